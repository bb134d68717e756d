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

    An update may apply the mean gradient of several samples (a synchronous minibatch); then
    g_t is the mean of their gradients at w_{t-1}. An update rule that scales the learning
    rate by a factor (staleness-aware ASGD) is divided out: s_t = (w_{t-1} − w_t)/(lr·factor).

    Also records the loss curve: at about ``curve_points`` evenly spaced counts of gradients
    computed, the completion t, its time, f(w_t), a_t = ‖w_t − w*‖² (the quantity Theorem 1's
    recursion bounds) and the gradient count.
    """

    def __init__(self, problem: Problem, lr: float, w0: np.ndarray, updates: int, exact: bool,
                 every: int, curve_points: int) -> None:
        self.problem, self.lr, self.every = problem, lr, every
        self.exact = exact
        self.w_star = problem.optimum()[0]
        self.prev = np.array(w0, dtype=np.float64)
        # Work vectors of ``_measure`` (s_t, δ_t, w_{t−1} − w*), filled in place.
        self._s, self._delta, self._gap = (np.empty_like(self.prev) for _ in range(3))
        self._checkpoints = curve_checkpoints(updates, curve_points)
        self._next = 1
        self.curve: list[tuple[int, int, float, float, int]] = [(0, 0, *self._position(w0), 0)]
        # The vector of the curve's last point: ``finish`` adds one when w moved after it.
        self._curve_w = np.array(w0, dtype=np.float64)

    def complete(self, t: int, w: np.ndarray, samples: list[int], time: int,
                 scale: float = 1.0, n: int | None = None,
                 part: slice | None = None) -> Measurement:
        """Record completion ``t`` (its samples, and ``w`` right after it) at ``time``;
        ``n`` gradients have been computed by then (default ``t``). An update that moves only
        the coordinates ``part`` (a model's stage) is measured against the exact gradient
        there: g_t is ∇f_z(w_{t−1}) on ``part`` and 0 elsewhere."""
        result = UNMEASURED
        if self.exact:
            if t % self.every == 0:
                result = self._measure(w, samples, scale, part)
            if (t + 1) % self.every == 0:
                np.copyto(self.prev, w)
        n = t if n is None else n
        checkpoints = self._checkpoints
        if self._next < len(checkpoints) and n >= checkpoints[self._next]:
            self._append(t, time, w, n)
            while self._next < len(checkpoints) and n >= checkpoints[self._next]:
                self._next += 1
        return result

    def finish(self, t: int, w: np.ndarray, time: int, n: int) -> None:
        """End the curve with the final state when the last point does not show it: the last
        checkpoint was not reached (a run that stalled, or ended with discarded gradients),
        or ``w`` changed after it without a completion (blocks stored by a thread that
        died)."""
        if (self.curve[-1][4] < n or self.curve[-1][0] < t
                or not np.array_equal(w, self._curve_w, equal_nan=True)):
            self._append(t, time, w, n)

    def _append(self, t: int, time: int, w: np.ndarray, n: int) -> None:
        self.curve.append((t, time, *self._position(w), n))
        np.copyto(self._curve_w, w)

    def curve_arrays(self) -> dict[str, np.ndarray]:
        """The loss curve as the trace's ``curve_*`` arrays."""
        t, time, loss, dist2, n = zip(*self.curve, strict=True)
        return {"curve_t": np.asarray(t, dtype=np.int64),
                "curve_time": np.asarray(time, dtype=np.int64),
                "curve_loss": np.asarray(loss, dtype=np.float64),
                "curve_dist2": np.asarray(dist2, dtype=np.float64),
                "curve_n": np.asarray(n, dtype=np.int64)}

    def _position(self, w: np.ndarray) -> tuple[float, float]:
        """(f(w), ‖w − w*‖²)."""
        gap = w - self.w_star
        return self.problem.full_loss(w), float(gap @ gap)

    def _measure(self, w: np.ndarray, samples: list[int], scale: float,
                 part: slice | None = None) -> Measurement:
        prev, s, delta, gap = self.prev, self._s, self._delta, self._gap
        np.subtract(prev, w, out=s)
        s /= self.lr * scale
        g = self.problem.dense_grad(prev, samples[0])
        if len(samples) > 1:
            for sample in samples[1:]:
                g += self.problem.dense_grad(prev, sample)
            g /= len(samples)
        if part is not None:
            kept = g[part].copy()
            g[:] = 0.0
            g[part] = kept
        np.subtract(s, g, out=delta)
        np.subtract(prev, self.w_star, out=gap)
        # ‖x‖ as sqrt(x·x): what numpy's norm computes for a real vector, without its overhead.
        return Measurement(True, math.sqrt(s @ s), math.sqrt(g @ g), math.sqrt(delta @ delta),
                           float(delta @ gap))
