"""Injected faults in the parameter server's backup-worker rounds (``paramserver.fraction``
> 0): delays, errors, drops, rounded stores, pauses and deaths, as the simulator's rounds."""

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.engine import simulate
from simulator.replay import replay
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=400", "run.lr=0.05",
        "run.protocol=paramserver")
SLOW = ("problem.dim=20", "problem.n_samples=200", "run.updates=200000", "run.lr=0.01",
        "run.protocol=paramserver")


@pytest.mark.parametrize("injected", [
    ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=3"),
    ("inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.2", "inject.write_bits=10"),
    ("problem.name=sparse_logistic", "inject.error=adversarial", "inject.error_bound=0.3",
     "inject.error_relative=true", "inject.drop=0.1", "inject.write_bits=8",
     "run.lr_schedule=inverse")])
def test_one_trainer_in_rounds_is_the_simulators_paramserver(injected):
    """float64, one trainer, every push a round of its own: the pull τ rounds back, each
    gradient's error (dense, as the simulator's round members compute them), a round whose
    writer's draw drops it lost, every value of a round's store rounded: the simulator's
    paramserver with rounds, the same rows exactly, errors and the vector to rounding."""
    s = scenario(*TINY, "paramserver.fraction=1", *injected)
    run = run_ps(s, 1, "float64", timeout=60, measure=True)
    assert run.failure is None
    simulated = simulate(run.scenario)
    for name in ("dropped", "delay", "staleness", "step", "sample", "lr_scale"):
        assert np.array_equal(run.trace[name], simulated[name]), name
    np.testing.assert_allclose(run.trace["error_norm"], simulated["error_norm"], rtol=1e-9)
    np.testing.assert_allclose(run.trace["w_final"], simulated["w_final"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(run.trace["delta_norm"], simulated["delta_norm"], rtol=1e-6,
                               atol=1e-9)


@pytest.mark.parametrize("fraction", ["1", "0.5"])
def test_a_replayed_trace_with_injected_rounds_puts_every_event_at_its_recorded_time(
        fraction):
    """Three trainers, delays, errors, drops and rounded stores in rounds: replaying the
    real trace in the simulated paramserver gives back every round, τ, drop and time row
    for row (but the last round's, which a trainer's done message can close a round trip
    later, as without injections), so the server draws each trainer's injections from its
    thread's stream in the simulator's order."""
    run = run_ps(scenario(*TINY, f"paramserver.fraction={fraction}", "inject.delay=0",
                          "inject.delay_dist=uniform", "inject.delay_max=2",
                          "inject.error=noise", "inject.error_bound=0.2", "inject.drop=0.2",
                          "inject.write_bits=12"), 3, "float64", timeout=60)
    assert run.failure is None
    trace = run.trace
    assert trace["delay"].max() == 2 and trace["dropped"].any()
    _, _, again = replay(trace)
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (trace, again))
    last = trace["step"][a] == trace["step"].max()
    assert np.array_equal(trace["step"][a], again["step"][b]) and last.sum() <= 3
    for column in ("sample", "delay", "dropped", "read_start", "grad_end", "write_end",
                   "staleness"):
        assert np.array_equal(trace[column][a][~last], again[column][b][~last]), column
    np.testing.assert_allclose(trace["error_norm"][a], again["error_norm"][b], rtol=1e-9)


@pytest.mark.parametrize("fraction", ["1", "0.5"])
def test_a_round_is_lost_where_its_writers_draw_drops_it(fraction):
    """Three trainers, drops and delays in rounds: the final vector is an independent replay
    of the trace's rounds in order: each applies the mean of its members' lr·∇f at the
    vector τ rounds before it, unless the draw of its writer (the last to arrive: the
    latest gradient end) dropped it; a member's own drop changes nothing (both happen)."""
    run = run_ps(scenario(*TINY, "run.updates=600", f"paramserver.fraction={fraction}",
                          "inject.drop=0.3", "inject.delay=0", "inject.delay_dist=uniform",
                          "inject.delay_max=2"), 3, "float64", timeout=60)
    trace, problem, lr = run.trace, run.problem, run.scenario.run.lr
    assert run.failure is None
    states, lost, spared = [problem.initial()], 0, 0
    for step in range(1, int(trace["step"].max()) + 1):
        rows = np.flatnonzero(trace["step"] == step)
        writer = rows[np.argmax(trace["grad_end"][rows])]
        mean = np.mean([lr * problem.dense_grad(
            states[step - 1 - int(trace["delay"][r])].copy(), int(trace["sample"][r]))
            for r in rows], axis=0)
        dropped = bool(trace["dropped"][writer])
        lost += dropped
        spared += not dropped and bool(trace["dropped"][rows].any())
        states.append(states[-1] if dropped else states[-1] - mean)
    assert lost > 0 and (fraction == "0.5" or spared > 0)
    np.testing.assert_allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)


def test_a_round_waiting_for_a_dead_trainer_ends_the_run_as_simulated():
    """fraction = 1, trainer 1 dies 30 ms into a run it would need far longer for: every
    round needs it, so the others wait for it for good and the run ends early, as the
    simulator's does (nothing can happen any more): every recorded round has all three
    members, none of the pushes left waiting is a row, trainer 1 read nothing after its
    death (its push in flight then lands), and trainer 2, with a death of its own long
    after, is dead too, as the simulator kills its waiting thread then."""
    deaths = "inject.deaths=[{thread=1, at=30000000}, {thread=2, at=900000000000}]"
    run = run_ps(scenario(*SLOW, "paramserver.fraction=1", deaths), 3, "float64",
                 timeout=60)
    simulated = simulate(scenario(*SLOW, "paramserver.fraction=1", "run.threads=3", deaths))
    assert run.failure is None and 0 < len(run.trace) < 200000
    for trace in (run.trace, simulated):
        assert trace["extra_dead_threads"].tolist() == [1, 2]
        assert (trace["step"] > 0).all()
        assert set(np.bincount(trace["step"])[1:].tolist()) == {3}
    assert run.trace["read_start"][run.trace["thread"] == 1].max() < 30_000_000


def test_backup_workers_go_on_without_a_dead_trainer():
    """fraction = 0.5 of three trainers (rounds of 2): trainer 1 dies 30 ms in, and the
    other two close every later round and spend the budget, as simulated (a dead thread is
    still counted live: the quota stays 2). Trainer 1 reads nothing after its death."""
    s = scenario(*TINY, "run.updates=3000", "paramserver.fraction=0.5",
                 "inject.deaths=[{thread=1, at=30000000}]")
    run = run_ps(s, 3, "float64", timeout=60)
    trace = run.trace
    assert run.failure is None and trace["extra_dead_threads"].tolist() == [1]
    # (the last gradient granted can be a round's only push: it waits for good, as the
    # simulator's would, and is in no row)
    assert len(trace) in (2999, 3000) and trace["curve_n"][-1] == len(trace)
    applied = trace["step"][trace["step"] > 0]
    assert set(np.bincount(applied)[1:].tolist()) == {2}
    assert trace["read_start"][trace["thread"] == 1].max() < 30_000_000
    assert (trace["read_start"][trace["thread"] != 1] > 30_000_000).sum() > 100


@pytest.mark.parametrize("fraction, rounds_in_window", [("1", 1), ("0.5", None)])
def test_a_paused_trainer_holds_the_rounds_that_need_it(fraction, rounds_in_window):
    """Trainer 0 paused 100-300 ms: it starts no read in the window; with fraction = 1 every
    round waits for it, so at most the round its push in flight closes ends in the window
    (the real window taken 10 ms narrower each side: the trace's clock starts at the first
    pull); with fraction = 0.5 the other two close rounds without it all along (more than
    10 in 180 ms: a loaded 2-core machine closed 2-3 rounds per 5 ms)."""
    s = scenario(*SLOW, "run.updates=6000", f"paramserver.fraction={fraction}",
                 "inject.pauses=[{thread=0, start=100000000, end=300000000}]")
    run = run_ps(s, 3, "float64", timeout=60)
    trace = run.trace
    assert run.failure is None and len(trace) == 6000
    assert trace["write_end"].max() > 320_000_000  # (the run outlasts the window)
    began = trace["read_start"]
    inside = (began >= 100_000_000) & (began < 300_000_000)
    assert not (inside & (trace["thread"] == 0)).any()
    ended = trace["write_end"]
    closed = np.unique(trace["step"][(ended > 110_000_000) & (ended < 290_000_000)
                                     & (trace["step"] > 0)])
    if rounds_in_window is not None:
        assert closed.size <= rounds_in_window
    else:
        assert closed.size > 10
