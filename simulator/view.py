"""The serialized view of a run (DESIGN §4): the iteration Theorem 1 is about.

Write completions are numbered t = 1..T in time order and w_t is the shared vector right after
the t-th completes. The applied update term is s_t = (w_{t-1} − w_t)/lr, the exact gradient is
g_t = ∇f_{z_t}(w_{t-1}) for that update's sample, and the gradient error is δ_t = s_t − g_t.
Any stores of other updates that landed in between belong to s_t, so Σ_t lr·s_t = w_0 − w_T.

The same view serves simulated runs (fed online by the engine) and real runs (fed by the
offline rebuild of the shared vector from recorded block writes).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simulator.problems import Problem

__all__ = ["Measurement", "SerializedView", "curve_checkpoints"]

NAN = float("nan")


class Measurement(NamedTuple):
    """Exact metrics of one completion; NaN where the update was not measured."""

    measured: bool
    s_norm: float
    g_norm: float
    delta_norm: float
    delta_dot: float


UNMEASURED = Measurement(False, NAN, NAN, NAN, NAN)


def curve_checkpoints(updates: int, points: int) -> list[int]:
    """Completion counts at which the full loss is evaluated: 0, about ``points`` more, T."""
    ticks = np.linspace(0, updates, points + 1).round().astype(int) if points else np.array([0])
    return sorted({*ticks.tolist(), 0, updates})


class SerializedView:
    """Measures δ_t exactly at completions (every ``every``-th one when ``exact``).

    Also records the loss curve: at each checkpoint, the time of completion t, f(w_t) and
    a_t = ‖w_t − w*‖² (the quantity Theorem 1's recursion bounds).
    """

    def __init__(self, problem: Problem, lr: float, w0: np.ndarray, updates: int, exact: bool,
                 every: int, curve_points: int) -> None:
        self.problem, self.lr, self.every = problem, lr, every
        self.exact = exact
        self.w_star = problem.optimum()[0]
        self.prev = np.array(w0, dtype=np.float64)
        self._checkpoints = curve_checkpoints(updates, curve_points)
        self._next = 1
        self.curve: list[tuple[int, int, float, float]] = [(0, 0, *self._position(w0))]

    def complete(self, t: int, w: np.ndarray, sample: int, time: int) -> Measurement:
        """Record completion ``t`` (its sample, and ``w`` right after it) at ``time``."""
        result = UNMEASURED
        if self.exact:
            if t % self.every == 0:
                result = self._measure(w, sample)
            if (t + 1) % self.every == 0:
                np.copyto(self.prev, w)
        if t == self._checkpoints[self._next]:
            self.curve.append((t, time, *self._position(w)))
            self._next = min(self._next + 1, len(self._checkpoints) - 1)
        return result

    def _position(self, w: np.ndarray) -> tuple[float, float]:
        """(f(w), ‖w − w*‖²)."""
        gap = w - self.w_star
        return self.problem.full_loss(w), float(gap @ gap)

    def _measure(self, w: np.ndarray, sample: int) -> Measurement:
        prev, w_star = self.prev, self.w_star
        s = np.subtract(prev, w)
        s /= self.lr
        g = self.problem.dense_grad(prev, sample)
        delta = s - g
        # ‖x‖ as sqrt(x·x): what numpy's norm computes for a real vector, without its overhead.
        return Measurement(True, math.sqrt(s @ s), math.sqrt(g @ g), math.sqrt(delta @ delta),
                           float(delta @ (prev - w_star)))
