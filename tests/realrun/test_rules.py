"""Update rules on real lock-free workers: staleness-aware learning rates (``staleness_lr``),
delay compensation (``dcasgd``) and learning-rate schedules, applied when a worker's write
begins by the simulator's own functions (``simulator.rules``)."""

import json

import numpy as np
import pytest

from realrun.runner import run_real
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.rules import staleness_scale
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=40", "problem.n_samples=200", "run.updates=600")

ONE_WORKER = [
    ("staleness_lr", 1, ["run.lr_schedule=inv_sqrt"]),
    ("dcasgd", 1, ["dcasgd.lam=2.0"]),
    ("lockfree", 1, ["run.lr_schedule=inverse", "run.lr=0.5"]),
    ("minibatch", 2, ["run.lr_schedule=inv_sqrt"]),
]


@pytest.mark.parametrize("mode, workers, options", ONE_WORKER)
def test_a_rule_without_concurrency_is_the_simulators_to_the_bit(mode, workers, options):
    """float64, one worker (minibatch: two, whose rounds have no concurrency): the same
    samples and the same rule at the same completion counts as the simulator, so the same
    final vector and the same factors on lr; measure mode divides the factor out of the
    serialized view, leaving δ at rounding."""
    s = scenario(*TINY, f"run.protocol={mode}", *options)
    real = run_real(s, workers, mode, dtype="float64", timeout=120,
                    measure_every=None if mode == "minibatch" else 1)
    simulated = simulate(real.scenario)
    assert real.failure is None and real.scenario.run.protocol == mode
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    assert np.array_equal(real.trace["lr_scale"], simulated["lr_scale"])
    if mode != "minibatch":
        assert np.nanmax(real.trace["delta_norm"]) < 1e-10


@pytest.mark.parametrize("launch", [None, "threads"])
def test_staleness_lr_divides_by_the_completions_a_worker_saw(launch):
    """Two workers: each factor is 1/τ for the τ completions a worker counted between its
    read's start and its write's start: at most one more than the trace's staleness (which
    counts write ends on to its own write's end; an update is counted just after its write
    ends, so one that ended before the read began may be counted after it); worker
    processes, and torch worker threads (the CUDA workers' loop)."""
    s = scenario(*TINY, "run.protocol=staleness_lr", "run.updates=2000")
    real = run_real(s, 2, "staleness_lr", dtype="float64", timeout=120, launch=launch)
    assert real.failure is None and len(real.trace) == 2000
    scale = real.trace["lr_scale"]
    tau = np.rint(1 / scale)
    np.testing.assert_allclose(scale, [staleness_scale(int(t)) for t in tau], rtol=0)
    bound = np.array([staleness_scale(int(x) + 1) for x in real.trace["staleness"]])
    assert (scale >= bound).all()
    if launch == "threads":  # (processes seldom overlap on this machine's two cores)
        assert (scale < 1).mean() > 0.01


def test_one_torch_worker_with_staleness_lr_and_a_schedule_is_the_simulators():
    """A torch worker thread (the CUDA workers' loop), float64: staleness_lr (τ = 0 alone)
    and an inv_sqrt schedule take the simulator's factors exactly, and its vector is the
    simulator's to 1e-12 (autograd sums in another order than the numpy gradient)."""
    s = scenario(*TINY, "run.protocol=staleness_lr", "run.lr_schedule=inv_sqrt")
    real = run_real(s, 1, "staleness_lr", dtype="float64", timeout=120, launch="threads")
    simulated = simulate(real.scenario)
    assert real.failure is None
    assert np.array_equal(real.trace["lr_scale"], simulated["lr_scale"])
    np.testing.assert_allclose(real.trace["w_final"], simulated["w_final"], rtol=1e-12,
                               atol=1e-14)


def test_rules_refuse_what_they_do_not_run(tmp_path, capsys):
    s = scenario(*TINY, "run.protocol=dcasgd")
    with pytest.raises(ScenarioError, match="delay compensation runs on CPU worker processes"):
        run_real(s, 2, "dcasgd", launch="threads")
    out = tmp_path / "run"
    sets = [a for o in (*TINY, "run.protocol=staleness_lr") for a in ("--set", o)]
    assert main(["real", "--out", str(out), "--quiet", *sets]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["mode"] == "staleness_lr" and summary["protocol"] == "staleness_lr"
