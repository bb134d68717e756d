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

from simulator.metrics import overlaps
from simulator.problems import Problem
from simulator.view import Measurement, SerializedView

__all__ = ["Rebuild", "quiet_reads", "rebuild"]


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


def rebuild(problem: Problem, lr: float, bounds: list[int], dtype: str, every: int,
            store_end: np.ndarray, steps: list[np.ndarray], thread: np.ndarray,
            seq: np.ndarray, samples: np.ndarray, write_end: np.ndarray,
            reads: list[np.ndarray] | None = None, times: np.ndarray | None = None
            ) -> Rebuild:
    """Replay the block stores of every row (rows in completion order).

    ``store_end[i, b]`` is when row i's store to block b finished (−1: untouched), ``steps[r]``
    the steps worker r subtracted, indexed by ``seq``; ``samples[i]`` the samples row i's
    step averaged (one per row, or m per row). With ``reads[r]`` (the read copies worker r
    computed its gradients at) and ``times[i]`` = (read start, read end, write start, write
    end), the view follows the real memory's losses (module docstring).
    """
    samples = samples[:, None] if samples.ndim == 1 else samples
    n = len(store_end)
    w = problem.initial().astype(dtype)
    view = SerializedView(problem, lr, problem.initial(), n, True, every, 100)
    ev_row, ev_block = np.nonzero(store_end >= 0)
    order = np.lexsort((ev_block, thread[ev_row], store_end[ev_row, ev_block]))
    remaining = (store_end >= 0).sum(axis=1)
    measurements: list[Measurement | None] = [None] * n
    completed = 0
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
        remaining[row] -= 1
        if remaining[row] == 0:
            completed += 1
            now = w.astype(np.float64)
            measurements[row] = view.complete(completed, now if loss is None else now + loss,
                                              samples[row].tolist(), int(write_end[row]))
    assert all(m is not None for m in measurements)
    return Rebuild([m for m in measurements if m is not None], view.curve,
                   w.astype(np.float64), seen)
