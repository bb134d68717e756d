"""Asynchronous consensus ADMM on real worker processes (``--mode admm``): the push each
worker adds to the shared consensus z is ``simulator.rules.admm_push``, as in the
simulator's ``admm``."""

import json

import numpy as np
import pytest

from realrun.runner import run_real
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=30", "problem.n_samples=200", "run.protocol=admm")


@pytest.mark.parametrize("options", [(), ("run.blocks=3", "run.lr_schedule=inv_sqrt",
                                          "admm.local_steps=3", "admm.rho=0.5"),
                                     ("inject.delay=1", "inject.delay_dist=uniform",
                                      "inject.delay_max=4")])
def test_one_real_worker_is_the_simulators_admm(options):
    """float64, one worker: nothing interleaves, so the real run is the simulator's admm
    with ``split = even`` to the bit: the same first local samples, the same final z, the
    same primal residual after every push (with injected delays: z pulled from τ pushes
    back, the same τ); the dual to rounding (the simulator takes Δz as z_t − z_{t−1}, the
    real writer as its push)."""
    s = scenario(*TINY, "run.updates=150", *options)
    real = run_real(s, 1, "admm", dtype="float64", timeout=120)
    assert real.failure is None and len(real.trace) == 150
    assert real.scenario.run.protocol == "admm" and real.scenario.run.write_mode == "atomic_add"
    simulated = simulate(real.scenario)
    assert np.array_equal(real.trace["sample"], simulated["sample"])
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    for name in ("lr_scale", "delay", "staleness"):
        assert np.array_equal(real.trace[name], simulated[name]), name
    assert np.array_equal(real.trace["extra_primal_residual"],
                          simulated["extra_primal_residual"])
    np.testing.assert_allclose(real.trace["extra_dual_residual"],
                               simulated["extra_dual_residual"], rtol=1e-9)
    assert not real.trace["measured"].any()  # an ADMM push is not a gradient step


def test_two_real_workers_converge_as_the_simulation_does():
    """Two workers, asynchronous pushes (atomic per block): stated tolerances against the
    simulation of the recorded scenario, over 3,000 pushes on the dense logistic problem:
    the final suboptimality within 2× of the simulator's (the issue's fidelity target) and
    far below the start; the median residuals of the last 500 pushes within 0.5–2× (a
    quiet machine gives 0.97–1.06; under CI's load a worker descheduled for a time slice
    lets the other push alone and its copy drift from z: 1.31 and 1.64 seen); every worker
    made its even share."""
    s = scenario("problem.name=logistic", "run.protocol=admm", "run.updates=3000")
    real = run_real(s, 2, "admm", dtype="float64", timeout=120)
    assert real.failure is None and len(real.trace) == 3000
    simulated = simulate(real.scenario, problem=real.problem)
    f_star = real.problem.full_loss(real.problem.optimum()[0])
    start = real.trace["curve_loss"][0] - f_star
    gaps = [t["curve_loss"][-1] - f_star for t in (real.trace, simulated)]
    assert gaps[0] < start / 4
    assert 0.5 < gaps[0] / gaps[1] < 2.0, gaps
    for name in ("extra_primal_residual", "extra_dual_residual"):
        ratio = np.median(real.trace[name][-500:]) / np.median(simulated[name][-500:])
        assert 0.5 < ratio < 2.0, (name, ratio)
    assert np.bincount(real.trace["thread"]).tolist() == [1500, 1500]


def test_measure_mode_replays_the_pushes():
    """--measure: the exact loss curve at the simulator's checkpoints from the replayed
    pushes, no row measured, and nothing lost: the rebuilt final z is the real one to
    rounding (the pushes hold a lock per block; a store's stamp, taken after the lock's
    release, can order two pushes of a block otherwise than the lock did)."""
    s = scenario(*TINY, "run.updates=400", "run.blocks=2")
    real = run_real(s, 2, "admm", dtype="float64", timeout=120, measure_every=1)
    assert real.failure is None and not real.trace["measured"].any()
    assert real.hardware_loss["rebuilt_vs_real_max"] < 1e-12
    simulated = simulate(real.scenario)
    assert np.array_equal(real.trace["curve_t"], simulated["curve_t"])
    z = real.trace["w_final"]
    assert real.trace["curve_loss"][-1] == real.problem.full_loss(z)


def test_the_command_line_runs_admm(tmp_path):
    """``asyngrad real --set run.protocol=admm``: ADMM workers (no --mode needed), the
    residuals in the trace as the simulator's."""
    out = tmp_path / "run"
    sets = [a for o in (*TINY, "run.updates=200") for a in ("--set", o)]
    assert main(["real", "--out", str(out), "--quiet", *sets]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["mode"] == "admm" and summary["updates"] == 200
    with np.load(out / "trace.npz", allow_pickle=False) as trace:
        primal, dual = trace["extra_primal_residual"], trace["extra_dual_residual"]
    assert primal.shape == dual.shape == (200,)
    assert np.isfinite(primal).all() and (dual > 0).any()


def test_the_merge_puts_each_push_s_residuals_on_its_row():
    """The residuals a worker recorded after each push land on that push's row of the
    trace, in completion order (rows interleaved across two workers)."""
    from realrun.timeline import WorkerRecord, merge

    def record(ends, residuals):
        ends = np.asarray(ends)
        times = np.stack([ends - 30, ends - 20, ends - 10, ends], axis=1)
        return WorkerRecord(times, times[:, 1:2].copy(), times[:, 3:4].copy(),
                            np.arange(len(ends)), residuals=np.asarray(residuals, dtype=float))

    records = [record([100, 300, 500], [[1, 10], [3, 30], [5, 50]]),
               record([200, 400], [[2, 20], [4, 40]])]
    s = scenario(*TINY, "run.updates=5", "run.threads=2", "run.split=even")
    from simulator.scenario import scenario_to_toml

    w0 = np.zeros(30)
    trace, _ = merge(records, w0, w0, [(0, 70, 1.0, 0.0), (5, 500, 1.0, 0.0)],
                     scenario_to_toml(s))
    assert trace["thread"].tolist() == [0, 1, 0, 1, 0]
    assert trace["extra_primal_residual"].tolist() == [1, 2, 3, 4, 5]
    assert trace["extra_dual_residual"].tolist() == [10, 20, 30, 40, 50]


@pytest.mark.parametrize(("kwargs", "override", "match"), [
    ({"launch": "threads"}, (), "CPU worker processes"),
    ({}, ("inject.error=noise",), "inject.error"),
])
def test_admm_refuses_what_it_does_not_run(kwargs, override, match):
    s = scenario(*TINY, "run.updates=40", *override)
    with pytest.raises(ScenarioError, match=match):
        run_real(s, 2, "admm", **kwargs)


def test_a_straggler_pushes_as_often_but_slower():
    """Stalls run under ADMM as under every mode (``[[inject.stragglers]]``): the slow
    worker's gradient phase (its local solve) takes about ``factor`` times as long (within
    what another process on a core of its own does to the fast worker's: a factor of 5
    gives 2 to 8)."""
    s = scenario(*TINY, "run.updates=200", "admm.local_steps=4",
                 "inject.stragglers=[{thread=1, factor=5.0}]")
    real = run_real(s, 2, "admm", dtype="float64", timeout=120)
    assert real.failure is None
    trace = real.trace
    solve = [np.median(trace["grad_ns"][trace["thread"] == r]) for r in (0, 1)]
    assert 2.0 < solve[1] / solve[0] < 8.0, solve
