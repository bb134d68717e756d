"""Where does convergence stop? Theorem 1's error limit against injected errors.

Theorem 1 (AsynGrad) guarantees E[f(w_t) − f*] ≤ ε only while the gradient error satisfies
2τq < cε, i.e. τ < cε/(2q), with τ bounding −E⟨δ_t, w_{t−1} − w*⟩ (condition (7)). This
sweep injects the error that is worst for the theorem — an adversarial error of norm b along
−(w − w*), so −⟨δ, w − w*⟩ = b·‖w − w*‖ (``simulator.inject``) — for increasing b, and asks
at which τ the runs stop reaching ε. The adversarial error takes the place of the scenario's
``inject.error``, so a scenario that injects an error of its own is refused; the errors its
runs make themselves (lock-free races, delays, dropped or rounded writes) stay, on top.

Procedure (``tau_sweep``):

1. c, q and a_0 from the problem; κ² and the scenario's own τ_0 from pilot runs of the
   scenario as it is (``theory.check.pilot_runs``); γ by (9) and t by (10) from them. If f
   is not strongly convex, a pilot run diverges, or the scenario alone already breaks
   2τq < cε, there is no γ to hold fixed and the sweep says so.
2. For each bound b: ``seeds`` runs at lr = γ for ``horizon``·t updates with the adversarial
   error of norm b. τ(b) is measured in those runs like every τ of this package (worst window,
   one-sided 95% upper bound; ``theory.estimators.serialized_constants``, in as many windows
   as ``theory.check.window_count`` allows the runs' measured updates); the runs reach ε
   when the mean final suboptimality is at most ε.
3. The empirical breaking τ is the measured τ of the smallest b whose runs miss ε (every
   smaller b reached it); the report divides it by the theorem's limit cε/(2q): how
   conservative the theorem is on this problem.

All runs share γ and the run length, so what changes from point to point is the injected
error alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simulator.errors import ScenarioError
from simulator.problems import Problem, make_problem
from simulator.scenario import Scenario
from theory.asyngrad import Constants, InfeasibleError, check_accuracy, learning_rate, tau_limit
from theory.asyngrad import updates as updates_needed
from theory.bounds import pilot_diverged
from theory.check import (
    _mean_and_bounds,
    _runs,
    check_max_updates,
    common_points,
    diverged,
    gradients_per_update,
    pilot_runs,
    runnable_updates,
    window_count,
)
from theory.estimators import curvature, initial_distance, serialized_constants

__all__ = ["default_bounds", "tau_sweep"]


def default_bounds(limit: float, a0: float, points: int) -> list[float]:
    """Error norms b from 1/10 to 1000 times b_lim = limit/√a_0, the norm at which the
    adversary's τ at w_0 (b·√a_0) equals the theorem's limit, evenly spaced in log."""
    b_lim = limit / math.sqrt(a0) if a0 > 0 else limit
    return [float(b) for b in b_lim * np.geomspace(0.1, 1000.0, points)]


MAX_POINTS = 1000  # error bounds one sweep runs (each: --seeds runs)


def tau_sweep(scenario: Scenario, eps: float, seeds: int = 5,
              bounds: Sequence[float] | None = None, points: int = 9, horizon: float = 2.0,
              beta: float = 1.0, pilot_seeds: int = 3, max_updates: int = 100_000,
              progress: Callable[[int], object] | None = None,
              problem: Problem | None = None) -> dict[str, Any]:
    """Everything ``tausweep.json`` holds (see the module docstring).

    Raises:
        ScenarioError: ε, β, seeds, points, horizon, max_updates or a bound out of range, a
            scenario that injects an error of its own (``inject.error``), or one whose step
            is not γ·s_t with one γ (``theory.check.constant_step``).
    """
    check_accuracy(eps, beta)
    if scenario.inject.error != "none":
        raise ScenarioError("inject.error", scenario.inject.error,
                            "tausweep injects its own adversarial error in its place; set it "
                            "to none")
    for name, value, low in (("--seeds", seeds, 2), ("--points", points, 2),
                             ("--pilot-seeds", pilot_seeds, 1),
                             ("--max-updates", max_updates, 1)):
        if value < low:
            raise ScenarioError(name, value, f"must be >= {low}")
    for name, value in (("--points", points), ("--bounds", len(bounds or ()))):
        if value > MAX_POINTS:  # each point is --seeds runs
            raise ScenarioError(name, value if name == "--points" else f"{value} bounds",
                                f"must be <= {MAX_POINTS} points")
    check_max_updates(max_updates)
    if not (math.isfinite(horizon) and horizon > 0):
        raise ScenarioError("--horizon", horizon, "must be a finite number > 0")
    for b in bounds or ():
        if not (math.isfinite(b) and b > 0):
            raise ScenarioError("--bounds", b, "must all be finite numbers > 0")
    problem = problem if problem is not None else make_problem(scenario.problem)
    curv = curvature(problem)
    result: dict[str, Any] = {"scenario": scenario.name, "eps": eps, "beta": beta,
                              "seeds": seeds, "problem": problem.describe(), "c": curv.c,
                              "q": curv.q, "points": []}
    if not curv.convex or curv.c <= 0:
        result["verdict"] = (f"no sweep: f is not strongly convex (condition (4) fails; "
                             f"{curv.method}: smallest {curv.c:.4g})")
        return result
    a0 = initial_distance(problem, problem.initial())
    w_star, f_star = problem.optimum()
    result["a0"] = a0
    pilot = pilot_runs(scenario, problem, pilot_seeds, progress)
    failed = pilot_diverged(pilot, scenario, "κ² and τ")
    if failed is not None:
        result["verdict"] = f"no sweep: {failed}"
        return result
    kappa2, tau0 = serialized_constants(pilot, window_count(pilot))
    k = Constants(c=curv.c, q=curv.q, kappa2=kappa2.upper, tau=tau0.upper, a0=a0)
    limit = tau_limit(k, eps)
    result.update(kappa2=k.kappa2, tau_scenario=k.tau, tau_limit=limit)
    try:
        gamma = learning_rate(k, eps, beta)
        t = updates_needed(k, eps, beta)
    except InfeasibleError as err:
        result["verdict"] = f"no sweep: with the scenario's own κ² and τ, {err}"
        return result
    per_update = gradients_per_update(pilot)
    ran = runnable_updates(min(max(1, math.ceil(horizon * t)), max_updates), per_update)
    result.update(gamma=gamma, updates=t, ran_updates=ran)
    bounds = list(bounds) if bounds else default_bounds(limit, a0, points)
    gradients = math.ceil(ran * per_update)
    every = max(1, gradients * seeds // 20_000)
    for b in sorted(bounds):
        with np.errstate(all="ignore"):  # (a bound large enough diverges: said in its point)
            result["points"].append(_point(scenario, problem, b, gamma, (ran, gradients),
                                           every, seeds, f_star, w_star, eps, progress))
    _conclude(result, eps)
    return result


def _point(scenario: Scenario, problem: Problem, b: float, gamma: float,
           length: tuple[int, int], every: int, seeds: int, f_star: float,
           w_star: np.ndarray, eps: float,
           progress: Callable[[int], object] | None) -> dict[str, Any]:
    """The runs at error bound ``b`` (``length``: updates of w to read them at, gradients to
    run): τ measured in them and where they ended, at ``final_at`` updates of w; where one
    diverged, which (``diverged``), and no τ or final values (None)."""
    ran, gradients = length
    runs = _runs(scenario, problem, [
        f"run.lr={gamma!r}", f"run.updates={gradients}", "metrics.exact=true",
        f"metrics.every={every}", "metrics.curve_points=20", "inject.error=adversarial",
        f"inject.error_bound={b!r}", "inject.error_relative=false"], range(seeds), progress)
    failed = diverged(runs)
    if failed is not None:
        return {"bound": b, "diverged": failed, "tau": None, "tau_mean": None,
                "final_mean": None, "final_upper": None, "final_distance": None,
                "reached_eps": False}
    _, tau = serialized_constants(runs, window_count(runs))
    grid, losses = common_points(runs, "curve_loss", ran)
    mean, _, upper = _mean_and_bounds(losses[:, -1:] - f_star)
    distance = float(np.mean([np.linalg.norm(r["w_final"] - w_star) for r in runs]))
    return {"bound": b, "diverged": None, "tau": tau.upper, "tau_mean": tau.mean,
            "final_at": int(grid[-1]),
            "final_mean": float(mean[0]), "final_upper": float(upper[0]),
            "final_distance": distance, "reached_eps": bool(mean[0] <= eps)}




def _conclude(result: dict[str, Any], eps: float) -> None:
    points, limit = result["points"], result["tau_limit"]
    first_miss = next((i for i, p in enumerate(points) if not p["reached_eps"]), None)
    if first_miss is None:
        last_ok = points[-1]
    else:
        last_ok = points[first_miss - 1] if first_miss > 0 else None
    result["last_reached"] = last_ok
    result["first_missed"] = points[first_miss] if first_miss is not None else None
    if first_miss is None:
        result["breaking_tau"] = None
        result["verdict"] = (f"every injected error still reached ε = {eps:g}, up to τ = "
                             f"{points[-1]['tau']:.4g} = {points[-1]['tau'] / limit:.3g}× the "
                             f"theorem's limit {limit:.4g}: extend --bounds")
        return
    breaking = points[first_miss]["tau"]
    result["breaking_tau"] = breaking
    result["conservatism"] = None if breaking is None else breaking / limit
    if breaking is None:  # its runs diverged: no τ to compare
        missed = points[first_miss]
        where = ("even the smallest injected error" if last_ok is None else
                 f"convergence to ε = {eps:g} held up to τ = {last_ok['tau']:.4g} "
                 f"({last_ok['tau'] / limit:.3g}× the limit {limit:.4g}); the next error")
        result["verdict"] = (f"{where}, of norm {missed['bound']:.4g}, diverged "
                             f"({missed['diverged']}): "
                             + ("start --bounds lower" if first_miss == 0 else
                                "add bounds between them to find where it stops"))
        return
    if first_miss == 0:
        result["verdict"] = (f"even the smallest injected error (τ = {breaking:.4g}, "
                             f"{breaking / limit:.3g}× the limit {limit:.4g}) missed ε: "
                             "start --bounds lower")
        return
    assert last_ok is not None
    result["verdict"] = (f"convergence to ε = {eps:g} stops between τ = {last_ok['tau']:.4g} "
                         f"and {breaking:.4g}; the theorem's limit cε/(2q) is {limit:.4g}, "
                         f"so it is conservative by {last_ok['tau'] / limit:.3g}–"
                         f"{breaking / limit:.3g}×")
