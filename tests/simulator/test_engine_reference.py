"""A second implementation of the lock-free loop: a hand-written heap of events, no simpy, no
engine code. Given the same samples and durations it must end on the engine's vector bit for
bit and count the same staleness (DESIGN §3: read, gradient, load_store write; one block)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from simulator.engine import Engine
from simulator.problems import make_problem
from tests.conftest import scenario

_SHIFT = 8  # heap keys: time << _SHIFT | thread (durations below are tie-free anyway)


def _durations(threads: int, updates: int, seed: int) -> list[list[tuple[int, int, int]]]:
    """Per thread, (read, gradient, write) ns for each update it could run: multiples of the
    thread count, so with each thread's start offset by its index no two events ever tie."""
    rng = np.random.default_rng(seed)
    drawn = rng.lognormal(np.log(200), 0.6, size=(threads, updates, 3))
    return [[tuple(int(x) * threads for x in row) for row in per] for per in drawn.round()]


def _reference(problem, samples, lr, threads, durations):
    """The heap loop: a thread's read copies w at its end, its gradient ends with the load of
    w, its store writes loaded − lr·g (overwriting stores in between). Returns w_T and the
    staleness of each update by uid."""
    w = problem.initial()
    local = [np.empty_like(w) for _ in range(threads)]
    loaded = [np.empty_like(w) for _ in range(threads)]
    state = [None] * threads  # (uid, sample, step, completions at read start)
    drawn = [iter(per) for per in durations]
    phase, todo = [0] * threads, [None] * threads
    heap, started, completed, staleness = [], 0, 0, {}

    def begin(thread, start):
        nonlocal started
        todo[thread] = next(drawn[thread])
        state[thread] = [started, samples[started], None, completed]
        started += 1
        phase[thread] = 0
        heapq.heappush(heap, ((start + todo[thread][0]) << _SHIFT) | thread)

    for thread in range(min(threads, len(samples))):
        begin(thread, thread)
    while heap:
        key = heapq.heappop(heap)
        thread, t = key & ((1 << _SHIFT) - 1), key >> _SHIFT
        uid, sample, _, seen = state[thread]
        if phase[thread] == 0:  # the read ends: copy
            np.copyto(local[thread], w)
            phase[thread], nxt = 1, t + todo[thread][1]
        elif phase[thread] == 1:  # the gradient ends; the write starts: load
            g, _ = problem.grad(local[thread], sample)
            state[thread][2] = g * lr
            np.copyto(loaded[thread], w)
            phase[thread], nxt = 2, t + todo[thread][2]
        else:  # the write ends: store, one completion
            np.subtract(loaded[thread], state[thread][2], out=w)
            completed += 1
            staleness[uid] = completed - 1 - seen
            if started < len(samples):
                begin(thread, t)
            continue
        heapq.heappush(heap, (nxt << _SHIFT) | thread)
    return w, [staleness[uid] for uid in range(len(samples))]


class _Given:
    """The engine's duration source: the same samples (by start order) and durations; each
    thread's first update waits its index in ns (the reference's offsets)."""

    def __init__(self, samples, durations):
        self.samples, self.drawn = samples, [iter(per) for per in durations]
        self.next, self.first = 0, [True] * len(durations)

    def next_sample(self, thread):
        self.next += 1
        return self.samples[self.next - 1]

    def remaining(self, thread):
        return None

    def durations(self, thread, fractions):
        read, grad, write = next(self.drawn[thread])
        return [read], grad, [write]

    def idle(self, thread):
        first, self.first[thread] = self.first[thread], False
        return thread if first else 0

    def coupled(self, thread):
        return False

    def slowness(self, thread, t):
        return 1.0

    def place(self, thread, core):
        pass

    def at(self, thread, phase, t):
        raise AssertionError("no durations drawn at a phase's start")

    def done(self, thread):
        pass


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_the_engine_and_a_heap_loop_written_apart_agree_bit_for_bit(threads):
    updates = 400
    s = scenario("problem.dim=20", f"run.threads={threads}", f"run.updates={updates}",
                 "run.lr=0.05", "metrics.curve_points=0")
    problem = make_problem(s.problem)
    samples = np.random.default_rng(3).integers(0, problem.n_samples, updates).tolist()
    durations = _durations(threads, updates, seed=threads)
    w_ref, staleness_ref = _reference(problem, samples, 0.05, threads, durations)
    engine = Engine(s, problem, source=_Given(samples, durations))
    trace = engine.run()
    np.testing.assert_array_equal(trace["w_final"], w_ref)
    order = np.argsort(trace["uid"])
    assert trace["staleness"][order].tolist() == staleness_ref
    if threads > 1:  # the runs really overlapped: stale reads and lost stores happened
        assert max(staleness_ref) > 0 and trace["lost_blocks"].sum() > 0
