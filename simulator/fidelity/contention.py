"""Contention: how phase durations grow with the number of workers in them.

Reported at one worker count: the slope of read and write durations against the number of other
workers reading or writing at the same time (least squares), and the gradient's slope
against the number of other workers computing. The calibrated scenario keeps one core per
worker and no bus: the fitted distributions already contain the contention of the recorded
run at its worker count.

Across runs at several worker counts (:func:`per_thread`), each phase's mean duration
b·(1 + x·(k − 1)) gives the scenario's ``*_per_thread`` x.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.fidelity.durations import fit_phase, mean_duration, scaled
from simulator.trace import Trace


def _overlaps(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """For each interval, how many intervals of other owners overlap its midpoint."""
    mid = (starts + ends) / 2
    order = np.argsort(starts, kind="stable")
    count = np.zeros(starts.size)
    for i in range(starts.size):
        j = order[: np.searchsorted(starts[order], mid[i], side="right")]
        count[i] = np.sum((ends[j] > mid[i]) & (owners[j] != owners[i]))
    return count


def _slope(load: np.ndarray, durations: np.ndarray) -> dict[str, float] | None:
    """Least-squares duration = base + slope·load, or None when load never varies."""
    if load.size < 3 or np.ptp(load) == 0:
        return None
    slope, base = np.polyfit(load, durations, 1)
    return {"base_ns": float(base), "ns_per_concurrent": float(slope),
            "mean_concurrent": float(load.mean())}


def contention(runs: list[tuple[Trace, np.ndarray]]) -> dict[str, Any]:
    """How phase durations grow with the number of other workers in the same phase, over the
    given rows of one or more runs."""
    result: dict[str, Any] = {}
    for phase in ("read", "grad", "write"):
        loads, durations = [], []
        for trace, rows in runs:
            rows = rows[:: max(1, rows.size * len(runs) // 4000)]  # the O(n²) scan stays cheap
            start = trace[f"{phase}_start"][rows].astype(np.float64)
            end = trace[f"{phase}_end"][rows].astype(np.float64)
            loads.append(_overlaps(start, end, trace["thread"][rows]))
            durations.append(end - start)
        result[phase] = _slope(np.concatenate(loads), np.concatenate(durations))
    return result


def per_thread(counts: list[int], pooled: list[dict[str, np.ndarray]]
               ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Each phase's slowdown per other worker from runs at the worker ``counts`` (their
    pooled samples, in the same order, fewest workers first): each run's mean duration is
    fitted by least squares as b·(1 + x·(k − 1)); x (at least 0) is ``*_per_thread`` and
    the distribution is the one fitted on the first run, its draws divided by
    1 + x·(k_min − 1) (one worker alone). Returns the timing fields, the contention report
    and each phase's fit described."""
    k = np.asarray(counts, dtype=np.float64) - 1
    timing: dict[str, Any] = {}
    found: dict[str, Any] = {}
    fits: dict[str, str] = {}
    for op in ("read", "grad", "write", "idle"):
        means = np.array([mean_duration(p, op) for p in pooled])
        slope, intercept = np.polyfit(k, means, 1)
        x = max(float(slope / intercept), 0.0) if intercept > 0 else 0.0
        fit = fit_phase(pooled[0], op)
        timing[op] = scaled(fit.duration, 1 + x * k[0])
        timing[f"{op}_per_thread"] = x
        fits[op] = fit.describe()
        found[op] = {"per_thread": x, "alone_ns": float(intercept),
                     "means_ns": {str(c): float(m) for c, m in zip(counts, means, strict=True)}}
    return timing, found, fits
