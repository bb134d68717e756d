"""Common factors (``timing.*_common``, ``common_ns``) from pairs of concurrent phases.

With ``--common`` (two or more workers): how alike the
durations of one phase are on two workers when the phases start Δt apart. Durations become
normal scores per worker (from their ranks); for every update and every other worker, the
other worker's first phase of the same kind starting in [Δ_lo, Δ_hi) after it forms a pair,
in bins of Δt from 0–250 ns to 32–64 µs (at least 30 pairs a bin). Each bin's correlation is
estimated from the median absolute difference of the pair's scores, c = 1 −
(median/0.6745)²/2 (exact for normal scores of correlation c; robust to the rare long
stalls that hit one worker and not the other, which a plain correlation weighs most), and
c_p·exp(−Δt/τ) is fitted by least squares weighted by pairs, one τ for all phases and one
c_p per phase (in [0, 1]). With convoys, the write's bins use writes that met no other,
which are the short ones, so two of them are less alike than two writes (a 2-core MLP
run's close pairs −1): the write then takes the other phases' c (their mean weighted by
pairs) and its bins are only reported; a
phase with fewer than 8 distinct durations (no local work, say) gets c = 0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import scipy.stats

from simulator.fidelity.runs import phase_windows
from simulator.scenario import CommonSpec, HardwareSpec, Scenario, spec_from_dict, upgrade_device
from simulator.trace import Trace

# The fitted weights, in the flat keys of the fit report (``with_common`` makes them
# [hardware.common]).
COMMON_FIELDS = ("read_common", "grad_common", "write_common", "idle_common")

# Common factors: bins of the start offset (ns), pairs a bin needs, the weakest c that
# "auto" keeps, and the correlation times tried.
COMMON_BINS = (0, 250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000)


_MIN_BIN = 30


_MIN_DISTINCT = 8  # a phase with fewer distinct durations tells nothing (e.g. no idle)


_MIN_COMMON = 0.05


_TAUS = np.geomspace(100.0, 1e6, 81)


_MEDIAN_ABS = 0.6744897501960817  # median of |Z| for a standard normal Z


def _scores(values: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """Normal scores of ``values`` within each owner's (from average ranks)."""
    scores = np.empty(values.size)
    for owner in np.unique(owners):
        mine = owners == owner
        ranks = scipy.stats.rankdata(values[mine])
        scores[mine] = scipy.stats.norm.ppf((ranks - 0.5) / mine.sum())
    return scores


def common_bins(starts: np.ndarray, durations: np.ndarray, owners: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin of ``COMMON_BINS``: the number of pairs, their median start offset (ns) and
    the robust correlation of their normal scores (the module docstring)."""
    scores = _scores(durations.astype(np.float64), owners)
    workers = np.unique(owners)
    bins = len(COMMON_BINS) - 1
    firsts, seconds, offsets, which = [], [], [], []
    for worker in workers:
        mine = np.flatnonzero(owners == worker)
        for other in workers[workers != worker]:
            theirs = np.flatnonzero(owners == other)
            order = theirs[np.argsort(starts[theirs], kind="stable")]
            sorted_starts = starts[order]
            for b in range(bins):
                lo, hi = COMMON_BINS[b], COMMON_BINS[b + 1]
                j = np.searchsorted(sorted_starts, starts[mine] + lo)
                ok = j < order.size
                j = np.minimum(j, order.size - 1)
                offset = sorted_starts[j] - starts[mine]
                ok &= offset < hi
                firsts.append(mine[ok])
                seconds.append(order[j[ok]])
                offsets.append(offset[ok])
                which.append(np.full(int(ok.sum()), b))
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    offset, where = np.concatenate(offsets), np.concatenate(which)
    diff = np.abs(scores[first] - scores[second])
    count, middle, corr = np.zeros(bins, dtype=np.int64), np.zeros(bins), np.zeros(bins)
    for b in range(bins):
        inside = where == b
        count[b] = int(inside.sum())
        if count[b]:
            middle[b] = float(np.median(offset[inside]))
            corr[b] = max(1 - (float(np.median(diff[inside])) / _MEDIAN_ABS) ** 2 / 2, -1.0)
    return count, middle, corr


_Bins = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def fit_common(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]],
               mode: str = "off") -> dict[str, Any]:
    """Common factors from the rows of one or more traces with two or more workers (each
    run: trace, rows, the rows whose writes met no other or None for all rows): the
    ``timing.*_common`` and ``common_ns`` values in ``"fields"`` when fitted, and the
    measured bins."""
    report: dict[str, Any] = {"fields": None}
    if mode == "off":
        report["why"] = "--common off"
        return report
    measured = _measured(runs)
    report["bins"] = {phase: {"pairs": c.astype(int).tolist(), "offset_ns": m.tolist(),
                              "correlation": r.tolist()}
                      for phase, (c, m, r) in measured.items()}
    # Writes that met no other are the short ones: two of them, both selected so, are less
    # alike than two writes (a simulated run with write c = 0.6 fits 0.23 from them, a
    # 2-core MLP run's close pairs −1). With convoys the write takes the other phases' c.
    borrowed = any(alone is not None for _, _, alone in runs)
    if borrowed:
        report["write_from_others"] = True
    if not any((c >= _MIN_BIN).any() for c, _, _ in measured.values()):
        report["why"] = ("fewer than two workers ran together" if not any(
            c.any() for c, _, _ in measured.values()) else
            f"no offset bin with {_MIN_BIN} pairs of phases")
        return report
    tau, weights = min((_weights(measured, tau, borrowed) for tau in _TAUS),
                       key=lambda fit: fit[2])[:2]
    report.update(common_ns=tau, weights=weights)
    if mode == "auto" and max(weights.values()) < _MIN_COMMON:
        report["why"] = f"concurrent phases alike by less than {_MIN_COMMON} (independent)"
        return report
    report["fields"] = {**{f"{phase}_common": weights[phase] for phase in weights},
                        "common_ns": tau}
    return report


def _measured(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]]) -> _Bins:
    """Per phase and bin of ``COMMON_BINS``, over the runs: the pairs, their mean offset and
    their correlation (means weighted by pairs; :func:`common_bins`)."""
    measured: _Bins = {}
    windows = [phase_windows(trace) for trace, _, _ in runs]
    for phase in ("read", "grad", "write", "idle"):
        count, middle = np.zeros(len(COMMON_BINS) - 1), np.zeros(len(COMMON_BINS) - 1)
        weighted = np.zeros(len(COMMON_BINS) - 1)
        for (trace, rows, alone), window in zip(runs, windows, strict=True):
            use = alone if phase == "write" and alone is not None else rows
            if np.unique(trace["thread"][use]).size < 2:
                continue
            start, duration = window[phase]
            if np.unique(duration[use]).size < _MIN_DISTINCT:  # ranks would be ties
                continue
            n, mid, corr = common_bins(start[use], duration[use], trace["thread"][use])
            count += n
            middle += n * mid
            weighted += n * corr
        with np.errstate(invalid="ignore", divide="ignore"):
            measured[phase] = (count, np.where(count > 0, middle / count, 0.0),
                               np.where(count > 0, weighted / count, 0.0))
    return measured


def _weights(measured: _Bins, tau: float, borrowed: bool
             ) -> tuple[float, dict[str, float], float]:
    """At correlation time ``tau``: each phase's c of c·exp(−Δt/τ) by least squares over
    its bins of enough pairs (weighted by pairs, in [0, 1]), the write's the others' mean
    when ``borrowed``; returned with τ and the squared error."""
    total, weights, pairs = 0.0, {}, {}
    for phase, (count, middle, corr) in measured.items():
        keep = count >= _MIN_BIN
        if not keep.any() or (borrowed and phase == "write"):
            weights[phase] = 0.0
            continue
        decay = np.exp(-middle[keep] / tau)
        n = count[keep]
        c = float(np.clip(np.sum(n * decay * corr[keep]) / np.sum(n * decay**2), 0, 1))
        weights[phase], pairs[phase] = c, float(np.sum(n))
        total += float(np.sum(n * (corr[keep] - c * decay) ** 2))
    if borrowed and pairs:
        weights["write"] = sum(weights[q] * n for q, n in pairs.items()) / sum(pairs.values())
    return float(tau), weights, total


def common_fits(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]], common: str
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pair bins and the common factors fitted from them: the same report, except that
    ``--common rhythm`` measures the bins (for τ) whatever they say and fits nothing yet."""
    if common != "rhythm":
        shared = fit_common(runs, common)
        return shared, shared
    return fit_common(runs, "on"), {"fields": None}


def with_common(scenario: Scenario, fields: dict[str, Any]) -> Scenario:
    """A calibrated ``scenario`` (every device has its timing) with common-factor
    ``fields`` (``read_common`` ..., ``common_ns``) as each device's ``[hardware.common]``
    (none where every weight is 0)."""
    common = upgrade_device({"timing": fields}).get("hardware", {}).get("common")
    spec = None if common is None else spec_from_dict(CommonSpec, common, "hardware.common")
    devices = [replace(d, hardware=replace(d.hardware or HardwareSpec(), common=spec))
               for d in scenario.devices]
    return replace(scenario, devices=tuple(devices))
