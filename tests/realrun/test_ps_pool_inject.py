"""Injections and the learning-rate schedule on a pool of parameter servers
(``paramserver.servers`` > 1): real server and trainer processes over loopback, checked
against the simulator's pool and the injector's own draws."""

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.engine import simulate
from simulator.inject import Injector
from tests.realrun.pooled import pooled

pytestmark = pytest.mark.alone  # real processes: see conftest


@pytest.mark.parametrize("servers, injected", [
    (2, ("inject.delay=2", "inject.error=noise", "inject.error_bound=0.1",
         "inject.error_relative=true", "inject.drop=0.2", "inject.write_bits=10",
         "run.lr_schedule=inverse")),
    (3, ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=4",
         "inject.error=adversarial", "inject.error_bound=0.3", "inject.drop=0.1",
         "inject.write_bits=12", "run.lr_schedule=inv_sqrt"))])
def test_one_trainer_with_injections_is_the_simulators_pool_to_the_bit(servers, injected):
    """One trainer, float64, every injection and a schedule (a fixed delay and noise
    errors relative to ‖g‖ on two servers; uniform delays and adversarial errors on
    three): the trainer draws each update's τ, error and drop from its thread's stream in
    the simulator's order, every server answers τ of its versions back, counts a lost push
    as a version and rounds its stores, and the coordinating server's factor scales every
    part: the simulator's pool to the bit, the final vector, every row's τ, ‖e‖, drop,
    factor, staleness and measured error, and the loss curve."""
    run = run_ps(pooled(servers, "run.updates=200", *injected), 1, "float64", timeout=60,
                 measure=True)
    simulated = simulate(run.scenario)
    assert run.failure is None and len(run.trace) == 200
    for column in ("sample", "step", "thread_seq", "staleness", "delay", "error_norm",
                   "dropped", "lr_scale", "w_final", "curve_t", "curve_loss", "measured",
                   "s_norm", "delta_norm"):
        assert np.array_equal(run.trace[column], simulated[column]), column
    trace = run.trace
    assert trace["delay"].max() > 0 and trace["dropped"].any()
    assert (trace["error_norm"] > 0).all() and (trace["lr_scale"] < 1).any()
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_three_trainers_rebuild_the_servers_vector_and_carry_their_own_draws():
    """Three trainers on two servers with every injection and a schedule, measure mode: the
    run completes, the view rebuilt from every server's parts in its order of application
    (rounded as the servers rounded them) ends exactly at the servers' vector, and each
    trainer's rows carry the injector's draws for its thread in its order: its drops, its
    τ (clipped only before its fourth pull) and its noise; a lost push takes no factor,
    the others the factors of distinct versions."""
    updates = 600
    run = run_ps(pooled(2, f"run.updates={updates}", "inject.delay=0",
                        "inject.delay_dist=uniform", "inject.delay_max=3",
                        "inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.2",
                        "inject.write_bits=10", "run.lr_schedule=inv_sqrt"),
                 3, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == updates
    assert sorted(trace["step"].tolist()) == list(range(1, updates + 1))
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    s, dim = run.scenario, run.problem.dim
    injector = Injector(s.inject, s.run.seed, 3, np.zeros(dim))
    for thread in range(3):
        mine = np.flatnonzero(trace["thread"] == thread)
        mine = mine[np.argsort(trace["thread_seq"][mine])]
        assert len(mine) > 0
        drawn, dropped = [], []
        for _ in mine:  # the simulator's order: τ, the error's direction, the drop
            drawn.append(injector.delay(thread))
            injector.error(thread, np.zeros(dim), np.zeros(dim), None)
            dropped.append(injector.dropped(thread))
        assert trace["dropped"][mine].tolist() == dropped
        assert (trace["delay"][mine] <= drawn).all()
        assert np.array_equal(trace["delay"][mine][3:], np.asarray(drawn[3:]))
    assert trace["dropped"].any() and (trace["error_norm"] == 0.1).all()
    lost = trace["dropped"]
    assert (trace["lr_scale"][lost] == 1).all()
    versions = np.rint(trace["lr_scale"][~lost] ** -2.0).astype(int)
    assert len(set(versions.tolist())) == (~lost).sum() and versions.max() <= updates
