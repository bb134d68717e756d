"""A warm start and rebalancing on a pool of parameter servers (``paramserver.servers`` >
1): real server and trainer processes over loopback, checked against the simulator's
pool."""

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.engine import simulate
from tests.realrun.pooled import pooled

pytestmark = pytest.mark.alone  # real processes: see conftest


def test_one_trainer_with_a_warm_start_and_rebalancing_is_the_simulators_pool_to_the_bit():
    """One trainer, float64, two servers, a warm start, rebalancing and a staleness limit
    over injected delays: the simulator's pool to the bit (every row's step, staleness,
    delay and measured error, the final vector, the loss curve, no trainer retired)."""
    run = run_ps(pooled(2, "run.updates=150", "paramserver.warm_start=20",
                        "paramserver.rebalance=1.5", "paramserver.rebalance_after=5",
                        "paramserver.staleness_limit=2", "inject.delay=0",
                        "inject.delay_dist=uniform", "inject.delay_max=4"),
                 1, "float64", timeout=60, measure=True)
    simulated = simulate(run.scenario)
    assert run.failure is None and len(run.trace) == 150
    for column in ("sample", "step", "thread_seq", "staleness", "delay", "w_final",
                   "curve_t", "curve_loss", "measured", "s_norm", "delta_norm",
                   "extra_retired_threads"):
        np.testing.assert_array_equal(run.trace[column], simulated[column], column)
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_a_warm_start_lets_trainer_0_alone_make_the_first_w_completions():
    """Three trainers on two servers, a warm start of 30: the first 30 completions are all
    trainer 0's, every other trainer's first read ends after the 30th completion (each
    shard server had its last part), the kept pushes complete 1..T and the view rebuilt
    from every server's parts ends exactly at the servers' vector."""
    warm = 30
    run = run_ps(pooled(2, "run.updates=300", f"paramserver.warm_start={warm}"), 3,
                 "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 300
    assert sorted(trace["step"].tolist()) == list(range(1, 301))
    assert (trace["thread"][trace["step"] <= warm] == 0).all()
    warmed = trace["write_end"][trace["step"] == warm][0]
    for thread in (1, 2):
        mine = trace["thread"] == thread
        assert mine.any() and trace["read_end"][mine].min() > warmed
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_rebalancing_retires_a_straggling_trainer():
    """Three trainers on two servers, trainer 2 a straggler 2,000 times slower: once every
    trainer made 5 gradients the coordinating server retires it by the simulator's rule
    (``extra_retired_threads``), the others make the rest of the budget, and the rebuild
    ends exactly at the servers' vector. (A budget of 3,000: with 400 a loaded run's fast
    trainers spent it before the straggler had made 5.)"""
    run = run_ps(pooled(2, "run.updates=3000", "paramserver.rebalance=3",
                        "paramserver.rebalance_after=5",
                        "inject.stragglers=[{thread=2, factor=2000}]"),
                 3, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 3000
    assert trace["extra_retired_threads"].tolist() == [2]
    assert 5 <= (trace["thread"] == 2).sum() < 20
    assert sorted(trace["step"].tolist()) == list(range(1, 3001))
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
