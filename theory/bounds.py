"""Checking the Hogwild! and delayed-SGD bounds on a scenario, the way ``theory.check`` checks
AsynGrad's Theorem 1: measure the constants, apply the bound, validate it by Monte Carlo.

Hogwild! Proposition 4.1 (``check_hogwild``):

0. The proposition's SGD computes exact sample gradients and adds them to w component by
   component, atomically: injected gradient errors, dropped and rounded writes are refused
   before any run (``refuse_uncovered``, the rule the delayed-SGD check uses), and where
   the pilot or validation runs lost writes (``load_store`` stores another update
   overwrote: ``lost_writes``) no guarantee is claimed. Injected delays stay: τ is measured.
1. c, L from the problem (closed form or Hessian eigenvalues); no claim if f is not strongly
   convex. Ω, Δ, ρ from the problem's gradient supports (exact, over all samples).
2. τ (the largest lag, in updates) and M (the largest sample-gradient norm seen, plus
   ``M_MARGIN``) from pilot runs of the scenario; D_0 = ‖x_0 − x*‖². A pilot run that
   diverges claims nothing (``pilot_diverged``; nor does one of the delayed-SGD check).
3. γ by (4.1) and k by (4.2); run k updates of w (at most ``max_updates``; as many gradients
   each as the pilot runs computed) at lr = γ over the seeds
   and compare the mean of f(x_k) − f* and its one-sided 95% upper bound with ε. τ and M are
   measured again in these runs; if they exceed what γ assumed, γ is recomputed and the
   validation repeated (at most ``rounds`` times). A guarantee is claimed only when they stay
   within the assumed values.

Delayed SGD, Langford et al. 2009 (``check_langford``): the ``roundrobin`` protocol with k
threads is their algorithm with delay τ = k − 1, exact gradients each computed at the iterate
τ updates back. A fixed injected delay d (``inject.delay``) moves every read d completions
further back, so τ = k − 1 + d; the analysis covers nothing else that ``[inject]`` can add
(gradient errors, dropped or rounded writes, random delays, deaths, which stall the rotation),
and the check refuses those before any run. Stragglers and pauses change only durations,
not the turn order. Every validation run's staleness must be exactly min(m − 1, τ) at update
m, the delay the regret and the bounds assume; otherwise no guarantee is claimed and the
first update that differs is reported. Pilot runs at the scenario's lr estimate L
(the largest sample-gradient norm) and F (from the largest distance to w*: the iterates stay
in the ball X = B(w*, r), so F² = max ½‖x − x'‖² = 2r²), which set σ = F/(L√(2τ)). The
validation runs use η_t = σ/√(t − τ) (Theorem 1) and, where every f_i is λ-strongly convex,
η_t = 1/(λ(t − τ)) (Theorem 2), and record f at every iterate. The update m is computed at
the iterate w_{m−1−τ} (w_0 for the first k), and since that iterate does not depend on the
sample drawn for m, E[R_T] = Σ_m E[f(w_{max(m−1−τ, 0)})] − T·f*, the expected regret against
w* — at most the regret against the best point of X that the theorems bound. Each bound is
evaluated with the L and F measured in the runs it is compared with (the bound holds for any
σ and any X that contains the iterates), at every horizon t <= T (the schedules do not depend
on T). L is the largest gradient norm seen, an estimate of its supremum over X.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse

from simulator.errors import AsyngradError, ScenarioError
from simulator.problems import Problem, make_problem
from simulator.scenario import InjectSpec, Scenario, with_overrides
from simulator.trace import Trace
from theory.asyngrad import InfeasibleError, start_within
from theory.check import (
    _mean_and_bounds,
    _runs,
    check_counts,
    constant_step,
    diverged,
    gradients_per_update,
    pilot_runs,
    runnable_updates,
    suboptimality,
    validated,
    validation_runs,
)
from theory.estimators import curvature, initial_distance
from theory.hogwild import HogwildConstants, check_theta, lag_factor, step_size, updates
from theory.langford import (
    convex_regret,
    optimal_sigma,
    simple_convex_regret,
    strongly_convex_regret,
)

#: M is assumed this much above the largest gradient norm seen: a sample maximum grows with
#: the number of samples, so a bound set at it would be exceeded by any longer run.
M_MARGIN = 0.1

__all__ = ["ANALYSES", "M_MARGIN", "UNCOVERED", "Sparsity", "check_hogwild", "check_langford",
           "delay_and_gradient_bound", "delay_mismatch", "expected_regret", "hypergraph",
           "langford_delay", "lost_writes", "pilot_diverged", "refuse_uncovered"]


@dataclass(frozen=True)
class Sparsity:
    """Hogwild!'s hypergraph measures of a problem: Ω (largest support), Δ (largest share of
    samples touching one coordinate), ρ (largest share of samples overlapping one sample)."""

    omega: int
    delta: float
    rho: float
    samples: int


def hypergraph(problem: Problem, chunk: int = 1024) -> Sparsity:
    """Ω, Δ, ρ of the problem's gradient supports, exact over all samples (a dense problem:
    Ω = d, Δ = ρ = 1). ρ counts, for each sample, the samples that share a coordinate with it,
    by sparse products of ``chunk`` rows of the incidence matrix at a time."""
    n, d = problem.n_samples, problem.dim
    if not problem.sparse:
        return Sparsity(d, 1.0, 1.0, n)
    supports = [np.unique(np.asarray(problem.support(i), dtype=np.int64)) for i in range(n)]
    lengths = np.array([s.size for s in supports])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    incidence = scipy.sparse.csr_matrix(
        (np.ones(int(indptr[-1]), dtype=np.int32), np.concatenate(supports), indptr),
        shape=(n, d))
    degree = np.bincount(incidence.indices, minlength=d)
    by_column = incidence.T.tocsr()
    overlaps = 0
    for start in range(0, n, chunk):
        shared = incidence[start:start + chunk] @ by_column  # rows × samples, > 0 = overlap
        overlaps = max(overlaps, int(np.diff(shared.indptr).max()))
    return Sparsity(int(lengths.max()), float(degree.max()) / n, overlaps / n, n)


def pilot_diverged(pilot: list[Trace], scenario: Scenario, constants: str) -> str | None:
    """Why ``constants`` cannot be measured in the ``pilot`` runs of ``scenario``: one of them
    diverged (``theory.check.diverged``), saying which, where and at what lr; None when none
    did."""
    failed = diverged(pilot)
    if failed is None:
        return None
    return (f"{constants} cannot be measured, pilot {failed} (at the scenario's lr = "
            f"{scenario.run.lr:g})")


def delay_and_gradient_bound(traces: Sequence[Trace]) -> tuple[int, float]:
    """(τ, M): the largest staleness of any update (the lag, in updates, between the read a
    gradient was computed on and the update that applied it) and the largest gradient norm
    measured (exact ‖g_t‖ at the serialized iterate and applied ‖s_t‖).

    Raises:
        AsyngradError: no measured update in ``traces``.
    """
    tau = max(int(t["staleness"].max()) if len(t) else 0 for t in traces)
    norms = [np.concatenate([t["g_norm"][t["measured"]], t["s_norm"][t["measured"]]])
             for t in traces]
    values = np.concatenate(norms) if norms else np.empty(0)
    if values.size == 0:
        raise AsyngradError("theory: no measured updates to bound the gradient norm (turn "
                            "metrics.exact on in the pilot runs)")
    return tau, float(values.max())


def check_hogwild(scenario: Scenario, eps: float, seeds: int, theta: float = 0.5,
                  pilot_seeds: int = 3, max_updates: int = 200_000, rounds: int = 3,
                  progress: Callable[[int], object] | None = None,
                  problem: Problem | None = None) -> dict[str, Any]:
    """Everything ``check.json`` holds for ``--bound hogwild`` (see the module docstring).

    Raises:
        ScenarioError: ε, ϑ, seeds, pilot seeds, max_updates or rounds out of range, or an
            injection the analysis does not cover (``refuse_uncovered``).
    """
    check_counts(seeds, pilot_seeds, max_updates, rounds)
    check_theta(eps, theta)
    refuse_uncovered(scenario.inject, "hogwild")
    constant_step(scenario)
    problem = problem if problem is not None else make_problem(scenario.problem)
    curv = curvature(problem)
    sparsity = hypergraph(problem)
    d0 = initial_distance(problem, problem.initial())
    result: dict[str, Any] = {
        "bound": "hogwild", "scenario": scenario.name, "eps": eps, "theta": theta,
        "seeds": seeds, "problem": problem.describe(), "d0": d0, "guarantee": False,
        "conditions": {
            "strong_convexity": {"c": curv.c, "method": curv.method, "holds": curv.convex},
            "smoothness": {"L": curv.q, "method": curv.method},
            "sparsity": {"omega": sparsity.omega, "delta": sparsity.delta,
                         "rho": sparsity.rho, "samples": sparsity.samples},
        },
        "rounds": [],
    }
    if not curv.convex or curv.c <= 0:
        result["verdict"] = (f"no guarantee: f is not strongly convex ({curv.method}: "
                             f"smallest {curv.c:.4g}, largest {curv.q:.4g})")
        return result
    if start_within(curv.q, d0, eps):  # whatever τ and M: (4.2) gives k = 0
        result["guarantee"] = True
        result["verdict"] = (f"holds: L·D_0 = {curv.q * d0:.4g} <= ε = {eps:g} at x_0, so "
                             "(4.2) asks for no update and nothing was run")
        return result
    pilot = pilot_runs(scenario, problem, pilot_seeds, progress)
    failed = (pilot_diverged(pilot, scenario, "τ and M")
              or lost_writes(pilot, f"{pilot_seeds} pilot runs"))
    if failed is not None:
        result["verdict"] = f"no guarantee: {failed}"
        return result
    per_update = gradients_per_update(pilot)
    tau, seen_m = delay_and_gradient_bound(pilot)
    M = (1 + M_MARGIN) * seen_m
    source = f"{pilot_seeds} pilot runs at the scenario's lr"
    for _ in range(rounds):
        k = HogwildConstants(c=curv.c, L=curv.q, M=M, omega=sparsity.omega,
                             delta=sparsity.delta, rho=sparsity.rho, tau=tau, d0=d0)
        entry: dict[str, Any] = {"source": source, "tau": tau, "M": M,
                                 "lag_factor": lag_factor(k)}
        result["rounds"].append(entry)
        result["conditions"]["lag"] = {"tau": tau, "source": source}
        result["conditions"]["gradient_bound"] = {"M": M, "source": source}
        gamma = step_size(k, eps, theta)
        try:
            planned = updates(k, eps, theta)
        except InfeasibleError as err:
            entry.update(gamma=gamma, infeasible=str(err))
            break
        ran = runnable_updates(min(planned, max_updates), per_update)
        entry.update(gamma=gamma, updates=planned, ran_updates=ran)
        runs = validation_runs(scenario, problem, gamma, ran, seeds, progress, per_update)
        entry["validation"] = result["validation"] = suboptimality(runs, problem, eps, planned,
                                                                   ran)
        lost = lost_writes(runs, f"{seeds} validation runs at γ = {gamma:.4g}")
        if lost is not None:
            entry["lost"] = lost
            break
        seen_tau, seen_m = delay_and_gradient_bound(runs)
        entry["measured"] = {"tau": seen_tau, "M": seen_m}
        entry["assumptions_held"] = seen_tau <= tau and seen_m <= M
        if entry["assumptions_held"]:
            break
        tau, M = max(tau, seen_tau), max(M, (1 + M_MARGIN) * seen_m)
        source = f"the {seeds} validation runs at γ = {gamma:.4g}"
    last = result["rounds"][-1]
    result["guarantee"] = bool(last.get("assumptions_held"))
    result["verdict"] = _hogwild_verdict(result, eps)
    return result


def _hogwild_verdict(result: dict[str, Any], eps: float) -> str:
    last = result["rounds"][-1]
    if "infeasible" in last:
        return f"no validation: {last['infeasible']} (γ (4.1) = {last['gamma']:.4g})"
    if "lost" in last:
        return f"no guarantee: {last['lost']}"
    v = result["validation"]
    if not last["assumptions_held"]:
        m = last["measured"]
        return (f"no guarantee: the validation runs saw lag τ = {m['tau']} and M = "
                f"{m['M']:.4g}, beyond the assumed {last['tau']} and {last['M']:.4g} after "
                f"{len(result['rounds'])} rounds")
    return validated(v, last, eps, "k", "(4.2)")


def expected_regret(trace: Trace, f_star: float, tau: int) -> np.ndarray:
    """Σ_{m<=t} f(w_{max(m−1−τ, 0)}) − f* for t = 0..T, from a trace whose loss curve holds
    f at every completion (``metrics.curve_points`` >= ``run.updates``).

    Raises:
        AsyngradError: the curve misses a completion.
    """
    steps, losses = trace["curve_t"], trace["curve_loss"]
    total = int(steps[-1])
    if not np.array_equal(steps, np.arange(total + 1)):
        raise AsyngradError("theory: the loss curve must hold every completion (set "
                            "metrics.curve_points to run.updates)")
    read = np.maximum(np.arange(total) - tau, 0)  # update m = index + 1 reads w_{m-1-τ}
    return np.concatenate([[0.0], np.cumsum(losses[read] - f_star)])


#: The injections a bound's analysis does not cover, by the ``inject`` field that sets them:
#: the bounds that refuse it, whether an ``InjectSpec`` has it, and what the analysis assumes
#: instead. Delays are covered by both: Hogwild!'s τ is the largest lag measured, the delayed
#: SGD's takes in a fixed one.
UNCOVERED: dict[str, tuple[tuple[str, ...], Callable[[InjectSpec], bool], str]] = {
    "inject.error": (("hogwild", "langford"), lambda i: i.error != "none", "exact gradients"),
    "inject.drop": (("hogwild", "langford"), lambda i: i.drop > 0, "no lost writes"),
    "inject.write_bits": (("hogwild", "langford"), lambda i: i.write_bits > 0,
                          "no rounded writes"),
    "inject.delay_dist": (("langford",), lambda i: i.delay != i.max_delay,
                          "one fixed delay, not a random one"),
    "inject.deaths": (("langford",), lambda i: bool(i.deaths),
                      "that every thread keeps taking its turn (a dead one stalls the "
                      "round-robin rotation)"),
}
ANALYSES = {"hogwild": "Hogwild!'s analysis (Niu et al. 2011)",
            "langford": "the delayed-SGD analysis (Langford et al. 2009)"}


def refuse_uncovered(inject: InjectSpec, bound: str) -> None:
    """Refuse an injection the analysis of ``bound`` does not cover (``UNCOVERED``).

    Raises:
        ScenarioError: naming the first such ``inject`` field.
    """
    for field, (bounds, present, assumes) in UNCOVERED.items():
        if bound in bounds and present(inject):
            raise ScenarioError(field, getattr(inject, field.removeprefix("inject.")),
                                f"{ANALYSES[bound]} assumes {assumes}; --bound {bound} "
                                "refuses it")


def langford_delay(inject: InjectSpec) -> int:
    """The injected delay d that delayed SGD's τ = k − 1 + d takes in: ``inject.delay`` when
    it is fixed (0 without one).

    Raises:
        ScenarioError: an injection the analysis of Langford et al. 2009 does not cover
            (exact gradients, each delayed by one fixed τ; ``refuse_uncovered``).
    """
    refuse_uncovered(inject, "langford")
    return inject.delay


def lost_writes(traces: Sequence[Trace], which: str) -> str | None:
    """Why the ``which`` runs break Hogwild!'s atomic component updates — stores that
    another update's read-modify-write overwrote (``load_store``) — or None where none was
    lost (a protocol that never lets writes overlap loses none, whatever its write mode)."""
    lost = sum(int(trace["lost_blocks"].sum()) for trace in traces)
    if lost:
        return (f"the {which} lost {lost:,} block stores (load_store writes overwritten by "
                "another update's read-modify-write), and Proposition 4.1 assumes atomic "
                "component updates (set run.write_mode = atomic_add)")
    return None


def delay_mismatch(traces: Sequence[Trace], tau: int) -> dict[str, int] | None:
    """The first update (run, completion m, staleness, min(m − 1, τ)) of ``traces`` whose
    staleness is not min(m − 1, τ), the delay of Langford et al.'s algorithm, counting a
    discarded gradient (m = 0) as one; None when every update has it."""
    for run, trace in enumerate(traces):
        steps, staleness = trace["step"], trace["staleness"]
        expected = np.minimum(steps - 1, tau)
        bad = np.flatnonzero((steps < 1) | (staleness != expected))
        if bad.size:
            i = bad[0]
            return {"run": run, "update": int(steps[i]), "staleness": int(staleness[i]),
                    "expected": int(expected[i])}
    return None


def _regret_runs(scenario: Scenario, problem: Problem, lr: float, schedule: str,
                 seeds: int, tau: int, progress: Callable[[int], object] | None,
                 ) -> tuple[np.ndarray, float, float, dict[str, int] | None]:
    """Validation runs: the regret curve of each (rows), the L and F they show, and their
    first update whose staleness is not min(m − 1, τ) (``delay_mismatch``)."""
    updates_ = scenario.run.updates
    runs = _runs(scenario, problem, [f"run.lr={lr!r}", f"run.lr_schedule={schedule}",
                                     "metrics.exact=true", "metrics.every=1",
                                     f"metrics.curve_points={updates_}"], range(seeds),
                 progress)
    f_star = problem.optimum()[1]
    regrets = np.array([expected_regret(r, f_star, tau) for r in runs])
    _, L = delay_and_gradient_bound(runs)
    return regrets, L, _domain_size(runs), delay_mismatch(runs, tau)


def _domain_size(traces: Sequence[Trace]) -> float:
    """F of the ball X = B(w*, r) holding every iterate of ``traces`` (r the largest distance
    to w* on their loss curves): max ½‖x − x'‖² over X is 2r², so F = √2·r."""
    return math.sqrt(2.0) * math.sqrt(max(float(t["curve_dist2"].max()) for t in traces))


def check_langford(scenario: Scenario, seeds: int, pilot_seeds: int = 3,
                   progress: Callable[[int], object] | None = None,
                   problem: Problem | None = None) -> dict[str, Any]:
    """Everything ``check.json`` holds for ``--bound langford`` (see the module docstring).

    Raises:
        ScenarioError: seeds < 2 or pilot seeds < 1, or an injection the analysis does not
            cover (``langford_delay``).
    """
    check_counts(seeds, pilot_seeds, 1, 1)
    delay = langford_delay(scenario.inject)
    scenario = with_overrides(scenario, ["run.protocol=roundrobin", "run.lr_schedule=constant"])
    problem = problem if problem is not None else make_problem(scenario.problem)
    tau = scenario.run.threads - 1 + delay
    T = scenario.run.updates
    curv = curvature(problem)
    lam = problem.sample_strong_convexity
    result: dict[str, Any] = {
        "bound": "langford", "scenario": scenario.name, "seeds": seeds, "tau": tau,
        "threads": scenario.run.threads, "injected_delay": delay, "updates": T,
        "problem": problem.describe(), "guarantee": False,
        "conditions": {"convex": {"holds": curv.convex, "method": curv.method},
                       "sample_strong_convexity": {"lambda": lam}},
        "theorems": {},
    }
    if not curv.convex:
        result["verdict"] = (f"no guarantee: f is not convex ({curv.method}: smallest "
                             f"eigenvalue {curv.c:.4g})")
        return result
    pilot = pilot_runs(scenario, problem, pilot_seeds, progress)
    failed = pilot_diverged(pilot, scenario, "L and F")
    if failed is not None:
        result["verdict"] = f"no guarantee: {failed}"
        return result
    _, L0 = delay_and_gradient_bound(pilot)
    F0 = _domain_size(pilot)
    sigma = optimal_sigma(L0, F0, tau)
    result["pilot"] = {"L": L0, "F": F0, "sigma": sigma}
    # Each theorem: its name, lr, schedule, and its bound at horizon t for the runs' L and F.
    plans: list[tuple[str, float, str, Callable[[float, float, float], float]]] = [
        ("1_convex", sigma, "inv_sqrt", lambda L, F, t: convex_regret(L, F, tau, t, sigma))]
    if lam is not None and lam > 0:
        strong = lam
        plans.append(("2_strongly_convex", 1.0 / strong, "inverse",
                      lambda L, F, t: strongly_convex_regret(L, F, tau, t, strong)))
    horizon = np.arange(T + 1, dtype=np.float64)
    for name, lr, schedule, regret_bound in plans:
        regrets, L, F, mismatch = _regret_runs(scenario, problem, lr, schedule, seeds, tau,
                                               progress)
        bound = np.array([regret_bound(L, F, max(t, 1.0)) for t in horizon])
        mean, half, upper = _mean_and_bounds(regrets)
        entry: dict[str, Any] = {
            "lr": lr, "schedule": schedule, "L": L, "F": F,
            "delay_as_assumed": mismatch is None, "delay_mismatch": mismatch,
            "checkpoints": horizon.astype(int).tolist(), "mean": mean.tolist(),
            "half_width": half.tolist(), "upper": upper.tolist(), "bound": bound.tolist(),
            "final_mean": float(mean[-1]), "final_upper": float(upper[-1]),
            "final_bound": float(bound[-1]),
            # Not established (None) when the runs' delay is not the τ the bound assumes.
            "holds": bool(np.all(upper[1:] <= bound[1:])) if mismatch is None else None,
            "slack": float(bound[-1] / mean[-1]) if mean[-1] > 0 else None,
        }
        if name == "1_convex" and tau >= 1 and tau ** 2 <= T:
            entry["corollary"] = simple_convex_regret(L, F, tau, T)
        result["theorems"][name] = entry
    result["guarantee"] = all(e["holds"] is True for e in result["theorems"].values())
    result["verdict"] = _langford_verdict(result)
    return result


def _langford_verdict(result: dict[str, Any]) -> str:
    parts = []
    for name, e in result["theorems"].items():
        label = "Theorem 1 (σ/√(t−τ))" if name == "1_convex" else "Theorem 2 (1/(λ(t−τ)))"
        if e["holds"] is None:
            m = e["delay_mismatch"]
            parts.append(f"{label}: no guarantee, the runs do not have the delay τ = "
                         f"{result['tau']} the bound assumes (run {m['run']}, update "
                         f"{m['update']}: staleness {m['staleness']}, not {m['expected']})")
            continue
        state = "holds" if e["holds"] else "VIOLATED"
        slack = f", {e['slack']:.3g}× the mean" if e["slack"] else ""
        parts.append(f"{label} {state}: mean regret {e['final_mean']:.4g} (95% upper bound "
                     f"{e['final_upper']:.4g}) against the bound {e['final_bound']:.4g}{slack}")
    return "; ".join(parts)
