"""CUDA real-backend throughput and gradient errors, measured side by side in one run.

A tanh MLP (input 1024, 512 hidden units, 10 classes: 529,930 float32 parameters) trained
with per-sample gradients by workers on one CUDA parameter tensor: updates per second
(over the window in which every worker runs) of serial, locked and lock-free workers for
K = 1, 2, 4, 8, with workers as threads of one process (each on its own CUDA stream) and as
spawned processes (CUDA IPC), and the host-master pattern (parameters in host memory, each
worker computing on its own GPU copy). Then the exact gradient error rate of lock-free runs
at each K by measure mode (every step kept and replayed offline), and what the hardware lost;
these runs are float64, since float32 rounding alone puts ‖δ‖/‖g‖ near 1e-6, above the
1e-9 that counts as an error.

    python bench/gpu.py            # full table
    python bench/gpu.py --quick    # fewer updates
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# Run as `python bench/gpu.py`, this file's folder comes first on sys.path; drop it so the
# bench's own names never shadow the project's packages.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import torch

from realrun.runner import run_real
from realrun.timeline import overlap_rate, thread_ends
from simulator.metrics import summarize
from simulator.problems import make_problem
from simulator.scenario import load_scenario

MODEL = ["problem.name=mlp", "problem.dim=1024", "problem.hidden=512", "problem.classes=10",
         "problem.n_samples=1000", "run.lr=0.01", "metrics.curve_points=10"]
WORKERS = (1, 2, 4, 8)


def _rate(scenario_overrides: list[str], workers: int, mode: str, launch: str,
          pattern: str, problem: object) -> tuple[float, float]:
    """(updates per second while all workers run, final loss) of one run."""
    scenario = load_scenario(None, [*MODEL, *scenario_overrides])
    run = run_real(scenario, workers, mode, "float32", timeout=300, device="cuda",
                   launch=launch, pattern=pattern, problem=problem)  # type: ignore[arg-type]
    if run.failure is not None:
        raise SystemExit(f"bench/gpu.py: {mode} K={workers} {launch}: {run.failure}")
    return overlap_rate(thread_ends(run.trace)), float(run.trace["curve_loss"][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    parser.add_argument("--errors-only", action="store_true",
                        help="only the gradient error table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: needs CUDA (torch.cuda.is_available() is False)")
    updates = 1_000 if args.quick else 4_000
    measured = 400 if args.quick else 1_000
    problem = make_problem(load_scenario(None, MODEL).problem)
    problem.optimum()  # once, outside every timing
    device = torch.cuda.get_device_name()
    print(f"# {time.strftime('%Y-%m-%d')}, {device}, {os.cpu_count()} CPU cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, "
          f"d = {problem.dim:,} float32, {updates:,} updates per run")
    results: dict[str, object] = {"device": device, "dim": problem.dim, "updates": updates}
    print("\n| launch / pattern | mode | K | updates/s | vs serial | final loss |")
    print("|---|---|---:|---:|---:|---:|")
    table = []
    for launch, pattern in (() if args.errors_only else (("threads", "shared"),
                            ("processes", "shared"), ("processes", "host"))):
        base = None
        for mode, workers in (("serial", 1), *[(m, k) for m in ("locked", "lockfree")
                                                 for k in WORKERS]):
            rate, loss = _rate([f"run.updates={updates}"], workers, mode, launch, pattern,
                               problem)
            base = rate if base is None else base
            table.append({"launch": launch, "pattern": pattern, "mode": mode,
                          "workers": workers, "updates_per_s": rate, "final_loss": loss})
            print(f"| {launch} / {pattern} | {mode} | {workers} | {rate:,.0f} | "
                  f"{rate / base:.2f}× | {loss:.4f} |", flush=True)
    results["throughput"] = table
    print(f"\n| launch | K | error rate | median ‖δ‖/‖g‖ | mean staleness | hardware lost "
          f"(share of distance moved) |   ({measured:,} updates, lock-free, float64, measure mode)")
    print("|---|---:|---:|---:|---:|---:|")
    errors = []
    for launch in ("threads", "processes"):
        for workers in WORKERS:
            scenario = load_scenario(None, [*MODEL, f"run.updates={measured}"])
            run = run_real(scenario, workers, "lockfree", "float64", timeout=300,
                           measure_every=1, problem=problem, device="cuda", launch=launch)
            summary = summarize(run.trace, problem, run.scenario)
            error = summary["gradient_error"]
            lost = run.hardware_loss or {}
            row = {"launch": launch, "workers": workers, "rate": error["rate"],
                   "median_relative": error["relative"]["p50"],
                   "staleness": summary["staleness"]["mean"],
                   "hardware_lost": lost.get("relative_to_distance_moved")}
            errors.append(row)
            rate = "n/a" if row["rate"] is None else f"{row['rate']:.3f}"
            print(f"| {launch} | {workers} | {rate} | "
                  f"{row['median_relative'] or 0:.3g} | {row['staleness']:.2f} | "
                  f"{row['hardware_lost'] or 0:.3g} |", flush=True)
    results["errors"] = errors
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
