"""The staleness limit and the update rules on a pool of parameter servers
(``paramserver.servers`` > 1): real server and trainer processes over loopback, checked
against the simulator's pool and the rules of ``simulator.rules``."""

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.engine import simulate
from simulator.rules import staleness_scale
from tests.realrun.pooled import pooled

pytestmark = pytest.mark.alone  # real processes: see conftest

#: Uniform injected delays: with one trainer a push's staleness is its pull's τ.
DELAYS = ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=4")


@pytest.mark.parametrize("servers, options", [
    (2, ("paramserver.staleness_limit=2", "paramserver.rule=staleness_lr",
         "run.lr_schedule=inverse", "inject.drop=0.1")),
    (3, ("paramserver.staleness_limit=3", "paramserver.rule=dcasgd", "dcasgd.lam=2.0",
         "run.lr_schedule=inv_sqrt", "inject.error=noise", "inject.error_bound=0.1",
         "inject.write_bits=12"))],
    ids=["staleness_lr", "dcasgd"])
def test_one_trainer_is_the_simulators_pool_to_the_bit(servers, options):
    """One trainer, float64, uniform delays (its staleness), a limit, a rule and a
    schedule: the coordinating server decides the limit and the rule at shard 0 with the
    push's staleness, the trainer scales the other parts by the schedule's factor, then
    ``staleness_lr``'s, or each shard server compensates its own part (DC-ASGD): the
    simulator's pool to the bit, every row's step (0: discarded), staleness, factor and
    measured error, the final vector and the loss curve."""
    run = run_ps(pooled(servers, "run.updates=150", *DELAYS, *options), 1, "float64",
                 timeout=60, measure=True)
    simulated = simulate(run.scenario)
    assert run.failure is None and len(run.trace) == 150
    for column in ("sample", "step", "thread_seq", "staleness", "delay", "dropped",
                   "error_norm", "lr_scale", "w_final", "curve_t", "curve_loss", "measured",
                   "s_norm", "delta_norm"):
        np.testing.assert_array_equal(run.trace[column], simulated[column], column)
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    trace = run.trace
    assert (trace["step"] == 0).any() and (trace["step"] > 0).any()
    if "paramserver.rule=staleness_lr" in options:  # (1/m of the schedule, then 1/τ)
        assert (trace["lr_scale"] < 1 / trace["step"].clip(1)).any()


def test_three_trainers_discard_and_scale_by_their_staleness():
    """Three trainers on two servers, a staleness limit and ``staleness_lr``, measure
    mode: kept pushes complete 1..n, every row whose injected τ alone exceeds the limit is
    discarded (its staleness at shard 0 is at least τ), every kept row's factor is
    staleness_scale of an integer staleness of at least its τ and at most the limit, and
    the view rebuilt from every server's parts ends exactly at the servers' vector."""
    limit = 3
    run = run_ps(pooled(2, "run.updates=300", "inject.delay=0", "inject.delay_dist=uniform",
                        "inject.delay_max=5", f"paramserver.staleness_limit={limit}",
                        "paramserver.rule=staleness_lr"), 3, "float64", timeout=60,
                 measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 300
    kept = trace["step"] > 0
    assert sorted(trace["step"][kept].tolist()) == list(range(1, int(kept.sum()) + 1))
    assert (~kept).any() and kept.any()
    assert not kept[trace["delay"] > limit].any()
    tau = np.rint(1 / trace["lr_scale"][kept]).astype(int)
    assert np.array_equal(trace["lr_scale"][kept], [staleness_scale(t) for t in tau])
    assert (tau <= limit).all()
    assert (tau >= np.maximum(trace["delay"][kept], 1)).all()
    assert (trace["lr_scale"][~kept] == 1).all() and not trace["measured"][~kept].any()
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_three_trainers_compensate_each_shard_and_rebuild_it_exactly():
    """Three trainers on two servers with DC-ASGD and a staleness limit over delays:
    every server compensates its own parts from the shard it sent that trainer, a row
    whose τ exceeds the limit is discarded, the rebuild from the parts the servers applied
    ends exactly at their vector, and the run converges."""
    run = run_ps(pooled(2, "run.updates=240", "paramserver.rule=dcasgd", "dcasgd.lam=1.0",
                        "paramserver.staleness_limit=4", *DELAYS, "inject.delay_max=6"),
                 3, "float64", timeout=60, measure=True)
    trace = run.trace
    kept = trace["step"] > 0
    assert run.failure is None and len(trace) == 240 and kept.any()
    assert sorted(trace["step"][kept].tolist()) == list(range(1, int(kept.sum()) + 1))
    assert not kept[trace["delay"] > 4].any() and (trace["lr_scale"] == 1).all()
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    assert trace["curve_loss"][-1] < trace["curve_loss"][0]
