"""Merging real workers' timestamps into a trace in the simulator's schema.

From the merged timeline, at block granularity, the records go to the one trace builder
(:class:`simulator.trace.TraceBuilder`):

* completions are write ends in time order; an update's staleness is the number of other
  completions between its read start and its own write end (the builder counts the writes
  that ended by the read's start: the workers count nothing);
* an update's local work before its read (``idle_ns``) runs from its worker's previous write
  end, or the run's first read, to its read start (the builder's, as the parameter
  server's): replaying these with the recorded durations puts every event at its recorded
  time;
* read-overwrites and torn reads from the block copy and store ends, by the one definition
  every trace uses (:func:`simulator.trace.read_report`).

Stores that the hardware lost cannot be seen from timestamps: ``lost_blocks`` stays 0; measure
mode (``realrun.rebuild``) adds exact gradient errors and the distance between the rebuilt and
the real final vector. Timestamps are made relative to the earliest read start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun.rebuild import convoy_losses, read_sweeps, rebuild
from simulator.problems import Problem
from simulator.trace import COLUMNS, RECORD, Trace, TraceBuilder

__all__ = ["Measure", "WorkerRecord", "hardware_loss", "merge", "overlap_rate", "thread_ends"]


@dataclass(frozen=True)
class WorkerRecord:
    """One worker's completed updates (n rows): times (n, 4) = read start, read end, gradient
    end, write end; copy_end, store_end (n, B) with −1 for untouched blocks; samples (n,),
    one gradient per update."""

    times: np.ndarray
    copy_end: np.ndarray
    store_end: np.ndarray
    samples: np.ndarray
    scales: np.ndarray | None = None  # the factor on lr each update applied (None: 1)
    injected: np.ndarray | None = None  # (n, 3): ‖e‖ injected, 1.0 if dropped, delay τ
    residuals: np.ndarray | None = None  # admm (n, 2): primal and dual after each push
    # (n,): a server discarded the update (it stores nothing, completes nothing: step 0)
    discarded: np.ndarray | None = None
    # (n,): a gradient accumulated into a push (``paramserver.accumulate``) that a later row,
    # its worker's next one that is no member, writes: it reads only if it is its push's
    # first, stores nothing and shares the push's completion
    member: np.ndarray | None = None


def _stacked(records: list[WorkerRecord]) -> dict[str, np.ndarray]:
    return {
        "times": np.concatenate([r.times for r in records]),
        "copy_end": np.concatenate([r.copy_end for r in records]),
        "store_end": np.concatenate([r.store_end for r in records]),
        "samples": np.concatenate([r.samples for r in records]),
        "thread": np.concatenate([np.full(len(r.samples), k) for k, r in enumerate(records)]),
        "thread_seq": np.concatenate([np.arange(len(r.samples)) for r in records]),
        "scales": np.concatenate([np.ones(len(r.samples)) if r.scales is None else r.scales
                                  for r in records]),
        "injected": np.concatenate([np.zeros((len(r.samples), 3)) if r.injected is None
                                    else r.injected for r in records]),
        "residuals": np.concatenate([np.full((len(r.samples), 2), np.nan)
                                     if r.residuals is None else r.residuals
                                     for r in records]),
        "discarded": np.concatenate([np.zeros(len(r.samples), dtype=bool)
                                     if r.discarded is None else r.discarded
                                     for r in records]),
        "member": np.concatenate([np.zeros(len(r.samples), dtype=bool)
                                  if r.member is None else r.member for r in records]),
    }


def _pushes(member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (stacked: each worker's rows in order, one after the other), the first and
    the last row of its push: a push is a run of ``member`` rows and the row that writes
    them (a worker's last row is never a member)."""
    rows = np.arange(member.size)
    first = np.ones(member.size, dtype=bool)
    first[1:] = ~member[:-1]
    reader = np.maximum.accumulate(np.where(first, rows, 0)) if rows.size else rows
    writer = np.minimum.accumulate(np.where(member, rows.size, rows)[::-1])[::-1]
    return reader, writer


@dataclass(frozen=True)
class Measure:
    """What measure mode adds: the steps each worker subtracted and how to replay them."""

    problem: Problem
    lr: float
    bounds: list[int]
    dtype: str
    every: int
    curve_points: int
    bits: int  # inject.write_bits: stores rounded to these significand bits (0: none)
    steps: list[np.ndarray]
    reads: list[np.ndarray] | None = None  # the read copies, where the workers keep them
    exact: bool = True  # False: the loss curve alone (ADMM's pushes are not SGD steps)


def merge(records: list[WorkerRecord], w0: np.ndarray, w_final: np.ndarray,
          curve: list[tuple[int, int, float, float]], scenario_toml: str,
          measure: Measure | None = None, rounds: bool = False,
          dead: list[int] | None = None, origin: int | None = None,
          writers: np.ndarray | None = None) -> tuple[Trace, dict[str, Any] | None]:
    """A trace (source ``real``) from the workers' records, and in measure mode what the
    hardware lost. ``curve`` (completions, time, f(w), ‖w − w*‖²) is the parent's sampled
    curve; measure mode replaces it with the exact rebuilt one.

    An update's read ends with its last block copy and the update completes with its last
    block store (its write end). ``rounds``: synchronous rounds (``realrun.worker.Rounds``),
    each worker's i-th update in round i, whose one writer stored the blocks; the round is
    completion i + 1 for every member, and the others' empty writes sit at its end (as the
    simulator's minibatch records them), before the writer's row. A worker's ``member`` rows
    are gradients accumulated into a push (``paramserver.accumulate``, a pool's trainer) with
    the next row that is none, which alone stores (the push's mean step): they share its
    completion and its read's count of completions before it, their writes are empty at its
    end, before its row, and its measured δ is against the mean gradient of the push's
    samples (as the simulator's group). ``dead``: the workers an
    injected death killed (``extra_dead_threads``, as the simulator records it). ADMM's
    residuals after each push are recorded in completion order (``extra_primal_residual``,
    ``extra_dual_residual``, as the simulator's ``admm``). ``origin``: the time that is the
    trace's 0 (None: the earliest read start). ``writers``: per row (stacked: each worker's
    rows in order, one after the other), the row that writes its group, another worker's
    for a member (a pool's backup-worker rounds, one gradient per push): such groups
    instead of ``member`` rows, each member reading for itself."""
    data = _stacked(records)
    times = data["times"]
    if origin is None:
        origin = int(times[:, 0].min()) if len(times) else 0
    copy_end = np.where(data["copy_end"] >= 0, data["copy_end"] - origin, -1)
    store_end = np.where(data["store_end"] >= 0, data["store_end"] - origin, -1)
    rel = times - origin
    # As in the simulator, a read ends with its last block copy and a write with its last
    # block store (the timestamps taken after each loop come a few ns later).
    member = data["member"]
    if writers is None:
        reader, writer = _pushes(member)
    else:
        reader, writer = np.arange(writers.size), writers
        member = writers != reader
    if len(rel):  # (a round's member stored nothing: its write end is the round's, below)
        copied, last = copy_end.max(axis=1), store_end.max(axis=1)
        rel[:, 1] = np.where(copied >= 0, copied, rel[:, 1])  # (a push's later gradients)
        rel[:, 3] = np.where(last >= 0, last, rel[:, 3])[writer]  # (a member's: its push's)
    # A push's members are applied, without writing themselves, when its write ends (the
    # simulator's group: an empty write at its end, the rows before its writer's).
    writes = ~member
    write_start = np.where(member, rel[:, 3], rel[:, 2])
    if rounds:
        writes, completed = _rounds(rel, write_start, data["thread_seq"], store_end)
    start_order = np.lexsort((data["thread"], rel[:, 0]))
    uid = np.empty(len(rel), dtype=np.int64)
    uid[start_order] = np.arange(len(rel))
    order = np.lexsort((data["thread"], writes, rel[:, 3]))  # completion order
    kept = ~data["discarded"]
    if rounds:
        seen = completed - 1
    else:  # completions by each row's write end, its own if kept (a member: its push's)
        applied = kept & writes
        completed = np.empty(len(rel), dtype=np.int64)
        completed[order] = np.cumsum(applied[order])
        completed = completed[writer]
        # Those before its read: the applied writes that ended by its push's read start (a
        # member saw what its push's pull saw; the builder would count a push's every row).
        seen = np.searchsorted(np.sort(rel[applied, 3]), rel[reader, 0], side="right")
    nan = np.full(len(rel), np.nan)
    columns = {
        "uid": uid, "thread": data["thread"], "thread_seq": data["thread_seq"],
        "sample": data["samples"], "step": np.where(kept, completed, 0),
        "read_start": rel[:, 0], "read_end": rel[:, 1],
        "grad_start": rel[:, 1], "grad_end": rel[:, 2], "write_start": write_start,
        "write_end": rel[:, 3], "grad_ns": rel[:, 2] - rel[:, 1],
        # Local work before each update: from the times, by the builder (the workers measure
        # none); the completions before its read: counted above.
        "idle_ns": np.full(len(rel), -1),
        "seen": seen,
        "completed": completed,
        "overwrote": np.zeros(len(rel)), "delay": data["injected"][:, 2],
        "error_norm": data["injected"][:, 0], "dropped": data["injected"][:, 1] > 0,
        "lr_scale": data["scales"], "measured": np.zeros(len(rel), dtype=bool),
        "s_norm": nan, "g_norm": nan, "delta_norm": nan, "delta_dot": nan,
    }
    arrays: dict[str, np.ndarray] = {
        name: np.asarray(columns[name], dtype=COLUMNS.get(name, np.int64))[order]
        for name in RECORD}
    extras: dict[str, np.ndarray] = ({} if dead is None else
                                     {"dead_threads": np.asarray(dead, dtype=np.int64)})
    if any(r.residuals is not None for r in records):
        extras["primal_residual"] = data["residuals"][order, 0]
        extras["dual_residual"] = data["residuals"][order, 1]
    loss, computed = None, None
    if measure is not None:
        built = rebuild(measure.problem, measure.lr, measure.bounds, measure.dtype,
                        measure.every, store_end[order], measure.steps,
                        arrays["thread"], arrays["thread_seq"], data["samples"][order],
                        arrays["write_end"], measure.reads, rel[order],
                        curve_points=measure.curve_points, scales=arrays["lr_scale"],
                        bits=measure.bits,
                        groups=_groups(arrays["step"], data["samples"][order]) if rounds
                        else _pushed(data["samples"], writer, kept, order)
                        if member.any() else None,
                        dropped=arrays["dropped"], exact=measure.exact)
        if built.measurements:  # a run stopped before its first update has none
            for name, values in zip(("measured", "s_norm", "g_norm", "delta_norm",
                                     "delta_dot"), zip(*built.measurements, strict=True),
                                    strict=True):
                arrays[name] = np.asarray(values, dtype=COLUMNS[name])
        if (measure.reads is not None and len(measure.bounds) == 2 and not rounds
                and measure.exact):  # lock-free writes of one block
            extras["convoy_pairs"] = convoy_losses(
                rel[order], arrays["thread"], arrays["thread_seq"], arrays["uid"],
                measure.steps, measure.reads, measure.dtype)
            extras["read_sweeps"] = read_sweeps(
                rel[order], arrays["thread"], arrays["thread_seq"], measure.steps,
                measure.reads, measure.dtype)
        curve = [(t, time + origin, f, d) for t, time, f, d, _ in built.curve]
        computed = [n for *_, n in built.curve]  # (the view's count: gradients, not pushes)
        loss = hardware_loss(built.w_final, w_final, w0,
                             "real memory" if measure.reads is not None
                             else "lossless rebuild", built.quiet_reads)
    t, time, f, dist2 = (np.asarray(c) for c in zip(*curve, strict=True))
    # Gradients computed by completion t: t, or in rounds those of the first t rounds, or
    # with accumulated pushes the rebuilt view's count.
    n = (computed if computed is not None and member.any() else t if not rounds
         else np.searchsorted(np.sort(arrays["step"]), t, side="right"))
    builder = TraceBuilder()
    builder.extend(arrays, *_ops(rel[order], copy_end[order], store_end[order],
                                 write_start[order]))
    return builder.build(scenario_toml, w0, w_final,
                         {"curve_t": t.astype(np.int64),
                          "curve_time": np.maximum(time - origin, 0).astype(np.int64),
                          "curve_loss": f.astype(np.float64),
                          "curve_dist2": dist2.astype(np.float64),
                          "curve_n": np.asarray(n, dtype=np.int64)},
                         extras=extras, source="real"), loss


def hardware_loss(rebuilt: np.ndarray, real: np.ndarray, w0: np.ndarray, view: str,
                  quiet_reads: int = 0) -> dict[str, Any]:
    """What the hardware lost: the distance from the rebuilt final vector (every step the
    program asked for, applied in completion order) to the real one, also as a share of the
    distance the real vector moved; ``view``: what the serialized view was measured on."""
    real = np.asarray(real, dtype=np.float64)
    gap = np.asarray(rebuilt, dtype=np.float64) - real
    moved = float(np.linalg.norm(real - w0))
    return {"rebuilt_vs_real_norm": float(np.linalg.norm(gap)),
            "rebuilt_vs_real_max": float(np.abs(gap).max()) if gap.size else 0.0,
            "relative_to_distance_moved": float(np.linalg.norm(gap)) / max(moved, 1e-300),
            "view": view, "quiet_reads": quiet_reads}


def _groups(step: np.ndarray, samples: np.ndarray) -> list[list[int]]:
    """Per row (in trace order), the samples of its round's gradients (rows of one step)."""
    rounds: dict[int, list[int]] = {}
    for t, sample in zip(step.tolist(), samples.tolist(), strict=True):
        rounds.setdefault(t, []).append(sample)
    return [rounds[t] for t in step.tolist()]


def _pushed(samples: np.ndarray, writer: np.ndarray, kept: np.ndarray,
            order: np.ndarray) -> list[list[int]]:
    """Per row (in ``order``), the samples of its group's gradients (the rows that share its
    ``writer``: an accumulated push's, a round's), whose mean step the writer's stores
    subtracted; none for a row that was not ``kept`` (it subtracted nothing)."""
    groups: dict[int, list[int]] = {}
    for row, (sample, by) in enumerate(zip(samples.tolist(), writer.tolist(), strict=True)):
        if kept[row]:
            groups.setdefault(by, []).append(sample)
    return [groups.get(int(writer[i]), []) if kept[i] else [] for i in order.tolist()]


def _rounds(rel: np.ndarray, write_start: np.ndarray, seq: np.ndarray,
            store_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Synchronous rounds (``merge``): each member's write moved to its round's end (its
    start and end both the writer's write end, in ``rel`` and ``write_start``; a round whose
    writer's row is missing, from a run stopped under it, keeps its members' own), and per
    row whether it wrote and its completion (its round + 1)."""
    writes = (store_end.max(axis=1) >= 0 if len(rel) else np.zeros(0, dtype=bool))
    ends = np.full(int(seq.max()) + 1 if len(seq) else 0, -1, dtype=np.int64)
    ends[seq[writes]] = rel[writes, 3]
    members = ~writes & (ends[seq] >= 0)
    rel[members, 3] = write_start[members] = ends[seq[members]]
    # The writer's write begins when the last member's gradient ended (its own wait at the
    # barrier is not writing: the simulator's writer is the last to arrive and never waits).
    last = np.full(ends.size, -1, dtype=np.int64)
    np.maximum.at(last, seq, rel[:, 2])
    write_start[writes] = last[seq[writes]]
    return writes, seq + 1


def _durations(start: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per block: its end minus the previous touched block's end in the same row (or the
    row's ``start``); rows are updates, −1 marks untouched blocks."""
    n, blocks = ends.shape
    valid = np.concatenate([np.ones((n, 1), dtype=bool), ends >= 0], axis=1)
    values = np.concatenate([start[:, None], ends], axis=1)
    last = np.where(valid, np.arange(blocks + 1), 0)
    np.maximum.accumulate(last, axis=1, out=last)
    return ends - np.take_along_axis(values, last, axis=1)[:, :-1]


def _ops(rel: np.ndarray, copy_end: np.ndarray, store_end: np.ndarray,
         write_start: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each update's count of block operations and the operations (touched blocks, in block
    order): the block, its read and write durations (from the read's and the write's start),
    when its copy and store ended (a block a round's member copied and did not store: no
    write, 0; one the writer of an accumulated push stored and did not copy: no read, 0)."""
    touched = (copy_end >= 0) | (store_end >= 0)
    rows, blocks = np.nonzero(touched)
    read = np.where(copy_end >= 0, _durations(rel[:, 0], copy_end), 0)
    written = np.where(store_end >= 0, _durations(write_start, store_end), 0)
    return touched.sum(axis=1), {
        "block": blocks, "read_ns": read[rows, blocks],
        "write_ns": written[rows, blocks],
        "copied": copy_end[rows, blocks], "stored": store_end[rows, blocks]}


def thread_ends(trace: Trace) -> list[np.ndarray]:
    """Each thread's write ends (ns), for :func:`overlap_rate`."""
    threads = int(trace["thread"].max()) + 1 if len(trace) else 0
    return [trace["write_end"][trace["thread"] == rank] for rank in range(threads)]


def overlap_rate(ends: list[np.ndarray]) -> float:
    """Updates per second while every worker runs: completions inside [the latest first
    completion, the earliest last completion] over that window's length (spawned workers
    start and end at different times; this leaves the ramps out)."""
    low = max(int(e.min()) for e in ends)
    high = min(int(e.max()) for e in ends)
    if high <= low:
        return float("nan")
    inside = sum(int(((e > low) & (e <= high)).sum()) for e in ends)
    return inside / ((high - low) * 1e-9)
