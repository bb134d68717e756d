"""Theorem 1 of AsynGrad: the identities of DESIGN §5 over random valid inputs."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.errors import ScenarioError
from theory.asyngrad import (
    Constants,
    InfeasibleError,
    contraction,
    error_budget,
    fixed_point,
    learning_rate,
    recursion_bound,
    tau_limit,
    updates,
)

positive = st.floats(1e-4, 1e3)


@st.composite
def feasible(draw):
    """Constants, ε and β with 2τq < cε."""
    c = draw(st.floats(1e-3, 10.0))
    q = c * draw(st.floats(1.0, 1e3))
    eps = draw(st.floats(1e-6, 10.0))
    tau = draw(st.floats(0.0, 0.999)) * c * eps / (2 * q)
    k = Constants(c=c, q=q, kappa2=draw(positive), tau=tau, a0=draw(positive))
    return k, eps, draw(st.floats(1.0, 100.0))


@settings(max_examples=300)
@given(feasible())
def test_updates_equal_log_ratio_over_c_gamma(case):
    """(10) is ⌈log(q a_0/ε)/(cγ)⌉ with γ from (9)."""
    k, eps, beta = case
    gamma = learning_rate(k, eps, beta)
    ratio = k.q * k.a0 / eps
    assume(ratio > 1.0001)
    exact = math.log(ratio) / (k.c * gamma)
    assume(abs(exact - round(exact)) > 1e-6 * max(exact, 1))  # away from ceiling ties
    assert updates(k, eps, beta) == math.ceil(exact)


@settings(max_examples=300)
@given(feasible())
def test_fixed_point_times_q_is_eps_at_beta_one(case):
    """q·(γκ² + 2τ)/c equals ε at β = 1 and is below ε for β > 1."""
    k, eps, beta = case
    assert k.q * fixed_point(k, learning_rate(k, eps, 1.0)) == pytest.approx(eps, rel=1e-9)
    if beta > 1 + 1e-9:
        assert k.q * fixed_point(k, learning_rate(k, eps, beta)) < eps


@settings(max_examples=200)
@given(feasible())
def test_bound_after_t_updates_is_within_eps(case):
    """After t updates the recursion's bound gives (q/2)·b_t <= ε (the theorem's claim)."""
    k, eps, beta = case
    gamma = learning_rate(k, eps, beta)
    assume(k.c * gamma < 1)
    t = updates(k, eps, beta)
    star = fixed_point(k, gamma)
    b_t = star + contraction(k, gamma, t) * (k.a0 - star)
    assert k.q / 2 * b_t <= eps * (1 + 1e-9)


@settings(max_examples=100)
@given(feasible(), st.integers(1, 200))
def test_closed_form_bound_solves_the_recursion(case, steps):
    """recursion_bound equals iterating b_t = (1 − cγ)b_{t−1} + γ²κ² + 2γτ."""
    k, eps, beta = case
    gamma = learning_rate(k, eps, beta)
    assume(k.c * gamma < 1)
    bound = recursion_bound(k, gamma, steps)
    b = k.a0
    for t in range(1, steps + 1):
        b = (1 - k.c * gamma) * b + gamma**2 * k.kappa2 + 2 * gamma * k.tau
        assert bound[t] == pytest.approx(b, rel=1e-9, abs=1e-300)


def test_error_budget_and_tau_limit():
    """2τq/(cε) reaches 1 exactly at the τ limit cε/(2q)."""
    k = Constants(c=0.1, q=2, kappa2=9, tau=1e-4, a0=4)
    assert error_budget(k, 1e-2) == pytest.approx(0.4)
    assert tau_limit(k, 1e-2) == pytest.approx(2.5e-4)
    at_limit = Constants(c=0.1, q=2, kappa2=9, tau=2.5e-4, a0=4)
    assert error_budget(at_limit, 1e-2) == pytest.approx(1.0)


def test_infeasible_error_says_what_tau_is_needed():
    """With 2τq >= cε no γ > 0 exists: an InfeasibleError naming the needed τ."""
    k = Constants(c=0.1, q=2, kappa2=9, tau=1e-3, a0=4)
    with pytest.raises(InfeasibleError, match=r"τ < cε/\(2q\) = 0\.00025"):
        learning_rate(k, 1e-2)
    with pytest.raises(InfeasibleError):
        updates(k, 1e-2)


def test_already_converged_start_needs_no_updates():
    """When q a_0 <= ε, t = 0."""
    assert updates(Constants(c=1, q=2, kappa2=1, tau=0, a0=1e-4), 1e-2) == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"c": 0.0}, "c"), ({"c": -1.0}, "c"), ({"q": float("nan")}, "q"), ({"q": 0.05}, "q"),
    ({"kappa2": 0.0}, "kappa2"), ({"tau": -1e-3}, "tau"), ({"a0": float("inf")}, "a0"),
])
def test_invalid_constants_name_the_field(kwargs, field):
    """Each invalid constant raises a ScenarioError naming it."""
    values = {"c": 0.1, "q": 2.0, "kappa2": 9.0, "tau": 1e-4, "a0": 4.0, **kwargs}
    with pytest.raises(ScenarioError) as err:
        Constants(**values)
    assert err.value.field == field


@pytest.mark.parametrize(("eps", "beta", "field"), [(0.0, 1.0, "eps"), (-1.0, 1.0, "eps"),
                                                     (float("nan"), 1.0, "eps"),
                                                     (1e-2, 0.5, "beta")])
def test_invalid_eps_and_beta(eps, beta, field):
    """ε <= 0, β < 1 and NaN are errors naming the field."""
    k = Constants(c=0.1, q=2, kappa2=9, tau=1e-4, a0=4)
    with pytest.raises(ScenarioError) as err:
        learning_rate(k, eps, beta)
    assert err.value.field == field


def _theorem(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", "theorem", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_the_theorem():
    """The issue's example prints γ (9), t (10), the budget and the fixed point."""
    result = _theorem("--c", "0.1", "--q", "2", "--kappa", "3", "--tau", "1e-4", "--eps",
                      "1e-2", "--a0", "4")
    assert result.returncode == 0, result.stderr
    assert "3.33333e-05" in result.stdout and "2,005,384" in result.stdout
    assert "0.4" in result.stdout and "0.005" in result.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--tau", "1e-3"], "no positive learning rate exists"),
    (["--eps", "0"], "eps = 0.0"),
    (["--beta", "0.5"], "beta = 0.5"),
    (["--c", "nan"], "c = nan"),
    (["--kappa", "-1"], "--kappa = -1.0"),
])
def test_cli_bad_theorem_input_is_one_line(args, needle):
    """Infeasible or invalid constants: one line, exit 2."""
    base = {"--c": "0.1", "--q": "2", "--kappa": "3", "--tau": "1e-4", "--eps": "1e-2",
            "--a0": "4"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = _theorem(*[x for pair in base.items() for x in pair])
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_recursion_bound_rejects_non_contracting_rates():
    """cγ >= 1 is not a contraction: refused with the field named."""
    k = Constants(c=0.5, q=2, kappa2=1, tau=0, a0=1)
    with pytest.raises(ScenarioError, match="gamma"):
        recursion_bound(k, 3.0, 10)
    assert np.all(np.diff(recursion_bound(k, 0.1, 50)) < 0)


def test_updates_beyond_floating_point_are_infeasible(capsys):
    """t of (10) whose quotient overflows (or whose denominator underflows to 0) is refused
    as beyond any run, not an OverflowError: the command line says so in one line, exit 2."""
    for k, eps in ((Constants(c=1e-160, q=1, kappa2=1e300, tau=0, a0=10), 1.0),
                   (Constants(c=1e-200, q=1, kappa2=1, tau=0, a0=1e300), 1e-120)):
        with pytest.raises(InfeasibleError, match=r"Theorem 1 \(10\) asks for inf updates"):
            updates(k, eps)
    assert main(["theorem", "--c", "1e-160", "--q", "1", "--kappa", "1e150", "--tau", "0",
                 "--eps", "1", "--a0", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t (10) = more than 2^63 updates" in err[0], err
