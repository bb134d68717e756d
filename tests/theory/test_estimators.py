"""Estimators of Theorem 1's constants against closed forms and hand computations."""

import numpy as np
import pytest
import scipy.stats

from simulator.engine import simulate
from simulator.errors import AsyngradError
from simulator.problems import LogisticProblem, QuadraticProblem, make_problem
from tests.conftest import scenario
from theory.estimators import (
    curvature,
    hessian_extremes,
    initial_distance,
    serialized_constants,
)


@pytest.mark.parametrize(("dim", "n"), [(2, 50), (30, 200), (60, 40)])
def test_lanczos_recovers_quadratic_constants(dim, n):
    """Hessian extremes from Hessian-vector products equal the exact c, q to 1e-8."""
    p = QuadraticProblem(dim, n, 0.05, seed=2)
    low, high = hessian_extremes(p, np.zeros(dim))
    assert low == pytest.approx(p.strong_convexity, rel=1e-8)
    assert high == pytest.approx(p.smoothness, rel=1e-8)


def test_logistic_closed_form_brackets_the_local_hessian():
    """For logistic the closed-form c, q bound the Hessian's spectrum at w*."""
    p = LogisticProblem.synthetic(25, 400, 0.01, seed=1)
    closed = curvature(p)
    assert closed.method == "closed form" and closed.convex
    low, high = hessian_extremes(p, p.optimum()[0])
    assert closed.c <= low + 1e-12 and high <= closed.q + 1e-12


def test_initial_distance_is_squared_distance_to_optimum():
    """a_0 = ‖w_0 − w*‖²."""
    p = QuadraticProblem(10, 50, 0.1, seed=0)
    w_star = p.optimum()[0]
    assert initial_distance(p, np.zeros(10)) == pytest.approx(float(w_star @ w_star))
    assert initial_distance(p, w_star) == 0.0


def test_locked_runs_have_no_error_term():
    """Under a lock δ = 0 up to rounding, so τ is ~0; κ² is a mean squared gradient."""
    trace = simulate(scenario("run.protocol=locked", "run.updates=400"))
    kappa2, tau = serialized_constants([trace], windows=1)
    assert abs(tau.mean) < 1e-12 and kappa2.n == 400
    assert kappa2.mean == pytest.approx(float(np.mean(trace["g_norm"] ** 2)), rel=1e-9)


def test_one_window_is_the_pooled_mean_with_a_t_bound():
    """windows=1: pooled mean, and the upper bound mean + t_{0.95,n−1}·sd/√n."""
    traces = [simulate(scenario("run.updates=300", f"run.seed={s}")) for s in range(2)]
    kappa2, tau = serialized_constants(traces, windows=1)
    harm = np.concatenate([-t["delta_dot"] for t in traces])
    assert tau.n == 600 and tau.mean == pytest.approx(max(harm.mean(), 0.0))
    squares = np.concatenate([t["s_norm"] ** 2 for t in traces])
    bound = squares.mean() + scipy.stats.t.ppf(0.95, 599) * squares.std(ddof=1) / np.sqrt(600)
    assert kappa2.upper == pytest.approx(bound)


def test_the_worst_window_is_reported():
    """A late window with larger errors determines τ (the condition holds at every t)."""
    trace = simulate(scenario("run.updates=1000"))
    harm = np.full(1000, -1.0)
    harm[700:800] = 2.0 + np.linspace(0, 0.1, 100)
    trace.arrays["delta_dot"] = -harm
    _, tau = serialized_constants([trace], windows=10)
    assert tau.window == 7 and tau.windows == 10 and tau.n == 100
    assert tau.mean == pytest.approx(2.05)
    _, pooled = serialized_constants([trace], windows=1)
    assert pooled.mean == 0.0  # the run-wide mean is negative: floored


def test_no_measured_updates_is_an_error():
    """Pilot runs without exact metrics cannot estimate κ² or τ."""
    with pytest.raises(AsyngradError, match=r"metrics\.exact"):
        serialized_constants([simulate(scenario("run.updates=50", "metrics.exact=false"))])


def test_curvature_without_closed_form_uses_the_hessian():
    """A problem without known constants gets them from Lanczos at w*."""
    p = make_problem(scenario("problem.name=quadratic", "problem.dim=12").problem)

    class Unknown(type(p)):
        strong_convexity = None
        smoothness = None

    p.__class__ = Unknown
    found = curvature(p)
    assert found.method.startswith("Hessian eigenvalues") and found.convex
    assert found.c == pytest.approx(QuadraticProblem.strong_convexity.fget(p), rel=1e-8)


def test_closed_form_curvature_is_convex_only_without_a_negative_c():
    """A closed-form c < 0 (a negative l2) is not convex; c = 0 (logistic, l2 = 0) is."""
    concave = curvature(QuadraticProblem(dim=5, n_samples=50, l2=-10.0, seed=0))
    assert concave.method == "closed form" and concave.c < 0 and not concave.convex
    flat = curvature(make_problem(scenario("problem.l2=0").problem))
    assert flat.method == "closed form" and flat.c == 0 and flat.convex
