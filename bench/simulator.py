"""Cost per simulated update relative to a bare numpy SGD loop computing the same gradients.

Both are measured side by side in one run, on the same problem object and the same number of
updates, alternating (baseline, simulation) and keeping the median of the repeats. The loss
curve is off (curve_points=0) so the table shows the engine and the exact metrics alone.

    python bench/simulator.py            # full table
    python bench/simulator.py --quick    # fewer updates, for a smoke run
    python bench/simulator.py --protocols  # only the table of protocols (d = 100, k = 8)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

# Run as `python bench/simulator.py`, this file's folder comes first on sys.path and its name
# would shadow the `simulator` package; drop that folder before importing it.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import numpy as np

from simulator.engine import Engine
from simulator.problems import Problem, make_problem
from simulator.scenario import load_scenario


def bare_sgd(problem: Problem, samples: np.ndarray, lr: float) -> float:
    """Seconds per update of ``w -= lr·∇f_z(w)`` over ``samples``."""
    w = np.zeros(problem.dim)
    started = time.perf_counter()
    for z in samples.tolist():
        g, _ = problem.grad(w, z)
        w -= lr * g
    return (time.perf_counter() - started) / samples.size


def simulated(problem: Problem, overrides: list[str]) -> float:
    """Seconds per update of the engine on ``problem``."""
    scenario = load_scenario(None, overrides)
    engine = Engine(scenario, problem)
    started = time.perf_counter()
    engine.run()
    return (time.perf_counter() - started) / scenario.run.updates


def measure(dim: int, threads: int, blocks: int, exact: bool, updates: int,
            repeats: int, problem: Problem) -> tuple[float, float]:
    overrides = [f"problem.dim={dim}", f"run.threads={threads}", f"run.blocks={blocks}",
                 f"run.updates={updates}", f"metrics.exact={str(exact).lower()}",
                 "metrics.curve_points=0"]
    samples = np.random.default_rng(0).integers(0, problem.n_samples, updates)
    base, sim = [], []
    for _ in range(repeats):
        base.append(bare_sgd(problem, samples, 0.02))
        sim.append(simulated(problem, overrides))
    return statistics.median(base), statistics.median(sim)


PROTOCOLS = ("lockfree", "locked", "roundrobin", "minibatch", "paramserver", "staleness_lr",
             "dcasgd", "admm")


def protocols(updates: int, repeats: int) -> None:
    """Each protocol at d = 100, k = 8, B = 1, metrics off, against the bare loop."""
    problem = make_problem(load_scenario(None, []).problem)
    problem.optimum()
    print("| protocol | bare SGD µs/gradient | simulator µs/gradient | ratio |")
    print("|---|---:|---:|---:|")
    for protocol in PROTOCOLS:
        overrides = [f"run.protocol={protocol}", f"run.updates={updates}",
                     "metrics.exact=false", "metrics.curve_points=0"]
        samples = np.random.default_rng(0).integers(0, problem.n_samples, updates)
        base, sim = [], []
        for _ in range(repeats):
            base.append(bare_sgd(problem, samples, 0.02))
            sim.append(simulated(problem, overrides))
        b, m = statistics.median(base), statistics.median(sim)
        print(f"| {protocol} | {b * 1e6:.2f} | {m * 1e6:.2f} | {m / b:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates and repeats")
    parser.add_argument("--protocols", action="store_true", help="only the protocol table")
    args = parser.parse_args()
    scale, repeats = (0.1, 1) if args.quick else (1.0, 3)
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}")
    if args.protocols:
        protocols(int(20_000 * scale), repeats)
        return
    print("| d | k | B | exact metrics | bare SGD µs/update | simulator µs/update | ratio |")
    print("|---:|---:|---:|:---:|---:|---:|---:|")
    for dim, updates in ((100, 20_000), (10_000, 4_000)):
        problem = make_problem(load_scenario(None, [f"problem.dim={dim}"]).problem)
        problem.optimum()  # computed once, outside the timings
        for exact in (False, True):
            for blocks in (1, 16):
                for threads in (1, 8, 64):
                    base, sim = measure(dim, threads, blocks, exact, int(updates * scale),
                                        repeats, problem)
                    print(f"| {dim} | {threads} | {blocks} | {'on' if exact else 'off'} | "
                          f"{base * 1e6:.2f} | {sim * 1e6:.2f} | {sim / base:.2f} |",
                          flush=True)
    print()
    protocols(int(20_000 * scale), repeats)


if __name__ == "__main__":
    main()
