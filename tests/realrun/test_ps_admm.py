"""Asynchronous consensus ADMM on the parameter server (``--backend ps`` with
``run.protocol = "admm"``): the server holds z, each trainer its x_i and u_i; the push is
``simulator.rules.admm_push`` and the residuals after each push
``simulator.rules.admm_residuals``, as in the simulator's ``admm``."""

import json

import numpy as np
import pytest

from realrun import support
from realrun.ps import run_ps
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from tests.conftest import scenario

TINY = ("problem.dim=30", "problem.n_samples=200", "run.protocol=admm")


@pytest.mark.alone  # real processes: see conftest
@pytest.mark.parametrize("options", [
    (),
    ("run.lr_schedule=inv_sqrt", "admm.local_steps=3", "admm.rho=0.5"),
    ("inject.delay=1", "inject.delay_dist=uniform", "inject.delay_max=4",
     "inject.stragglers=[{thread=0, factor=2.0}]"),
    ("problem.name=sparse_logistic", "inject.drop=0.2", "inject.write_bits=10")])
def test_one_trainer_is_the_simulators_admm_to_the_bit(options):
    """float64, one trainer: the simulator's admm at one thread to the bit: the same first
    local samples, the same final z, the same primal and dual residual after every push (the
    server takes Δz = z_t − z_{t−1} of its own vector, as the simulator), the schedule's
    factors, delays, staleness and drops; one row per push, the loss curve's gradient count
    in pushes; no row measured. With a schedule the push is scaled (``lr_scale``); a
    delayed pull gets z τ pushes back; a dropped push is a completion that changes nothing;
    ``write_bits`` rounds every value of z (a push is dense, on a sparse problem too); a
    straggler changes when a trainer works, not what it computes."""
    s = scenario(*TINY, "run.updates=150", *options)
    run = run_ps(s, 1, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 150 and run.pushes == 150
    assert run.scenario.run.protocol == "admm" and run.scenario.run.split == "shared"
    simulated = simulate(run.scenario)
    for name in ("sample", "w_final", "extra_primal_residual", "extra_dual_residual",
                 "lr_scale", "delay", "staleness", "dropped", "step", "curve_t", "curve_n",
                 "curve_loss"):
        assert np.array_equal(run.trace[name], simulated[name]), name
    assert not run.trace["measured"].any()
    assert (run.trace["delay"].max() > 0) == ("inject.delay=1" in options)
    assert run.trace["dropped"].any() == ("inject.drop=0.2" in options)


@pytest.mark.alone
def test_two_trainers_converge_as_the_simulation_does():
    """Two trainers, 3,000 pushes on the dense logistic problem, against the simulation of
    the recorded scenario (``split = shared``: the server hands each push to whichever
    trainer pulls, as the simulator's shared budget): the final suboptimality far below the
    start and within 2× of the simulator's; the median residuals of the last 500 pushes
    within 0.6–1.5× (the tolerance of the CPU workers' test, tests/realrun/test_admm.py: a
    trainer descheduled for a time slice lets the other push alone and its copy drift from
    z). On the quiet 2-core machine: suboptimality 1.00–1.06×, dual 1.01–1.03×, primal
    0.89–0.91× (the server serializes the pushes, so each is half as stale as the
    simulator's, and its primal residual takes another trainer's x_j from its last push,
    where the simulator's thread sets x_j when its solve ends); the trainers share the
    pushes about evenly."""
    s = scenario("problem.name=logistic", "run.protocol=admm", "run.updates=3000")
    run = run_ps(s, 2, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 3000
    simulated = simulate(run.scenario, problem=run.problem)
    f_star = run.problem.full_loss(run.problem.optimum()[0])
    start = run.trace["curve_loss"][0] - f_star
    gaps = [t["curve_loss"][-1] - f_star for t in (run.trace, simulated)]
    assert gaps[0] < start / 4
    assert 0.5 < gaps[0] / gaps[1] < 2.0, gaps
    for name in ("extra_primal_residual", "extra_dual_residual"):
        assert run.trace[name].shape == (3000,) and np.isfinite(run.trace[name]).all()
        ratio = np.median(run.trace[name][-500:]) / np.median(simulated[name][-500:])
        assert 0.6 < ratio < 1.5, (name, ratio)
    assert np.bincount(run.trace["thread"], minlength=2).min() > 300


REFUSED = [
    ("inject.error=noise", "inject.error = 'noise'"),
    ("paramserver.accumulate=2", "paramserver.accumulate = 2"),
    ("paramserver.staleness_limit=3", "paramserver.staleness_limit = 3"),
    ("paramserver.warm_start=5", "paramserver.warm_start = 5"),
    ("paramserver.fraction=1", "paramserver.fraction = 1.0"),
    ("paramserver.rebalance=2", "paramserver.rebalance = 2.0"),
    ("paramserver.rebalance_after=5", "paramserver.rebalance_after = 5"),
    ("paramserver.rule=staleness_lr", "paramserver.rule = 'staleness_lr'"),
    ("paramserver.lock_free=true", "paramserver.lock_free = True"),
    ("paramserver.servers=1", "paramserver.servers = 1"),
    ("run.blocks=2", "run.blocks = 2"),
    ("run.split=even", "run.split = 'even'"),
]


@pytest.mark.parametrize(("override", "named"), REFUSED)
def test_what_the_servers_admm_does_not_run_is_refused(override, named):
    """Before anything starts (no trainer spawned): one ScenarioError naming the field, its
    value and the backend; every ``[paramserver]`` option (the simulator's admm has none)
    and injected errors (none reach the simulator's local solves)."""
    with pytest.raises(ScenarioError) as refused:
        run_ps(scenario(*TINY, "run.updates=40", override), 2, "float64")
    assert str(refused.value).startswith(f"{named}: "), str(refused.value)
    assert str(refused.value).endswith("refused by the ps backend")


def test_the_servers_admm_accepts_what_it_runs():
    """Delays, drops, rounded stores and stalls under admm; errors' inert parameters."""
    support.refuse_unsupported(scenario(
        *TINY, "inject.delay=2", "inject.drop=0.1", "inject.write_bits=8",
        "inject.error_bound=0.5", "inject.pauses=[{thread=0, start=1, end=9}]",
        "inject.deaths=[{thread=1, at=5}]", "inject.stragglers=[{thread=1, factor=2.0}]",
        "admm.rho=0.5", "admm.local_steps=3"), "ps", "admm")
    recorded = support.recorded(scenario(*TINY), "admm", 3, False, None, "ps")
    assert (recorded.run.protocol, recorded.run.threads, recorded.run.split) == (
        "admm", 3, "shared")
    assert recorded.hardware.sweeping_reads is None  # a pull is a consistent copy


def test_the_command_line_refuses_a_server_option_under_admm(tmp_path, capsys):
    """Exit 2, one line naming the field, the value and the backend, nothing written."""
    out = tmp_path / "run"
    assert main(["real", "--backend", "ps", "--out", str(out), "--quiet",
                 *[a for o in TINY for a in ("--set", o)],
                 "--set", "paramserver.staleness_limit=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "paramserver.staleness_limit = 2" in err[0], err
    assert "refused by the ps backend" in err[0] and not out.exists()


@pytest.mark.alone
def test_the_command_line_runs_admm_on_the_server(tmp_path, capsys):
    """``asyngrad real --backend ps --set run.protocol=admm``: the run directory's
    scenario.toml says admm, the summary names the mode and its [admm] options, the trace
    holds a residual per push, and --measure measures no row (a push is no SGD step)."""
    out = tmp_path / "run"
    sets = [a for o in (*TINY, "run.updates=200", "admm.local_steps=4")
            for a in ("--set", o)]
    assert main(["real", "--backend", "ps", "--workers", "2", "--measure", "--out", str(out),
                 *sets]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("ps admm k=2 T=200 ")
    resolved = load_scenario(out / "scenario.toml")
    assert resolved.run.protocol == "admm" and resolved.run.threads == 2
    assert resolved.admm.local_steps == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["mode"] == "admm" and summary["real"]["pushes"] == 200
    assert summary["real"]["admm"] == {"rho": 1.0, "local_steps": 4}
    assert summary["updates"] == 200 and summary["exact_metrics"]["measured_updates"] == 0
    with np.load(out / "trace.npz", allow_pickle=False) as trace:
        primal, dual = trace["extra_primal_residual"], trace["extra_dual_residual"]
    assert primal.shape == dual.shape == (200,)
    assert np.isfinite(primal).all() and (dual > 0).any()
