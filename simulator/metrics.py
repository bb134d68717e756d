"""Summaries of a trace (DESIGN §4): gradient error, staleness, overwrites, loss.

Pure functions of a trace and its problem, so simulated and real runs are summarised alike.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simulator.problems import Problem
from simulator.trace import EXTRA, Trace

__all__ = ["ERROR_THRESHOLD", "PHASE_BINS", "busy_intervals", "curve_rows", "diverged_at",
           "error_mask", "error_rate", "finite_mask", "interference", "overlaps",
           "relative_error", "rhythm", "stages", "summarize", "trace_rhythm", "write_meetings",
           "write_pairs"]

# An update has a gradient error when ‖δ‖ > ERROR_THRESHOLD · max(‖g‖, 1e-12).
ERROR_THRESHOLD = 1e-9
# Bins of `rhythm`'s phase profile (others' completions over a worker's cycle).
PHASE_BINS = 20


def _floor(g_norm: np.ndarray) -> np.ndarray:
    return np.maximum(g_norm, 1e-12)


def relative_error(trace: Trace) -> np.ndarray:
    """‖δ‖/‖g‖ of the measured updates (NaN where a diverged run's norms are, without a
    warning)."""
    measured = trace["measured"]
    with np.errstate(invalid="ignore"):
        return trace["delta_norm"][measured] / _floor(trace["g_norm"][measured])


def error_mask(trace: Trace) -> np.ndarray:
    """For each measured update, whether it carries a gradient error (False where ‖δ‖ or
    ‖g‖ is not finite: ``finite_mask`` leaves those out of every rate)."""
    measured = trace["measured"]
    return trace["delta_norm"][measured] > ERROR_THRESHOLD * _floor(trace["g_norm"][measured])


def finite_mask(trace: Trace) -> np.ndarray:
    """For each measured update, whether ‖δ‖ and ‖g‖ are finite: a diverged run's inf and
    NaN say neither that the update carries an error nor that it does not."""
    measured = trace["measured"]
    return np.isfinite(trace["delta_norm"][measured]) & np.isfinite(trace["g_norm"][measured])


def error_rate(trace: Trace) -> float | None:
    """The share of the measured updates with finite ‖δ‖ and ‖g‖ that carry a gradient
    error; None when there are none."""
    finite = finite_mask(trace)
    return float(error_mask(trace)[finite].mean()) if finite.any() else None


def overlaps(start: np.ndarray, end: np.ndarray, other_start: np.ndarray,
             other_end: np.ndarray, touching: bool = False) -> np.ndarray:
    """For each window [start, end], how many of the other windows overlap it in time (a
    window that ends exactly when another starts overlaps it only with ``touching``).
    Windows shared by both sets (a write compared with all writes) count themselves:
    subtract 1 there."""
    starts, ends = np.sort(other_start), np.sort(other_end)
    return (np.searchsorted(starts, end, side="right" if touching else "left")
            - np.searchsorted(ends, start, side="left" if touching else "right"))


def write_pairs(start: np.ndarray, end: np.ndarray, owner: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Writes that met in pairs: (leader, joiner) indices of two windows of different owners
    where the joiner started inside the leader's window and no third window overlaps either
    (windows that only touch do not meet), and the quiet gap around each pair: when the
    last earlier window ended and when the next window starts (int64 extremes: none)."""
    order = np.argsort(start, kind="stable")
    s, e, o = start[order], end[order], owner[order]
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    if s.size < 2:
        none = np.zeros(0, dtype=np.int64)
        return none, none, none, none
    before = np.maximum.accumulate(np.concatenate([[low], e[:-1]]))
    after = np.concatenate([s[2:], [high, high]])
    lead = np.arange(s.size - 1)
    join = lead + 1
    met = ((s[join] < e[lead]) & (o[join] != o[lead]) & (before[lead] <= s[lead])
           & (after[lead] >= np.maximum(e[lead], e[join])))
    return order[lead[met]], order[join[met]], before[lead[met]], after[lead[met]]


def write_meetings(trace: Trace) -> dict[str, float | None]:
    """How writes met, from the recorded windows alone (any trace): the share of writes that
    another write overlapped (``met_rate``), and the median duration of those and of the
    others (``met_median_ns``, ``lone_median_ns``). On dense vectors writes that meet can
    take many times a lone one and keep the workers in lockstep (docs/fidelity.md). Rows that
    stored nothing are left out; None where a group is empty."""
    writes = trace["write_end"] > trace["write_start"]
    ws, we = trace["write_start"][writes], trace["write_end"][writes]
    met = overlaps(ws, we, ws, we) > 1
    duration = we - ws

    def median(values: np.ndarray) -> float | None:
        return float(np.median(values)) if values.size else None

    return {"met_rate": float(met.mean()) if met.size else None,
            "met_median_ns": median(duration[met]), "lone_median_ns": median(duration[~met])}


def interference(trace: Trace) -> dict[str, float | None]:
    """How updates met each other in time, from the recorded windows alone (simulated and
    real traces alike): the share of writes that overlapped another write (where stores can
    be lost), the share of reads a write overlapped (where a read can see a half-written
    vector), and the gradient error rate split by staleness — among updates no other
    completion came between (``fresh``: their errors are lost stores and torn reads, not
    staleness) and among the others (``stale``), with the share of the measured updates that
    were fresh (so the error rate is ``fresh_share`` × the one rate plus the rest × the
    other); and the median duration of the writes another write overlapped and of the others
    (``met_write_median_ns``, ``lone_write_median_ns``: on dense vectors writes that meet can
    take many times a lone one, docs/fidelity.md)."""
    writes = trace["write_end"] > trace["write_start"]  # rows that stored something
    ws, we = trace["write_start"][writes], trace["write_end"][writes]
    rs, re = trace["read_start"], trace["read_end"]
    measured, stale = trace["measured"], trace["staleness"] > 0
    errors, counted = np.zeros(len(trace), dtype=bool), np.zeros(len(trace), dtype=bool)
    errors[measured], counted[measured] = error_mask(trace), finite_mask(trace)

    def share(mask: np.ndarray) -> float | None:
        return float(mask.mean()) if mask.size else None

    meetings = write_meetings(trace)
    return {"write_overlap_rate": meetings["met_rate"],
            "read_under_write_rate": share(overlaps(rs, re, ws, we)[re > rs] > 0),
            "fresh_share": share(~stale[measured]),
            "error_rate_fresh": share(errors[counted & ~stale]),
            "error_rate_stale": share(errors[counted & stale]),
            "met_write_median_ns": meetings["met_median_ns"],
            "lone_write_median_ns": meetings["lone_median_ns"]}


def rhythm(thread: np.ndarray, read_start: np.ndarray, write_end: np.ndarray,
           staleness: np.ndarray) -> dict[str, Any]:
    """Whether the workers kept a common rhythm, from the recorded windows alone (any trace).

    Over the span in which every worker runs (the latest first read start to the earliest
    last write end; updates wholly inside it), each other worker j completes at its mean rate
    r_j, so workers whose phases are independent of each other give an update of worker i
    with window W (read start to write end) W · Σ_{j≠i} r_j completions on average:
    ``independent_staleness`` is that value over the updates, ``staleness`` the measured mean
    over the same updates, and ``coupling`` their ratio — 1 for independent workers, below 1
    when completions avoid the others' windows (workers in step), 0 under a lock.
    ``phase_profile``: where the others' completions fall in a worker's cycle (read start to
    its next read start, in ``PHASE_BINS`` equal parts), as a density with 1 = uniform;
    ``phase_peak`` its largest bin. None where fewer than two workers overlap."""
    workers = np.unique(thread)
    none = {"updates": 0, "staleness": None, "independent_staleness": None,
            "coupling": None, "phase_profile": None, "phase_peak": None}
    if workers.size < 2:
        return none
    first = max(int(read_start[thread == j].min()) for j in workers)
    last = min(int(write_end[thread == j].max()) for j in workers)
    inside = (read_start >= first) & (write_end <= last)
    if last <= first or not inside.any():
        return none
    done = (write_end >= first) & (write_end <= last)
    rates = {int(j): np.count_nonzero(done & (thread == j)) / (last - first) for j in workers}
    total = sum(rates.values())
    others = total - np.array([rates[int(j)] for j in thread[inside]])
    expected = float(np.mean((write_end[inside] - read_start[inside]) * others))
    measured = float(np.mean(staleness[inside]))
    counts = np.zeros(PHASE_BINS)
    for j in workers:
        starts = np.sort(read_start[(thread == j) & inside])
        ends = write_end[done & (thread != j)]
        cycle = np.searchsorted(starts, ends, side="right") - 1
        within = (cycle >= 0) & (cycle < starts.size - 1)  # in one of j's whole cycles
        ends, cycle = ends[within], cycle[within]
        phase = (ends - starts[cycle]) / (starts[cycle + 1] - starts[cycle])
        counts += np.histogram(phase, bins=PHASE_BINS, range=(0.0, 1.0))[0]
    profile = counts / counts.mean() if counts.sum() else None
    return {"updates": int(np.count_nonzero(inside)), "staleness": measured,
            "independent_staleness": expected,
            "coupling": measured / expected if expected > 0 else None,
            "phase_profile": None if profile is None else [float(v) for v in profile],
            "phase_peak": None if profile is None else float(profile.max())}


def trace_rhythm(trace: Trace) -> dict[str, Any]:
    """:func:`rhythm` of a trace's recorded windows."""
    return rhythm(trace["thread"], trace["read_start"], trace["write_end"], trace["staleness"])


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _quantiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p95": None, "max": None}
    return {"mean": _number(values.mean()), "p50": _number(np.quantile(values, 0.5)),
            "p95": _number(np.quantile(values, 0.95)), "max": _number(values.max())}


def busy_intervals(trace: Trace, thread: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts and ends of ``thread``'s read, gradient and write phases (the time it
    works; under a model-parallel protocol a read is a stage's forward pass)."""
    rows = trace["thread"] == thread
    starts = np.concatenate([trace[f"{p}_start"][rows] for p in ("read", "grad", "write")])
    ends = np.concatenate([trace[f"{p}_end"][rows] for p in ("read", "grad", "write")])
    return starts, ends


def stages(trace: Trace, threads: int) -> list[dict[str, Any]]:
    """Per stage (thread) of a model-parallel run: its updates, their staleness and gradient
    error (‖δ‖/‖g‖ on the stage's parameters), and its time at work and idle over the run's
    span (utilisation = at work / span)."""
    start = int(trace["read_start"].min()) if len(trace) else 0
    span = max((int(trace["write_end"].max()) if len(trace) else 0) - start, 1)
    out = []
    for thread in range(threads):
        rows = trace["thread"] == thread
        measured = rows & trace["measured"]
        with np.errstate(invalid="ignore"):
            error = trace["delta_norm"][measured] / _floor(trace["g_norm"][measured])
        begin, end = busy_intervals(trace, thread)
        busy = int((end - begin).sum())
        staleness = trace["staleness"][rows].astype(np.float64)
        out.append({"stage": thread, "updates": int(rows.sum()),
                    "staleness_mean": _number(staleness.mean()) if staleness.size else None,
                    "staleness_max": int(staleness.max()) if staleness.size else None,
                    "relative_error": _quantiles(error),
                    "busy_ns": busy, "idle_ns": span - busy, "utilisation": busy / span})
    return out


def curve_rows(trace: Trace, f_star: float,
               ) -> list[tuple[int, int, float, float, float, int]]:
    """(update t, time_ns, loss, suboptimality, ‖w − w*‖², gradients computed) at each
    loss-curve checkpoint (t counts applied updates; gradients include averaged and
    discarded ones)."""
    return [(int(t), int(time), float(loss), float(loss) - f_star, float(dist2), int(n))
            for t, time, loss, dist2, n in zip(trace["curve_t"], trace["curve_time"],
                                               trace["curve_loss"], trace["curve_dist2"],
                                               trace["curve_n"], strict=True)]


def _protocol(run: Any) -> Any:
    """The protocol class ``run`` names (None for a name the simulator does not run)."""
    from simulator.protocols import PROTOCOLS

    return PROTOCOLS.get(run.protocol)


def _write_mode(scenario: Any) -> str:
    """The write mode in effect: protocols that apply pushes on a server add atomically (a
    lock-free parameter server loads and stores)."""
    run = scenario.run
    protocol = _protocol(run)
    atomic = protocol is not None and protocol.atomic and not (
        run.protocol == "paramserver" and scenario.paramserver.lock_free)
    return "atomic_add" if atomic else str(run.write_mode)


def _threads(run: Any) -> int:
    """The run's thread count: the protocol's (1 for ``serial``), not the trace's highest
    thread id (a thread that made no update has no row)."""
    protocol = _protocol(run)
    return protocol.threads(run) if protocol is not None else int(run.threads)


# Extras that are series (one value per update or per block write); every other extra is a
# list of thread ids or flat records, whatever its length.
_SERIES_EXTRAS = frozenset({"primal_residual", "dual_residual", "write_drawn_ns"})


def _extra(name: str, values: np.ndarray) -> Any:
    """A run's extra array: a series longer than 16 values (``_SERIES_EXTRAS``) as (first,
    final, min, max), anything else as its list."""
    if name in _SERIES_EXTRAS and values.size > 16:
        return {"first": _number(values[0]), "final": _number(values[-1]),
                "min": _number(values.min()), "max": _number(values.max())}
    return values.tolist()


def diverged_at(trace: Trace) -> int | None:
    """The first completion t whose recorded state is not finite (the run diverged), or
    None. A run records its state at the loss curve's points (f(w_t), ‖w_t − w*‖², always
    ending at the final vector) and at measured updates (‖s_t‖ = ‖w_{t−1} − w_t‖/lr): t is
    exact when every update is measured (``metrics.exact``, ``every = 1``), else the first
    curve point or measured update that shows it. Reads what is recorded, so a run that
    stays finite costs one pass over the final vector."""
    if np.isfinite(trace["w_final"]).all() and np.isfinite(trace["curve_loss"]).all():
        return None
    curve = ~(np.isfinite(trace["curve_loss"]) & np.isfinite(trace["curve_dist2"]))
    found = [int(trace["curve_t"][curve][0])] if curve.any() else [int(trace["step"].max())]
    measured = trace["measured"] & ~np.isfinite(trace["s_norm"])
    if measured.any():
        found.append(int(trace["step"][measured].min()))
    return min(found)


def summarize(trace: Trace, problem: Problem, scenario: Any) -> dict[str, Any]:
    """Everything ``summary.json`` holds: deterministic (no wall-clock time). A run that
    diverged (``diverged_at``) is summarised like any other, its non-finite values as NaN or
    infinity, without floating-point warnings."""
    with np.errstate(all="ignore"):
        return _summarize(trace, problem, scenario)


def _summarize(trace: Trace, problem: Problem, scenario: Any) -> dict[str, Any]:
    run, metrics = scenario.run, scenario.metrics
    measured = trace["measured"]
    n_measured = int(measured.sum())
    staleness = trace["staleness"].astype(np.float64)
    w_star, f_star = problem.optimum()
    final = float(trace["curve_loss"][-1])
    end = int(trace["write_end"].max()) if len(trace) else 0
    start = int(trace["read_start"].min()) if len(trace) else 0
    span = max(end - start, 1)
    dot = trace["delta_dot"][measured]
    return {
        "source": trace.source,
        "scenario": scenario.name,
        "protocol": run.protocol,
        "threads": _threads(run),
        "updates": len(trace),
        "steps": int(trace["step"].max()) if len(trace) else 0,
        "ended_early": len(trace) < run.updates,
        "diverged_at": diverged_at(trace),
        "discarded": int((trace["step"] == 0).sum()),
        "injected": {"mean_delay": _number(trace["delay"].mean()) if len(trace) else None,
                     "errors": int((trace["error_norm"] > 0).sum()),
                     "dropped_writes": int(trace["dropped"].sum())},
        **{name[len(EXTRA):]: _extra(name[len(EXTRA):], trace[name])
           for name in sorted(trace.arrays) if name.startswith(EXTRA)},
        "blocks": run.blocks,
        "write_mode": _write_mode(scenario),
        "lr": run.lr,
        "problem": problem.describe(),
        "time": {"span_ns": span, "updates_per_second": len(trace) / (span * 1e-9)},
        "exact_metrics": {"enabled": metrics.exact, "every": metrics.every,
                          "measured_updates": n_measured},
        "gradient_error": {
            "rate": error_rate(trace),
            "relative": _quantiles(relative_error(trace)),
            "mean_norm": _number(trace["delta_norm"][measured].mean()) if n_measured else None,
            "mean_neg_dot": _number(-dot.mean()) if n_measured else None,
            "mean_s_norm2": (_number((trace["s_norm"][measured] ** 2).mean())
                             if n_measured else None),
        },
        "staleness": {"mean": _number(staleness.mean()) if len(trace) else None,
                      "p95": _number(np.quantile(staleness, 0.95)) if len(trace) else None,
                      "max": int(staleness.max()) if len(trace) else None},
        "writes": write_meetings(trace),
        "overwrites": {
            "read_overwrite_blocks": int(trace["read_overwrites"].sum()),
            "updates_with_read_overwrite": int((trace["read_overwrites"] > 0).sum()),
            "torn_reads": int(trace["torn"].sum()),
            "lost_blocks": int(trace["lost_blocks"].sum()),
            "updates_with_lost_blocks": int((trace["lost_blocks"] > 0).sum()),
        },
        "loss": {"initial": float(trace["curve_loss"][0]), "final": final,
                 "optimum": f_star, "final_suboptimality": final - f_star,
                 "final_distance": float(np.linalg.norm(trace["w_final"] - w_star))},
        "task": {"accuracy": problem.accuracy(trace["w_final"]),
                 "held_out_accuracy": problem.held_out_accuracy(trace["w_final"])},
        **({"stages": stages(trace, _threads(run))} if _staged(run) else {}),
    }


def _staged(run: Any) -> bool:
    """Whether ``run``'s protocol runs a model's stages on its threads."""
    protocol = _protocol(run)
    return protocol is not None and protocol.partial
