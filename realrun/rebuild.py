"""Exact gradient errors of a real run, by offline rebuild (DESIGN §6).

A snapshot of the shared vector taken at write time would itself be a torn read, so the
serialized view is rebuilt instead: starting from w_0, every block store of every update is
applied in store-timestamp order, in the run's dtype and with the very operation the worker ran
(``w[block] -= step[block]``). An update completes with its last block store; right after it the
rebuilt vector is w_t, and the simulator's :class:`SerializedView` measures δ_t, ⟨δ_t, w − w*⟩
and the loss curve exactly as for a simulation.

Applying every step is what the program asked for. If the hardware lost any (two processes'
read-modify-writes of one element interleaving), the real final vector differs from the
rebuilt one: that distance is what the hardware itself lost.

A lost store stays in the real vector: every later read sees it. Measured against the lossless
rebuild, every update after the first loss would carry a gradient error, which is the
accumulated loss, not the update's own. The simulator's view is the memory itself (a store it
loses is one completion's error, then the vector moves on from there), and so is this one when
the workers' read copies are recorded (dense problems, numpy workers): a *quiet* read — one no
write overlapped in time — is an exact copy of the real vector, and its difference from the
rebuild is the loss accumulated so far. The view is the rebuild plus the latest such loss, so a
loss enters δ once, at the first completion after a quiet read revealed it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.metrics import overlaps, write_pairs
from simulator.problems import Problem
from simulator.rules import round_significand
from simulator.view import UNMEASURED, Measurement, SerializedView

__all__ = ["Rebuild", "convoy_losses", "quiet_reads", "read_sweeps", "rebuild"]


@dataclass(frozen=True)
class Rebuild:
    """Measurements per row (in the given completion order), the exact loss curve and the
    rebuilt final vector."""

    measurements: list[Measurement]
    curve: list[tuple[int, int, float, float, int]]
    w_final: np.ndarray
    quiet_reads: int = 0  # reads that showed the real vector (0: the view is lossless)


def quiet_reads(read_start: np.ndarray, read_end: np.ndarray, write_start: np.ndarray,
                write_end: np.ndarray) -> np.ndarray:
    """Rows whose read window no write window (of any row) overlaps, not even at an end
    point, in read-start order."""
    quiet = np.flatnonzero(overlaps(read_start, read_end, write_start, write_end,
                                    touching=True) == 0)
    return quiet[np.argsort(read_start[quiet], kind="stable")]


def convoy_losses(times: np.ndarray, thread: np.ndarray, seq: np.ndarray, uid: np.ndarray,
                  steps: list[np.ndarray], reads: list[np.ndarray], dtype: str) -> np.ndarray:
    """Which coordinates two real writes that met lost, from the read copies (one block).

    For each pair of writes that met and no third (:func:`simulator.metrics.write_pairs`)
    with a read before them that nothing could change (it began after every earlier write
    ended and ended before the pair began) and one after them (began after both ended,
    ended before the next write began), the vector after is compared coordinate by
    coordinate with what the two subtractions give in the run's dtype: both applied,
    only the joiner's (the leader's store was lost) or only the leader's. A pair where any
    coordinate matches none of them (something else changed the vector) is left out, and
    so is a coordinate where the outcomes coincide. Returns rows of
    ``simulator.trace.CONVOY_PAIR_COLUMNS``, flat. ``times[i]`` = (read start, read end,
    write start, write end) of row i."""
    rs, re, ws, we = times.T
    leaders, joiners, quiet_from, quiet_until = write_pairs(ws, we, thread)
    rows: list[tuple[float, float, float, float, float]] = []
    by_start = np.argsort(rs, kind="stable")
    starts = rs[by_start]
    kind = np.dtype(dtype).type
    for a, b, previous_end, following in zip(leaders.tolist(), joiners.tolist(),
                                             quiet_from.tolist(), quiet_until.tolist(),
                                             strict=True):
        pre = _read_within(starts, re, by_start, previous_end, ws[a])
        post = _read_within(starts, re, by_start, max(we[a], we[b]), following)
        if pre is None or post is None:
            continue
        w0 = reads[int(thread[pre])][int(seq[pre])].astype(kind)
        w1 = reads[int(thread[post])][int(seq[post])].astype(kind)
        sa = steps[int(thread[a])][int(seq[a])].astype(kind)
        sb = steps[int(thread[b])][int(seq[b])].astype(kind)
        both = ((w0 - sa) - sb, (w0 - sb) - sa)
        only_a, only_b = w0 - sa, w0 - sb
        either = (w1 == both[0]) | (w1 == both[1])
        if not np.all(either | (w1 == only_a) | (w1 == only_b)):
            continue
        clear = ~either & (only_a != only_b)
        rows.append((float(uid[a]), float(uid[b]), float(ws[b] - ws[a]),
                     float(np.mean(clear & (w1 == only_b))),
                     float(np.mean(clear & (w1 == only_a)))))
    return np.asarray(rows, dtype=np.float64).ravel()


def read_sweeps(times: np.ndarray, thread: np.ndarray, seq: np.ndarray,
                steps: list[np.ndarray], reads: list[np.ndarray], dtype: str) -> np.ndarray:
    """What the read copies held of a write in flight, from the read copies (one block).

    For each write that met no other write, the vector before it is the latest quiet read's
    copy (:func:`quiet_reads`, ended by the write's start) less the steps of the writes that
    ended in between (all of which met no other). Each other worker's read whose window
    overlapped that write's, and no other write's, is compared with it coordinate by
    coordinate: every coordinate the step changes must hold the value before the write or
    after it (else the row is left out). Returns rows of
    ``simulator.trace.READ_SWEEP_COLUMNS``, flat: how long before the read's end the write
    began, the write's duration, the coordinates its step changes, how many of them the copy
    holds after the write. ``times[i]`` = (read start, read end, write start, write end)."""
    rs, re, ws, we = times.T
    lone = overlaps(ws, we, ws, we) == 1
    quiet = quiet_reads(rs, re, ws, we)
    quiet = quiet[np.argsort(re[quiet], kind="stable")]
    quiet_ends = re[quiet]
    by_end = np.argsort(we, kind="stable")
    ends = we[by_end]
    starts = np.sort(ws)
    by_read = np.argsort(rs, kind="stable")
    read_starts = rs[by_read]
    kind = np.dtype(dtype).type
    rows: list[tuple[float, float, float, float]] = []
    for x in np.flatnonzero(lone).tolist():
        q = int(np.searchsorted(quiet_ends, ws[x], side="right")) - 1
        if q < 0:
            continue
        source = int(quiet[q])
        between = by_end[np.searchsorted(ends, re[source], side="right"):
                         np.searchsorted(ends, ws[x], side="right")]
        if not lone[between].all():
            continue
        before = reads[int(thread[source])][int(seq[source])].astype(kind)
        for m in between.tolist():
            before = before - steps[int(thread[m])][int(seq[m])].astype(kind)
        after = before - steps[int(thread[x])][int(seq[x])].astype(kind)
        changed = after != before
        if not changed.any():
            continue
        earlier = int(np.searchsorted(ends, ws[x], side="right"))
        previous_end = ends[earlier - 1] if earlier else np.iinfo(np.int64).min
        later = int(np.searchsorted(starts, ws[x], side="right"))
        next_start = starts[later] if later < starts.size else np.iinfo(np.int64).max
        first = int(np.searchsorted(read_starts, previous_end, side="left"))
        for k in by_read[first:].tolist():
            if rs[k] >= we[x]:
                break
            if thread[k] == thread[x] or re[k] <= ws[x] or re[k] > next_start:
                continue
            copy = reads[int(thread[k])][int(seq[k])].astype(kind)
            stored = copy == after
            if not np.all(stored | (copy == before)):
                continue
            rows.append((float(re[k] - ws[x]), float(we[x] - ws[x]), float(changed.sum()),
                         float((stored & changed).sum())))
    return np.asarray(rows, dtype=np.float64).ravel()


def _read_within(starts: np.ndarray, re: np.ndarray, by_start: np.ndarray, low: int,
                 high: int) -> int | None:
    """A row whose read began after ``low`` and ended by ``high`` (the earliest such);
    ``by_start`` orders the rows by read start, ``starts`` are their read starts."""
    first = int(np.searchsorted(starts, low, side="right"))
    for position, row in enumerate(by_start[first:].tolist(), start=first):
        if starts[position] >= high:
            return None
        if re[row] <= high:
            return int(row)
    return None


def _round_touched(w: np.ndarray, lo: int, hi: int, support: np.ndarray | None,
                   bits: int) -> None:
    """Round a block's stored coordinates ``[lo, hi)`` of ``support`` (None: all of them)
    to ``bits`` significand bits, as a worker's store rounded them."""
    if support is None:
        round_significand(w[lo:hi], bits)
        return
    inside = support[(support >= lo) & (support < hi)]
    values = w[inside]
    round_significand(values, bits)
    w[inside] = values


def rebuild(problem: Problem, lr: float, bounds: list[int], dtype: str, every: int,
            store_end: np.ndarray, steps: list[np.ndarray], thread: np.ndarray,
            seq: np.ndarray, samples: np.ndarray, write_end: np.ndarray,
            reads: list[np.ndarray] | None = None, times: np.ndarray | None = None, *,
            curve_points: int, scales: np.ndarray | None = None, bits: int = 0,
            groups: list[list[int]] | None = None,
            dropped: np.ndarray | None = None, exact: bool = True) -> Rebuild:
    """Replay the block stores of every row (rows in completion order).

    ``store_end[i, b]`` is when row i's store to block b finished (−1: untouched), ``steps[r]``
    the steps worker r subtracted, indexed by ``seq``; ``samples[i]`` the sample of row
    i's gradient. With ``reads[r]`` (the read copies worker r
    computed its gradients at) and ``times[i]`` = (read start, read end, write start, write
    end), the view follows the real memory's losses (module docstring). The loss curve is
    taken at the simulator's checkpoints for ``curve_points`` (``metrics.curve_points``).
    ``scales[i]``: the factor on lr row i's step took (an update rule's; the view divides it
    out, as the simulator's does). ``bits``: each block store's values rounded to that many
    significand bits (``inject.write_bits``) over the coordinates row i's gradient touches
    (nothing for a ``dropped`` write), as the workers stored them. ``groups[i]``: the
    samples whose mean step row i's stores subtracted (a synchronous round: its writer's row
    holds the round's mean step; the other members' rows store nothing and are not
    measured, as in the simulator; an accumulated push's rows, whose last stores their mean
    step; empty: a discarded row, in no group). ``exact`` false: the loss curve alone, no
    row measured (updates that are not SGD steps: ADMM's pushes, each of which moves every
    coordinate, so ``bits`` rounds a store's whole block, as the workers' dense pushes stored
    it).
    """
    n = len(store_end)
    w = problem.initial().astype(dtype)
    view = SerializedView(problem, lr, problem.initial(), n, exact, every, curve_points)
    ev_row, ev_block = np.nonzero(store_end >= 0)
    order = np.lexsort((ev_block, thread[ev_row], store_end[ev_row, ev_block]))
    remaining = (store_end >= 0).sum(axis=1)
    measurements: list[Measurement | None] = [None] * n
    completed = computed = 0  # completions, and the gradients they applied
    # Rows a server discarded (no stores, in no group: an empty one) count among the
    # gradients computed by the completions after them, as the simulator's rows do.
    skipped = np.cumsum((remaining == 0) if groups is None
                        else (remaining == 0) & np.asarray([not g for g in groups], bool))
    anchors: list[int] = []
    if reads is not None and times is not None:
        anchors = quiet_reads(*times.T).tolist()[::-1]  # popped from the end, earliest first
    seen = len(anchors)
    loss: np.ndarray | None = None  # real − rebuilt, as of the latest quiet read
    for event in order.tolist():
        row, block = int(ev_row[event]), int(ev_block[event])
        while anchors and times is not None and times[anchors[-1], 0] < store_end[row, block]:
            quiet = anchors.pop()  # nothing was stored during its read: w is what it saw
            assert reads is not None
            loss = reads[int(thread[quiet])][int(seq[quiet])] - w.astype(np.float64)
        lo, hi = bounds[block], bounds[block + 1]
        w[lo:hi] -= steps[int(thread[row])][int(seq[row]), lo:hi]
        if bits and not (dropped is not None and dropped[row]):
            _round_touched(w, lo, hi, problem.support(int(samples[row])) if exact else None,
                           bits)
        remaining[row] -= 1
        if remaining[row] == 0:
            completed += 1
            computed += 1 if groups is None else len(groups[row])
            now = w.astype(np.float64)
            measurements[row] = view.complete(completed, now if loss is None else now + loss,
                                              [int(samples[row])] if groups is None
                                              else groups[row], int(write_end[row]),
                                              1.0 if scales is None else float(scales[row]),
                                              n=computed + int(skipped[row]))
    if n and skipped[-1]:  # the curve ends with every row, discarded ones included
        view.finish(completed, w.astype(np.float64), int(write_end.max()),
                    computed + int(skipped[-1]))
    # A row that stored nothing is not measured: a round's member (its writer's row measures
    # the round) or a push a server discarded.
    measurements = [UNMEASURED if m is None and not (store_end[i] >= 0).any() else m
                    for i, m in enumerate(measurements)]
    assert all(m is not None for m in measurements)
    return Rebuild([m for m in measurements if m is not None], view.curve,
                   w.astype(np.float64), seen)
