"""The floor of an exact event-ordered simulation in Python: minimal loops of the engine's
lock-free semantics (k threads, one block: the read's copy at its end, the load at the
write's start, the store ``loaded − lr·g`` at its end, in time order), with no records, against
the bare SGD loop and the engine, side by side (docs/performance.md): one event per touch (a
heap, or simpy), or one simpy event per update with the copies and loads taken lazily. Before
timing, each is checked bit for bit: plain SGD at one thread, and the same vector as the
heap's at k threads acting at distinct times.

Then the same for controlled schedules (``asyngrad explore``, k = 2, T = 2, d = 4): a run is
eight steps (per update: copy, gradient, load, store), each chosen by a scheduler drawing
uniforms 32 at a time; a plain Python loop, the same with one simpy event per step, and
``explore``'s random scheduler on the engine, in schedules per second.

    python bench/floor.py            # d = 100, k = 8, 20,000 updates, 5 alternating repeats
    python bench/floor.py --dim 10000 --updates 4000   # the first table at d = 10,000 only
    python bench/floor.py --quick
"""

from __future__ import annotations

import argparse
import heapq
import platform
import sys
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # (this folder would shadow the simulator package)

import numpy as np
import simpy

from simulator.engine import Engine
from simulator.problems import Problem, make_problem
from simulator.scenario import load_scenario

LR = 0.02
_SHIFT = 8  # heap keys: time << _SHIFT | thread


def _durations(threads: int, updates: int) -> list[list[tuple[int, int, int]]]:
    """Per thread, (read, gradient, write) ns for as many updates as the run has."""
    rng = np.random.default_rng(1)
    ns = np.maximum(1, rng.lognormal(np.log(500), 0.5, size=(threads, updates, 3)).astype(int))
    return [[tuple(row) for row in per.tolist()] for per in ns]


def heap_loop(problem: Problem, samples: list[int], threads: int,
              durations: list[list[tuple[int, int, int]]], record: bool = False) -> np.ndarray:
    """One ``heapq`` of integer keys; one pop or replace per touch."""
    grad, copyto, subtract = problem.grad, np.copyto, np.subtract
    w = problem.initial()
    local = [np.empty_like(w) for _ in range(threads)]
    loaded = [np.empty_like(w) for _ in range(threads)]
    step = [w] * threads  # (each replaced by its lr·g before the store reads it)
    phase, sample, todo = [0] * threads, [0] * threads, [iter(d) for d in durations]
    now: list[tuple[int, int, int]] = [(0, 0, 0)] * threads
    rows: list[tuple[int, int, int]] = []
    heap, started, n = [], 0, len(samples)
    for thread in range(min(threads, n)):
        now[thread], sample[thread] = next(todo[thread]), samples[started]
        started += 1
        heap.append((now[thread][0] << _SHIFT) | thread)
    heapq.heapify(heap)
    mask = (1 << _SHIFT) - 1
    while heap:
        key = heap[0]
        thread = key & mask
        if phase[thread] == 0:
            copyto(local[thread], w)
            phase[thread] = 1
            heapq.heapreplace(heap, key + (now[thread][1] << _SHIFT))
        elif phase[thread] == 1:
            g, _ = grad(local[thread], sample[thread])
            g *= LR
            step[thread] = g
            copyto(loaded[thread], w)
            phase[thread] = 2
            heapq.heapreplace(heap, key + (now[thread][2] << _SHIFT))
        else:
            subtract(loaded[thread], step[thread], out=w)
            if record:
                rows.append((started, thread, key >> _SHIFT))
            if started < n:
                now[thread], sample[thread] = next(todo[thread]), samples[started]
                started += 1
                phase[thread] = 0
                heapq.heapreplace(heap, key + (now[thread][0] << _SHIFT))
            else:
                heapq.heappop(heap)
    return w


def simpy_loop(problem: Problem, samples: list[int], threads: int,
               durations: list[list[tuple[int, int, int]]]) -> np.ndarray:
    """The same loop with one simpy timeout per touch."""
    env, w = simpy.Environment(), problem.initial()
    state = {"started": 0}

    def thread(index: int):
        local, loaded = np.empty_like(w), np.empty_like(w)
        todo = iter(durations[index])
        while state["started"] < len(samples):
            z = samples[state["started"]]
            state["started"] += 1
            read, grad_ns, write = next(todo)
            yield env.timeout(read)
            np.copyto(local, w)
            yield env.timeout(grad_ns)
            g, _ = problem.grad(local, z)
            g *= LR
            np.copyto(loaded, w)
            yield env.timeout(write)
            np.subtract(loaded, g, out=w)

    for index in range(threads):
        env.process(thread(index))
    env.run()
    return w


def lazy_loop(problem: Problem, samples: list[int], threads: int,
              durations: list[list[tuple[int, int, int]]]) -> np.ndarray:
    """The same semantics with one simpy timeout per update, to its store: the copy and the
    load are not events but captures kept in a heap (by the heap loop's keys) and taken,
    in key order, just before the first store whose key comes after theirs (w does not
    change between stores, so each sees the vector it would have seen at its time)."""
    env, w = simpy.Environment(), problem.initial()
    grad, copyto, subtract = problem.grad, np.copyto, np.subtract
    push, pop = heapq.heappush, heapq.heappop
    local = [np.empty_like(w) for _ in range(threads)]
    loaded = [np.empty_like(w) for _ in range(threads)]
    into = (local, loaded)
    pending: list[tuple[int, int]] = []  # (key, 0 copy | 1 load) not taken yet
    mask, n = (1 << _SHIFT) - 1, len(samples)
    state = {"started": 0}

    def thread(index: int):
        todo, now = iter(durations[index]), 0
        while state["started"] < n:
            z = samples[state["started"]]
            state["started"] += 1
            read, grad_ns, write = next(todo)
            push(pending, (((now + read) << _SHIFT) | index, 0))
            push(pending, (((now + read + grad_ns) << _SHIFT) | index, 1))
            yield env.timeout(read + grad_ns + write)
            now += read + grad_ns + write
            key = (now << _SHIFT) | index
            while pending and pending[0][0] < key:
                taken, kind = pop(pending)
                copyto(into[kind][taken & mask], w)
            g, _ = grad(local[index], z)
            g *= LR
            subtract(loaded[index], g, out=w)

    for index in range(threads):
        env.process(thread(index))
    env.run()
    return w


def _tie_free(durations: list[list[tuple[int, int, int]]]) -> list[list[tuple[int, int, int]]]:
    """``durations`` times 16, thread i's first read i ns longer: no two threads ever act at
    the same nanosecond, where simpy's order (first scheduled) and the heap's (lower thread)
    would differ."""
    spread = [[tuple(16 * ns for ns in row) for row in per] for per in durations]
    for index, per in enumerate(spread):
        read, grad_ns, write = per[0]
        per[0] = (read + index, grad_ns, write)
    return spread


def _scheduled(problem: Problem, samples: list[int], threads: int, seed: int,
               env: simpy.Environment | None = None) -> np.ndarray:
    """One controlled run: at each step a uniform draw picks one of the threads that can act,
    which does its next action (copy, gradient, load, store); with ``env``, each step is a
    simpy event the chosen thread waits for."""
    w = problem.initial()
    local = [np.empty_like(w) for _ in range(threads)]
    loaded = [np.empty_like(w) for _ in range(threads)]
    step = [w] * threads  # (each replaced by its lr·g before the store reads it)
    phase, sample = [0] * threads, [0] * threads
    rng = np.random.default_rng([seed, 0x5C4ED])
    uniforms: list[float] = []
    started, n = 0, len(samples)
    waiting: dict[int, simpy.Event] = {}

    def act(thread: int) -> None:
        """The thread's next action."""
        nonlocal w, started
        if phase[thread] == 0:
            sample[thread] = samples[started]
            started += 1
            copyto(local[thread], w)
        elif phase[thread] == 1:
            g, _ = problem.grad(local[thread], sample[thread])
            g *= LR
            step[thread] = g
        elif phase[thread] == 2:
            copyto(loaded[thread], w)
        else:
            subtract(loaded[thread], step[thread], out=w)
        phase[thread] = (phase[thread] + 1) % 4

    def ready() -> list[int]:
        return [t for t in range(threads) if phase[t] or started < n]

    copyto, subtract = np.copyto, np.subtract
    if env is None:
        while runnable := ready():
            if not uniforms:
                uniforms = rng.random(32).tolist()[::-1]
            act(runnable[int(uniforms.pop() * len(runnable))])
        return w

    def worker(thread: int):
        while True:
            waiting[thread] = event = env.event()
            yield event
            act(thread)

    def scheduler():
        nonlocal uniforms
        while runnable := ready():
            if not uniforms:
                uniforms = rng.random(32).tolist()[::-1]
            waiting.pop(runnable[int(uniforms.pop() * len(runnable))]).succeed()
            yield env.timeout(1)

    for thread in range(threads):
        env.process(worker(thread))
    env.process(scheduler())
    env.run()
    return w


def schedules(repeats: int, runs: int) -> None:
    """Controlled runs per second: the plain loop, on simpy, and ``explore`` (the engine)."""
    from simulator.schedule import explore

    scenario = load_scenario(None, ["problem.dim=4", "problem.n_samples=20", "run.blocks=1",
                                    "metrics.curve_points=0", "run.threads=2",
                                    "run.updates=2"])
    problem = make_problem(scenario.problem)
    problem.optimum()
    samples = [3, 11]
    one = bare(problem, samples)
    assert _scheduled(problem, samples, 1, 0).tobytes() == one.tobytes()
    assert _scheduled(problem, samples, 1, 0, simpy.Environment()).tobytes() == one.tobytes()
    assert all(_scheduled(problem, samples, 2, seed).tobytes()
               == _scheduled(problem, samples, 2, seed, simpy.Environment()).tobytes()
               for seed in range(20))
    cases = {
        "plain Python loop, one choice per step": lambda: [
            _scheduled(problem, samples, 2, seed) for seed in range(runs)],
        "the same, one simpy event per step": lambda: [
            _scheduled(problem, samples, 2, seed, simpy.Environment())
            for seed in range(runs)],
        "explore (the engine's loop, records, trace, objective)": lambda: explore(
            scenario, "random", runs, "lost_blocks"),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(repeats):
        for name in (list(cases) if repeat % 2 == 0 else list(cases)[::-1]):
            started = time.perf_counter()
            cases[name]()
            times[name].append((time.perf_counter() - started) / runs)
    print(f"\nControlled schedules: k = 2, T = 2, d = 4, B = 1, {runs:,} runs, min of {repeats}")
    print("| loop | schedules/s | cost / the plain loop |")
    print("|---|---:|---:|")
    base = min(times["plain Python loop, one choice per step"])
    for name, spent in times.items():
        print(f"| {name} | {1 / min(spent):,.0f} | {min(spent) / base:.1f} |")


def bare(problem: Problem, samples: list[int]) -> np.ndarray:
    w = problem.initial()
    for z in samples:
        g, _ = problem.grad(w, z)
        w -= LR * g
    return w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, 2,000 updates")
    parser.add_argument("--dim", type=int, default=100,
                        help="the problem's dimension (other than 100: no schedules table)")
    parser.add_argument("--updates", type=int, help="default 20,000 (--quick: 2,000)")
    args = parser.parse_args()
    repeats, threads = (3, 8) if args.quick else (5, 8)
    updates = args.updates or (2_000 if args.quick else 20_000)
    scenario = load_scenario(None, [f"problem.dim={args.dim}", f"run.threads={threads}",
                                    f"run.updates={updates}", "metrics.exact=false",
                                    "metrics.curve_points=0"])
    problem = make_problem(scenario.problem)
    problem.optimum()
    samples = np.random.default_rng(0).integers(0, problem.n_samples, updates).tolist()
    durations = _durations(threads, updates)
    # A check before the timings: one thread is plain SGD, bit for bit.
    one = _durations(1, updates)
    assert heap_loop(problem, samples, 1, one).tobytes() == bare(problem, samples).tobytes()
    assert simpy_loop(problem, samples, 1, one).tobytes() == bare(problem, samples).tobytes()
    assert lazy_loop(problem, samples, 1, one).tobytes() == bare(problem, samples).tobytes()
    # At k threads, acting at distinct times, the three loops give the same vector.
    spread = _tie_free(durations)
    heap = heap_loop(problem, samples, threads, spread).tobytes()
    assert simpy_loop(problem, samples, threads, spread).tobytes() == heap
    assert lazy_loop(problem, samples, threads, spread).tobytes() == heap
    cases = {
        "bare SGD loop": lambda: bare(problem, samples),
        "heapq, one pop or replace per touch": lambda: heap_loop(problem, samples, threads,
                                                                 durations),
        "the same, one record per update": lambda: heap_loop(problem, samples, threads,
                                                             durations, record=True),
        "the same loop, one simpy timeout per touch": lambda: simpy_loop(
            problem, samples, threads, durations),
        "one simpy timeout per update, copies and loads taken at the next store": lambda:
            lazy_loop(problem, samples, threads, durations),
        "the engine": lambda: Engine(scenario, problem).run(),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(repeats):  # alternating, the order reversed every other repeat
        for name in (list(cases) if repeat % 2 == 0 else list(cases)[::-1]):
            started = time.perf_counter()
            cases[name]()
            times[name].append((time.perf_counter() - started) / updates)
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, Python "
          f"{platform.python_version()}, numpy {np.__version__}, simpy {simpy.__version__}; "
          f"d = {problem.dim}, k = {threads}, B = 1, {updates:,} updates, min of {repeats}")
    base = min(times["bare SGD loop"])
    print("| loop | µs/update | ratio to the bare loop |")
    print("|---|---:|---:|")
    for name, spent in times.items():
        print(f"| {name} | {min(spent) * 1e6:.2f} | {min(spent) / base:.2f} |")
    if args.dim == 100:
        schedules(repeats, 300 if args.quick else 3_000)


if __name__ == "__main__":
    main()
