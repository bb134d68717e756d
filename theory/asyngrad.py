"""Theorem 1 of AsynGrad (X. Sun, "Asynchronous Parallel Learning for Neural Networks and
Structured Models with Dense Features", COLING 2016) as pure functions.

Setting: the serialized iteration w_t = w_{t−1} − γ s_t, where s_t = ∇f_{z_t}(w_{t−1}) + δ_t
carries the gradient error δ_t of lock-free training; a_t = E‖w_t − w*‖², a_0 = ‖w_0 − w*‖².

Conditions (the paper states them in prose; the wording here is **reconstructed from equations
(9) and (10)**, which are the only forms the theorem's conclusion uses):

* (4) f is c-strongly convex;
* (5) ∇f is q-Lipschitz, so f(w) − f* ≤ (q/2)‖w − w*‖²;
* (6) the applied update is bounded in mean square: E‖s_t‖² ≤ κ²;
* (7) the gradient error is bounded along the way to w*: −E⟨δ_t, w_{t−1} − w*⟩ ≤ τ.

Then with ε > 0, β ≥ 1, the learning rate (9) γ = (cε − 2τq)/(βqκ²) and
(10) t = ⌈βqκ² log(q a_0/ε) / (c(cε − 2τq))⌉ updates give E[f(w_t) − f*] ≤ ε, provided
2τq < cε. The proof runs through the recursion a_t ≤ (1 − cγ)a_{t−1} + γ²κ² + 2γτ, whose fixed
point (γκ² + 2τ)/c is at most ε/q exactly when β ≥ 1, while the transient (1 − cγ)^t a_0 falls
to ε/q after the t of (10); (q/2)·a_t ≤ ε follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.errors import AsyngradError, ScenarioError

__all__ = ["Constants", "InfeasibleError", "check_accuracy", "contraction", "error_budget",
           "fixed_point", "learning_rate", "recursion_bound", "start_within", "tau_limit",
           "update_count", "updates"]


class InfeasibleError(AsyngradError):
    """The theorem's conditions admit no positive learning rate (2τq ≥ cε)."""


def _require(ok: bool, name: str, value: float, reason: str) -> None:
    if not ok:
        raise ScenarioError(name, value, reason)


@dataclass(frozen=True)
class Constants:
    """The theorem's constants: c (4), q (5), κ² (6), τ (7) and a_0 = ‖w_0 − w*‖².

    Raises:
        ScenarioError: a constant that is NaN, infinite or out of its range (c, q, κ² > 0;
            τ, a_0 ≥ 0), or q < c (no function is more strongly convex than it is smooth).
    """

    c: float
    q: float
    kappa2: float
    tau: float
    a0: float

    def __post_init__(self) -> None:
        for name in ("c", "q", "kappa2", "tau", "a0"):
            value = getattr(self, name)
            _require(isinstance(value, int | float) and math.isfinite(value), name, value,
                     "must be a finite number")
        _require(self.c > 0, "c", self.c, "must be > 0 (strong convexity, condition 4)")
        _require(self.q > 0, "q", self.q, "must be > 0 (smoothness, condition 5)")
        _require(self.q >= self.c, "q", self.q, f"must be >= c ({self.c})")
        _require(self.kappa2 > 0, "kappa2", self.kappa2, "must be > 0 (condition 6)")
        _require(self.tau >= 0, "tau", self.tau, "must be >= 0 (condition 7)")
        _require(self.a0 >= 0, "a0", self.a0, "must be >= 0")


def check_accuracy(eps: float, beta: float) -> None:
    """Raise ScenarioError unless ε > 0 and β >= 1 (both finite)."""
    _require(math.isfinite(eps) and eps > 0, "eps", eps, "must be a finite number > 0")
    _require(math.isfinite(beta) and beta >= 1, "beta", beta, "must be a finite number >= 1")


def tau_limit(k: Constants, eps: float) -> float:
    """The largest admissible error bound: τ < cε/(2q) (from 2τq < cε)."""
    check_accuracy(eps, 1.0)
    return k.c * eps / (2 * k.q)


def error_budget(k: Constants, eps: float) -> float:
    """2τq/(cε): the share of the accuracy ε the gradient error uses up (must be < 1)."""
    check_accuracy(eps, 1.0)
    return 2 * k.tau * k.q / (k.c * eps)


def learning_rate(k: Constants, eps: float, beta: float = 1.0) -> float:
    """Equation (9): γ = (cε − 2τq)/(βqκ²).

    Raises:
        InfeasibleError: 2τq ≥ cε, so no positive γ exists; the message says what τ would do.
        ScenarioError: ε ≤ 0 or β < 1 (or not finite).
    """
    check_accuracy(eps, beta)
    margin = k.c * eps - 2 * k.tau * k.q
    if margin <= 0:
        raise InfeasibleError(
            f"no positive learning rate exists: 2τq = {2 * k.tau * k.q:.6g} >= cε = "
            f"{k.c * eps:.6g}; the gradient error needs τ < cε/(2q) = {tau_limit(k, eps):.6g}")
    return margin / (beta * k.q * k.kappa2)


def updates(k: Constants, eps: float, beta: float = 1.0) -> int:
    """Equation (10): t = ⌈βqκ² log(q a_0/ε) / (c(cε − 2τq))⌉, and 0 when q a_0 ≤ ε
    (the start already satisfies the bound). Equal to ⌈log(q a_0/ε)/(cγ)⌉ with γ from (9).

    Raises:
        InfeasibleError: as :func:`learning_rate`, or t is beyond floating point
            (:func:`update_count`; any finite t is returned, for the caller to judge).
        ScenarioError: as :func:`learning_rate`.
    """
    learning_rate(k, eps, beta)  # validates, and raises when infeasible
    if start_within(k.q, k.a0, eps):
        return 0
    return update_count(beta * k.q * k.kappa2 * math.log(k.q * k.a0 / eps),
                        k.c * (k.c * eps - 2 * k.tau * k.q), "Theorem 1 (10)")


def start_within(smoothness: float, distance2: float, eps: float) -> bool:
    """Whether the start already meets ε: smoothness·‖w_0 − w*‖² <= ε, so that
    f(w_0) − f* <= (smoothness/2)·‖w_0 − w*‖² < ε and a bound's count of updates is 0
    (AsynGrad's (10) with q and a_0, Hogwild!'s (4.2) with L and D_0)."""
    return smoothness * distance2 <= eps


def update_count(numerator: float, denominator: float, source: str,
                 limit: float = math.inf) -> int:
    """⌈numerator/denominator⌉ of two positive numbers: the update count ``source`` asks
    for, refused from ``limit`` on (default: only a count no float holds, whose quotient
    overflowed or whose denominator underflowed to 0).

    Raises:
        InfeasibleError: the count is not below ``limit``.
    """
    count = numerator / denominator if denominator > 0 else math.inf
    if not count < limit:
        raise InfeasibleError(f"{source} asks for {count:.3g} updates, more than any run can "
                              "make")
    return math.ceil(count)


def fixed_point(k: Constants, gamma: float) -> float:
    """The fixed point of a_t = (1 − cγ)a_{t−1} + γ²κ² + 2γτ: (γκ² + 2τ)/c."""
    return (gamma * k.kappa2 + 2 * k.tau) / k.c


def recursion_bound(k: Constants, gamma: float, steps: int) -> np.ndarray:
    """b_0..b_steps with b_0 = a_0 and b_t = (1 − cγ)b_{t−1} + γ²κ² + 2γτ, in closed form
    b_t = a* + (1 − cγ)^t (a_0 − a*): the proof's bound on a_t = E‖w_t − w*‖².

    Raises:
        ScenarioError: γ ≤ 0, or cγ ≥ 1 (the recursion is then no contraction).
    """
    _require(math.isfinite(gamma) and gamma > 0, "gamma", gamma, "must be > 0")
    _require(k.c * gamma < 1, "gamma", gamma, f"must satisfy cγ < 1 (c = {k.c})")
    star = fixed_point(k, gamma)
    return star + contraction(k, gamma, np.arange(steps + 1)) * (k.a0 - star)


def contraction(k: Constants, gamma: float, t: np.ndarray | int) -> np.ndarray:
    """(1 − cγ)^t, computed as exp(t·log1p(−cγ)): exact to rounding even when cγ is tiny
    and t is huge (1 − cγ itself would already round away the digits that matter)."""
    return np.exp(np.asarray(t, dtype=np.float64) * math.log1p(-k.c * gamma))
