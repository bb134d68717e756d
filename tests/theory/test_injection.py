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


SERIAL = ("problem.name=quadratic", "problem.dim=10", "problem.n_samples=100",
          "run.protocol=serial", "run.threads=1", "run.updates=300")


def test_short_runs_measure_tau_in_fewer_windows():
    """ε so loose that t of (10) is a few updates: τ is measured in as many windows as the
    short runs allow (``window_count``), not refused for empty windows."""
    result = tau_sweep(scenario(*SERIAL), eps=1.0, seeds=2, points=2, pilot_seeds=1)
    assert result["ran_updates"] < 20 and len(result["points"]) == 2
    assert all(p["tau"] >= 0 for p in result["points"])


def test_a_diverging_pilot_is_a_result_not_an_input_error(tmp_path, capsys):
    """A pilot run that diverges at the scenario's lr: no sweep, said as such (exit 0 and
    tausweep.json written, as check does for no guarantee), not 'kappa2 = nan'."""
    result = tau_sweep(scenario(*SERIAL, "run.lr=5"), eps=1.0, seeds=2, pilot_seeds=1)
    assert result["points"] == [] and "gamma" not in result
    assert result["verdict"].startswith("no sweep: κ² and τ cannot be measured, pilot run 1 "
                                        "of 1 diverged at update")
    out = tmp_path / "ts"
    assert main(["tausweep", "--eps", "1", "--seeds", "2", "--pilot-seeds", "1", "--out",
                 str(out), *(f"--set={o}" for o in (*SERIAL, "run.lr=5"))]) == 0
    assert "diverged" in capsys.readouterr().out and (out / "tausweep.json").exists()


def test_an_error_that_diverges_is_said_and_written_as_strict_json(tmp_path, capsys):
    """An injected error large enough to diverge has no τ: its point says which run
    diverged, the verdict names it, tausweep.json holds no NaN (it held NaN and inf, and
    printing the table crashed on the missing values), and numpy prints no warning."""
    out = tmp_path / "ts"
    assert main(["tausweep", "--eps", "0.01", "--seeds", "2", "--bounds", "0.001,1e300",
                 "--out", str(out), *(f"--set={o}" for o in SERIAL)]) == 0
    printed = capsys.readouterr()
    assert "1e+300 | diverged | n/a | no" in printed.out and printed.err == ""
    result = json.loads((out / "tausweep.json").read_text(),
                        parse_constant=lambda name: pytest.fail(f"{name} in tausweep.json"))
    ok, blown = result["points"]
    assert ok["reached_eps"] and blown["diverged"].startswith("run 1 of 2 diverged")
    assert blown["tau"] is None and result["breaking_tau"] is None
    assert "the next error, of norm 1e+300, diverged" in result["verdict"]
    with pytest.raises(ScenarioError, match=r"--points = 100000000: must be <= 1000"):
        tau_sweep(scenario(*SERIAL), eps=0.01, points=100_000_000)


def test_a_minibatch_sweep_is_read_after_its_updates_of_w():
    """t (10) counts updates of w: each point's runs compute four gradients per update of a
    minibatch of 4 and are read at the sweep's count (they ran that many gradients, a
    quarter of the updates)."""
    result = tau_sweep(scenario(*SERIAL, "run.protocol=minibatch", "run.threads=4",
                                "run.updates=400"), eps=0.5, seeds=2, bounds=[1e-3])
    point = result["points"][0]
    assert 0.9 * result["ran_updates"] <= point["final_at"] <= result["ran_updates"]


def test_a_scenario_with_its_own_error_is_refused():
    """The adversarial error replaces the scenario's inject.error, so one that sets its own
    is refused with the field named, before any run."""
    with pytest.raises(ScenarioError, match=r"^inject\.error = 'noise': tausweep injects"):
        tau_sweep(scenario(*SERIAL, "inject.error=noise", "inject.error_bound=0.1"), eps=1.0)
