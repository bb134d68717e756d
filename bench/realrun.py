"""Real-backend throughput and accuracy, measured side by side in one run.

For dense logistic regression (d = 100 and d = 10,000) and a tanh MLP of 105,004 parameters:
updates per second of serial, locked and lock-free workers (1 and 2), their final
suboptimality over seeds (the MLP's against a local-minimum estimate), and the same training
written the plain way of the PyTorch Hogwild example (``model.share_memory()``, one SGD
optimizer per process, autograd) as the baseline a user would otherwise write. Throughput is
measured over the overlap window, when every worker is running (spawned workers start tens of
ms apart): updates completed in the window divided by its length, from per-update end times
recorded the same way on both sides. Then the cost of measure mode (``--measure``: the
workers' updates per second with and without it, and the parent's offline rebuild). Then,
because two-worker MLP runs on a shared machine
swing by tens of percent, the MLP's serial, lock-free ×2 and block-locked ×2 runs paired by
seed, with how each lock-free run's writes met (write lockstep: writes that coincide and take
many times a lone write) and how far apart its two CPUs were (the cache-line latency between
them just before and after it: a virtual machine's host moves its CPUs between L3 domains).

    python bench/realrun.py                     # full table, then 9 paired seeds
    python bench/realrun.py --quick             # fewer updates and seeds
    python bench/realrun.py --pairs-only --pairs 15
    python bench/realrun.py --measure-only      # what --measure costs
    python bench/realrun.py --torch             # users' torch modules (problem.name = torch)
    python bench/realrun.py --protocols         # protocols other than lock-free (minibatch)
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Run as `python bench/realrun.py`, this file's folder comes first on sys.path; drop it so the
# bench's own names never shadow the project's packages.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import numpy as np
import torch
import torch.multiprocessing as mp

from realrun.records import compiled
from realrun.runner import run_real
from realrun.timeline import overlap_rate, thread_ends
from realrun.worker import START
from simulator.fidelity.runs import alone_writes, running_together
from simulator.problems import MLPProblem, Problem, TorchProblem, make_problem
from simulator.rundir import FAR_NS, latency_pair, placement
from simulator.scenario import Scenario, load_scenario, with_overrides
from simulator.timing import sample_stream
from simulator.trace import Trace


def _ours(scenario: Scenario, problem: Problem, workers: int, mode: str,
          dtype: str) -> tuple[float, float]:
    """(updates per second, final suboptimality) of one real run."""
    rate, suboptimality, _, _ = _run(scenario, problem, workers, mode, dtype)
    return rate, suboptimality


def _run(scenario: Scenario, problem: Problem, workers: int, mode: str, dtype: str,
         probe: bool = False) -> tuple[float, float, Trace, dict[str, Any] | None]:
    """:func:`_ours`, the run's trace and its CPU-to-CPU latency (``RealRun.cpu_latency``,
    probed when asked)."""
    run = run_real(scenario, workers, mode, dtype=dtype, problem=problem, probe=probe)
    return (overlap_rate(thread_ends(run.trace)),
            float(run.trace["curve_loss"][-1]) - problem.optimum()[1], run.trace,
            run.cpu_latency)


def far_apart(latency: dict[str, Any] | None) -> bool | None:
    """Whether a run's two CPUs were far apart (cache-line latency ≥ ``FAR_NS`` before or
    after it: ``placement`` far or changing); None when it was not measured."""
    state = placement(latency)
    return None if state is None else state != "near"


def write_lockstep(trace: Trace, reference_us: float) -> tuple[float, float, float | None]:
    """Over the span in which every worker ran: (share of writes that another write
    overlapped, share that were overlapped and took ≥ 3× ``reference_us``, median µs of the
    overlapped writes, None when no write met another)."""
    rows = running_together(trace)
    met = np.setdiff1d(rows, alone_writes(trace, rows))
    duration = (trace["write_end"][met] - trace["write_start"][met]) / 1e3
    return (met.size / max(rows.size, 1),
            float(np.sum(duration >= 3 * reference_us)) / max(rows.size, 1),
            float(np.median(duration)) if met.size else None)


def median_write_us(trace: Trace) -> float:
    """The median write's duration, µs."""
    return float(np.median(trace["write_end"] - trace["write_start"])) / 1e3


def _model(problem: Problem) -> torch.nn.Module:
    """The module a PyTorch user would write for the problem, starting at its w_0 (a torch
    problem's own module)."""
    if isinstance(problem, TorchProblem):
        return copy.deepcopy(problem.module)
    w0 = torch.as_tensor(problem.initial())
    if isinstance(problem, MLPProblem):
        d_in, hidden, classes = problem.shape
        model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                                    torch.nn.Linear(hidden, classes)).double()
    else:
        model = torch.nn.Linear(problem.dim, 1, bias=False).double()
    with torch.no_grad():
        offset = 0
        for parameter in model.parameters():
            parameter.copy_(w0[offset: offset + parameter.numel()].view_as(parameter))
            offset += parameter.numel()
    return model


def _plain_worker(rank: int, workers: int, quota: int, toml: str,
                  shared: list[torch.Tensor], stamps: torch.Tensor,
                  start: SimpleNamespace) -> None:
    """The PyTorch Hogwild example's loop: a per-process optimizer on a shared module. The
    worker builds the module itself (a user's module class, loaded from a file, cannot be
    pickled to it) and points its parameters at the shared tensors, as ``share_memory()``
    leaves them. It starts with the others, as the real runs' workers do (``wait_for_start``):
    spawned one after another, a worker would otherwise make all its updates of a short run
    before the next had started, and leave no window in which both ran (the table's ``nan``)."""
    import tomllib

    from realrun.worker import die_with_parent, wait_for_start
    from simulator.scenario import scenario_from_dict
    torch.set_num_threads(1)
    scenario = scenario_from_dict(tomllib.loads(toml))
    problem = make_problem(scenario.problem)
    model = _model(problem)
    for parameter, memory in zip(model.parameters(), shared, strict=True):
        parameter.data = memory
    optimizer = torch.optim.SGD(model.parameters(), lr=scenario.run.lr)
    X, y = torch.as_tensor(problem.X), torch.as_tensor(problem.y)
    mlp = isinstance(problem, MLPProblem)
    batch = problem.batch if isinstance(problem, TorchProblem) else None
    stream = sample_stream(scenario.run.seed, workers, rank, problem.n_samples)
    wait_for_start(start, rank, die_with_parent())
    for step in range(quota):
        i = int(stream.take())
        optimizer.zero_grad()
        if batch is not None:  # a user's module: its own loss on the minibatch
            rows = slice(i * batch, (i + 1) * batch)
            data = problem.loss_fn(model(X[rows]), y[rows])
        else:
            out = model(X[i])
            data = (torch.nn.functional.cross_entropy(out.unsqueeze(0), y[i].unsqueeze(0))
                    if mlp else torch.nn.functional.softplus(-y[i] * out.squeeze()))
        penalty = sum((p * p).sum() for p in model.parameters())
        (data + 0.5 * problem.l2 * penalty).backward()
        optimizer.step()
        stamps[rank, step] = time.monotonic_ns()


def _plain(scenario: Scenario, problem: Problem, workers: int) -> tuple[float, float]:
    from simulator.scenario import scenario_to_toml
    shared = [p.detach().clone().share_memory_() for p in _model(problem).parameters()]
    updates = scenario.run.updates
    quotas = [updates // workers + (1 if r < updates % workers else 0) for r in range(workers)]
    stamps = torch.zeros(workers, max(quotas), dtype=torch.int64).share_memory_()
    start = SimpleNamespace(ready=torch.zeros(workers, dtype=torch.int64).share_memory_(),
                            control=torch.zeros(2, dtype=torch.int64).share_memory_())
    context = mp.get_context("spawn")
    toml = scenario_to_toml(scenario)
    processes = [context.Process(target=_plain_worker, args=(
        r, workers, quotas[r], toml, shared, stamps, start)) for r in range(workers)]
    for p in processes:
        p.start()
    while not all(start.ready.tolist()):
        time.sleep(0.01)
    start.control[START] = time.monotonic_ns() + 10_000_000
    for p in processes:
        p.join()
    rate = overlap_rate([stamps[r, :quota].numpy() for r, quota in enumerate(quotas)])
    w = torch.cat([p.reshape(-1) for p in shared]).numpy()
    return rate, problem.full_loss(w) - problem.optimum()[1]


CONFIGS = [("serial", 1), ("locked", 2), ("lockfree", 1), ("lockfree", 2), ("plain", 1),
           ("plain", 2)]


def instrumentation_ns(blocks: int, native: bool, updates: int = 200_000) -> float:
    """ns per update of exactly what the numpy worker adds to record an update, timed in
    isolation: the recorder's calls (4 stamps, 2B more with B > 1 blocks, and ``done``) into
    preallocated shared buffers, with the C recorder (``native``) or the Python one, less the
    block loops the worker runs anyway."""
    from realrun.records import recorder
    from realrun.worker import _flat

    def shared(*shape: int) -> memoryview:
        return _flat(torch.zeros(*shape, dtype=torch.int64).share_memory_())

    record = recorder(shared(updates, 4), shared(updates), shared(1), 0, shared(updates, blocks),
                      shared(updates, blocks), blocks, native=native)
    start, read_end, grad_end, written = (record.start, record.read_end, record.grad_end,
                                          record.written)
    copied, stored, done = record.copied, record.stored, record.done
    stamp = blocks > 1
    started = time.perf_counter_ns()
    for i in range(updates):
        start()
        for b in range(blocks):
            if stamp:
                copied(b)
        read_end()
        grad_end()
        for b in range(blocks):
            if stamp:
                stored(b)
        written()
        done(i)
    loop = time.perf_counter_ns() - started
    started = time.perf_counter_ns()
    for _ in range(updates):
        for _b in range(blocks):
            pass
        for _b in range(blocks):
            pass
    empty = time.perf_counter_ns() - started  # the loops the worker runs anyway
    return (loop - empty) / updates


PROBLEMS = (
    ("logistic d=100", ["problem.dim=100"], 20_000),
    ("logistic d=10,000", ["problem.dim=10000"], 4_000),
    ("MLP 100-1000-4 (105,004 parameters)",
     ["problem.name=mlp", "problem.dim=100", "problem.hidden=1000", "problem.l2=0.001",
      "run.lr=0.005"], 2_000),
)

ROOT = Path(__file__).resolve().parent.parent
# Users' torch modules (problem.name = torch), minibatches of 16.
TORCH_PROBLEMS = (
    ("digits convnet (examples/digits_convnet.py, 3,658 parameters)",
     ["problem.name=torch", f"problem.model={ROOT}/examples/digits_convnet.py:make",
      "problem.batch=16", "run.lr=0.05"], 3_000),
    ("tanh MLP 64-1500-10 (bench/models.py, 112,510 parameters)",
     ["problem.name=torch", f"problem.model={ROOT}/bench/models.py:digits_mlp",
      "problem.batch=16", "run.lr=0.05"], 1_500),
)


def paired(label: str, overrides: list[str], updates: int, seeds: int,
           dtype: str = "float64") -> None:
    """Serial, lock-free ×2 and block-locked ×2 (a lock around each block's write only) run
    back to back for each seed, the order rotating with the seed, so that a change of the
    machine's state falls on every side of a ratio; with each lock-free run, how its writes
    met (:func:`write_lockstep`, against the same seed's serial writes)."""
    problem = make_problem(load_scenario(None, overrides).problem)
    problem.optimum()
    configs = [("serial", 1), ("lockfree", 2), ("blocklock", 2)]
    print(f"\n{label}: two workers against serial, paired by seed\n")
    print("| seed | serial updates/s | lock-free ×2 | ratio | writes met | met and ≥ 3× slower | "
          "met write (median) | serial write (median) | CPU latency before / after | "
          "block-locked ×2 | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {"lockfree": [], "blocklock": []}
    lockstep, far = [], []
    for seed in range(seeds):
        scenario = load_scenario(None, [*overrides, f"run.updates={updates}",
                                        f"run.seed={seed}"])
        order = configs[seed % 3:] + configs[: seed % 3]
        done = {mode: _run(scenario, problem, workers, mode, dtype, probe=True)
                for mode, workers in order}
        serial = done["serial"][0]
        for mode in ratios:
            ratios[mode].append(done[mode][0] / serial)
        alone = median_write_us(done["serial"][2])
        share, slow, met = write_lockstep(done["lockfree"][2], alone)
        lockstep.append(slow >= 0.5)
        latency = done["lockfree"][3]
        far.append(far_apart(latency))
        met_cell = "—" if met is None else f"{met:.0f} µs"  # no write met another
        print(f"| {seed} | {serial:,.0f} | {done['lockfree'][0]:,.0f} | "
              f"{ratios['lockfree'][-1]:.2f}× | {share:.2f} | {slow:.2f} | {met_cell} | "
              f"{alone:.0f} µs | {latency_pair(latency)}{'' if latency is None else ' ns'} | "
              f"{done['blocklock'][0]:,.0f} | {ratios['blocklock'][-1]:.2f}× |", flush=True)
    print()
    for mode, values in ratios.items():
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        print(f"{mode} ×2 / serial: median {median:.2f}× (quartiles {q1:.2f}–{q3:.2f}×), "
              f"≥ 1.7× in {sum(r >= 1.7 for r in values)} of {seeds}")
    stuck = np.array(lockstep)
    free = np.array(ratios["lockfree"])
    for name, members in (("lock-free runs in write lockstep (half their writes met and ≥ 3× "
                           "slower)", free[stuck]), ("the other lock-free runs", free[~stuck])):
        if members.size:
            print(f"{name}: {members.size}, ratio median {np.median(members):.2f}×")
    if any(f is not None for f in far):
        apart = np.array([bool(f) for f in far])
        for name, chosen in ((f"CPUs far apart (≥ {FAR_NS:.0f} ns before or after)", apart),
                             ("CPUs near", ~apart)):
            if chosen.any():
                print(f"lock-free runs on {name}: {int(chosen.sum())}, in write lockstep "
                      f"{int(stuck[chosen].sum())}, ratio median "
                      f"{np.median(free[chosen]):.2f}×, ≥ 1.7× in "
                      f"{int((free[chosen] >= 1.7).sum())}")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer updates and seeds")
    parser.add_argument("--pairs", type=int, default=None,
                        help="seeds of the paired MLP comparison (default 9, 3 with --quick)")
    parser.add_argument("--pairs-only", action="store_true",
                        help="only the paired MLP comparison")
    parser.add_argument("--measure-only", action="store_true",
                        help="only the cost of measure mode")
    parser.add_argument("--torch", action="store_true",
                        help="only the table of users' torch modules")
    parser.add_argument("--protocols", action="store_true",
                        help="only the protocols against serial and lock-free")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="the shared vector's dtype in the table and the paired runs "
                             "(measure mode's cost is always float64)")
    args = parser.parse_args()
    seeds = 2 if args.quick else 3
    pairs = args.pairs if args.pairs is not None else (3 if args.quick else 9)
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, shared vector "
          f"{args.dtype} (the plain PyTorch loop: float64)")
    label, overrides, updates = PROBLEMS[-1]
    if args.measure_only:
        measure_cost(args.quick, seeds)
        return
    if args.torch:
        table(args.quick, seeds, args.dtype, TORCH_PROBLEMS)
        return
    if args.protocols:
        protocols(args.quick, seeds, args.dtype)
        return
    if not args.pairs_only:
        table(args.quick, seeds, args.dtype)
        measure_cost(args.quick, seeds)
    paired(label, overrides, updates // 4 if args.quick else updates, pairs, args.dtype)


# Measure mode keeps two float64 vectors per update (the step and the read copy): the MLP's
# 105,004 parameters make 1.7 MB per update, so its rows run fewer updates.
MEASURE_UPDATES = {"MLP 100-1000-4 (105,004 parameters)": 500}


def measure_cost(quick: bool, seeds: int) -> None:
    """What ``--measure`` costs a lock-free ×2 run: the workers' updates per second with and
    without it (the workers store each step and read copy), and the parent's time after the
    workers end (``RealRun.finish_seconds``: merging the records; with measure mode also
    replaying every store from w_0 and evaluating the serialized view at every n-th
    completion), for n = 1 and 10. (The start-up is not in it: it took the CPU probes'
    seconds, which varied more than the rebuild took, and made its difference negative.)"""
    print("\n| problem | updates | lock-free ×2 updates/s | with --measure | ratio | rebuild "
          "and view, every completion | per update | every 10th completion | record buffers |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, overrides, updates in PROBLEMS:
        updates = MEASURE_UPDATES.get(label, updates) // (4 if quick else 1)
        problem = make_problem(load_scenario(None, overrides).problem)
        problem.optimum()
        cells: dict[int | None, list[tuple[float, float]]] = {None: [], 1: [], 10: []}
        for seed in range(seeds):
            scenario = load_scenario(None, [*overrides, f"run.updates={updates}",
                                            f"run.seed={seed}"])
            for every in cells:  # configurations inside, so the load falls on all alike
                run = run_real(scenario, 2, "lockfree", dtype="float64", problem=problem,
                               measure_every=every)
                cells[every].append((overlap_rate(thread_ends(run.trace)),
                                     run.finish_seconds))
        speed = {every: statistics.median(r for r, _ in done) for every, done in cells.items()}
        after = {every: statistics.median(a for _, a in done) for every, done in cells.items()}
        megabytes = 2 * updates * problem.dim * 8 / 1e6
        every, tenth = after[1] - after[None], after[10] - after[None]
        print(f"| {label} | {updates:,} | {speed[None]:,.0f} | {speed[1]:,.0f} | "
              f"{speed[1] / speed[None]:.2f}× | {every:.2f} s | {every / updates * 1e6:,.0f} µs | "
              f"{tenth:.2f} s | {megabytes:,.0f} MB |", flush=True)


PROTOCOL_CONFIGS = [("serial", 1), ("lockfree", 2), ("minibatch", 1), ("minibatch", 2),
                    ("allreduce", 2), ("roundrobin", 2), ("staleness_lr", 2), ("dcasgd", 2),
                    ("admm", 1), ("admm", 2)]


def round_us(trace: Trace) -> tuple[float, float]:
    """Of a synchronous run: the median round (one completion's period: its write end less
    the previous one's) and the median of what each round adds to its slowest member's
    read and gradient (waiting for the others, the mean step and its write), µs."""
    ends = np.unique(trace["write_end"])
    slowest = [int((trace["grad_end"][rows] - trace["read_start"][rows]).max())
               for rows in (trace["step"] == t for t in np.unique(trace["step"]))]
    period = np.diff(ends)
    return (float(np.median(period)) / 1e3,
            float(np.median(period - np.asarray(slowest[1:]))) / 1e3)


def protocols(quick: bool, seeds: int, dtype: str) -> None:
    """Gradients per second (overlap window) of each real protocol against serial, side by
    side per seed, with final suboptimality; for synchronous minibatch also the round's
    length and the barrier's share of it (:func:`round_us`). ADMM makes T / admm.local_steps
    pushes of admm.local_steps gradients each: the same gradients."""
    print("| problem | mode | workers | gradients/s (median) | vs serial | final suboptimality "
          "(mean ± sd) | round µs | barrier and write µs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, overrides, updates in PROBLEMS:
        updates = updates // 4 if quick else updates
        problem = make_problem(load_scenario(None, overrides).problem)
        problem.optimum()
        runs: dict[tuple[str, int], list[tuple[float, float, tuple[float, float] | None]]] = {
            c: [] for c in PROTOCOL_CONFIGS}
        for seed in range(seeds):
            scenario = load_scenario(None, [*overrides, f"run.updates={updates}",
                                            f"run.seed={seed}"])
            for mode, workers in PROTOCOL_CONFIGS:
                work = scenario.admm.local_steps if mode == "admm" else 1  # gradients a row
                rate, suboptimality, trace, _ = _run(
                    with_overrides(scenario, [f"run.updates={updates // work}"]), problem,
                    workers, mode, dtype)
                runs[(mode, workers)].append(
                    (rate * work, suboptimality,
                     round_us(trace) if mode in ("minibatch", "allreduce") else None))
        base = statistics.median(r for r, _, _ in runs[("serial", 1)])
        for (mode, workers), done in runs.items():
            rate = statistics.median(r for r, _, _ in done)
            values = [v for _, v, _ in done]
            rounds = [x for _, _, x in done if x is not None]
            cells = (f"{statistics.median(x[0] for x in rounds):.1f} | "
                     f"{statistics.median(x[1] for x in rounds):.1f}" if rounds else " | ")
            print(f"| {label} | {mode} | {workers} | {rate:,.0f} | {rate / base:.2f}× | "
                  f"{np.mean(values):.4f} ± {np.std(values):.4f} | {cells} |", flush=True)


def table(quick: bool, seeds: int, dtype: str = "float64",
          problems: tuple[tuple[str, list[str], int], ...] | None = None) -> None:
    """Every configuration on every problem (default: the built-in ones, then users' torch
    modules), then the instrumentation's cost."""
    print("| problem | mode | workers | updates/s (median) | vs serial | final suboptimality "
          "(mean ± sd over seeds) |")
    print("|---|---|---:|---:|---:|---:|")
    serial_update_ns: dict[str, float] = {}
    for label, overrides, updates in problems or PROBLEMS + TORCH_PROBLEMS:
        updates = updates // 4 if quick else updates
        problem = make_problem(load_scenario(None, overrides).problem)
        problem.optimum()  # once, outside every timing
        # Seeds outside, configurations inside: a change in the machine's load during the
        # run then falls on every configuration alike instead of on one configuration's rows.
        runs: dict[tuple[str, int], list[tuple[float, float]]] = {c: [] for c in CONFIGS}
        for seed in range(seeds):
            scenario = load_scenario(None, [*overrides, f"run.updates={updates}",
                                            f"run.seed={seed}"])
            for mode, workers in CONFIGS:
                runs[(mode, workers)].append(
                    _plain(scenario, problem, workers) if mode == "plain"
                    else _ours(scenario, problem, workers, mode, dtype))
        results = {config: (statistics.median(s for s, _ in done),
                            np.mean([v for _, v in done]), np.std([v for _, v in done]))
                   for config, done in runs.items()}
        base = results[("serial", 1)][0]
        for (mode, workers), (speed, mean, sd) in results.items():
            name = "plain PyTorch Hogwild" if mode == "plain" else mode
            print(f"| {label} | {name} | {workers} | {speed:,.0f} | {speed / base:.2f}× | "
                  f"{mean:.4f} ± {sd:.4f} |", flush=True)
        serial_update_ns[label] = 1e9 / base
    if problems is not None:
        return
    print("\n| problem | serial update | instrumentation, C recorder (B = 1) | share | "
          "Python recorder | share |")
    print("|---|---:|---:|---:|---:|---:|")
    native = compiled()
    cost = instrumentation_ns(1, native=True) if native else None
    fallback = instrumentation_ns(1, native=False)
    for label, update_ns in serial_update_ns.items():
        c_cells = ("n/a (not built) | n/a" if cost is None
                   else f"{cost / 1e3:.3f} µs | {cost / update_ns:.1%}")
        print(f"| {label} | {update_ns / 1e3:.2f} µs | {c_cells} | {fallback / 1e3:.3f} µs | "
              f"{fallback / update_ns:.1%} |")


if __name__ == "__main__":
    main()
