"""Sandblaster L-BFGS (``run.protocol = "sandblaster"``): its L-BFGS rule against an
independent dense BFGS recursion, its optimum against scipy's L-BFGS, its rounds' semantics
and the point of its work units (a straggler does fewer)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

from simulator.engine import Engine, simulate
from simulator.errors import ScenarioError
from simulator.problems import make_problem
from simulator.replay import replay
from simulator.rules import lbfgs_direction, lbfgs_pair
from tests.conftest import same_every_way, scenario

QUADRATIC = ("run.protocol=sandblaster", "problem.name=quadratic", "run.lr=1.0",
             "metrics.curve_points=50")


def test_the_two_loop_recursion_is_the_bfgs_inverse_update():
    """With every pair kept, H·g from the two-loop recursion equals the dense BFGS inverse
    update H ← (I − ρsyᵀ)ᵀ… applied pair by pair from γI (Nocedal & Wright eq. 7.19)."""
    rng = np.random.default_rng(0)
    d = 6
    a = rng.standard_normal((d, d))
    hessian = a @ a.T + d * np.eye(d)
    pairs = []
    for _ in range(4):
        s = rng.standard_normal(d)
        pairs.append((s, hessian @ s))
    assert all(lbfgs_pair(s, y) for s, y in pairs)
    s, y = pairs[-1]
    h = (s @ y) / (y @ y) * np.eye(d)
    for s, y in pairs:
        rho = 1 / (y @ s)
        v = np.eye(d) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    g = rng.standard_normal(d)
    np.testing.assert_allclose(lbfgs_direction(g, pairs), h @ g, rtol=1e-12)
    np.testing.assert_array_equal(lbfgs_direction(g, []), g)
    assert not lbfgs_pair(pairs[0][0], -pairs[0][1])  # negative curvature: left out


@pytest.mark.parametrize("threads", [1, 4])
def test_sandblaster_reaches_scipys_lbfgs_optimum_on_a_quadratic(threads):
    """No stragglers: 40 rounds of 16 units reach the minimizer scipy's L-BFGS finds, to
    1e-8, and each round's step is the same whatever the number of replicas (the units'
    mean is ∇f either way)."""
    s = scenario(*QUADRATIC, f"run.threads={threads}", "run.updates=640")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    reference = scipy.optimize.minimize(problem.full_loss, problem.initial(),
                                        jac=problem.full_grad, method="L-BFGS-B",
                                        options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 500})
    np.testing.assert_allclose(trace["w_final"], reference.x, atol=1e-8)
    assert trace["step"].max() == 40
    one = simulate(scenario(*QUADRATIC, "run.threads=1", "run.updates=640"), problem)
    np.testing.assert_allclose(trace["w_final"], one["w_final"], rtol=0, atol=1e-12)


def test_one_round_is_a_full_gradient_step():
    """With one round of units the step is α·∇f(x_0): the units' weighted mean is the full
    gradient, and without a pair H is the identity."""
    s = scenario(*QUADRATIC, "run.threads=3", "run.updates=16", "run.lr=0.3")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    w0 = problem.initial()
    np.testing.assert_allclose(trace["w_final"], w0 - 0.3 * problem.full_grad(w0),
                               rtol=1e-12, atol=1e-14)


def test_a_round_reads_one_vector_and_completes_once():
    """Every unit of round r reads after round r − 1's step was written, the round's U rows
    share completion r, and the units of one round cover every chunk once."""
    s = scenario(*QUADRATIC, "run.threads=3", "run.updates=64", "sandblaster.units=8",
                 "timing.grad.dist=exponential")
    trace = simulate(s)
    steps = trace["step"]
    assert sorted(np.bincount(steps)[1:].tolist()) == [8] * 8
    for r in range(2, 9):
        written = trace["write_end"][steps == r - 1].max()
        assert trace["read_start"][steps == r].min() >= written
    chunks = np.array_split(np.arange(make_problem(s.problem).n_samples), 8)
    firsts = sorted(int(c[0]) for c in chunks)
    for r in range(1, 9):
        assert sorted(trace["sample"][steps == r].tolist()) == firsts


def test_a_straggler_does_fewer_units():
    """The point of many small units: a replica four times slower takes about a quarter of
    the others' share, and the run is not four times as long."""
    base = (*QUADRATIC, "run.threads=4", "run.updates=1280", "sandblaster.units=32")
    slow = simulate(scenario(*base, "inject.stragglers=[{thread=0, factor=4}]"))
    even = simulate(scenario(*base))
    counts = np.bincount(slow["thread"], minlength=4)
    assert counts[0] < 0.45 * counts[1:].mean()
    assert slow["write_end"].max() < 2 * even["write_end"].max()


def test_sandblaster_is_deterministic_every_way():
    same_every_way(scenario(*QUADRATIC, "run.threads=3", "run.updates=96",
                            "sandblaster.units=8", "timing.grad.dist=exponential"))


def test_what_sandblaster_cannot_run_is_refused():
    with pytest.raises(ScenarioError, match=r"run\.updates.*whole number of rounds"):
        scenario(*QUADRATIC, "run.updates=100")
    with pytest.raises(ScenarioError, match=r"sandblaster\.units.*run\.threads"):
        scenario(*QUADRATIC, "run.threads=8", "sandblaster.units=4", "run.updates=64")
    with pytest.raises(ScenarioError, match=r"inject\.deaths"):
        scenario(*QUADRATIC, "run.updates=64", "inject.deaths=[{thread=0, at=1000}]")
    with pytest.raises(ScenarioError, match=r"inject\.error"):
        scenario(*QUADRATIC, "run.updates=64", "inject.error=noise")
    engine = Engine(scenario(*QUADRATIC, "run.updates=64"))  # 1,000 samples in 16 units
    assert engine.protocol.grad_work == 63
    with pytest.raises(ScenarioError, match=r"sandblaster\.units.*samples"):
        Engine(scenario(*QUADRATIC, "problem.n_samples=10", "run.updates=64"))
    with pytest.raises(ScenarioError, match=r"sandblaster\.units.*fixed by the trace"):
        replay(simulate(scenario(*QUADRATIC, "run.updates=32")), ["sandblaster.units=8"])


def test_calibration_counts_a_units_gradients():
    """A unit's gradient phase is ⌈n/U⌉ gradient durations: calibration's operation samples
    give one gradient's, the timing's constant 6000 ns."""
    from simulator.fidelity.runs import operation_samples

    s = scenario(*QUADRATIC, "run.updates=32", "timing.grad.dist=constant")
    samples = operation_samples(simulate(s), s)
    grads = np.concatenate([per["grad"] for per in samples.values()])
    np.testing.assert_allclose(grads, 6000, rtol=1e-3)


def serial_lbfgs(problem, rounds: int, memory: int, lr: float) -> np.ndarray:
    """An independent reference: the full gradient each round, the dense BFGS inverse
    update rebuilt from γI over the last ``memory`` pairs with s·y > 1e-10‖s‖‖y‖, and the
    step x − lr·H·g."""
    x = problem.initial().astype(np.float64)
    pairs, previous = [], None
    for _ in range(rounds):
        g = problem.full_grad(x)
        if previous is not None:
            s, y = x - previous[0], g - previous[1]
            if s @ y > 1e-10 * np.linalg.norm(s) * np.linalg.norm(y):
                pairs = [*pairs, (s, y)][-memory:]
        previous = (x.copy(), g.copy())
        h = np.eye(x.size)
        if pairs:
            s, y = pairs[-1]
            h *= (s @ y) / (y @ y)
        for s, y in pairs:
            rho = 1 / (y @ s)
            v = np.eye(x.size) - rho * np.outer(y, s)
            h = v.T @ h @ v + rho * np.outer(s, s)
        x = x - lr * h @ g
    return x


@pytest.mark.parametrize("problem_settings", [
    ("problem.name=logistic", "problem.dim=20", "problem.n_samples=200", "run.lr=1.0"),
    ("problem.name=mlp", "problem.dim=8", "problem.n_samples=120", "problem.hidden=6",
     "run.lr=0.5")])
def test_every_round_is_a_serial_lbfgs_step(problem_settings):
    """Twelve rounds with a history of three pairs on a non-quadratic problem (where L-BFGS
    and gradient descent part at once), three threads: the final vector is an independent
    serial L-BFGS's to rounding."""
    s = scenario("run.protocol=sandblaster", *problem_settings, "run.threads=3",
                 "sandblaster.units=8", "sandblaster.memory=3", "run.updates=96")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    reference = serial_lbfgs(problem, 12, 3, s.run.lr)
    np.testing.assert_allclose(trace["w_final"], reference, rtol=1e-9, atol=1e-12)
    descent = problem.initial()
    for _ in range(12):
        descent = descent - s.run.lr * problem.full_grad(descent)
    assert np.abs(trace["w_final"] - descent).max() > 1e-3  # (not gradient descent)


def test_sandblaster_takes_a_torch_models_full_gradient_in_work_units():
    """``sandblaster`` on a torch model: its first round's six work units over the 15
    minibatches (chunks of 3 and 2) add up to ∇f(w_0) exactly (to 1e-12), so the round's step
    is −lr·∇f(w_0) (no L-BFGS pair yet)."""
    pytest.importorskip("torch")
    from pathlib import Path

    from simulator.scenario import scenario_from_dict
    from tests.simulator.problems import torch_models

    s = scenario_from_dict({
        "problem": {"name": "torch", "model": f"{Path(torch_models.__file__)}:"
                    "convnet_sequential", "batch": 8, "l2": 0.001},
        "run": {"protocol": "sandblaster", "threads": 3, "updates": 6, "lr": 0.5},
        "sandblaster": {"units": 6}})
    convnet = make_problem(s.problem)
    trace = simulate(s, problem=convnet)
    w0 = convnet.initial()
    np.testing.assert_allclose(trace["w_final"], w0 - 0.5 * convnet.full_grad(w0), rtol=0,
                               atol=1e-12)
