"""Update rules: pure functions of arrays, shared by the simulator's protocols and realrun.

Each takes what a worker knows when it writes and returns the step it applies (the vector
subtracted from the shared parameters), so the same arithmetic runs on virtual and real
threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["LR_FACTORS", "admm_push", "admm_residuals", "admm_samples", "admm_shard",
           "dc_compensate", "dc_correction", "dc_step", "lbfgs_direction", "lbfgs_pair",
           "mean_step", "retirements", "round_quota", "round_significand", "staleness_scale",
           "too_stale", "unit_work", "warmed_up"]

#: Learning-rate schedules (``run.lr_schedule``) as the factor on lr of the m-th update
#: (m >= 1); ``constant`` has none.
LR_FACTORS: dict[str, Callable[[int], float]] = {
    "inv_sqrt": lambda m: 1.0 / math.sqrt(m),
    "inverse": lambda m: 1.0 / m,
}


def staleness_scale(staleness: int) -> float:
    """Learning-rate factor of staleness-aware ASGD (Zhang et al. 2016): 1/τ, or 1 for τ = 0."""
    return 1.0 / max(1, staleness)


def dc_correction(g: np.ndarray, w_now: np.ndarray, w_read: np.ndarray, lam: float,
                  out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                  ) -> np.ndarray:
    """The delay-compensation term λ·g⊙g⊙(w_now − w_read) of Zheng et al. (2017): a
    first-order Taylor correction of g from the vector it was computed on to the vector it
    is applied to, with λ·g⊙g as a cheap diagonal stand-in for the Hessian. Evaluated as
    ((λ·g)·g)·Δ into ``out``, with Δ in ``scratch`` (which may be g's own array); given both,
    nothing of size d is allocated: a freed large array goes back to the OS, and the page
    faults of a fresh one cost a 105,004-parameter model 0.3 ms an update."""
    out = np.multiply(lam, g, out=out)
    out *= g
    out *= np.subtract(w_now, w_read, out=scratch)
    return out


def dc_compensate(g: np.ndarray, w_now: np.ndarray, w_read: np.ndarray,
                  lam: float) -> np.ndarray:
    """Delay-compensated gradient: g + λ·g⊙g⊙(w_now − w_read)."""
    return g + dc_correction(g, w_now, w_read, lam)


def dc_step(step: np.ndarray, lr: float, w_now: np.ndarray, w_read: np.ndarray,
            lam: float, work: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The step of DC-ASGD from the plain step lr·g: lr·(g + λ·g⊙g⊙(w_now − w_read)), which
    is ``step`` itself wherever w_now equals w_read. ``work``: two float64 arrays of at
    least step.size the result is computed in (it lives in the second until the next call)."""
    n = step.size
    first, second = (None, None) if work is None else (work[0][:n], work[1][:n])
    g = np.divide(step, lr, out=first)
    out = dc_correction(g, w_now, w_read, lam, second, g)
    out *= lr
    out += step
    return out


def mean_step(steps: Sequence[np.ndarray]) -> np.ndarray:
    """The average of several steps (a synchronous minibatch, or accumulated gradients)."""
    if len(steps) == 1:
        return steps[0].copy()
    total = steps[0].copy()
    for step in steps[1:]:
        total += step
    total /= len(steps)
    return total


#: Tags the streams of ADMM's shard samples, apart from every other stream of the run's seed.
ADMM_TAG = 0xAD77


def admm_shard(samples: int, workers: int, rank: int) -> np.ndarray:
    """The data shard of ADMM worker ``rank``: samples rank, rank + k, rank + 2k, …"""
    return np.arange(rank, samples, workers)


def admm_samples(seed: int, rank: int) -> Callable[[np.ndarray, int], np.ndarray]:
    """Worker ``rank``'s draws of ADMM samples: a function of (its shard, how many) giving
    the shard's samples drawn uniformly with replacement, from the stream seeded by (seed,
    :data:`ADMM_TAG`, rank), so a real worker draws what the simulated thread draws."""
    rng = np.random.default_rng([seed, ADMM_TAG, rank])

    def draw(shard: np.ndarray, count: int) -> np.ndarray:
        return shard[rng.integers(0, shard.size, count)]

    return draw


def admm_push(grad: Callable[[np.ndarray, int], np.ndarray], x: np.ndarray, u: np.ndarray,
              z: np.ndarray, samples: Sequence[int] | np.ndarray, weight: float, rho: float,
              lr: float, workers: int) -> np.ndarray:
    """One update of a worker in asynchronous consensus ADMM (Boyd et al. 2011 §7.1, scaled
    form; Zhang & Kwok 2014), in place on its local copy ``x`` and scaled dual ``u``, given
    the consensus ``z`` it pulled: the dual step u ← u + x − z, then the subproblem
    min_x f_i(x) + ρ/2‖x − z + u‖² solved inexactly by one SGD step with rate ``lr`` per
    sample, with gradient weight·∇f_s(x) + ρ(x − z + u) (``weight`` = |shard|/n: the shard's
    share of the mean loss). Returns the push subtracted from z, ((x + u)_before −
    (x + u)_after)/k, so that z stays the mean of the workers' x + u whatever the order of
    the pushes."""
    before = x + u
    u += x - z
    for sample in samples:
        g = grad(x, int(sample))
        g *= weight
        g += rho * (x - z + u)
        x -= lr * g
    return (before - (x + u)) / workers


def admm_residuals(xs: np.ndarray, z: np.ndarray, moved: np.ndarray,
                   rho: float) -> tuple[float, float]:
    """Consensus ADMM's residuals (Boyd et al. 2011 §7.1) after a push: the primal
    ‖(x_1 − z, …, x_k − z)‖ over the workers' copies ``xs`` (k, d), and the dual ρ·√k·‖Δz‖
    with Δz = ``moved``, the change of z the push made."""
    gap = xs - z
    primal = math.sqrt(float(np.sum(gap * gap)))
    return primal, rho * math.sqrt(len(xs)) * math.sqrt(float(moved @ moved))


def round_quota(fraction: float, workers: int, live: int) -> int:
    """Gradients that close a synchronous round with backup workers (Chen et al. 2016):
    ceil(p·k) of the k workers, less a 1e-9 guard so that p·k a hair above an integer by
    rounding (0.56·25 = 14.000000000000002) still asks for that integer; never more than
    the ``live`` workers that may still arrive, never less than 1."""
    return max(1, min(math.ceil(fraction * workers - 1e-9), live))


def too_stale(staleness: int, limit: int) -> bool:
    """Whether a push is discarded under a staleness limit S (Dean et al. 2012's Downpour
    option): staleness > S, with S = 0 meaning no limit."""
    return bool(limit) and staleness > limit


def warmed_up(completed: int, warm_start: int) -> bool:
    """Whether a warm start of W updates by worker 0 alone is over: W completions made."""
    return completed >= warm_start


def retirements(busy: Sequence[int] | np.ndarray, count: Sequence[int] | np.ndarray,
                working: Sequence[int], factor: float, after: int) -> list[int]:
    """The workers to retire now under rebalancing (the parameter-server practice of moving a
    consistently slow machine's data to the others): once every ``working`` worker (those
    neither retired nor finished) made ``after`` updates, each whose mean update time
    busy[t]/count[t] exceeds ``factor`` times the median of the working workers' means, in
    ``working`` order, as long as at least one working worker remains. ``factor`` 0: none.
    """
    if not factor or len(working) < 2 or any(count[t] < after for t in working):
        return []
    means = np.asarray([busy[t] for t in working]) / np.asarray([count[t] for t in working])
    median = float(np.median(means))
    chosen: list[int] = []
    for thread, mean in zip(working, means.tolist(), strict=True):
        if mean > factor * median and len(working) - len(chosen) > 1:
            chosen.append(thread)
    return chosen


def round_significand(values: np.ndarray, bits: int) -> None:
    """Round float64 ``values`` in place to ``bits`` significand bits (round half to even);
    ``bits`` = 0 leaves them alone. bfloat16 keeps 8 bits, float16 11, float32 24."""
    if bits <= 0:
        return
    mantissa, exponent = np.frexp(values)
    np.ldexp(np.round(np.ldexp(mantissa, bits)), exponent - bits, out=values)


def unit_work(samples: int, units: int) -> int:
    """Gradients one of Sandblaster's work units computes: its chunk of the ``samples`` cut
    into ``units`` (``numpy.array_split``), ⌈samples / units⌉ at most."""
    return -(-samples // units)


def lbfgs_direction(g: np.ndarray,
                    pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """H·g, L-BFGS's inverse-Hessian approximation applied to the gradient ``g`` by the
    two-loop recursion (Nocedal & Wright 2006, Algorithm 7.4) over the curvature pairs
    (s, y) = (x_{r+1} − x_r, g_{r+1} − g_r), oldest first, each with s·y > 0; the initial
    matrix is γI with γ = s·y / y·y of the newest pair (I without pairs). The L-BFGS step
    is x_{r+1} = x_r − α·H·g."""
    q = np.array(g, dtype=np.float64)
    kept = []
    for s, y in reversed(pairs):
        rho = 1.0 / float(y @ s)
        a = rho * float(s @ q)
        q -= a * y
        kept.append((rho, a, s, y))
    if pairs:
        s, y = pairs[-1]
        q *= float(s @ y) / float(y @ y)
    for rho, a, s, y in reversed(kept):
        q += (a - rho * float(y @ q)) * s
    return q


def lbfgs_pair(s: np.ndarray, y: np.ndarray) -> bool:
    """Whether a curvature pair may enter the L-BFGS history: s·y > 0 (the update keeps H
    positive definite), with a margin for rounding: s·y > 1e-10·‖s‖·‖y‖."""
    return float(s @ y) > 1e-10 * float(np.linalg.norm(s) * np.linalg.norm(y))

