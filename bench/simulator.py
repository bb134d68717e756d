"""Cost per simulated update relative to a bare numpy SGD loop computing the same gradients.

Both are measured side by side in one run, on the same problem object and the same number of
updates, alternating (baseline, simulation) and keeping the median of the repeats. The loss
curve is off (curve_points=0) so the table shows the engine and the exact metrics alone.

    python bench/simulator.py            # full table
    python bench/simulator.py --quick    # fewer updates, for a smoke run
    python bench/simulator.py --protocols  # only the table of protocols (d = 100, k = 8)
    python bench/simulator.py --schedules  # only controlled schedules (asyngrad explore)
    python bench/simulator.py --torch      # only torch modules, against a bare torch loop
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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
    """Seconds per gradient of the engine on ``problem`` (an update computes the protocol's
    ``grad_work`` gradients: ADMM's local steps, Sandblaster's chunk)."""
    scenario = load_scenario(None, overrides)
    engine = Engine(scenario, problem)
    started = time.perf_counter()
    engine.run()
    return ((time.perf_counter() - started)
            / (scenario.run.updates * engine.protocol.grad_work))


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
             "dcasgd", "admm", "sandblaster")


def protocols(updates: int, repeats: int) -> None:
    """Each protocol at d = 100, k = 8, B = 1, metrics off, against the bare loop."""
    problem = make_problem(load_scenario(None, []).problem)
    problem.optimum()
    print("| protocol | bare SGD µs/gradient | simulator µs/gradient | ratio |")
    print("|---|---:|---:|---:|")
    for protocol in PROTOCOLS:
        # (Sandblaster's units are 16 chunks of the 1,000 samples: a round of them is 1,000
        # gradients.)
        count = max(1, updates // 1000) * 16 if protocol == "sandblaster" else updates
        overrides = [f"run.protocol={protocol}", f"run.updates={count}",
                     "metrics.exact=false", "metrics.curve_points=0"]
        samples = np.random.default_rng(0).integers(0, problem.n_samples, updates)
        base, sim = [], []
        for _ in range(repeats):
            base.append(bare_sgd(problem, samples, 0.02))
            sim.append(simulated(problem, overrides))
        b, m = statistics.median(base), statistics.median(sim)
        print(f"| {protocol} | {b * 1e6:.2f} | {m * 1e6:.2f} | {m / b:.2f} |", flush=True)
    # The model-parallel protocols on the mlp (default shape): a sample's gradient is its two
    # stages' rows (amp and local with 4 samples in flight; block_admm's stages each on
    # samples of their own, two rows a sample's worth of work).
    staged = ["problem.name=mlp", "run.threads=2", "run.blocks=2"]
    mlp = make_problem(load_scenario(None, staged).problem)
    mlp.optimum()
    samples = np.random.default_rng(0).integers(0, mlp.n_samples, updates // 2)
    for protocol in ("amp", "local", "block_admm"):
        overrides = [*staged, f"run.protocol={protocol}", f"run.updates={2 * samples.size}",
                     "metrics.exact=false", "metrics.curve_points=0"]
        base, sim = [], []
        for _ in range(repeats):
            base.append(bare_sgd(mlp, samples, 0.02))
            sim.append(2 * simulated(mlp, overrides))  # (per row: half a sample's gradient)
        b, m = statistics.median(base), statistics.median(sim)
        print(f"| {protocol} (mlp, per sample: 2 stage rows) | {b * 1e6:.2f} | {m * 1e6:.2f} | "
              f"{m / b:.2f} |", flush=True)


# Controlled-schedule cases: (label, overrides, scheduler), on the default problem at d = 4
# with 20 samples (the test suite's tiny case) unless the overrides say otherwise.
SCHEDULE_CASES = (
    ("k = 2, T = 2, B = 1, random", ["run.updates=2"], "random"),
    ("k = 8, d = 100, T = 80, B = 1, random, exact metrics on",
     ["run.threads=8", "run.updates=80", "problem.dim=100"], "random"),
    ("the same, exact metrics off",
     ["run.threads=8", "run.updates=80", "problem.dim=100", "metrics.exact=false"], "random"),
    ("k = 2, T = 2, B = 1, dfs (70 interleavings)", ["run.updates=2"], "dfs"),
    ("k = 3, T = 3, B = 1, dfs (first 5,000 of 34,650), exact metrics off",
     ["run.threads=3", "run.updates=3", "metrics.exact=false"], "dfs"),
)


def schedules(seconds: float) -> None:
    """Controlled runs per second, and their cost per update against the bare loop."""
    from simulator.schedule import enumerate_schedules, explore

    print("| case | schedules/s | µs/update | bare SGD µs/update | ratio |")
    print("|---|---:|---:|---:|---:|")
    for label, extra, kind in SCHEDULE_CASES:
        scenario = load_scenario(None, ["problem.dim=4", "problem.n_samples=20", "run.blocks=1",
                                        "metrics.curve_points=0", *extra])
        problem = make_problem(scenario.problem)
        problem.optimum()
        samples = np.random.default_rng(0).integers(0, problem.n_samples, 20_000)
        base = statistics.median(bare_sgd(problem, samples, 0.02) for _ in range(3))
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            if kind == "dfs":
                runs += enumerate_schedules(scenario, "lost_blocks", limit=5_000)["schedules"]
            else:
                explore(scenario, kind, 200, "lost_blocks", seed=runs)
                runs += 200
        per_run = (time.perf_counter() - started) / runs
        per_update = per_run / scenario.run.updates
        print(f"| {label} | {1 / per_run:,.0f} | {per_update * 1e6:.1f} | {base * 1e6:.2f} | "
              f"{per_update / base:.0f} |", flush=True)


ROOT = Path(__file__).resolve().parent.parent
TORCH_CASES = [
    ("digits convnet (examples/digits_convnet.py, 3,658 parameters)",
     f"{ROOT}/examples/digits_convnet.py:make"),
    ("tanh MLP 64-1500-10 (bench/models.py, 112,510 parameters)",
     f"{ROOT}/bench/models.py:digits_mlp"),
]


def bare_torch(problem: Any, samples: np.ndarray, lr: float) -> float:
    """Seconds per update of the plain PyTorch loop on the problem's own module and minibatches:
    ``loss_fn(model(x), y).backward()``, then SGD with weight decay λ (the (λ/2)‖w‖² term)."""
    import copy

    import torch

    model = copy.deepcopy(problem.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=problem.l2)
    X, y, batch = problem.X, problem.y, problem.batch
    started = time.perf_counter()
    for z in samples.tolist():
        optimizer.zero_grad()
        problem.loss_fn(model(X[z * batch:(z + 1) * batch]), y[z * batch:(z + 1) * batch]
                        ).backward()
        optimizer.step()
    return (time.perf_counter() - started) / samples.size


def torch_models(updates: int, repeats: int) -> None:
    """A user's torch module (minibatches of 16, d as the module has, k = 1 and 8, B = 1,
    metrics off) against the bare PyTorch loop on the same module, both on one torch
    thread."""
    import torch

    torch.set_num_threads(1)
    print("| module | k | bare torch µs/update | simulator µs/update | ratio |")
    print("|---|---:|---:|---:|---:|")
    for label, factory in TORCH_CASES:
        model = ["problem.name=torch", f"problem.model={factory}", "problem.batch=16"]
        problem = make_problem(load_scenario(None, model).problem)
        problem.optimum()  # computed once (L-BFGS), outside the timings
        samples = np.random.default_rng(0).integers(0, problem.n_samples, updates)
        for threads in (1, 8):
            overrides = [*model, f"run.threads={threads}", f"run.updates={updates}",
                         "metrics.exact=false", "metrics.curve_points=0", "run.lr=0.05"]
            base, sim = [], []
            for _ in range(repeats):
                base.append(bare_torch(problem, samples, 0.05))
                sim.append(simulated(problem, overrides))
            b, s = statistics.median(base), statistics.median(sim)
            print(f"| {label} | {threads} | {b * 1e6:.0f} | {s * 1e6:.0f} | {s / b:.2f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates and repeats")
    parser.add_argument("--protocols", action="store_true", help="only the protocol table")
    parser.add_argument("--schedules", action="store_true",
                        help="only the table of controlled schedules")
    parser.add_argument("--torch", action="store_true",
                        help="only torch modules against a bare torch loop")
    args = parser.parse_args()
    scale, repeats = (0.1, 1) if args.quick else (1.0, 3)
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}")
    if args.protocols:
        protocols(int(20_000 * scale), repeats)
        return
    if args.schedules:
        schedules(3.0 * scale)
        return
    if args.torch:
        torch_models(int(3_000 * scale), repeats)
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
    print()
    schedules(3.0 * scale)
    print()
    torch_models(int(3_000 * scale), repeats)


if __name__ == "__main__":
    main()
