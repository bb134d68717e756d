"""Protocols with rounds or turns on real worker processes: synchronous minibatch SGD
(``--mode minibatch``: a barrier per round, worker 0 subtracting the round's mean step) and
delayed SGD in a fixed turn order (``--mode roundrobin``)."""

import json

import numpy as np
import pytest

from realrun.runner import run_real
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=30", "problem.n_samples=200", "run.protocol=minibatch")


def _rounds(trace):
    """Per round (completion t), its rows in trace order."""
    return [np.flatnonzero(trace["step"] == t) for t in np.unique(trace["step"])]


@pytest.mark.parametrize("workers, updates, blocks", [(2, 400, 1), (3, 401, 3)])
def test_real_rounds_are_the_simulators_rounds(workers, updates, blocks):
    """float64: round r averages every worker's r-th gradient (the first T mod k workers take
    the last round) at the same vector, as the simulator's minibatch with ``split = even``
    does. The same samples in the same rounds; the final vector is the simulator's to the bit
    with two workers (a + b = b + a), to rounding with three (the real writer sums in rank
    order, the simulator in arrival order)."""
    s = scenario(*TINY, f"run.updates={updates}", f"run.blocks={blocks}")
    real = run_real(s, workers, "minibatch", dtype="float64", timeout=120)
    assert real.failure is None and len(real.trace) == updates
    assert real.scenario.run.protocol == "minibatch" and real.scenario.run.split == "even"
    simulated = simulate(real.scenario)
    rows = sorted(zip(*(real.trace[n].tolist() for n in ("step", "thread", "sample")),
                      strict=True))
    assert rows == sorted(zip(*(simulated[n].tolist() for n in ("step", "thread", "sample")),
                              strict=True))
    if workers == 2:
        assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    else:
        np.testing.assert_allclose(real.trace["w_final"], simulated["w_final"], atol=1e-12)
    trace = real.trace
    assert trace["staleness"].max() == 0 and trace["read_overwrites"].max() == 0
    rounds = _rounds(trace)
    assert len(rounds) == -(-updates // workers)
    assert sorted(trace["thread"][rounds[-1]].tolist()) == list(range(updates % workers
                                                                      or workers))
    previous_end = -1
    for members in rounds:
        writer = members[-1]  # the members' empty writes come first, at the round's end
        assert (trace["write_end"][members] == trace["write_end"][writer]).all()
        assert (trace["write_start"][members[:-1]] == trace["write_end"][writer]).all()
        assert (trace["grad_end"][members] <= trace["write_end"][writer]).all()
        assert (trace["read_start"][members] >= previous_end).all()  # no read meets a write
        previous_end = trace["write_end"][writer]
    # Only the writer's block operations write.
    offsets, write_ns = trace["op_offsets"], trace["op_write_ns"]
    for members in rounds:
        assert all(write_ns[offsets[i]:offsets[i + 1]].sum() == 0 for i in members[:-1])


def test_minibatch_refuses_what_it_does_not_run():
    s = scenario(*TINY, "run.updates=40")
    with pytest.raises(ScenarioError, match="CPU worker processes"):
        run_real(s, 2, "minibatch", launch="threads")


@pytest.mark.parametrize("workers, options", [(2, ()), (3, ("run.blocks=3",
                                                             "run.lr_schedule=inv_sqrt"))])
def test_measure_mode_rebuilds_rounds(workers, options):
    """--measure: the writer's row holds the round's mean step, and the view measures each
    round at its writer's row against the mean gradient of its samples, as the simulator
    does: zero gradient error (rounding) on the same rows, the same step norms."""
    s = scenario(*TINY, "run.updates=401", *options)
    real = run_real(s, workers, "minibatch", dtype="float64", timeout=120, measure_every=1)
    simulated = simulate(real.scenario)
    trace = real.trace
    assert real.failure is None and real.hardware_loss["rebuilt_vs_real_max"] == 0
    assert np.array_equal(trace["measured"], simulated["measured"])
    assert trace["measured"].sum() == -(-401 // workers)  # one measured row a round
    assert np.nanmax(trace["delta_norm"] / trace["g_norm"]) < 1e-12
    np.testing.assert_allclose(trace["s_norm"], simulated["s_norm"], rtol=1e-12)


def test_the_command_line_runs_the_scenarios_protocol(tmp_path, capsys):
    """``asyngrad real --set run.protocol=minibatch`` runs real rounds (no --mode needed);
    an explicit other mode is refused in one line."""
    out = tmp_path / "run"
    sets = [a for o in (*TINY, "run.updates=200") for a in ("--set", o)]
    assert main(["real", "--out", str(out), "--quiet", "--dtype", "float64", *sets]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["mode"] == "minibatch" and summary["real"]["workers"] == 2
    assert summary["updates"] == 200 and summary["steps"] == 100  # two gradients a step
    assert main(["real", "--out", str(tmp_path / "no"), "--quiet", "--mode", "lockfree",
                 *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.protocol = 'minibatch'" in err[0], err


@pytest.mark.parametrize("workers, updates, blocks", [(2, 400, 1), (3, 401, 3), (4, 3, 1)])
def test_real_turns_are_the_simulators_turns(workers, updates, blocks):
    """float64: reads and writes in one fixed order leave nothing to chance, so the real run
    is the simulator's roundrobin with ``split = even`` to the bit: the final vector, every
    update's staleness (k − 1 from the k-th update on; fewer updates than workers: the
    active ones) and, measured, its gradient error."""
    s = scenario("problem.dim=40", "problem.n_samples=200", "run.protocol=roundrobin",
                 f"run.updates={updates}", f"run.blocks={blocks}")
    real = run_real(s, workers, "roundrobin", dtype="float64", timeout=120, measure_every=1)
    assert real.failure is None and len(real.trace) == updates
    simulated = simulate(real.scenario)
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    for name in ("thread", "sample", "staleness", "step"):
        assert np.array_equal(real.trace[name], simulated[name]), name
    np.testing.assert_allclose(real.trace["delta_norm"], simulated["delta_norm"], rtol=1e-12)
    active = min(workers, updates)
    assert (real.trace["staleness"][active - 1:] == active - 1).all()


@pytest.mark.parametrize("workers, updates", [(2, 400), (3, 401)])
def test_allreduce_rounds_are_the_simulators_minibatch(workers, updates):
    """``--mode allreduce``: each worker trains its own replica and a torch.distributed
    all-reduce sums the round's steps (data-parallel training as DistributedDataParallel runs
    it); the run records minibatch, and ends on the simulator's vector to the bit with two
    workers (to rounding with three: gloo's order of the sum); measure mode finds zero
    gradient error at each round's writer row, as the simulator."""
    s = scenario(*TINY, f"run.updates={updates}", "run.blocks=2")
    real = run_real(s, workers, "allreduce", dtype="float64", timeout=120, measure_every=1)
    assert real.failure is None and len(real.trace) == updates
    assert real.scenario.run.protocol == "minibatch"
    simulated = simulate(real.scenario)
    if workers == 2:
        assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    else:
        np.testing.assert_allclose(real.trace["w_final"], simulated["w_final"], atol=1e-12)
    assert np.array_equal(real.trace["measured"], simulated["measured"])
    assert np.nanmax(real.trace["delta_norm"] / real.trace["g_norm"]) < 1e-12
    assert (real.trace["thread"][real.trace["measured"]] == 0).all()  # worker 0 writes


def test_allreduce_in_float32_with_a_schedule_records_what_it_subtracted():
    """float32 replicas: measure mode's rebuild subtracts the very float32 means the replicas
    did (no loss is reported where none happened); the schedule's factor is on the writer's
    row only, as the simulator records a round; the exact curve reaches every gradient."""
    s = scenario(*TINY, "run.updates=300", "run.lr_schedule=inv_sqrt")
    real = run_real(s, 2, "allreduce", dtype="float32", timeout=120, measure_every=1)
    assert real.failure is None and real.hardware_loss["rebuilt_vs_real_max"] == 0
    trace = real.trace
    assert (trace["lr_scale"][~trace["measured"]] == 1).all()
    assert (trace["lr_scale"][trace["measured"]] < 1).any()
    assert trace["curve_n"][-1] == 300 and trace["curve_t"][-1] == 150


@pytest.mark.parametrize("mode", ["staleness_lr", "dcasgd"])
def test_two_rule_workers_converge_as_the_simulation_does(mode):
    """Two lock-free workers applying an update rule (staleness-scaled or delay-compensated
    steps), 4,000 updates of the logistic problem: the final suboptimality within 2× of the
    simulation of the scenario the run recorded (the fidelity target's bound; the
    simulation's durations are the default ones, so staleness is not compared here:
    bench/fidelity.py compares it calibrated), and the rule's factors on lr below 1 on both
    sides where it scales the step."""
    s = scenario("problem.name=logistic", "problem.dim=50", "run.updates=4000",
                 f"run.protocol={mode}", "dcasgd.lam=0.5")
    real = run_real(s, 2, mode, dtype="float64")
    simulated = simulate(real.scenario, real.problem)
    f_star = real.problem.optimum()[1]
    gap, sim = (t["curve_loss"][-1] - f_star for t in (real.trace, simulated))
    assert real.failure is None and 0.5 < gap / sim < 2.0
    assert gap < 0.5 * (real.trace["curve_loss"][0] - f_star)
    if mode == "staleness_lr":
        assert (real.trace["lr_scale"] < 1).any() and (simulated["lr_scale"] < 1).any()
