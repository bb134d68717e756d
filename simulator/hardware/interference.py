"""Interference: a phase runs slower while other threads of its device are in phases that
compete with it (``[hardware.interference]``, ``InterferenceSpec``), as processor sharing."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from simulator.hardware.base import Hardware
from simulator.timing import IDLE, WRITE

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.hardware.convoys import Convoy
    from simulator.update import Update

__all__ = ["Interference", "Slowdowns"]

Slowdowns = tuple[tuple[float, float, float, float], ...]  # [phase][other's phase]


class Interference(Hardware):
    """Per thread: its slowdowns by [phase][other's phase] and the other threads of its
    device; what each thread is doing, from when to when. A starting phase needs every other
    thread's state at its start, so no thread runs ahead of simpy's clock."""

    lookahead = False

    def __init__(self, engine: Engine, under: list[Slowdowns | None]) -> None:
        self.engine = engine
        self.under = under
        devices = [engine.scenario.device_of(t) for t in range(engine.threads)]
        self.peers = [[j for j in range(engine.threads) if j != t and devices[j] == devices[t]]
                      for t in range(engine.threads)]
        self.doing: list[tuple[int, int, int]] = [(IDLE, 0, 0)] * engine.threads
        self.plan: list[list[tuple[float, float]]] = [[] for _ in range(engine.threads)]
        self.fixed = [False] * engine.threads  # writing in a convoy of two or more
        self.writing: list[Convoy | None] = [None] * engine.threads  # alone in a convoy

    @staticmethod
    def slowdowns(engine: Engine) -> list[Slowdowns | None]:
        """Per thread: its device's slowdowns (None: none, or the durations are replayed,
        which carry them already)."""
        scenario = engine.scenario
        specs = [scenario.hardware_of(scenario.device_of(t)).interference
                 for t in range(engine.threads)]
        return [None if engine.replayed or spec is None else spec.slowdowns for spec in specs]

    def on(self, thread: int) -> bool:
        return self.under[thread] is not None

    def phase(self, thread: int, phase: int, u: Update, durations: list[int]) -> list[int]:
        """``thread`` starts ``phase``: its actions' ``durations`` stretched, and the ends of
        the phases the device's other threads are in moved, as processor sharing between
        them says: each phase in progress runs at the rate 1 / (1 + Σ slowdowns under the
        others' phases), from its remaining work, until the first ends, and so on. Ends only
        move later (a new phase only adds slowdowns); a thread whose end moved waits for it
        (``overrun``)."""
        start, work = self.engine.clock[thread], sum(durations)
        going, fixed = self._going(thread, start)
        if work > 0:
            going[thread] = [phase, float(work)]
        plans, ends = self._share(going, fixed, float(start))
        for j, finish in ends.items():
            self._moved(j, thread, phase, start, finish, plans[j])
        if work <= 0:
            self.doing[thread] = (phase, start, start)
            return durations
        total = self.doing[thread][2] - start
        if total != work:
            ratio = total / work
            durations = [int(d * ratio + 0.5) for d in durations]
            durations[-1] += total - sum(durations)
            i = len(durations) - 1
            while durations[i] < 0:  # shares rounded up past the total: the earlier ones give
                durations[i - 1] += durations[i]
                durations[i] = 0
                i -= 1
        return durations

    def _going(self, thread: int, start: int) -> tuple[dict[int, list[float]],
                                                       list[tuple[int, int, int]]]:
        """The phases in progress at ``start`` on the thread's device: work left by thread,
        and convoy members (which end with their convoy) as (thread, phase, end)."""
        going: dict[int, list[float]] = {}
        fixed: list[tuple[int, int, int]] = []
        for j in self.peers[thread]:
            q, begun, end = self.doing[j]
            if begun <= start < end:
                if self.fixed[j]:
                    fixed.append((j, q, end))
                else:
                    going[j] = [q, self._left(j, start)]
        return going, fixed

    def _share(self, going: dict[int, list[float]], fixed: list[tuple[int, int, int]],
               now: float) -> tuple[dict[int, list[tuple[float, float]]], dict[int, float]]:
        """Processor sharing from ``now``: each phase's plan (from when, at what rate) and
        its end."""
        plans: dict[int, list[tuple[float, float]]] = {j: [] for j in going}
        ends: dict[int, float] = {}
        while going:
            running = [(j, int(v[0])) for j, v in going.items()]
            running += [(j, f) for j, f, end in fixed if end > now]
            step, rates = math.inf, {}
            for j, (p, left) in going.items():
                row = self.under[j][int(p)]  # type: ignore[index]
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
        return plans, ends

    def _moved(self, j: int, thread: int, phase: int, start: int, finish: float,
               plan: list[tuple[float, float]]) -> None:
        """Thread ``j``'s phase now ends at ``finish`` (``thread`` starts ``phase``)."""
        q, begun, before = self.doing[j] if j != thread else (phase, start, start)
        self.doing[j] = (q, begun, max(before, round(finish)))
        self.plan[j] = plan
        convoy = self.writing[j]
        if j != thread and convoy is not None:  # a write alone in its convoy
            convoy.end = self.doing[j][2]
            convoy.leader.drawn_write_ns = [convoy.end - convoy.first]

    def _left(self, thread: int, at: int) -> float:
        """The work (ns at full rate) left at ``at`` of the phase ``thread`` is in."""
        plan, end = self.plan[thread], self.doing[thread][2]
        left = 0.0
        for k, (begun, rate) in enumerate(plan):
            until = plan[k + 1][0] if k + 1 < len(plan) else end
            left += rate * max(0.0, min(until, end) - max(begun, at))
        return left

    def overrun(self, thread: int) -> Generator[Any, Any, int]:
        """Wait until the end of the thread's phase, which others' phases moved later;
        returns the time added."""
        engine, extra = self.engine, 0
        while self.doing[thread][2] > engine.clock[thread]:
            wait = self.doing[thread][2] - engine.clock[thread]
            yield engine.env.timeout(wait)
            engine.clock[thread] = int(engine.env.now)
            extra += wait
        return extra

    def convoy_moved(self, thread: int, convoy: Convoy) -> None:
        """With write convoys: a write alone in its convoy is a phase like any other (its
        end, the convoy's, moves with the others'); once writes meet, their end is the
        convoy's and the others' phases no longer move it."""
        convoy.threads.append(thread)
        if convoy.members == 1:
            self.writing[thread] = convoy
            return
        for member in convoy.threads:
            self.writing[member], self.fixed[member] = None, True
            if self.doing[member][0] == WRITE:
                self.doing[member] = (WRITE, self.doing[member][1], convoy.end)

    def left_convoy(self, thread: int) -> None:
        """``thread``'s convoy write ended."""
        self.fixed[thread], self.writing[thread] = False, None
