"""`asyngrad compare`: fidelity of one run against another."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.compare import compare_runs
from simulator.errors import AsyngradError


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, threads in (("a", 8), ("b", 8), ("c", 2)):
        assert main(["simulate", "--out", str(root / name), "--quiet", "--set",
                     "run.updates=600", "--set", f"run.threads={threads}"]) == 0
    assert main(["simulate", "--out", str(root / "other"), "--quiet", "--set",
                 "run.updates=100", "--set", "problem.dim=20"]) == 0
    return root


def test_identical_runs_have_zero_distances(runs):
    report = compare_runs(runs / "a", runs / "b")
    assert report["staleness"]["ks_distance"] == 0.0
    assert report["staleness"]["relative_mean_gap"] == 0.0
    assert report["gradient_error"]["rate_gap"] == 0.0
    assert report["loss"]["final_ratio"] == 1.0
    assert report["loss"]["max_abs_log10_ratio"] == 0.0
    assert report["throughput"]["ratio"] == 1.0


def test_different_runs_are_told_apart(runs):
    report = compare_runs(runs / "a", runs / "c")
    st = report["staleness"]
    assert st["mean_a"] > 5 and st["mean_b"] < 2 and st["ks_distance"] > 0.8
    assert report["overwrites"]["a"]["lost_blocks_per_update"] > (
        report["overwrites"]["b"]["lost_blocks_per_update"])


def test_cli_writes_report_and_figure(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "a"), str(runs / "c"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "KS distance" in text and "final suboptimality" in text
    report = json.loads((out / "compare.json").read_text())
    assert report["a"]["updates"] == 600
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case", ["missing", "not_a_run", "mismatch"])
def test_bad_or_mismatched_runs_are_one_line(runs, tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    b = {"missing": tmp_path / "nope", "not_a_run": tmp_path / "empty",
         "mismatch": runs / "other"}[case]
    assert main(["compare", str(runs / "a"), str(b), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(b) in err[0]
    assert not (tmp_path / "o").exists()
    if case == "mismatch":
        assert "different problems" in err[0] and "dim: 100 vs 20" in err[0]
    with pytest.raises(AsyngradError):
        compare_runs(runs / "a", b)
