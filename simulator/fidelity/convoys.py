"""Write convoys (``[hardware.convoys]``): writes that met and end together.

With one block per update: when writes that met end together (the median gap
between their ends under half the median gap between their starts, over at least
30 pairs of writes that met and no third), the time from the joiner's start to the
leader's end is fitted by least squares as ``convoy_join``·W + ``convoy_rest``·E[min(R,
D)] (the rule's min(E − t, W) in expectation: R the leader's time alone left at the lag,
given it had not ended, D a joiner's time alone; :meth:`Survival.expected_rest`), and
``convoy_end_gap`` is the median end gap over the median start lag (the joiner's end
trails the leader's), or, where writes that met end together up to some lag and apart by
the rest beyond it, g of g·max(0, lag − a) with ``convoy_end_catch_up`` = a
(:func:`end_gap_hinge`). The time a write runs alone is survival data
(:func:`write_survival`): a write no other met shows it whole, a write another started
into shows only that it exceeds the lag (right-censored there), and writes that started
into another's are left out. The write distribution (so the convoys are not counted
twice) and W, its mean, are fitted on both: the families by censored maximum likelihood,
the empirical one from the Kaplan–Meier estimate. Writes that met no other are the
short ones (a long write is the likelier to be met: on a 2-core MLP run in write
lockstep their mean is 6.2 µs, the censored estimate's 16 µs, docs/fidelity.md), so a fit
on them alone draws writes too short to meet as often as the run's did.
What the meetings lose is fitted as for passing writes
(:mod:`simulator.fidelity.passing`); without classified pairs convoys are fitted only when
asked (``convoys = "on"``), losing nothing. Runs of one worker have no writes that meet: their
convoys are fitted the same way from the meetings the real run's probe made
(:func:`probed_meetings`, ``real.write_meetings``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.fidelity.durations import MIN_PAIRS, Survival
from simulator.fidelity.passing import Meetings, meeting_losses, merged_meetings
from simulator.fidelity.runs import write_survival
from simulator.fidelity.shared import shared_writes
from simulator.metrics import write_pairs
from simulator.trace import Trace, convoy_pairs

_TOGETHER = 0.5  # convoys: median end gap below this share of the median start gap


_HINGE_GAIN = 0.95  # convoys: a catch-up kept when it cuts the end gaps' error to this share


def fit_convoys(runs: list[tuple[Trace, np.ndarray]], mode: str = "auto",
                shared: float = 1.0) -> dict[str, Any]:
    """Write convoys from the rows of one or more traces (the module docstring): the
    ``convoy_*`` values (the ``[hardware.convoys]`` table's, in the fit report's flat keys)
    in ``"fields"`` when convoys are found (or forced with
    ``mode = "on"``), and what was measured. ``shared``: the fitted ``write_shared``, by
    which the writes :func:`shared_writes` marks ran alone longer (their times alone are
    divided by it, and each pair's leader and joiner scaled back by it where marked)."""
    parts = []
    for trace, rows in runs:
        if len(trace) and int(np.diff(trace["op_offsets"]).max()) > 1:
            return {"pairs": 0, "fields": None, "why": "writes of more than one block"}
        part = _trace_meetings(trace, rows, shared)
        if part is not None:
            parts.append(part)
    return fit_meetings(merged_meetings(parts), mode)


def _trace_meetings(trace: Trace, rows: np.ndarray, shared: float) -> dict[str, Any] | None:
    """The pairs of writes that met among one trace's ``rows``, as :class:`Meetings` fields
    (None when no write ran alone)."""
    kept, share = write_survival(trace, rows)
    if not np.any(share >= 1):
        return None
    # W: the mean time a write runs alone, the met ones counted as censored (a long write is
    # the likelier to be met, so writes that met no other are the short ones). Each row's
    # time-alone factor.
    factor = (np.where(shared_writes(trace), shared, 1.0) if shared != 1
              else np.ones(len(trace)))
    whole = (trace["write_end"][kept] - trace["write_start"][kept]) / factor[kept]
    alone_time = Survival.of(whole[share >= 1], (whole * share)[share < 1])
    mean = alone_time.mean()
    ws, we = trace["write_start"][rows], trace["write_end"][rows]
    lead, join, _, _ = write_pairs(ws, we, trace["thread"][rows])
    lag = (ws[join] - ws[lead]).astype(np.float64)
    # The convoy's end is the leader's: the joiner's own end trails it by the end gap.
    return {"lag": lag, "gap": np.abs(we[join] - we[lead]).astype(np.float64),
            "duration": (we[lead] - ws[join]).astype(np.float64),
            "alone": mean * factor[rows][join],
            "rest": alone_time.expected_rest(lag, factor[rows][lead], factor[rows][join]),
            **_classified(trace, mean * factor)}


def _classified(trace: Trace, mean: np.ndarray) -> dict[str, Any]:
    """The :class:`Meetings` fields of a trace's classified pairs (``extra_convoy_pairs``),
    ``mean`` each row's mean time alone: the shares lost given that the pair lost anything
    (most meetings lose nothing), in the leader's own time alone."""
    pairs = convoy_pairs(trace)
    if pairs is None or not pairs.size:
        return {}
    lossy = (pairs[:, 3] > 0) | (pairs[:, 4] > 0)
    by_uid = np.argsort(trace["uid"], kind="stable")
    at = np.searchsorted(trace["uid"][by_uid], pairs[:, 0].astype(np.int64))
    pair_mean = mean[by_uid[np.minimum(at, len(trace) - 1)]]
    part = np.clip(1 - pairs[lossy, 2] / pair_mean[lossy], 0, 1)
    # Whether a meeting loses anything: pairs that swept at least half the block together
    # (a smaller shared part may lose nothing by chance alone), and how much each such
    # meeting lost, in coordinates of its shared part.
    half = pairs[:, 2] <= pair_mean / 2
    size = int(trace["w0"].size)
    return {"fronts": np.clip(pairs[:, 2] / pair_mean, 0, 1), "lossy": lossy,
            "lost": pairs[lossy, 3:5].sum(axis=0), "shared_total": float(part.sum()),
            "classified": len(pairs), "close": int(half.sum()),
            "close_lossy": int((half & lossy).sum()),
            "counts": np.rint((pairs[half, 3] + pairs[half, 4]) * size),
            "spans": np.rint(np.clip(1 - pairs[half, 2] / pair_mean[half], 0, 1) * size)}


def probed_meetings(probes: list[dict[str, Any] | None], mode: str = "auto",
                    write_ns: float | None = None) -> dict[str, Any]:
    """Write convoys for runs of one worker from the meetings their probes made
    (realrun/host/probe.py ``write_meetings``: the first CPU's write at 0, the second's a lag
    later, the stores each lost), fitted as :func:`fit_convoys` fits a trace's pairs. A
    write's time alone is the median of the probe's writes that met none (the first's for
    the leader's rest, the second's for the joiner); pairs are the rows where the second
    started before the first ended. How long a convoy takes is fitted in the probe's own
    time (a share of a write alone); what a meeting loses, by its lag in ns: the simulator
    puts a meeting at the front lag / W of a write it drew as W, so the fronts and shared
    parts are taken at ``write_ns`` (the runs' median write; the probe's own when None),
    which makes a meeting at a given lag lose what the probe's lost."""
    present = [p for p in probes if p is not None and len(p.get("rows", ()))]
    if not present:
        return {"pairs": 0, "fields": None,
                "why": "one worker: no writes that met, and no probe in the runs "
                       "(real.write_meetings; record the runs with asyngrad real --probe)"}
    parts = [part for part in (_probe_meetings(probe, write_ns) for probe in present)
             if part is not None]
    if not parts:
        return {"pairs": 0, "fields": None,
                "why": "the probes' writes all met, or none did (no time alone to fit from)"}
    report = fit_meetings(merged_meetings(parts), mode)
    report["probes"] = len(parts)
    return report


def _probe_meetings(probe: dict[str, Any], write_ns: float | None) -> dict[str, Any] | None:
    """The :class:`Meetings` fields of one probe's rows (:func:`probed_meetings`), or None
    when fewer than two of its pairs of writes met or fewer than two did not."""
    table = np.asarray(probe["rows"], dtype=np.float64)
    first = table[:, 0] <= table[:, 2]
    lead = np.where(first[:, None], table[:, [0, 1, 4]], table[:, [2, 3, 5]])
    join = np.where(first[:, None], table[:, [2, 3, 5]], table[:, [0, 1, 4]])
    apart = join[:, 0] >= lead[:, 1]
    if apart.sum() < 2 or (~apart).sum() < 2:
        return None
    leader_alone = float(np.median(lead[apart, 1] - lead[apart, 0]))
    joiner_alone = float(np.median(join[apart, 1] - join[apart, 0]))
    met = ~apart
    size = float(probe["probed"])
    lag = join[met, 0] - lead[met, 0]
    planned = write_ns if write_ns else leader_alone
    front = np.clip(lag / planned, 0, 1)
    lost_lead, lost_join = lead[met, 2] / size, join[met, 2] / size
    lossy = (lost_lead > 0) | (lost_join > 0)
    half = lag <= planned / 2
    return dict(
        lag=lag, gap=np.abs(join[met, 1] - lead[met, 1]), duration=lead[met, 1] - join[met, 0],
        alone=np.full(lag.size, joiner_alone),
        rest=np.maximum(lead[met, 0] + leader_alone - join[met, 0], 0.0), fronts=front,
        lossy=lossy, lost=np.array([lost_lead[lossy].sum(), lost_join[lossy].sum()]),
        shared_total=float((1 - front[lossy]).sum()), classified=int(lag.size),
        close=int(half.sum()), close_lossy=int((half & lossy).sum()),
        counts=(lead[met, 2] + join[met, 2])[half], spans=np.rint((1 - front[half]) * size))


def fit_meetings(meetings: Meetings, mode: str = "auto") -> dict[str, Any]:
    """The ``[hardware.convoys]`` values (as ``convoy_*``) from pairs of writes that met
    (:func:`fit_convoys`): convoys when they ended together, passing writes (their losses
    alone) when apart."""
    m = meetings
    report: dict[str, Any] = {"pairs": int(m.lag.size), "fields": None}
    if m.lag.size < MIN_PAIRS or mode == "off":
        report["why"] = ("--convoys off" if mode == "off" else
                         f"{m.lag.size} pairs of writes that met (fewer than {MIN_PAIRS})")
        return report
    together = float(np.median(m.gap) / max(np.median(m.lag), 1e-9))
    report["end_gap_over_start_gap"] = together
    apart = together >= _TOGETHER and mode == "auto"
    why = _unfitted(m, mode, apart)
    if why:
        report["why"] = why
        return report
    losses, found = meeting_losses(m)
    report.update(found, classified=m.classified)
    if apart:  # they pass each other: their own durations, the losses as measured
        report["fields"] = {"convoy_join": 0.0, "convoy_rest": 0.0, **losses}
        return report
    times, hinge = _convoy_times(m, together)
    report.update(end_gap_hinge=hinge, fields={**times, **losses},
                  alone_write_ns=float(m.alone.mean()))
    return report


def _unfitted(m: Meetings, mode: str, apart: bool) -> str | None:
    """Why pairs that met (enough of them) fit nothing: they ended apart and lost nothing,
    or under ``auto`` none was classified (convoys would lose nothing); None to fit."""
    unclassified = ("no pair's lost coordinates were classified (record the run with "
                    "asyngrad real --measure)")
    if apart and not m.lost.any():
        return ("writes that met ended apart (no convoys) and "
                + ("no classified pair lost a coordinate" if m.classified else unclassified))
    if not m.classified and mode == "auto":
        return f"writes that met ended together, but {unclassified}"
    return None


def _convoy_times(m: Meetings, together: float) -> tuple[dict[str, float], dict[str, Any]]:
    """How long a convoy takes (``convoy_join``, ``convoy_rest``: least squares) and how far
    the joiner's end trails the leader's (:func:`end_gap_hinge`, or the median ratio
    ``together``); and the hinge's fit."""
    design = np.column_stack([m.alone, m.rest])
    solution = np.linalg.lstsq(design, m.duration, rcond=None)[0]
    joined, rest = max(float(solution[0]), 1e-3), max(float(solution[1]), 0.0)
    hinge = end_gap_hinge(m.lag, m.gap)
    end = ({"convoy_end_gap": hinge["slope"], "convoy_end_catch_up": hinge["catch_up_ns"]}
           if hinge["kept"] else {"convoy_end_gap": together, "convoy_end_catch_up": 0.0})
    return {"convoy_join": joined, "convoy_rest": rest, **end}, hinge


def end_gap_hinge(lag: np.ndarray, gap: np.ndarray) -> dict[str, Any]:
    """How far apart writes that met ended (``gap``) against how far apart they started
    (``lag``), as g·max(0, lag − a): the ``convoy_end_gap`` g and ``convoy_end_catch_up`` a
    that fit with the least absolute error, a tried at 0 and at the lags' 5th … 95th
    percentiles (then in 40 steps between the best one's neighbours), g for each a the
    weighted median of gap / (lag − a) (weights lag − a, the
    least-absolute-error slope). ``kept`` when that error is at most ``_HINGE_GAIN`` of the
    error of g·lag alone (a = 0); otherwise the convoy fit keeps its median ratio. On a 2-core
    MLP run with both CPUs near, met writes ended together up to a lag of about 0.9 µs and
    apart by the rest of the lag beyond it (g = 1.00, a = 935 ns, the error 0.73 of the
    proportional one's); on runs that never meet that way, a = 0 fits as well."""
    def slope(shift: float) -> tuple[float, float]:
        excess = np.maximum(lag - shift, 0.0)
        used = excess > 0
        if not used.any():
            return 0.0, float(np.abs(gap).sum())
        ratio, weight = gap[used] / excess[used], excess[used]
        order = np.argsort(ratio, kind="stable")
        total = np.cumsum(weight[order])
        g = float(ratio[order][np.searchsorted(total, 0.5 * total[-1])])
        return g, float(np.abs(gap - g * excess).sum())

    shifts = [0.0, *np.quantile(lag, np.arange(1, 20) / 20).tolist()] if lag.size else [0.0]
    fits = [(shift, *slope(shift)) for shift in shifts]
    proportional = fits[0][2]
    best = min(range(len(fits)), key=lambda i: (fits[i][2], fits[i][0]))
    if best > 0:  # then 40 steps between the neighbouring percentiles
        low, high = shifts[best - 1], shifts[min(best + 1, len(shifts) - 1)]
        fits += [(shift, *slope(shift)) for shift in np.linspace(low, high, 41).tolist()]
    shift, g, error = min(fits, key=lambda fit: (fit[2], fit[0]))
    kept = shift > 0 and g > 0 and error <= _HINGE_GAIN * proportional
    return {"catch_up_ns": float(shift), "slope": g, "error": error,
            "proportional_error": proportional, "kept": bool(kept)}


def forms_convoys(report: dict[str, Any]) -> bool:
    """Whether a :func:`fit_convoys` report fitted convoys (not passing writes)."""
    return bool(report["fields"]) and report["fields"]["convoy_join"] > 0


def usable_convoys(report: dict[str, Any], cores: int, quantum: int) -> dict[str, Any]:
    """Convoys cannot be simulated on a core pool without time slices: say so, drop them."""
    if forms_convoys(report) and cores and not quantum:
        report = {**report, "fields": None,
                  "why": "convoys found, not used: they need --quantum with --cores"}
    return report
