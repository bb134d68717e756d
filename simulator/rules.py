"""Update rules: pure functions of arrays, shared by the simulator's protocols and realrun.

Each takes what a worker knows when it writes and returns the step it applies (the vector
subtracted from the shared parameters), so the same arithmetic runs on virtual and real
threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["LR_FACTORS", "dc_compensate", "dc_correction", "mean_step", "round_significand",
           "staleness_scale"]

#: Learning-rate schedules (``run.lr_schedule``) as the factor on lr of the m-th update
#: (m >= 1); ``constant`` has none.
LR_FACTORS: dict[str, Callable[[int], float]] = {
    "inv_sqrt": lambda m: 1.0 / math.sqrt(m),
    "inverse": lambda m: 1.0 / m,
}


def staleness_scale(staleness: int) -> float:
    """Learning-rate factor of staleness-aware ASGD (Zhang et al. 2016): 1/τ, or 1 for τ = 0."""
    return 1.0 / max(1, staleness)


def dc_correction(g: np.ndarray, w_now: np.ndarray, w_read: np.ndarray,
                  lam: float) -> np.ndarray:
    """The delay-compensation term λ·g⊙g⊙(w_now − w_read) of Zheng et al. (2017): a
    first-order Taylor correction of g from the vector it was computed on to the vector it
    is applied to, with λ·g⊙g as a cheap diagonal stand-in for the Hessian."""
    return lam * g * g * (w_now - w_read)


def dc_compensate(g: np.ndarray, w_now: np.ndarray, w_read: np.ndarray,
                  lam: float) -> np.ndarray:
    """Delay-compensated gradient: g + λ·g⊙g⊙(w_now − w_read)."""
    return g + dc_correction(g, w_now, w_read, lam)


def mean_step(steps: Sequence[np.ndarray]) -> np.ndarray:
    """The average of several steps (a synchronous minibatch, or accumulated gradients)."""
    if len(steps) == 1:
        return steps[0].copy()
    total = steps[0].copy()
    for step in steps[1:]:
        total += step
    total /= len(steps)
    return total


def round_significand(values: np.ndarray, bits: int) -> None:
    """Round float64 ``values`` in place to ``bits`` significand bits (round half to even);
    ``bits`` = 0 leaves them alone. bfloat16 keeps 8 bits, float16 11, float32 24."""
    if bits <= 0:
        return
    mantissa, exponent = np.frexp(values)
    np.ldexp(np.round(np.ldexp(mantissa, bits)), exponent - bits, out=values)
