"""Calibration recovers known timing distributions from simulated traces."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.calibrate import calibrate, fit_durations
from simulator.cli import main
from simulator.compare import compare_runs
from simulator.scenario import load_scenario


def _source(tmp_path, *overrides):
    out = tmp_path / "source"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=3000",
                 "--set", "run.threads=2",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return out


@pytest.mark.parametrize("family", ["lognormal", "gamma"])
def test_recovers_known_distributions_within_ten_percent(tmp_path, family):
    timing = {"read": (2000, 0.3), "grad": (6000, 0.5), "write": (3000, 0.25)}
    run = _source(tmp_path, "run.blocks=4", *(
        f"timing.{op}={{dist='{family}', mean={m}, cv={cv}}}" for op, (m, cv) in timing.items()))
    scenario, report = calibrate(run)
    assert [d.name for d in scenario.devices] == ["worker0", "worker1"]
    for device in scenario.devices:
        assert device.timing is not None
        for op, (mean, cv) in timing.items():
            fitted = getattr(device.timing, op)
            assert fitted.dist == family, (op, report["fits"])
            assert fitted.mean == pytest.approx(mean, rel=0.1)
            assert fitted.cv == pytest.approx(cv, rel=0.1)


def test_sparse_blocks_are_scaled_by_the_support_they_move(tmp_path):
    run = _source(tmp_path, "problem.name=sparse_logistic", "problem.dim=200",
                  "problem.density=0.05", "run.blocks=5",
                  "timing.read={dist='lognormal', mean=4000, cv=0.2}")
    scenario, _ = calibrate(run)
    assert scenario.devices[0].timing.read.mean == pytest.approx(4000, rel=0.1)


def test_neither_family_fits_a_bimodal_sample():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(1000, 30, 800), rng.normal(5000, 100, 800)])
    fit = fit_durations(values)
    assert fit.duration.dist == "empirical" and len(fit.duration.values) == 512
    assert fit.duration.mean == pytest.approx(values.mean(), rel=0.01)
    assert all(c["p"] < 0.01 for c in fit.candidates.values())
    assert fit_durations(np.full(10, 700.0)).duration.dist == "constant"


def test_calibrated_scenario_reproduces_the_run(tmp_path):
    """Simulate, calibrate, simulate the calibrated scenario: the staleness distribution and
    error rate of the original come back (KS distance small)."""
    run = _source(tmp_path)
    out = tmp_path / "calibrated.toml"
    assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 0
    text = out.read_text()
    assert text.startswith("# asyngrad-lab calibrated scenario") and "worker 1 grad" in text
    scenario = load_scenario(out)
    assert scenario.name == "default-calibrated"
    assert main(["simulate", str(out), "--out", str(tmp_path / "again"), "--quiet",
                 "--set", "run.seed=7"]) == 0
    report = compare_runs(run, tmp_path / "again")
    assert report["staleness"]["ks_distance"] < 0.05
    assert report["staleness"]["relative_mean_gap"] < 0.05
    assert report["gradient_error"]["rate_gap"] < 0.05


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path, capsys):
    keep = tmp_path / "mine.toml"
    keep.write_text("precious = true\n")
    run = _source(tmp_path)
    for args, needle in ((["calibrate", str(tmp_path / "nope"), "--out", str(tmp_path / "x")],
                          "not a run directory"),
                         (["calibrate", str(run), "--out", str(keep)],
                          "is not a calibrated scenario")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
    assert keep.read_text() == "precious = true\n"
    assert not (tmp_path / "x").exists()


def test_pooled_calibration_shares_cores_between_threads(tmp_path):
    run = _source(tmp_path)
    scenario, report = calibrate(run, pool=True, cores=2)
    assert len(scenario.devices) == 1 and scenario.devices[0].cores == 2
    assert list(report["fits"]) == ["all workers"]
    assert scenario.devices[0].timing.grad.mean == pytest.approx(6000, rel=0.1)


def test_idle_time_between_updates_is_simulated_and_recovered(tmp_path):
    """Local work before each update lengthens the cycle but not the read-to-write window,
    so it lowers staleness; calibration recovers it."""
    busy = _source(tmp_path, "timing.idle={dist='gamma', mean=3000, cv=0.4}")
    scenario, _ = calibrate(busy)
    idle = scenario.devices[0].timing.idle
    assert idle.dist == "gamma" and idle.mean == pytest.approx(3000, rel=0.1)
    report = compare_runs(tmp_path / "source", busy)  # itself: zero distance
    assert report["staleness"]["ks_distance"] == 0
    plain = tmp_path / "plain"
    assert main(["simulate", "--out", str(plain), "--quiet", "--set", "run.updates=3000",
                 "--set", "run.threads=2"]) == 0
    gap = compare_runs(plain, busy)["staleness"]
    assert gap["mean_b"] < 0.8 * gap["mean_a"]
