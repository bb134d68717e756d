"""The serialized view: the loss curve and the exact per-update measurements."""

import numpy as np

from simulator.engine import simulate
from simulator.problems import make_problem
from tests.conftest import scenario

BASE = ("problem.dim=10", "run.threads=2", "run.blocks=3", "run.updates=20",
        "run.protocol=locked")


def test_the_curve_ends_at_the_final_vector_after_a_partial_store_by_a_dead_thread():
    """A thread that dies between its block stores changes w without a completion: the
    curve still ends with f(w_final) and ‖w_final − w*‖²."""
    first = simulate(scenario(*BASE))
    row = int(np.flatnonzero(first["thread"] == 0)[2])
    ops = first["op_write_ns"][first.ops_of(row)]
    at = int(first["write_start"][row] + ops[0] + ops[1] // 2)  # after block 0's store
    s = scenario(*BASE, f"inject.deaths=[{{thread=0, at={at}}}]")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    assert trace["extra_dead_threads"].tolist() == [0]
    gap = trace["w_final"] - problem.optimum()[0]
    assert trace["curve_loss"][-1] == problem.full_loss(trace["w_final"])
    assert trace["curve_dist2"][-1] == float(gap @ gap)
