"""Proposition 4.1 of Hogwild! (F. Niu, B. Recht, C. Ré, S. J. Wright, "HOGWILD!: A Lock-Free
Approach to Parallelizing Stochastic Gradient Descent", NIPS 2011; arXiv:1106.5730) as pure
functions.

Setting: f(x) = Σ_{e∈E} f_e(x_e), each term depending on the coordinates of one hyperedge e.
Processors repeatedly pick e uniformly, read x_e, and update each coordinate v ∈ e by
−γ·[G_e(x)]_v without locks, where G_e = |E|·∇f_e is an unbiased estimate of ∇f. In this
toolkit's terms a sample i is a hyperedge, its gradient support is e, and G_e = ∇f_i of the
mean loss f = (1/n) Σ_i f_i. The sparsity of the hypergraph is measured by

* Ω = max_e |e| (the largest support),
* Δ = max_v |{e : v ∈ e}| / |E| (the largest share of samples touching one coordinate),
* ρ = max_e |{ê : ê ∩ e ≠ ∅}| / |E| (the largest share of samples overlapping one sample);

a dense problem has Ω = d and Δ = ρ = 1.

Assumptions: f is c-strongly convex; ∇f is L-Lipschitz; ‖G_e(x)‖₂ ≤ M almost surely; the lag
between the read a gradient was computed on and the update that applies it (in component
updates) is at most τ. With ε > 0, ϑ ∈ (0, 1) and D_0 = ‖x_0 − x*‖²,

(4.1) γ = ϑεc / (2LM²Ω(1 + 6ρτ + 4τ²ΩΔ^{1/2})),
(4.2) k ≥ 2LM²Ω(1 + 6τρ + 6τ²ΩΔ^{1/2}) log(LD_0/ε) / (c²ϑε)

updates give E[f(x_k) − f*] ≤ ε. (4.1) and (4.2) label the proposition's step size and
update count here, in the order it states them. The two differ in the τ² coefficient of their
lag factor, 4 in (4.1) (``STEP_TAU2``) and 6 in (4.2) (``COUNT_TAU2``), as printed in the
paper; both are implemented as printed, and every number this toolkit prints names the
equation and the factor it comes from. The lag factor is the price of the lag: with τ = 0 the
proposition is serial SGD, and near-linear speedup needs ρτ and τ²ΩΔ^{1/2} small, which only
sparse problems give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from theory.asyngrad import _require, start_within, update_count

__all__ = ["COUNT_TAU2", "STEP_TAU2", "HogwildConstants", "check_theta", "lag_factor",
           "step_size", "updates"]

STEP_TAU2 = 4.0  # the τ² coefficient of the lag factor in the step size (4.1)
COUNT_TAU2 = 6.0  # ... and in the update count (4.2)


@dataclass(frozen=True)
class HogwildConstants:
    """Proposition 4.1's constants: c, L, M, Ω, Δ, ρ, τ and D_0 = ‖x_0 − x*‖².

    Raises:
        ScenarioError: a constant that is NaN, infinite or out of range (c, L, M > 0, c² and
            M² finite and > 0; L >= c; Ω >= 1; 0 < Δ <= ρ <= 1, as every edge through the
            busiest coordinate overlaps all others through it; τ, D_0 >= 0).
    """

    c: float
    L: float
    M: float
    omega: float
    delta: float
    rho: float
    tau: float
    d0: float

    def __post_init__(self) -> None:
        for name in ("c", "L", "M", "omega", "delta", "rho", "tau", "d0"):
            value = getattr(self, name)
            _require(isinstance(value, int | float) and math.isfinite(value), name, value,
                     "must be a finite number")
        _require(self.c > 0, "c", self.c, "must be > 0 (strong convexity)")
        _require(self.c <= self.L, "L", self.L, f"must be >= c ({self.c})")
        _require(self.M > 0, "M", self.M, "must be > 0 (gradient bound)")
        for name in ("c", "M"):  # (4.1) and (4.2) divide by their squares
            value = getattr(self, name)
            _require(0 < value * value < math.inf, name, value,
                     "must have a square that is finite and > 0")
        _require(self.omega >= 1, "omega", self.omega, "must be >= 1 (largest support)")
        _require(0 < self.delta <= 1, "delta", self.delta, "must be in (0, 1]")
        _require(self.delta <= self.rho <= 1, "rho", self.rho,
                 f"must be in [delta ({self.delta}), 1]")
        _require(self.tau >= 0, "tau", self.tau, "must be >= 0 (lag)")
        _require(self.d0 >= 0, "d0", self.d0, "must be >= 0")


def check_theta(eps: float, theta: float) -> None:
    """Raise ScenarioError unless ε > 0 and 0 < ϑ < 1 (both finite)."""
    _require(math.isfinite(eps) and eps > 0, "eps", eps, "must be a finite number > 0")
    _require(math.isfinite(theta) and 0 < theta < 1, "theta", theta, "must be in (0, 1)")


def lag_factor(k: HogwildConstants, tau_squared_coefficient: float = STEP_TAU2) -> float:
    """1 + 6ρτ + a·τ²ΩΔ^{1/2}: with a = ``STEP_TAU2`` (4, the default) the factor of the step
    size (4.1), how many times smaller γ is than for serial SGD (τ = 0); with a =
    ``COUNT_TAU2`` (6) the factor of the update count (4.2), how many times more updates k
    asks for."""
    return (1 + 6 * k.rho * k.tau
            + tau_squared_coefficient * k.tau ** 2 * k.omega * math.sqrt(k.delta))


def step_size(k: HogwildConstants, eps: float, theta: float = 0.5) -> float:
    """Equation (4.1): γ = ϑεc / (2LM²Ω(1 + 6ρτ + 4τ²ΩΔ^{1/2})).

    Raises:
        ScenarioError: ε <= 0 or ϑ outside (0, 1).
    """
    check_theta(eps, theta)
    return theta * eps * k.c / (2 * k.L * k.M ** 2 * k.omega * lag_factor(k, STEP_TAU2))


def updates(k: HogwildConstants, eps: float, theta: float = 0.5) -> int:
    """Equation (4.2): k = ⌈2LM²Ω(1 + 6τρ + 6τ²ΩΔ^{1/2}) log(LD_0/ε) / (c²ϑε)⌉, and 0 when
    L·D_0 <= ε (the start already satisfies the bound, as f(x_0) − f* <= (L/2)D_0).

    Raises:
        ScenarioError: ε <= 0 or ϑ outside (0, 1).
        InfeasibleError: the count does not fit in a 64-bit integer (``update_count``).
    """
    check_theta(eps, theta)
    if start_within(k.L, k.d0, eps):
        return 0
    return update_count(2 * k.L * k.M ** 2 * k.omega * lag_factor(k, COUNT_TAU2)
                        * math.log(k.L * k.d0 / eps), k.c ** 2 * theta * eps, "Proposition 4.1",
                        limit=2 ** 63)
