"""Fidelity of one run against another: simulated vs real, predicted vs measured.

Both runs are run directories (``asyngrad simulate``, ``replay``, ``real`` or a sweep cell)
of the same problem. The report puts side by side what a researcher checks before trusting
a simulation of hardware: the staleness distributions (means, p95 and the two-sample
Kolmogorov–Smirnov distance), the gradient error rate and relative-error quantiles, the
overwrite counts per update (a real run's lost blocks are unknown: hardware does not say
which update lost a store) and what pairs of writes that met lost where they were classified,
the throughput, the loss curves against gradients computed
(the ratio of the final suboptimalities and the largest ratio along the common range), how
updates met in time, and whether the workers kept a common rhythm (measured staleness against
what workers with independent phases would give; `simulator.metrics.rhythm`).

The report is records: the four fidelity targets (``targets``) and the details
(``details``), each a list of rows that :mod:`simulator.fidelity.report` prints as tables.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import scipy.stats

from simulator.errors import AsyngradError
from simulator.fidelity.runs import Run, load_run
from simulator.metrics import (
    error_rate,
    interference,
    relative_error,
    trace_rhythm,
    write_meetings,
    write_pairs,
)
from simulator.rundir import cpu_latency, placement
from simulator.trace import Trace, convoy_pairs


def compare_runs(a: str | Path, b: str | Path) -> dict[str, Any]:
    """The fidelity report of run ``b`` against run ``a`` (what ``compare.json`` holds).

    Raises:
        AsyngradError: a path is not a run directory, or the runs train different problems.
    """
    ra, rb = load_run(a), load_run(b)
    _check_same_problem(ra, rb)
    ta, tb = ra.trace, rb.trace
    ea, eb = _errors(ta), _errors(tb)
    ia, ib = interference(ta), interference(tb)
    latency_a, latency_b = cpu_latency(ra.summary), cpu_latency(rb.summary)
    rate_gap = (abs(eb["rate"] - ea["rate"]) if ea["rate"] is not None
                and eb["rate"] is not None else None)
    ups_a = ra.summary["time"]["updates_per_second"]
    ups_b = rb.summary["time"]["updates_per_second"]
    report: dict[str, Any] = {
        "a": {"path": str(ra.path), "label": ra.label, "updates": len(ta),
              "diverged_at": ra.summary.get("diverged_at")},
        "b": {"path": str(rb.path), "label": rb.label, "updates": len(tb),
              "diverged_at": rb.summary.get("diverged_at")},
        "staleness": _staleness(ta["staleness"], tb["staleness"]),
        "gradient_error": {"a": ea, "b": eb, "rate_gap": rate_gap,
                           "gap_split": error_gap_split(ia, ib)},
        "overwrites": {"a": _overwrites(ra), "b": _overwrites(rb)},
        "interference": {"a": ia, "b": ib},
        "rhythm": {"a": trace_rhythm(ta), "b": trace_rhythm(tb)},
        "offsets": {"a": offsets([ta]), "b": offsets([tb])},
        # Real runs: how far apart their two CPUs were (a different state of the host makes
        # a different machine: docs/fidelity.md, write lockstep).
        "cpu_latency": {"a": latency_a, "b": latency_b},
        "placement": {"a": placement(latency_a), "b": placement(latency_b)},
        "throughput": {"updates_per_second_a": ups_a, "updates_per_second_b": ups_b,
                       "ratio": ups_b / ups_a if ups_a else None},
        "loss": _loss_agreement(ra.curve, rb.curve),
    }
    report["targets"] = targets(report)
    report["details"] = details(report)
    return report


def _check_same_problem(ra: Run, rb: Run) -> None:
    """Raises AsyngradError where the runs train different problems."""
    pa, pb = ra.summary["problem"], rb.summary["problem"]
    differ = sorted(k for k in set(pa) | set(pb) if not _same(pa.get(k), pb.get(k)))
    if differ:
        raise AsyngradError(f"compare: {ra.path} and {rb.path} train different problems "
                            f"({', '.join(f'{k}: {pa.get(k)} vs {pb.get(k)}' for k in differ)})")


def _staleness(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Both runs' staleness: means (None for a run without updates), their relative gap
    |b − a| / a (None where a mean is missing, or where run A's is 0 and run B's is not: no
    finite relative gap), p95 and the KS distance."""
    sa, sb = a.astype(np.float64), b.astype(np.float64)
    ks = (float(scipy.stats.ks_2samp(sa, sb, method="asymp").statistic) if sa.size and sb.size
          else None)
    mean_a = float(sa.mean()) if sa.size else None
    mean_b = float(sb.mean()) if sb.size else None
    gap = None
    if mean_a is not None and mean_b is not None and (mean_a > 0 or mean_b == 0):
        gap = abs(mean_b - mean_a) / mean_a if mean_a > 0 else 0.0
    return {"mean_a": mean_a, "mean_b": mean_b, "relative_mean_gap": gap,
            "p95_a": _quantile(sa, 0.95), "p95_b": _quantile(sb, 0.95), "ks_distance": ks}


def _errors(trace: Trace) -> dict[str, Any]:
    """A run's gradient error rate and relative-error quantiles (of the finite ones: a
    diverged run's inf and NaN are left out, as from the rate)."""
    relative = relative_error(trace)
    finite = relative[np.isfinite(relative)]
    return {"rate": error_rate(trace),
            "measured": int(relative.size), "p50": _quantile(finite, 0.5),
            "p95": _quantile(finite, 0.95)}


def _overwrites(run: Run) -> dict[str, Any]:
    """A run's overwrites per update and what its pairs of writes that met lost."""
    trace, n = run.trace, max(len(run.trace), 1)
    # Hardware loses stores without a trace of who lost them: a real run's lost blocks are
    # unknown, what its classified pairs of writes lost is known.
    lost = (None if run.summary.get("source") == "real"
            else float(trace["lost_blocks"].sum()) / n)
    return {"lost_blocks_per_update": lost,
            "torn_read_fraction": float(trace["torn"].sum()) / n,
            "read_overwrite_blocks_per_update": float(trace["read_overwrites"].sum()) / n,
            **pair_losses(trace), "meeting_lags": meeting_lags([trace])}


def _quantile(values: np.ndarray, q: float) -> float | None:
    return float(np.quantile(values, q)) if values.size else None


def _loss_agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float | None]:
    """Final suboptimality ratio b/a, and the largest |log10(b/a)| over the gradient counts
    both curves cover (each interpolated on the union of their checkpoints), over positive
    suboptimalities. A run that diverged has no final value, and where a curve is not
    finite within the common gradients there is no largest ratio: each is None."""
    final_a, final_b = _finite(a[-1, 1]), _finite(b[-1, 1])
    final = (final_b / final_a) if final_a and final_b and final_a > 0 and final_b > 0 else None
    end = min(a[-1, 0], b[-1, 0])
    x = np.unique(np.concatenate([a[:, 0], b[:, 0]]))
    x = x[x <= end]
    with np.errstate(invalid="ignore"):
        ya, yb = np.interp(x, a[:, 0], a[:, 1]), np.interp(x, b[:, 0], b[:, 1])
    usable = (ya > 0) & (yb > 0)
    worst = (float(np.abs(np.log10(yb[usable] / ya[usable])).max())
             if usable.any() and np.isfinite(ya).all() and np.isfinite(yb).all() else None)
    return {"final_a": final_a, "final_b": final_b, "final_ratio": final,
            "max_abs_log10_ratio": worst, "common_gradients": float(end)}


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative: a problem's derived constants (smoothness, …) are
    computed from the same data on each machine, and BLAS builds differ in the last bits."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return bool(a == b)


#: The fidelity targets a prediction is held to (run B against run A): the name, the
#: report's values of A and B, the gap, the limit and whether the gap is within it.
TARGETS = (
    ("mean staleness", "relative gap", 0.15),
    ("staleness distribution", "KS distance", 0.15),
    ("gradient error rate", "absolute gap", 0.1),
    ("final suboptimality", "ratio B/A", 2.0),
)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The four fidelity targets of a comparison as records: ``metric``, ``a``, ``b``,
    ``gap`` (how it is measured in ``measure``), ``target`` (its limit) and ``met`` (None
    where a value is missing). The suboptimality ratio is met within a factor of the limit
    either way."""
    st, ge, lo = report["staleness"], report["gradient_error"], report["loss"]
    ratio = lo["final_ratio"]
    values = ((st["mean_a"], st["mean_b"], st["relative_mean_gap"]),
              (None, None, st["ks_distance"]),
              (ge["a"]["rate"], ge["b"]["rate"], ge["rate_gap"]),
              (lo["final_a"], lo["final_b"], ratio))
    rows = []
    for (metric, measure, limit), (a, b, gap) in zip(TARGETS, values, strict=True):
        if gap is None:
            met = None
        elif measure == "ratio B/A":
            met = bool(1 / limit <= gap <= limit)
        else:
            met = bool(gap <= limit)
        rows.append({"metric": metric, "a": a, "b": b, "measure": measure, "gap": gap,
                     "target": limit, "met": met})
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _row(metric: str, a: Any, b: Any, note: str = "", measure: str | None = None,
         gap: float | None = None) -> dict[str, Any]:
    """One record of ``details``; without a ``measure``, the gap is b − a where both are
    numbers."""
    if measure is None and _number(a) and _number(b):
        measure, gap = "b − a", b - a
    return {"metric": metric, "a": a, "b": b, "measure": measure, "gap": gap, "note": note}


def _pair(section: dict[str, Any], key: str) -> tuple[Any, Any]:
    """A value of runs A and B from a section keyed ``a`` and ``b`` (None for a run without
    the section)."""
    a, b = (None if section[side] is None else section[side][key] for side in "ab")
    return a, b


def _bins(edges: tuple[float, ...]) -> str:
    return "bins from " + ", ".join(f"{e:g}" for e in edges) + " W"


def _staleness_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    st, ge = report["staleness"], report["gradient_error"]
    return [_row("staleness p95", st["p95_a"], st["p95_b"]),
            _row("relative gradient error p50", *_pair(ge, "p50")),
            _row("relative gradient error p95", *_pair(ge, "p95"))]


def _overwrite_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    ow = report["overwrites"]
    lost = _pair(ow, "lost_blocks_per_update")
    rows = [_row("lost blocks per update", *lost,
                 "unknown for a real run" if None in lost else ""),
            _row("torn reads per update", *_pair(ow, "torn_read_fraction")),
            _row("pairs of writes that met, classified", *_pair(ow, "pairs_classified")),
            _row("classified pairs losing stores (share)", *_pair(ow, "pairs_losing")),
            _row("share of the block lost per pair", *_pair(ow, "lost_per_pair")),
            _row("lost by a pair that lost any", *_pair(ow, "lost_per_lossy_pair"),
                 "quartiles"),
            _row("pair start lag over a lone write", *_pair(ow, "pair_lag_over_lone_write"),
                 "quartiles")]
    lags = {side: ow[side]["meeting_lags"] for side in "ab"}
    if lags["a"] is not None or lags["b"] is not None:
        rows += [_row("pairs that met per start-lag bin (share)", *_pair(lags, "shares"),
                      _bins(LAG_EDGES[:-1])),
                 _row("lossy pairs per start-lag bin (share)", *_pair(lags, "lossy_by_lag"),
                      _bins(LAG_EDGES[:-1]))]
    return rows


def _interference_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    ia = report["interference"]
    split = report["gradient_error"]["gap_split"] or {}
    part = "its part of the error-rate gap b − a" if split else ""

    def parted(metric: str, key: str, share: str) -> dict[str, Any]:
        if not split:
            return _row(metric, *_pair(ia, key))
        return _row(metric, *_pair(ia, key), part, "part of the gap", split[share])

    return [_row("writes overlapping a write (share)", *_pair(ia, "write_overlap_rate")),
            _row("reads under a write (share)", *_pair(ia, "read_under_write_rate")),
            parted("updates at staleness 0 (share)", "fresh_share", "fresh_share"),
            parted("error rate at staleness 0", "error_rate_fresh", "fresh_errors"),
            parted("error rate above staleness 0", "error_rate_stale", "stale_errors"),
            _row("median write met by another, ns", *_pair(ia, "met_write_median_ns")),
            _row("median lone write, ns", *_pair(ia, "lone_write_median_ns"))]


def _rhythm_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rh, fo = report["rhythm"], report["offsets"]
    rows = [_row("rhythm: staleness / independent-phase value", *_pair(rh, "coupling")),
            _row("independent-phase staleness", *_pair(rh, "independent_staleness")),
            _row("others' completions peak, × uniform", *_pair(rh, "phase_peak"),
                 "where in a worker's cycle the others complete")]
    if fo["a"] is not None or fo["b"] is not None:
        rows += [_row("write starts' offset to another's (share)", *_pair(fo, "shares"),
                      _bins(OFFSET_EDGES[:-1]) + " (over a lone write)"),
                 _row("next offset over this one", *_pair(fo, "next_over_now"),
                      _bins(OFFSET_EDGES[:-3])),
                 _row("end gap of writes that met, W", *_pair(fo, "end_gap"),
                      _bins(OFFSET_EDGES[:-4]) + " (their start lag)")]
    return rows


def _host_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    th, lo = report["throughput"], report["loss"]
    rows = [_row("updates/s", th["updates_per_second_a"], th["updates_per_second_b"],
                 measure="ratio B/A", gap=th["ratio"])]
    latency, placed = report["cpu_latency"], report["placement"]
    if latency["a"] is not None or latency["b"] is not None:
        differ = {placed["a"], placed["b"]} == {"near", "far"}
        a, b = (None if latency[s] is None else [latency[s]["before_ns"], latency[s]["after_ns"]]
                for s in "ab")
        rows += [_row("CPU-to-CPU cache line before/after, ns", a, b),
                 _row("CPU placement", placed["a"], placed["b"],
                      "placed differently: dense shared writes differ by that alone, so part "
                      "of every gap is the host's placement" if differ else "")]
    diverged = [f"{side.upper()} diverged at update {report[side]['diverged_at']}"
                for side in "ab" if report[side].get("diverged_at") is not None]
    rows.append(_row("largest suboptimality ratio along the curves", None, None,
                     "; ".join(diverged) or "final ratio: the targets", "|log10 B/A|",
                     lo["max_abs_log10_ratio"]))
    return rows


def details(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Everything a comparison measured beyond its targets, as records: ``metric``, ``a``,
    ``b`` (numbers, or lists of them per quartile or bin; None where a run has none),
    ``measure`` and ``gap`` (b − a by default; None where there is no gap) and ``note``."""
    return [*_staleness_rows(report), *_overwrite_rows(report), *_interference_rows(report),
            *_rhythm_rows(report), *_host_rows(report)]


def error_gap_split(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float] | None:
    """Where the gradient error rate of run b differs from run a's (b − a, signed), from
    their ``interference``: the rate is P·e0 + (1 − P)·e1, with P the share of measured
    updates no other completion came between, e0 their error rate and e1 the others', so

        rate_b − rate_a = (P_b − P_a)(e0_a − e1_a) + P_b (e0_b − e0_a) + (1 − P_b)(e1_b − e1_a)

    exactly: ``fresh_share`` is what the share of fresh updates alone moves, ``fresh_errors``
    what the fresh updates' own errors (lost stores, torn reads, copies of writes in flight)
    move, ``stale_errors`` what the stale updates' do. A kind of update one run lacks takes
    the other run's rate (its weight there is 0). None where either run measured nothing."""
    if a["fresh_share"] is None or b["fresh_share"] is None:
        return None

    def rates(x: dict[str, Any], y: dict[str, Any]) -> tuple[float, float]:
        e0 = x["error_rate_fresh"] if x["error_rate_fresh"] is not None else y["error_rate_fresh"]
        e1 = x["error_rate_stale"] if x["error_rate_stale"] is not None else y["error_rate_stale"]
        return e0 or 0.0, e1 or 0.0

    (e0a, e1a), (e0b, e1b) = rates(a, b), rates(b, a)
    pa, pb = a["fresh_share"], b["fresh_share"]
    return {"fresh_share": (pb - pa) * (e0a - e1a), "fresh_errors": pb * (e0b - e0a),
            "stale_errors": (1 - pb) * (e1b - e1a)}


# Bins of a pair's start lag over the median lone write (meeting_lags).
LAG_EDGES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0, math.inf)


def meeting_lags(traces: list[Trace]) -> dict[str, Any] | None:
    """How the classified pairs of writes that met (``extra_convoy_pairs``) of one or more
    traces of one kind (the repeats of a real run, the seeds of a simulation) were staggered,
    pooled: pairs per update, the share that lost anything, the median start lag over the
    trace's median lone write, and for each bin of that lag (:data:`LAG_EDGES`) the share of
    the pairs in it and the share of those that lost anything (None for an empty bin). Where
    two workers keep in step, the lags say how: together (near 0, where meetings lose most)
    or staggered. None where no trace recorded pairs."""
    lags, lossy, updates = [], [], 0
    for trace in traces:
        pairs, lone = convoy_pairs(trace), write_meetings(trace)["lone_median_ns"]
        if pairs is None or not lone:
            continue
        updates += len(trace)
        lags.append(pairs[:, 2] / lone)
        lossy.append(pairs[:, 3] + pairs[:, 4] > 0)
    if not updates:
        return None
    lag, lost = np.concatenate(lags), np.concatenate(lossy)
    which = np.digitize(lag, LAG_EDGES[1:-1])  # bin i: LAG_EDGES[i] <= lag < LAG_EDGES[i+1]
    counts = np.bincount(which, minlength=len(LAG_EDGES) - 1)
    losing = np.bincount(which, weights=lost, minlength=len(LAG_EDGES) - 1)
    return {"pairs_per_update": len(lag) / updates,
            "lossy": float(lost.mean()) if lag.size else None,
            "median_lag": float(np.median(lag)) if lag.size else None,
            "shares": (counts / max(len(lag), 1)).tolist(),
            "lossy_by_lag": [float(n / c) if c else None for n, c in zip(losing, counts,
                                                                          strict=True)]}


# Bins of a write's start offset to the nearest other worker's write start, over the median
# lone write (offsets): the meetings' bins, then writes too far apart to meet.
OFFSET_EDGES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 2.0, 4.0, math.inf)


_MIN_IN_BIN = 5  # offsets: a bin's median from at least this many rows


def offsets(traces: list[Trace]) -> dict[str, Any] | None:
    """How far apart the workers start their writes, and how that offset moves, pooled over
    one or more traces of one kind (the repeats of a real run, a simulation's seeds), all
    over each trace's median lone write W. Per write, its offset is the time to the nearest
    write start of another worker. ``shares``: the share of writes in each offset bin
    (:data:`OFFSET_EDGES`). ``next_over_now``: per bin below 2 W, the median ratio of a
    worker's next offset to this one (< 1: the offset shrinks, as when meetings pull the
    workers together; > 1: it spreads). ``end_gap``: per bin below 1 W, the median time
    between the ends of two writes that met (no third), second start's after the first's,
    by their start lag (how a meeting moves the offset). A bin with fewer than 5 rows:
    None. None where no trace has two workers' writes."""
    shares_of: list[np.ndarray] = []
    ratio_bins: list[list[np.ndarray]] = [[] for _ in OFFSET_EDGES[:-3]]  # offsets < 2 W
    gap_bins: list[list[np.ndarray]] = [[] for _ in OFFSET_EDGES[:-4]]  # start lags < 1 W
    for trace in traces:
        lone = write_meetings(trace)["lone_median_ns"]
        thread = trace["thread"]
        workers = np.unique(thread)
        if not lone or workers.size < 2:
            continue
        ws, we = trace["write_start"].astype(np.int64), trace["write_end"].astype(np.int64)
        for worker in workers:
            rows, other = np.flatnonzero(thread == worker), np.sort(ws[thread != worker])
            mine = ws[rows[np.argsort(ws[rows], kind="stable")]]  # in the worker's order
            at = np.searchsorted(other, mine)
            before = np.abs(mine - other[np.maximum(at - 1, 0)])
            after = np.abs(other[np.minimum(at, other.size - 1)] - mine)
            offset = np.minimum(before, after) / lone
            shares_of.append(offset)
            now, later = offset[:-1], offset[1:]
            which = np.digitize(now, OFFSET_EDGES[1:-1])
            for i, kept in enumerate(ratio_bins):
                kept.append(later[which == i] / np.maximum(now[which == i], 1e-3))
        lead, join, _, _ = write_pairs(ws, we, thread)
        lag = (ws[join] - ws[lead]) / lone
        which = np.digitize(lag, OFFSET_EDGES[1:-1])
        for i, kept in enumerate(gap_bins):
            kept.append((we[join] - we[lead])[which == i] / lone)
    if not shares_of:
        return None

    def medians(bins: list[list[np.ndarray]]) -> list[float | None]:
        pooled = [np.concatenate(b) for b in bins]
        return [float(np.median(v)) if v.size >= _MIN_IN_BIN else None for v in pooled]

    every = np.concatenate(shares_of)
    counts = np.bincount(np.digitize(every, OFFSET_EDGES[1:-1]),
                         minlength=len(OFFSET_EDGES) - 1)
    return {"shares": (counts / every.size).tolist(), "next_over_now": medians(ratio_bins),
            "end_gap": medians(gap_bins)}


def pair_losses(trace: Trace) -> dict[str, Any]:
    """What the trace's pairs of writes that met (and no third) lost, where they were
    classified (``extra_convoy_pairs``: a measure-mode real run, or a simulation with
    convoys or passing writes): how many pairs, the share that lost any coordinate, the
    mean share of the block a pair lost (both writes' losses), the quartiles of that share
    over the pairs that lost anything (how unlike lossy meetings are), and the quartiles of
    the pairs' start lag over the median lone write (how far into the first sweep the second
    began: meetings early in it lose most); None where not recorded."""
    pairs = convoy_pairs(trace)
    if pairs is None or not len(pairs):
        return {"pairs_classified": 0, "pairs_losing": None, "lost_per_pair": None,
                "lost_per_lossy_pair": None, "pair_lag_over_lone_write": None}
    lost = pairs[:, 3] + pairs[:, 4]
    lossy = lost[lost > 0]
    lone = write_meetings(trace)["lone_median_ns"]
    return {"pairs_classified": len(pairs), "pairs_losing": float(np.mean(lost > 0)),
            "lost_per_pair": float(lost.mean()),
            "lost_per_lossy_pair": (np.quantile(lossy, [0.25, 0.5, 0.75]).tolist()
                                    if lossy.size else None),
            "pair_lag_over_lone_write": (np.quantile(pairs[:, 2] / lone, [0.25, 0.5, 0.75])
                                         .tolist() if lone else None)}
