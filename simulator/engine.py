"""The discrete-event engine: virtual threads read, compute and write a shared vector.

Time is integer nanoseconds on a simpy clock. Each thread loops (DESIGN §3): draw a sample;
READ the blocks the sample needs, each copied when its read ends (so a read can be torn);
compute the GRADIENT at the local copy; WRITE block by block. ``load_store`` loads a block,
waits, and stores ``loaded − lr·g`` (overwriting any store that landed in between);
``atomic_add`` adds ``−lr·g`` atomically. The engine owns the loop and the clock; a protocol
(``simulator.protocols``) owns only what differs, such as holding a lock around the update.

Every wait goes through :meth:`Engine.hold`, the one place where time passes: cores and the
memory bus are simpy resources acquired there, so the order of atomic actions (block read,
gradient, block load, block store) is decided in one place. Durations and samples come from a
``DurationSource``: seeded draws, or a recorded trace (replay).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.errors import ScenarioError
from simulator.memory import BlockCopy, SharedMemory
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
                 "start_completed", "start_versions", "step", "thread", "torn", "uid",
                 "write_end", "write_ns", "write_start")

    def __init__(self, uid: int, thread: int, seq: int, sample: int, ops: list[Op]) -> None:
        self.uid, self.thread, self.seq, self.sample, self.ops = uid, thread, seq, sample, ops
        self.start_versions: list[int] = []
        self.overwrote = 0
        self.step: np.ndarray = np.empty(0)


# One block an update moves: block id, index into w, index into the gradient values, and the
# coordinates (None: the whole block, for dense gradients).
Op = tuple[int, Any, slice, np.ndarray | None]


class Engine:
    """Runs one scenario to completion and returns its trace.

    Raises:
        ScenarioError: a value that only the built problem can check (``run.blocks`` > dim).
    """

    def __init__(self, scenario: Scenario, problem: Problem | None = None,
                 source: DurationSource | None = None) -> None:
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
        w0 = np.zeros(self.problem.dim)
        self.mem = SharedMemory(w0, run.blocks, track_coords=self.problem.sparse)
        self.source = source if source is not None else SampledSource(
            scenario, self.threads, self.problem.n_samples)
        metrics = scenario.metrics
        self.view = SerializedView(self.problem, self.lr, w0, run.updates, metrics.exact,
                                   metrics.every, metrics.curve_points)
        self._dense_ops, self._dense_fractions = self._block_ops(None)
        self._cores, self._bus = self._resources()
        self.started = self.completed = 0
        self.active: dict[int, Update] = {}
        self.lost = np.zeros(run.updates, dtype=np.int32)
        self._rows: list[tuple[Any, ...]] = []
        self._op_rows: list[tuple[int, int, int]] = []
        self._op_counts: list[int] = []
        self.progress: Callable[[int], object] | None = None
        self.protocol.setup(self)

    # -- setup -------------------------------------------------------------------------------

    def _block_ops(self, support: np.ndarray | None) -> tuple[list[Op], list[float]]:
        bounds, dim = self.mem.bounds, self.problem.dim
        if support is None:
            return ([(b, slice(lo, hi), slice(lo, hi), None)
                     for b, (lo, hi) in enumerate(itertools.pairwise(bounds))],
                    [(hi - lo) / dim for lo, hi in itertools.pairwise(bounds)])
        cuts = np.searchsorted(support, bounds).tolist()
        ops: list[Op] = []
        for b, (p0, p1) in enumerate(itertools.pairwise(cuts)):
            if p1 > p0:
                coords = support[p0:p1]
                ops.append((b, coords, slice(p0, p1), coords))
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

    def hold(self, thread: int, duration: int, transfer: bool) -> simpy.Event:
        """The event that fires when ``thread`` has spent ``duration`` ns on one action.

        The action holds a core of the thread's device (when cores are scarce) and, for a
        block transfer, a place on the device's memory bus (when it has one).
        """
        core, bus = self._cores[thread], self._bus[thread] if transfer else None
        if core is None and bus is None:
            return self.env.timeout(duration)
        return self.env.process(self._held(duration, core, bus))

    def _held(self, duration: int, *pools: simpy.Resource | None) -> Generator[Any, Any, None]:
        requests = [pool.request() for pool in pools if pool is not None]
        for request in requests:
            yield request
        yield self.env.timeout(duration)
        for request, pool in zip(requests, [p for p in pools if p is not None], strict=True):
            pool.release(request)

    # -- the three phases of an update (protocols compose these) -----------------------------

    def read(self, u: Update, local: np.ndarray) -> Generator[Any, Any, None]:
        """READ: copy each block the sample needs when its read ends."""
        u.read_start, u.start_completed = self.env.now, self.completed
        mem = self.mem
        u.start_versions = [mem.version(op[0]) for op in u.ops]
        copies: list[BlockCopy] = []
        for (block, index, _, coords), duration in zip(u.ops, u.read_ns, strict=True):
            yield self.hold(u.thread, duration, True)
            copies.append(mem.copy(block, index, coords, local))
        u.read_end = self.env.now
        u.read_overwrites = sum(mem.changed(c, v) for c, v in
                                zip(copies, u.start_versions, strict=True))
        u.torn = mem.torn(copies)

    def compute(self, u: Update, local: np.ndarray) -> Generator[Any, Any, None]:
        """GRADIENT: the real gradient at the local copy; holds the device for its duration."""
        u.grad_start = self.env.now
        yield self.hold(u.thread, u.grad_ns, False)
        values, _ = self.problem.grad(local, u.sample)
        u.step = self.lr * values
        u.grad_end = self.env.now

    def write(self, u: Update) -> Generator[Any, Any, None]:
        """WRITE: block by block, as a read-modify-write or an atomic add."""
        u.write_start = self.env.now
        mem, step = self.mem, u.step
        for (block, index, vsel, coords), duration in zip(u.ops, u.write_ns, strict=True):
            if self.atomic:
                yield self.hold(u.thread, duration, True)
                mem.add(block, index, coords, -step[vsel], u.uid)
                continue
            loaded_at, loaded = mem.version(block), mem.load(index)
            yield self.hold(u.thread, duration, True)
            lost = mem.store(block, index, coords, loaded - step[vsel], u.uid, loaded_at)
            for victim in lost:
                self.lost[victim] += 1
            u.overwrote += len(lost)
        u.write_end = self.env.now
        self._complete(u)

    # -- the loop ----------------------------------------------------------------------------

    def _thread(self, thread: int) -> Generator[Any, Any, None]:
        local = np.zeros(self.problem.dim)
        seq = 0
        while self.started < self.updates:
            u = self._begin(thread, seq)
            seq += 1
            yield from self.protocol.update(self, u, local)

    def _begin(self, thread: int, seq: int) -> Update:
        sample = self.source.next_sample(thread)
        if self.problem.sparse:
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
        m = self.view.complete(t, self.mem.w, u.sample, self.env.now)
        self._rows.append((u.uid, u.thread, u.seq, u.sample, u.read_start, u.read_end,
                           u.grad_start, u.grad_end, u.write_start, u.write_end, u.grad_ns,
                           staleness, u.read_overwrites, u.torn, 0, u.overwrote, *m))
        self._op_counts.append(len(u.ops))
        self._op_rows.extend(zip([op[0] for op in u.ops], u.read_ns, u.write_ns, strict=True))
        del self.active[u.thread]
        if t % _TRIM_EVERY == 0:
            self._trim()
        if self.progress is not None and t % _PROGRESS_EVERY == 0:
            self.progress(_PROGRESS_EVERY)

    def _trim(self) -> None:
        keep = [self.mem.version(b) for b in range(len(self.mem.bounds) - 1)]
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
        arrays = {name: np.asarray(col, dtype=COLUMNS[name])
                  for name, col in zip(names, columns, strict=True)}
        arrays["lost_blocks"] = self.lost[arrays["uid"]]
        ops = list(zip(*self._op_rows, strict=True)) or [(), (), ()]
        arrays.update(
            op_offsets=np.concatenate([[0], np.cumsum(self._op_counts)]).astype(np.int64),
            op_block=np.asarray(ops[0], dtype=np.int32),
            op_read_ns=np.asarray(ops[1], dtype=np.int64),
            op_write_ns=np.asarray(ops[2], dtype=np.int64),
            w0=np.zeros(self.problem.dim), w_final=self.mem.w.copy())
        curve = list(zip(*self.view.curve, strict=True))
        arrays.update(curve_t=np.asarray(curve[0], dtype=np.int64),
                      curve_time=np.asarray(curve[1], dtype=np.int64),
                      curve_loss=np.asarray(curve[2], dtype=np.float64))
        return Trace(arrays, scenario_to_toml(self.scenario))


def simulate(scenario: Scenario, problem: Problem | None = None,
             source: DurationSource | None = None) -> Trace:
    """Run ``scenario`` (optionally on a prebuilt problem or a replay source)."""
    return Engine(scenario, problem, source).run()
