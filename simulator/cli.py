"""``asyngrad``: the command line.

Every user error (a bad scenario value, a corrupt trace, a bad flag) prints one line naming
the field and value and exits with status 2; nothing is written before the input is known good.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from simulator.errors import AsyngradError, ScenarioError
from simulator.scenario import SLICINGS

__all__ = ["main"]

CHECK_FILES = ("check.json", "check.png")
TAUSWEEP_FILES = ("tausweep.json", "tausweep.png")
TABLE_FILES = ("table.csv", "table.md")
COMPARE_FILES = ("compare.json", "compare.png")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _print_summary(summary: dict[str, Any], out: Path, seconds: float) -> None:
    error, stale, over = summary["gradient_error"], summary["staleness"], summary["overwrites"]
    rate = "off" if error["rate"] is None else f"{error['rate']:.3f}"
    median = error["relative"]["p50"]
    real = summary.get("real")  # a real run: the backend and the mode that ran
    ran = (f"{summary['protocol']}" if real is None else
           f"{real.get('backend', 'shm')} {real.get('mode', summary['protocol'])}")
    print(f"{ran} k={summary['threads']} T={summary['updates']} "
          f"B={summary['blocks']}{'' if real else ' ' + summary['write_mode']} on "
          f"{summary['problem']['name']} (d={summary['problem']['dim']})")
    print(f"  gradient error rate {rate}, median relative error "
          f"{'n/a' if median is None else f'{median:.3g}'}")
    if summary.get("steps", summary["updates"]) != summary["updates"]:
        print(f"  {summary['steps']} applied steps, {summary['discarded']} gradients discarded")
    if summary.get("ended_early"):
        print(f"  ended early: {summary['updates']} gradients; dead threads "
              f"{summary.get('dead_threads', [])} (a protocol waiting on them stalls)")
    if stale["mean"] is not None:
        print(f"  staleness mean {stale['mean']:.2f}, p95 {stale['p95']:.0f}, "
              f"max {stale['max']}")
    print(f"  lost blocks {over['lost_blocks']}, torn reads {over['torn_reads']}, "
          f"read-overwritten blocks {over['read_overwrite_blocks']}")
    met = summary.get("writes", {})
    if summary["threads"] > 1 and met.get("met_rate"):
        lone = met["lone_median_ns"]
        print(f"  writes met by another {met['met_rate']:.3f} (median "
              f"{met['met_median_ns'] / 1e3:.3g} µs, lone "
              f"{'n/a' if lone is None else f'{lone / 1e3:.3g}'} µs)")
    clock = "wall-clock span" if summary["source"] == "real" else "simulated time"
    print(f"  final suboptimality {summary['loss']['final_suboptimality']:.4g}, "
          f"{clock} {summary['time']['span_ns'] / 1e6:.3f} ms "
          f"({summary['time']['updates_per_second']:.4g} updates/s)")
    task = summary.get("task", {})
    if task.get("accuracy") is not None:
        held = task["held_out_accuracy"]
        print(f"  accuracy {task['accuracy']:.3f}"
              + ("" if held is None else f", held out {held:.3f}"))
    print(f"  wrote {out}/ in {seconds:.2f} s")


def _progress(total: int, quiet: bool) -> Any:
    """A progress bar on stderr when it is a terminal. A terminal that reports no size (a
    pseudo-terminal nobody sized) counts as 80 × 24: tqdm would draw nothing in 0 × 0."""
    from tqdm import tqdm
    shown = not quiet and sys.stderr.isatty()
    columns, lines = os.get_terminal_size(sys.stderr.fileno()) if shown else (0, 0)
    return tqdm(total=total, unit="upd", disable=not shown, leave=False,
                ncols=columns or 80, nrows=lines or 24)


def _simulate(args: argparse.Namespace) -> int:
    from simulator.engine import Engine
    from simulator.rundir import check_out, write_run
    from simulator.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    check_out(args.out)
    started = time.perf_counter()
    engine = Engine(scenario)
    with _progress(scenario.run.updates, args.quiet) as bar:
        engine.progress = bar.update
        trace = engine.run()
    summary = write_run(args.out, scenario, trace, engine.problem)
    if not args.quiet:
        _print_summary(summary, Path(args.out), time.perf_counter() - started)
        _print_diverged(summary)
    return 0


def _print_diverged(summary: dict[str, Any]) -> None:
    """The line a run that diverged gets after its summary (summary.json: diverged_at)."""
    if summary.get("diverged_at") is not None:
        print(f"  diverged at update {summary['diverged_at']}: w or f(w) stopped being finite "
              f"(lr {summary['lr']:g})")


def _replay(args: argparse.Namespace) -> int:
    from simulator.replay import load_trace, replay
    from simulator.rundir import check_out, write_run

    started = time.perf_counter()
    check_out(args.out)
    if args.schedule is not None:
        scenario, problem, trace = _replay_schedule(Path(args.trace), args.schedule, args.set)
    else:
        recorded = load_trace(args.trace)
        scenario, problem, trace = replay(recorded, args.set)
    out = Path(args.out)
    summary = write_run(out, scenario, trace, problem)
    if not args.quiet:
        _print_summary(summary, out, time.perf_counter() - started)
        _print_diverged(summary)
    return 0


def _replay_schedule(path: Path, text: str, overrides: list[str]) -> tuple[Any, Any, Any]:
    """Re-run a controlled schedule on a scenario file, or on the scenario.toml of a
    directory (an ``asyngrad explore`` output or a run directory)."""
    from simulator.scenario import load_scenario
    from simulator.schedule import Scheduler, parse_schedule, run_schedule

    source = path / "scenario.toml" if path.is_dir() else path
    scenario = load_scenario(source, overrides)
    if Path(text).is_file():  # a schedule file, such as explore's worst.schedule
        text = Path(text).read_text().strip()
    threads = 1 if scenario.run.protocol == "serial" else scenario.run.threads
    result = run_schedule(scenario, Scheduler("fixed", threads,
                                              schedule=parse_schedule(text)))
    return scenario, result.problem, result.trace


def _dask_client(address: str) -> Any:
    """A Dask ``distributed`` client of the scheduler at ``address``."""
    try:
        from distributed import Client
    except ImportError:
        raise AsyngradError("--dask: needs the 'distributed' package "
                            "(pip install 'asyngrad-lab[cluster]')") from None
    try:
        return Client(address, timeout=10)
    except OSError as err:
        raise AsyngradError(f"--dask = '{address}': no scheduler there ({err})") from None


def _sweep(args: argparse.Namespace) -> int:
    from concurrent.futures import ProcessPoolExecutor

    from simulator.sweep import MAX_CELLS, Axis, parse_axis, plan_sweep, run_sweep

    for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs)):
        if value is not None and value < 1:
            raise ScenarioError(flag, value, "must be >= 1")
    if args.seeds is not None and args.seeds > MAX_CELLS:
        raise ScenarioError("--seeds", args.seeds, f"must be <= {MAX_CELLS:,} (cells of one "
                            "sweep)")
    axes = [parse_axis(text) for text in args.grid]
    if args.seeds is not None:
        axes.append(Axis("run.seed", tuple(str(s) for s in range(args.seeds))))
    if not axes:
        raise AsyngradError("sweep: give at least one --grid KEY=V1,V2,... or --seeds N")
    cells = plan_sweep(args.scenario, args.set, axes)
    started = time.perf_counter()
    jobs = min(args.jobs or os.cpu_count() or 1, len(cells))
    with _progress(len(cells), args.quiet) as bar:
        if args.dask:
            with _dask_client(args.dask) as client:
                rows, ran = run_sweep(cells, axes, args.out, client.get_executor(), bar.update)
        elif jobs > 1:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                rows, ran = run_sweep(cells, axes, args.out, pool, bar.update)
        else:
            rows, ran = run_sweep(cells, axes, args.out, None, bar.update)
    if not args.quiet:
        keys = [a.key for a in axes]
        print(" | ".join([*keys, "error rate", "staleness", "lost blocks", "suboptimality"]))
        for row in rows:
            rate = "off" if row["error_rate"] is None else f"{row['error_rate']:.3f}"
            print(" | ".join([*(str(row[k]) for k in keys), rate, f"{row['staleness_mean']:.2f}",
                              str(row["lost_blocks"]), f"{row['final_suboptimality']:.4g}"]))
        print(f"{ran} cells ran, {len(cells) - ran} resumed; wrote {args.out}/sweep.csv in "
              f"{time.perf_counter() - started:.1f} s")
    return 0


THEOREM_ARGS = {
    "asyngrad": ("c", "q", "kappa", "tau", "eps", "a0"),
    "hogwild": ("c", "L", "M", "omega", "delta", "rho", "tau", "d0", "eps"),
    "langford": ("L", "F", "tau", "T"),
}


def _theorem(args: argparse.Namespace) -> int:
    import json

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
    bits."""
    if updates is None:
        return "more than 2^63"
    return f"{updates:,}" if updates < 10 ** 15 else f"{float(updates):.3g}"


def _runnable(result: dict[str, Any], count: str, step: str) -> None:
    """Judge the bound's update count against what a run can make (``GRADIENT_LIMIT``, the
    most gradients ``simulator.budget.preflight`` lets one run compute) and this machine's
    memory; the verdict goes into ``result`` (``runnable``, ``fits_here``, ``verdict``).
    ``updates`` None: the count does not even fit in 64 bits."""
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
        "updates": updates(k, args.eps, args.beta), "error_budget": error_budget(k, args.eps),
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
    from theory.asyngrad import InfeasibleError
    from theory.hogwild import (
        COUNT_TAU2,
        HogwildConstants,
        lag_factor,
        step_size,
        updates,
    )

    k = HogwildConstants(c=args.c, L=args.L, M=args.M, omega=args.omega, delta=args.delta,
                         rho=args.rho, tau=args.tau, d0=args.d0)
    gamma = step_size(k, args.eps, args.theta)

    def count(constants: HogwildConstants) -> int | None:
        try:
            return updates(constants, args.eps, args.theta)
        except InfeasibleError:  # beyond 64 bits: judged by _runnable
            return None

    result: dict[str, Any] = {
        "bound": "hogwild", **dataclasses.asdict(k), "eps": args.eps, "theta": args.theta,
        "gamma": gamma, "updates": count(k), "lag_factor": lag_factor(k),
        "lag_factor_count": lag_factor(k, COUNT_TAU2),
        "serial_updates": count(dataclasses.replace(k, tau=0.0))}
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


def _check(args: argparse.Namespace) -> int:
    import json

    from simulator.rundir import check_out, publish
    from simulator.scenario import load_scenario
    from theory.plots import check_figure, regret_figure

    if args.bound != "langford" and args.eps is None:
        raise ScenarioError("--eps", None, f"is required by --bound {args.bound}")
    scenario = load_scenario(args.scenario, args.set)
    out = Path(args.out or f"runs/check-{scenario.name}")
    check_out(out, CHECK_FILES)
    with _progress(args.pilot_seeds + args.seeds * args.rounds, args.quiet) as bar:
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
        (where / "check.json").write_text(json.dumps(result, indent=2) + "\n")
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
                  f"{entry['updates']:,}, assumptions held: {entry['assumptions_held']}")
    validation = result.get("validation")
    if validation and validation["reached_eps_at"] is not None:
        print(f"  the mean fell below ε after {validation['reached_eps_at']:,} updates "
              f"(tightness {validation['tightness']:.3g} of t)")


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
    validation = result.get("validation")
    if validation and validation["reached_eps_at"] is not None:
        print(f"  the mean fell below ε after {validation['reached_eps_at']:,} updates "
              f"(tightness {validation['tightness']:.3g} of k)")


def _print_langford_check(result: dict[str, Any], name: str) -> None:
    print(f"Delayed-SGD check (Langford et al. 2009) of {name}: roundrobin, τ = "
          f"{result['tau']}, T = {result['updates']:,}")
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
    import json

    from simulator.rundir import check_out, publish
    from simulator.scenario import load_scenario
    from theory.injection import tau_sweep
    from theory.plots import tausweep_figure

    scenario = load_scenario(args.scenario, args.set)
    bounds = _floats("--bounds", args.bounds) if args.bounds else None
    out = Path(args.out or f"runs/tausweep-{scenario.name}")
    check_out(out, TAUSWEEP_FILES)
    total = args.pilot_seeds + args.seeds * (len(bounds) if bounds else args.points)
    with _progress(total, args.quiet) as bar:
        result = tau_sweep(scenario, args.eps, args.seeds, bounds, args.points, args.horizon,
                           args.beta, args.pilot_seeds, args.max_updates, bar.update)

    def write(where: Path) -> None:
        (where / "tausweep.json").write_text(json.dumps(result, indent=2) + "\n")
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
                print(f"  {p['bound']:.4g} | {p['tau']:.4g} | {p['final_mean']:.4g} | "
                      f"{'yes' if p['reached_eps'] else 'no'}")
        print(f"  {result['verdict']}")
        print(f"  wrote {out}/tausweep.json and tausweep.png")
    return 0


def _compare(args: argparse.Namespace) -> int:
    import json

    from simulator.compare import LAG_EDGES, OFFSET_EDGES, compare_figure, compare_runs
    from simulator.rundir import check_out, latency_pair, publish

    out = Path(args.out or "runs/compare")
    check_out(out, COMPARE_FILES)
    report = compare_runs(args.run_a, args.run_b)

    def write(where: Path) -> None:
        (where / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
        compare_figure(args.run_a, args.run_b).savefig(where / "compare.png", dpi=100)

    publish(out, COMPARE_FILES, write)
    if not args.quiet:
        st, ge, lo = report["staleness"], report["gradient_error"], report["loss"]

        def num(value: Any, spec: str = ".4g") -> str:
            return "n/a" if value is None else format(value, spec)

        def quartiles(values: list[float] | None) -> str:
            return "n/a" if values is None else "/".join(format(v, ".3g") for v in values)

        def bins(lags: dict[str, Any] | None, key: str) -> str:
            return "n/a" if lags is None else "/".join(num(v, ".2f") for v in lags[key])

        def us(ns: float | None) -> str:
            return num(None if ns is None else ns / 1e3, ".1f")

        print(f"A: {report['a']['label']}\nB: {report['b']['label']}")
        print(f"  staleness mean {num(st['mean_a'])} vs {num(st['mean_b'])} (gap "
              f"{num(st['relative_mean_gap'], '.1%')}), p95 {num(st['p95_a'])} vs "
              f"{num(st['p95_b'])}, KS distance {num(st['ks_distance'], '.3f')}")
        print(f"  gradient error rate {num(ge['a']['rate'], '.3f')} vs "
              f"{num(ge['b']['rate'], '.3f')}, relative error p50 {num(ge['a']['p50'])} vs "
              f"{num(ge['b']['p50'])}, p95 {num(ge['a']['p95'])} vs {num(ge['b']['p95'])}")
        oa, ob = report["overwrites"]["a"], report["overwrites"]["b"]
        print(f"  lost blocks per update {num(oa['lost_blocks_per_update'], '.3g')} vs "
              f"{num(ob['lost_blocks_per_update'], '.3g')}, torn reads "
              f"{oa['torn_read_fraction']:.3g} vs {ob['torn_read_fraction']:.3g}; pairs of "
              f"writes that met losing stores {num(oa['pairs_losing'], '.3f')} vs "
              f"{num(ob['pairs_losing'], '.3f')} (of {oa['pairs_classified']} vs "
              f"{ob['pairs_classified']} classified), share of the block lost per pair "
              f"{num(oa['lost_per_pair'], '.3g')} vs {num(ob['lost_per_pair'], '.3g')}, by a "
              f"pair that lost any (quartiles) {quartiles(oa['lost_per_lossy_pair'])} vs "
              f"{quartiles(ob['lost_per_lossy_pair'])}, their start lag over a lone write "
              f"(quartiles) {quartiles(oa['pair_lag_over_lone_write'])} vs "
              f"{quartiles(ob['pair_lag_over_lone_write'])}")
        la, lb = oa["meeting_lags"], ob["meeting_lags"]
        if la is not None or lb is not None:
            edges = ", ".join(f"{e:g}" for e in LAG_EDGES[:-1])
            print(f"  pairs that met by start lag over a lone write (bins {edges} W): shares "
                  f"{bins(la, 'shares')} vs {bins(lb, 'shares')}, lossy "
                  f"{bins(la, 'lossy_by_lag')} vs {bins(lb, 'lossy_by_lag')}")
        ia, ib = report["interference"]["a"], report["interference"]["b"]
        print(f"  writes overlapping a write {num(ia['write_overlap_rate'], '.3f')} vs "
              f"{num(ib['write_overlap_rate'], '.3f')}, reads under a write "
              f"{num(ia['read_under_write_rate'], '.3f')} vs "
              f"{num(ib['read_under_write_rate'], '.3f')}; error rate at staleness 0 "
              f"{num(ia['error_rate_fresh'], '.3f')} vs {num(ib['error_rate_fresh'], '.3f')}, "
              f"above 0 {num(ia['error_rate_stale'], '.3f')} vs "
              f"{num(ib['error_rate_stale'], '.3f')}")
        split = report["gradient_error"]["gap_split"]
        if split is not None:
            print(f"  error-rate gap b − a {sum(split.values()):+.3f}: the share of updates at "
                  f"staleness 0 ({num(ia['fresh_share'], '.3f')} vs "
                  f"{num(ib['fresh_share'], '.3f')}) moves it {split['fresh_share']:+.3f}, "
                  f"their errors {split['fresh_errors']:+.3f}, the stale updates' errors "
                  f"{split['stale_errors']:+.3f}")
        print(f"  median write µs: met by another {us(ia['met_write_median_ns'])} vs "
              f"{us(ib['met_write_median_ns'])}, lone {us(ia['lone_write_median_ns'])} vs "
              f"{us(ib['lone_write_median_ns'])}")
        rh_a, rh_b = report["rhythm"]["a"], report["rhythm"]["b"]
        print(f"  rhythm: staleness / independent-phase value {num(rh_a['coupling'], '.3f')} vs "
              f"{num(rh_b['coupling'], '.3f')} ({num(rh_a['independent_staleness'])} vs "
              f"{num(rh_b['independent_staleness'])} independent), others' completions peak "
              f"at {num(rh_a['phase_peak'], '.2f')}× vs {num(rh_b['phase_peak'], '.2f')}× uniform "
              f"in a worker's cycle")
        fa, fb = report["offsets"]["a"], report["offsets"]["b"]
        if fa is not None or fb is not None:
            edges = ", ".join(f"{e:g}" for e in OFFSET_EDGES[:-1])
            print(f"  write starts' offset to another worker's over a lone write (bins {edges} "
                  f"W): shares {bins(fa, 'shares')} vs {bins(fb, 'shares')}; next offset over "
                  f"this one (below 2 W) {bins(fa, 'next_over_now')} vs "
                  f"{bins(fb, 'next_over_now')}; end gap of writes that met (W, below 1 W) "
                  f"{bins(fa, 'end_gap')} vs {bins(fb, 'end_gap')}")
        print(f"  updates/s {report['throughput']['updates_per_second_a']:.4g} vs "
              f"{report['throughput']['updates_per_second_b']:.4g}")
        ca, cb = report["cpu_latency"]["a"], report["cpu_latency"]["b"]
        if ca is not None or cb is not None:
            pa, pb = report["placement"]["a"], report["placement"]["b"]
            print(f"  CPU-to-CPU cache line before / after the run, ns: {latency_pair(ca)} vs "
                  f"{latency_pair(cb)} (CPUs {pa or '—'} vs {pb or '—'})")
            if {pa, pb} == {"near", "far"}:
                print("  the runs' CPUs were placed differently: dense shared writes differ by "
                      "that alone, so part of every gap above is the host's placement")
        print(f"  final suboptimality {num(lo['final_a'])} vs {num(lo['final_b'])} (ratio "
              f"{num(lo['final_ratio'], '.3g')}; largest ratio along the curves "
              f"10^{num(lo['max_abs_log10_ratio'], '.2f')})")
        print(f"  wrote {out}/compare.json and compare.png")
    return 0


def _ns(flag: str, text: str) -> int:
    """A flag's value in ns: a non-negative integer (``auto`` handled by the caller)."""
    try:
        value = int(text)
    except ValueError:
        raise ScenarioError(flag, text, "must be ns (an integer) or auto") from None
    if value < 0:
        raise ScenarioError(flag, value, "must be >= 0 ns")
    return value


def _quantum(text: str) -> tuple[int, str]:
    """``--quantum``: ns, or ``auto`` to measure this machine's time slice (and say how)."""
    if text == "auto":
        from realrun.timeslice import measure_time_slice

        quantum, seen = measure_time_slice()
        return quantum, (f"{quantum / 1e6:.3g} ms, measured on this machine ({seen} turns "
                         "of two processes pinned to one core)")
    return _ns("--quantum", text), ""


def _migrate(text: str, cores: int, quantum: int, slicing: str) -> tuple[int, str]:
    """``--migrate``: ns, or ``auto`` to measure this machine's load balancer (and say how)."""
    migrate = None if text == "auto" else _ns("--migrate", text)
    if migrate == 0:
        return 0, ""
    if not (cores and quantum and slicing == "per_core"):
        raise ScenarioError("--migrate", text, "needs --cores, --quantum and --slicing per_core")
    if migrate is not None:
        return migrate, ""
    from realrun.timeslice import measure_migration

    migrate, moves = measure_migration(cores, quantum)
    return migrate, (f"{migrate / 1e6:.3g} ms between moves, measured on this machine "
                     f"({moves} moves of {cores + 1} processes spinning on {cores} cores)")


def _calibrate(args: argparse.Namespace) -> int:
    from simulator.calibrate import (
        MARKER,
        calibrate,
        calibrate_counts,
        calibrated_toml,
        run_workers,
    )
    from simulator.rundir import run_cpu_latency

    out = Path(args.out)
    if out.is_dir() or (out.exists() and not out.read_text().startswith(MARKER)):
        raise AsyngradError(f"--out = '{out}': exists and is not a calibrated scenario; "
                            "choose a new file name")
    if args.cores < 0:
        raise ScenarioError("--cores", args.cores, "must be >= 0 (0: one per thread)")
    quantum, measured = _quantum(args.quantum)
    migrate, balancer = _migrate(args.migrate, args.cores, quantum, args.slicing)
    if args.common == "rhythm" and not args.quiet:
        print("fitting common factors to the runs' rhythm (up to 12 simulations of the calibrated "
              "scenario, at most 20,000 updates each)...", flush=True)
    resolved = [Path(run).resolve() for run in args.run_dir]
    for index, run in enumerate(args.run_dir):
        if resolved[index] in resolved[:index]:
            raise AsyngradError(f"RUN = '{run}': given twice")
    counts = {run_workers(run) for run in args.run_dir}
    if len(counts) > 1 and args.speeds != "off":
        raise AsyngradError(f"--speeds = '{args.speeds}': fits one run (each worker on a core "
                            "of its own), not several worker counts")
    if len(counts) > 1 and args.episodes != "off":
        raise AsyngradError(f"--episodes = '{args.episodes}': fits one run or repeats of one "
                            "worker count, not several worker counts")
    if len(counts) > 1:
        scenario, report = calibrate_counts(args.run_dir, args.cores, quantum, args.slicing,
                                            args.convoys, args.common, args.interference,
                                            args.shared)
    else:  # one run, or repeats of one worker count fitted together
        scenario, report = calibrate(list(args.run_dir), args.pool, args.cores, quantum,
                                     args.slicing, args.convoys, args.common,
                                     args.interference, args.speeds, args.episodes,
                                     args.shared)
    if migrate:
        scenario = dataclasses.replace(scenario, devices=tuple(
            dataclasses.replace(d, migrate=migrate) if d.quantum and d.slicing == "per_core" else d
            for d in scenario.devices))
        report["migrate"] = balancer or f"{migrate / 1e6:.3g} ms between moves (given)"
    if measured:
        report["time_slice"] = measured
    # Where the host put the runs' CPUs (real runs on a virtual machine): a scenario fitted
    # with the CPUs near each other predicts a run with them near.
    report["cpu_latency"] = {str(run): run_cpu_latency(run) for run in args.run_dir}
    text = calibrated_toml(scenario, report)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(text)
        staging.replace(out)
    except OSError as err:
        staging.unlink(missing_ok=True)
        raise AsyngradError(f"--out = '{out}': cannot be written ({err.strerror or err})"
                            ) from None
    if not args.quiet:
        for line in text.splitlines()[1:]:
            if not line.startswith("#"):
                break
            print(line[2:])
        print(f"wrote {out}; simulate it with: asyngrad simulate {out} --out DIR")
    return 0


def _explore(args: argparse.Namespace) -> int:
    import json

    from simulator.rundir import check_out, publish, write_run
    from simulator.scenario import load_scenario, scenario_to_toml
    from simulator.schedule import explore

    scenario = load_scenario(args.scenario, args.set)
    out = Path(args.out)
    files = ("explore.json", "scenario.toml", "worst", "worst.schedule")
    check_out(out, files)
    if args.property is not None:
        return _explore_property(args, scenario, out, files)
    with _progress(args.runs, args.quiet) as bar:
        report, worst = explore(scenario, args.scheduler, args.runs, args.objective,
                                args.depth, args.seed, args.keep, bar.update,
                                args.preemptions, args.checkpoint)

    def write(where: Path) -> None:
        (where / "explore.json").write_text(json.dumps(report, indent=2) + "\n")
        (where / "scenario.toml").write_text(scenario_to_toml(scenario))
        (where / "worst.schedule").write_text(report["worst"][0]["schedule"] + "\n")
        write_run(where / "worst", scenario, worst.trace, worst.problem)

    publish(out, files, write)
    if not args.quiet:
        v = report["values"]
        if report["scheduler"] == "dfs":
            bound = ("" if report["preemptions"] is None
                     else f" with at most {report['preemptions']} preemptions")
            extent = ("all of them" if report["complete"] else
                      "stopped at --runs; rerun with the same --checkpoint to go on")
            print(f"{report['schedules']} interleavings of {scenario.name}{bound} "
                  f"({extent}); {report['objective']}: mean {v['mean']:.4g}, p95 "
                  f"{v['p95']:.4g}, max {v['max']:.4g}")
        else:
            print(f"{report['runs']} {report['scheduler']} schedules (depth {report['depth']}) "
                  f"of {scenario.name}, {report['steps_per_run']} steps each; "
                  f"{report['objective']}: mean {v['mean']:.4g}, max {v['max']:.4g}")
        for item in report["worst"]:
            print(f"  {item['value']:.6g}  {item['schedule']}")
        print(f"  the worst schedule replays identically: {report['replayed_identically']}")
        print(f"  wrote {out}/explore.json, {out}/worst.schedule and {out}/worst/ (replay: "
              f"asyngrad replay {out} --schedule {out}/worst.schedule --out DIR)")
    return 0


def _explore_property(args: argparse.Namespace, scenario: Any, out: Path,
                      files: tuple[str, ...]) -> int:
    """Search for a schedule violating --property, shrink it, write the counterexample."""
    import json

    from simulator.rundir import publish, write_run
    from simulator.scenario import scenario_to_toml
    from simulator.schedule import Property, search_violation

    prop = Property.parse(args.property)
    with _progress(args.runs, args.quiet) as bar:
        report = search_violation(scenario, prop, args.scheduler, args.runs, args.depth,
                                  args.seed, bar.update)
    run = report.pop("run", None)

    def write(where: Path) -> None:
        (where / "explore.json").write_text(json.dumps(report, indent=2) + "\n")
        (where / "scenario.toml").write_text(scenario_to_toml(scenario))
        if run is not None:
            (where / "worst.schedule").write_text(report["counterexample_schedule"] + "\n")
            write_run(where / "worst", scenario, run.trace, run.problem)

    publish(out, files, write)
    if not args.quiet:
        if report["counterexample"] is None:
            print(f"{prop} held in all {args.runs} {args.scheduler} schedules")
        else:
            print(f"{prop} fails after {report['runs_until_found']} {args.scheduler} "
                  f"schedules ({report['found_value']:.6g}); shrunk to "
                  f"{report['counterexample']} ({report['counterexample_preemptions']} "
                  f"preemptions, {report['counterexample_value']:.6g})")
            print(f"  wrote {out}/explore.json, {out}/worst.schedule (the whole schedule the "
                  f"counterexample ran) and {out}/worst/ (replay: asyngrad replay {out} "
                  f"--schedule {out}/worst.schedule --out DIR)")
    return 1 if report["counterexample"] is not None else 0


def _table(args: argparse.Namespace) -> int:
    import csv

    from simulator.rundir import check_out, publish
    from simulator.table import COLUMNS, paper_table, table_markdown

    for name, value in (("--updates", args.updates), ("--threads", args.threads)):
        if value < 1:
            raise ScenarioError(name, value, "must be >= 1")
    out = Path(args.out)
    check_out(out, TABLE_FILES)
    with _progress(3 * len(COLUMNS), args.quiet) as bar:
        cells = paper_table(args.updates, args.threads, args.seed, bar.update)
    text = table_markdown(cells)

    def write(where: Path) -> None:
        with open(where / "table.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, list(cells[0]))
            writer.writeheader()
            writer.writerows(cells)
        (where / "table.md").write_text(text)

    publish(out, TABLE_FILES, write)
    if not args.quiet:
        print(text, end="")
        print(f"wrote {out}/table.csv and table.md")
    return 0


def _floats(name: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise ScenarioError(name, text, "must be numbers separated by commas") from None


def _real(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401 - the real backend's one optional dependency
    except ImportError:
        raise AsyngradError("asyngrad real needs PyTorch: pip install torch "
                            "(or the project's extra: pip install -e '.[torch]')") from None
    from realrun.runner import run_real, summary_extra
    from simulator.rundir import check_out, latency_line, write_run
    from simulator.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    check_out(args.out)
    if args.backend == "ps":
        return _real_ps(args, scenario)
    if args.backend != "shm":
        raise ScenarioError("--backend", args.backend, "must be shm or ps")
    with _progress(scenario.run.updates, args.quiet) as bar:
        run = run_real(scenario, args.workers, args.mode, args.dtype, args.timeout, bar.update,
                       measure_every=args.measure_every or (
                           scenario.metrics.every if args.measure else None),
                       device=args.device, launch=args.launch, pattern=args.pattern,
                       accumulate=args.accumulate, pin=args.pin, probe=args.probe,
                       notice=None if args.quiet else _notice)
    if run.failure is not None and not args.quiet:
        _notice(f"writing the partial run to {args.out}/")
    summary = write_run(args.out, run.scenario, run.trace, run.problem,
                        extra=summary_extra(run))
    if run.failure is not None:
        who = "" if run.failure["worker"] is None else f"worker {run.failure['worker']}: "
        print(f"asyngrad: real run stopped after {len(run.trace)} updates ({who}"
              f"{run.failure['reason']}); partial results in {args.out}/", file=sys.stderr)
        return 1
    if not args.quiet:
        _print_summary(summary, Path(args.out), run.seconds)
        print(f"  {summary['real']['updates_per_wall_second']:.4g} updates per wall second "
              f"with {run.workers} {run.mode} worker(s), {run.dtype}, on {run.device}"
              + ("" if run.device == "cpu" else f" ({run.launch}, {run.pattern} parameters)"))
        if run.hardware_loss is not None:
            print(f"  hardware lost: |rebuilt w_T − real w_T| = "
                  f"{run.hardware_loss['rebuilt_vs_real_norm']:.3g} (max element "
                  f"{run.hardware_loss['rebuilt_vs_real_max']:.3g})")
        if run.cpu_latency is not None:
            print("  " + latency_line(run.cpu_latency))
    return 0


def _notice(text: str) -> None:
    """What a stopped run does while the user waits, on stderr."""
    print(f"asyngrad: {text} ...", file=sys.stderr, flush=True)


def _real_ps(args: argparse.Namespace, scenario: Any) -> int:
    """``asyngrad real --backend ps``: a parameter server and K trainers on loopback."""
    from realrun.ps import run_ps, summary_extra
    from simulator.rundir import write_run
    from simulator.scenario import with_overrides

    if args.pin:
        raise ScenarioError("--pin", "on", "pins the shared-memory workers; not with "
                            "--backend ps")
    for flag, value, default in (("--mode", args.mode, "lockfree"),
                                 ("--device", args.device, "cpu"),
                                 ("--launch", args.launch, None),
                                 ("--pattern", args.pattern, "shared"),
                                 ("--accumulate", args.accumulate, 1)):
        if value != default:
            raise ScenarioError(flag, value, "a flag of the shared-memory workers; the ps "
                                "backend runs paramserver on the CPU ([paramserver] options)")
    if args.measure_every is not None:
        if args.measure_every < 1:
            raise ScenarioError("--measure-every", args.measure_every, "must be >= 1")
        scenario = with_overrides(scenario, [f"metrics.every={args.measure_every}"])
    with _progress(scenario.run.updates, args.quiet) as bar:
        run = run_ps(scenario, args.workers, args.dtype, args.timeout, bar.update,
                     measure=args.measure or args.measure_every is not None)
    summary = write_run(args.out, run.scenario, run.trace, run.problem,
                        extra=summary_extra(run))
    if run.failure is not None:
        print(f"asyngrad: parameter server stopped after {run.pushes} pushes "
              f"({len(run.trace)} gradients; {run.failure['reason']}); partial results in "
              f"{args.out}/", file=sys.stderr)
        return 1
    if not args.quiet:
        _print_summary(summary, Path(args.out), run.seconds)
        real = summary["real"]
        print(f"  {real['pushes_per_wall_second']:.4g} pushes per wall second from "
              f"{run.workers} trainer(s); dropped {summary['discarded']} gradients "
              f"({real['dropped_fraction']:.1%})"
              + (f"; retired trainers {summary['retired_threads']}"
                 if summary.get("retired_threads") else ""))
    return 0


def _scenario(args: argparse.Namespace) -> int:
    from simulator.scenario import load_scenario, scenario_to_toml

    sys.stdout.write(scenario_to_toml(load_scenario(args.scenario, args.set)))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyngrad", description="Simulate and analyse asynchronous "
                     "lock-free SGD (AsynGrad, Hogwild!).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, summary: str, run: Any, out: str | None = "run directory to write",
                scenario: bool = True, out_required: bool = True) -> argparse.ArgumentParser:
        """A subcommand with the arguments most share: a scenario file, --out, --quiet and
        --set overrides (``out=None``: no --out; ``scenario=False``: no scenario or --set)."""
        sub = commands.add_parser(name, help=summary)
        if scenario:
            sub.add_argument("scenario", nargs="?",
                             help="scenario TOML (default: embedded default)")
            sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="override a scenario field, e.g. run.threads=4 (repeatable)")
        if out is not None:
            sub.add_argument("--out", required=out_required, help=out)
            sub.add_argument("--quiet", action="store_true", help="print nothing on success")
        sub.set_defaults(run=run)
        return sub

    command("simulate", "run a scenario and write a run directory", _simulate)

    rep = command("replay", "re-run a trace's exact interleaving", _replay, scenario=False)
    rep.add_argument("trace", help="trace.npz, or a run directory holding one")
    rep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="change a value the trace does not fix, e.g. run.lr=0.01")
    rep.add_argument("--schedule", metavar="S",
                     help="re-run this controlled schedule (e.g. 0x3.1.0x2, or a file "
                          "holding one such as explore's worst.schedule) on TRACE's "
                          "scenario: a scenario file or a directory holding scenario.toml")

    sweep = command("sweep", "run a scenario over a grid of field values", _sweep,
                    out="sweep directory (rerun to resume)")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                       help="a swept field and its values (repeatable: the grid is the product)")
    sweep.add_argument("--seeds", type=int, default=None, metavar="N",
                       help="also sweep run.seed over 0..N-1 (N >= 1)")
    sweep.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="worker processes (default: one per core; 1: in this process)")
    sweep.add_argument("--dask", metavar="ADDRESS",
                       help="run the cells on the Dask scheduler at ADDRESS (e.g. "
                            "tcp://host:8786); its workers must see --out")

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
    theorem.add_argument("--beta", type=float, default=1.0, help="β >= 1 (AsynGrad; default 1)")
    theorem.add_argument("--theta", type=float, default=0.5,
                         help="ϑ in (0, 1) (Hogwild!; default 0.5)")
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
    check.add_argument("--beta", type=float, default=1.0, help="β >= 1 (asyngrad; default 1)")
    check.add_argument("--theta", type=float, default=0.5,
                       help="ϑ in (0, 1) (hogwild; default 0.5)")
    check.add_argument("--pilot-seeds", type=int, default=3,
                       help="pilot runs that estimate the constants (default 3)")
    check.add_argument("--max-updates", type=int, default=200_000,
                       help="cap on the updates of each validation run (default 200000)")
    check.add_argument("--rounds", type=int, default=3,
                       help="re-estimation rounds of the run-dependent constants (default 3)")

    tsweep = command("tausweep", "inject adversarial gradient errors of growing size and find "
                     "where convergence to ε stops, against Theorem 1's limit", _tausweep,
                     out="directory for tausweep.json and tausweep.png "
                     "(default runs/tausweep-NAME)", out_required=False)
    tsweep.add_argument("--eps", type=float, required=True, help="target accuracy ε")
    tsweep.add_argument("--seeds", type=int, default=5, help="runs per error size (default 5)")
    tsweep.add_argument("--bounds", metavar="B1,B2,...",
                        help="error norms to inject (default: --points norms around the limit)")
    tsweep.add_argument("--points", type=int, default=9, help="default grid size (default 9)")
    tsweep.add_argument("--horizon", type=float, default=2.0,
                        help="run length as a multiple of t of (10) (default 2)")
    tsweep.add_argument("--beta", type=float, default=1.0, help="β >= 1 (default 1)")
    tsweep.add_argument("--pilot-seeds", type=int, default=3,
                        help="pilot runs that estimate κ² and the scenario's τ (default 3)")
    tsweep.add_argument("--max-updates", type=int, default=100_000,
                        help="cap on the updates of each run (default 100000)")

    exp = command("explore", "run a scenario under controlled schedules and keep the worst",
                  _explore, out="directory for explore.json and the worst run")
    exp.add_argument("--scheduler", default="pct",
                     help="random, roundrobin, pct, dfs (every interleaving) or adversarial "
                          "(greedy worst case); default pct")
    exp.add_argument("--runs", type=int, default=100,
                     help="schedules to try (default 100; dfs: the most to run now)")
    exp.add_argument("--preemptions", type=int, default=None,
                     help="dfs: at most this many preemptions per schedule (default: any)")
    exp.add_argument("--checkpoint", metavar="FILE",
                     help="dfs: where to save and resume the enumeration")
    exp.add_argument("--property", metavar="'METRIC OP VALUE'",
                     help="search for a schedule violating it, e.g. 'lost_fraction <= 0.5', "
                          "and shrink it to a minimal counterexample (exit 1 when found)")
    exp.add_argument("--depth", type=int, default=2, help="pct bug depth d (default 2)")
    exp.add_argument("--objective", default="grad_error",
                     help="grad_error (max ‖δ‖/‖g‖), staleness (max), lost_blocks (total) or "
                          "suboptimality (final); default grad_error")
    exp.add_argument("--seed", type=int, default=0, help="first scheduler seed (default 0)")
    exp.add_argument("--keep", type=int, default=5, help="worst schedules kept (default 5)")

    tab = command("table", "the Sync/Async × Sparse/Dense table of AsynGrad (sparse and dense "
                  "logistic, LSTM tagger, dense CRF), measured", _table,
                  scenario=False, out="directory for table.csv and table.md")
    tab.add_argument("--updates", type=int, default=20_000, help="T per run (default 20000)")
    tab.add_argument("--threads", type=int, default=8, help="k (default 8)")
    tab.add_argument("--seed", type=int, default=0, help="run seed (default 0)")

    cal = command("calibrate", "fit the simulator's timing model to a recorded (real) run",
                  _calibrate, scenario=False, out="scenario file to write (TOML)")
    cal.add_argument("run_dir", metavar="RUN", nargs="+",
                     help="a run directory (from asyngrad real, simulate or replay); repeats "
                          "of one run (same problem and worker count) are fitted together; "
                          "runs of one problem at different worker counts also fit the "
                          "contention between workers (a slowdown per other worker; pooled)")
    cal.add_argument("--pool", action="store_true",
                     help="one timing for all workers on one device (to predict other k)")
    cal.add_argument("--cores", type=int, default=0,
                     help="with --pool: the machine's cores, shared by the threads (0: one "
                          "per thread)")
    cal.add_argument("--quantum", default="0", metavar="NS",
                     help="with --cores: threads beyond the cores run in OS-like time slices "
                          "of NS ns (0: they take turns per action; auto: measure this "
                          "machine's slice)")
    cal.add_argument("--slicing", choices=SLICINGS, default="per_core",
                     help="time slices per core (each thread keeps its core, as Linux keeps "
                          "processes, until a core goes idle; default) or global (all threads "
                          "rotate over all cores)")
    cal.add_argument("--migrate", default="0", metavar="NS",
                     help="with --slicing per_core: the OS load balancer moves a waiting "
                          "thread to another core every NS ns on average (0: only to a core "
                          "left idle; auto: measure this machine's balancer)")
    for flag, default, what in (
            ("--convoys", "auto", "write convoys (overlapping writes that end together): fit "
             "them when the run shows them (for runs of one worker, in the meetings their "
             "probe made: real.write_meetings, from asyngrad real --probe), or, when its "
             "overlapping writes end apart, what their meetings lose (passing writes) (auto, "
             "default); convoys whenever "
             "writes met (on); neither (off)"),
            ("--common", "off", "common factors (durations of one phase alike on workers "
             "that start it together): fit them when some phase's correlation reaches 0.05 "
             "(auto), whenever two workers ran (on), with one strength chosen so the "
             "simulation keeps the run's rhythm (rhythm: staleness over the independent-"
             "phase value, as compare reports it), or never (off, default)"),
            ("--interference", "auto", "slowdowns of a worker's phase under another's (a "
             "write while the other computes, say): fit them when one reaches 0.1 (auto, "
             "default), whenever two workers ran (on), or never (off)"),
            ("--shared", "auto", "writes slowed on lines another worker read last "
             "(timing.write_shared: the worker still holds them from its own read, no one "
             "wrote them since): fit the factor when it is 1.2x or more (or 1/1.2 or less) "
             "(auto, default), whenever two workers ran (on), or never (off)"),
            ("--speeds", "off", "with --pool and one worker per core (--cores = the run's "
             "workers): each core's own speed, from each worker's median gradient time (a "
             "busy sibling hyperthread or a throttled core runs a worker slower for the whole "
             "run): keep them when they differ by over 10%% (auto), always (on), or never "
             "(off, default); thread j is then simulated on core j mod cores"),
            ("--episodes", "off", "speed episodes: cores that switch to a slower pace for "
             "milliseconds at a time (the workers' gradient times in two levels): keep them "
             "when the levels are 1.2x or more apart and well separated (auto), whenever two "
             "levels are found (on), or never (off, default); one run")):
        choices = ("auto", "on", "rhythm", "off") if flag == "--common" else ("auto", "on", "off")
        cal.add_argument(flag, choices=choices, default=default, help=what)

    cmp = command("compare", "fidelity report of run B against run A (simulated or real)",
                  _compare, scenario=False, out="directory for compare.json and compare.png "
                  "(default runs/compare)", out_required=False)
    cmp.add_argument("run_a", help="a run directory")
    cmp.add_argument("run_b", help="another run directory of the same problem")

    real = command("real", "train with real lock-free worker processes", _real)
    real.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    real.add_argument("--mode", default="lockfree",
                      help="lockfree, blocklock (a lock per block write), locked or serial")
    real.add_argument("--dtype", default="float32", help="float32 (default) or float64")
    real.add_argument("--timeout", type=float, default=None,
                      help="stop the run after this many seconds (partial results kept)")
    real.add_argument("--measure", action="store_true",
                      help="exact gradient errors: rebuild the serialized view offline")
    real.add_argument("--measure-every", type=int, default=None, metavar="N",
                      help="measure mode, computing the exact gradient of every N-th update")
    real.add_argument("--backend", default="shm",
                      help="shm (default: workers on one shared parameter vector) or ps (a "
                      "parameter server and K trainers on torch.distributed; its options "
                      "come from the scenario's [paramserver] section)")
    real.add_argument("--device", default="cpu",
                      help="where gradients run: cpu (default), cuda or cuda:N")
    real.add_argument("--launch", default=None,
                      help="workers as spawned processes or as threads of one process (on "
                      "CUDA each with its own stream); default: processes on the CPU, the "
                      "faster measured on CUDA")
    real.add_argument("--pattern", default="shared",
                      help="shared (default: parameters on the device, updated in place by "
                      "every worker) or host (master parameters in host memory, each worker "
                      "computes on its device copy and pushes its step)")
    real.add_argument("--accumulate", type=int, default=1, metavar="N",
                      help="average N gradients per update (lr/N per gradient)")
    real.add_argument("--probe", action="store_true",
                      help="probe the CPUs before the start (seconds): the cache-line latency "
                      "between two workers' CPUs (real.cpu_latency), what a write costs on "
                      "lines the other CPU copied last (real.shared_write) and how two writes "
                      "meet (real.write_meetings); calibrate needs the last two for runs of "
                      "one worker")
    real.add_argument("--pin", action="store_true",
                      help="pin worker r to CPU r (mod the CPUs this process may use): no "
                      "two workers share a core while another is idle, as the simulator's "
                      "per-core slicing assumes (unpinned, the OS may pile them up at the "
                      "start)")

    command("scenario", "print a fully resolved scenario as TOML", _scenario, out=None)
    return parser


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM takes Ctrl-C's way out (a real run stops its workers and keeps its partial
    trace): a KeyboardInterrupt that says so."""
    raise KeyboardInterrupt("SIGTERM")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyngrad`` command; returns the exit status (SIGTERM is handled
    as Ctrl-C while it runs, from the main thread)."""
    import signal
    import threading

    args = _parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return int(args.run(args))
    except AsyngradError as err:
        print(f"asyngrad: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print("asyngrad: interrupted; no partial result was written", file=sys.stderr)
        return 143 if err.args == ("SIGTERM",) else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


if __name__ == "__main__":
    sys.exit(main())
