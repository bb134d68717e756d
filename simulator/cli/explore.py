"""Controlled schedules: ``asyngrad explore``."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import progress


def _explore(args: argparse.Namespace) -> int:

    from simulator.rundir import check_out, publish, write_json, write_run
    from simulator.scenario import load_scenario, scenario_to_toml
    from simulator.schedule import explore

    scenario = load_scenario(args.scenario, args.set)
    out = Path(args.out)
    files = ("explore.json", "scenario.toml", "worst", "worst.schedule")
    check_out(out, files)
    _options(args)
    if args.property is not None:
        return _explore_property(args, scenario, out, files)
    with progress(args.runs, args.quiet) as bar:
        report, worst = explore(scenario, args.scheduler, args.runs, args.objective,
                                args.depth, args.seed, args.keep, bar.update,
                                args.preemptions, args.checkpoint)

    def write(where: Path) -> None:
        write_json(where / "explore.json", report)
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
            depth = "" if report.get("depth") is None else f" (depth {report['depth']})"
            print(f"{report['runs']} {report['scheduler']} schedules{depth} "
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

    from simulator.rundir import publish, write_json, write_run
    from simulator.scenario import scenario_to_toml
    from simulator.schedule import Property, search_violation

    prop = Property.parse(args.property)
    with progress(args.runs, args.quiet) as bar:
        report = search_violation(scenario, prop, args.scheduler, args.runs, args.depth,
                                  args.seed, bar.update)
    run = report.pop("run", None)

    def write(where: Path) -> None:
        write_json(where / "explore.json", report)
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


def _options(args: argparse.Namespace) -> None:
    """Refuse the options the scheduler (or a --property search) would ignore, then fill in
    the defaults of those not given."""
    from simulator.errors import ScenarioError
    from simulator.rundir import file_above
    from simulator.schedule import refuse_options

    if args.property is not None:
        for flag, value in (("--keep", args.keep), ("--objective", args.objective)):
            if value is not None:
                raise ScenarioError(flag, value, "does not apply with --property (the "
                                    "property's metric is what the search measures)")
    refuse_options(args.scheduler, {
        "--runs": args.runs, "--seed": args.seed, "--depth": args.depth, "--keep": args.keep,
        "--preemptions": args.preemptions, "--checkpoint": args.checkpoint})
    if args.checkpoint is not None:  # (written after the search: checked before it)
        state = Path(args.checkpoint)
        above = file_above(state)
        if state.is_dir() or above is not None:
            raise ScenarioError("--checkpoint", args.checkpoint, "is a directory"
                                if above is None else f"lies under a file ({above})")
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.scheduler == "roundrobin":
        args.runs = 1  # the same schedule every run


# Options left out take these values (--runs: the schedules to try; dfs: the most to run).
DEFAULTS = {"runs": 100, "depth": 2, "seed": 0, "keep": 5, "objective": "grad_error"}


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
    exp = command("explore", "run a scenario under controlled schedules and keep the worst",
                  _explore, out="directory for explore.json and the worst run")
    exp.add_argument("--scheduler", default="pct",
                     help="random, roundrobin, pct, dfs (every interleaving) or adversarial "
                          "(greedy worst case); default pct")
    exp.add_argument("--runs", type=int,
                     help="schedules to try (default 100; dfs: the most to run now; not "
                          "adversarial, whose search decides, nor roundrobin: one schedule)")
    exp.add_argument("--preemptions", type=int, default=None,
                     help="dfs: at most this many preemptions per schedule (default: any)")
    exp.add_argument("--checkpoint", metavar="FILE",
                     help="dfs: where to save and resume the enumeration")
    exp.add_argument("--property", metavar="'METRIC OP VALUE'",
                     help="search for a schedule violating it, e.g. 'lost_fraction <= 0.5', "
                          "and shrink it to a minimal counterexample (exit 1 when found)")
    exp.add_argument("--depth", type=int, help="pct bug depth d (default 2)")
    exp.add_argument("--objective",
                     help="grad_error (max ‖δ‖/‖g‖), staleness (max), lost_blocks (total) or "
                          "suboptimality (final); default grad_error")
    exp.add_argument("--seed", type=int,
                     help="random, pct: first scheduler seed (default 0)")
    exp.add_argument("--keep", type=int,
                     help="random, pct: worst schedules kept (default 5)")
