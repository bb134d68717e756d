"""Time slices: threads that outnumber their device's cores run in turns, as an OS runs
processes (``[hardware.time_slices]``, ``TimeSliceSpec``).

``global`` slicing rotates all the device's threads over its cores; ``per_core`` puts its
j-th thread (in slot order: ``run.placement``) on core j mod cores, where it rotates with the
core's others; a core whose threads finished takes a waiting one, and with ``migrate`` a
balancer moves threads between the cores (``Migrating``, below).

Per-core time slices with a load balancer that moves threads between cores:

With ``devices.slicing = "per_core"`` each core runs its own queue of threads, one time slice
(``quantum`` ns) each in turn; a thread stays on the core it was placed on until it moves.
Linux keeps per-core run queues too, and its load balancer moves waiting processes between
them: with 3 busy processes on 2 cores the one running alone changes
every few tens of milliseconds, and a core whose processes have all finished takes one from a
busier core. ``Migrating`` models that: balancer moves come at exponential intervals of mean
``migrate`` ns, drawn from the device's own stream of the run's seed; a move takes the thread
waiting on the busiest core (most live threads; ties: the lower core) to the least busy one
(ties: the lower core), where it runs from the next slice, whenever the busiest has two
threads or more and at least one more than the least busy (so a move between 2 and 1 swaps
which thread runs alone). With or without ``migrate``, a core left with no threads takes the
waiting thread of the busiest core at the next slice boundary, as an idle Linux CPU pulls
a waiting process at once (measured: docs/fidelity.md).

The queues at each slice follow from the move times and from when threads finished; the
engine learns finish times as the run goes and reports each (``Migrating.finish``), so the
slices after it are worked out again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simulator.hardware.base import Hardware

if TYPE_CHECKING:
    from simulator.scenario import Scenario

__all__ = ["Migrating", "TimeSlices"]

_MIGRATE_TAG = 0x316


class Migrating:
    """The per-core queues of one device's ``threads`` (in slot order: the j-th starts on core
    j mod ``cores``) slice by slice, with balancer moves of mean interval ``migrate`` ns."""

    def __init__(self, threads: Sequence[int], cores: int, quantum: int, migrate: int,
                 seed: int, device: int) -> None:
        self.threads, self.cores, self.quantum = list(threads), cores, quantum
        self._rng = np.random.default_rng([seed, _MIGRATE_TAG, device])
        self._mean = float(migrate)
        self._moves: dict[int, int] = {}  # slice boundary → moves that take effect there
        self._next_move = float(self._rng.exponential(self._mean)) if migrate else math.inf
        self._start = [self.threads[core::cores] for core in range(cores)]
        # _queues[s]: per core, its live threads at slice s, the one running first.
        self._queues: list[list[list[int]]] = []
        self._finished: dict[int, float] = {}  # thread → when it finished

    def _moves_at(self, boundary: int) -> int:
        """How many balancer moves take effect at slice ``boundary`` (moves drawn in the
        slice before it act when it ends)."""
        while self._next_move <= boundary * self.quantum:
            at = math.ceil(self._next_move / self.quantum)
            self._moves[at] = self._moves.get(at, 0) + 1
            self._next_move += float(self._rng.exponential(self._mean))
        return self._moves.get(boundary, 0)

    def _advance(self) -> None:
        """Work out the queues of the next slice."""
        finished = self._finished
        s = len(self._queues)
        t = s * self.quantum
        if s == 0:
            queues = [list(q) for q in self._start]
        else:  # each core's runner of the last slice goes to the back of its queue
            queues = [q[1:] + q[:1] for q in self._queues[-1]]
        queues = [[j for j in q if finished.get(j, math.inf) > t] for q in queues]
        while self._move(queues, 2):  # idle cores take waiting threads
            pass
        for _ in range(self._moves_at(s)):
            self._move(queues, 1)
        self._queues.append(queues)

    def _move(self, queues: list[list[int]], apart: int) -> bool:
        """Move the waiting thread of the busiest core to the least busy one, where it runs
        next, if the busiest has two threads or more and ``apart`` more than the least busy.
        """
        sizes = [len(q) for q in queues]
        busiest = max(range(self.cores), key=lambda c: (sizes[c], -c))
        idlest = min(range(self.cores), key=lambda c: (sizes[c], c))
        if sizes[busiest] < 2 or sizes[busiest] - sizes[idlest] < apart:
            return False
        # The waiting thread is the one that did not run in the last slice: after the
        # rotation, the queue's head (a two-thread queue's other thread).
        queues[idlest].insert(0, queues[busiest].pop(0))
        return True

    def finish(self, thread: int, at: float) -> None:
        """``thread`` finished at ``at`` ns: it leaves its queue from the next slice that
        begins at or after ``at``, so the slices from there on are worked out again."""
        self._finished[thread] = at
        del self._queues[max(math.ceil(at / self.quantum), 0):]

    def _through(self, slot: int) -> list[list[int]]:
        """The queues of slice ``slot``, given the finishes reported so far."""
        while len(self._queues) <= slot:
            self._advance()
        return self._queues[slot]

    def runs(self, thread: int, slot: int) -> bool:
        """Whether ``thread`` runs in slice ``slot``."""
        return any(q and q[0] == thread for q in self._through(slot))

    def core_of(self, thread: int, slot: int) -> int | None:
        """The core whose queue holds ``thread`` in slice ``slot``, or None when the thread
        has finished."""
        for core, queue in enumerate(self._through(slot)):
            if thread in queue:
                return core
        return None


def sliced_devices(scenario: Scenario, threads: int) -> dict[int, list[int]]:
    """The devices whose time is sliced, each with its threads: those with a
    ``[hardware.time_slices]`` table and fewer cores than threads (with a core each, no
    thread waits for one)."""
    on: dict[int, list[int]] = {}
    for thread in range(threads):
        on.setdefault(scenario.device_of(thread), []).append(thread)
    return {device: members for device, members in on.items()
            if scenario.hardware_of(device).time_slices is not None
            and 0 < scenario.devices[device].cores < len(members)}


class TimeSlices(Hardware):
    """Threads on time-sliced devices start actions only in their own slices; with
    ``preempt`` a slice's end also stops the action running, which goes on in the thread's
    next slice."""

    def __init__(self, scenario: Scenario, threads: int) -> None:
        # Per sliced thread: (the threads it rotates with, itself included; the cores they
        # share; quantum; the device's per-core queues or None for global slicing).
        self.slices: list[tuple[list[int], int, int, Migrating | None] | None] = [None] * threads
        self.preempts = [False] * threads
        for device, members in sliced_devices(scenario, threads).items():
            spec, cores = (scenario.hardware_of(device).time_slices,
                           scenario.devices[device].cores)
            assert spec is not None
            ordered = sorted(members, key=scenario.slot_of)
            moves = (Migrating(ordered, cores, spec.quantum, spec.migrate, scenario.run.seed,
                               device)
                     if spec.slicing == "per_core" else None)
            for thread in members:
                self.slices[thread] = (ordered if moves else members, cores, spec.quantum,
                                       moves)
                self.preempts[thread] = spec.preempt
        self._finished = [math.inf] * threads  # when each thread's loop ended

    @property
    def active(self) -> bool:
        """Whether some thread's time is sliced."""
        return any(s is not None for s in self.slices)

    def on(self, thread: int) -> bool:
        return self.slices[thread] is not None

    def hold(self, thread: int, t: int) -> int:
        """A thread out of its time slice starts its next action when its next slice
        begins."""
        quantum = self.slices[thread][2]  # type: ignore[index]
        current = t // quantum
        slot = self._running_slot(thread, current)
        return slot * quantum if slot > current else t

    def stretch(self, thread: int, start: int, duration: int) -> int:
        """``duration`` ns of work started at ``start`` on a preemptive device: how long it
        takes with the slices the thread sits out in between (its rotation as known now)."""
        if not self.preempts[thread]:
            return duration
        quantum = self.slices[thread][2]  # type: ignore[index]
        now, left = start, duration
        while True:
            slot = now // quantum
            room = (slot + 1) * quantum - now
            if left <= room:
                return now + left - start
            left -= room
            now = self._running_slot(thread, slot + 1) * quantum

    def _running_slot(self, thread: int, slot: int) -> int:
        """The first time slice from ``slot`` on in which ``thread`` runs."""
        rotation, cores, quantum, moves = self.slices[thread]  # type: ignore[misc]
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

    def core_of(self, thread: int, t: int) -> int | None:
        """The core ``thread`` is on at ``t`` where per-core slices move threads between
        cores (None: not moved, or finished)."""
        sliced = self.slices[thread]
        if sliced is None or sliced[3] is None:
            return None
        return sliced[3].core_of(thread, t // sliced[2])

    def finished(self, thread: int, at: int) -> None:
        self._finished[thread] = at
        sliced = self.slices[thread]
        if sliced is not None and sliced[3] is not None:
            sliced[3].finish(thread, at)
