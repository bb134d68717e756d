"""The discrete-event engine: virtual threads read, compute and write a shared vector.

Time is integer nanoseconds on a simpy clock. Each thread loops (DESIGN §3): draw a sample;
READ the blocks the sample needs, each copied when its read ends (so a read can be torn);
compute the GRADIENT at the local copy; WRITE block by block, as the run's write mode says
(``simulator.memory``: ``load_store`` loads a block, waits, and stores ``loaded − lr·g``,
overwriting any store that landed in between; ``atomic_add`` adds ``−lr·g`` atomically).
The engine owns the loop and the clock and nothing else: a protocol
(``simulator.protocols``) owns only what differs, such as holding a lock around the update,
and hardware effects (``simulator.hardware``) plug in through their hooks only when a
scenario switches them on.

Every action's duration goes through the threads' clocks (``simulator.clock``), the one
place where time passes: cores and the memory bus are simpy resources acquired there, so the
order of atomic actions (block read, gradient, block load, block store) is decided in one
place. Durations and
samples come from a ``DurationSource``: seeded draws, or a recorded trace (replay).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from simulator.budget import preflight
from simulator.clock import Clocks, Pool, Scheduled, refuse_unscheduled, resources
from simulator.errors import ScenarioError
from simulator.hardware import Writing, build, overrides
from simulator.inject import Injector, Pauses, start_deaths
from simulator.ledger import Ledger
from simulator.memory import (
    AtomicAdd,
    Grain,
    LoadStore,
    Op,
    SharedMemory,
    WriteMode,
    block_ops,
    grain_durations,
    grain_ops,
)
from simulator.problems import Problem, make_problem, recorded_text
from simulator.protocols import make_protocol
from simulator.protocols.base import GROUPED, MEMBER, Protocol
from simulator.rules import LR_FACTORS, mean_step
from simulator.scenario import Scenario, scenario_to_toml
from simulator.timing import GRAD, IDLE, READ, WRITE, DurationSource, SampledSource
from simulator.trace import Trace
from simulator.update import Update
from simulator.view import SerializedView

__all__ = ["Engine", "Update", "simulate"]


def _ends(end: int, durations: list[int]) -> list[int]:
    """The end of each of consecutive actions of ``durations`` that ended at ``end``."""
    if len(durations) == 1:
        return [end]
    ends = list(itertools.accumulate(durations, initial=end - sum(durations)))
    return ends[1:]


class Engine:
    """Runs one scenario to completion and returns its trace.

    What protocols and hardware models may use: ``scenario``, ``problem``, ``threads``,
    ``env``, ``clock`` (each thread's own, which may run ahead of simpy's), ``mem``,
    ``source``, ``completed``, ``started``, ``lost`` (per uid: its stores overwritten),
    ``dense_ops``, ``sparse``, ``replayed``, ``own_cores``, ``stores`` (the write mode,
    which a protocol's ``setup`` may wrap; a write it marks ``discard`` stores nothing and
    gets a row with step 0), and the methods ``advance``, ``catch_up``, ``skip_holds`` and
    ``discard``. Its ``ledger`` (``simulator.ledger``)
    keeps the completions and the trace rows; set ``ledger.progress`` to follow a run.
    A protocol that owns its threads' loop (model-parallel stages) drives the same phases
    itself: ``begin`` an update, spend its ``idle`` work, ``hold`` before each phase (sit out
    what holds the thread), ``read``, ``gradient`` and ``write`` it, ``wait`` for an event,
    and complete it through ``ledger``. (``active`` then holds a stage's latest update.)

    ``choose`` puts a scheduler in place of durations (``simulator.schedule``). A caller
    that runs one scenario many times passes it written as TOML (``text``) and says it has
    already checked it (``checked``: ``simulator.budget.preflight``).

    Raises:
        ScenarioError: a value that only the built problem can check (``run.blocks`` > dim),
            or a scenario that cannot run on this machine (``simulator.budget.preflight``).
    """

    def __init__(self, scenario: Scenario, problem: Problem | None = None,
                 source: DurationSource | None = None, lookahead: bool = True,
                 choose: Callable[[list[int]], int] | None = None,
                 text: str | None = None, checked: bool = False) -> None:
        if not checked:
            preflight(scenario)
        if choose is not None:
            refuse_unscheduled(scenario)
        self.scenario = scenario
        self.problem = problem if problem is not None else make_problem(scenario.problem)
        self._text = text if text is not None else recorded_text(scenario, problem)
        run = scenario.run
        if run.blocks > self.problem.dim:
            raise ScenarioError("run.blocks", run.blocks,
                                f"must be <= the problem's dimension ({self.problem.dim})")
        self.env = simpy.Environment()
        self.protocol = make_protocol(run.protocol, scenario)
        self.protocol.bind(self.problem)
        self._stops = type(self.protocol).active is not Protocol.active  # may stop a thread
        self.threads = self.protocol.threads(run)
        self.lr, self.updates = run.lr, run.updates
        self._setup_memory()
        self.source = source if source is not None else SampledSource(
            scenario, self.threads, self.problem.n_samples, self._dense_fractions,
            self.protocol.network, self.problem.dim, self.protocol.grad_work,
            self.protocol.latency)
        self.replayed = not isinstance(self.source, SampledSource)
        self.label = "simulated" if choose is None else "scheduled"  # the trace's source
        metrics = scenario.metrics
        self.view = SerializedView(self.problem, self.lr, self.mem.w.copy(), run.updates,
                                   metrics.exact and self.protocol.exact_view, metrics.every,
                                   metrics.curve_points)
        self._cores, self._bus = resources(self.env, scenario, self.threads)
        self.own_cores = all(c is None and b is None for c, b in zip(self._cores, self._bus,
                                                                     strict=True))
        self._setup_injection()
        self._setup_threads()
        self._setup_hardware(lookahead, choose)
        self.protocol.setup(self)

    # -- setup -------------------------------------------------------------------------------

    def _setup_memory(self) -> None:
        """The shared vector, its write mode and the blocks a dense update moves."""
        run = self.scenario.run
        self.atomic = run.write_mode == "atomic_add" or self.protocol.atomic
        self.mem = SharedMemory(self.problem.initial(), run.blocks,
                                self.protocol.bounds(self.problem))
        self.lost = [0] * run.updates  # stores of each update (by uid) that were overwritten
        self.stores: WriteMode = (AtomicAdd(self.mem) if self.atomic
                                  else LoadStore(self.mem, self.lost))
        self.dense_ops, self._dense_fractions = self._block_ops(None)
        # load_store writes swept grain by grain (run.store_grain): the pieces of a dense
        # update, cut once.
        self._grain = 0 if self.atomic else run.store_grain
        self._dense_grains = grain_ops(self.dense_ops, self._grain) if self._grain else None
        self.sparse = self.problem.sparse and not self.protocol.dense
        self._dense_grad = self.problem.sparse and self.protocol.dense
        # The learning-rate schedule the engine applies at a write's start (a protocol that
        # applies it elsewhere, as a server on arrival, sets it to None in its setup).
        self.schedule = LR_FACTORS.get(run.lr_schedule)

    def _setup_injection(self) -> None:
        """Injected errors, drops, delays (snapshots w_t of the last completions) and
        pauses."""
        inject = self.scenario.inject
        self.injector = (Injector(inject, self.scenario.run.seed, self.threads,
                                  self.view.w_star) if inject.active else None)
        if inject.write_bits:
            self.mem.quantize = self.injector.quantize if self.injector else None
        self._delays = self.injector is not None and self.injector.max_delay > 0
        self._pauses = Pauses(inject, self.threads)

    def _setup_threads(self) -> None:
        """Each thread's clock, quota, local copy, and the run's records."""
        run = self.scenario.run
        # Updates each thread may start: all of T (shared), or its even share.
        self._quota = ([run.updates // self.threads + (thread < run.updates % self.threads)
                        for thread in range(self.threads)] if run.split == "even"
                       else [run.updates] * self.threads)
        self.started = 0
        self.clock = [0] * self.threads
        self.active: dict[int, Update] = {}
        self.dead: list[int] = []
        self._local = [np.zeros(self.problem.dim) for _ in range(self.threads)]
        self._pulled = [(0, 0)] * self.threads  # (completions, version) of each thread's read
        self.ledger = Ledger(self.mem, self.view, self.dense_ops, self.active,
                             self.scenario.inject.max_delay, self.protocol.partial)

    def _setup_hardware(self, lookahead: bool,
                        choose: Callable[[list[int]], int] | None) -> None:
        """The hardware models the scenario switches on, per thread the hooks to call, and
        the threads' clocks. A thread runs ahead of simpy's clock only when every model
        allows it and it waits for no core, bus, pause or slice. With ``choose`` a scheduler
        decides who acts at each step instead of durations (``simulator.clock.Scheduled``)."""
        machine = build(self)
        models = machine.models
        self._writer, self._sweeping = machine.writer, machine.sweeping
        if machine.mode is not None:
            self.stores = machine.mode
        self.lookahead = lookahead and all(m.lookahead for m in models)
        threads = range(self.threads)
        self._drawn = machine.hooks("drawn", self.threads)
        self._holds = [([self._pauses.hold] if self._pauses.paused(t) else []) + holds
                       for t, holds in zip(threads, machine.hooks("hold", self.threads),
                                           strict=True)]
        self._stretch = machine.hooks("stretch", self.threads)
        self._phase_hooks = machine.hooks("phase", self.threads)
        self._overruns = machine.hooks("overrun", self.threads)
        self._copied_hooks = machine.hooks("copied", self.threads)
        self.ledger.hooks = [m.row for m in models if overrides(m, "row")]
        self._models = models
        self._coupled = [self.source.coupled(t) for t in threads]
        # Threads whose phase durations are redrawn or changed as each phase starts.
        self._reshaped = [coupled or bool(phase) for coupled, phase
                          in zip(self._coupled, self._phase_hooks, strict=True)]
        clocks = (Clocks(self.env, self.clock, self._cores, self._bus, self._holds,
                         self._stretch, self.lookahead) if choose is None
                  else Scheduled(self.env, self.clock, choose))
        self._clocks, self._points = clocks, clocks.points
        # Under a scheduler a load_store write's load is an action of its own.
        self._load = (clocks.load if clocks.loads and isinstance(self.stores, LoadStore)
                      else None)
        self._advance, self.advance, self._spent = clocks.advance, clocks.spend, clocks.spent
        self.skip_holds, self.catch_up, self._hold_point = (clocks.skip_holds, clocks.catch_up,
                                                            clocks.hold_point)
        self._uninterrupted, self.wait = clocks.uninterrupted, clocks.gate
        # Threads that wait for a core or a bus start a phase once they hold them.
        self._pooled, self._seize = clocks.pooled, clocks.seize

    def _block_ops(self, support: np.ndarray | None) -> tuple[list[Op], list[float]]:
        """The blocks a sample moves, and the fraction of all coordinates each moves."""
        ops = block_ops(self.mem.bounds, support)
        dim = self.problem.dim
        return ops, [(op[2].stop - op[2].start) / dim for op in ops]

    def _durations(self, thread: int, phase: int, u: Update, drawn: list[int]) -> list[int]:
        """The durations of ``phase``'s actions as it starts: drawn now for coupled threads,
        then changed by the hardware models (interference, shared lines)."""
        if self._coupled[thread]:
            drawn = self.source.at(thread, phase, self.clock[thread])
        for hook in self._phase_hooks[thread]:
            drawn = hook(thread, phase, u, drawn)
        return drawn

    def _overrun(self, thread: int) -> Generator[Any, Any, int]:
        """At a phase's end: the time the hardware models added to it."""
        extra = 0
        for hook in self._overruns[thread]:
            extra += yield from hook(thread)
        return extra

    # -- the loop: read, compute, write, with the protocol's gates ---------------------------

    def _thread(self, thread: int) -> Generator[Any, Any, None]:
        try:
            yield from (self.protocol.loop(self, thread) if self.protocol.owns_loop
                        else self._loop(thread))
        except simpy.Interrupt:  # an injected death: abandon the update in flight
            self._clocks.release(thread)
            self.active.pop(thread, None)
            self.dead.append(thread)
            for model in self._models:
                model.died(thread)
        self.source.done(thread)
        finished = max(self.clock[thread], int(self.env.now))
        for model in self._models:
            model.finished(thread, finished)

    def _loop(self, thread: int) -> Generator[Any, Any, None]:
        """The update loop of one thread; the protocol's gates around each phase."""
        protocol, seq = self.protocol, 0
        gated, reshaped, points = protocol.gated, self._reshaped[thread], self._points[thread]
        while self._may_start(thread, seq):
            u = self._begin(thread, seq)
            seq += 1
            if u.idle_ns or reshaped:
                yield from self.idle(thread, u)
            if points or gated:
                yield from self._enter(thread, u, protocol.before_read if gated else None,
                                       again=True)
            if u.read:
                yield from self.read(thread, u)
            else:  # gradients accumulated on the vector this thread read last
                u.read_start = u.read_end = self.clock[thread]
                u.start_completed, u.delay = self._pulled[thread]
            if gated:
                yield from self.catch_up(thread)
                protocol.after_read(self, u)
            if points:
                yield from self._hold_point(thread)
            yield from self.gradient(thread, u)
            if points or gated:
                yield from self._enter(thread, u, protocol.before_write if gated else None)
                u.write_start = self.clock[thread]
                if u.role == MEMBER:  # a group's writer completes this update
                    continue
                if u.discard:
                    self.discard(u)
                    protocol.after_write(self, u)
                    continue
            yield from self.write(thread, u)
            if u.discard:  # thrown away as it arrived (the protocol's write mode)
                self.ledger.discard(u, wrote=True)
            elif u.role == GROUPED:
                self.ledger.complete_group(u)
            else:
                self.ledger.complete(u)
            if gated:
                yield from self.catch_up(thread)
                protocol.after_write(self, u)
        if gated:
            yield from self.catch_up(thread)
            protocol.finish(self, thread)

    def _enter(self, thread: int, u: Update,
               gate: Callable[[Engine, Update], simpy.Event | None] | None,
               again: bool = False) -> Generator[Any, Any, None]:
        """A phase of ``u`` begins: sit out what holds the thread (under a scheduler: wait
        to be chosen), then pass the protocol's ``gate``, asked at that moment; a gate that
        made the thread wait sends it back to what holds it. With ``again`` (a read's gate)
        it is asked again when the thread comes back, since what it decided (the round a
        read belongs to) may have moved on meanwhile."""
        if self._points[thread]:
            yield from self._hold_point(thread)
        while gate is not None:
            yield from self.catch_up(thread)
            event = gate(self, u)
            if event is None:
                return
            waits = not event.triggered
            yield from self.wait(thread, event)
            if not (waits and self._points[thread]):
                return
            yield from self._hold_point(thread)
            if not again:
                return

    def _may_start(self, thread: int, seq: int) -> bool:
        """Whether ``thread`` starts its ``seq``-th update."""
        return (self.started < self.updates and seq < self._quota[thread]
                and (not self.replayed or self.source.remaining(thread) != 0)
                and (not self._stops or self.protocol.active(self, thread)))

    def _begin(self, thread: int, seq: int) -> Update:
        """Draw the next update's sample and durations."""
        sample = self.source.next_sample(thread)
        if self.sparse:
            ops, fractions = self._block_ops(self.problem.support(sample))
        else:
            ops, fractions = self.dense_ops, self._dense_fractions
        return self.begin(thread, seq, sample, ops, fractions)

    def begin(self, thread: int, seq: int, sample: int, ops: list[Op],
              fractions: list[float]) -> Update:
        """Start ``thread``'s ``seq``-th update, of ``sample`` moving ``ops`` (each a
        fraction of the coordinates): its durations drawn, counted as started."""
        u = Update(self.started, thread, seq, sample, ops)
        u.read_ns, u.grad_ns, u.write_ns = self.source.durations(thread, fractions)
        u.idle_ns = self.source.idle(thread)
        for hook in self._drawn[thread]:
            hook(thread, u)
        self.started += 1
        self.active[thread] = u
        return u

    def hold(self, thread: int) -> Generator[Any, Any, None]:
        """Before a phase: sit out what holds the thread (a pause, a time slice), on simpy's
        clock, where anything can hold it."""
        if self._points[thread]:
            yield from self._hold_point(thread)

    def idle(self, thread: int, u: Update) -> Generator[Any, Any, None]:
        """Local work before the update (sampling, bookkeeping)."""
        if self._reshaped[thread]:
            u.idle_ns = self._durations(thread, IDLE, u, [u.idle_ns])[0]
        if u.idle_ns:
            wait = self._advance(thread, u.idle_ns, False)
            if wait is not None:
                yield wait
                self.clock[thread] = int(self.env.now)
            if self._overruns[thread]:
                u.idle_ns += yield from self._overrun(thread)

    def read(self, thread: int, u: Update) -> Generator[Any, Any, None]:
        """READ: each block is copied when its read ends (so a read can be torn)."""
        clock, mem, local = self.clock, self.mem, self._local[thread]
        if self._pooled[thread]:
            yield from self._seize(thread, True)
        u.read_start, u.start_completed = clock[thread], self.completed
        if self._reshaped[thread]:
            u.read_ns = self._durations(thread, READ, u, u.read_ns)
        ops, n = u.ops, len(u.ops)
        u.start_versions = (mem.count.copy() if ops is self.dense_ops
                            else [mem.count[op[0]] for op in ops])
        if self._delays:  # the gradient will see w as it was τ completions before
            u.delay = min(self.injector.delay(thread), u.start_completed)  # type: ignore[union-attr]
            past = self.ledger.history[-1 - u.delay]
        overruns, copied = self._overruns[thread], self._copied_hooks[thread]
        i = 0
        while i < n:
            run = self._uninterrupted(thread, u.read_ns, i) if n > 1 else i
            if run > i:  # (never with models that follow every copy: no lookahead)
                mem.copy_run(ops[i:run], local)
                u.copied.extend(_ends(clock[thread], u.read_ns[i:run]))
                i = run
                continue
            block, index = ops[i][0], ops[i][1]
            wait = self._advance(thread, u.read_ns[i], True, block, ops[i - 1][0] if i else -1)
            if wait is not None:
                yield wait
                clock[thread] = int(self.env.now)
            if overruns and i == n - 1:
                extra = yield from self._overrun(thread)
                if extra:
                    u.read_ns = [*u.read_ns[:-1], u.read_ns[-1] + extra]
            mem.copy(index, local)
            u.copied.append(clock[thread])
            for hook in copied:
                hook(thread, block, index, local, clock[thread])
            i += 1
        u.read_end = clock[thread]
        if self._delays:
            np.copyto(local, past)
        self._pulled[thread] = (u.start_completed, u.delay)

    def serve(self, pool: Pool) -> None:
        """Block transfers hold their server in ``pool`` (a protocol's ``setup``: the
        parameter server's pool)."""
        self._clocks.serve(pool)

    def read_copy(self, thread: int) -> np.ndarray:
        """The vector ``thread``'s update in flight read (its local copy)."""
        return self._local[thread]

    def gradient(self, thread: int, u: Update) -> Generator[Any, Any, None]:
        """GRADIENT: the real gradient at the local copy, holding the device."""
        if self._pooled[thread]:
            yield from self._seize(thread, False)
        u.grad_start = self.clock[thread]
        if self._reshaped[thread]:
            u.grad_ns = self._durations(thread, GRAD, u, [u.grad_ns])[0]
        wait = self._advance(thread, u.grad_ns, False)
        if wait is not None:
            yield wait
            self.clock[thread] = int(self.env.now)
        if self._overruns[thread]:
            u.grad_ns += yield from self._overrun(thread)
        u.step = self._step(thread, u)
        u.grad_end = u.write_start = self.clock[thread]

    def _step(self, thread: int, u: Update) -> np.ndarray:
        """lr·g at the thread's local copy (with any injected error), or the protocol's own
        computation; draws whether the write will be dropped."""
        local, injector = self._local[thread], self.injector
        if self.protocol.computes:
            step = self.protocol.compute(self, u, local)
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
        return step

    def _rule(self, thread: int, u: Update) -> None:
        """The step ``u`` applies: the protocol's update rule, a group's mean, the learning
        rate schedule."""
        if self.protocol.rule:
            u.step = self.protocol.step(self, u, u.step, self._local[thread])
        if u.role == GROUPED:
            u.step = self.protocol.grouped(self, u, mean_step([m.step for m in u.group]))
        if self.schedule is not None:
            factor = self.schedule(self.completed + 1)
            u.step = u.step * factor
            u.lr_scale *= factor

    def write(self, thread: int, u: Update) -> Generator[Any, Any, None]:
        """WRITE: the step the update rule gives (``_rule``), then block by block (or grain
        by grain), as the write mode says; a hardware model may write the blocks itself
        (convoys)."""
        clock = self.clock
        if self._pooled[thread]:  # the write begins when it holds its core and bus
            yield from self._seize(thread, True)
            u.write_start = clock[thread]
        self._rule(thread, u)
        if self._reshaped[thread]:
            u.write_ns = self._durations(thread, WRITE, u, u.write_ns)
        n = len(u.ops)
        if u.dropped:  # lost in transit: its time passes, nothing is stored
            wait = self._advance(thread, sum(u.write_ns), True)
            if wait is not None:
                yield wait
                clock[thread] = int(self.env.now)
            u.write_ns = self._spent(u.write_ns)  # under a scheduler: one step
            n = 0
        if self._writer is not None and n:
            yield from self._writer.write(thread, u, u.step)
            n = 0
        writes: Sequence[Grain] = u.ops
        write_ns = u.write_ns
        if self._grain and n:
            writes, write_ns = self._grains(u)
            n = len(writes)
        if n:
            yield from self._store(thread, u, writes, write_ns)
        u.write_end = clock[thread]

    def _store(self, thread: int, u: Update, writes: Sequence[Grain],
               write_ns: list[int]) -> Generator[Any, Any, None]:
        """Write ``writes`` in turn; runs that nothing can interleave with land at once."""
        clock, mem, mode, step = self.clock, self.mem, self.stores, u.step
        sweeping = self._sweeping if not self._grain else None  # (grains land as they sweep)
        overruns, n, i = self._overruns[thread], len(writes), 0
        while i < n:
            run = self._uninterrupted(thread, write_ns, i) if mode.runs else i
            if run > i:
                mem.write_run(writes[i:run], step, u.uid, self.atomic)
                u.stored.update(zip([piece[0] for piece in writes[i:run]],
                                    _ends(clock[thread], write_ns[i:run]), strict=True))
                i = run
                continue
            block, index, vsel, touched = writes[i]
            if self._pooled[thread]:  # the load is made once the write runs
                yield from self._seize(thread, True)
            lead = 0
            if self._load is not None:
                yield self._load(thread)
                clock[thread] = int(self.env.now)
            elif mode.leads:  # a server's shard: loaded once its transfer has passed
                lead = min(mode.lead(u, i), write_ns[i])
                if lead:  # (the places seized stay held; a pause begun meanwhile holds the load)
                    clock[thread] += lead
                    yield from self._hold_point(thread)
            begun = mode.begin(u, block, index, clock[thread], write_ns[i] - lead)
            if sweeping is not None:
                writing = sweeping.enter(block, Writing(
                    u, clock[thread], clock[thread] + write_ns[i] - lead, step[vsel],
                    mode.lost_of(block)))
            wait = self._advance(thread, write_ns[i] - lead, True, block,
                                 writes[i - 1][0] if i else -1)
            if wait is not None:
                yield wait
                clock[thread] = int(self.env.now)
            i += 1
            if sweeping is not None:
                sweeping.leave(block, writing)
            if overruns and i == n:
                extra = yield from self._overrun(thread)
                if extra:
                    u.write_ns = [*u.write_ns[:-1], u.write_ns[-1] + extra]
            mode.end(u, block, index, touched, begun, step[vsel])
            u.stored[block] = clock[thread]

    def _grains(self, u: Update) -> tuple[list[Grain], list[int]]:
        """``u``'s writes as grains of ``run.store_grain`` coordinates, each taking its share
        of its block's write duration (integer ns that add up to the block's)."""
        pieces, counts = (self._dense_grains if u.ops is self.dense_ops and self._dense_grains
                          else grain_ops(u.ops, self._grain))
        return pieces, grain_durations(u.write_ns, counts)

    # -- the run ------------------------------------------------------------------------------

    @property
    def completed(self) -> int:
        """Write completions so far (the serialized view's t)."""
        return self.ledger.completed

    def discard(self, u: Update) -> None:
        """A gradient the protocol threw away: a row with step 0, no completion."""
        self.ledger.discard(u)

    def run(self) -> Trace:
        """Run every thread until T updates have started and every thread has stopped (or
        nothing can happen any more: threads waiting on a dead one); return the trace."""
        processes = [self.env.process(self._thread(thread)) for thread in range(self.threads)]
        start_deaths(self.env, self.scenario, processes)
        self._clocks.start()
        # A run that diverges (a step too large) carries inf and NaN through the same math:
        # recorded as they are and reported as ``diverged_at`` in its summary, not warned
        # about at every operation.
        with np.errstate(all="ignore"):
            self.env.run()
            self.ledger.finish()
        extras = {"dead_threads": np.asarray(sorted(self.dead), dtype=np.int64),
                  **self.protocol.report()}
        for model in self._models:
            extras.update(model.report())
        text = self._text if self._text is not None else scenario_to_toml(self.scenario)
        return self.ledger.trace(text, self.problem.initial(), self.lost, extras, self.label)


def simulate(scenario: Scenario, problem: Problem | None = None,
             source: DurationSource | None = None, lookahead: bool = True) -> Trace:
    """Run ``scenario`` (optionally on a prebuilt problem or a replay source).

    ``lookahead=False`` sends every action through simpy; the result is identical (tested),
    only slower.
    """
    return Engine(scenario, problem, source, lookahead).run()
