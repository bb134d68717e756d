"""The error-injection sweep against Theorem 1's limit τ < cε/(2q)."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.errors import ScenarioError
from tests.conftest import scenario
from theory.injection import default_bounds, tau_sweep

SMALL = ("problem.name=quadratic", "problem.dim=4", "problem.n_samples=50",
         "run.protocol=serial", "run.updates=400")


def test_sweep_finds_the_break_above_the_theorem_limit():
    """Small errors keep ε, large ones do not; the theorem's limit lies below the empirical
    break (it is a sufficient condition), and τ grows with the injected norm."""
    result = tau_sweep(scenario(*SMALL), eps=0.02, seeds=2, bounds=[1e-4, 3e-3, 3.0],
                       pilot_seeds=1, max_updates=20_000)
    points = result["points"]
    assert [p["reached_eps"] for p in points] == [True, True, False]
    taus = [p["tau"] for p in points]
    assert taus == sorted(taus) and taus[0] > 0
    # The adversary's τ is b·‖w − w*‖ at its worst window: at most b·√a0 (plus rounding).
    assert taus[0] <= 1e-4 * result["a0"] ** 0.5 * 1.01
    assert result["breaking_tau"] == taus[2] and result["breaking_tau"] > result["tau_limit"]
    assert result["conservatism"] == pytest.approx(taus[2] / result["tau_limit"])
    assert "stops between" in result["verdict"]


def test_default_bounds_straddle_the_limit():
    bounds = default_bounds(0.01, 4.0, 9)
    assert len(bounds) == 9 and bounds[0] == pytest.approx(0.0005)
    assert bounds[-1] == pytest.approx(5.0) and bounds == sorted(bounds)


def test_nonconvex_problem_gets_no_sweep():
    result = tau_sweep(scenario("problem.name=mlp", "problem.dim=4", "problem.hidden=3",
                                "problem.n_samples=30"), eps=0.1, seeds=2)
    assert result["verdict"].startswith("no sweep: f is not strongly convex")
    assert result["points"] == []


def test_cli_writes_json_and_png_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "ts"
    assert main(["tausweep", "--eps", "0.02", "--seeds", "2", "--bounds", "1e-4,3",
                 "--pilot-seeds", "1", "--out", str(out), "--quiet",
                 *(f"--set={o}" for o in SMALL)]) == 0
    result = json.loads((out / "tausweep.json").read_text())
    assert [p["reached_eps"] for p in result["points"]] == [True, False]
    assert (out / "tausweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad, field in ((["--bounds", "0,1"], "--bounds = 0.0"),
                       (["--bounds", "a,b"], "--bounds = 'a,b'"),
                       (["--seeds", "1"], "--seeds = 1"), (["--eps", "-1"], "eps = -1.0")):
        args = ["tausweep", "--eps", "0.02", "--out", str(tmp_path / "bad"), *bad]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and field in err[0], err
        assert not (tmp_path / "bad").exists()
    with pytest.raises(ScenarioError):
        tau_sweep(scenario(*SMALL), eps=0.02, horizon=0)
