"""What writes that met lose (``timing.convoy_lost_*``): all of passing writes' fit, and the
losses of convoys.

When writes that met end apart, they pass each other (``TimingSpec.passing``): the
``convoy_lost_*`` values are fitted as above from the classified pairs (none lost: nothing
fitted), ``convoy_join`` and ``convoy_rest`` stay 0, and the write distribution is fitted on
every write. In both cases, when the share of pairs that lose anything falls with the lag
(:func:`lossy_falloff`: q·exp(−f/λ) in the leader's swept share f = lag/W, by maximum
likelihood over all classified pairs, kept when a likelihood-ratio test against one share
rejects at 1%), ``convoy_lost_pairs`` = q and ``convoy_lost_within`` = λ; when the lossy
meetings within half a write are unlike each other (:func:`lossy_spread`: a
beta-binomial count of lost coordinates, zero-inflated by the meetings drawn lossless, by
maximum likelihood, against one rate for all at 1%, ρ ≥ 0.01), ``convoy_lost_spread`` =
ρ, the two shares are scaled to the fitted mean rate, and ``convoy_lost_pairs`` is raised
by the fitted share of meetings drawn lossy over the share seen losing anything (a lossy
draw near 0 loses nothing). Runs of one worker have no writes that meet: their convoys
are fitted the same way from the meetings the real run's probe made
(:func:`probed_meetings`, ``real.write_meetings``).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.stats

from simulator.distributions import beta_shapes
from simulator.fidelity.durations import MIN_PAIRS

_LR_1PCT = 6.635  # χ² with one degree of freedom, 99th percentile


_MIN_SPREAD = 0.01  # lossy meetings: a smaller spread is kept as none


def lossy_falloff(fronts: np.ndarray, lossy: np.ndarray) -> tuple[float, float] | None:
    """How the share of meetings that lose anything falls with the leader's swept share f
    at the meeting: (q, λ) of q·exp(−f/λ) by maximum likelihood over the classified pairs,
    or None when that fits no better than one share for every f (likelihood-ratio test at
    the 1% level; fewer than ``MIN_PAIRS`` pairs, or none lossy or all lossy: None)."""
    if fronts.size < MIN_PAIRS or not 0 < lossy.sum() < lossy.size:
        return None

    def loglik(q: np.ndarray) -> float:
        q = np.clip(q, 1e-12, 1 - 1e-12)
        return float(np.sum(np.where(lossy, np.log(q), np.log1p(-q))))

    def negative(params: np.ndarray) -> float:
        q0 = 1 / (1 + math.exp(-params[0]))
        return -loglik(q0 * np.exp(-fronts / math.exp(params[1])))

    share = float(lossy.mean())
    best = min((scipy.optimize.minimize(negative, [math.log(share / (1 - share)), math.log(w)],
                                        method="Nelder-Mead") for w in (0.1, 0.3, 1.0)),
               key=lambda r: r.fun)
    if 2 * (-best.fun - loglik(np.full(fronts.size, share))) < _LR_1PCT:
        return None
    return 1 / (1 + math.exp(-best.x[0])), math.exp(best.x[1])


def lossy_spread(lost: np.ndarray, shared: np.ndarray) -> tuple[float, float, float] | None:
    """How unlike the lossy meetings are, from meetings that lost ``lost`` of their
    ``shared`` coordinates (0 for those that lost nothing): (q, μ, ρ) of the engine's law,
    by maximum likelihood — a meeting is drawn lossy with probability q, and a lossy one
    loses a beta-binomial count of mean rate μ in which two coordinates' losses correlate ρ
    (so a lossy draw may lose nothing: a meeting seen losing nothing is either). None when
    that fits no better than one rate for every lossy meeting (ρ = 0, a binomial;
    likelihood-ratio test at the 1% level), when ρ < ``_MIN_SPREAD`` (as much as the shared
    part's own estimate, from the mean write, adds), or from fewer than ``MIN_PAIRS``
    lossy meetings."""
    keep = shared >= 1
    lost, shared = np.minimum(lost[keep], shared[keep]), shared[keep]
    lossy = lost > 0
    if lossy.sum() < MIN_PAIRS or lossy.all():
        return None
    mean = float(np.sum(lost) / np.sum(shared[lossy]))
    if not 0 < mean < 1:
        return None
    some, none = lost[lossy], shared[~lossy]

    def logit(x: float) -> float:
        return math.log(x / (1 - x))

    def unit(params: np.ndarray) -> list[float]:
        return [min(max(1 / (1 + math.exp(-p)), 1e-9), 1 - 1e-9) for p in params]

    def loglik(q: float, log_zero: np.ndarray, log_some: np.ndarray) -> float:
        # A meeting that lost nothing was not lossy, or lossy and drew no coordinate.
        zero = np.log1p(-q + q * np.exp(log_zero))
        return float(zero.sum() + some.size * math.log(q) + log_some.sum())

    def binomial(params: np.ndarray) -> float:
        q, rate = unit(params)
        return -loglik(q, none * math.log1p(-rate),
                       scipy.stats.binom.logpmf(some, shared[lossy], rate))

    def beta_binomial(params: np.ndarray) -> float:
        q, rate, rho = unit(params)
        a, b = beta_shapes(rate, rho)
        return -loglik(q, scipy.stats.betabinom.logpmf(0, none, a, b),
                       scipy.stats.betabinom.logpmf(some, shared[lossy], a, b))

    start = [logit(min(max(float(lossy.mean()), 0.01), 0.99)), logit(mean)]
    null = scipy.optimize.minimize(binomial, start, method="Nelder-Mead")
    best = min((scipy.optimize.minimize(beta_binomial, [*start, logit(r)], method="Nelder-Mead",
                                        options={"maxiter": 2000})
                for r in (0.01, 0.1, 0.5)), key=lambda r: r.fun)
    q, rate, rho = unit(best.x)
    if 2 * (null.fun - best.fun) < _LR_1PCT or rho < _MIN_SPREAD:
        return None
    return q, rate, min(rho, 0.999)


def _loses_anything(rate: float, rho: float, shared: float) -> float:
    """The chance that a meeting of ``shared`` coordinates, at a Beta(rate, ρ) draw of its
    own rate, loses at least one."""
    a, b = beta_shapes(rate, rho)
    return float(-math.expm1(scipy.stats.betabinom.logpmf(0, max(int(shared), 1), a, b)))
