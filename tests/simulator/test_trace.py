"""Trace files: round trip, deterministic bytes, and corrupt input."""

import zipfile

import numpy as np
import pytest

from realrun.timeline import WorkerRecord, merge
from simulator.engine import simulate
from simulator.errors import TraceError
from simulator.trace import COLUMNS, CURVE, RECORD, Trace, TraceBuilder, read_report
from tests.conftest import scenario


def _curve() -> dict[str, np.ndarray]:
    return {name: np.zeros(1, dtype=dtype) for name, dtype in CURVE.items()}


@pytest.fixture(scope="module")
def trace():
    return simulate(scenario("run.updates=200", "run.blocks=2"))


def test_round_trip_keeps_every_array(trace, tmp_path):
    """save then load gives back the same arrays, scenario text and source."""
    trace.save(tmp_path / "t.npz")
    loaded = Trace.load(tmp_path / "t.npz")
    assert loaded.scenario_toml == trace.scenario_toml and loaded.source == trace.source
    assert set(loaded.arrays) == set(trace.arrays)
    for name, array in trace.arrays.items():
        assert np.array_equal(loaded[name], array, equal_nan=array.dtype.kind == "f")


def test_saved_bytes_are_deterministic(trace, tmp_path):
    """Saving the same trace twice gives identical files (no timestamps inside)."""
    trace.save(tmp_path / "a.npz")
    trace.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_file_has_no_pickled_objects(trace, tmp_path):
    """numpy reads it with allow_pickle=False."""
    trace.save(tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz", allow_pickle=False) as data:
        assert "uid" in data.files and str(data["scenario"]).startswith("#")


def _rewrite(src, dst, drop=(), replace=None):
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for item in a.namelist():
            if item in drop:
                continue
            b.writestr(item, replace[1] if replace and item == replace[0] else a.read(item))


@pytest.mark.parametrize("damage", ["missing", "text", "truncated", "no_column", "bad_dtype",
                                    "wrong_schema"])
def test_corrupt_traces_are_trace_errors(trace, tmp_path, damage):
    """Every kind of damage is one TraceError, never a traceback from numpy or zipfile."""
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    trace.save(good)
    if damage == "text":
        bad.write_text("not a trace")
    elif damage == "truncated":
        bad.write_bytes(good.read_bytes()[:2000])
    elif damage == "no_column":
        _rewrite(good, bad, drop=("staleness.npy",))
    elif damage == "bad_dtype":
        other = tmp_path / "x.npy"
        np.save(other, np.zeros(len(trace), dtype=np.float32))
        _rewrite(good, bad, replace=("staleness.npy", other.read_bytes()))
    elif damage == "wrong_schema":
        other = tmp_path / "x.npy"
        np.save(other, np.array(99))
        _rewrite(good, bad, replace=("schema.npy", other.read_bytes()))
    with pytest.raises(TraceError):
        Trace.load(bad)


def test_read_report_on_a_hand_built_timeline():
    """Two blocks; stores end at u0: b0 30, b1 40; u1: b0 60, b1 70 (the others store
    nothing). u1 copies b0 at 15 (before any store) and b1 at 45 (after u0's store at 40):
    copies valid over (−∞, 30) and [40, 70) never meet, so torn, and one block overwritten.
    u2 reads from 32: b0's store at 30 came before its start, b1's at 40 after it; [30, 60)
    and [40, 70) meet. u3 starts at 40 and copies b1 at 70: stores at the same instants count
    as before its start and after its copy. u4 reads b1 alone: overwritten, never torn."""
    read_start = np.array([0, 5, 32, 40, 0])
    op_row = np.array([0, 0, 1, 1, 2, 2, 3, 4])
    op_block = np.array([0, 1, 0, 1, 0, 1, 1, 1])
    copy_at = np.array([10, 20, 15, 45, 34, 50, 70, 45])
    store_at = np.array([30, 40, 60, 70, -1, -1, -1, -1])
    overwrites, torn = read_report(read_start, op_row, op_block, copy_at, store_at)
    assert overwrites.tolist() == [0, 1, 1, 0, 1]
    assert torn.tolist() == [False, True, False, False, False]
    assert overwrites.dtype == np.int32 and torn.dtype == bool


def test_read_report_matches_the_simulated_trace(trace):
    """The engine's columns are the report of its own copy and store ends: with unlimited
    cores every block's copy ends at its read start plus its reads so far, every store at its
    write start plus its writes so far."""
    rows = np.repeat(np.arange(len(trace)), np.diff(trace["op_offsets"]))
    first = trace["op_offsets"][:-1][rows]

    def ends(start, durations):
        total = np.cumsum(durations)
        return start[rows] + total - np.concatenate([[0], total])[first]

    overwrites, torn = read_report(trace["read_start"], rows, trace["op_block"],
                                   ends(trace["read_start"], trace["op_read_ns"]),
                                   ends(trace["write_start"], trace["op_write_ns"]))
    assert np.array_equal(overwrites, trace["read_overwrites"])
    assert np.array_equal(torn, trace["torn"]) and trace["read_overwrites"].any()


def test_to_pandas_gives_the_rows_ops_and_curve_of_the_arrays(trace):
    """One frame row per gradient, per block operation (with its update's row and uid) and
    per curve point, holding exactly the trace's values."""
    frames = trace.to_pandas()
    assert list(frames.rows.columns) == list(COLUMNS) and len(frames.rows) == len(trace)
    for name in COLUMNS:
        assert np.array_equal(frames.rows[name].to_numpy(), trace[name])
    for row in (0, len(trace) // 2, len(trace) - 1):
        ops = frames.ops[frames.ops["row"] == row]
        assert np.array_equal(ops["block"].to_numpy(), trace["op_block"][trace.ops_of(row)])
        assert set(ops["uid"]) == {trace["uid"][row]}
    assert len(frames.ops) == trace["op_block"].size
    assert np.array_equal(frames.curve["loss"].to_numpy(), trace["curve_loss"])
    assert list(frames.curve.columns) == ["t", "time", "loss", "dist2", "n"]


def _builder_example() -> TraceBuilder:
    """Two blocks, four gradients (times in ns; ``RECORD`` order). u0 (thread 0) reads from
    0, copies b0 at 10 and b1 at 20, stores them at 30 and 40: completion 1. u1 (thread 1)
    reads from 5 with nothing completed, copies b0 at 15 and b1 at 45 (after u0's store at
    40), stores at 60 and 70 (overwriting u0's store to b0): completion 2. u2 (thread 0)
    reads from 42 after completion 1, copies at 50 and 55, and is discarded once completion
    2 happened. u3 (thread 1) reads b0 alone from 72 after completion 2, with an injected
    delay of 2, and stores it at 90: completion 3."""
    builder = TraceBuilder()
    nan = float("nan")
    for uid, thread, seq, step, (rs, re, ws, we), seen, completed, overwrote, delay, ops in (
            (0, 0, 0, 1, (0, 20, 25, 40), 0, 1, 0, 0, [(0, 10, 30), (1, 20, 40)]),
            (1, 1, 0, 2, (5, 45, 50, 70), 0, 2, 1, 0, [(0, 15, 60), (1, 45, 70)]),
            (2, 0, 1, 0, (42, 55, 58, 58), 1, 2, 0, 0, [(0, 50, -1), (1, 55, -1)]),
            (3, 1, 1, 3, (72, 80, 85, 90), 2, 3, 0, 2, [(0, 80, 90)])):
        builder.add((uid, thread, seq, 7, step, rs, re, re, ws, ws, we, ws - re, 0, seen,
                     completed, overwrote, delay, 0.0, False, 1.0, False, nan, nan, nan, nan),
                    [op[0] for op in ops], [1] * len(ops), [1] * len(ops),
                    [op[1] for op in ops], [op[2] for op in ops])
    return builder


def test_builder_derives_the_columns_of_a_hand_built_run():
    """Staleness = completions before its own (or its discard) − those before its read + τ:
    u0 0, u1 1 (u0's), u2 1 (u1's, then discarded), u3 2 (none, plus τ = 2). u1's copy of
    b1 came after u0's store to it (overwritten; its copies never met: torn); u0's store to
    b0 was lost to u1's."""
    trace = _builder_example().build("", np.zeros(2), np.ones(2), _curve(), lost=[1, 0, 0, 0],
                                     extras={"marks": np.arange(3)})
    log = {name: trace[name].tolist() for name in ("step", "staleness", "read_overwrites",
                                                   "torn", "lost_blocks", "overwrote",
                                                   "op_offsets", "op_block", "extra_marks")}
    assert log == {"step": [1, 2, 0, 3], "staleness": [0, 1, 1, 2],
                   "read_overwrites": [0, 1, 0, 0], "torn": [False, True, False, False],
                   "lost_blocks": [1, 0, 0, 0], "overwrote": [0, 1, 0, 0],
                   "op_offsets": [0, 2, 4, 6, 7], "op_block": [0, 1, 0, 1, 0, 1, 0],
                   "extra_marks": [0, 1, 2]}
    assert trace.source == "simulated" and trace["staleness"].dtype == COLUMNS["staleness"]


def test_builder_takes_columns_as_it_takes_records():
    """``extend`` with the same records as columns builds the same trace as ``add``."""
    one = _builder_example()
    records = {name: [row[i] for row in one.rows] for i, name in enumerate(RECORD)}
    ops = {"block": [0, 1, 0, 1, 0, 1, 0], "read_ns": [1] * 7, "write_ns": [1] * 7,
           "copied": [10, 20, 15, 45, 50, 55, 80], "stored": [30, 40, 60, 70, -1, -1, 90]}
    other = TraceBuilder()
    other.extend(records, [2, 2, 2, 1], ops)
    a, b = (x.build("", np.zeros(2), np.ones(2), _curve()) for x in (one, other))
    for name, array in a.arrays.items():
        assert np.array_equal(b[name], array, equal_nan=True), name


def test_what_workers_do_not_count_is_taken_from_the_times():
    """Workers count no completions and time no local work (``seen``, ``idle_ns`` −1): the
    real merge's staleness counts the writes that ended by the read's start, its idle time
    runs from the worker's previous write end (or the first read). Worker 0: a reads from 0
    (copy 10, store 30), b from 40 (50, 100); worker 1: c from 5 (15, 35), d from 32 (copy
    70, after c's store at 35: overwritten; store 110). In completion order a, c, b, d: d
    read after a's write only, then c and b completed before its own; d began before its
    worker's previous write ended (idle 0)."""
    def worker(*updates):
        times = np.array([[u[0], u[1], u[1] + 5, u[2]] for u in updates]) + 100
        return WorkerRecord(times, times[:, 1:2].copy(), times[:, 3:4].copy(),
                            np.arange(len(updates)))

    trace, _ = merge([worker((0, 10, 30), (40, 50, 100)), worker((5, 15, 35), (32, 70, 110))],
                     np.zeros(2), np.ones(2), [(0, 100, 1.0, 1.0)], "")
    log = {name: trace[name].tolist() for name in ("thread", "step", "read_start", "idle_ns",
                                                   "staleness", "read_overwrites")}
    assert log == {"thread": [0, 1, 0, 1], "step": [1, 2, 3, 4],
                   "read_start": [0, 5, 40, 32], "idle_ns": [0, 5, 10, 0],
                   "staleness": [0, 1, 0, 2], "read_overwrites": [0, 0, 0, 1]}


def test_every_backend_builds_its_trace_through_the_one_builder(monkeypatch):
    """The engine, the schedule explorer, the real workers' merge and the parameter server
    each derive staleness and read-overwrites with the builder's one function of each."""
    import datetime

    from realrun.ps import _Push, _push, _Server
    from realrun.ps import _trace as ps_trace
    from simulator import trace as trace_module
    from simulator.problems import make_problem
    from simulator.schedule import Scheduler, run_schedule
    from simulator.view import SerializedView

    calls = []
    for name in ("staleness", "read_report"):
        original = getattr(trace_module, name)
        monkeypatch.setattr(trace_module, name, lambda *a, _o=original, _n=name: (
            calls.append(_n), _o(*a))[1])
    s = scenario("run.updates=12", "problem.dim=6", "run.blocks=2")
    traces = {"engine": simulate(s),
              "schedule": run_schedule(s, lambda k: Scheduler("random", k)).trace,
              "timeline": merge([WorkerRecord(np.array([[0, 1, 2, 3]]), np.array([[1]]),
                                              np.array([[3]]), np.array([5]))],
                                np.zeros(6), np.ones(6), [(0, 0, 1.0, 1.0)], "")[0]}
    problem = make_problem(s.problem)
    w0 = problem.initial()
    state = _Server(problem, s, 2, np.dtype("float64"), w0.copy(),
                    SerializedView(problem, s.run.lr, w0, 2, False, 1, 10),
                    datetime.timedelta(seconds=1), busy=[0, 0], count=[0, 0])
    for thread in (0, 1):  # both read version 0: the second push applied is 1 stale
        _push(state, _Push(thread, 0, [thread], 10 + thread, 20, 30, [5], 0, np.zeros(6)))
    traces["ps"] = ps_trace(state, 0)
    assert calls == ["staleness", "read_report"] * 4
    assert traces["ps"]["staleness"].tolist() == [0, 1]
    assert traces["ps"]["idle_ns"].tolist() == [0, 1]  # from time 0, its first read
    assert [t.source for t in traces.values()] == ["simulated", "scheduled", "real", "real"]
