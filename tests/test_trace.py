"""Trace files: round trip, deterministic bytes, and corrupt input."""

import zipfile

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import TraceError
from simulator.trace import COLUMNS, Trace, read_report

from .conftest import scenario


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
