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
