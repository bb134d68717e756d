"""The threads' clocks over simpy's: when each action of a thread ends, and whether anything
can happen before it does.

Each thread keeps its own clock, which may run ahead of simpy's: an action that ends strictly
before the next scheduled event (``env.peek()``) cannot be interleaved with anything, so it is
applied at once, exactly as if its timeout had fired. Threads that wait for cores or a bus,
for what holds them (a pause, the time slices they sit out), and protocol gates always go
through simpy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import NORMAL, EventPriority
from simpy.resources.resource import Request

from simulator.errors import ScenarioError
from simulator.scenario import plain

_LAST = EventPriority(NORMAL + 1)  # the scheduler's: after every event of its step

if TYPE_CHECKING:
    from simulator.scenario import Scenario

__all__ = ["Clocks", "Pool", "Scheduled", "refuse_unscheduled", "resources"]

Hold = Callable[[int, int], int]
Place = tuple[simpy.Resource, Request]  # a pool and the request for a place in it
Stretch = Callable[[int, int, int], int]


def resources(env: simpy.Environment, scenario: Scenario, threads: int,
              ) -> tuple[list[simpy.Resource | None], list[simpy.Resource | None]]:
    """Per thread: its device's core pool (when threads outnumber cores and the device does
    not slice time) and bus; None where there is none to wait for."""
    per_device = [0] * len(scenario.devices)
    for thread in range(threads):
        per_device[scenario.device_of(thread)] += 1
    pools = [simpy.Resource(env, d.cores)
             if 0 < d.cores < n and scenario.hardware_of(i).time_slices is None else None
             for i, (d, n) in enumerate(zip(scenario.devices, per_device, strict=True))]
    buses = [simpy.Resource(env, d.bus) if d.bus > 0 else None for d in scenario.devices]
    devices = [scenario.device_of(t) for t in range(threads)]
    return [pools[d] for d in devices], [buses[d] for d in devices]


class Pool:
    """Servers that each serve one shard transfer at a time (``paramserver.servers``): a
    pull or push sends each server its shards as one message, which is in flight for the
    thread's link's ``latency`` before its first shard asks for the server (``of_block``);
    each shard's transfer then holds the server for its duration (stretched by its thread's
    preemption), so the transfers one server receives queue; a lost push's message only
    flies. ``busy`` and ``waited`` sum, per server, the time it served and the time
    transfers waited for it."""

    def __init__(self, env: simpy.Environment, servers: int, of_block: list[int],
                 latency: list[int]) -> None:
        self.places = [simpy.Resource(env, 1) for _ in range(servers)]
        self.of_block, self.latency = of_block, latency
        self.busy = [0] * servers
        self.waited = [0] * servers
        self.queued: list[Request | None] = [None] * len(latency)  # per thread, waiting


class Clocks:
    """Per thread: its clock (``now``), its device's core pool and bus (None: none to wait
    for), what holds it and what stretches its actions (preemption); ``lookahead`` false
    sends every action through simpy. ``loads``: a ``load_store`` write's load is an action
    of its own (``load``), as under a scheduler."""

    loads = False

    def __init__(self, env: simpy.Environment, now: list[int],
                 cores: list[simpy.Resource | None], bus: list[simpy.Resource | None],
                 holds: list[list[Hold]], stretch: list[list[Stretch]],
                 lookahead: bool) -> None:
        self.env, self.now, self.lookahead = env, now, lookahead
        self._cores, self._bus, self._holds, self._stretch = cores, bus, holds, stretch
        # Threads that wait for no core, bus, pause or slice: their clock only moves.
        self._plain = [core is None and b is None and not held
                       for core, b, held in zip(cores, bus, holds, strict=True)]
        self._free = [lookahead and plain for plain in self._plain]
        # Threads that may run ahead of simpy's clock now (not while others woken by the
        # same event have still to run: ``gate``).
        self._ahead = [lookahead] * len(now)
        # Threads that stop at a hold point before each phase (``hold_point``).
        self.points = [bool(held) for held in holds]
        # Threads that wait for a core or a bus (``seize``), and the places each holds
        # between ``seize`` and the ``advance`` of the action they were taken for.
        self.pooled = [core is not None or b is not None for core, b in zip(cores, bus,
                                                                            strict=True)]
        self._seized: list[list[Place] | None] = [None] * len(now)
        self._pool: Pool | None = None

    def serve(self, pool: Pool) -> None:
        """Block transfers hold their server in ``pool`` (set before the run starts): every
        thread's actions go through simpy."""
        self._pool = pool
        self._plain = [False] * len(self.now)
        self._free = [False] * len(self.now)

    def start(self) -> None:
        """The threads' processes exist: start what drives the clock (nothing here)."""

    def load(self, thread: int) -> simpy.Event:
        """A ``load_store`` write's load as an action of its own (where ``loads``)."""
        raise NotImplementedError

    def advance(self, thread: int, duration: int, transfer: bool, block: int = -1,
                after: int = -1) -> simpy.Event | None:
        """Spend ``duration`` ns on one action (a block transfer when ``transfer``: of
        ``block``, after the transfer of block ``after`` in the same read or write, −1 for
        its first); the event to wait for, or ``None`` if the action completes without
        anything else happening first."""
        env = self.env
        if not self._plain[thread]:
            served = None
            if self._pool is not None and transfer:
                if block < 0:  # a push lost in transit: its flight passes, no server
                    duration += self._pool.latency[thread]
                else:
                    served = self._served(thread, block, after)
            seized = self._seized[thread]
            if seized is not None:  # the places are taken: the action runs now
                self._seized[thread] = None
                return env.process(self._hold(duration, seized, served))
            if self._holds[thread]:
                self.skip_holds(thread)
                if served is None:  # (a served transfer stretches once its server takes it)
                    for stretch in self._stretch[thread]:
                        duration = stretch(thread, self.now[thread], duration)
            core = self._cores[thread]
            bus = self._bus[thread] if transfer else None
            if core is not None or bus is not None or served is not None:
                return env.process(self._take(self.now[thread] - int(env.now), duration,
                                               (core, bus), served))
        end = self.now[thread] = self.now[thread] + duration
        if self._ahead[thread]:
            if end < env.peek():
                return None
        elif self.lookahead:  # it waits once: the others woken with it have run by then
            self._ahead[thread], self._free[thread] = True, self._plain[thread]
        return simpy.Timeout(env, end - env.now)

    def spent(self, durations: list[int]) -> list[int]:
        """The durations the trace records for ``durations`` spent as one action (an
        :meth:`advance` of their sum, as a dropped write is): these durations."""
        return durations

    def spend(self, thread: int, duration: int, transfer: bool) -> Generator[Any, Any, None]:
        """:meth:`advance`, waiting for its event when there is one."""
        wait = self.advance(thread, duration, transfer)
        if wait is not None:
            yield wait
            self.now[thread] = int(self.env.now)

    def skip_holds(self, thread: int) -> bool:
        """Move the thread's clock past what holds it: its next action starts when nothing
        does. Whether the clock moved."""
        holds = self._holds[thread]
        if not holds:
            return False
        before = t = self.now[thread]
        while True:
            moved = t
            for hold in holds:
                t = hold(thread, t)
            if t == moved:
                break
        self.now[thread] = t
        return t != before

    def hold_point(self, thread: int) -> Generator[Any, Any, None]:
        """Before a phase: sit out what holds the thread, on simpy's clock (so the phase
        sees every completion that happened meanwhile)."""
        self.skip_holds(thread)
        yield from self.catch_up(thread)

    def uninterrupted(self, thread: int, durations: list[int], start: int) -> int:
        """End of the longest run of block actions from ``start`` that all end before the next
        scheduled event (so nothing can come between them); the thread's clock moves to the
        run's end. Returns ``start`` when the thread waits on resources or lookahead is off."""
        if not self._free[thread]:
            return start
        horizon, end, stop, n = self.env.peek(), self.now[thread], start, len(durations)
        while stop < n and end + durations[stop] < horizon:
            end += durations[stop]
            stop += 1
        self.now[thread] = end
        return stop

    def seize(self, thread: int, transfer: bool) -> Generator[Any, Any, None]:
        """Before an action that touches shared memory as it starts (a read's start, a
        write's load): take the thread's core (and its bus for a ``transfer``) first, so the
        action starts when it runs; the next :meth:`advance` holds them for its duration.
        Nothing to do for a thread that waits for no core or bus, or already holds them."""
        core, bus = self._cores[thread], self._bus[thread] if transfer else None
        if (core is None and bus is None) or self._seized[thread] is not None:
            return
        if self._holds[thread]:
            self.skip_holds(thread)
        seized = self._seized[thread] = []
        yield from self._request(self.now[thread] - int(self.env.now), (core, bus), seized)
        self.now[thread] = int(self.env.now)

    def release(self, thread: int) -> None:
        """The thread stops (an injected death): give back the places it seized, and take
        back a transfer still waiting for its server (it never reaches it)."""
        for pool, request in self._seized[thread] or ():
            if request.triggered:
                pool.release(request)
            else:
                request.cancel()
        self._seized[thread] = None
        queued = self._pool.queued[thread] if self._pool is not None else None
        if queued is not None and not queued.triggered:
            queued.cancel()

    def _served(self, thread: int, block: int, after: int) -> tuple[int, int, int]:
        """A block transfer's thread, its server in the pool, and how long its message is in
        flight before it asks for the server: the latency, on the first block of a server's
        message (the first, or after a block of another server)."""
        servers = self._pool
        assert servers is not None
        server = servers.of_block[block]
        first = after < 0 or servers.of_block[after] != server
        return thread, server, servers.latency[thread] if first else 0

    def _take(self, lag: int, duration: int, pools: tuple[simpy.Resource | None, ...],
              served: tuple[int, int, int] | None = None) -> Generator[Any, Any, None]:
        """Catch up with the thread's clock, take core/bus places, hold them ``duration``
        (and a server for its part: ``_hold``)."""
        requests: list[Place] = []
        yield from self._request(lag, pools, requests)
        yield from self._hold(duration, requests, served)

    def _request(self, lag: int, pools: tuple[simpy.Resource | None, ...],
                 into: list[Place]) -> Generator[Any, Any, None]:
        """Catch up with the thread's clock, ask for a place in each pool (kept in
        ``into``) and wait until every one is granted."""
        if lag:
            yield self.env.timeout(lag)
        into.extend((pool, pool.request()) for pool in pools if pool is not None)
        for _, request in into:
            yield request

    def _hold(self, duration: int, requests: list[Place],
              served: tuple[int, int, int] | None = None) -> Generator[Any, Any, None]:
        """Hold granted places ``duration`` ns, then give them back. A transfer ``served``
        (thread, server, time in flight) holds them while its message is in flight and while
        it waits for its server, then holds the server too for ``duration`` (stretched by
        the thread's preemption from then on)."""
        env, servers = self.env, self._pool
        if served is not None and servers is not None:
            thread, server, flight = served
            if flight:
                yield env.timeout(flight)
            place, asked = servers.places[server], int(env.now)
            request = servers.queued[thread] = place.request()
            yield request
            servers.queued[thread] = None
            for stretch in self._stretch[thread]:
                duration = stretch(thread, int(env.now), duration)
            servers.waited[server] += int(env.now) - asked
            servers.busy[server] += duration
            requests = [*requests, (place, request)]
        yield env.timeout(duration)
        for pool, granted in requests:
            pool.release(granted)

    def catch_up(self, thread: int) -> Generator[Any, Any, None]:
        """Bring simpy's clock up to the thread's (before touching shared simpy state)."""
        lag = self.now[thread] - int(self.env.now)
        if lag:
            yield self.env.timeout(lag)

    def gate(self, thread: int, event: simpy.Event | None) -> Generator[Any, Any, None]:
        """Wait for a protocol's event (if any) and move the thread's clock to simpy's. A
        thread woken with others (a round opening) runs no action ahead until it has waited
        once more: those woken after it act at this instant too, and ``env.peek`` does not
        see them (they are the event's callbacks, not scheduled events)."""
        if event is not None:
            waiters = event.callbacks
            place = len(waiters) if waiters is not None else 0
            yield event
            self.now[thread] = int(self.env.now)
            if waiters is not None and len(waiters) > place + 1 and self.lookahead:
                self._ahead[thread] = self._free[thread] = False


# What says when things happen in time: under a scheduler the schedule does.
_TIMED = ("stragglers", "pauses", "deaths")


def refuse_unscheduled(scenario: Scenario) -> None:
    """Refuse what a scheduler cannot honour: hardware timing models and timed injections.

    Raises:
        ScenarioError: naming the first such field.
    """
    for d in range(len(scenario.devices)):
        for table, spec in vars(scenario.hardware_of(d)).items():
            if spec is not None:
                hint = (" (under a scheduler a read sees part of a write swept grain by grain: "
                        "run.store_grain)" if table == "sweeping_reads" else "")
                raise ScenarioError(f"hardware.{table}", plain(spec), "under a scheduler the "
                                    "schedule is the timing: hardware timing models do not "
                                    f"apply{hint}")
    from simulator.protocols import PROTOCOLS

    if PROTOCOLS[scenario.run.protocol].owns_loop:
        raise ScenarioError("run.protocol", scenario.run.protocol, "under a scheduler the "
                            "schedule is the timing: model-parallel stages, which run loops "
                            "of their own, are not scheduled")
    if scenario.run.protocol == "paramserver" and scenario.paramserver.servers:
        raise ScenarioError("paramserver.servers", scenario.paramserver.servers,
                            "under a scheduler the schedule is the timing: servers' queues "
                            "do not apply")
    for name in _TIMED:
        if getattr(scenario.inject, name):
            raise ScenarioError(f"inject.{name}", plain(getattr(scenario.inject, name)),
                                "under a scheduler the schedule decides when each thread acts")


class _Step(simpy.Event):
    """A thread's next action, waiting to be chosen; once chosen it ends ``after`` steps
    later (0: a hold point, where the phase begins; 1: an action)."""

    __slots__ = ("after",)

    def __init__(self, env: simpy.Environment, after: int) -> None:
        super().__init__(env)
        self.after = after

    def go(self) -> None:
        self._ok, self._value = True, None
        self.env.schedule(self, NORMAL, self.after)


class Scheduled(Clocks):
    """Time counts steps, and a scheduler decides who acts: at each step it picks one of
    the threads waiting to act (``choose(runnable)``, threads in increasing order), whose
    action spans [s, s + 1). Each phase starts at the step its first action is chosen (a
    hold point), so a phase's records (its start, the completions it saw) are those of that
    step; a ``load_store`` write's load is an action of its own (``load``). Threads held by
    a protocol's gate (a lock, a barrier) are not runnable. Durations, cores and buses play
    no part: the schedule is the timing."""

    def __init__(self, env: simpy.Environment, now: list[int],
                 choose: Callable[[list[int]], int]) -> None:
        threads = len(now)
        super().__init__(env, now, [None] * threads, [None] * threads,
                         [[] for _ in now], [[] for _ in now], False)
        self.points = [True] * threads
        self.choose = choose
        self._waiting: dict[int, _Step] = {}
        self._chosen = [False] * threads  # chosen at a hold point: its next action is due

    def start(self) -> None:
        self._next(0)

    def _next(self, delay: int) -> None:
        """Choose ``delay`` steps from now, after every other event of that step (a lower
        priority than simpy's own: whatever the step's actions set off happens first)."""
        wake = simpy.Event(self.env)
        wake.callbacks.append(self._choose)
        wake._ok, wake._value = True, None
        self.env.schedule(wake, _LAST, delay)

    def _choose(self, _: simpy.Event) -> None:
        """Nothing else can happen at this step: pick the thread that acts."""
        waiting = self._waiting
        if not waiting:
            return  # every thread done (or waiting on one that is)
        thread = self.choose(sorted(waiting))
        waiting.pop(thread).go()
        self._next(1)

    def _action(self, thread: int) -> simpy.Event:
        if self._chosen[thread]:
            self._chosen[thread] = False
            return simpy.Timeout(self.env, 1)
        step = self._waiting[thread] = _Step(self.env, 1)
        return step

    def advance(self, thread: int, duration: int, transfer: bool, block: int = -1,
                after: int = -1) -> simpy.Event:
        return self._action(thread)

    def spent(self, durations: list[int]) -> list[int]:
        """One action takes one step whatever its durations: the trace gives it to the
        first of them (a dropped write: its first block)."""
        return [1] + [0] * (len(durations) - 1) if durations else durations

    loads = True

    def load(self, thread: int) -> simpy.Event:
        """The load of a ``load_store`` write: an action of its own before the store."""
        return self._action(thread)

    def gate(self, thread: int, event: simpy.Event | None) -> Generator[Any, Any, None]:
        """A thread that must wait at a gate gives up its choice: it is chosen again once
        the gate lets it go."""
        if event is not None:
            if not event.triggered:
                self._chosen[thread] = False
            yield event
            self.now[thread] = int(self.env.now)

    def hold_point(self, thread: int) -> Generator[Any, Any, None]:
        if not self._chosen[thread]:
            step = self._waiting[thread] = _Step(self.env, 0)
            yield step
            self.now[thread] = int(self.env.now)
            self._chosen[thread] = True
