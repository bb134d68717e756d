"""Shared helpers for the test suite."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.engine import simulate
from simulator.replay import replay
from simulator.scenario import Scenario, load_scenario
from simulator.trace import Trace


def scenario(*overrides: str) -> Scenario:
    """The default scenario with ``key=value`` overrides applied."""
    return load_scenario(None, list(overrides))


def one_worker_run(where: Path) -> Path:
    """A small simulated run of one thread in ``where`` (nothing between workers to fit)."""
    from simulator.cli import main

    assert main(["simulate", "--out", str(where), "--quiet", "--set", "run.threads=1",
                 "--set", "run.updates=500", "--set", "metrics.exact=false"]) == 0
    return where


def check_fit_choice(run: Path, tmp_path: Path, choice: str, value: str, comment: str) -> None:
    """A calibrate fit chosen by ``--{choice}``: off unless asked for, written as a comment
    of the calibrated scenario when asked on the command line, and refused (with the reason)
    for a one-worker run."""
    from simulator.calibrate import calibrate
    from simulator.cli import main

    _, report_off = calibrate(run, pool=True)
    assert report_off[choice]["why"] == f"--{choice} off"
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(run), "--pool", f"--{choice}", value, "--out", str(out),
                 "--quiet"]) == 0
    assert comment in out.read_text()
    _, report_alone = calibrate(one_worker_run(tmp_path / "alone"), **{choice: "on"})
    assert report_alone[choice]["fields"] is None
    assert "two workers" in report_alone[choice]["why"]


CONSTANT = ("timing.read.dist=constant", "timing.grad.dist=constant",
            "timing.write.dist=constant")


def same_every_way(sc: Scenario) -> Trace:
    """Simulate ``sc`` twice, without lookahead and replayed: all four traces bit for bit the
    same (the determinism promise). Returns the first."""
    first, second = simulate(sc), simulate(sc)
    slow = simulate(sc, lookahead=False)
    _, _, replayed = replay(first)
    for other in (second, slow, replayed):
        for name, values in first.arrays.items():
            assert np.array_equal(values, other.arrays[name]), name
    return first
