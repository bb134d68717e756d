"""Real-backend throughput and accuracy, measured side by side in one run.

For dense logistic regression (d = 100 and d = 10,000): updates per second of serial, locked
and lock-free workers (1 and 2), their final suboptimality over seeds, and the same training
written the plain way of the PyTorch Hogwild example (``model.share_memory()``, one SGD
optimizer per process, autograd) as the baseline a user would otherwise write. Throughput is
the sum over workers of each worker's updates / (its last write end − its first read start):
workers start tens of ms apart (spawn), and this steady-state rate is measured the same way for
both implementations.

    python bench/realrun.py            # full table
    python bench/realrun.py --quick    # fewer updates and seeds
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# Run as `python bench/realrun.py`, this file's folder comes first on sys.path; drop it so the
# bench's own names never shadow the project's packages.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import numpy as np
import torch
import torch.multiprocessing as mp

from realrun.runner import run_real
from simulator.problems import make_problem
from simulator.scenario import Scenario, load_scenario
from simulator.timing import sample_stream


def _ours(scenario: Scenario, workers: int, mode: str) -> tuple[float, float]:
    """(updates per second, final suboptimality) of one real run."""
    run = run_real(scenario, workers, mode, dtype="float64")
    trace = run.trace
    rate = 0.0
    for rank in range(run.workers):
        mine = trace["thread"] == rank
        span = int(trace["write_end"][mine].max()) - int(trace["read_start"][mine].min())
        rate += int(mine.sum()) / (span * 1e-9)
    return rate, float(trace["curve_loss"][-1]) - run.problem.optimum()[1]


def _plain_worker(rank: int, workers: int, quota: int, toml: str, weight: torch.Tensor,
                  stamps: torch.Tensor) -> None:
    """The PyTorch Hogwild example's loop: per-process optimizer on a shared module."""
    import tomllib

    from simulator.scenario import scenario_from_dict
    torch.set_num_threads(1)
    scenario = scenario_from_dict(tomllib.loads(toml))
    problem = make_problem(scenario.problem)
    model = torch.nn.Linear(problem.dim, 1, bias=False, dtype=torch.float64)
    model.weight = torch.nn.Parameter(weight, requires_grad=True)  # shares the memory
    optimizer = torch.optim.SGD(model.parameters(), lr=scenario.run.lr)
    X = torch.as_tensor(problem.X)
    y = torch.as_tensor(problem.y)
    stream = sample_stream(scenario.run.seed, workers, rank, problem.n_samples)
    stamps[rank, 0] = time.monotonic_ns()
    for _ in range(quota):
        i = int(stream.take())
        optimizer.zero_grad()
        margin = y[i] * model(X[i]).squeeze()
        loss = torch.nn.functional.softplus(-margin) + 0.5 * problem.l2 * (model.weight ** 2).sum()
        loss.backward()
        optimizer.step()
    stamps[rank, 1] = time.monotonic_ns()


def _plain(scenario: Scenario, workers: int) -> tuple[float, float]:
    from simulator.scenario import scenario_to_toml
    problem = make_problem(scenario.problem)
    weight = torch.zeros(1, problem.dim, dtype=torch.float64).share_memory_()
    stamps = torch.zeros(workers, 2, dtype=torch.int64).share_memory_()
    updates = scenario.run.updates
    quotas = [updates // workers + (1 if r < updates % workers else 0) for r in range(workers)]
    context = mp.get_context("spawn")
    toml = scenario_to_toml(scenario)
    processes = [context.Process(target=_plain_worker, args=(r, workers, quotas[r], toml, weight,
                                                              stamps)) for r in range(workers)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    rate = sum(quota / ((int(stamps[r, 1]) - int(stamps[r, 0])) * 1e-9)
               for r, quota in enumerate(quotas))
    w = weight.numpy().ravel()
    return rate, problem.full_loss(w) - problem.optimum()[1]


CONFIGS = [("serial", 1), ("locked", 2), ("lockfree", 1), ("lockfree", 2), ("plain", 1),
           ("plain", 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates and seeds")
    args = parser.parse_args()
    seeds = 2 if args.quick else 3
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}")
    print("| problem | mode | workers | updates/s (median) | vs serial | final suboptimality "
          "(mean ± sd over seeds) |")
    print("|---|---|---:|---:|---:|---:|")
    for dim, updates in ((100, 20_000), (10_000, 4_000)):
        updates = updates // 4 if args.quick else updates
        results = {}
        for mode, workers in CONFIGS:
            speeds, subopts = [], []
            for seed in range(seeds):
                scenario = load_scenario(None, [f"problem.dim={dim}", f"run.updates={updates}",
                                                f"run.seed={seed}"])
                speed, subopt = (_plain(scenario, workers) if mode == "plain"
                                 else _ours(scenario, workers, mode))
                speeds.append(speed)
                subopts.append(subopt)
            results[(mode, workers)] = (statistics.median(speeds), np.mean(subopts),
                                        np.std(subopts))
        base = results[("serial", 1)][0]
        for (mode, workers), (speed, mean, sd) in results.items():
            label = "plain PyTorch Hogwild" if mode == "plain" else mode
            print(f"| logistic d={dim:,} | {label} | {workers} | {speed:,.0f} | "
                  f"{speed / base:.2f}× | {mean:.4f} ± {sd:.4f} |", flush=True)


if __name__ == "__main__":
    main()
