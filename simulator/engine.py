"""The discrete-event engine: virtual threads read, compute and write a shared vector.

Time is integer nanoseconds on a simpy clock. Each thread loops (DESIGN §3): draw a sample;
READ the blocks the sample needs, each copied when its read ends (so a read can be torn);
compute the GRADIENT at the local copy; WRITE block by block. ``load_store`` loads a block,
waits, and stores ``loaded − lr·g`` (overwriting any store that landed in between);
``atomic_add`` adds ``−lr·g`` atomically; with write convoys (``timing.convoy_*``) writes
of one block that meet end together and lose some coordinates' stores, and with passing
writes (``convoy_lost_*`` alone) they keep their own ends and lose only such coordinates,
each landing whole at its end less what it lost. The engine owns the
loop and the clock; a protocol (``simulator.protocols``) owns only what differs, such as
holding a lock around the update.

Every action's duration goes through :meth:`Engine._advance`, the one place where time
passes: cores and the memory bus are simpy resources acquired there, so the order of atomic
actions (block read, gradient, block load, block store) is decided in one place. Durations and
samples come from a ``DurationSource``: seeded draws, or a recorded trace (replay).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from simulator.budget import preflight
from simulator.distributions import beta_shapes
from simulator.errors import ScenarioError
from simulator.inject import Injector
from simulator.memory import Grain, Op, SharedMemory, block_ops, grain_ops
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.protocols.base import GROUPED, MEMBER, SINGLE, Protocol
from simulator.rules import LR_FACTORS, mean_step
from simulator.scenario import CONVOY_FIELDS, Scenario, TimingSpec, scenario_to_toml
from simulator.slices import Migrating
from simulator.timing import GRAD, IDLE, READ, WRITE, DurationSource, SampledSource
from simulator.trace import Trace, TraceBuilder
from simulator.view import UNMEASURED, SerializedView

__all__ = ["Engine", "Update", "simulate"]

_TRIM_EVERY = 2048
_PROGRESS_EVERY = 256
_CONVOY_TAG = 0xC0
Slowdowns = tuple[tuple[float, float, float, float], ...]  # [phase][other's phase]


class _Convoy:
    """The writes of one block in flight together (``timing.convoy_*``). The front of the
    sweep moves linearly from ``front`` at ``start`` to the block's end at ``end``."""

    __slots__ = ("end", "first", "front", "leader", "lost", "members", "pair", "start",
                 "threads")

    def __init__(self, leader: Update, start: int, end: int) -> None:
        self.leader, self.first, self.start, self.end = leader, start, start, end
        self.front = 0.0
        self.members = 1
        self.lost: dict[int, np.ndarray] = {}  # uid → coordinates of the block it loses
        self.pair: tuple[int, int, int, float, float] | None = None
        self.threads: list[int] = []  # with interference: the threads writing in it


class _Flight:
    """One write of a block in flight when writes that meet pass each other
    (``TimingSpec.passing``): who writes, from when to when (as planned at its start), how
    many others it met, and the pair record it is in (None: none, or not a pair)."""

    __slots__ = ("end", "met", "pair", "start", "u")

    def __init__(self, u: Update, start: int, end: int) -> None:
        self.u, self.start, self.end = u, start, end
        self.met = 0
        self.pair: list[Any] | None = None  # [leader uid, joiner uid, lag, shares ×2, valid]


class _Writing:
    """A block write in flight that a read sees part of (``run.read_view = "sweep"``): whose,
    from when, until when as planned (a convoy member: its convoy's end plus its tail), and
    the step its stores take off the memory, less the coordinates in ``lost`` under its uid.
    A read sees the stores of an in-place sweep, each the value it replaces less the step,
    even where the write itself lands as ``loaded − step`` at its end (``load_store``): a
    write stopped by a time slice does not show the block as it was at the write's start."""

    __slots__ = ("convoy", "end", "lost", "start", "step", "tail", "thread", "uid")

    def __init__(self, u: Update, start: int, end: int, step: np.ndarray,
                 lost: dict[int, np.ndarray] | None = None, convoy: _Convoy | None = None,
                 tail: int = 0) -> None:
        self.thread, self.uid, self.start, self.end = u.thread, u.uid, start, end
        self.step, self.lost, self.convoy, self.tail = step, lost, convoy, tail

    def planned_end(self) -> int:
        return self.end if self.convoy is None else self.convoy.end + self.tail


def _ends(end: int, durations: list[int]) -> list[int]:
    """The end of each of consecutive actions of ``durations`` that ended at ``end``."""
    ends = list(itertools.accumulate(durations, initial=end - sum(durations)))
    return ends[1:]


class Update:
    """One update in flight: its sample, the blocks it moves and what happened to it."""

    __slots__ = ("copied", "delay", "discard", "drawn_write_ns", "dropped", "error_norm",
                 "grad_end", "grad_ns", "grad_start", "group", "idle_ns", "lr_scale", "ops",
                 "overwrote", "read", "read_end", "read_ns", "read_start", "role",
                 "sample", "seq", "start_completed", "start_versions", "step", "stored", "thread",
                 "uid", "write_end", "write_ns", "write_start")

    read_ns: list[int]
    grad_ns: int
    idle_ns: int
    write_ns: list[int]
    read_start: int
    read_end: int
    grad_start: int
    grad_end: int
    write_start: int
    write_end: int
    start_completed: int
    step: np.ndarray

    def __init__(self, uid: int, thread: int, seq: int, sample: int, ops: list[Op]) -> None:
        self.uid, self.thread, self.seq, self.sample, self.ops = uid, thread, seq, sample, ops
        self.start_versions: list[int] = []
        # For the read report: when each op's block copy ended, and per block when its (last)
        # store ended.
        self.copied: list[int] = []
        self.stored: dict[int, int] = {}
        self.overwrote = 0
        self.read = True        # False: reuse the thread's previous read copy (accumulation)
        self.role = SINGLE      # set by the protocol before the write
        self.group: list[Update] = []
        self.discard = False    # the protocol throws the gradient away (never applied)
        self.dropped = False    # injected: the write is lost in transit
        self.delay = 0          # injected staleness τ
        self.error_norm = 0.0   # injected ‖e‖
        self.lr_scale = 1.0     # the update rule's learning-rate factor
        self.drawn_write_ns: list[int] | None = None  # in a convoy run: before convoys


class Engine:
    """Runs one scenario to completion and returns its trace.

    Raises:
        ScenarioError: a value that only the built problem can check (``run.blocks`` > dim),
            or a scenario that cannot run on this machine (``simulator.budget.preflight``).
    """

    def __init__(self, scenario: Scenario, problem: Problem | None = None,
                 source: DurationSource | None = None, lookahead: bool = True) -> None:
        preflight(scenario)
        self.scenario = scenario
        self.problem = problem if problem is not None else make_problem(scenario.problem)
        run = scenario.run
        if run.blocks > self.problem.dim:
            raise ScenarioError("run.blocks", run.blocks,
                                f"must be <= the problem's dimension ({self.problem.dim})")
        self.env = simpy.Environment()
        self.protocol = make_protocol(run.protocol, scenario)
        self.threads = self.protocol.threads(run)
        self.lr, self.updates = run.lr, run.updates
        # Updates each thread may start: all of T (shared), or its even share.
        self._quota = ([run.updates // self.threads + (thread < run.updates % self.threads)
                        for thread in range(self.threads)] if run.split == "even"
                       else [run.updates] * self.threads)
        self._schedule = LR_FACTORS.get(run.lr_schedule)
        self.atomic = run.write_mode == "atomic_add" or self.protocol.atomic
        w0 = self.problem.initial()
        self.mem = SharedMemory(w0, run.blocks)
        self._dense_ops, self._dense_fractions = self._block_ops(None)
        # load_store writes swept grain by grain (run.store_grain): the pieces of a dense
        # update, cut once.
        self._grain = 0 if self.atomic else run.store_grain
        self._dense_grains = grain_ops(self._dense_ops, self._grain) if self._grain else None
        self._dense_blocks = [op[0] for op in self._dense_ops]
        self._sparse = self.problem.sparse and not self.protocol.dense
        # Speed episodes on some device: each update asks its core's state (off the hot path
        # otherwise).
        self._episodic = any(d.slow_factor > 1 for d in scenario.devices)
        self._dense_grad = self.problem.sparse and self.protocol.dense
        self.source = source if source is not None else SampledSource(
            scenario, self.threads, self.problem.n_samples, self._dense_fractions,
            self.protocol.network, self.problem.dim, self.protocol.grad_work)
        metrics = scenario.metrics
        self.view = SerializedView(self.problem, self.lr, w0, run.updates,
                                   metrics.exact and self.protocol.exact_view, metrics.every,
                                   metrics.curve_points)
        self._cores, self._bus = self._resources()
        inject = scenario.inject
        self.injector = (Injector(inject, run.seed, self.threads, self.view.w_star)
                         if inject.active else None)
        if inject.write_bits:
            self.mem.quantize = self.injector.quantize if self.injector else None
        # Snapshots w_{t} of the last completions, for injected delays.
        self._history: deque[np.ndarray] = deque([w0.copy()], maxlen=inject.max_delay + 1)
        self._keep_history = inject.max_delay > 0
        self._pauses: list[list[tuple[int, int]]] = [[] for _ in range(self.threads)]
        for pause in inject.pauses:
            if pause.thread < self.threads:
                self._pauses[pause.thread].append((pause.start, pause.end))
        self._slices = self._time_slices()
        # Preemptive slices (devices.preempt): an action cut by its slice's end goes on in
        # the thread's next slice.
        self._preempt = [s is not None and scenario.devices[scenario.device_of(t)].preempt
                         for t, s in enumerate(self._slices)]
        # Interference (timing.*_under_*): per thread, its slowdowns by [phase][other's
        # phase] and the other threads of its device; what each thread is doing, from when
        # to when. A starting phase needs every other thread's state at its start, so the
        # lookahead (threads running ahead of simpy's clock) is off.
        self._under, self._peers = self._interference_setup()
        # Shared lines (timing.write_shared): per thread its factor (None: none, or replayed
        # durations, which carry it); per block the threads holding a copy (a bit each) since
        # the block's last write and the thread that read it last. It needs every thread's
        # reads and writes in time order, so the lookahead is off.
        self._shared_factor = self._shared_setup()
        self._sharing = any(f is not None for f in self._shared_factor)
        self._holders = [0] * run.blocks
        self._last_reader = [-1] * run.blocks
        self._doing: list[tuple[int, int, int]] = [(IDLE, 0, 0)] * self.threads
        self._plan: list[list[tuple[float, float]]] = [[] for _ in range(self.threads)]
        self._fixed = [False] * self.threads  # writing in a convoy of two or more
        self._writing: list[_Convoy | None] = [None] * self.threads  # alone in a convoy
        # Reads that see the writes in flight (run.read_view = "sweep"): per block, the
        # writes sweeping it now. A read's copy needs them at its end: the lookahead is off.
        self._sweeping = run.read_view == "sweep"
        if self._sweeping and self._sparse:
            raise ScenarioError("run.read_view", run.read_view,
                                "sweeps dense blocks; the problem's updates are sparse")
        self._in_write: list[list[_Writing]] = [[] for _ in range(run.blocks)]
        # Per thread, the part of its write windows its stores take: (lead, tail) in ns
        # (timing.write_sweep_lead and write_sweep_tail of its device).
        self._store_window = [self._store_setup(t) for t in range(self.threads)]
        self._read_sweeps: list[tuple[int, int, int, int]] = []  # trace.READ_SWEEP_COLUMNS
        lookahead = (lookahead and not any(self._under) and not self._sharing
                     and not self._sweeping)
        self._finished = [math.inf] * self.threads  # when each thread's loop ended
        self._blocked = [bool(p) or s is not None
                         for p, s in zip(self._pauses, self._slices, strict=True)]
        self._free = [lookahead and core is None and bus is None and not blocked
                      for core, bus, blocked in zip(self._cores, self._bus, self._blocked,
                                                    strict=True)]
        self.started = self.completed = 0
        self.clock = [0] * self.threads
        self.lookahead = lookahead
        self.active: dict[int, Update] = {}
        self.lost = [0] * run.updates  # stores of each update (by uid) that were overwritten
        self.dead: list[int] = []
        self._local: list[np.ndarray] = [np.zeros(self.problem.dim) for _ in range(self.threads)]
        self._pulled = [(0, 0)] * self.threads  # (completions, version) of each thread's read
        self._builder = TraceBuilder()
        self._rows = self._builder.rows  # the records so far (trace.RECORD)
        self.progress: Callable[[int], object] | None = None
        # Writes that meet (timing.convoy_*): the timing they follow when they form convoys,
        # or when they pass each other; None: a meeting is two plain read-modify-writes.
        self._convoys, self._passing = self._meeting_setup()
        self._inflight: list[_Convoy | None] = [None] * run.blocks
        self._paired: list[_Convoy] = []
        self._flying: list[list[_Flight]] = [[] for _ in range(run.blocks)]
        self._passing_lost: list[dict[int, np.ndarray]] = [{} for _ in range(run.blocks)]
        self._passed: list[list[Any]] = []
        self._op_write_drawn: list[int] = []
        self._convoy_rng = np.random.default_rng([run.seed, _CONVOY_TAG])
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
        pools = [simpy.Resource(self.env, d.cores) if 0 < d.cores < n and not d.quantum
                 else None for d, n in zip(scenario.devices, per_device, strict=True)]
        buses = [simpy.Resource(self.env, d.bus) if d.bus > 0 else None
                 for d in scenario.devices]
        devices = [scenario.device_of(t) for t in range(self.threads)]
        return [pools[d] for d in devices], [buses[d] for d in devices]

    def _time_slices(self) -> list[tuple[list[int], int, int, Migrating | None] | None]:
        """Per thread on a time-sliced device: (the threads it rotates with, itself included;
        the cores they share; quantum; for ``per_core`` slicing the device's queues
        (``simulator.slices``: they move threads), else None); None elsewhere.

        ``global`` slicing rotates all the device's threads over its cores; ``per_core``
        puts its j-th thread (in slot order: ``run.placement``) on core j mod cores, where it
        rotates with the core's others; a core whose threads finished takes a waiting one,
        and with ``migrate`` a balancer moves threads between the cores
        (``simulator.slices``)."""
        scenario = self.scenario
        on: dict[int, list[int]] = {}
        for thread in range(self.threads):
            on.setdefault(scenario.device_of(thread), []).append(thread)
        slices: list[tuple[list[int], int, int, Migrating | None] | None] = [None] * self.threads
        for device, threads in on.items():
            spec = scenario.devices[device]
            if not spec.quantum or not 0 < spec.cores < len(threads):
                continue
            ordered = sorted(threads, key=scenario.slot_of)
            if spec.slicing == "per_core":
                moves = Migrating(ordered, spec.cores, spec.quantum, spec.migrate,
                                  scenario.run.seed, device)
                for thread in threads:
                    slices[thread] = (ordered, spec.cores, spec.quantum, moves)
                continue
            for thread in threads:
                slices[thread] = (threads, spec.cores, spec.quantum, None)
        return slices

    def _interference_setup(self) -> tuple[list[Slowdowns | None], list[list[int]]]:
        """Per thread: its timing's slowdowns by [phase][other's phase] (None: none, or the
        durations are replayed, which carry them already), and its device's other threads."""
        scenario, replayed = self.scenario, not isinstance(self.source, SampledSource)
        devices = [scenario.device_of(t) for t in range(self.threads)]
        under = [None if replayed else scenario.timing_of(d).interference for d in devices]
        peers = [[j for j in range(self.threads) if j != t and devices[j] == devices[t]]
                 for t in range(self.threads)]
        return under, peers

    def _shared_setup(self) -> list[float | None]:
        """Per thread: its timing's ``write_shared`` factor, or None (1, or the durations
        are replayed)."""
        if not isinstance(self.source, SampledSource):
            return [None] * self.threads
        factors = [self.scenario.timing_of(self.scenario.device_of(t)).write_shared
                   for t in range(self.threads)]
        return [None if f == 1 else f for f in factors]

    def _read_lines(self, thread: int, ops: Sequence[Op]) -> None:
        """``thread`` copied the blocks of ``ops``: it holds them and read them last."""
        bit = 1 << thread
        for op in ops:
            self._holders[op[0]] |= bit
            self._last_reader[op[0]] = thread

    def _write_lines(self, thread: int, ops: Sequence[Op], durations: list[int]) -> list[int]:
        """``thread`` starts writing the blocks of ``ops``: each block's write ``durations``
        times the thread's ``write_shared`` where it still holds the block from its read and
        another thread read it since (``TimingSpec`` docstring); the writer then holds each
        block alone."""
        factor, bit = self._shared_factor[thread], 1 << thread
        out = list(durations)
        for i, op in enumerate(ops):
            block = op[0]
            if (factor is not None and self._holders[block] & bit
                    and self._last_reader[block] != thread):
                out[i] = round(out[i] * factor)
            self._holders[block], self._last_reader[block] = bit, thread
        return out

    def _interfered(self, thread: int, phase: int, durations: list[int]) -> list[int]:
        """``thread`` starts ``phase``: its actions' ``durations`` stretched, and the ends of
        the phases the device's other threads are in moved, as processor sharing between
        them says (``TimingSpec`` docstring): each phase in progress runs at the rate
        1 / (1 + Σ slowdowns under the others' phases), from its remaining work, until the
        first ends, and so on. Ends only move later (a new phase only adds slowdowns); a
        thread whose end moved waits for it (``_overrun``)."""
        start, work = self.clock[thread], sum(durations)
        going: dict[int, list[float]] = {}  # thread → [phase, work left]
        fixed: list[tuple[int, int, int]] = []  # convoy members: they end with the convoy
        for j in self._peers[thread]:
            q, begun, end = self._doing[j]
            if begun <= start < end:
                if self._fixed[j]:
                    fixed.append((j, q, end))
                else:
                    going[j] = [q, self._left(j, start)]
        if work > 0:
            going[thread] = [phase, float(work)]
        now = float(start)
        plans: dict[int, list[tuple[float, float]]] = {j: [] for j in going}
        ends: dict[int, float] = {}
        while going:
            running = [(j, int(v[0])) for j, v in going.items()]
            running += [(j, f) for j, f, end in fixed if end > now]
            step, rates = math.inf, {}
            for j, (p, left) in going.items():
                slowdowns = self._under[j]
                assert slowdowns is not None
                row = slowdowns[int(p)]
                rates[j] = 1.0 / (1.0 + sum(row[o] for i, o in running if i != j))
                step = min(step, left / rates[j])
            later = [end - now for _, _, end in fixed if end > now]
            step = min([step, *later])
            now += step
            for j, rate in rates.items():
                plans[j].append((now - step, rate))
                going[j][1] -= step * rate
                if going[j][1] <= 1e-6 * step * rate or going[j][1] <= 1e-9:
                    ends[j] = now
                    del going[j]
        for j, finish in ends.items():
            q, begun, before = self._doing[j] if j != thread else (phase, start, start)
            self._doing[j] = (q, begun, max(before, round(finish)))
            self._plan[j] = plans[j]
            convoy = self._writing[j]
            if j != thread and convoy is not None:  # a write alone in its convoy
                convoy.end = self._doing[j][2]
                convoy.leader.drawn_write_ns = [convoy.end - convoy.first]
        if work <= 0:
            self._doing[thread] = (phase, start, start)
            return durations
        total = self._doing[thread][2] - start
        if total != work:
            ratio = total / work
            durations = [int(d * ratio + 0.5) for d in durations]
            durations[-1] += total - sum(durations)
        return durations

    def _left(self, thread: int, at: int) -> float:
        """The work (ns at full rate) left at ``at`` of the phase ``thread`` is in."""
        plan, end = self._plan[thread], self._doing[thread][2]
        left = 0.0
        for k, (begun, rate) in enumerate(plan):
            until = plan[k + 1][0] if k + 1 < len(plan) else end
            left += rate * max(0.0, min(until, end) - max(begun, at))
        return left

    def _overrun(self, thread: int) -> Generator[Any, Any, int]:
        """Wait until the end of the thread's phase, which others' phases moved later;
        returns the time added."""
        extra = 0
        while self._doing[thread][2] > self.clock[thread]:
            wait = self._doing[thread][2] - self.clock[thread]
            yield self.env.timeout(wait)
            self.clock[thread] = int(self.env.now)
            extra += wait
        return extra

    def _meeting_setup(self) -> tuple[TimingSpec | None, TimingSpec | None]:
        """The timing whose ``convoy_*`` values every thread's writes follow when writes that
        meet form convoys, and when they pass each other (``TimingSpec.passing``); None
        where they do neither. Checks that the run's writes can: dense ``load_store``
        writes of whole blocks; convoys also need threads on their own cores or in time
        slices (no core pool or bus to wait for inside a write)."""
        scenario = self.scenario
        timings = {scenario.timing_of(scenario.device_of(t)) for t in range(self.threads)}
        asked = [t for t in timings if t.convoys or t.passing]
        if not asked or self.protocol.atomic:
            return None, None
        timing = asked[0]
        name, what = (("timing.convoy_join", "write convoys") if timing.convoys else
                      ("timing.convoy_lost_leader", "writes that pass"))
        value = getattr(timing, name.removeprefix("timing."))
        if len({tuple(getattr(t, f) for f in CONVOY_FIELDS) for t in timings}) > 1:
            raise ScenarioError(name, value,
                                "the convoy_* values must be the same on every device")
        run = scenario.run
        if run.write_mode != "load_store":
            raise ScenarioError(name, value, f"{what} need run.write_mode = load_store")
        if run.store_grain:
            raise ScenarioError(name, value,
                                f"{what} sweep whole blocks: set run.store_grain = 0")
        if self._sparse:
            raise ScenarioError(name, value,
                                f"{what} need dense writes (this problem's are sparse)")
        if timing.passing:
            return None, timing
        if any(self._under) and run.blocks > 1:
            raise ScenarioError("run.blocks", run.blocks,
                                "write convoys with interference (timing.*_under_*) need "
                                "run.blocks = 1")
        if any(c is not None or b is not None for c, b in zip(self._cores, self._bus,
                                                               strict=True)):
            raise ScenarioError(name, value,
                                "write convoys need no bus and a core per thread or "
                                "time slices (devices.quantum)")
        return timing, None

    # -- the clock ---------------------------------------------------------------------------
    # Each thread keeps its own clock, which may run ahead of simpy's: an action that ends
    # strictly before the next scheduled event (``env.peek()``) cannot be interleaved with
    # anything, so it is applied at once, exactly as if its timeout had fired. Threads that
    # wait for cores or a bus, and protocol gates, always go through simpy.

    def _advance(self, thread: int, duration: int, transfer: bool) -> simpy.Event | None:
        """Spend ``duration`` ns on one action; the event to wait for, or ``None`` if the
        action completes without anything else happening first."""
        if self._blocked[thread]:
            self._skip_pauses(thread)
            if self._preempt[thread]:
                duration = self._preempted(thread, duration)
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

    def _pause_point(self, thread: int) -> Generator[Any, Any, None]:
        """Before a phase: sit out any pause the thread's clock falls into, on simpy's clock
        (so the phase sees every completion that happened meanwhile)."""
        self._skip_pauses(thread)
        yield from self._catch_up(thread)

    def _skip_pauses(self, thread: int) -> None:
        """A paused thread starts its next action when the pause window ends; a thread out of
        its time slice, when its next slice begins."""
        moved = True
        while moved:
            moved = False
            for start, end in self._pauses[thread]:
                if start <= self.clock[thread] < end:
                    self.clock[thread], moved = end, True
            sliced = self._slices[thread]
            if sliced is not None:
                quantum = sliced[2]
                current = self.clock[thread] // quantum
                slot = self._running_slot(thread, current)
                if slot > current:
                    self.clock[thread], moved = slot * quantum, True

    def _running_slot(self, thread: int, slot: int) -> int:
        """The first time slice from ``slot`` on in which ``thread`` runs."""
        rotation, cores, quantum, moves = self._slices[thread]  # type: ignore[misc]
        if moves is not None:
            while not moves.runs(thread, slot):
                slot += 1
            return slot
        # Threads that finished their updates leave the rotation (a thread that ran ahead
        # of simpy's clock finished at its own clock, not before).
        live = [t for t in rotation if self._finished[t] > slot * quantum]
        index, threads = live.index(thread), len(live)
        # Slot s runs the rotation's threads (s·cores + j) mod threads, j < cores.
        while (index - slot * cores) % threads >= cores:
            slot += 1
        return slot

    def _preempted(self, thread: int, duration: int) -> int:
        """``duration`` ns of work started now on a preemptive time-sliced device: how long
        it takes with the slices the thread sits out in between (its rotation as known now).
        """
        quantum = self._slices[thread][2]  # type: ignore[index]
        start = now = self.clock[thread]
        left = duration
        while True:
            slot = now // quantum
            room = (slot + 1) * quantum - now
            if left <= room:
                return now + left - start
            left -= room
            now = self._running_slot(thread, slot + 1) * quantum

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

    def _gate(self, thread: int, event: simpy.Event | None) -> Generator[Any, Any, None]:
        """Wait for a protocol's event (if any) and move the thread's clock to simpy's."""
        if event is not None:
            yield event
            self.clock[thread] = int(self.env.now)

    def _catch_up(self, thread: int) -> Generator[Any, Any, None]:
        wait = self._sync(thread)
        if wait is not None:
            yield wait

    def _thread(self, thread: int) -> Generator[Any, Any, None]:
        try:
            yield from self._loop(thread)
        except simpy.Interrupt:  # an injected death: abandon the update in flight
            self.active.pop(thread, None)
            self.dead.append(thread)
            for flights, lost in zip(self._flying, self._passing_lost, strict=True):
                for flight in [f for f in flights if f.u.thread == thread]:
                    flights.remove(flight)  # its write never lands
                    lost.pop(flight.u.uid, None)
        self.source.done(thread)
        self._finished[thread] = max(self.clock[thread], int(self.env.now))
        sliced = self._slices[thread]
        if sliced is not None and sliced[3] is not None:
            sliced[3].finish(thread, self._finished[thread])

    def _loop(self, thread: int) -> Generator[Any, Any, None]:
        """The update loop of one thread (read and write inline: this is the hot path)."""
        local = self._local[thread]
        mem, protocol, clock, seq = self.mem, self.protocol, self.clock, 0
        gated, injector, paused = protocol.gated, self.injector, self._blocked[thread]
        quota = self._quota[thread]
        source = self.source
        coupled = source.coupled(thread)  # durations drawn as each phase starts
        interfered = self._under[thread] is not None  # ... and stretched by the others'
        sharing = self._sharing  # reads and writes change the blocks' holders
        sweeping = self._sweeping  # reads see part of the writes in flight
        sweeps_whole = sweeping and not self._grain  # (grains land as they sweep)
        delays = injector is not None and injector.max_delay > 0
        retires = type(protocol).active is not Protocol.active
        passes = self._passing is not None
        while (self.started < self.updates and seq < quota
               and self.source.remaining(thread) != 0
               and (not retires or protocol.active(self, thread))):
            u = self._begin(thread, seq)
            seq += 1
            if coupled:
                u.idle_ns = source.at(thread, IDLE, clock[thread])[0]
            if interfered:
                u.idle_ns = self._interfered(thread, IDLE, [u.idle_ns])[0]
            if u.idle_ns:  # local work before the update (sampling, bookkeeping)
                wait = self._advance(thread, u.idle_ns, False)
                if wait is not None:
                    yield wait
                    clock[thread] = int(self.env.now)
                if interfered:
                    u.idle_ns += yield from self._overrun(thread)
            if gated:
                yield from self._catch_up(thread)
                yield from self._gate(thread, protocol.before_read(self, u))
            ops, n = u.ops, len(u.ops)
            if u.read:
                # READ: each block is copied when its read ends (so a read can be torn).
                if paused:
                    yield from self._pause_point(thread)
                u.read_start, u.start_completed = clock[thread], self.completed
                if coupled:
                    u.read_ns = source.at(thread, READ, clock[thread])
                if interfered:
                    u.read_ns = self._interfered(thread, READ, u.read_ns)
                u.start_versions = [mem.count[op[0]] for op in ops]
                if delays:  # the gradient will see w as it was τ completions before
                    assert injector is not None
                    u.delay = min(injector.delay(thread), u.start_completed)
                    past = self._history[-1 - u.delay]
                i = 0
                while i < n:
                    run = self._uninterrupted(thread, u.read_ns, i) if n > 1 else i
                    if run > i:  # (never with shared lines or sweeping reads: no lookahead)
                        mem.copy_run(ops[i:run], local)
                        u.copied.extend(_ends(clock[thread], u.read_ns[i:run]))
                        i = run
                        continue
                    block, index = ops[i][:2]
                    wait = self._advance(thread, u.read_ns[i], True)
                    if wait is not None:
                        yield wait
                        clock[thread] = int(self.env.now)
                    if interfered and i == n - 1:
                        extra = yield from self._overrun(thread)
                        if extra:
                            u.read_ns = [*u.read_ns[:-1], u.read_ns[-1] + extra]
                    mem.copy(index, local)
                    u.copied.append(clock[thread])
                    if sweeping and self._in_write[block]:
                        self._swept(thread, block, index, local, clock[thread])
                    if sharing:
                        self._read_lines(thread, ops[i:i + 1])
                    i += 1
                u.read_end = clock[thread]
                if delays:
                    np.copyto(local, past)
                self._pulled[thread] = (u.start_completed, u.delay)
            else:  # gradients accumulated on the vector this thread read last
                u.read_start = u.read_end = clock[thread]
                u.start_completed, u.delay = self._pulled[thread]
            if gated:
                yield from self._catch_up(thread)
                protocol.after_read(self, u)
            # GRADIENT: the real gradient at the local copy, holding the device.
            if paused:
                yield from self._pause_point(thread)
            u.grad_start = clock[thread]
            if coupled:
                u.grad_ns = source.at(thread, GRAD, clock[thread])[0]
            if interfered:
                u.grad_ns = self._interfered(thread, GRAD, [u.grad_ns])[0]
            wait = self._advance(thread, u.grad_ns, False)
            if wait is not None:
                yield wait
                clock[thread] = int(self.env.now)
            if interfered:
                u.grad_ns += yield from self._overrun(thread)
            if protocol.computes:
                step = protocol.compute(self, u, local)
            else:
                if self._dense_grad:
                    step, support = self.problem.dense_grad(local, u.sample), None
                else:
                    step, support = self.problem.grad(local, u.sample)
                if injector is not None and injector.errors:
                    step, u.error_norm = injector.error(thread, step, local, support)
                step *= self.lr  # grad returns a new array
            if injector is not None:
                u.dropped = injector.dropped(thread)
            u.step = step
            u.grad_end = u.write_start = clock[thread]
            if gated:
                yield from self._catch_up(thread)
                yield from self._gate(thread, protocol.before_write(self, u))
                u.write_start = clock[thread]
                if u.role == MEMBER:  # a group's writer completes this update
                    continue
                if u.discard:
                    self._discard(u)
                    protocol.after_write(self, u)
                    continue
            if protocol.rule:
                step = u.step = protocol.step(self, u, step, local)
            if u.role == GROUPED:
                step = u.step = mean_step([m.step for m in u.group])
            if self._schedule is not None:
                factor = self._schedule(self.completed + 1)
                step = u.step = step * factor
                u.lr_scale *= factor
            if paused:
                yield from self._pause_point(thread)
                u.write_start = clock[thread]
            # WRITE: block by block, an atomic add or a load, wait, store.
            if coupled:
                u.write_ns = source.at(thread, WRITE, clock[thread])
            if sharing and not u.dropped:
                u.write_ns = self._write_lines(thread, ops, u.write_ns)
            if interfered:
                u.write_ns = self._interfered(thread, WRITE, u.write_ns)
            if u.dropped:  # lost in transit: its time passes, nothing is stored
                wait = self._advance(thread, sum(u.write_ns), True)
                if wait is not None:
                    yield wait
                    clock[thread] = int(self.env.now)
                n = 0
            if self._convoys is not None and n:
                drawn = u.drawn_write_ns = u.write_ns
                u.write_ns = []
                for i in range(n):
                    block, index, vsel, _ = ops[i]
                    if paused:  # a slice that moves the start: let simpy catch up first
                        before = clock[thread]
                        self._skip_pauses(thread)
                        if clock[thread] != before:
                            yield from self._catch_up(thread)
                    begun = clock[thread]
                    convoy, duration = self._join(thread, u, block, index, drawn[i])
                    # A later write joined: end with it (a member that started lag ns after
                    # the first write ends convoy_end_gap·max(0, lag − convoy_end_catch_up)
                    # after the convoy's end).
                    tail = round(self._convoys.convoy_end_gap * max(
                        0, begun - convoy.first - self._convoys.convoy_end_catch_up))
                    if sweeping:
                        writing = _Writing(u, begun, 0, step[vsel], lost=convoy.lost,
                                           convoy=convoy, tail=tail)
                        self._in_write[block].append(writing)
                    if interfered:  # alone, its end follows the others; met, the convoy's
                        self._convoy_moved(thread, convoy)
                    wait = self._advance(thread, duration, True)
                    if wait is not None:
                        yield wait
                        clock[thread] = int(self.env.now)
                    while convoy.end + tail > clock[thread]:
                        yield self.env.timeout(convoy.end + tail - clock[thread])
                        clock[thread] = int(self.env.now)
                    self._sweep(convoy, u, block, index, step[vsel])
                    u.stored[block] = clock[thread]
                    if sweeping:
                        self._in_write[block].remove(writing)
                    u.write_ns.append(clock[thread] - begun)
                    if interfered:
                        self._fixed[thread], self._writing[thread] = False, None
                n = 0
            writes: Sequence[Grain] = ops
            write_ns = u.write_ns
            if self._grain and n:
                writes, write_ns = self._grains(u)
                n = len(writes)
            i = 0
            while i < n:
                # (A passing write draws its losses as it starts: never in an unbroken run.)
                run = self._uninterrupted(thread, write_ns, i) if n > 1 and not passes else i
                if run > i:
                    mem.write_run(writes[i:run], step, u.uid, self.atomic)
                    u.stored.update(zip([piece[0] for piece in writes[i:run]],
                                        _ends(clock[thread], write_ns[i:run]), strict=True))
                    i = run
                    continue
                block, index, vsel, touched = writes[i]
                if passes:
                    flight = self._pass(u, block, vsel.stop - vsel.start, clock[thread],
                                        write_ns[i])
                loaded_at, loaded = (mem.count[block], None if self.atomic or passes
                                     else mem.load(index))
                if sweeps_whole:
                    writing = _Writing(u, clock[thread], clock[thread] + write_ns[i],
                                       step[vsel], self._passing_lost[block] if passes else None)
                    self._in_write[block].append(writing)
                wait = self._advance(thread, write_ns[i], True)
                if wait is not None:
                    yield wait
                    clock[thread] = int(self.env.now)
                i += 1
                if sweeps_whole:
                    self._in_write[block].remove(writing)
                if interfered and i == n:
                    extra = yield from self._overrun(thread)
                    if extra:
                        u.write_ns = [*u.write_ns[:-1], u.write_ns[-1] + extra]
                if passes:
                    self._land(flight, block, index, step[vsel])
                    u.stored[block] = clock[thread]
                    continue
                if loaded is None:
                    mem.add(block, index, touched, -step[vsel], u.uid)
                    u.stored[block] = clock[thread]
                    continue
                lost = mem.store(block, index, touched, loaded, step[vsel], u.uid, loaded_at)
                u.stored[block] = clock[thread]
                for victim in lost:
                    self.lost[victim] += 1
                u.overwrote += len(lost)
            u.write_end = clock[thread]
            if u.role == GROUPED:
                self._complete_group(u)
            else:
                self._complete(u)
            if gated:
                yield from self._catch_up(thread)
                protocol.after_write(self, u)
        if gated:
            yield from self._catch_up(thread)
            protocol.finish(self, thread)

    def _join(self, thread: int, u: Update, block: int, index: slice,
              drawn: int) -> tuple[_Convoy, int]:
        """``u`` starts writing ``block`` now: alone (a new convoy) or joining the writes in
        flight, whose end it moves; returns the convoy and the write's duration."""
        now = self.clock[thread]
        convoy = self._inflight[block]
        if convoy is None or convoy.end <= now:
            convoy = self._inflight[block] = _Convoy(u, now, now + drawn)
            return convoy, drawn
        timing = self._convoys
        assert timing is not None
        front = convoy.front + (1 - convoy.front) * (now - convoy.start) / (convoy.end
                                                                             - convoy.start)
        # The joiner sweeps along at most one write's worth of the convoy's rest: a chain of
        # joiners (many threads) lengthens the convoy by at most (join + rest)·W each, where
        # rest·(E − t) alone would grow it geometrically whenever rest > 1.
        end = max(convoy.end, now + round(timing.convoy_join * drawn + timing.convoy_rest
                                          * min(convoy.end - now, drawn)))
        size = index.stop - index.start
        counts = self._meeting_losses(timing, convoy.leader, u, size, front, convoy.lost)
        if convoy.members == 1:
            convoy.pair = (convoy.leader.uid, u.uid, now - convoy.first, counts[0] / size,
                           counts[1] / size)
            self._paired.append(convoy)
        else:
            convoy.pair = None  # three or more: not a pair
        convoy.start, convoy.front, convoy.end = now, front, end
        convoy.members += 1
        return convoy, end - now

    def _meeting_losses(self, timing: TimingSpec, leader: Update, joiner: Update, size: int,
                        front: float, lost: dict[int, np.ndarray]) -> list[int]:
        """Draw what a meeting of two writes of one block of ``size`` coordinates loses: in
        the part both sweep (from ``front``, the leader's position, to the end), each
        coordinate is lost by the leader or by the joiner with the ``convoy_lost_*``
        probabilities (never both), when the meeting loses anything at all
        (``convoy_lost_pairs``, falling with ``front`` as ``convoy_lost_within`` says), at
        the meeting's own rate with ``convoy_lost_spread`` (:meth:`_meeting_rate`). The
        victims' masks in ``lost`` (uid → lost coordinates) grow; returns the coordinates
        each lost (leader, joiner)."""
        shared = size - min(size, math.ceil(front * size))
        lossy = timing.convoy_lost_pairs
        if timing.convoy_lost_within > 0:
            lossy *= math.exp(-front / timing.convoy_lost_within)
        if lossy < 1 and self._convoy_rng.random() >= lossy:
            shared = 0  # this meeting loses nothing (one draw per meeting, only when asked)
        leader_share = timing.convoy_lost_leader
        total = timing.convoy_lost_leader + timing.convoy_lost_joiner
        if timing.convoy_lost_spread > 0 and shared and 0 < total < 1:
            rate = self._meeting_rate(total, timing.convoy_lost_spread)
            leader_share, total = rate * leader_share / total, rate
        draws = self._convoy_rng.random(shared)
        leader_loses = draws < leader_share
        joiner_loses = ~leader_loses & (draws < total)
        counts = []
        for victim, winner, loses in ((leader, joiner, leader_loses),
                                      (joiner, leader, joiner_loses)):
            counts.append(int(loses.sum()))
            if counts[-1]:
                mask = lost.setdefault(victim.uid, np.zeros(size, dtype=bool))
                mask[size - shared:] |= loses
                self.lost[victim.uid] += 1
                winner.overwrote += 1
        return counts

    def _meeting_rate(self, mean: float, rho: float) -> float:
        """A lossy meeting's own loss rate (``convoy_lost_spread`` = ρ > 0): a Beta draw of
        mean ``mean`` in which two coordinates' losses correlate ρ."""
        return float(self._convoy_rng.beta(*beta_shapes(mean, rho)))

    def _pass(self, u: Update, block: int, size: int, now: int, duration: int) -> _Flight:
        """``u`` starts writing ``block`` (``size`` coordinates) at ``now`` for ``duration``
        ns, passing the writes of it in flight (``TimingSpec.passing``): it meets the
        earliest of them, draws what the meeting loses, and counts as a pair with it when
        neither meets a third."""
        timing = self._passing
        assert timing is not None
        flight = _Flight(u, now, now + duration)
        others = [f for f in self._flying[block] if f.end > now]
        if others:
            leader = others[0]  # flights are kept in start order
            front = min(1.0, (now - leader.start) / max(leader.end - leader.start, 1))
            counts = self._meeting_losses(timing, leader.u, u, size, front,
                                          self._passing_lost[block])
            for other in others:
                other.met += 1
                if other.met > 1 and other.pair is not None:
                    other.pair[5] = False  # a third write met it: no longer a pair
            flight.met = len(others)
            if flight.met == 1 and leader.met == 1:
                flight.pair = leader.pair = [leader.u.uid, u.uid, now - leader.start,
                                             counts[0] / size, counts[1] / size, True]
                self._passed.append(flight.pair)
        self._flying[block].append(flight)
        return flight

    def _land(self, flight: _Flight, block: int, index: slice, step: np.ndarray) -> None:
        """A passing write lands at its end: its step, less the coordinates it lost."""
        self._flying[block].remove(flight)
        lost = self._passing_lost[block].pop(flight.u.uid, None)
        self.mem.add(block, index, None, -step if lost is None else np.where(lost, 0.0, -step),
                     flight.u.uid)

    def _store_setup(self, thread: int) -> tuple[int, int]:
        """``thread``'s store window in its write windows: (lead, tail), whole ns."""
        timing = self.scenario.timing_of(self.scenario.device_of(thread))
        return round(timing.write_sweep_lead), round(timing.write_sweep_tail)

    def _swept(self, thread: int, block: int, index: slice, local: np.ndarray,
               now: int) -> None:
        """``thread``'s read of ``block`` just copied it into ``local`` at its end, ``now``:
        add the coordinates each other thread's write in flight had stored by then (``RunSpec``
        docstring, ``read_view``), and record each such (read, write) row."""
        size = index.stop - index.start
        for writing in self._in_write[block]:
            if writing.thread == thread:
                continue
            span = writing.planned_end() - writing.start  # W
            lead, tail = self._store_window[writing.thread]
            begins = writing.start + min(lead, span)  # the first store
            stores = max(span - lead - tail, 0)  # from the first store to the last
            m = (0 if now <= begins else size if stores == 0
                 else min(size, -((begins - now) * size // stores)))
            self._read_sweeps.append((now - writing.start, span, size, m))
            if m == 0:
                continue
            part = slice(index.start, index.start + m)
            step = writing.step[:m]
            lost = None if writing.lost is None else writing.lost.get(writing.uid)
            local[part] -= step if lost is None else np.where(lost[:m], 0.0, step)

    def _convoy_moved(self, thread: int, convoy: _Convoy) -> None:
        """Interference and convoys: a write alone in its convoy is a phase like any other
        (its end, the convoy's, moves with the others'); once writes meet, their end is the
        convoy's and the others' phases no longer move it."""
        convoy.threads.append(thread)
        if convoy.members == 1:
            self._writing[thread] = convoy
            return
        for member in convoy.threads:
            self._writing[member], self._fixed[member] = None, True
            if self._doing[member][0] == WRITE:
                self._doing[member] = (WRITE, self._doing[member][1], convoy.end)

    def _sweep(self, convoy: _Convoy, u: Update, block: int, index: slice,
               step: np.ndarray) -> None:
        """``u``'s write of ``block`` lands, less the coordinates its convoy lost."""
        lost = convoy.lost.pop(u.uid, None)
        self.mem.add(block, index, None, -step if lost is None else np.where(lost, 0.0, -step),
                     u.uid)

    def _grains(self, u: Update) -> tuple[list[Grain], list[int]]:
        """``u``'s writes as grains of ``run.store_grain`` coordinates, each taking its share
        of its block's write duration (integer ns that add up to the block's)."""
        pieces, counts = (self._dense_grains if u.ops is self._dense_ops and self._dense_grains
                          else grain_ops(u.ops, self._grain))
        durations: list[int] = []
        for block_ns, count in zip(u.write_ns, counts, strict=True):
            ends = [block_ns * (c + 1) // count for c in range(count)]
            durations.extend(end - start for start, end in zip([0, *ends], ends, strict=False))
        return pieces, durations

    def _begin(self, thread: int, seq: int) -> Update:
        sample = self.source.next_sample(thread)
        if self._sparse:
            ops, fractions = self._block_ops(self.problem.support(sample))
        else:
            ops, fractions = self._dense_ops, self._dense_fractions
        u = Update(self.started, thread, seq, sample, ops)
        u.read_ns, u.grad_ns, u.write_ns = self.source.durations(thread, fractions)
        u.idle_ns = self.source.idle(thread)
        if self._episodic:
            self._follow_core(thread)
        slow = self.source.slowness(thread, self.clock[thread]) if self._episodic else 1.0
        if slow != 1.0:  # a slow episode of its core (coupled threads: applied by ``at``)
            u.read_ns = [int(d * slow + 0.5) for d in u.read_ns]
            u.write_ns = [int(d * slow + 0.5) for d in u.write_ns]
            u.grad_ns, u.idle_ns = int(u.grad_ns * slow + 0.5), int(u.idle_ns * slow + 0.5)
        self.started += 1
        self.active[thread] = u
        return u

    def _follow_core(self, thread: int) -> None:
        """Tell the source which core ``thread`` is on now, where per-core slices move
        threads between cores (its speed episodes are that core's)."""
        sliced = self._slices[thread]
        if sliced is None or sliced[3] is None:
            return
        core = sliced[3].core_of(thread, self.clock[thread] // sliced[2])
        if core is not None:
            self.source.place(thread, core)

    def _row(self, u: Update, step: int, m: tuple[Any, ...]) -> None:
        """Append ``u``'s trace record; ``step`` is its completion t (0: never applied)."""
        stored = u.stored  # in op order when every block was stored (blocks are written in
        # op order; a block's grains keep its first place)
        self._builder.add(
            (u.uid, u.thread, u.seq, u.sample, step, u.read_start, u.read_end, u.grad_start,
             u.grad_end, u.write_start, u.write_end, u.grad_ns, u.idle_ns, u.start_completed,
             self.completed, u.overwrote, u.delay, u.error_norm, u.dropped, u.lr_scale, *m),
            self._dense_blocks if u.ops is self._dense_ops else [op[0] for op in u.ops],
            u.read_ns, u.write_ns, u.copied if u.copied else [-1] * len(u.ops),
            stored.values() if len(stored) == len(u.ops) else
            [stored.get(op[0], -1) for op in u.ops])
        if self._convoys is not None:
            self._op_write_drawn.extend(u.write_ns if u.drawn_write_ns is None
                                        else u.drawn_write_ns)
        if self.active.get(u.thread) is u:
            del self.active[u.thread]
        n = len(self._rows)
        if self.progress is not None and n % _PROGRESS_EVERY == 0:
            self.progress(_PROGRESS_EVERY)

    def _completed(self) -> int:
        """Count a completion: the shared vector has a new serialized state w_t."""
        self.completed += 1
        if self._keep_history:
            self._history.append(self.mem.w.copy())
        if self.completed % _TRIM_EVERY == 0:
            self._trim()
        return self.completed

    def _complete(self, u: Update) -> None:
        t = self._completed()
        m = self.view.complete(t, self.mem.w, [u.sample], u.write_end, u.lr_scale,
                               len(self._rows) + 1)
        self._row(u, t, m)

    def _complete_group(self, writer: Update) -> None:
        """One completion applying the mean step of the group's gradients; the exact metrics
        sit on the writer's row (the last of the group), the others share its step and get an
        empty write at its end."""
        group = writer.group
        t = self._completed()
        m = self.view.complete(t, self.mem.w, [v.sample for v in group], writer.write_end,
                               writer.lr_scale, len(self._rows) + len(group))
        for member in group:
            if member is not writer:  # applied, without writing itself, when the write ended
                member.write_start = member.write_end = writer.write_end
                self._row(member, t, UNMEASURED)
        self._row(writer, t, m)

    def _discard(self, u: Update) -> None:
        """A gradient the protocol threw away: a row with step 0, no completion."""
        u.write_end = u.write_start
        for member in u.group or [u]:
            member.write_start = member.write_end = u.write_start
            self._row(member, 0, UNMEASURED)

    def _trim(self) -> None:
        keep = list(self.mem.count)
        for u in self.active.values():
            for op, version in zip(u.ops, u.start_versions, strict=False):
                keep[op[0]] = min(keep[op[0]], version)
        self.mem.trim(keep)

    def _deaths(self, processes: list[simpy.Process]) -> None:
        for death in self.scenario.inject.deaths:
            victims = ([death.thread] if death.thread >= 0 else
                       [t for t in range(self.threads)
                        if self.scenario.device_of(t) == death.device])
            for thread in victims:
                if thread < self.threads:
                    self.env.process(self._kill(processes[thread], death.at))

    def _kill(self, process: simpy.Process, at: int) -> Generator[Any, Any, None]:
        yield self.env.timeout(at)
        if process.is_alive:
            process.interrupt("death")

    def run(self) -> Trace:
        """Run every thread until T updates have started and every thread has stopped (or
        nothing can happen any more: threads waiting on a dead one); return the trace."""
        processes = [self.env.process(self._thread(thread)) for thread in range(self.threads)]
        self._deaths(processes)
        # A run that diverges (a step too large) carries inf and NaN through the same math:
        # recorded as they are and reported as ``diverged_at`` in its summary, not warned
        # about at every operation.
        with np.errstate(all="ignore"):
            self.env.run()
            self.view.finish(self.completed, self.mem.w, self._end_time(), len(self._rows))
        if self.progress is not None:
            self.progress(len(self._rows) % _PROGRESS_EVERY)
        return self._trace()

    def _end_time(self) -> int:
        return max((row[10] for row in self._rows), default=0)  # write_end

    def _trace(self) -> Trace:
        extras = {"dead_threads": np.asarray(sorted(self.dead), dtype=np.int64),
                  **self.protocol.report()}
        if self._convoys is not None:  # drawn write durations (for replay) and the pairs
            extras["write_drawn_ns"] = np.asarray(self._op_write_drawn, dtype=np.int64)
            extras["convoy_pairs"] = np.asarray(
                [c.pair for c in self._paired if c.pair is not None], dtype=np.float64).ravel()
        if self._sweeping:  # reads under a write and what they copied of it
            extras["read_sweeps"] = np.asarray(self._read_sweeps, dtype=np.float64).ravel()
        if self._passing is not None:  # the pairs of writes that passed each other
            extras["convoy_pairs"] = np.asarray([p[:5] for p in self._passed if p[5]],
                                                dtype=np.float64).ravel()
        return self._builder.build(scenario_to_toml(self.scenario), self.problem.initial(),
                                   self.mem.w.copy(), self.view.curve_arrays(), lost=self.lost,
                                   extras=extras)


def simulate(scenario: Scenario, problem: Problem | None = None,
             source: DurationSource | None = None, lookahead: bool = True) -> Trace:
    """Run ``scenario`` (optionally on a prebuilt problem or a replay source).

    ``lookahead=False`` sends every action through simpy; the result is identical (tested),
    only slower.
    """
    return Engine(scenario, problem, source, lookahead).run()
