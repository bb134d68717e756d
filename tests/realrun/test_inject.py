"""``[inject]`` on real CPU worker processes: gradient errors, dropped writes and rounded
stores, drawn by the simulator's own injector (``simulator.inject.Injector``), update by
update, from the same per-thread streams."""

import numpy as np
import pytest

from realrun.runner import run_real
from simulator.engine import simulate
from simulator.errors import ScenarioError
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

TINY = ("problem.dim=40", "problem.n_samples=200", "run.updates=600")
ALL = ("inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.2",
       "inject.write_bits=10", "run.blocks=3")


@pytest.mark.parametrize("mode, workers, options", [
    ("serial", 1, ALL),
    ("serial", 1, ("inject.error=adversarial", "inject.error_bound=0.3",
                   "inject.error_relative=true")),
    ("roundrobin", 3, ALL),
])
def test_injections_without_chance_are_the_simulators_to_the_bit(mode, workers, options):
    """float64, in an order nothing leaves to chance (one worker, or turns): every error,
    drop and rounding is the simulator's, so the final vector, the recorded ‖e‖ and drops,
    and the measured gradient errors are the simulator's."""
    s = scenario(*TINY, f"run.protocol={mode}", *options)
    real = run_real(s, workers, mode, dtype="float64", timeout=120, measure_every=1)
    assert real.failure is None and len(real.trace) == 600
    simulated = simulate(real.scenario)
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    for name in ("error_norm", "dropped"):
        assert np.array_equal(real.trace[name], simulated[name]), name
    np.testing.assert_allclose(real.trace["delta_norm"], simulated["delta_norm"], rtol=1e-12)
    assert real.hardware_loss["rebuilt_vs_real_max"] == 0  # the rebuild rounds as they did


def test_lock_free_workers_draw_each_threads_injections():
    """Two lock-free workers: the interleaving is the hardware's, but worker r's i-th update
    drops its write and carries its error exactly when the simulator's thread r's i-th does."""
    s = scenario(*TINY, "inject.drop=0.3", "inject.error=noise", "inject.error_bound=0.2",
                 "inject.error_relative=true")
    real = run_real(s, 2, "lockfree", dtype="float64", timeout=120)
    simulated = simulate(real.scenario)

    def by_update(trace):
        order = np.lexsort((trace["thread_seq"], trace["thread"]))
        return trace["dropped"][order], trace["error_norm"][order] > 0

    for ours, theirs in zip(by_update(real.trace), by_update(simulated), strict=True):
        assert np.array_equal(ours, theirs)
    assert 0.2 < real.trace["dropped"].mean() < 0.4


@pytest.mark.parametrize("overrides, kwargs, named", [
    (("inject.delay=2",), {}, "inject.delay"),
    (("inject.deaths=[{thread=0, at=5}]",), {}, "inject.deaths"),
    (("inject.drop=0.1",), {"launch": "threads"}, "inject"),
])
def test_injections_real_workers_do_not_run_are_refused(overrides, kwargs, named):
    with pytest.raises(ScenarioError, match=named):
        run_real(scenario(*TINY, *overrides), 2, "lockfree", **kwargs)
