"""Parameter server on torch.distributed (gloo, loopback): pushes per second and accuracy.

For K = 1, 2, 4 trainers, with and without a staleness threshold: pushes per second (over the
window in which every trainer pushes), the final suboptimality and the fraction of pushes
dropped as too stale, on the default dense logistic problem (d = 100), float64. The baseline
measured in the same run is K = 1 (serial SGD through the server).

    python bench/ps.py            # 6,000 pushes per run
    python bench/ps.py --quick    # 1,500
    python bench/ps.py --pool 1,2 --dim 10000   # a pool of S servers instead of the limit
    python bench/ps.py --protocols              # each of the server's protocols at K = 2

With ``--pool``, for each S given and K = 1, 2, 4: the same columns for a pool of S servers
(``--servers S``, one shard each; no staleness limit: a pool refuses it; the loss curve at
two points, so that no server evaluates f in its loop), with the simulator's pool at the
same K and S beside it (its default durations: a shape, not a calibrated prediction):
simulated updates per simulated second relative to its own K = 1, S = 1.

With ``--protocols``: each protocol and option the server runs (a plain server, the
staleness-aware and delay-compensating rules, a lock-free server, a pool of two, consensus
ADMM with z on the server, Sandblaster with the server its coordinator) at K = 2 trainers,
against the plain server at K = 1 measured in the same run (serial SGD through the server;
Sandblaster against its own K = 1), the loss curve at two points.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import torch

from realrun.ps import run_ps
from realrun.timeline import overlap_rate, thread_ends
from simulator.problems import make_problem
from simulator.scenario import load_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pushes")
    parser.add_argument("--pool", default=None, help="server counts, e.g. 1,2")
    parser.add_argument("--dim", type=int, default=100, help="problem.dim (default 100)")
    parser.add_argument("--protocols", action="store_true",
                        help="each of the server's protocols at K = 2 against K = 1")
    args = parser.parse_args()
    updates = 1_500 if args.quick else 6_000
    base = ["run.lr=0.05", f"run.updates={updates}", f"problem.dim={args.dim}"]
    if args.pool is not None:
        pool(base, [int(s) for s in args.pool.split(",")], updates)
        return
    if args.protocols:
        protocols([*base, "metrics.curve_points=2"], updates)
        return
    problem, f_star = _start(base, f"{updates:,} pushes per run",
                             ("trainers", "staleness limit", "pushes/s", "vs K = 1",
                              "mean staleness", "dropped", "final f − f*"))
    serial = None
    for limit in (0, 1):
        for trainers in (1, 2, 4):
            scenario = load_scenario(None, [*base, f"paramserver.staleness_limit={limit}"])
            run = run_ps(scenario, trainers, "float64", timeout=120, problem=problem)
            if run.failure is not None:
                raise SystemExit(f"bench/ps.py: K={trainers}: {run.failure}")
            trace = run.trace
            rate = overlap_rate(thread_ends(trace))
            serial = rate if serial is None else serial
            dropped = float((trace["step"] == 0).mean())
            print(f"| {trainers} | {limit or 'none'} | {rate:,.0f} | {rate / serial:.2f}× | "
                  f"{trace['staleness'].mean():.2f} | {dropped:.1%} | "
                  f"{trace['curve_loss'][-1] - f_star:.4g} |", flush=True)


def _start(base: list[str], runs: str, columns: tuple[str, ...]) -> tuple[Any, float]:
    """The problem and f*; print the machine line and the table's header."""
    problem = make_problem(load_scenario(None, base).problem)
    f_star = problem.optimum()[1]
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, gloo on loopback, "
          f"{runs}")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---:|" * len(columns))
    return problem, f_star


#: The server's protocols and options: label, trainers, scenario settings. A row with one
#: trainer is the baseline of the rows after it (serial SGD through the server; Sandblaster's
#: units computed by one trainer).
SERVER_RUNS = (
    ("paramserver (serial through the server)", 1, []),
    ("paramserver", 2, []),
    ("rule staleness_lr", 2, ["paramserver.rule=staleness_lr"]),
    ("rule dcasgd", 2, ["paramserver.rule=dcasgd"]),
    ("lock-free server", 2, ["paramserver.lock_free=true"]),
    ("pool of 2 servers", 2, ["paramserver.servers=2", "run.blocks=2"]),
    ("backup-worker rounds, fraction 1", 2, ["paramserver.fraction=1"]),
    ("backup-worker rounds, fraction 0.5", 2, ["paramserver.fraction=0.5"]),
    ("rounds on a pool of 2, fraction 1", 2, ["paramserver.fraction=1",
                                              "paramserver.servers=2", "run.blocks=2"]),
    ("admm (z on the server)", 2, ["run.protocol=admm"]),
    ("sandblaster, one trainer (units of 63 gradients)", 1, ["run.protocol=sandblaster"]),
    ("sandblaster", 2, ["run.protocol=sandblaster"]),
)


def protocols(base: list[str], updates: int) -> None:
    """Pushes (updates) per second of each server protocol against serial SGD through it
    (Sandblaster against its own units computed by one trainer)."""
    problem, f_star = _start(base, f"{updates:,} pushes per run",
                             ("protocol", "trainers", "pushes/s", "vs K = 1",
                              "mean staleness", "final f − f*"))
    serial = 0.0
    for label, trainers, settings in SERVER_RUNS:
        scenario = load_scenario(None, [*base, "run.protocol=paramserver", *settings])
        run = run_ps(scenario, trainers, "float64", timeout=120, problem=problem)
        if run.failure is not None:
            raise SystemExit(f"bench/ps.py: {label}: {run.failure}")
        rate = overlap_rate(thread_ends(run.trace))
        serial = rate if trainers == 1 else serial
        print(f"| {label} | {trainers} | {rate:,.0f} | {rate / serial:.2f}× | "
              f"{run.trace['staleness'].mean():.2f} | "
              f"{run.trace['curve_loss'][-1] - f_star:.4g} |", flush=True)


def pool(base: list[str], servers: list[int], updates: int) -> None:
    """Pushes per second of a pool of S servers at K trainers, real and simulated."""
    from simulator.engine import simulate

    # The loss curve at two points only: a single server evaluates f at each checkpoint in
    # its loop (a pool's view is rebuilt after the run), which at d = 10,000 costs it most
    # of its time.
    base = [*base, "metrics.curve_points=2"]
    problem, f_star = _start(base, f"d = {load_scenario(None, base).problem.dim:,}, "
                             f"{updates:,} pushes per run",
                             ("servers", "trainers", "pushes/s", "vs S = 1, K = 1",
                              "mean staleness", "final f − f*", "simulated: vs S = 1, K = 1"))
    first = simulated_first = None
    for s in servers:
        for trainers in (1, 2, 4):
            scenario = load_scenario(None, [*base, "run.protocol=paramserver",
                                            f"paramserver.servers={s}", f"run.blocks={s}"])
            run = run_ps(scenario, trainers, "float64", timeout=120, problem=problem)
            if run.failure is not None:
                raise SystemExit(f"bench/ps.py: S={s}, K={trainers}: {run.failure}")
            rate = overlap_rate(thread_ends(run.trace))
            first = rate if first is None else first
            sim = simulate(load_scenario(None, [*base, "run.protocol=paramserver",
                                                f"paramserver.servers={s}", f"run.blocks={s}",
                                                f"run.threads={trainers}"]), problem)
            simulated = overlap_rate(thread_ends(sim))
            simulated_first = simulated if simulated_first is None else simulated_first
            print(f"| {s} | {trainers} | {rate:,.0f} | {rate / first:.2f}× | "
                  f"{run.trace['staleness'].mean():.2f} | "
                  f"{run.trace['curve_loss'][-1] - f_star:.4g} | "
                  f"{simulated / simulated_first:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
