"""Passing writes, and what any writes that met lose (the ``lost_*`` values of
``[hardware.passing]`` and ``[hardware.convoys]``).

When writes that met end apart, they pass each other (``[hardware.passing]``):
``convoy_join`` and ``convoy_rest`` stay 0, the write distribution is fitted on every write,
and only what the meetings lose is fitted (:func:`meeting_losses`; none lost: nothing
fitted); convoys (:mod:`simulator.fidelity.convoys`) take their losses the same way. From the
pairs a measure-mode run classified (``extra_convoy_pairs``): ``convoy_lost_pairs`` is the
share of the pairs that lost any coordinate among those that met within half a write
(lag ≤ W/2: half the block or more swept together), and the lost shares are the lossy
pairs' lost coordinates over their shared part max(1 − lag/W, 0). When the share of pairs
that lose anything falls with the lag (:func:`lossy_falloff`: q·exp(−f/λ) in the leader's
swept share f = lag/W, by maximum likelihood over all classified pairs, kept when a
likelihood-ratio test against one share rejects at 1%), ``convoy_lost_pairs`` = q and
``convoy_lost_within`` = λ; when the lossy meetings within half a write are unlike each
other (:func:`lossy_spread`: a beta-binomial count of lost coordinates, zero-inflated by the
meetings drawn lossless, by maximum likelihood, against one rate for all at 1%, ρ ≥ 0.01),
``convoy_lost_spread`` = ρ, the two shares are scaled to the fitted mean rate, and
``convoy_lost_pairs`` is raised by the fitted share of meetings drawn lossy over the share
seen losing anything (a lossy draw near 0 loses nothing).
"""

from __future__ import annotations

import math
from copy import copy
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats

from simulator.distributions import beta_shapes
from simulator.fidelity.durations import MIN_PAIRS

_LR_1PCT = 6.635  # χ² with one degree of freedom, 99th percentile
_MIN_SPREAD = 0.01  # lossy meetings: a smaller spread is kept as none


@dataclass(frozen=True)
class Meetings:
    """Pairs of writes that met (a leader and the joiner that started ``lag`` ns after it),
    as the convoy fit reads them, from a trace (:func:`fit_convoys`) or a probe
    (:func:`probed_meetings`). Per pair: ``lag``; ``gap``, how far apart the two ended;
    ``duration``, the leader's end less the joiner's start; ``alone``, the joiner's time
    alone; ``rest``, the leader's expected time left at the join. Per classified pair:
    ``fronts``, the share of the block the leader had swept at the join, and ``lossy``,
    whether it lost any coordinate. ``lost``: the leader's and joiner's lost shares summed
    over lossy pairs, ``shared_total`` their shared parts summed; ``close`` pairs that swept
    at least half the block together, ``close_lossy`` of them lossy, and per close pair
    ``counts`` lost coordinates of ``spans`` shared."""

    lag: np.ndarray
    gap: np.ndarray
    duration: np.ndarray
    alone: np.ndarray
    rest: np.ndarray
    fronts: np.ndarray
    lossy: np.ndarray
    lost: np.ndarray
    shared_total: float
    classified: int
    close: int
    close_lossy: int
    counts: np.ndarray
    spans: np.ndarray


def merged_meetings(parts: list[dict[str, Any]]) -> Meetings:
    """One :class:`Meetings` of the pairs of several traces or probes, each given as its
    fields (a trace without classified pairs leaves those out): totals added, per-pair
    values joined in order."""
    def joined(key: str) -> np.ndarray:
        arrays = [part[key] for part in parts if key in part]
        return np.concatenate(arrays) if arrays else np.zeros(0)

    def total(key: str) -> Any:
        return sum((part[key] for part in parts if key in part), start=copy(_NONE[key]))

    values: dict[str, Any] = {f.name: total(f.name) if f.name in _NONE else joined(f.name)
                              for f in fields(Meetings)}
    return Meetings(**{**values, "lossy": joined("lossy").astype(bool)})


_NONE: dict[str, Any] = {"lost": np.zeros(2), "shared_total": 0.0, "classified": 0, "close": 0,
                         "close_lossy": 0}


def meeting_losses(m: Meetings) -> tuple[dict[str, float], dict[str, Any]]:
    """The ``lost_*`` values (as ``convoy_lost_*``) from pairs that met (the module docstring), and
    what the report adds: with a spread of lossy meetings, the share of lossy meetings that
    lose nothing."""
    leader, joiner = ((m.lost / m.shared_total).tolist() if m.shared_total > 0 else [0.0, 0.0])
    total = leader + joiner
    if total > 1:
        leader, joiner = leader / total, joiner / total
    losses = {"convoy_lost_leader": leader, "convoy_lost_joiner": joiner,
              "convoy_lost_pairs": m.close_lossy / m.close if m.close_lossy else 1.0,
              "convoy_lost_within": 0.0}
    if m.fronts.size:
        falling = lossy_falloff(m.fronts, m.lossy)
        if falling is not None:
            losses["convoy_lost_pairs"], losses["convoy_lost_within"] = falling
    spread = lossy_spread(m.counts, m.spans)
    if spread is None or leader + joiner <= 0:
        return losses, {}
    # Each lossy meeting draws its own rate from the fitted law (mean μ, split between the
    # two writes as measured). A draw near 0 loses nothing, so more meetings are drawn lossy
    # than are seen losing anything: q over the share seen, as fitted.
    drawn, rate, rho = spread
    scale = rate / (leader + joiner)
    seen = float(np.mean(m.counts[m.spans >= 1] > 0))
    losses.update(convoy_lost_leader=leader * scale, convoy_lost_joiner=joiner * scale,
                  convoy_lost_spread=rho,
                  convoy_lost_pairs=min(1.0, losses["convoy_lost_pairs"] * drawn / seen))
    return losses, {"lossy_meetings_losing_nothing": 1 - _loses_anything(
        rate, rho, float(np.median(m.spans)))}


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
