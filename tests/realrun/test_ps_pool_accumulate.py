"""Accumulated pushes (``paramserver.accumulate``) on a pool of parameter servers
(``paramserver.servers`` > 1): real server and trainer processes over loopback, checked
against the simulator's pool, a row per gradient."""

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.engine import simulate
from tests.realrun.pooled import pooled

pytestmark = pytest.mark.alone  # real processes: see conftest

#: What a trainer's rows must share with the simulator's pool, to the bit.
EXACT = ("sample", "step", "thread_seq", "thread", "staleness", "delay", "dropped",
         "error_norm", "lr_scale", "w_final", "measured", "s_norm", "g_norm", "delta_norm",
         "curve_t", "curve_n", "curve_loss", "curve_dist2")


def same_as_simulated(run, columns=EXACT) -> dict:
    """The run's trace is the simulator's pool of its scenario, row for row, to the bit
    (``columns``); the simulated trace."""
    simulated = simulate(run.scenario)
    for column in columns:
        np.testing.assert_array_equal(run.trace[column], simulated[column], column)
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    return simulated


@pytest.mark.parametrize("n", [2, 3])
def test_one_trainer_accumulating_is_the_simulators_pool_to_the_bit(n):
    """One trainer, float64, two servers, n gradients per push: every gradient is a row, a
    push's rows share its completion and its read's staleness, its writer's row measures δ
    against the mean gradient of its samples: the simulator's pool to the bit, the final
    vector and the loss curve included."""
    run = run_ps(pooled(2, "run.updates=120", f"paramserver.accumulate={n}"), 1, "float64",
                 timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 120 and run.pushes == 120 // n
    same_as_simulated(run)
    step = run.trace["step"]
    assert np.array_equal(np.bincount(step)[1:], np.full(120 // n, n))
    assert run.trace["measured"].sum() == 120 // n


def test_a_push_the_budget_left_short_is_dropped_on_every_server():
    """One trainer, pushes of 3, a budget of 100: the last push holds 1 gradient, which the
    coordinating server drops and every shard server gets as a header alone (no version):
    its row has step 0, and every row, the final vector and the loss curve (its last point
    counting the gradient left unpushed: ``realrun.rebuild`` counts a discarded row, in no
    group, among the gradients computed) are the simulator's."""
    run = run_ps(pooled(2, "run.updates=100", "paramserver.accumulate=3"), 1, "float64",
                 timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 100 and run.pushes == 34
    same_as_simulated(run)
    assert (run.trace["step"] == 0).sum() == 1 and run.trace["step"][-1] == 0


@pytest.mark.parametrize("n, injected", [
    (2, ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=3",
         "inject.drop=0.2", "inject.error=noise", "inject.error_bound=0.1",
         "inject.write_bits=10", "run.lr_schedule=inverse")),
    (3, ("inject.delay=2", "inject.drop=0.1", "inject.error=adversarial",
         "inject.error_bound=0.3", "paramserver.rule=staleness_lr"))],
    ids=["delays-drops-noise", "delay-adversarial-staleness_lr"])
def test_one_trainer_accumulating_with_injections_is_the_simulators_pool(n, injected):
    """One trainer, float64, two servers, accumulated pushes with injected delays, drops
    (a push is lost with its last gradient's write), errors (each gradient's own, dense),
    rounded stores, a schedule or a rule: the simulator's pool to the bit."""
    run = run_ps(pooled(2, "run.updates=120", f"paramserver.accumulate={n}", *injected), 1,
                 "float64", timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 120
    same_as_simulated(run)
    trace = run.trace
    assert trace["delay"].max() > 0 and trace["dropped"].any()
    assert (trace["error_norm"] > 0).all()


def test_three_trainers_accumulating_rebuild_the_servers_vector():
    """Three trainers on three servers, pushes of 3 gradients, injected delays, drops and
    rounded stores, measure mode: every applied push is 3 rows of one completion
    (completions 1..T/3), the budget's last gradients short of a push have step 0, a
    push's rows share their staleness, and the view rebuilt from every server's parts ends
    exactly at the servers' vector."""
    updates, n = 301, 3
    run = run_ps(pooled(3, f"run.updates={updates}", f"paramserver.accumulate={n}",
                        "inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=2",
                        "inject.drop=0.1", "inject.write_bits=12"),
                 3, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == updates
    step = trace["step"]
    assert sorted(set(step[step > 0].tolist())) == list(range(1, updates // n + 1))
    assert (np.bincount(step[step > 0])[1:] == n).all() and (step == 0).sum() == updates % n
    for t in range(1, updates // n + 1):
        rows = step == t
        assert len(set(trace["thread"][rows].tolist())) == 1
        assert len(set(trace["staleness"][rows].tolist())) == 1
    assert trace["measured"].sum() == updates // n
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_measure_mode_refuses_rounded_accumulated_pushes_on_a_sparse_problem():
    """A sparse problem's accumulated push moves the union of its samples' coordinates, and
    a pool's servers round their whole shards; measure mode's rebuild rounds the last
    sample's: refused before anything starts (without ``--measure`` it runs)."""
    from simulator.errors import ScenarioError

    sparse = pooled(2, "problem.name=sparse_logistic", "problem.dim=200", "run.updates=40",
                    "paramserver.accumulate=2", "inject.write_bits=10")
    with pytest.raises(ScenarioError, match=r"inject\.write_bits.*whole shards"):
        run_ps(sparse, 1, "float64", timeout=60, measure=True)
    run = run_ps(sparse, 1, "float64", timeout=60)
    assert run.failure is None
    np.testing.assert_array_equal(run.trace["w_final"], simulate(run.scenario)["w_final"])
