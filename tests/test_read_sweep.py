"""Reads that sweep (``run.read_view = "sweep"``): a block's copy also holds the part of each
other thread's write in flight that the write's sweep reached before the read's, the first
min(1, max(0, (r − s) / (W − R))) of the block. Checked by hand on two threads, against a
second implementation that rebuilds every read copy from the trace's timestamps alone, and
for determinism and replay."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.problems import make_problem
from simulator.schedule import Scheduler, run_schedule

from .conftest import CONSTANT, same_every_way, scenario

LOGNORMAL = ("timing.read={dist='lognormal', mean=2500, cv=0.3}",
             "timing.grad={dist='lognormal', mean=9000, cv=0.4}",
             "timing.write={dist='lognormal', mean=6000, cv=0.3}")


def _device(name: str, grad: int) -> str:
    return (f"{{name='{name}', timing={{read={{dist='constant', mean=1000}}, "
            f"grad={{dist='constant', mean={grad}}}, write={{dist='constant', mean=4000}}}}}}")


HAND = (*CONSTANT, "run.threads=2", "run.updates=4", "run.split=even", "problem.dim=40",
        "run.write_mode=atomic_add", f"devices=[{_device('a', 6000)}, {_device('b', 4000)}]")


def test_a_read_inside_another_write_copies_the_part_its_sweep_reached():
    """Thread a writes [7000, 11000); thread b (a shorter gradient) writes [5000, 9000) and
    reads again [9000, 10000]. a's sweep reaches coordinate c of 40 at 7000 + 100c, b's read at
    9000 + 25c: b copies a's step on the first (9000 − 7000)·40 // (4000 − 1000) = 26."""
    sc = scenario(*HAND, "run.read_view=sweep")
    trace = simulate(sc)
    rows = {(int(t), int(q)): i for i, (t, q) in enumerate(zip(trace["thread"],
                                                              trace["thread_seq"], strict=True))}
    a1, b1, b2 = rows[0, 0], rows[1, 0], rows[1, 1]
    assert (trace["write_start"][a1], trace["write_end"][a1]) == (7000, 11000)
    assert (trace["read_start"][b2], trace["read_end"][b2]) == (9000, 10000)
    assert trace["torn"][b2] and trace["read_overwrites"][b2] == 1
    assert not trace["torn"][a1] and not trace["torn"][b1]
    problem, lr, w0 = make_problem(sc.problem), sc.run.lr, trace["w0"]
    step_a1 = lr * problem.grad(w0, int(trace["sample"][a1]))[0]
    step_b1 = lr * problem.grad(w0, int(trace["sample"][b1]))[0]
    seen = w0 - step_b1
    seen[:26] -= step_a1[:26]
    step_b2 = lr * problem.grad(seen, int(trace["sample"][b2]))[0]
    # b2's gradient is at the torn copy: the vector after all four writes says so.
    a2 = rows[0, 1]
    copy_a2 = w0 - step_b1 - step_a1  # a reads [11000, 12000]: b's second write is later
    step_a2 = lr * problem.grad(copy_a2, int(trace["sample"][a2]))[0]
    assert np.allclose(trace["w_final"], w0 - step_a1 - step_b1 - step_b2 - step_a2,
                       rtol=0, atol=1e-15)
    end = simulate(scenario(*HAND))
    assert not end["torn"].any()
    assert not np.array_equal(end["w_final"], trace["w_final"])


def _rebuilt(trace, sc) -> tuple[np.ndarray, np.ndarray]:
    """Every update's copy rebuilt from the timestamps (atomic adds: the memory at a read's
    end is w0 less every step landed by then), plus the swept part of each other thread's
    write in flight; returns the torn flags and the final vector."""
    problem, lr, w0 = make_problem(sc.problem), sc.run.lr, trace["w0"]
    rs, re, ws, we, owner = (trace[k].astype(np.int64) for k in
                             ("read_start", "read_end", "write_start", "write_end", "thread"))
    size, steps, torn = len(w0), {}, np.zeros(len(trace), dtype=bool)
    for u in np.argsort(trace["grad_end"], kind="stable").tolist():
        copy = w0.copy()
        for v, step in steps.items():
            if we[v] <= re[u]:
                copy -= step
            elif owner[v] != owner[u] and ws[v] < rs[u]:
                span = (we[v] - ws[v]) - (re[u] - rs[u])
                m = min(size, (rs[u] - ws[v]) * size // span) if span > 0 else 0
                copy[:m] -= step[:m]
                torn[u] |= 0 < m < size
        steps[u] = lr * problem.grad(copy, int(trace["sample"][u]))[0]
    return torn, w0 - sum(steps.values())


def test_every_copy_matches_a_rebuild_from_the_timestamps():
    sc = scenario("run.threads=3", "run.updates=600", "problem.dim=50",
                  "run.write_mode=atomic_add", "run.read_view=sweep", *LOGNORMAL)
    trace = simulate(sc)
    torn, w_final = _rebuilt(trace, sc)
    assert 0.2 < torn.mean() < 0.6  # reads inside writes are common here
    assert np.array_equal(torn, trace["torn"])
    assert np.allclose(w_final, trace["w_final"], rtol=0, atol=1e-14)


def test_a_read_with_no_write_in_flight_is_the_plain_copy():
    """One thread (never another write in flight): sweep and end are the same run."""
    one = ("run.threads=1", "run.updates=300", *LOGNORMAL)
    sweep, end = simulate(scenario(*one, "run.read_view=sweep")), simulate(scenario(*one))
    for name, values in end.arrays.items():
        if name != "scenario":
            assert np.array_equal(values, sweep.arrays[name]), name


@pytest.mark.parametrize("extra", [(), ("timing.convoy_join=0.9", "timing.convoy_rest=2",
                                        "timing.convoy_lost_leader=0.1", "problem.dim=400",
                                        "timing.idle={dist='lognormal', mean=3000, cv=0.5}",
                                        "timing.convoy_end_gap=0.3")])
def test_sweeping_reads_are_deterministic_and_replay_bit_for_bit(extra):
    trace = same_every_way(scenario("run.threads=3", "run.updates=600", "run.read_view=sweep",
                                    "metrics.exact=true", *LOGNORMAL, *extra))
    assert trace["torn"].any()


def test_bad_read_view_names_the_field(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--quiet", "--set",
                 "run.read_view=halfway"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.read_view" in err[0] and "halfway" in err[0]
    assert not out.exists()
    with pytest.raises(ScenarioError, match=r"run\.read_view"):
        simulate(scenario("problem.name=sparse_logistic", "run.read_view=sweep"))
    with pytest.raises(ScenarioError, match=r"run\.read_view"):
        run_schedule(scenario("run.threads=2", "run.updates=4", "run.read_view=sweep"),
                     Scheduler("random", 2))
