"""Reads that see writes in flight (``run.read_view = "sweep"``): a block's copy, made at the
read's end, also holds the coordinates each other thread's write in flight had stored by
then: its stores run in order at a constant pace over its window less
``timing.write_sweep_lead`` and ``write_sweep_tail``, so a read ending a share u through
that store window copies the first ⌈u·n⌉ coordinates of its step. Checked by hand on two
threads, against a second implementation that rebuilds every read copy from the trace's
timestamps alone, and for determinism and replay."""

from __future__ import annotations

import numpy as np
import pytest

from realrun.rebuild import read_sweeps as rebuild_read_sweeps
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.stores import store_shares
from simulator.problems import make_problem
from simulator.schedule import Scheduler, run_schedule
from simulator.trace import read_sweeps
from tests.conftest import CONSTANT, fitted, same_every_way, scenario

LOGNORMAL = ("timing.read={dist='lognormal', mean=2500, cv=0.3}",
             "timing.grad={dist='lognormal', mean=9000, cv=0.4}",
             "timing.write={dist='lognormal', mean=6000, cv=0.3}")


def _device(name: str, grad: int, window: str = "") -> str:
    return (f"{{name='{name}', timing={{read={{dist='constant', mean=1000}}, "
            f"grad={{dist='constant', mean={grad}}}, write={{dist='constant', mean=4000}}"
            f"{window}}}}}")


def _hand(lead: int = 0, tail: int = 0) -> tuple[str, ...]:
    window = f", write_sweep_lead={lead}, write_sweep_tail={tail}"
    return (*CONSTANT, "run.threads=2", "run.updates=4", "run.split=even", "problem.dim=40",
            "run.write_mode=atomic_add",
            f"devices=[{_device('a', 6000, window)}, {_device('b', 4000, window)}]")


@pytest.mark.parametrize(("lead", "tail", "seen"), [(0, 0, 30), (2000, 0, 20), (1500, 500, 30),
                                                    (1000, 1000, 40), (3000, 1000, 0)])
def test_a_read_inside_another_write_copies_what_its_stores_reached(lead, tail, seen):
    """Thread a writes [7000, 11000); thread b (a shorter gradient) writes [5000, 9000) and
    reads again [9000, 10000]. a's stores run over [7000 + lead, 11000 − tail]: at b's read end,
    10000, they are a share u = (3000 − lead) / (4000 − lead − tail) through, and b copies a's
    step on the first ⌈40·u⌉ coordinates: 30 with the whole window, 20 from 9000 on, all 40
    when the stores end at 10000, none when they happen at one instant, 10000."""
    sc = scenario(*_hand(lead, tail), "run.read_view=sweep")
    trace = simulate(sc)
    rows = {(int(t), int(q)): i for i, (t, q) in enumerate(zip(trace["thread"],
                                                              trace["thread_seq"], strict=True))}
    a1, b1, b2 = rows[0, 0], rows[1, 0], rows[1, 1]
    assert (trace["write_start"][a1], trace["write_end"][a1]) == (7000, 11000)
    assert (trace["read_start"][b2], trace["read_end"][b2]) == (9000, 10000)
    # What the copy holds of a's write is recorded apart; a's store lands at its end (11000),
    # after the copy, so by the read report's definition b2 saw no store and is not torn.
    assert read_sweeps(trace)[:, 3].tolist() == [seen]
    assert trace["read_overwrites"][b2] == 0 and not trace["torn"].any()
    problem, lr, w0 = make_problem(sc.problem), sc.run.lr, trace["w0"]
    step_a1 = lr * problem.grad(w0, int(trace["sample"][a1]))[0]
    step_b1 = lr * problem.grad(w0, int(trace["sample"][b1]))[0]
    copy = w0 - step_b1
    copy[:seen] -= step_a1[:seen]
    step_b2 = lr * problem.grad(copy, int(trace["sample"][b2]))[0]
    # b2's gradient is at the torn copy: the vector after all four writes says so.
    a2 = rows[0, 1]
    copy_a2 = w0 - step_b1 - step_a1  # a reads [11000, 12000]: b's second write is later
    step_a2 = lr * problem.grad(copy_a2, int(trace["sample"][a2]))[0]
    assert np.allclose(trace["w_final"], w0 - step_a1 - step_b1 - step_b2 - step_a2,
                       rtol=0, atol=1e-15)
    end = simulate(scenario(*_hand(lead, tail)))
    assert not end["torn"].any()
    assert np.array_equal(end["w_final"], trace["w_final"]) == (seen == 0)


def _rebuilt(trace, sc, lead: int = 0, tail: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every update's copy rebuilt from the timestamps (atomic adds: the memory at a read's
    end is w0 less every step landed by then), plus what each other thread's write in flight
    had stored by then; returns how many coordinates each copy holds of each write in flight
    (sorted) and the final vector."""
    problem, lr, w0 = make_problem(sc.problem), sc.run.lr, trace["w0"]
    re, ws, we, owner = (trace[k].astype(np.int64) for k in
                         ("read_end", "write_start", "write_end", "thread"))
    size, steps, seen = len(w0), {}, []
    for u in np.argsort(trace["grad_end"], kind="stable").tolist():
        copy = w0.copy()
        for v, step in steps.items():
            if we[v] <= re[u]:
                copy -= step
            elif owner[v] != owner[u] and ws[v] < re[u]:
                first = ws[v] + min(lead, we[v] - ws[v])
                stores = max(we[v] - ws[v] - lead - tail, 0)
                # coordinate c (0-based) is stored at first + c·stores/n
                m = int(sum(first + c * stores / size < re[u] for c in range(size)))
                copy[:m] -= step[:m]
                seen.append(m)
        steps[u] = lr * problem.grad(copy, int(trace["sample"][u]))[0]
    return np.sort(seen), w0 - sum(steps.values())


@pytest.mark.parametrize(("lead", "tail"), [(0, 0), (2500, 1500)])
def test_every_copy_matches_a_rebuild_from_the_timestamps(lead, tail):
    sc = scenario("run.threads=3", "run.updates=600", "problem.dim=50",
                  "run.write_mode=atomic_add", "run.read_view=sweep", *LOGNORMAL,
                  f"timing.write_sweep_lead={lead}", f"timing.write_sweep_tail={tail}")
    trace = simulate(sc)
    seen, w_final = _rebuilt(trace, sc, lead, tail)
    partial = np.sum((seen > 0) & (seen < sc.problem.dim))
    assert 0.1 * len(trace) < partial < len(trace)  # reads inside writes are common here
    assert np.array_equal(seen, np.sort(read_sweeps(trace)[:, 3]))
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
                                        "timing.convoy_end_gap=0.3",
                                        "timing.write_sweep_lead=2000",
                                        "timing.write_sweep_tail=500")])
def test_sweeping_reads_are_deterministic_and_replay_bit_for_bit(extra):
    trace = same_every_way(scenario("run.threads=3", "run.updates=600", "run.read_view=sweep",
                                    "metrics.exact=true", *LOGNORMAL, *extra))
    rows = read_sweeps(trace)
    assert ((rows[:, 3] > 0) & (rows[:, 3] < rows[:, 2])).any()


@pytest.mark.parametrize(("setting", "field", "value"),
                         [("run.read_view=halfway", "run.read_view", "halfway"),
                          ("timing.write_sweep_tail=-5", "write_sweep_tail", "-5")])
def test_a_bad_value_names_the_field(tmp_path, capsys, setting, field, value):
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and value in err[0]
    assert not out.exists()


def test_sparse_problems_and_explore_refuse_sweeping_reads():
    with pytest.raises(ScenarioError, match=r"hardware\.sweeping_reads"):
        simulate(scenario("problem.name=sparse_logistic", "run.read_view=sweep"))
    with pytest.raises(ScenarioError, match=r"hardware\.sweeping_reads"):
        run_schedule(scenario("run.threads=2", "run.updates=4", "run.read_view=sweep"),
                     Scheduler("random", 2))


WINDOW = ("run.threads=3", "run.updates=1500", "problem.dim=50", "run.read_view=sweep",
          *LOGNORMAL)


def test_the_recorded_reads_under_a_write_follow_the_store_window():
    """Every (read, write in flight) row a simulation records holds what calibrate's rule
    gives for it, row by row: the fit and the engine share one rule."""
    trace = simulate(scenario(*WINDOW, "timing.write_sweep_lead=2000",
                              "timing.write_sweep_tail=1000"))
    rows = read_sweeps(trace)
    assert rows is not None and rows.shape[0] > 200
    assert 0 < np.mean(rows[:, 3] == 0) < 1 and 0 < np.mean(rows[:, 3] == rows[:, 2]) < 1
    assert np.array_equal(np.rint(store_shares(rows, 2000, 1000) * rows[:, 2]), rows[:, 3])


@pytest.mark.parametrize(("lead", "tail"), [(2000, 1000), (0, 0), (4500, 300)])
def test_calibrate_recovers_the_store_window(tmp_path, lead, tail):
    run = tmp_path / "run"
    settings = (*WINDOW, f"timing.write_sweep_lead={lead}", f"timing.write_sweep_tail={tail}")
    assert main(["simulate", "--quiet", "--out", str(run),
                 *(arg for o in settings for arg in ("--set", o))]) == 0
    calibrated, report = calibrate(run)
    timing = fitted(calibrated)
    assert abs(timing.write_sweep_lead - lead) <= 150
    assert abs(timing.write_sweep_tail - tail) <= 150
    assert report["stores"]["miss"] < 0.01


def test_a_run_that_reads_at_the_end_fits_no_store_window(tmp_path):
    run = tmp_path / "run"
    assert main(["simulate", "--quiet", "--out", str(run), "--set", "run.threads=2"]) == 0
    calibrated, report = calibrate(run)
    assert report["stores"]["fields"] is None and "fewer than" in report["stores"]["why"]
    assert fitted(calibrated).write_sweep_lead == 0


def test_real_read_copies_give_the_share_they_hold():
    """A real run's rows from the read copies (realrun.rebuild.read_sweeps), by hand: worker 0
    reads quietly [0, 10], writes [20, 40]; worker 1's read [25, 35] holds its step on 3 of
    the 4 coordinates it changes (the fifth is 0), worker 1's read [50, 60] is quiet."""
    times = np.array([[0, 10, 20, 40], [25, 35, 70, 80], [50, 60, 90, 95]], dtype=np.int64)
    thread, seq = np.array([0, 1, 1]), np.array([0, 0, 1])
    before = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    step = np.array([0.5, 0.5, 0.5, 0.5, 0.0])
    after = before - step
    copy = np.where(np.arange(5) < 3, after, before)
    steps = [np.array([step]), np.array([np.zeros(5), np.zeros(5)])]
    reads = [np.array([before]), np.array([copy, after])]
    rows = rebuild_read_sweeps(times, thread, seq, steps, reads, "float64").reshape(-1, 4)
    assert rows.tolist() == [[15.0, 20.0, 4.0, 3.0]]
    reads[1][0][0] = 7.0  # a coordinate that is neither before nor after: left out
    assert rebuild_read_sweeps(times, thread, seq, steps, reads, "float64").size == 0


def test_a_load_store_write_in_flight_shows_its_stores_not_its_loads():
    """load_store: a's write loads w0 at 7000 and lands w0 − a's step at 11000 (b's first step,
    landed at 9000, is lost then). b's read ending at 10000 sees what an in-place sweep has
    stored by then on a's first 30 coordinates — the memory less a's step — not the block
    as a loaded it (which would take b's own landed step back)."""
    sc = scenario(*_hand(), "run.read_view=sweep", "run.write_mode=load_store",
                  "metrics.exact=true")
    trace = simulate(sc)
    rows = {(int(t), int(q)): i for i, (t, q) in enumerate(zip(trace["thread"],
                                                              trace["thread_seq"], strict=True))}
    a1, b1, b2 = rows[0, 0], rows[1, 0], rows[1, 1]
    problem, lr, w0 = make_problem(sc.problem), sc.run.lr, trace["w0"]
    step_a1 = lr * problem.grad(w0, int(trace["sample"][a1]))[0]
    step_b1 = lr * problem.grad(w0, int(trace["sample"][b1]))[0]
    stored = w0 - step_b1
    stored[:30] -= step_a1[:30]
    loads = w0 - step_b1
    loads[:30] = w0[:30] - step_a1[:30]
    # b2 completes third, on w0 − a's step: its serialized step is its own gradient.
    at = {name: np.linalg.norm(problem.grad(copy, int(trace["sample"][b2]))[0])
          for name, copy in (("stored", stored), ("loads", loads))}
    assert trace["s_norm"][b2] == pytest.approx(at["stored"], rel=1e-12)
    assert abs(at["stored"] - at["loads"]) > 1e-6
