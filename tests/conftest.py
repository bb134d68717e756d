"""Shared helpers for the test suite."""

from __future__ import annotations

from simulator.scenario import Scenario, load_scenario


def scenario(*overrides: str) -> Scenario:
    """The default scenario with ``key=value`` overrides applied."""
    return load_scenario(None, list(overrides))


CONSTANT = ("timing.read.dist=constant", "timing.grad.dist=constant",
            "timing.write.dist=constant")
