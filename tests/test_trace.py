"""Trace files: round trip, deterministic bytes, and corrupt input."""

import zipfile

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import TraceError
from simulator.trace import Trace

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
