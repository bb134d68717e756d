"""Passing writes: writes of one block that meet keep their own durations and each lands
whole at its end, less what the meeting lost (``[hardware.passing]``), as two in-place
sweeps on hardware that do not end in lockstep lose a few coordinates or none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.hardware.meetings import Meetings
from simulator.memory import Coords, WriteMode

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import PassingSpec
    from simulator.update import Update

__all__ = ["Flight", "Passing"]


class Flight:
    """One write of a block in flight: who writes, from when to when (as planned at its
    start), how many others it met, and the pair record it is in (None: none, or not a
    pair)."""

    __slots__ = ("end", "met", "pair", "start", "u")

    def __init__(self, u: Update, start: int, end: int) -> None:
        self.u, self.start, self.end = u, start, end
        self.met = 0
        self.pair: list[Any] | None = None  # [leader uid, joiner uid, lag, shares ×2, valid]


class Passing(Meetings, WriteMode):
    """A write mode (``begin``/``end`` around each block's write, as ``memory.LoadStore``)
    for writes that pass each other. A passing write draws its losses as it starts, so no
    run of block writes goes ahead unbroken (``runs`` false)."""

    runs = False

    def __init__(self, engine: Engine, spec: PassingSpec) -> None:
        super().__init__(engine, spec)
        blocks = engine.scenario.run.blocks
        self.flying: list[list[Flight]] = [[] for _ in range(blocks)]
        self.lost: list[dict[int, np.ndarray]] = [{} for _ in range(blocks)]
        self.passed: list[list[Any]] = []

    def begin(self, u: Update, block: int, index: slice, now: int, duration: int) -> Flight:
        """``u`` starts writing ``block`` at ``now`` for ``duration`` ns, passing the writes
        of it in flight: it meets the earliest of them, draws what the meeting loses, and
        counts as a pair with it when neither meets a third."""
        size = index.stop - index.start
        flight = Flight(u, now, now + duration)
        others = [f for f in self.flying[block] if f.end > now]
        if others:
            leader = others[0]  # flights are kept in start order
            front = min(1.0, (now - leader.start) / max(leader.end - leader.start, 1))
            counts = self.losses(leader.u, u, size, front, self.lost[block])
            for other in others:
                other.met += 1
                if other.met > 1 and other.pair is not None:
                    other.pair[5] = False  # a third write met it: no longer a pair
            flight.met = len(others)
            if flight.met == 1 and leader.met == 1:
                flight.pair = leader.pair = [leader.u.uid, u.uid, now - leader.start,
                                             counts[0] / size, counts[1] / size, True]
                self.passed.append(flight.pair)
        self.flying[block].append(flight)
        return flight

    def end(self, u: Update, block: int, index: slice, coords: Coords, flight: Flight,
            step: np.ndarray) -> None:
        """The write lands at its end: its step, less the coordinates it lost."""
        self.flying[block].remove(flight)
        self.land(u, block, index, step, self.lost[block])

    def lost_of(self, block: int) -> dict[int, np.ndarray]:
        """The coordinates each write of ``block`` in flight lost so far (uid → mask)."""
        return self.lost[block]

    def died(self, thread: int) -> None:
        """A dead thread's writes in flight never land."""
        for flights, lost in zip(self.flying, self.lost, strict=True):
            for flight in [f for f in flights if f.u.thread == thread]:
                flights.remove(flight)
                lost.pop(flight.u.uid, None)

    def report(self) -> dict[str, np.ndarray]:
        """The pairs of writes that passed each other."""
        return {"convoy_pairs": np.asarray([p[:5] for p in self.passed if p[5]],
                                           dtype=np.float64).ravel()}
