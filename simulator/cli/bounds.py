"""The bounds: ``asyngrad theorem``, ``check`` and ``tausweep``."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import default_out, floats, progress
from simulator.errors import AsyngradError, ScenarioError

THEOREM_ARGS = {
    "asyngrad": ("c", "q", "kappa", "tau", "eps", "a0"),
    "hogwild": ("c", "L", "M", "omega", "delta", "rho", "tau", "d0", "eps"),
    "langford": ("L", "F", "tau", "T"),
}

# The bounds each option of ``theorem`` and ``check`` belongs to, by argparse dest; a
# constant above (``check --eps`` too) belongs to the bounds that list it. One given to
# another bound is refused, not ignored.
OPTIONS = {"beta": ("asyngrad",), "theta": ("hogwild",), "sigma": ("langford",),
           "lam": ("langford",), "max_updates": ("asyngrad", "hogwild"),
           "rounds": ("asyngrad", "hogwild")}

# Options left out take these values (``tausweep --max-updates`` keeps its own default).
DEFAULTS = {"beta": 1.0, "theta": 0.5, "max_updates": 200_000, "rounds": 3, "points": 9}


def _flag(name: str) -> str:
    """The option an argparse dest comes from."""
    return "--lambda" if name == "lam" else "--" + name.replace("_", "-")


def _options(args: argparse.Namespace) -> None:
    """Refuse an option given on the command line (not None) that ``--bound`` does not use
    (``OPTIONS``, ``THEOREM_ARGS``), then fill in the defaults of those left out
    (``DEFAULTS``).

    Raises:
        ScenarioError: naming the option and the bounds that use it.
    """
    for name, value in list(vars(args).items()):
        users = OPTIONS.get(name) or tuple(
            bound for bound, constants in THEOREM_ARGS.items() if name in constants)
        if value is not None and users and args.bound not in users:
            raise ScenarioError(_flag(name), value, f"applies to --bound {' or '.join(users)} "
                                f"only (not {args.bound})")
        if value is None and name in DEFAULTS:
            setattr(args, name, DEFAULTS[name])


def _theorem(args: argparse.Namespace) -> int:
    import json

    _options(args)
    for name in THEOREM_ARGS[args.bound]:
        if getattr(args, name) is None:
            raise ScenarioError(f"--{name}", None, f"is required by --bound {args.bound}")
        if not math.isfinite(getattr(args, name)):
            raise ScenarioError(f"--{name}", getattr(args, name), "must be a finite number")
    result = {"asyngrad": _asyngrad_theorem, "hogwild": _hogwild_theorem,
              "langford": _langford_theorem}[args.bound](args)
    verdict = result.get("verdict")
    if args.json:
        print(json.dumps(result, indent=2))
    if verdict is not None and not result["runnable"]:
        raise AsyngradError(verdict)
    if not args.json:
        for line in result.pop("lines"):
            print(line)
    return 0


def _count(updates: int | None) -> str:
    """An update count as printed (in scientific notation from 10^15); None: one beyond 64
    bits (or floating point)."""
    if updates is None:
        return "more than 2^63"
    return f"{updates:,}" if updates < 10 ** 15 else f"{float(updates):.3g}"


def _updates(count: Callable[[], int]) -> int | None:
    """A bound's update count, None where its formula refuses it as beyond any run
    (``InfeasibleError``; judged by :func:`_runnable`)."""
    from theory.asyngrad import InfeasibleError

    try:
        return count()
    except InfeasibleError:
        return None


def _runnable(result: dict[str, Any], count: str, step: str) -> None:
    """Judge the bound's update count against what a run can make (``GRADIENT_LIMIT``, the
    most gradients ``simulator.budget.preflight`` lets one run compute) and this machine's
    memory; the verdict goes into ``result`` (``runnable``, ``fits_here``, ``verdict``).
    ``updates`` None: the count is beyond 64 bits (or floating point)."""
    from simulator.budget import GRADIENT_LIMIT, max_updates

    updates, here = result["updates"], max_updates()
    result["runnable"] = updates is not None and updates <= GRADIENT_LIMIT
    result["fits_here"] = result["runnable"] and updates <= here
    shown = _count(updates)
    if not result["runnable"]:
        result["verdict"] = (f"{count} = {shown} updates at {step} = {result['gamma']:.6g}: "
                             f"more than any run can make (at most {GRADIENT_LIMIT:,} "
                             "gradients); the bound cannot be checked by simulation")
    elif not result["fits_here"]:
        result["verdict"] = (f"{count} = {shown} updates: more than this machine's memory "
                             f"holds in one run (about {here:,})")
    else:
        result["verdict"] = f"{count} = {shown} updates: a run can make them"


def _asyngrad_theorem(args: argparse.Namespace) -> dict[str, Any]:
    from theory.asyngrad import (
        Constants,
        error_budget,
        fixed_point,
        learning_rate,
        tau_limit,
        updates,
    )

    if args.kappa <= 0 or not math.isfinite(args.kappa * args.kappa):
        raise ScenarioError("--kappa", args.kappa, "must be a finite number > 0 whose square "
                            "is finite")
    k = Constants(c=args.c, q=args.q, kappa2=args.kappa * args.kappa, tau=args.tau, a0=args.a0)
    gamma = learning_rate(k, args.eps, args.beta)
    result: dict[str, Any] = {
        "bound": "asyngrad", "c": k.c, "q": k.q, "kappa2": k.kappa2, "tau": k.tau, "a0": k.a0,
        "eps": args.eps, "beta": args.beta, "gamma": gamma,
        "updates": _updates(lambda: updates(k, args.eps, args.beta)),
        "error_budget": error_budget(k, args.eps),
        "tau_limit": tau_limit(k, args.eps), "fixed_point": fixed_point(k, gamma),
        "q_times_fixed_point": k.q * fixed_point(k, gamma)}
    _runnable(result, "t (10)", "γ (9)")
    if not args.json:
        result["lines"] = [
            f"Theorem 1 (AsynGrad): c={k.c:g} q={k.q:g} κ²={k.kappa2:g} τ={k.tau:g} "
            f"ε={args.eps:g} a0={k.a0:g} β={args.beta:g}",
            f"  error budget 2τq/(cε)          {result['error_budget']:.6g}  (< 1 required; "
            f"τ limit cε/(2q) = {result['tau_limit']:.6g})",
            f"  learning rate γ (9)            {gamma:.6g}",
            f"  updates t (10)                 {_count(result['updates'])}",
            f"  fixed point (γκ² + 2τ)/c       {result['fixed_point']:.6g}  "
            f"(q × it = {result['q_times_fixed_point']:.6g} <= ε)",
            f"  {result['verdict']}"]
    return result


def _hogwild_theorem(args: argparse.Namespace) -> dict[str, Any]:
    from theory.hogwild import (
        COUNT_TAU2,
        HogwildConstants,
        lag_factor,
        step_size,
        updates,
    )

    k = HogwildConstants(c=args.c, L=args.L, M=args.M, omega=args.omega, delta=args.delta,
                         rho=args.rho, tau=args.tau, d0=args.d0)
    lagless = dataclasses.replace(k, tau=0.0)
    gamma = step_size(k, args.eps, args.theta)
    result: dict[str, Any] = {
        "bound": "hogwild", **dataclasses.asdict(k), "eps": args.eps, "theta": args.theta,
        "gamma": gamma, "updates": _updates(lambda: updates(k, args.eps, args.theta)),
        "lag_factor": lag_factor(k), "lag_factor_count": lag_factor(k, COUNT_TAU2),
        "serial_updates": _updates(lambda: updates(lagless, args.eps, args.theta))}
    _runnable(result, "k (4.2)", "γ (4.1)")
    if not args.json:
        serial = result["serial_updates"]
        result["lines"] = [
            f"Hogwild! Proposition 4.1: c={k.c:g} L={k.L:g} M={k.M:g} Ω={k.omega:g} "
            f"Δ={k.delta:g} ρ={k.rho:g} τ={k.tau:g} D0={k.d0:g} ε={args.eps:g} "
            f"ϑ={args.theta:g}",
            f"  lag factor of γ (4.1), 1 + 6ρτ + 4τ²Ω√Δ   {result['lag_factor']:.6g}",
            f"  step size γ (4.1)                        {gamma:.6g}",
            f"  lag factor of k (4.2), 1 + 6τρ + 6τ²Ω√Δ   {result['lag_factor_count']:.6g}",
            f"  updates k (4.2)                          {_count(result['updates'])}  "
            f"(serial, τ = 0: {_count(serial)})",
            f"  {result['verdict']}"]
    return result


def _langford_theorem(args: argparse.Namespace) -> dict[str, Any]:
    from theory.langford import (
        convex_regret,
        optimal_sigma,
        simple_convex_regret,
        strongly_convex_regret,
    )

    sigma = args.sigma if args.sigma is not None else optimal_sigma(args.L, args.F, args.tau)
    result: dict[str, Any] = {
        "bound": "langford", "L": args.L, "F": args.F, "tau": args.tau, "T": args.T,
        "sigma": sigma, "convex_regret": convex_regret(args.L, args.F, args.tau, args.T, sigma),
        "corollary": (simple_convex_regret(args.L, args.F, args.tau, args.T)
                      if args.tau >= 1 and args.tau ** 2 <= args.T else None),
        "lambda": args.lam,
        "strongly_convex_regret": (None if args.lam is None else strongly_convex_regret(
            args.L, args.F, args.tau, args.T, args.lam))}
    if not args.json:
        lines = [f"Delayed SGD (Langford et al. 2009): L={args.L:g} F={args.F:g} "
                 f"τ={args.tau:g} T={args.T:g}",
                 f"  Theorem 1, η_t = σ/√(t−τ), σ = {sigma:.6g}: regret <= "
                 f"{result['convex_regret']:.6g}"]
        if result["corollary"] is not None:
            lines.append(f"  corollary 4FL√(τT) (σ² = F²/(2τL²), T >= τ²): "
                         f"{result['corollary']:.6g}")
        if args.lam is not None:
            lines.append(f"  Theorem 2, η_t = 1/(λ(t−τ)), λ = {args.lam:g}: regret <= "
                         f"{result['strongly_convex_regret']:.6g}")
        lines.append(f"  average regret at T: {result['convex_regret'] / args.T:.6g}"
                     + ("" if args.lam is None else
                        f" (Theorem 2: {result['strongly_convex_regret'] / args.T:.6g})"))
        result["lines"] = lines
    return result


CHECK_FILES = ("check.json", "check.png")


TAUSWEEP_FILES = ("tausweep.json", "tausweep.png")


def _check(args: argparse.Namespace) -> int:

    from simulator.rundir import check_out, publish, write_json
    from simulator.scenario import load_scenario
    from theory.plots import check_figure, regret_figure

    _options(args)
    if args.bound != "langford" and args.eps is None:
        raise ScenarioError("--eps", None, f"is required by --bound {args.bound}")
    scenario = load_scenario(args.scenario, args.set)
    out = default_out(args.out, "check", scenario.name)
    check_out(out, CHECK_FILES)
    # At most: rounds stop once the assumptions hold; delayed SGD runs Theorem 1, and
    # Theorem 2 where the losses are strongly convex.
    validations = 2 if args.bound == "langford" else args.rounds
    with progress(args.pilot_seeds + args.seeds * validations, args.quiet) as bar:
        if args.bound == "asyngrad":
            from theory.check import check_theorem
            result = check_theorem(scenario, args.eps, args.seeds, args.beta, args.pilot_seeds,
                                   args.max_updates, args.rounds, bar.update)
        elif args.bound == "hogwild":
            from theory.bounds import check_hogwild
            result = check_hogwild(scenario, args.eps, args.seeds, args.theta,
                                   args.pilot_seeds, args.max_updates, args.rounds, bar.update)
        else:
            from theory.bounds import check_langford
            result = check_langford(scenario, args.seeds, args.pilot_seeds, bar.update)
    figure = regret_figure if args.bound == "langford" else check_figure

    def write(where: Path) -> None:
        write_json(where / "check.json", result)
        figure(result).savefig(where / "check.png", dpi=110)

    publish(out, CHECK_FILES, write)
    if not args.quiet:
        {"asyngrad": _print_asyngrad_check, "hogwild": _print_hogwild_check,
         "langford": _print_langford_check}[args.bound](result, scenario.name)
        print(f"  {result['verdict']}")
        print(f"  wrote {out}/check.json and check.png")
    return 1 if "VIOLATED" in result["verdict"] else 0


def _print_asyngrad_check(result: dict[str, Any], name: str) -> None:
    conditions = result["conditions"]
    c4, c5 = conditions["4_strong_convexity"], conditions["5_smoothness"]
    print(f"Theorem 1 check of {name} (ε = {result['eps']:g}, β = {result['beta']:g})")
    print(f"  (4) c  = {c4['c']:.6g}  [{c4['method']}]  {'holds' if c4['holds'] else 'FAILS'}")
    print(f"  (5) q  = {c5['q']:.6g}")
    if "6_update_bound" in conditions:
        c6, c7 = conditions["6_update_bound"], conditions["7_error_bound"]
        print(f"  (6) κ² = {c6['kappa2']:.6g}  [{c6['source']}]")
        print(f"  (7) τ  = {c7['tau']:.6g}, limit cε/(2q) = {c7['limit']:.6g}, margin "
              f"{c7['margin']:.6g}  {'holds' if c7['holds'] else 'FAILS'}")
    print(f"  a0 = {result['a0']:.6g}")
    for i, entry in enumerate(result["rounds"]):
        if "gamma" in entry:
            print(f"  round {i}: γ (9) = {entry['gamma']:.6g}, t (10) = "
                  f"{entry['updates']:,}, assumptions held: "
                  + ("not re-measured" if entry["measured"] is None
                     else str(entry["assumptions_held"])))
    _print_reached(result, "t")


def _print_hogwild_check(result: dict[str, Any], name: str) -> None:
    conditions = result["conditions"]
    convex, sparsity = conditions["strong_convexity"], conditions["sparsity"]
    print(f"Hogwild! Proposition 4.1 check of {name} (ε = {result['eps']:g}, "
          f"ϑ = {result['theta']:g})")
    print(f"  c = {convex['c']:.6g}, L = {conditions['smoothness']['L']:.6g}  "
          f"[{convex['method']}]  {'holds' if convex['holds'] else 'FAILS'}")
    print(f"  Ω = {sparsity['omega']}, Δ = {sparsity['delta']:.4g}, ρ = {sparsity['rho']:.4g} "
          f"(over {sparsity['samples']} samples), D0 = {result['d0']:.6g}")
    for i, entry in enumerate(result["rounds"]):
        updates = f"{entry['updates']:,}" if "updates" in entry else "too many"
        print(f"  round {i}: τ = {entry['tau']}, M = {entry['M']:.4g} [{entry['source']}]; "
              f"γ (4.1) = {entry['gamma']:.4g} (its lag factor 1 + 6ρτ + 4τ²Ω√Δ = "
              f"{entry['lag_factor']:.4g}), k (4.2) = {updates} (with 6τ²Ω√Δ)")
    _print_reached(result, "k")


def _print_reached(result: dict[str, Any], count: str) -> None:
    """When the validation's mean fell below ε and the tightness, its share of the bound's
    ``count``; nothing without a validation."""
    validation = result.get("validation")
    if validation and validation["reached_eps_at"] is not None:
        print(f"  the mean fell below ε after {validation['reached_eps_at']:,} updates "
              f"(tightness {validation['tightness']:.3g} of {count})")


def _print_langford_check(result: dict[str, Any], name: str) -> None:
    delay = result["injected_delay"]
    print(f"Delayed-SGD check (Langford et al. 2009) of {name}: roundrobin, τ = "
          f"{result['tau']}" + (f" (k − 1 + injected delay {delay})" if delay else "")
          + f", T = {result['updates']:,}")
    pilot = result.get("pilot")
    if pilot:
        print(f"  pilot runs: L = {pilot['L']:.4g}, F = {pilot['F']:.4g}, σ = F/(L√(2τ)) = "
              f"{pilot['sigma']:.4g}")
    for label, e in result["theorems"].items():
        print(f"  Theorem {label[0]}: lr {e['lr']:.4g} ({e['schedule']}), measured L = "
              f"{e['L']:.4g}, F = {e['F']:.4g}; mean regret {e['final_mean']:.4g}, bound "
              f"{e['final_bound']:.4g}" + (f", corollary 4FL√(τT) = {e['corollary']:.4g}"
                                          if e.get("corollary") else ""))


def _tausweep(args: argparse.Namespace) -> int:

    from simulator.rundir import check_out, publish, write_json
    from simulator.scenario import load_scenario
    from theory.injection import tau_sweep
    from theory.plots import tausweep_figure

    if args.bounds and args.points is not None:
        raise ScenarioError("--points", args.points, "sizes the default grid; --bounds gives "
                            "the error norms itself")
    args.points = DEFAULTS["points"] if args.points is None else args.points
    scenario = load_scenario(args.scenario, args.set)
    bounds = floats("--bounds", args.bounds) if args.bounds else None
    out = default_out(args.out, "tausweep", scenario.name)
    check_out(out, TAUSWEEP_FILES)
    total = args.pilot_seeds + args.seeds * (len(bounds) if bounds else args.points)
    with progress(total, args.quiet) as bar:
        result = tau_sweep(scenario, args.eps, args.seeds, bounds, args.points, args.horizon,
                           args.beta, args.pilot_seeds, args.max_updates, bar.update)

    def write(where: Path) -> None:
        write_json(where / "tausweep.json", result)
        tausweep_figure(result).savefig(where / "tausweep.png", dpi=110)

    publish(out, TAUSWEEP_FILES, write)
    if not args.quiet:
        print(f"Error-injection sweep of {scenario.name} (ε = {args.eps:g})")
        if "gamma" in result:
            print(f"  c = {result['c']:.4g}, q = {result['q']:.4g}, κ² = {result['kappa2']:.4g},"
                  f" scenario's own τ = {result['tau_scenario']:.4g}; γ (9) = "
                  f"{result['gamma']:.4g}, {result['ran_updates']:,} updates per run")
            print("  bound b | τ measured | final f − f* (mean) | reached ε")
            for p in result["points"]:
                print(f"  {p['bound']:.4g} | " + (
                    f"{p['tau']:.4g} | {p['final_mean']:.4g} | "
                    f"{'yes' if p['reached_eps'] else 'no'}" if p["tau"] is not None
                    else "diverged | n/a | no"))
        print(f"  {result['verdict']}")
        print(f"  wrote {out}/tausweep.json and tausweep.png")
    return 0


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
    theorem = command("theorem", "a bound's learning rate and update count from its "
                      "constants: AsynGrad Theorem 1, Hogwild! Prop. 4.1, delayed SGD",
                      _theorem, out=None, scenario=False)
    theorem.add_argument("--bound", choices=tuple(THEOREM_ARGS), default="asyngrad",
                         help="which bound (default asyngrad); each needs its own constants")
    for name, meaning in (("c", "strong convexity c (AsynGrad (4), Hogwild!)"),
                          ("q", "smoothness q (AsynGrad (5))"),
                          ("kappa", "bound κ with E‖s_t‖² <= κ² (AsynGrad (6))"),
                          ("tau", "AsynGrad: gradient-error bound τ (7); Hogwild!, delayed "
                                  "SGD: the lag in updates"),
                          ("eps", "target accuracy ε (AsynGrad, Hogwild!)"),
                          ("a0", "a_0 = ‖w_0 − w*‖² (AsynGrad)"),
                          ("L", "Lipschitz constant of ∇f (Hogwild!); gradient-norm bound "
                                "(delayed SGD)"),
                          ("M", "bound on sample-gradient norms (Hogwild!)"),
                          ("omega", "Ω, the largest support (Hogwild!)"),
                          ("delta", "Δ, largest share of samples on one coordinate (Hogwild!)"),
                          ("rho", "ρ, largest share of samples overlapping one (Hogwild!)"),
                          ("d0", "D_0 = ‖x_0 − x*‖² (Hogwild!)"),
                          ("F", "F, with ½‖x − x'‖² <= F² on the domain (delayed SGD)"),
                          ("T", "horizon T (delayed SGD)"),
                          ("sigma", "σ of η_t = σ/√(t−τ) (delayed SGD; default F/(L√(2τ)))")):
        theorem.add_argument(f"--{name}", type=float, default=None, help=meaning)
    theorem.add_argument("--lambda", dest="lam", type=float, default=None,
                         help="λ: every f_t λ-strongly convex (delayed SGD Theorem 2)")
    theorem.add_argument("--beta", type=float, help="β >= 1 (AsynGrad; default 1)")
    theorem.add_argument("--theta", type=float, help="ϑ in (0, 1) (Hogwild!; default 0.5)")
    theorem.add_argument("--json", action="store_true", help="print the results as JSON")

    check = command("check", "measure a bound's conditions on a scenario and validate it by "
                    "Monte Carlo", _check, out="directory for check.json and check.png "
                    "(default runs/check-NAME)", out_required=False)
    check.add_argument("--bound", choices=tuple(THEOREM_ARGS), default="asyngrad",
                       help="AsynGrad Theorem 1 (default), Hogwild! Prop. 4.1, or delayed SGD "
                            "(Langford et al. 2009, run as roundrobin)")
    check.add_argument("--eps", type=float, default=None,
                       help="target accuracy ε (asyngrad, hogwild)")
    check.add_argument("--seeds", type=int, default=30, help="Monte Carlo runs (default 30)")
    check.add_argument("--beta", type=float, help="β >= 1 (asyngrad; default 1)")
    check.add_argument("--theta", type=float, help="ϑ in (0, 1) (hogwild; default 0.5)")
    check.add_argument("--pilot-seeds", type=int, default=3,
                       help="pilot runs that estimate the constants (default 3)")
    check.add_argument("--max-updates", type=int,
                       help="cap on the updates of each validation run (asyngrad, hogwild; "
                            "default 200000)")
    check.add_argument("--rounds", type=int,
                       help="re-estimation rounds of the run-dependent constants (asyngrad, "
                            "hogwild; default 3)")

    tsweep = command("tausweep", "inject adversarial gradient errors of growing size and find "
                     "where convergence to ε stops, against Theorem 1's limit", _tausweep,
                     out="directory for tausweep.json and tausweep.png "
                     "(default runs/tausweep-NAME)", out_required=False)
    tsweep.add_argument("--eps", type=float, required=True, help="target accuracy ε")
    tsweep.add_argument("--seeds", type=int, default=5, help="runs per error size (default 5)")
    tsweep.add_argument("--bounds", metavar="B1,B2,...",
                        help="error norms to inject (default: --points norms around the limit)")
    tsweep.add_argument("--points", type=int,
                        help="size of the default grid (default 9; not with --bounds)")
    tsweep.add_argument("--horizon", type=float, default=2.0,
                        help="run length as a multiple of t of (10) (default 2)")
    tsweep.add_argument("--beta", type=float, default=1.0, help="β >= 1 (default 1)")
    tsweep.add_argument("--pilot-seeds", type=int, default=3,
                        help="pilot runs that estimate κ² and the scenario's τ (default 3)")
    tsweep.add_argument("--max-updates", type=int, default=100_000,
                        help="cap on the updates of each run (default 100000)")
