"""The ``[hardware.*]`` tables: each switches one model on, the default shows none, and the
old keys (files written by ``asyngrad calibrate`` before the tables) still load and run as
they did."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.scenario import (
    HardwareSpec,
    Scenario,
    load_scenario,
    scenario_from_dict,
    scenario_to_dict,
    scenario_to_toml,
)
from simulator.scenario.legacy import upgrade

DATA = Path(__file__).parents[2] / "data"
BASE = ("run.threads=3", "run.updates=600", "problem.dim=40")

# Each model: its old keys and the same values in its table.
MODELS = [
    ("convoys", ("timing.convoy_join=1.5", "timing.convoy_rest=2.0",
                 "timing.convoy_lost_leader=0.1", "timing.convoy_end_gap=0.2"),
     ("hardware.convoys.join=1.5", "hardware.convoys.rest=2.0",
      "hardware.convoys.lost_leader=0.1", "hardware.convoys.end_gap=0.2")),
    ("passing", ("timing.convoy_lost_leader=0.1", "timing.convoy_lost_pairs=0.5"),
     ("hardware.passing.lost_leader=0.1", "hardware.passing.lost_pairs=0.5")),
    ("common", ("timing.read_common=0.5", "timing.write_common=0.3", "timing.common_ns=5000"),
     ("hardware.common.read=0.5", "hardware.common.write=0.3", "hardware.common.ns=5000")),
    ("interference", ("timing.write_under_read=0.5", "timing.read_under_write=0.2"),
     ("hardware.interference.write_under_read=0.5",
      "hardware.interference.read_under_write=0.2")),
    ("shared_lines", ("timing.write_shared=2.5",), ("hardware.shared_lines.factor=2.5",)),
    ("sweeping_reads", ("run.read_view=sweep", "timing.write_sweep_lead=300"),
     ("hardware.sweeping_reads.lead=300",)),
    ("time_slices", ("devices.0.cores=2", "devices.0.quantum=100000",
                     "devices.0.slicing=per_core", "devices.0.preempt=true"),
     ("devices.0.cores=2", "hardware.time_slices.quantum=100000",
      "hardware.time_slices.slicing=per_core", "hardware.time_slices.preempt=true")),
    ("episodes", ("devices.0.slow_factor=1.7", "devices.0.slow_ns=100000",
                  "devices.0.fast_ns=200000"),
     ("hardware.episodes.factor=1.7", "hardware.episodes.slow_ns=100000",
      "hardware.episodes.fast_ns=200000")),
]


def _load(*overrides: str) -> Scenario:
    return load_scenario(None, [*BASE, *overrides])


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_default_scenario_switches_no_model_on():
    """The resolved default has no hardware table, and its timing only durations and
    contention."""
    text = scenario_to_toml(Scenario())
    assert "hardware" not in text
    assert Scenario().hardware == HardwareSpec()
    timing = text.split("[timing]\n")[1].split("\n\n")[0].splitlines()
    assert [line.split(" = ")[0] for line in timing] == [
        "read", "grad", "write", "idle", "read_per_thread", "grad_per_thread",
        "write_per_thread", "idle_per_thread"]


@pytest.mark.parametrize(("table", "old", "new"), MODELS, ids=[m[0] for m in MODELS])
def test_a_table_and_the_old_keys_run_the_same(table, old, new):
    """The table the old keys move to, and the run it gives, are those of the new keys; the
    model changes the run (it is on)."""
    before, after = _load(*old), _load(*new)
    assert getattr(before.hardware_of(0), table) is not None
    assert before.hardware_of(0) == after.hardware_of(0)
    traces = [simulate(s) for s in (before, after, _load(*old[:1] if table == "time_slices"
                                                            else ()))]
    assert _same(traces[0].arrays, traces[1].arrays)
    assert not _same(traces[0].arrays, traces[2].arrays)


def test_a_file_calibrate_wrote_before_the_tables_runs_as_it_did():
    """A calibrated file with every model on (written with the old keys) loads into the
    tables, and its run is the run the code of that time made: every array but the values
    of w bit for bit (digests recorded then), those values to rounding (recorded with that
    code, 9f7e973; their last bits follow the CPU's BLAS kernel, e.g. OpenBLAS's Haswell
    and SkylakeX dot products add in other orders); written out and read back in the new
    layout, it runs the same."""
    scenario = load_scenario(DATA / "legacy_calibrated.toml", ["run.updates=1500"])
    hardware = scenario.hardware_of(0)
    assert all(getattr(hardware, t) is not None for t in (
        "convoys", "interference", "shared_lines", "sweeping_reads", "time_slices",
        "episodes"))
    trace = simulate(scenario)
    values = np.load(DATA / "legacy_calibrated_values.npz")
    digests = {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:16]
               for k, v in trace.arrays.items() if k not in values}
    assert digests == json.loads((DATA / "legacy_calibrated_trace.json").read_text())
    for name in values:
        np.testing.assert_allclose(trace[name], values[name], rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    again = scenario_from_dict(scenario_to_dict(scenario))
    assert again == scenario and _same(simulate(again).arrays, trace.arrays)


def test_old_values_without_effect_are_dropped_and_bad_ones_name_the_old_key():
    assert _load("timing.convoy_lost_pairs=0.5", "timing.write_shared=1.0",
                 "timing.read_common=0.0").hardware == HardwareSpec()
    with pytest.raises(ScenarioError, match=r"timing\.write_sweep_tail = -5"):
        _load("timing.write_sweep_tail=-5")
    with pytest.raises(ScenarioError, match=r"devices\.0\.slicing"):
        _load("devices.0.slicing=random")
    with pytest.raises(ScenarioError, match=r"run\.read_view"):
        _load("run.read_view=halfway")


def test_data_without_old_keys_is_left_as_it_is():
    data = scenario_to_dict(_load(*MODELS[0][2]))
    assert upgrade(data) is data


def test_a_device_table_takes_the_place_of_the_scenario_one():
    """``[devices.hardware]`` replaces the same table of ``[hardware]`` for that device and
    keeps the others; convoys and passing writes cannot both be on."""
    s = load_scenario(None, [*BASE, "devices=[{name='a'}, {name='b'}]",
                             "hardware.shared_lines.factor=2.0",
                             "hardware.interference.write_under_write=0.5",
                             "devices.1.hardware.shared_lines.factor=3.0"])
    assert s.hardware_of(0).shared_lines.factor == 2.0
    assert s.hardware_of(1).shared_lines.factor == 3.0
    assert s.hardware_of(1).interference == s.hardware_of(0).interference
    with pytest.raises(ScenarioError, match="passing"):
        _load("hardware.convoys.join=1.0", "hardware.passing.lost_leader=0.1")


def test_an_old_device_timing_switches_off_what_it_did_not_set():
    """A device whose old [timing] left out a model the scenario's timing switched on gets
    the neutral table: the model stays off on that device, as before."""
    s = load_scenario(None, [*BASE, "timing.write_under_write=0.5",
                             "devices=[{name='a'}, {name='b', timing={write_under_read=0.0}}]"])
    assert s.hardware_of(0).interference.slowdowns is not None
    assert s.hardware_of(1).interference.slowdowns is None
