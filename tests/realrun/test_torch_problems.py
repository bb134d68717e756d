"""A user's torch model on the real backends: CPU worker processes on one shared vector, the
torch workers (autograd of the same loss), and the parameter server over loopback."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from realrun.ps import run_ps
from realrun.runner import run_real
from simulator.engine import simulate
from simulator.problems import make_problem
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

MODELS = Path(__file__).parent.parent / "simulator" / "problems" / "torch_models.py"
NET = ("problem.name=torch", f"problem.model={MODELS}:net", "problem.batch=4",
       "run.updates=600", "run.lr=0.2")
TWIN = ("problem.name=torch", f"problem.model={MODELS}:logistic", "run.updates=400",
        "run.lr=0.05")


def test_one_worker_on_a_torch_model_is_the_simulators_serial_run_to_the_bit():
    """Serial, float64, the torch twin of the logistic problem: the worker process draws the
    simulator's samples and applies the same gradients, so the final vectors are identical."""
    real = run_real(scenario(*TWIN), 1, "serial", dtype="float64", timeout=120)
    simulated = simulate(scenario(*TWIN, "run.protocol=serial"))
    assert real.failure is None and len(real.trace) == 400
    assert np.array_equal(real.trace["sample"], simulated["sample"])
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])


def test_lock_free_workers_train_a_torch_network_and_measure_its_errors():
    """Two lock-free processes on a ReLU network with minibatches of 4: the loss falls, and
    measure mode rebuilds the serialized view (finite exact errors on every 2nd update)."""
    s = scenario(*NET)
    run = run_real(s, 2, "lockfree", dtype="float64", timeout=120, measure_every=2)
    trace = run.trace
    assert run.failure is None and len(trace) == 600
    assert trace["curve_loss"][-1] < 0.8 * trace["curve_loss"][0]
    assert np.isfinite(trace["delta_norm"][trace["measured"]]).all()
    assert set(np.unique(trace["sample"])) <= set(range(make_problem(s.problem).n_samples))


def _plain_sgd(s, samples):
    """Plain SGD with the problem's own gradients over ``samples``, from w_0."""
    problem = make_problem(s.problem)
    w = problem.initial()
    for sample in samples:
        w = w - s.run.lr * problem.grad(w, int(sample))[0]
    return w


def test_torch_workers_run_the_same_loss_by_autograd():
    """Worker threads computing autograd of the problem's torch loss (float64) end where
    plain SGD with the problem's own gradients ends, to 1e-12."""
    s = scenario(*NET, "run.updates=150")
    run = run_real(s, 1, "serial", "float64", timeout=120, launch="threads")
    w = _plain_sgd(s, run.trace["sample"])
    assert run.failure is None and len(run.trace) == 150
    np.testing.assert_allclose(run.trace["w_final"], w, rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("launch, pattern", [("threads", "shared"), ("processes", "shared"),
                                             ("threads", "host")])
def test_cuda_workers_run_a_torch_network(launch, pattern):
    """The user's module on a GPU: one worker ends where plain SGD with the problem's own
    gradients ends (float64, to 1e-10: cuBLAS sums in another order), and two lock-free
    workers train it with measure mode's exact errors."""
    s = scenario(*NET, "run.updates=150")
    one = run_real(s, 1, "serial", "float64", timeout=300, device="cuda", launch=launch,
                   pattern=pattern)
    w = _plain_sgd(s, one.trace["sample"])
    assert one.failure is None and len(one.trace) == 150
    np.testing.assert_allclose(one.trace["w_final"], w, rtol=1e-10, atol=1e-12)
    two = run_real(scenario(*NET), 2, "lockfree", "float64", timeout=300, device="cuda",
                   launch=launch, pattern=pattern, measure_every=2)
    assert two.failure is None and len(two.trace) == 600
    assert two.trace["curve_loss"][-1] < 0.8 * two.trace["curve_loss"][0]
    assert np.isfinite(two.trace["delta_norm"][two.trace["measured"]]).all()


def test_the_parameter_server_trains_a_torch_network():
    """Two trainers pushing gradients of the network to the server over loopback."""
    run = run_ps(scenario(*NET, "run.updates=300"), 2, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 300
    assert run.trace["curve_loss"][-1] < run.trace["curve_loss"][0]


def test_a_worker_that_builds_another_problem_stops_the_run(capfd):
    """A factory whose data depends on the process: each worker's problem is compared with the
    parent's before the start (its fingerprint: data and w_0), and the run stops with a
    failure naming problem.model instead of training other data. A parameter-server trainer
    says so in one line and tells the server, which stops the run at once, with no push."""
    s = scenario("problem.name=torch", f"problem.model={MODELS}:per_process",
                 "run.updates=100")
    run = run_real(s, 2, "lockfree", dtype="float64", timeout=60)
    assert run.failure is not None and len(run.trace) == 0
    assert "built another problem than the parent" in run.failure["reason"]
    assert "problem.model" in run.failure["reason"]
    served = run_ps(s, 1, "float64", timeout=60)
    assert served.failure is not None and served.pushes == 0
    assert "trainer 1 built another problem" in served.failure["reason"]
    assert served.seconds < 50  # told, not waiting out the 60 s receive timeout
    assert "trainer 1 built another problem than the parent" in capfd.readouterr().err
