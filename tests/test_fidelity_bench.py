"""bench/fidelity.py's split of its comparisons by where the host had each real run's CPUs."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "fidelity.py"


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("bench_fidelity", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(work: Path, name: str, before: float | None, after: float | None) -> None:
    """A run directory whose summary says only what the placement needs."""
    (work / name).mkdir(parents=True)
    latency = None if before is None else {"cpus": [0, 1], "before_ns": before,
                                           "after_ns": after}
    (work / name / "summary.json").write_text(json.dumps({"real": {"cpu_latency": latency}}))


def test_state_plans_calibrate_from_the_first_run_in_each_other_state(fidelity, tmp_path):
    """Seed 0 far: one more calibration from the first near run (not the changing one before
    it); k = 1 runs are not probed, so no state plan; the labels name count, state, seed."""
    for name, before, after in (("real1", None, None), ("real2", 170.0, 180.0),
                                ("real2.1", 40.0, 200.0), ("real2.2", 160.0, 155.0),
                                ("real2.3", 45.0, 50.0), ("real2.4", 30.0, 20.0)):
        _run(tmp_path, name, before, after)
    args = type("Args", (), {"calibrate": [1, 2], "repeats": 5})()
    plans = fidelity._state_plans(args, tmp_path)
    assert plans == [("2@near.3", [str(tmp_path / "real2.3"), "--pool"])]
    assert fidelity._plan_state(tmp_path, "2") == "far"
    assert fidelity._plan_state(tmp_path, "2@near.3") == "near"
    assert fidelity._plan_state(tmp_path, "1") is None  # one worker: no pair of CPUs probed
    assert fidelity._plan_state(tmp_path, "1+2") is None
    assert fidelity._state(tmp_path, 2, 1) == "changing"


def test_repeat_plans_calibrate_from_every_repeat_at_each_count(fidelity, tmp_path):
    """``--from-repeats``: one calibration per count from all its R runs, seed 0 first; a fit
    to several runs has no one placement."""
    args = type("Args", (), {"calibrate": [1, 2], "repeats": 3})()
    assert fidelity._repeat_plans(args, tmp_path) == [
        ("1x3", [str(tmp_path / "real1"), str(tmp_path / "real1.1"), str(tmp_path / "real1.2"),
                 "--pool"]),
        ("2x3", [str(tmp_path / "real2"), str(tmp_path / "real2.1"), str(tmp_path / "real2.2"),
                 "--pool"])]
    assert fidelity._plan_state(tmp_path, "2x3") is None


def test_state_tables_split_real_pairs_and_predictions_by_state(fidelity, capsys):
    """Real pairs go to near/near, far/far or across by their two states (changing runs left
    out); each prediction's comparisons to the near and the far real runs."""
    def cmp(gap, ks, rate):
        return {"gap": gap, "ks": ks, "rate_gap": rate}

    floors = {2: [{**cmp(0.04, 0.1, 0.1), "states": ["near", "near"]},
                  {**cmp(-0.25, 0.12, 0.05), "states": ["far", "near"]},
                  {**cmp(0.3, 0.15, 0.09), "states": ["near", "far"]},
                  {**cmp(0.5, 0.5, 0.5), "states": ["changing", "near"]}]}
    rows = [{"calibrated": "2", "calibration_state": "far", "predicted": 2,
             "sim_vs_real": [{**cmp(-0.01, 0.02, 0.03), "state": "far"},
                             {**cmp(0.2, 0.2, 0.1), "state": "near"},
                             {**cmp(0.9, 0.9, 0.9), "state": "changing"}]}]
    fidelity._state_tables(rows, floors)
    out = capsys.readouterr().out
    assert "| 2 | 1: 4.0%, 0.100, 0.100 | none | 2: 27.5% [25.0%–30.0%], 0.135 " \
        "[0.120–0.150], 0.070 [0.050–0.090] |" in out
    assert "| 2 | far | 2 | 1: 20.0%, 0.200, 0.100 | 1: 1.0%, 0.020, 0.030 |" in out
    assert "90.0%" not in out and "50.0%" not in out


def test_split_table_gives_the_medians_of_each_part_of_the_gap(fidelity, capsys):
    """Each part of the error-rate gap, and the shares and rates it comes from, as medians over
    the repeats' comparisons (a part a comparison lacks is left out of its median)."""
    def cmp(share, fresh, stale, parts):
        error_a, error_b = 0.7, 0.7 + sum(parts)
        return {"error_a": error_a, "error_b": error_b, "fresh_a": 0.25, "fresh_b": share,
                "fresh_error_a": 0.1, "fresh_error_b": fresh, "stale_error_a": 0.9,
                "stale_error_b": stale, **dict(zip(("from_fresh_share", "from_fresh_errors",
                                                    "from_stale_errors"), parts, strict=True))}

    rows = [{"calibrated": "1", "predicted": 2, "sim_vs_real": [
        cmp(0.15, 0.2, 0.95, (0.08, 0.015, 0.0425)), cmp(0.17, 0.3, 0.9, (0.064, 0.033, 0.0)),
        {**cmp(0.2, None, 0.9, (0.04, 0.0, 0.0)), "from_fresh_errors": None}]}]
    fidelity._split_table(rows)
    out = capsys.readouterr().out
    assert ("| 1 | 2 | 0.250 / 0.170 | 0.100 / 0.250 | 0.900 / 0.900 | +0.097 | +0.064 | "
            "+0.024 | +0.000 |") in out


def test_lag_table_pools_the_repeats_of_each_kind(fidelity, capsys, monkeypatch, tmp_path):
    """One row for the real runs at each k' and one per calibration, each pooling its runs
    over the repeats (seed 0's real run is realK, the others realK.R)."""
    pooled = []
    monkeypatch.setattr(fidelity.Trace, "load", staticmethod(lambda path: Path(path).parent.name))

    def lags(traces):
        pooled.append(traces)
        return None if traces[0].startswith("sim2") else {
            "pairs_per_update": 0.147, "lossy": 0.16, "median_lag": 0.27,
            "shares": [0.1, 0.9], "lossy_by_lag": [0.51, None]}

    monkeypatch.setattr(fidelity, "meeting_lags", lags)
    args = SimpleNamespace(predict=[2], repeats=2)
    fidelity._lag_table(args, tmp_path, [("1", []), ("2", [])])
    assert pooled == [["real2", "real2.1"], ["sim1_2.0", "sim1_2.1"], ["sim2_2.0", "sim2_2.1"]]
    out = capsys.readouterr().out
    assert "| real | 2 | 0.147 | 0.16 | 0.27 W | 0.10 / 0.90 | 0.51 / n/a |" in out
    assert "| calibrated at 2 | 2 | n/a | | | | |" in out


def test_offset_table_pools_the_repeats_of_each_kind(fidelity, capsys, monkeypatch, tmp_path):
    """One row for the real runs at each k' and one per calibration, each pooling its runs
    over the repeats; a kind without two workers' writes says n/a."""
    pooled = []
    monkeypatch.setattr(fidelity.Trace, "load", staticmethod(lambda path: Path(path).parent.name))

    def found(traces):
        pooled.append(traces)
        return None if traces[0].startswith("sim2") else {
            "shares": [0.25, 0.75], "next_over_now": [1.8, None], "end_gap": [0.01, 0.33]}

    monkeypatch.setattr(fidelity, "offsets", found)
    args = SimpleNamespace(predict=[2], repeats=2)
    fidelity._offset_table(args, tmp_path, [("1", []), ("2", [])])
    assert pooled == [["real2", "real2.1"], ["sim1_2.0", "sim1_2.1"], ["sim2_2.0", "sim2_2.1"]]
    out = capsys.readouterr().out
    assert "| real | 2 | 0.25 / 0.75 | 1.80 / n/a | 0.01 / 0.33 |" in out
    assert "| calibrated at 2 | 2 | n/a | | |" in out
