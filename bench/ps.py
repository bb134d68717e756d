"""Parameter server on torch.distributed (gloo, loopback): pushes per second and accuracy.

For K = 1, 2, 4 trainers, with and without a staleness threshold: pushes per second (over the
window in which every trainer pushes), the final suboptimality and the fraction of pushes
dropped as too stale, on the default dense logistic problem (d = 100), float64. The baseline
measured in the same run is K = 1 (serial SGD through the server).

    python bench/ps.py            # 6,000 pushes per run
    python bench/ps.py --quick    # 1,500
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

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
    args = parser.parse_args()
    updates = 1_500 if args.quick else 6_000
    base = ["run.lr=0.05", f"run.updates={updates}"]
    problem = make_problem(load_scenario(None, base).problem)
    f_star = problem.optimum()[1]
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, gloo on loopback, "
          f"{updates:,} pushes per run")
    print("| trainers | staleness limit | pushes/s | vs K = 1 | mean staleness | dropped | "
          "final f − f* |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
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


if __name__ == "__main__":
    main()
