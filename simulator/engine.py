"""The discrete-event engine: virtual threads read, compute and write a shared vector.

Time is integer nanoseconds on a simpy clock. Each thread loops (DESIGN §3): draw a sample;
READ the blocks the sample needs, each copied when its read ends (so a read can be torn);
compute the GRADIENT at the local copy; WRITE block by block. ``load_store`` loads a block,
waits, and stores ``loaded − lr·g`` (overwriting any store that landed in between);
``atomic_add`` adds ``−lr·g`` atomically. The engine owns the loop and the clock; a protocol
(``simulator.protocols``) owns only what differs, such as holding a lock around the update.

Every action's duration goes through :meth:`Engine._advance`, the one place where time
passes: cores and the memory bus are simpy resources acquired there, so the order of atomic
actions (block read, gradient, block load, block store) is decided in one place. Durations and
samples come from a ``DurationSource``: seeded draws, or a recorded trace (replay).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.errors import ScenarioError
from simulator.memory import BlockCopy, Op, SharedMemory, block_ops
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.scenario import Scenario, scenario_to_toml
from simulator.timing import DurationSource, SampledSource
from simulator.trace import COLUMNS, Trace
from simulator.view import SerializedView

__all__ = ["Engine", "Update", "simulate"]

_TRIM_EVERY = 2048
_PROGRESS_EVERY = 256


class Update:
    """One update in flight: its sample, the blocks it moves and what happened to it."""

    __slots__ = ("grad_end", "grad_ns", "grad_start", "ops", "overwrote", "read_end",
                 "read_ns", "read_overwrites", "read_start", "sample", "seq",
                 "start_completed", "start_versions", "thread", "torn", "uid",
                 "write_end", "write_ns", "write_start")

    read_ns: list[int]
    grad_ns: int
    write_ns: list[int]
    read_start: int
    read_end: int
    grad_start: int
    grad_end: int
    write_start: int
    write_end: int
    start_completed: int
    read_overwrites: int
    torn: bool

    def __init__(self, uid: int, thread: int, seq: int, sample: int, ops: list[Op]) -> None:
        self.uid, self.thread, self.seq, self.sample, self.ops = uid, thread, seq, sample, ops
        self.start_versions: list[int] = []
        self.overwrote = 0


class Engine:
    """Runs one scenario to completion and returns its trace.

    Raises:
        ScenarioError: a value that only the built problem can check (``run.blocks`` > dim).
    """

    def __init__(self, scenario: Scenario, problem: Problem | None = None,
                 source: DurationSource | None = None, lookahead: bool = True) -> None:
        self.scenario = scenario
        self.problem = problem if problem is not None else make_problem(scenario.problem)
        run = scenario.run
        if run.blocks > self.problem.dim:
            raise ScenarioError("run.blocks", run.blocks,
                                f"must be <= the problem's dimension ({self.problem.dim})")
        self.env = simpy.Environment()
        self.protocol = make_protocol(run.protocol)
        self.threads = self.protocol.threads(run)
        self.lr, self.updates = run.lr, run.updates
        self.atomic = run.write_mode == "atomic_add"
        w0 = self.problem.initial()
        self.mem = SharedMemory(w0, run.blocks, track_coords=self.problem.sparse)
        self._dense_ops, self._dense_fractions = self._block_ops(None)
        self._dense_blocks = [op[0] for op in self._dense_ops]
        self._sparse = self.problem.sparse
        self.source = source if source is not None else SampledSource(
            scenario, self.threads, self.problem.n_samples, self._dense_fractions)
        metrics = scenario.metrics
        self.view = SerializedView(self.problem, self.lr, w0, run.updates, metrics.exact,
                                   metrics.every, metrics.curve_points)
        self._cores, self._bus = self._resources()
        self._free = [lookahead and core is None and bus is None
                      for core, bus in zip(self._cores, self._bus, strict=True)]
        self.started = self.completed = 0
        self.clock = [0] * self.threads
        self.lookahead = lookahead
        self.active: dict[int, Update] = {}
        self.lost = [0] * run.updates  # stores of each update (by uid) that were overwritten
        self._rows: list[tuple[Any, ...]] = []
        self._op_counts: list[int] = []
        self._op_blocks: list[int] = []
        self._op_read_ns: list[int] = []
        self._op_write_ns: list[int] = []
        self.progress: Callable[[int], object] | None = None
        self.protocol.setup(self)

    # -- setup -------------------------------------------------------------------------------

    def _block_ops(self, support: np.ndarray | None) -> tuple[list[Op], list[float]]:
        """The blocks a sample moves, and the fraction of all coordinates each moves."""
        ops = block_ops(self.mem.bounds, support)
        dim = self.problem.dim
        return ops, [(op[2].stop - op[2].start) / dim for op in ops]

    def _resources(self) -> tuple[list[simpy.Resource | None], list[simpy.Resource | None]]:
        """Per thread: its device's core pool (when threads outnumber cores) and bus."""
        scenario = self.scenario
        per_device = [0] * len(scenario.devices)
        for thread in range(self.threads):
            per_device[scenario.device_of(thread)] += 1
        pools = [simpy.Resource(self.env, d.cores) if 0 < d.cores < n else None
                 for d, n in zip(scenario.devices, per_device, strict=True)]
        buses = [simpy.Resource(self.env, d.bus) if d.bus > 0 else None
                 for d in scenario.devices]
        devices = [scenario.device_of(t) for t in range(self.threads)]
        return [pools[d] for d in devices], [buses[d] for d in devices]

    # -- the clock ---------------------------------------------------------------------------
    # Each thread keeps its own clock, which may run ahead of simpy's: an action that ends
    # strictly before the next scheduled event (``env.peek()``) cannot be interleaved with
    # anything, so it is applied at once, exactly as if its timeout had fired. Threads that
    # wait for cores or a bus, and protocol gates, always go through simpy.

    def _advance(self, thread: int, duration: int, transfer: bool) -> simpy.Event | None:
        """Spend ``duration`` ns on one action; the event to wait for, or ``None`` if the
        action completes without anything else happening first."""
        core = self._cores[thread]
        bus = self._bus[thread] if transfer else None
        env, end = self.env, self.clock[thread] + duration
        if core is not None or bus is not None:
            return env.process(self._held(self.clock[thread] - int(env.now), duration, core,
                                           bus))
        self.clock[thread] = end
        if self.lookahead and end < env.peek():
            return None
        return env.timeout(end - env.now)

    def _uninterrupted(self, thread: int, durations: list[int], start: int) -> int:
        """End of the longest run of block actions from ``start`` that all end before the next
        scheduled event (so nothing can come between them); the thread's clock moves to the
        run's end. Returns ``start`` when the thread waits on resources or lookahead is off."""
        if not self._free[thread]:
            return start
        horizon, end, stop = self.env.peek(), self.clock[thread], start
        for duration in durations[start:]:
            if end + duration >= horizon:
                break
            end += duration
            stop += 1
        self.clock[thread] = end
        return stop

    def _held(self, lag: int, duration: int,
              *pools: simpy.Resource | None) -> Generator[Any, Any, None]:
        """Catch up with the thread's clock, take core/bus places, hold them ``duration``."""
        if lag:
            yield self.env.timeout(lag)
        requests = [(pool, pool.request()) for pool in pools if pool is not None]
        for _, request in requests:
            yield request
        yield self.env.timeout(duration)
        for pool, request in requests:
            pool.release(request)

    def _sync(self, thread: int) -> simpy.Event | None:
        """Bring simpy's clock up to the thread's (before touching shared simpy state)."""
        lag = self.clock[thread] - int(self.env.now)
        return self.env.timeout(lag) if lag else None

    # -- the loop: read, compute, write, with the protocol's gates ---------------------------

    def _thread(self, thread: int) -> Generator[Any, Any, None]:
        local = np.zeros(self.problem.dim)
        mem, protocol, clock, seq = self.mem, self.protocol, self.clock, 0
        while self.started < self.updates and self.source.remaining(thread) != 0:
            u = self._begin(thread, seq)
            seq += 1
            if protocol.gated:
                wait = self._sync(thread)
                if wait is not None:
                    yield wait
                yield protocol.acquire(self, u)
                clock[thread] = int(self.env.now)
            # READ: each block is copied when its read ends.
            u.read_start, u.start_completed = clock[thread], self.completed
            u.start_versions = [mem.count[op[0]] for op in u.ops]
            copies: list[BlockCopy] = []
            ops, n, i = u.ops, len(u.ops), 0
            while i < n:
                run = self._uninterrupted(thread, u.read_ns, i) if n > 1 else i
                if run > i:
                    copies.extend(mem.copy_run(ops[i:run], local))
                    i = run
                    continue
                block, index, _, coords = ops[i]
                wait = self._advance(thread, u.read_ns[i], True)
                if wait is not None:
                    yield wait
                    clock[thread] = int(self.env.now)
                copies.append(mem.copy(block, index, coords, local))
                i += 1
            u.read_end = clock[thread]
            u.read_overwrites, u.torn = mem.read_report(copies, u.start_versions)
            # GRADIENT: the real gradient at the local copy, holding the device.
            u.grad_start = clock[thread]
            wait = self._advance(thread, u.grad_ns, False)
            if wait is not None:
                yield wait
                clock[thread] = int(self.env.now)
            step, _ = self.problem.grad(local, u.sample)
            step *= self.lr  # grad returns a new array
            u.grad_end = u.write_start = clock[thread]
            # WRITE: block by block, an atomic add or a load, wait, store.
            i = 0
            while i < n:
                run = self._uninterrupted(thread, u.write_ns, i) if n > 1 else i
                if run > i:
                    mem.write_run(ops[i:run], step, u.uid, self.atomic)
                    i = run
                    continue
                block, index, vsel, coords = ops[i]
                loaded_at, loaded = mem.count[block], None if self.atomic else mem.load(index)
                wait = self._advance(thread, u.write_ns[i], True)
                if wait is not None:
                    yield wait
                    clock[thread] = int(self.env.now)
                i += 1
                if loaded is None:
                    mem.add(block, index, coords, -step[vsel], u.uid)
                    continue
                lost = mem.store(block, index, coords, loaded, step[vsel], u.uid, loaded_at)
                for victim in lost:
                    self.lost[victim] += 1
                u.overwrote += len(lost)
            u.write_end = clock[thread]
            self._complete(u)
            if protocol.gated:
                wait = self._sync(thread)
                if wait is not None:
                    yield wait
                protocol.release(self, u)

    def _begin(self, thread: int, seq: int) -> Update:
        sample = self.source.next_sample(thread)
        if self._sparse:
            ops, fractions = self._block_ops(self.problem.support(sample))
        else:
            ops, fractions = self._dense_ops, self._dense_fractions
        u = Update(self.started, thread, seq, sample, ops)
        u.read_ns, u.grad_ns, u.write_ns = self.source.durations(thread, fractions)
        self.started += 1
        self.active[thread] = u
        return u

    def _complete(self, u: Update) -> None:
        staleness = self.completed - u.start_completed
        self.completed += 1
        t = self.completed
        m = self.view.complete(t, self.mem.w, u.sample, u.write_end)
        self._rows.append((u.uid, u.thread, u.seq, u.sample, u.read_start, u.read_end,
                           u.grad_start, u.grad_end, u.write_start, u.write_end, u.grad_ns,
                           staleness, u.read_overwrites, u.torn, 0, u.overwrote, *m))
        self._op_counts.append(len(u.ops))
        self._op_blocks.extend(self._dense_blocks if u.ops is self._dense_ops
                               else [op[0] for op in u.ops])
        self._op_read_ns.extend(u.read_ns)
        self._op_write_ns.extend(u.write_ns)
        del self.active[u.thread]
        if t % _TRIM_EVERY == 0:
            self._trim()
        if self.progress is not None and t % _PROGRESS_EVERY == 0:
            self.progress(_PROGRESS_EVERY)

    def _trim(self) -> None:
        keep = list(self.mem.count)
        for u in self.active.values():
            for op, version in zip(u.ops, u.start_versions, strict=False):
                keep[op[0]] = min(keep[op[0]], version)
        self.mem.trim(keep)

    def run(self) -> Trace:
        """Run every thread until T updates have completed; return the trace."""
        for thread in range(self.threads):
            self.env.process(self._thread(thread))
        self.env.run()
        if self.progress is not None:
            self.progress(self.completed % _PROGRESS_EVERY)
        return self._trace()

    def _trace(self) -> Trace:
        names = list(COLUMNS)
        columns = list(zip(*self._rows, strict=True))
        arrays: dict[str, np.ndarray] = {name: np.asarray(col, dtype=COLUMNS[name])
                  for name, col in zip(names, columns, strict=True)}
        arrays["lost_blocks"] = np.asarray(self.lost, dtype=np.int32)[arrays["uid"]]
        arrays.update(
            op_offsets=np.concatenate([[0], np.cumsum(self._op_counts)]).astype(np.int64),
            op_block=np.asarray(self._op_blocks, dtype=np.int32),
            op_read_ns=np.asarray(self._op_read_ns, dtype=np.int64),
            op_write_ns=np.asarray(self._op_write_ns, dtype=np.int64),
            w0=self.problem.initial(), w_final=self.mem.w.copy())
        curve = list(zip(*self.view.curve, strict=True))
        arrays.update(curve_t=np.asarray(curve[0], dtype=np.int64),
                      curve_time=np.asarray(curve[1], dtype=np.int64),
                      curve_loss=np.asarray(curve[2], dtype=np.float64),
                      curve_dist2=np.asarray(curve[3], dtype=np.float64))
        return Trace(arrays, scenario_to_toml(self.scenario))


def simulate(scenario: Scenario, problem: Problem | None = None,
             source: DurationSource | None = None, lookahead: bool = True) -> Trace:
    """Run ``scenario`` (optionally on a prebuilt problem or a replay source).

    ``lookahead=False`` sends every action through simpy; the result is identical (tested),
    only slower.
    """
    return Engine(scenario, problem, source, lookahead).run()
