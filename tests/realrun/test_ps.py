"""The parameter server on torch.distributed (gloo) over loopback: real processes, real
messages, 1–3 trainers on tiny problems."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from realrun.ps import free_port, run_ps, summary_extra
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.metrics import summarize
from simulator.replay import load_trace, replay
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes, or the CPUs probed: see conftest

TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=400", "run.lr=0.05")


def test_one_trainer_is_serial_sgd_to_the_bit():
    """One trainer, float64: the samples and arithmetic of the simulator's serial run."""
    s = scenario(*TINY)
    run = run_ps(s, 1, "float64", timeout=60)
    simulated = simulate(scenario(*TINY, "run.protocol=serial"))
    assert run.failure is None and len(run.trace) == 400
    assert np.array_equal(run.trace["sample"], simulated["sample"])
    assert np.array_equal(run.trace["w_final"], simulated["w_final"])
    assert run.trace["staleness"].max() == 0


def test_accumulated_pushes_count_gradients_as_the_simulator_does():
    """run.updates counts gradients on both paths: 100 gradients in pushes of 3 are 33
    applied pushes and one gradient the budget left unpushed (dropped), row for row the
    simulator's paramserver at one thread, w_final to the bit."""
    s = scenario(*TINY, "run.updates=100", "paramserver.accumulate=3")
    run = run_ps(s, 1, "float64", timeout=60)
    simulated = simulate(scenario(*TINY, "run.updates=100", "paramserver.accumulate=3",
                                  "run.protocol=paramserver", "run.threads=1"))
    assert run.failure is None and len(run.trace) == 100 and run.pushes == 34
    for column in ("sample", "step", "thread_seq", "staleness"):
        assert np.array_equal(run.trace[column], simulated[column]), column
    assert np.array_equal(run.trace["w_final"], simulated["w_final"])
    assert int((run.trace["step"] == 0).sum()) == 1 and run.trace["step"].max() == 33
    assert summary_extra(run)["real"]["pushes"] == 34


def test_two_trainers_converge_with_a_well_formed_measured_trace():
    s = scenario(*TINY, "run.updates=1000")
    run = run_ps(s, 2, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 1000
    assert sorted(trace["step"].tolist()) == list(range(1, 1001))
    assert np.all(np.diff(trace["write_end"]) >= 0)
    for a, b in (("read_start", "read_end"), ("read_end", "grad_end"),
                 ("grad_end", "write_end")):
        assert np.all(trace[a] <= trace[b])
    assert set(trace["thread"].tolist()) == {0, 1}
    summary = summarize(trace, run.problem, run.scenario)
    assert summary["exact_metrics"]["measured_updates"] == 1000
    # A push with staleness 0 was computed on the vector it was applied to: no error.
    fresh = (trace["staleness"] == 0) & trace["measured"]
    assert np.all(trace["delta_norm"][fresh] <= 1e-9 * trace["g_norm"][fresh] + 1e-15)
    f_star = run.problem.optimum()[1]
    assert trace["curve_loss"][-1] - f_star < 0.3 * (trace["curve_loss"][0] - f_star)


@pytest.mark.parametrize("lock_free", ["false", "true"])
def test_a_replayed_ps_trace_puts_every_event_at_its_recorded_time(lock_free):
    """Three trainers: replaying the real trace in the simulated paramserver gives back
    every write end, staleness and read-overwrite count row for row (a push's transfer is
    recorded in its write, where the simulated push pays its link); on a lock-free server
    too, whose pull waits for its trainer's pushes to be applied: its read starts then, so
    none starts before its previous write ended."""
    s = scenario(*TINY, "run.protocol=paramserver", "run.updates=600",
                 f"paramserver.lock_free={lock_free}", "run.write_mode=load_store")
    run = run_ps(s, 3, "float64", timeout=60)
    assert run.failure is None
    trace = run.trace
    for thread in range(3):
        rows = np.flatnonzero(trace["thread"] == thread)
        rows = rows[np.argsort(trace["thread_seq"][rows])]
        assert (trace["read_start"][rows][1:] >= trace["write_end"][rows][:-1]).all()
    _, _, again = replay(run.trace)
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (run.trace, again))
    for column in ("write_end", "grad_end", "staleness", "read_overwrites", "step"):
        assert np.array_equal(run.trace[column][a], again[column][b]), column


@pytest.mark.parametrize("options", [("paramserver.fraction=1",),
                                     ("paramserver.fraction=0.5",),
                                     ("paramserver.warm_start=20",),
                                     ("paramserver.warm_start=10", "paramserver.fraction=1")])
def test_a_replayed_ps_rounds_or_warm_start_trace_puts_every_event_at_its_recorded_time(
        options):
    """Rounds and warm starts in the simulator's form: a round member's push is applied with
    an empty write at the round's close (the closing push writes), a dropped one's write is
    empty at its arrival, and a pull the server held starts when it was released; so no
    trainer's read starts before its previous push was applied, and a replay gives back every
    time row for row. Except the last round's: the simulator ends a thread as its budget runs
    out, the real server when the trainer's done message arrives, and that can close the last
    round (fewer trainers left) a round trip later."""
    run = run_ps(scenario(*TINY, *options), 3, "float64", timeout=60)
    assert run.failure is None
    trace = run.trace
    for thread in range(3):
        rows = np.flatnonzero(trace["thread"] == thread)
        rows = rows[np.argsort(trace["thread_seq"][rows])]
        assert np.all(trace["read_start"][rows][1:] >= trace["write_end"][rows][:-1])
    _, _, again = replay(trace)
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (trace, again))
    last = trace["step"][a] == trace["step"].max()
    assert np.array_equal(trace["step"][a], again["step"][b]) and last.sum() <= 3
    for column in ("sample", "read_start", "read_end", "grad_end", "write_start", "write_end",
                   "staleness"):
        assert np.array_equal(trace[column][a][~last], again[column][b][~last]), column


def test_staleness_limit_drops_exactly_the_stale_pushes():
    s = scenario(*TINY, "run.updates=900", "paramserver.staleness_limit=1")
    run = run_ps(s, 3, timeout=60)
    trace = run.trace
    dropped = trace["step"] == 0
    assert run.failure is None and len(trace) == 900
    assert np.all(trace["staleness"][dropped] > 1)
    assert np.all(trace["staleness"][~dropped] <= 1)
    assert summarize(trace, run.problem, run.scenario)["discarded"] == int(dropped.sum())


@pytest.mark.parametrize("rule, schedule", [("staleness_lr", "constant"),
                                            ("dcasgd", "constant"),
                                            ("staleness_lr", "inverse"),
                                            ("dcasgd", "inv_sqrt")])
def test_the_server_applies_its_rule_with_each_push_s_exact_staleness(rule, schedule):
    """``paramserver.rule`` and ``run.lr_schedule``: one trainer (float64) is the simulator's
    paramserver to the bit (τ = 0 leaves every push as it is); with three, every push the
    server kept took the schedule's factor f at m = its version (the versions applied before
    it + 1) and 1/τ for its exact staleness τ (``staleness_lr``), both in ``lr_scale``,
    measure mode divides it out, and the final vector is an independent replay of the
    applied pushes in order: f·lr·∇f at the version each pulled, scaled by 1/τ or
    compensated at the rate f·lr towards the vector it was applied to from that version
    (``simulator.rules``)."""
    from simulator.rules import LR_FACTORS, dc_step, staleness_scale

    options = ("run.protocol=paramserver", f"paramserver.rule={rule}", "dcasgd.lam=0.5",
               f"run.lr_schedule={schedule}")
    s = scenario(*TINY, *options)
    one = run_ps(s, 1, "float64", timeout=60)
    simulated = simulate(one.scenario)
    assert np.array_equal(one.trace["w_final"], simulated["w_final"])
    assert np.array_equal(one.trace["lr_scale"], simulated["lr_scale"])
    run = run_ps(scenario(*TINY, "run.updates=1500", *options), 3, "float64", timeout=60,
                 measure=True)
    trace = run.trace
    assert run.failure is None and trace["measured"].any()
    assert (trace["staleness"] > 0).any()
    factor = LR_FACTORS.get(schedule, lambda m: 1.0)
    f = np.array([factor(int(m)) for m in trace["step"]])
    expected = f / np.maximum(1, trace["staleness"]) if rule == "staleness_lr" else f
    np.testing.assert_allclose(trace["lr_scale"], expected, rtol=1e-15)
    f_star = run.problem.optimum()[1]
    if schedule == "constant":
        assert trace["curve_loss"][-1] - f_star < (trace["curve_loss"][0] - f_star) / 4
    rows = np.flatnonzero(trace["step"] > 0)
    rows = rows[np.argsort(trace["step"][rows])]
    states, lr = [run.problem.initial()], run.scenario.run.lr
    for row in rows:
        read = states[int(trace["step"][row] - 1 - trace["staleness"][row])]  # its pull
        rate = lr * factor(int(trace["step"][row]))
        step = rate * run.problem.dense_grad(read.copy(), int(trace["sample"][row]))
        if rule == "staleness_lr":
            step = step * staleness_scale(int(trace["staleness"][row]))
        elif rule == "dcasgd":
            step = dc_step(step, rate, states[-1], read, 0.5)
        states.append(states[-1] - step)
    np.testing.assert_allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", [("paramserver.fraction=1",),
                                     ("paramserver.accumulate=2", "inject.drop=0.2"),
                                     ("paramserver.staleness_limit=1", "inject.delay=0",
                                      "inject.delay_dist=uniform", "inject.delay_max=3")])
def test_one_trainer_with_a_schedule_is_the_simulators_paramserver(options):
    """``run.lr_schedule`` on the server, float64, one trainer: with rounds (the factor on a
    round's mean), accumulated pushes with drops (a lost push takes no factor) and a
    staleness limit over delayed pulls (a discarded push takes none): the simulator's run to
    the bit, every row's factor included."""
    s = scenario(*TINY, "run.protocol=paramserver", "run.lr_schedule=inverse", *options)
    run = run_ps(s, 1, "float64", timeout=60)
    assert run.failure is None
    simulated = simulate(run.scenario)
    assert np.array_equal(run.trace["w_final"], simulated["w_final"])
    for name in ("lr_scale", "step", "sample", "dropped"):
        assert np.array_equal(run.trace[name], simulated[name]), name
    assert (run.trace["lr_scale"] < 1).any()


@pytest.mark.parametrize("delays", [("inject.delay=3",),
                                    ("inject.delay=1", "inject.delay_dist=uniform",
                                     "inject.delay_max=5", "paramserver.accumulate=2"),
                                    ("inject.delay=0", "inject.delay_dist=uniform",
                                     "inject.delay_max=4", "paramserver.staleness_limit=2"),
                                    ("inject.delay=2", "paramserver.rule=staleness_lr"),
                                    ("inject.delay=2", "paramserver.rule=dcasgd",
                                     "dcasgd.lam=0.5")])
def test_one_trainer_with_injected_delays_is_the_simulators_paramserver(delays):
    """float64, one trainer: each pull is answered with the vector τ versions back, τ drawn
    from the simulator's stream of its thread (clipped at the version), so the run is the
    simulator's paramserver to the bit: the final vector, every row's τ and staleness, the
    pushes a staleness limit drops (τ counted) and what a server rule makes of a push τ
    versions stale (1/τ; compensated from the delayed vector)."""
    s = scenario(*TINY, "run.protocol=paramserver", *delays)
    run = run_ps(s, 1, "float64", timeout=60)
    assert run.failure is None
    simulated = simulate(run.scenario)
    assert np.array_equal(run.trace["w_final"], simulated["w_final"])
    for name in ("delay", "staleness", "sample", "step", "lr_scale"):
        assert np.array_equal(run.trace[name], simulated[name]), name
    assert run.trace["delay"].max() > 0


@pytest.mark.parametrize("injected", [
    ("inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.2",
     "inject.write_bits=10"),
    ("problem.name=sparse_logistic", "inject.error=adversarial", "inject.error_bound=0.3",
     "inject.error_relative=true", "inject.drop=0.1", "inject.write_bits=8"),
    ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=3",
     "inject.error=noise", "inject.error_bound=0.2", "inject.error_relative=true",
     "inject.drop=0.3", "paramserver.staleness_limit=2"),
    ("inject.drop=0.3", "paramserver.accumulate=3"),
    ("inject.error=noise", "inject.error_bound=0.2", "inject.error_relative=true",
     "inject.drop=0.1", "paramserver.accumulate=3"),
    ("problem.name=sparse_logistic", "inject.error=adversarial", "inject.error_bound=0.3",
     "inject.drop=0.2", "paramserver.accumulate=2"),
    ("problem.name=sparse_logistic", "inject.error=noise", "inject.error_bound=0.3",
     "inject.write_bits=8", "inject.drop=0.1", "paramserver.accumulate=2")])
def test_one_trainer_with_injections_is_the_simulators_paramserver(injected):
    """float64, one trainer: the server draws each pull's delay and each gradient's error
    and drop from the simulator's stream of the trainer's thread, in the simulator's order,
    adds the error to the pushed gradient, counts a dropped push as a version that changes
    nothing and rounds what a push stored: the simulator's paramserver, the same drops,
    delays and staleness exactly, errors and the final vector to rounding (the server adds
    the error to lr·g / lr)."""
    s = scenario(*TINY, "run.protocol=paramserver", *injected)
    run = run_ps(s, 1, "float64", timeout=60, measure=True)
    assert run.failure is None
    simulated = simulate(run.scenario)
    for name in ("dropped", "delay", "staleness", "step", "sample"):
        assert np.array_equal(run.trace[name], simulated[name]), name
    np.testing.assert_allclose(run.trace["error_norm"], simulated["error_norm"], rtol=1e-9)
    np.testing.assert_allclose(run.trace["w_final"], simulated["w_final"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(run.trace["delta_norm"], simulated["delta_norm"], rtol=1e-6,
                               atol=1e-9)
    assert run.trace["dropped"].any()


def test_delayed_pulls_count_their_delay_in_the_limit_and_the_vector():
    """Three trainers, τ uniform in [0, 3], a staleness limit of 2: a push is kept when its
    staleness (versions applied since its pull, plus τ) is at most 2, and the final vector
    is an independent replay of the kept pushes in order, each lr·∇f at the version its
    staleness says it read (τ versions before its pull)."""
    s = scenario(*TINY, "run.updates=900", "run.protocol=paramserver",
                 "inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=3",
                 "paramserver.staleness_limit=2")
    run = run_ps(s, 3, "float64", timeout=60)
    trace = run.trace
    assert run.failure is None and trace["delay"].max() == 3
    kept = trace["step"] > 0
    assert (trace["staleness"][kept] <= 2).all() and (trace["staleness"][~kept] > 2).all()
    assert (~kept).any()
    rows = np.flatnonzero(kept)
    rows = rows[np.argsort(trace["step"][rows])]
    states, lr = [run.problem.initial()], run.scenario.run.lr
    for row in rows:
        read = states[int(trace["step"][row] - 1 - trace["staleness"][row])]
        states.append(states[-1] - lr * run.problem.dense_grad(read.copy(),
                                                                int(trace["sample"][row])))
    np.testing.assert_allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)


def test_the_servers_rule_is_the_simulators_arithmetic():
    """``_rule`` on a push that waited two versions: the step the simulator's rules give
    (``simulator.rules``), with the vector the server sent that trainer at its pull."""
    from realrun.ps import _Push, _rule, _Server

    rng = np.random.default_rng(0)
    w_read, w_now, step = rng.standard_normal((3, 6))
    for rule, expected in (("staleness_lr", step / 2),
                           ("dcasgd", step + 0.05 * 0.5 * (step / 0.05) ** 2
                            * (w_now - w_read))):
        s = scenario(*TINY, "run.protocol=paramserver", f"paramserver.rule={rule}",
                     "dcasgd.lam=0.5")
        state = _Server(None, s, 1, np.dtype("float64"), w_now.copy(), None, None,
                        version=7, sent={1: w_read.copy()})
        push = _Push(0, 0, [0], 0, 0, 0, [0], 5, step.copy())
        _rule(state, push)
        np.testing.assert_allclose(push.step, expected, rtol=1e-12)
        assert push.scale == (0.5 if rule == "staleness_lr" else 1.0)
        if rule == "staleness_lr":  # an injected delay of its pull counts: τ = 2 + 1
            push = _Push(0, 0, [0], 0, 0, 0, [0], 5, step.copy(), delay=1)
            _rule(state, push)
            np.testing.assert_allclose(push.step, step / 3, rtol=1e-12)


def test_backup_worker_rounds_apply_pushes_computed_on_one_vector():
    """fraction = 1: every round waits for both trainers and applies their mean; nothing is
    stale. fraction = 0.5: the first push ends each round, later ones for it are dropped."""
    full = run_ps(scenario(*TINY, "paramserver.fraction=1"), 2, "float64", timeout=60)
    trace = full.trace
    applied = trace["step"] > 0
    assert full.failure is None and np.all(trace["staleness"][applied] == 0)
    counts = np.bincount(trace["step"][applied])[1:]
    assert counts.max() == 2 and (counts == 2).sum() >= len(counts) - 1
    half = run_ps(scenario(*TINY, "paramserver.fraction=0.5"), 2, "float64", timeout=60)
    trace = half.trace
    applied = trace["step"] > 0
    assert half.failure is None and len(trace) == 400 and 0 < (~applied).sum() < 400
    assert np.bincount(trace["step"][applied])[1:].max() == 1
    assert np.all(trace["staleness"][applied] == 0) and np.all(trace["staleness"][~applied] >= 1)


def test_a_dead_trainer_does_not_hang_the_server():
    """Kill a trainer: the server's receive times out, it says which trainer is missing and
    keeps the pushes it applied."""
    s = scenario(*TINY, "run.updates=200000")
    pids, pushes = [], []

    def kill_one_after_50_pushes(n):
        pushes.append(n)
        if len(pushes) == 50:
            os.kill(pids[0], signal.SIGKILL)

    run = run_ps(s, 2, timeout=30, on_start=pids.extend, progress=kill_one_after_50_pushes)
    assert run.failure == {"worker": 0, "reason": "trainer 1 died (exit code -9)"}
    assert 50 <= len(run.trace) < 200000


def test_a_hung_trainer_stops_the_server_after_the_receive_timeout():
    """A stopped trainer is alive but silent: the receive times out and says so."""
    s = scenario(*TINY, "run.updates=200000")
    pids, pushes = [], []

    def stop_one_after_50_pushes(n):
        pushes.append(n)
        if len(pushes) == 50:
            os.kill(pids[0], signal.SIGSTOP)

    try:
        run = run_ps(s, 2, timeout=2, on_start=pids.extend, progress=stop_one_after_50_pushes)
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    # Stopped between exchanges (the server's receive from any trainer times out), or half
    # way through one of its own (the server names it): either way by the run's 2 s timeout,
    # which the reason names (not the group's 60 s).
    assert run.failure is not None and 50 <= len(run.trace) < 200000
    reason = run.failure["reason"]
    assert (reason.startswith("no message for 2 s; trainers [1") and run.failure["worker"]
            is None) or (re.match(r"trainer 1 (took no parameters|sent no step after its "
                                  r"push|sent nothing) for 2 s", reason)
                         and run.failure["worker"] == 0), reason
    assert 50 <= len(run.trace) < 200000


def _node(rank, world, port, out, extra=(), command=("-m", "realrun.ps", "--out")):
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *command, str(out),
                             "--timeout", "5", "--set", "problem.dim=20", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_torchrun_nodes_write_the_run_directory(tmp_path):
    """The several-machine path on one: torchrun starts a server and two trainers."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "ps"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "3", "-m",
                           "realrun.ps", "--out", str(out), "--set", "problem.dim=20",
                           "--set", "run.updates=300"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 300 and summary["real"]["backend"] == "ps"
    assert summary["threads"] == 2


def test_a_dead_server_makes_trainers_exit(tmp_path):
    port = free_port()
    world = 3
    nodes = [_node(rank, world, port, tmp_path / "ps", ["--set", "run.updates=10000000"])
             for rank in range(world)]
    # Every rank has joined once the server says it serves; let them train a moment.
    assert nodes[0].stdout.readline().startswith("realrun.ps: serving 2 trainers")
    time.sleep(1)
    nodes[0].kill()
    for node in nodes[1:]:
        _, err = node.communicate(timeout=30)
        assert node.returncode == 1
        assert "the server is gone" in err.strip().splitlines()[-1]


def test_cli_real_ps_and_bad_backend(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["real", "--backend", "ps", "--workers", "2", "--out", str(out), "--quiet",
                 "--set", "run.updates=300"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["protocol"] == "paramserver" and summary["updates"] == 300
    capsys.readouterr()
    assert main(["real", "--backend", "mpi", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend = 'mpi'" in err[0]
    assert main(["real", "--backend", "ps", "--pin", "--out", str(tmp_path / "y"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pin = 'on'" in err[0] and not (tmp_path / "y").exists()


def test_cli_timeout_stops_a_ps_run_and_keeps_its_part(tmp_path, capsys):
    """`real --backend ps --timeout 1` stops serving after about a second, keeps the partial
    trace and exits 1, as the shared-memory backend does (it set how long the server waits
    for a silent trainer, and a long run went on to the end)."""
    out = tmp_path / "run"
    started = time.monotonic()
    assert main(["real", "--backend", "ps", "--timeout", "1", "--out", str(out), "--quiet",
                 "--set", "problem.dim=20", "--set", "run.updates=2000000"]) == 1
    assert time.monotonic() - started < 60
    assert "timeout after 1 s" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["updates"] < 2_000_000


def test_a_trainer_silent_while_others_are_served_is_named():
    """The silence rule on its own: finished trainers and those waiting for their round's
    answer do not count; a trainer quiet for the timeout does."""
    from types import SimpleNamespace

    from realrun.ps import _silent

    state = SimpleNamespace(done={3}, waiting=[(2, 0)], resume={})
    heard = {1: 0, 2: 0, 3: 0}
    assert _silent(state, heard, 4_900_000_000, 5.0) is None
    assert _silent(state, heard, 5_100_000_000, 5.0) == {
        "worker": 0, "reason": "trainer 1 sent nothing for 5 s while the others were served"}
    heard[1] = 5_000_000_000
    assert _silent(state, heard, 5_100_000_000, 5.0) is None
    # A trainer told to pull again after an injected pause is silent until its end.
    heard[1], state.resume[1] = 0, 2_000_000_000
    assert _silent(state, heard, 6_900_000_000, 5.0) is None
    assert _silent(state, heard, 7_100_000_000, 5.0) is not None


def test_warm_start_lets_trainer_0_alone_make_the_first_pushes():
    """paramserver.warm_start W: the first W applied pushes are trainer 0's, computed on the
    vector each previous one left (staleness 0); then every trainer works."""
    run = run_ps(scenario(*TINY, "run.updates=300", "paramserver.warm_start=40"), 3,
                 "float64", timeout=60)
    trace = run.trace
    assert run.failure is None and len(trace) == 300
    first = trace["step"] <= 40
    assert np.all(trace["thread"][first] == 0) and int(first.sum()) == 40
    assert np.all(trace["staleness"][first] == 0)
    assert set(trace["thread"].tolist()) == {0, 1, 2}
    assert run.scenario.paramserver.warm_start == 40


def test_warm_start_with_rounds_closes_a_round_per_push_of_trainer_0():
    """With rounds, the warm start's pushes (trainer 0 is the one that may arrive) close a
    round each on both paths; then rounds of all the trainers (fraction 1)."""
    overrides = (*TINY, "run.updates=120", "paramserver.warm_start=10",
                 "paramserver.fraction=1")
    run = run_ps(scenario(*overrides), 3, "float64", timeout=60)
    simulated = simulate(scenario(*overrides, "run.protocol=paramserver", "run.threads=3"))
    for trace in (run.trace, simulated):
        sizes = np.bincount(trace["step"][trace["step"] > 0])[1:]
        assert sizes[:10].tolist() == [1] * 10 and np.all(sizes[10:-1] == 3), sizes
        assert np.all(trace["thread"][(trace["step"] > 0) & (trace["step"] <= 10)] == 0)
    assert run.failure is None and len(run.trace) == len(simulated) == 120


_SLOW_TRAINER = """
import sys, time
import realrun.ps as ps
train = ps.train

def slow_train(problem, *args, **kwargs):
    grad = problem.dense_grad

    def slow_grad(w, sample):
        time.sleep(0.1)
        return grad(w, sample)

    problem.dense_grad = slow_grad
    return train(problem, *args, **kwargs)

ps.train = slow_train
sys.exit(ps._node_main(sys.argv[1:]))
"""


def test_rebalance_retires_a_slow_trainer(tmp_path):
    """Trainer 0 (a node whose gradients take 100 ms longer) is slower than r times the median
    once every trainer made rebalance_after gradients: the server retires it (its next pull
    gets no gradients, it exits), the others make the rest of the budget, and the trace and
    summary name it as the simulator's report does."""
    port, world, out = free_port(), 4, tmp_path / "ps"
    # The budget outlasts the slow trainer's first rebalance_after gradients by far (the
    # rule needs every working trainer to have made them; fast trainers that finished
    # the budget first would leave it alone).
    extra = ["--set", "run.updates=2000", "--set", "paramserver.rebalance=3",
             "--set", "paramserver.rebalance_after=3"]
    nodes = [_node(rank, world, port, out, extra) for rank in (0, 2, 3)]
    slow = _node(1, world, port, out, extra, ["-c", _SLOW_TRAINER, "--out"])
    for node in [*nodes, slow]:
        _, err = node.communicate(timeout=120)
        assert node.returncode == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["retired_threads"] == [0] and summary["updates"] == 2000
    trace = load_trace(out)
    assert trace["extra_retired_threads"].tolist() == [0]
    counts = np.bincount(trace["thread"], minlength=3)
    assert counts[0] < 0.1 * min(counts[1], counts[2])


def test_cli_ps_summary_says_backend_and_mode(tmp_path, capsys):
    """summary.json's real block names the backend and mode, the header prints them, and
    the resolved metrics say what was measured."""
    out = tmp_path / "run"
    assert main(["real", "--backend", "ps", "--workers", "2", "--out", str(out), "--measure",
                 "--set", "run.updates=200", "--set", "paramserver.accumulate=2",
                 "--set", "metrics.every=4"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("ps paramserver k=2 T=200 ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["backend"] == "ps" and summary["real"]["mode"] == "paramserver"
    assert summary["updates"] == 200 and summary["real"]["pushes"] == 100
    assert summary["real"]["paramserver"]["accumulate"] == 2
    # --measure measured every metrics.every-th of the 100 completions, and says so.
    assert summary["exact_metrics"] == {"enabled": True, "every": 4, "measured_updates": 25}


def test_a_dead_trainer_stops_at_its_death_and_the_run_goes_on():
    """``[[inject.deaths]]`` on the server's clock (from the first pull): trainer 1's pulls
    after 40 ms are answered with no gradients; the run is no failure, trainer 0 makes the
    rest of the budget, and the trace names thread 1 dead, as the simulator records it."""
    s = scenario("problem.dim=100", "run.updates=4000", "run.protocol=paramserver",
                 "inject.deaths=[{thread=1, at=40000000}]")
    run = run_ps(s, 2, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 4000
    trace = run.trace
    assert trace["extra_dead_threads"].tolist() == [1]
    mine = trace["thread"] == 1
    assert 0 < mine.sum() < 4000
    assert trace["read_start"][mine].max() < 40_000_000  # no pull of it answered after
    assert trace["read_start"][~mine].max() > 40_000_000  # the run went on without it


def test_a_paused_trainer_pulls_after_its_window_and_a_straggler_is_slower():
    """``[[inject.pauses]]``: trainer 0's pulls that arrive in its window (30-70 ms on the
    server's clock) are answered with the time left, and it pulls again after it, while
    trainer 1 goes on; ``[[inject.stragglers]]``: trainer 1's gradients take about 3 times
    trainer 0's."""
    s = scenario("problem.dim=100", "run.updates=4000", "run.protocol=paramserver",
                 "inject.pauses=[{thread=0, start=30000000, end=70000000}]",
                 "inject.stragglers=[{thread=1, factor=3.0}]")
    run = run_ps(s, 2, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 4000
    trace = run.trace
    assert trace["extra_dead_threads"].tolist() == []
    mine = trace["thread"] == 0
    began = trace["read_start"][mine]
    assert not np.any((began >= 30_000_000) & (began < 70_000_000))
    assert began.min() < 30_000_000 and began.max() >= 70_000_000
    others = trace["read_start"][~mine]
    assert np.any((others >= 30_000_000) & (others < 70_000_000))
    grad = trace["grad_ns"]
    ratio = np.median(grad[~mine]) / np.median(grad[mine])
    assert 2.0 < ratio < 4.5, ratio


def test_one_paused_straggling_trainer_is_still_serial_sgd_and_a_long_pause_is_refused():
    """A pause and a straggler change when a trainer works, never what it computes: one
    float64 trainer is the simulator's run to the bit. A pause as long as the receive
    timeout would read as a hung trainer: refused before anything starts."""
    s = scenario(*TINY, "run.protocol=paramserver",
                 "inject.pauses=[{thread=0, start=0, end=5000000}]",
                 "inject.stragglers=[{thread=0, factor=2.0}]")
    run = run_ps(s, 1, "float64", timeout=60)
    assert run.failure is None
    assert run.trace["read_start"].min() >= 5_000_000
    simulated = simulate(run.scenario)
    assert np.array_equal(run.trace["w_final"], simulated["w_final"])
    assert np.array_equal(run.trace["sample"], simulated["sample"])
    with pytest.raises(ScenarioError, match=r"^inject\.pauses\.0\.end = 3000000000: a pause "
                       r"of 3 s reads as a hung trainer to a server whose receive timeout is "
                       r"2 s$"):
        run_ps(scenario(*TINY, "inject.pauses=[{thread=0, start=0, end=3000000000}]"), 1,
               timeout=2)


def test_one_trainer_on_a_lock_free_server_is_the_simulators():
    """``paramserver.lock_free``: with one trainer its update thread applies each push
    alone, so a float64 run is the simulator's lock-free server (and serial SGD) to the
    bit, with a staleness limit over delays and the server's rule too."""
    for options in ((), ("inject.delay=2", "paramserver.staleness_limit=1",
                         "paramserver.rule=staleness_lr")):
        s = scenario(*TINY, "run.protocol=paramserver", "paramserver.lock_free=true",
                     *options)
        run = run_ps(s, 1, "float64", timeout=60)
        assert run.failure is None and run.hardware_loss is None
        simulated = simulate(run.scenario)
        assert np.array_equal(run.trace["w_final"], simulated["w_final"])
        for name in ("sample", "step", "staleness", "delay", "lr_scale"):
            assert np.array_equal(run.trace[name], simulated[name]), name


def test_a_lock_free_server_applies_pushes_from_update_threads(tmp_path, capsys):
    """Three trainers, update threads without a lock, measure mode: the view is every push
    applied in completion order and the summary says what the real vector lacks against
    it. On 20 parameters numpy holds the interpreter's lock through each subtraction, so
    the update threads never run at once and nothing is lost but the rounding of two
    pushes applied in one order and counted in the other."""
    s = scenario(*TINY, "run.updates=900", "run.protocol=paramserver",
                 "paramserver.lock_free=true")
    run = run_ps(s, 3, "float64", timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 900
    trace = run.trace
    assert trace["measured"].any() and (trace["staleness"] > 0).any()
    assert sorted(trace["step"][trace["step"] > 0]) == list(range(1, 901))
    loss = run.hardware_loss
    assert loss["view"] == "lossless rebuild" and loss["relative_to_distance_moved"] < 1e-12
    f_star = run.problem.optimum()[1]
    assert trace["curve_loss"][-1] - f_star < (trace["curve_loss"][0] - f_star) / 4
    out = tmp_path / "ps"
    assert main(["real", "--backend", "ps", "--workers", "2", "--measure", "--out", str(out),
                 *[a for o in (*TINY, "paramserver.lock_free=true") for a in ("--set", o)]]
                ) == 0
    assert "hardware lost: |rebuilt w_T − real w_T|" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["hardware_loss"]["view"] == "lossless rebuild"


def _slow_subtract(w, step):
    """A lock-free update that takes its time between its load and its store (the
    interpreter's lock released meanwhile): overlapping pushes lose updates."""
    loaded = w.copy()
    time.sleep(0.0003)
    w[:] = loaded - step


def test_a_slow_lock_free_update_loses_pushes_but_never_its_trainers_own(monkeypatch):
    """With the server's in-place update made slow (load, sleep, store), three trainers'
    pushes overlap on the server and lose updates: the real vector lacks part of what the
    rebuild applied (``hardware_loss``), which a locked server could not do. A trainer's
    pull still waits for its own pushes: one trainer is the simulator's run to the bit."""
    from realrun import ps

    monkeypatch.setattr(ps, "_subtract", _slow_subtract)
    s = scenario(*TINY, "run.updates=300", "run.protocol=paramserver",
                 "paramserver.lock_free=true")
    one = run_ps(s, 1, "float64", timeout=60)
    assert one.failure is None
    assert np.array_equal(one.trace["w_final"], simulate(one.scenario)["w_final"])
    assert one.trace["staleness"].max() == 0
    run = run_ps(s, 3, "float64", timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 300
    assert run.hardware_loss["relative_to_distance_moved"] > 1e-6


def test_a_failed_lock_free_update_stops_the_run(monkeypatch):
    """An update thread that fails stops the run with its error named, not a run whose
    later pushes silently went unapplied."""
    from realrun import ps

    calls = []

    def failing(w, step):
        calls.append(1)
        if len(calls) == 20:
            raise FloatingPointError("injected")
        np.subtract(w, step, out=w)

    monkeypatch.setattr(ps, "_subtract", failing)
    run = run_ps(scenario(*TINY, "run.protocol=paramserver", "paramserver.lock_free=true"), 2,
                 "float64", timeout=30)
    assert run.failure is not None
    assert "server update thread: FloatingPointError: injected" in run.failure["reason"]
