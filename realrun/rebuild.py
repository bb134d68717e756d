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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.problems import Problem
from simulator.view import Measurement, SerializedView

__all__ = ["Rebuild", "rebuild"]


@dataclass(frozen=True)
class Rebuild:
    """Measurements per row (in the given completion order), the exact loss curve and the
    rebuilt final vector."""

    measurements: list[Measurement]
    curve: list[tuple[int, int, float, float, int]]
    w_final: np.ndarray


def rebuild(problem: Problem, lr: float, bounds: list[int], dtype: str, every: int,
            store_end: np.ndarray, steps: list[np.ndarray], thread: np.ndarray,
            seq: np.ndarray, samples: np.ndarray, write_end: np.ndarray) -> Rebuild:
    """Replay the block stores of every row (rows in completion order).

    ``store_end[i, b]`` is when row i's store to block b finished (−1: untouched), ``steps[r]``
    the steps worker r subtracted, indexed by ``seq``; ``samples[i]`` the samples row i's
    step averaged (one per row, or m per row).
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
    for event in order.tolist():
        row, block = int(ev_row[event]), int(ev_block[event])
        lo, hi = bounds[block], bounds[block + 1]
        w[lo:hi] -= steps[int(thread[row])][int(seq[row]), lo:hi]
        remaining[row] -= 1
        if remaining[row] == 0:
            completed += 1
            measurements[row] = view.complete(completed, w.astype(np.float64),
                                              samples[row].tolist(), int(write_end[row]))
    assert all(m is not None for m in measurements)
    return Rebuild([m for m in measurements if m is not None], view.curve,
                   w.astype(np.float64))
