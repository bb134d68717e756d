"""The ledger of a run: completions, the serialized view and one row per gradient."""

from __future__ import annotations

import numpy as np

from simulator.ledger import Ledger
from simulator.memory import SharedMemory, block_ops
from simulator.problems import make_problem
from simulator.protocols.base import GROUPED
from simulator.update import Update
from simulator.view import SerializedView
from tests.conftest import scenario


def _update(uid: int, thread: int, ops: list, start: int) -> Update:
    u = Update(uid, thread, 0, sample=uid, ops=ops)
    u.read_ns, u.grad_ns, u.idle_ns, u.write_ns = [1] * len(ops), 1, 0, [1] * len(ops)
    u.read_start = u.read_end = u.grad_start = u.grad_end = u.write_start = start
    u.write_end, u.start_completed, u.start_versions = start + 1, 0, [0] * len(ops)
    return u


def test_completions_discards_and_groups_make_one_row_per_gradient():
    s = scenario("problem.dim=6", "run.updates=5", "metrics.curve_points=0")
    problem = make_problem(s.problem)
    mem = SharedMemory(problem.initial(), 2)
    view = SerializedView(problem, 0.1, mem.w.copy(), 5, True, 1, 0)
    ops = block_ops(mem.bounds, None)
    ledger = Ledger(mem, view, ops, active={}, max_delay=2)
    seen: list[int] = []
    ledger.hooks = [lambda u: seen.append(u.uid)]
    first = _update(0, 0, ops, 0)
    mem.w -= 0.1  # the shared vector after update 0's write
    ledger.complete(first)
    ledger.discard(_update(1, 1, ops, 3))
    members = [_update(2, 0, ops, 4), _update(3, 1, ops, 5)]
    members[1].role, members[1].group = GROUPED, members
    mem.w -= 0.1
    ledger.complete_group(members[1])
    ledger.finish()
    trace = ledger.trace("", problem.initial(), [0] * 5, {}, "simulated")
    assert trace["uid"].tolist() == [0, 1, 2, 3] and seen == [0, 1, 2, 3]
    assert trace["step"].tolist() == [1, 0, 2, 2]  # the discard applied nothing
    assert trace["write_end"].tolist() == [1, 3, 6, 6]  # a member ends with its group's write
    assert ledger.completed == 2
    # The snapshots an injected delay reads: w_0, w_1, w_2.
    assert [float(w[0]) for w in ledger.history] == [float(problem.initial()[0] - d)
                                                    for d in (0.0, 0.1, 0.2)]
    # Exact metrics only on rows that completed an update (the group's on its writer).
    assert np.isfinite(trace["g_norm"][[0, 3]]).all() and np.isnan(trace["g_norm"][[1, 2]]).all()
