"""Common factors fitted to a run's rhythm (``calibrate --common rhythm``).

With ``common = "rhythm"`` the pair bins (:mod:`simulator.fidelity.common`) give τ only and
one c for every phase is chosen so that the calibrated scenario, simulated at the run's
worker count and seed (at most 20,000 updates, exact metrics off), keeps the run's rhythm:
its staleness over the independent-phase value (:func:`simulator.metrics.rhythm`) equals the
run's (bisection on c in [0, 0.999], 10 steps; several runs: the mean over their worker
counts; none when the runs' coupling is 0.95 or more, sampling noise around independence).
The pair correlations measure how alike two concurrent phases are, not what holds real
workers in step; this targets the latter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from simulator.fidelity.common import COMMON_FIELDS, with_common
from simulator.metrics import trace_rhythm
from simulator.problems import Problem, make_problem
from simulator.scenario import Scenario

# A run whose staleness is below this share of the independent-phase value kept a common
# rhythm (said in the report; fitted by --common rhythm): above it, sampling noise.
RHYTHM_NOTE = 0.95


# calibrate --common rhythm: the largest c tried, bisection steps, longest fitting run.
RHYTHM_HIGH = 0.999


_RHYTHM_STEPS = 10


_RHYTHM_UPDATES = 20_000


def fit_rhythm(scenario: Scenario, targets: list[tuple[int, int, float | None]],
               bins: dict[str, Any]) -> dict[str, Any]:
    """Common factors that give the recorded runs' rhythm (``calibrate --common rhythm``).

    ``targets``: (workers, updates, coupling) of each run; ``bins``: :func:`fit_common`'s
    report in ``on`` mode, whose τ is kept. One c for every phase, chosen by bisection so
    that ``scenario`` simulated at each run's worker count gives the runs' mean coupling.
    Returns a report like :func:`fit_common`'s, with the bisection's steps (``to_rhythm``
    marks it as this fit's, fields or none)."""
    report: dict[str, Any] = {"fields": None, "bins": bins.get("bins"), "to_rhythm": True}
    wanted = [t for t in targets if t[2] is not None]
    if not wanted:
        report["why"] = "fewer than two workers ran together"
        return report
    if "common_ns" not in bins:
        report["why"] = bins.get("why", "no offset bins to measure τ")
        return report
    tau = float(bins["common_ns"])
    goal = float(np.mean([coupling for _, _, coupling in wanted]))
    problem = make_problem(scenario.problem)
    steps: list[tuple[float, float]] = []

    def coupling_at(c: float) -> float:
        steps.append((c, _simulated_coupling(scenario, problem, wanted, c, tau)))
        return steps[-1][1]

    report.update(goal=goal, common_ns=tau, steps=steps)
    if goal >= RHYTHM_NOTE:
        report["why"] = (f"the run's workers are independent: staleness {goal:.3f} × the "
                         f"independent-phase value, at least {RHYTHM_NOTE}")
        return report
    if coupling_at(0.0) <= goal:
        report["why"] = (f"the simulation keeps the run's rhythm already: staleness "
                         f"{steps[0][1]:.3f} × the independent-phase value, the run's {goal:.3f}")
        return report
    c = _bisect(coupling_at, goal)
    report["weights"] = {phase: c for phase in ("read", "grad", "write", "idle")}
    report["fields"] = {**{name: c for name in COMMON_FIELDS}, "common_ns": tau}
    return report


def _simulated_coupling(scenario: Scenario, problem: Problem,
                        wanted: list[tuple[int, int, float | None]], c: float, tau: float
                        ) -> float:
    """The mean coupling of ``scenario`` with common factors c (correlation time ``tau``)
    simulated at each wanted run's worker count (at most ``_RHYTHM_UPDATES`` updates)."""
    from simulator.engine import Engine

    coupled = with_common(scenario, {**{name: c for name in COMMON_FIELDS},
                                     "common_ns": tau if c > 0 else 0.0})
    found = []
    for workers, updates, _ in wanted:
        trial = replace(coupled, run=replace(scenario.run, threads=workers,
                                             updates=min(updates, _RHYTHM_UPDATES)),
                        metrics=replace(scenario.metrics, exact=False, curve_points=0))
        value = trace_rhythm(Engine(trial, problem).run())["coupling"]
        found.append(1.0 if value is None else value)
    return float(np.mean(found))


def _bisect(coupling_at: Callable[[float], float], goal: float) -> float:
    """The c in [0, ``RHYTHM_HIGH``] whose coupling is ``goal`` (coupling falls with c), by
    ``_RHYTHM_STEPS`` bisections; the largest when even it couples less."""
    low, high = 0.0, RHYTHM_HIGH
    if coupling_at(high) >= goal:
        return high  # the strongest common factors tried: said in the report
    for _ in range(_RHYTHM_STEPS):
        middle = (low + high) / 2
        if coupling_at(middle) > goal:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def with_rhythm(scenario: Scenario, targets: list[tuple[int, int, float | None]],
                 bins: dict[str, Any]) -> tuple[Scenario, dict[str, Any]]:
    """``scenario`` with the common factors :func:`fit_rhythm` finds, and its report."""
    report = fit_rhythm(scenario, targets, bins)
    if not report["fields"]:
        return scenario, report
    return with_common(scenario, report["fields"]), report
