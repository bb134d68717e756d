"""Checking Theorem 1 of AsynGrad on a scenario: measure its conditions, apply it, and
validate its bound by Monte Carlo over seeds.

1. c, q (conditions 4, 5) from the problem (closed form or Hessian eigenvalues); if f is not
   convex, say which condition fails and claim nothing.
2. κ², τ (6, 7) from pilot runs of the scenario (their own seeds), as worst-window one-sided 95%
   upper bounds; a_0 = ‖w_0 − w*‖². The scenario must apply one γ (no lr schedule, no
   staleness-scaled steps); a pilot run that diverges claims nothing.
3. γ by (9) and t by (10); if 2τq ≥ cε, say so and claim nothing.
4. Run the scenario with lr = γ for t updates of w (at most ``max_updates``; as many more
   gradients as the pilot runs computed per update: a minibatch protocol averages several)
   over ``seeds`` seeds, and compare the mean of f(w_t) − f* at the checkpoints every run
   reached and its one-sided 95% upper bound with ε; a run that stopped short of t (a thread
   died) leaves the bound not validated at t. t = 0 (w_0 already within ε) runs nothing.
   Report the update count at which the mean actually fell below ε (tightness), the
   (q/2)·bound envelope of the recursion, and whether κ² and τ measured in these runs stayed
   within what γ assumed. They are measured in ``WINDOWS`` windows, or in fewer where a run
   has fewer measured updates (:func:`window_count`), in the pilot runs too; runs without
   enough measured updates to estimate them claim no guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.stats

from simulator.budget import max_updates as budget_max_updates
from simulator.engine import Engine
from simulator.errors import AsyngradError, ScenarioError
from simulator.metrics import diverged_at
from simulator.problems import Problem, make_problem
from simulator.protocols import PROTOCOLS
from simulator.scenario import Scenario, with_overrides
from simulator.trace import Trace
from theory.asyngrad import (
    Constants,
    InfeasibleError,
    check_accuracy,
    error_budget,
    fixed_point,
    learning_rate,
    recursion_bound,
    start_within,
    tau_limit,
    updates,
)
from theory.estimators import Estimate, curvature, initial_distance, serialized_constants

__all__ = ["PILOT_SEED", "WINDOWS", "check_counts", "check_theorem", "common_points",
           "completions", "constant_step", "diverged", "gradients_per_update", "pilot_runs",
           "remeasured_constants", "runnable_updates", "suboptimality", "validated",
           "validation_runs", "window_count"]

PILOT_SEED = 1_000_000  # pilot runs use seeds from here, so they never reuse a validation seed
WINDOWS = 10  # windows κ² and τ are measured in (``serialized_constants``)


def _runs(scenario: Scenario, problem: Problem, overrides: list[str], seeds: range,
          progress: Callable[[int], object] | None) -> list[Trace]:
    """One run of ``scenario`` with ``overrides`` per seed, all on the same problem."""
    traces = []
    for seed in seeds:
        traces.append(Engine(with_overrides(scenario, [*overrides, f"run.seed={seed}"]),
                             problem).run())
        if progress:
            progress(1)
    return traces


def constant_step(scenario: Scenario) -> None:
    """Raise ScenarioError unless every update applies γ·s_t with one γ, as the theorems
    assume (w_t = w_{t−1} − γ s_t): no learning-rate schedule, no step scaled by staleness
    (the serialized view divides such factors out of s_t, so the measured s_t would not be
    the iteration's), no protocol whose updates are not SGD steps (ADMM's local solves: the
    view measures nothing of them)."""
    protocol = scenario.run.protocol
    if not PROTOCOLS[protocol].exact_view:
        raise ScenarioError("run.protocol", protocol, "its updates are not SGD steps "
                            "w_t = w_{t−1} − γ s_t; the bounds are about SGD")
    if PROTOCOLS[protocol].partial:
        raise ScenarioError("run.protocol", protocol, "each update moves one stage's "
                            "parameters (block-coordinate steps, δ measured on the stage); "
                            "the bounds are about full SGD steps, and no bound is checked "
                            "for model-parallel training")
    if scenario.run.lr_schedule != "constant":
        raise ScenarioError("run.lr_schedule", scenario.run.lr_schedule,
                            "the bounds assume a constant learning rate γ (set it constant)")
    if protocol == "staleness_lr":
        raise ScenarioError("run.protocol", protocol,
                            "scales γ by each update's staleness; the bounds assume one γ")
    if protocol == "paramserver" and scenario.paramserver.rule == "staleness_lr":
        raise ScenarioError("paramserver.rule", "staleness_lr", "the server scales γ by each "
                            "push's staleness; the bounds assume one γ")


def pilot_runs(scenario: Scenario, problem: Problem, count: int,
               progress: Callable[[int], object] | None) -> list[Trace]:
    """``count`` runs of the scenario as it is, every update measured, on seeds from
    ``PILOT_SEED``: what the run-dependent constants are estimated from.

    Raises:
        ScenarioError: a step that is not γ·s_t with one γ (:func:`constant_step`).
    """
    constant_step(scenario)
    return _runs(scenario, problem, ["metrics.exact=true", "metrics.every=1"],
                 range(PILOT_SEED, PILOT_SEED + count), progress)


SPREAD_MARGIN = 0.1  # more gradients planned where the pilot runs' ratios differ


def gradients_per_update(runs: list[Trace]) -> float:
    """The gradients to plan per update of w (t in (10) counts updates of w, completions):
    the most any of ``runs`` computed, more than one where a protocol averages several
    (minibatch, a server's accumulation) or throws some away, and ``SPREAD_MARGIN`` more
    where the runs differ (a server discarding stale pushes), so that validation runs reach
    their count and are read there (:func:`common_points`)."""
    ratios = [len(run) / max(1, completions(run)) for run in runs]
    return max(ratios) * (1 + SPREAD_MARGIN if max(ratios) > min(ratios) else 1)


def runnable_updates(wanted: int, per_update: float) -> int:
    """``wanted`` updates of w, or fewer where their gradients would not fit one run on
    this machine (``simulator.budget.max_updates``), at least one."""
    return max(1, min(wanted, math.floor(budget_max_updates() / per_update)))


def completions(run: Trace) -> int:
    """The updates of w a run made (its last completion t)."""
    return int(run["step"].max()) if len(run) else 0


def diverged(runs: list[Trace]) -> str | None:
    """Which of ``runs`` diverged and where (None: none did)."""
    for index, run in enumerate(runs):
        at = diverged_at(run)
        if at is not None:
            return f"run {index + 1} of {len(runs)} diverged at update {at:,}"
    return None


def window_count(runs: list[Trace]) -> int:
    """The windows κ² and τ are measured in: ``WINDOWS``, or fewer where a run has fewer
    measured updates, so that each window holds one of every run, two or more in all (one
    run: two of its own; at least one window)."""
    fewest = min(int(np.count_nonzero(r["measured"])) for r in runs)
    return max(1, min(WINDOWS, fewest if len(runs) > 1 else fewest // 2))


def _mean_and_bounds(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column: mean, two-sided 95% half-width, one-sided 95% upper bound."""
    n = values.shape[0]
    mean = values.mean(axis=0)
    if n < 2:
        return mean, np.zeros_like(mean), mean
    spread = values.std(axis=0, ddof=1) / math.sqrt(n)
    return (mean, float(scipy.stats.t.ppf(0.975, n - 1)) * spread,
            mean + float(scipy.stats.t.ppf(0.95, n - 1)) * spread)


def validation_runs(scenario: Scenario, problem: Problem, lr: float, ran: int, seeds: int,
                    progress: Callable[[int], object] | None,
                    per_update: float = 1.0) -> list[Trace]:
    """``seeds`` runs at ``lr`` (seeds 0..) of ``ran`` updates of w, at ``per_update``
    gradients each (:func:`gradients_per_update`), measured at most 20,000 times in all,
    each with a 100-point loss curve."""
    gradients = max(math.ceil(ran * per_update), 1)
    every = max(1, gradients * seeds // 20_000)
    return _runs(scenario, problem, [f"run.lr={lr!r}", f"run.updates={gradients}",
                                     "metrics.exact=true", f"metrics.every={every}",
                                     "metrics.curve_points=100"], range(seeds), progress)


def common_points(runs: list[Trace], name: str,
                  upto: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A grid of update counts every run reached (the loss-curve checkpoints of the run with
    the fewest updates of w, up to ``upto``), and per run its curve's ``name`` column at
    them: the value at its last checkpoint at or before each (checkpoints sit at gradient
    counts, so runs that turn gradients into updates at different rates have different
    ones)."""
    shortest = min(runs, key=completions)["curve_t"]
    grid = shortest[shortest <= upto] if upto is not None else shortest
    values = [run[name][np.searchsorted(run["curve_t"], grid, side="right") - 1]
              for run in runs]
    return grid, np.array(values)


def suboptimality(runs: list[Trace], problem: Problem, eps: float,
                  planned: int, upto: int | None = None) -> dict[str, Any]:
    """Mean f(w_t) − f* over the runs on a grid they all reached, up to ``upto`` updates of
    w (:func:`common_points`), its 95% band and one-sided upper bound, when the mean first
    fell to ``eps`` (also as a share of ``planned`` > 0), ``final_at`` (the last grid point)
    and ``reached``: the fewest updates of w a run made."""
    checkpoints, losses = common_points(runs, "curve_loss", upto)
    f_star = problem.optimum()[1]
    mean, half, upper = _mean_and_bounds(losses - f_star)
    below = np.flatnonzero(mean <= eps)
    return {
        "checkpoints": checkpoints.tolist(), "mean": mean.tolist(), "half_width": half.tolist(),
        "upper": upper.tolist(), "envelope": None,
        "final_mean": float(mean[-1]), "final_upper": float(upper[-1]),
        "final_at": int(checkpoints[-1]), "reached": min(completions(run) for run in runs),
        "reached_eps_at": int(checkpoints[below[0]]) if below.size else None,
        "tightness": float(checkpoints[below[0]]) / planned if below.size else None,
    }


def check_counts(seeds: int, pilot_seeds: int, max_updates: int, rounds: int) -> None:
    """Raise ScenarioError unless seeds >= 2 and the others >= 1, and ``max_updates`` fits
    one run on this machine (``check_max_updates``)."""
    for name, value, low in (("--seeds", seeds, 2), ("--pilot-seeds", pilot_seeds, 1),
                             ("--max-updates", max_updates, 1), ("--rounds", rounds, 1)):
        if value < low:
            raise ScenarioError(name, value, f"must be >= {low}")
    check_max_updates(max_updates)


def check_max_updates(max_updates: int) -> None:
    """Raise ScenarioError naming ``--max-updates`` when a run of that many updates cannot
    be held in this machine's memory (``simulator.budget.max_updates``), before any run."""
    limit = budget_max_updates()
    if max_updates > limit:
        raise ScenarioError("--max-updates", max_updates,
                            f"must be <= {limit:,} (the most updates one run can hold here)")


def _validate(scenario: Scenario, problem: Problem, k: Constants, gamma: float, t: int,
              ran: int, seeds: int, eps: float, per_update: float,
              progress: Callable[[int], object] | None) -> tuple[dict[str, Any], list[Trace]]:
    """Monte Carlo over ``seeds`` runs at lr = γ for ``ran`` updates of w, with the
    (q/2)·bound envelope of the recursion and whether the mean a_t stayed under its
    bound."""
    runs = validation_runs(scenario, problem, gamma, ran, seeds, progress, per_update)
    result = suboptimality(runs, problem, eps, t, ran)
    checkpoints, dist2 = common_points(runs, "curve_dist2", ran)
    mean_dist2 = dist2.mean(axis=0)
    bound = (recursion_bound(k, gamma, int(checkpoints[-1]))[checkpoints]
             if k.c * gamma < 1 else None)
    result.update({
        "mean_dist2": mean_dist2.tolist(),
        "envelope": None if bound is None else (k.q / 2 * bound).tolist(),
        "a_t_within_bound": (None if bound is None
                             else bool(np.all(mean_dist2 <= bound * (1 + 1e-9)))),
    })
    return result, runs


def remeasured_constants(runs: list[Trace]) -> tuple[Estimate, Estimate] | None:
    """(κ², τ) of validation runs in :func:`window_count` windows; None when they cannot be
    estimated (fewer than two measured updates in a window)."""
    try:
        return serialized_constants(runs, window_count(runs))
    except AsyngradError:
        return None


def check_theorem(scenario: Scenario, eps: float, seeds: int, beta: float = 1.0,
                  pilot_seeds: int = 3, max_updates: int = 200_000, rounds: int = 3,
                  progress: Callable[[int], object] | None = None,
                  problem: Problem | None = None) -> dict[str, Any]:
    """Everything ``check.json`` holds (see the module docstring for the procedure).

    κ² and τ depend on the trajectory, hence on γ: after each validation the constants are
    measured again in its runs; if they exceed what γ assumed, γ is recomputed from them and
    the validation repeated, at most ``rounds`` times. A guarantee is claimed only when the
    constants measured in the validation runs stay within the assumed ones.

    Raises:
        ScenarioError: ε, β, seeds, pilot seeds, max_updates or rounds out of range.
    """
    check_counts(seeds, pilot_seeds, max_updates, rounds)
    check_accuracy(eps, beta)
    constant_step(scenario)
    problem = problem if problem is not None else make_problem(scenario.problem)
    curv = curvature(problem)
    a0 = initial_distance(problem, problem.initial())
    result: dict[str, Any] = {
        "scenario": scenario.name, "eps": eps, "beta": beta, "seeds": seeds,
        "problem": problem.describe(), "a0": a0, "guarantee": False,
        "conditions": {
            "4_strong_convexity": {"c": curv.c, "method": curv.method, "holds": curv.convex},
            "5_smoothness": {"q": curv.q, "method": curv.method, "holds": math.isfinite(curv.q)},
        },
        "rounds": [],
    }
    if not curv.convex or curv.c <= 0:
        result["verdict"] = (f"no guarantee: condition (4) fails, f is not strongly convex "
                             f"({curv.method}: smallest {curv.c:.4g}, largest {curv.q:.4g})")
        return result
    if start_within(curv.q, a0, eps):  # whatever κ² and τ: (10) gives t = 0
        result["guarantee"] = True
        result["verdict"] = (f"holds: (q/2)·a_0 = {curv.q * a0 / 2:.4g} <= ε = {eps:g} at "
                             "w_0, so (10) asks for no update and nothing was run")
        return result
    pilot = pilot_runs(scenario, problem, pilot_seeds, progress)
    failed = diverged(pilot)
    if failed is not None:
        result["verdict"] = (f"no guarantee: κ² and τ cannot be measured, pilot {failed} "
                             f"(at the scenario's lr = {scenario.run.lr:g})")
        return result
    kappa2, tau = serialized_constants(pilot, window_count(pilot))
    per_update = gradients_per_update(pilot)
    source = f"{pilot_seeds} pilot runs at the scenario's lr"
    for _ in range(rounds):
        k = Constants(c=curv.c, q=curv.q, kappa2=kappa2.upper, tau=tau.upper, a0=a0)
        entry: dict[str, Any] = {"source": source, "kappa2": k.kappa2, "tau": k.tau,
                                 "tau_window": tau.window, "tau_limit": tau_limit(k, eps),
                                 "error_budget": error_budget(k, eps)}
        result["rounds"].append(entry)
        result["conditions"]["6_update_bound"] = {"kappa2": k.kappa2, "source": source}
        result["conditions"]["7_error_bound"] = {
            "tau": k.tau, "limit": entry["tau_limit"], "margin": entry["tau_limit"] - k.tau,
            "holds": entry["error_budget"] < 1, "source": source}
        try:
            gamma = learning_rate(k, eps, beta)
            t = updates(k, eps, beta)
        except InfeasibleError as err:
            entry["infeasible"] = str(err)
            break
        ran = runnable_updates(min(t, max_updates), per_update)
        entry.update(gamma=gamma, updates=t, ran_updates=ran, fixed_point=fixed_point(k, gamma))
        entry["validation"], runs = _validate(scenario, problem, k, gamma, t, ran, seeds, eps,
                                              per_update, progress)
        result["validation"] = entry["validation"]
        failed = diverged(runs)
        remeasured = None if failed else remeasured_constants(runs)
        if remeasured is None:  # not re-measured: held is unknown, no guarantee
            entry["measured"] = entry["assumptions_held"] = None
            entry["diverged"] = failed
            break
        kappa2, tau = remeasured
        entry["measured"] = {"kappa2": kappa2.mean, "tau": tau.mean,
                             "kappa2_upper": kappa2.upper, "tau_upper": tau.upper,
                             "windows": kappa2.windows}
        # Held when the validation runs' means stay within the assumed bounds (τ of the order
        # of rounding counts as zero).
        entry["assumptions_held"] = (kappa2.mean <= k.kappa2
                                     and tau.mean <= k.tau + 1e-9 * entry["tau_limit"])
        if entry["assumptions_held"]:
            break
        # Assumptions only grow, so γ only shrinks and the rounds settle.
        kappa2 = Estimate(kappa2.mean, max(kappa2.upper, k.kappa2), kappa2.n)
        tau = Estimate(tau.mean, max(tau.upper, k.tau), tau.n, tau.window, tau.windows)
        source = f"the {seeds} validation runs at γ = {gamma:.4g}"
    last = result["rounds"][-1]
    result["guarantee"] = last.get("assumptions_held") is True
    result["verdict"] = _verdict(result, eps)
    return result


def _verdict(result: dict[str, Any], eps: float) -> str:
    last = result["rounds"][-1]
    empirical = ""
    v = result.get("validation")
    if v is not None:
        empirical = (f"; empirically the mean suboptimality reached {v['final_mean']:.4g} "
                     f"(95% upper bound {v['final_upper']:.4g}, ε = {eps:g})")
    if "infeasible" in last:
        return (f"no guarantee: with κ², τ from {last['source']}, {last['infeasible']}"
                + empirical)
    if last.get("diverged"):
        return (f"no guarantee: at γ = {last['gamma']:.4g} validation {last['diverged']}"
                + empirical)
    if last["measured"] is None:
        return ("no guarantee: κ² and τ could not be measured again in the validation runs "
                "(fewer than two measured updates)" + empirical)
    if not last["assumptions_held"]:
        m = last["measured"]
        return (f"no guarantee: in the validation runs mean κ² = {m['kappa2']:.4g} and τ = "
                f"{m['tau']:.4g}, against the assumed {last['kappa2']:.4g} and "
                f"{last['tau']:.4g} after {len(result['rounds'])} rounds" + empirical)
    assert v is not None
    return validated(v, last, eps, "t", "(10)")


def validated(v: dict[str, Any], last: dict[str, Any], eps: float, name: str,
              formula: str) -> str:
    """The verdict of a validation ``v`` (:func:`suboptimality`) of the last round ``last``
    (``updates`` the bound's count ``name`` by ``formula``, ``ran_updates`` those run):
    not validated where the runs fell short of what was planned or were cut, else holds or
    VIOLATED, saying where the final values were read."""
    there = (f"at update {v['final_at']:,} the mean suboptimality is {v['final_mean']:.4g} "
             f"(95% upper bound {v['final_upper']:.4g}) against ε = {eps:g}")
    if v["reached"] < last["ran_updates"]:
        return (f"not validated at {name}: {formula} asks for {last['updates']:,} updates of "
                f"w, a run made only {v['reached']:,} (a thread died, or fewer of its "
                f"gradients were applied than in the pilot runs); {there}")
    if last["ran_updates"] < last["updates"]:
        return (f"not validated at {name}: {formula} asks for {last['updates']:,} updates, "
                f"the runs stopped at {last['ran_updates']:,} (--max-updates, or the "
                f"gradients one run can hold here); {there}")
    holds = v["final_upper"] <= eps
    if v["final_at"] == last["updates"]:
        where = f"after {name} = {last['updates']:,} updates"
    else:  # runs made at their own rates
        where = (f"at update {v['final_at']:,} of {name} = {last['updates']:,} (the last "
                 "checkpoint every run reached by then)")
    return (f"{'holds' if holds else 'VIOLATED'}: {where} "
            f"the mean suboptimality is {v['final_mean']:.4g}, 95% upper bound "
            f"{v['final_upper']:.4g} {'<=' if holds else '>'} ε = {eps:g}")
