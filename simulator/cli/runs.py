"""Running scenarios: ``asyngrad simulate``, ``replay``, ``sweep`` and ``scenario``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import print_diverged, print_summary, progress
from simulator.errors import AsyngradError, ScenarioError


def _simulate(args: argparse.Namespace) -> int:
    from simulator.engine import Engine
    from simulator.rundir import check_out, write_run
    from simulator.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    check_out(args.out)
    started = time.perf_counter()
    engine = Engine(scenario)
    with progress(scenario.run.updates, args.quiet) as bar:
        engine.ledger.progress = bar.update
        trace = engine.run()
    summary = write_run(args.out, scenario, trace, engine.problem)
    if not args.quiet:
        print_summary(summary, Path(args.out), time.perf_counter() - started)
        print_diverged(summary)
    return 0


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
        print_summary(summary, out, time.perf_counter() - started)
        print_diverged(summary)
    return 0


def _replay_schedule(path: Path, text: str, overrides: list[str]) -> tuple[Any, Any, Any]:
    """Re-run a controlled schedule on a scenario file, or on the scenario.toml of a
    directory (an ``asyngrad explore`` output or a run directory)."""
    from simulator.scenario import load_scenario
    from simulator.schedule import Scheduler, parse_schedule, run_schedule

    source = path / "scenario.toml" if path.is_dir() else path
    scenario = load_scenario(source, overrides)
    try:  # a schedule file, such as explore's worst.schedule (a long schedule written
        # inline is no file name: ENAMETOOLONG)
        named = Path(text).is_file()
    except OSError:
        named = False
    if named:
        try:
            text = Path(text).read_text().strip()
        except (OSError, UnicodeDecodeError):
            raise ScenarioError("--schedule", text, "cannot be read as a schedule "
                                "file") from None
    choices = parse_schedule(text)
    result = run_schedule(scenario, lambda threads: Scheduler("fixed", threads,
                                                              schedule=choices))
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
    if args.dask is not None and not args.dask.strip():
        raise ScenarioError("--dask", args.dask, "is empty: give the scheduler's address, "
                            "e.g. tcp://host:8786")
    axes = [parse_axis(text) for text in args.grid]
    if args.seeds is not None:
        axes.append(Axis("run.seed", tuple(str(s) for s in range(args.seeds))))
    if not axes:
        raise AsyngradError("sweep: give at least one --grid KEY=V1,V2,... or --seeds N")
    cells = plan_sweep(args.scenario, args.set, axes)
    started = time.perf_counter()
    jobs = min(args.jobs or os.cpu_count() or 1, len(cells))
    with progress(len(cells), args.quiet) as bar:
        if args.dask is not None:
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
            print(" | ".join([*(str(row[k]) for k in keys), _shown(row["error_rate"], ".3f", "off"),
                              _shown(row["staleness_mean"], ".2f"), str(row["lost_blocks"]),
                              _shown(row["final_suboptimality"], ".4g")]))
        print(f"{ran} cells ran, {len(cells) - ran} resumed; wrote {args.out}/sweep.csv in "
              f"{time.perf_counter() - started:.1f} s")
    return 0


def _shown(value: float | None, spec: str, none: str = "—") -> str:
    """A sweep table's number as ``spec`` formats it; ``none`` where the summary had none."""
    return none if value is None else format(value, spec)


def _scenario(args: argparse.Namespace) -> int:
    from simulator.scenario import load_scenario, scenario_to_toml

    if args.reference:
        from simulator.scenario_reference import reference

        if args.scenario or args.set:
            raise ScenarioError("--reference", args.scenario or args.set[0],
                                "lists every key with its default; give no scenario or --set")
        sys.stdout.write(reference())
        return 0
    sys.stdout.write(scenario_to_toml(load_scenario(args.scenario, args.set)))
    return 0


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
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

    scen = command("scenario", "print a fully resolved scenario as TOML", _scenario, out=None)
    scen.add_argument("--reference", action="store_true",
                      help="print the scenario reference instead: every key with its type, "
                           "default, allowed values and description (docs/scenario.md)")
