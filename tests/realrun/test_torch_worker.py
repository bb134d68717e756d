"""The torch worker (realrun.torch_worker): on the CPU here, on CUDA where there is one.

The CPU tests run the very loop a GPU worker runs (threads, the host pattern, measure mode;
accumulation is refused on the CPU and tested on CUDA), against independent references: the
problems' numpy gradients and a plain numpy SGD loop. Tests marked ``gpu`` need CUDA and
skip cleanly without it.
"""

import json

import numpy as np
import pytest
import torch

from realrun.runner import run_real
from realrun.torch_worker import TorchGradient
from simulator.cli import main
from simulator.metrics import summarize
from simulator.problems import make_problem
from simulator.timing import sample_stream
from tests.conftest import check_hardware_loss, scenario

pytestmark = pytest.mark.alone  # real processes, or the CPUs probed: see conftest

TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=600")
CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs CUDA")


@pytest.mark.parametrize("problem", [
    ("problem.name=quadratic",), ("problem.name=logistic",),
    ("problem.name=sparse_logistic", "problem.dim=50", "problem.density=0.1"),
    ("problem.name=mlp", "problem.dim=6", "problem.hidden=5", "problem.classes=3"),
    ("problem.name=lstm_tagger", "problem.dim=7", "problem.hidden=3", "problem.classes=3",
     "problem.length=4", "problem.n_samples=20"),
])
def test_torch_gradient_equals_the_numpy_gradient(problem):
    """Autograd of the torch loss on the device copy of the data = the problem's numpy
    gradient; with several samples, their mean."""
    p = make_problem(scenario(*problem).problem)
    w = p.initial() + 0.1 * np.random.default_rng(0).standard_normal(p.dim)
    grad = TorchGradient(p)
    for sample in (1, 3, 7):
        got = grad(torch.as_tensor(w), sample).numpy()
        np.testing.assert_allclose(got, p.dense_grad(w, sample), rtol=1e-10, atol=1e-12)


def _numpy_sgd(s):
    """Serial SGD written plainly: one sample from the worker's stream per step."""
    p = make_problem(s.problem)
    stream = sample_stream(s.run.seed, 1, 0, p.n_samples)
    w = p.initial()
    for _ in range(s.run.updates):
        w = w - s.run.lr * p.dense_grad(w, int(stream.take()))
    return w


def test_serial_torch_worker_equals_plain_numpy_sgd():
    """(The host pattern places CUDA workers' parameters; on the CPU it is refused, and it is
    tested on CUDA below.)"""
    s = scenario(*TINY, "run.updates=200")
    run = run_real(s, 1, "serial", "float64", timeout=120, launch="threads")
    assert run.failure is None and len(run.trace) == 200
    np.testing.assert_allclose(run.trace["w_final"], _numpy_sgd(s), rtol=1e-12,
                               atol=1e-14)


def test_torch_workers_honour_a_learning_rate_schedule():
    """``run.lr_schedule`` on the torch worker (threads here; the same loop on CUDA): one
    float64 worker is plain SGD with the factor 1/m at its m-th update, to 1e-12; two
    lock-free workers take the factor at m = the updates counted as their write begins + 1:
    never above their completion's t, and t − 1 or t for nearly every update (a thread the
    OS stops in the middle of its write completes later, after others)."""
    s = scenario(*TINY, "run.updates=200", "run.lr_schedule=inverse", "run.lr=0.5")
    run = run_real(s, 1, "serial", "float64", timeout=120, launch="threads")
    assert run.failure is None
    p = make_problem(s.problem)
    stream = sample_stream(s.run.seed, 1, 0, p.n_samples)
    w = p.initial()
    for m in range(1, 201):
        w = w - s.run.lr / m * p.dense_grad(w, int(stream.take()))
    np.testing.assert_allclose(run.trace["w_final"], w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(run.trace["lr_scale"], 1 / run.trace["step"], rtol=1e-15)
    two = run_real(scenario(*TINY, "run.lr_schedule=inv_sqrt"), 2, "lockfree", "float64",
                   timeout=120, launch="threads", measure_every=1)
    assert two.failure is None
    m, t = np.rint(1 / two.trace["lr_scale"] ** 2), two.trace["step"]
    assert np.all(m <= t) and np.mean(m >= t - 1) > 0.95
    np.testing.assert_allclose(two.trace["lr_scale"], 1 / np.sqrt(m), rtol=1e-15)
    # Under a lock each update is counted before the next one's write: m = t exactly.
    locked = run_real(scenario(*TINY, "run.lr_schedule=inverse"), 2, "locked", "float64",
                      timeout=120, launch="threads", measure_every=1)
    assert locked.failure is None
    np.testing.assert_array_equal(np.rint(1 / locked.trace["lr_scale"]),
                                  locked.trace["step"])


def test_a_stopped_thread_leaves_its_pause():
    """A worker thread paused for 20 s stops when the run's timeout stops it, instead of
    sleeping out the pause and then updating the buffers of a run that has returned."""
    import threading

    before = threading.active_count()
    s = scenario(*TINY, "inject.pauses=[{thread=1, start=1000000, end=20000000000}]")
    run = run_real(s, 2, "lockfree", "float64", timeout=1, launch="threads")
    assert run.failure is not None and "timeout" in run.failure["reason"]
    assert threading.active_count() == before


def test_locked_threads_measure_no_error_and_lose_nothing():
    """Locked worker threads: the rebuilt serialized view is the real vector to the last bit,
    and no update carries a gradient error."""
    s = scenario(*TINY)
    run = run_real(s, 2, "locked", "float64", timeout=120, measure_every=1, launch="threads")
    assert run.failure is None and len(run.trace) == 600
    assert run.hardware_loss is not None
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0.0
    summary = summarize(run.trace, run.problem, run.scenario)
    assert summary["gradient_error"]["rate"] == 0.0
    assert summary["staleness"]["max"] == 0


def test_lock_free_threads_converge():
    s = scenario(*TINY, "run.updates=2000")
    run = run_real(s, 2, "lockfree", "float32", timeout=120, launch="threads")
    f_star = run.problem.optimum()[1]
    curve = run.trace["curve_loss"] - f_star
    assert run.failure is None and curve[-1] < 0.2 * curve[0]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--launch", "fibers", "--launch = 'fibers': must be one of processes, threads"),
    ("--pattern", "remote", "--pattern = 'remote': must be one of shared, host"),
    ("--device", "tpu", "--device = 'tpu': must be cpu, cuda or cuda:N"),
    # places CUDA workers' parameters: on the CPU it changed nothing, with exit 0
    ("--pattern", "host", "--pattern = 'host': places the parameters of CUDA workers"),
    # 0 turned measure mode off, with exit 0
    ("--measure-every", "0", "--measure-every = 0: must be >= 1"),
])
def test_bad_real_options_are_one_line(tmp_path, capsys, flag, value, message):
    out = tmp_path / "run"
    assert main(["real", "--out", str(out), "--quiet", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    assert main(["real", "--out", str(tmp_path / "r"), "--quiet", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0]


# ---- CUDA -------------------------------------------------------------------------------

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["threads", "processes"])
def test_cuda_serial_equals_plain_numpy_sgd(launch):
    s = scenario(*TINY, "run.updates=200")
    run = run_real(s, 1, "serial", "float64", timeout=300, device="cuda", launch=launch)
    assert run.failure is None
    np.testing.assert_allclose(run.trace["w_final"], _numpy_sgd(s), rtol=1e-10,
                               atol=1e-12)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["threads", "processes"])
def test_cuda_lock_free_workers_converge_and_measure(launch):
    """Four lock-free workers on one CUDA tensor: the run converges, the trace is well
    formed, and measure mode rebuilds the serialized view."""
    s = scenario("problem.name=mlp", "problem.dim=16", "problem.hidden=32",
                 "problem.n_samples=300", "run.updates=2000", "run.lr=0.05")
    run = run_real(s, 4, "lockfree", "float32", timeout=300, device="cuda", launch=launch,
                   measure_every=1)
    trace = run.trace
    assert run.failure is None and len(trace) == 2000
    for a, b in (("read_start", "read_end"), ("read_end", "grad_end"),
                 ("grad_end", "write_end")):
        assert np.all(trace[a] <= trace[b])
    assert trace["curve_loss"][-1] < 0.8 * trace["curve_loss"][0]
    assert trace["staleness"].mean() > 0
    assert trace["measured"].all() and np.isfinite(trace["delta_norm"]).all()
    check_hardware_loss(run)
    assert summarize(trace, run.problem, run.scenario)["gradient_error"]["rate"] > 0


@gpu
@pytest.mark.gpu
def test_cuda_locked_and_host_pattern_lose_nothing():
    s = scenario(*TINY)
    run = run_real(s, 2, "locked", "float64", timeout=300, device="cuda", measure_every=1)
    assert run.failure is None and run.hardware_loss["rebuilt_vs_real_norm"] == 0.0
    host = run_real(s, 1, "serial", "float64", timeout=300, device="cuda", pattern="host",
                    launch="processes")
    np.testing.assert_allclose(host.trace["w_final"], _numpy_sgd(s), rtol=1e-10,
                               atol=1e-12)


@gpu
@pytest.mark.gpu
def test_cli_real_on_cuda(tmp_path):
    out = tmp_path / "run"
    assert main(["real", "--device", "cuda", "--workers", "2", "--out", str(out), "--quiet",
                 "--set", "run.updates=500"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["device"] == "cuda" and summary["updates"] == 500


def test_torch_workers_refuse_injections_into_their_updates(tmp_path, capsys):
    """Threads (and CUDA workers) run stragglers, pauses and deaths; an injection into the
    updates themselves is one line, exit 2, nothing written."""
    out = tmp_path / "run"
    assert main(["real", "--launch", "threads", "--out", str(out), "--quiet",
                 "--set", "inject.drop=0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inject.drop = 0.1: torch workers" in err[0] and not out.exists()
