"""Regret bounds of delayed SGD (J. Langford, A. J. Smola, M. Zinkevich, "Slow Learners are
Fast", NIPS 2009) as pure functions.

Setting: online learning over a domain X with the Euclidean Bregman divergence
D(x‖x') = ½‖x − x'‖². At clock step t the learner is at x_t, sees f_t, computes ∇f_t(x_t),
and applies the gradient computed τ steps earlier: x_{t+1} = x_t − η_t ∇f_{t−τ}(x_{t−τ}) (the
first τ steps apply nothing). In this toolkit that is the ``roundrobin`` protocol with
k = τ + 1 threads, whose update m is computed at the serialized iterate w_{m−1−τ}.
Regret: R[X] = Σ_{t=1}^T f_t(x_t) − f_t(x*), with x* = argmin_{x∈X} Σ_t f_t(x).

Assumptions: every f_t is convex; ‖∇f_t(x)‖ ≤ L on X; D(x‖x') ≤ F² for all x, x' ∈ X.

* Theorem 1 (convex): with η_t = σ/√(t − τ),
  R[X] ≤ σL²√T + F²√T/σ + L²στ²/2 + 2L²στ√T;
  with σ² = F²/(2τL²) (τ >= 1) and T >= τ², R[X] ≤ 4FL√(τT).
* Theorem 2 (strongly convex): if the f_t are i.i.d. and λ-strongly convex and
  η_t = 1/(λ(t − τ)), R[X] ≤ λτF² + (½ + τ)(L²/λ)(1 + τ + log T).

In both, t − τ is the count of updates applied so far including this one, so the schedules
are the simulator's ``run.lr_schedule`` ``inv_sqrt`` (lr = σ) and ``inverse`` (lr = 1/λ).
"""

from __future__ import annotations

import math

from theory.asyngrad import _require

__all__ = ["check_langford", "convex_regret", "optimal_sigma", "simple_convex_regret",
           "strongly_convex_regret"]


def check_langford(L: float, F: float, tau: float, T: float) -> None:
    """Raise ScenarioError unless L, F > 0, τ >= 0 and T >= 1 (all finite)."""
    for name, value, low, strict in (("L", L, 0.0, True), ("F", F, 0.0, True),
                                     ("tau", tau, 0.0, False), ("T", T, 1.0, False)):
        ok = math.isfinite(value) and (value > low if strict else value >= low)
        _require(ok, name, value, f"must be a finite number {'>' if strict else '>='} {low:g}")


def convex_regret(L: float, F: float, tau: float, T: float, sigma: float) -> float:
    """Theorem 1: σL²√T + F²√T/σ + L²στ²/2 + 2L²στ√T, for η_t = σ/√(t − τ).

    Raises:
        ScenarioError: an argument out of range (σ must be > 0).
    """
    check_langford(L, F, tau, T)
    _require(math.isfinite(sigma) and sigma > 0, "sigma", sigma, "must be > 0")
    root = math.sqrt(T)
    return (sigma * L ** 2 * root + F ** 2 * root / sigma + L ** 2 * sigma * tau ** 2 / 2
            + 2 * L ** 2 * sigma * tau * root)


def optimal_sigma(L: float, F: float, tau: float) -> float:
    """σ = F/(L√(2τ)), Theorem 1's choice for a delay τ >= 1; for τ = 0, σ = F/L (the
    minimiser of σL² + F²/σ, the delay-free terms)."""
    check_langford(L, F, tau, 1.0)
    return F / (L * math.sqrt(2 * tau)) if tau > 0 else F / L


def simple_convex_regret(L: float, F: float, tau: float, T: float) -> float:
    """Theorem 1's corollary 4FL√(τT), valid for σ = F/(L√(2τ)), τ >= 1 and T >= τ².

    Raises:
        ScenarioError: τ < 1 or T < τ² (the corollary does not apply), or a bad argument.
    """
    check_langford(L, F, tau, T)
    _require(tau >= 1, "tau", tau, "must be >= 1 for the corollary (use convex_regret)")
    _require(tau ** 2 <= T, "T", T, f"must be >= τ² = {tau ** 2:g} for the corollary")
    return 4 * F * L * math.sqrt(tau * T)


def strongly_convex_regret(L: float, F: float, tau: float, T: float, lam: float) -> float:
    """Theorem 2: λτF² + (½ + τ)(L²/λ)(1 + τ + log T), for η_t = 1/(λ(t − τ)).

    Raises:
        ScenarioError: an argument out of range (λ must be > 0).
    """
    check_langford(L, F, tau, T)
    _require(math.isfinite(lam) and lam > 0, "lambda", lam, "must be > 0 (strong convexity)")
    return lam * tau * F ** 2 + (0.5 + tau) * L ** 2 / lam * (1 + tau + math.log(T))
