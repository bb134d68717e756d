"""Backup-worker rounds (``paramserver.fraction`` > 0) on a pool of parameter servers: each
shard server holds a round's parts until the coordinating server closes it, then applies
their mean; real server and trainer processes over loopback, against the simulator's pool."""

import numpy as np
import pytest

from realrun.ps import run_ps
from realrun.support import refuse_unmeasurable
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.replay import replay
from tests.conftest import scenario
from tests.realrun.pooled import TINY, pooled

pytestmark = pytest.mark.alone  # real processes: see conftest


@pytest.mark.parametrize("injected", [
    (),
    ("inject.delay=0", "inject.delay_dist=uniform", "inject.delay_max=3",
     "inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.2",
     "inject.write_bits=10", "run.lr_schedule=inverse")])
def test_one_trainer_in_rounds_on_a_pool_is_the_simulators_pool_to_the_bit(injected):
    """One float64 trainer on two servers, every push a round of its own, with delays,
    errors, drops, rounded stores and a schedule drawn and applied as the simulator's: the
    simulator's pool with rounds, rows, final vector, loss curve and δ to the bit, and the
    rebuild is the servers' vector."""
    run = run_ps(pooled(2, "run.updates=200", "paramserver.fraction=1", *injected), 1,
                 "float64", timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 200
    simulated = simulate(run.scenario)
    for column in ("sample", "step", "thread_seq", "staleness", "dropped", "delay",
                   "lr_scale", "w_final", "curve_loss", "delta_norm"):
        assert np.array_equal(run.trace[column], simulated[column]), column
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


@pytest.mark.parametrize("fraction, quota", [("1", 3), ("0.5", 2)])
def test_rounds_on_a_pool_apply_gradients_of_one_vector_and_replay_exactly(fraction, quota):
    """Three trainers on three servers, measure mode, drops: every round holds the quota of
    pushes (fewer only as trainers finish), later pushes of a round are discarded; every
    kept gradient was computed on its round's vector on every shard (δ 0 to rounding but
    for a round whose write its writer's draw dropped: δ = −g), the rebuild from every
    server's parts is the servers' vector to the bit, and a replay without a pool (the
    durations hold the waits) gives back every event at its recorded time: no pull reads a
    shard before the round's write there (the coordinating server holds every pull until
    each server applied the round)."""
    run = run_ps(pooled(3, "run.updates=600", f"paramserver.fraction={fraction}",
                        "inject.drop=0.1"), 3, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 600
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    applied = trace["step"] > 0
    sizes = np.bincount(trace["step"][applied])[1:]
    assert sizes.max() == quota and (sizes == quota).sum() >= len(sizes) - 3
    assert (trace["staleness"][applied] == 0).all()
    assert (~applied).any() == (fraction == "0.5")
    measured = trace["measured"]
    ratio = trace["delta_norm"][measured] / trace["g_norm"][measured]
    lost = trace["dropped"][measured]
    assert lost.any() and (ratio[~lost] < 1e-9).all()
    np.testing.assert_allclose(ratio[lost], 1.0, rtol=1e-9)
    _, _, again = replay(trace, ["paramserver.servers=0"])
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (trace, again))
    for column in ("read_start", "read_end", "grad_end", "write_end", "staleness", "step"):
        assert np.array_equal(trace[column][a], again[column][b]), column


def test_a_pool_round_waiting_for_a_dead_trainer_ends_the_run_as_simulated():
    """fraction = 1 on two servers, trainer 1 dies 150 ms in: the round that needs it waits
    for good and the run ends early, as simulated; every recorded round has all three
    members on every shard (the rebuild is the servers' vector), none of the parts left
    waiting is a row, and trainer 2, with a death of its own long after, is dead too."""
    deaths = "inject.deaths=[{thread=1, at=150000000}, {thread=2, at=900000000000}]"
    run = run_ps(pooled(2, "run.updates=200000", "paramserver.fraction=1", deaths), 3,
                 "float64", timeout=60, measure=True)
    simulated = simulate(scenario(*TINY, "run.protocol=paramserver", "run.blocks=2",
                                  "paramserver.servers=2", "run.updates=200000",
                                  "paramserver.fraction=1", "run.threads=3", deaths))
    assert run.failure is None and 0 < len(run.trace) < 200000
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    for trace in (run.trace, simulated):
        assert trace["extra_dead_threads"].tolist() == [1, 2]
        assert (trace["step"] > 0).all()
        assert set(np.bincount(trace["step"])[1:].tolist()) == {3}
    assert run.trace["read_start"][run.trace["thread"] == 1].max() < 150_000_000


def test_measure_mode_refuses_rounded_rounds_on_a_sparse_pool():
    """The rebuild rounds a store over its writer's sample's coordinates; a pool's servers
    round every value of a round's mean: refused in measure mode, named."""
    s = pooled(2, "problem.name=sparse_logistic", "paramserver.fraction=1",
               "inject.write_bits=8")
    with pytest.raises(ScenarioError, match=r"inject\.write_bits"):
        refuse_unmeasurable(s, "paramserver", True)
    refuse_unmeasurable(pooled(2, "paramserver.fraction=1", "inject.write_bits=8"),
                        "paramserver", False)
