"""The engine against renewal theory (statistical checks with stated tolerances).

Lock-free threads that share no cores or bus run independent renewal processes with cycle
C = R + G + W. At the moment an update stores its single block (B = 1), each other thread is,
independently, inside its own write with probability p = E[W]/E[C] (renewal-reward), and every
such thread loaded before that store and stores after it: it overwrites the store. Hence

    E[lost stores per update]   = (k − 1) · p
    P(an update loses a store)  = 1 − (1 − p)^(k − 1)
    E[staleness]                = k − 1   (an update spans exactly one cycle of its thread,
                                           in which each other thread completes once on average)
"""

import numpy as np
import pytest

from simulator.engine import simulate
from tests.conftest import scenario

CASES = [
    # threads, read, grad, write (means in ns, lognormal cv 0.5 unless exponential)
    (4, 2000.0, 6000.0, 2000.0, "lognormal"),
    (8, 1000.0, 3000.0, 4000.0, "lognormal"),
    (16, 3000.0, 3000.0, 1000.0, "exponential"),
]


@pytest.mark.parametrize(("threads", "read", "grad", "write", "dist"), CASES)
def test_lost_updates_and_staleness_match_renewal_theory(threads, read, grad, write, dist):
    """Lost stores, loss probability and staleness within 4% (20,000 updates, after warm-up)."""
    cv = "" if dist == "exponential" else ", cv=0.5"
    s = scenario(f"run.threads={threads}", "run.updates=20000", "metrics.exact=false",
                 "metrics.curve_points=0",
                 *(f"timing.{op}={{dist='{dist}', mean={mean}{cv}}}"
                   for op, mean in (("read", read), ("grad", grad), ("write", write))))
    trace = simulate(s)
    steady = slice(2000, None)  # all threads start together at t = 0: skip the warm-up
    p = write / (read + grad + write)
    lost = trace["lost_blocks"][steady]
    assert lost.mean() == pytest.approx((threads - 1) * p, rel=0.04)
    assert (lost > 0).mean() == pytest.approx(1 - (1 - p) ** (threads - 1), rel=0.04)
    assert trace["staleness"][steady].mean() == pytest.approx(threads - 1, rel=0.04)


def test_atomic_add_keeps_every_update_and_the_same_staleness():
    """Same timings with atomic_add: no loss at all, the staleness law unchanged."""
    trace = simulate(scenario("run.write_mode=atomic_add", "run.updates=20000",
                              "metrics.exact=false", "metrics.curve_points=0"))
    assert trace["lost_blocks"].sum() == 0
    assert np.mean(trace["staleness"][2000:]) == pytest.approx(7, rel=0.04)
