"""Write convoys: a write that starts while other writes of the same block are in flight
joins them, and all of them end together (``[hardware.convoys]``, ``ConvoySpec``),
as in-place sweeps that meet on hardware end in lockstep and lose element stores."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.errors import ScenarioError
from simulator.hardware.meetings import Meetings
from simulator.hardware.sweeping import Writing
from simulator.scenario import plain

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.hardware.interference import Interference
    from simulator.hardware.sweeping import Sweeping
    from simulator.scenario import ConvoySpec
    from simulator.update import Update

__all__ = ["Convoy", "Convoys"]


class Convoy:
    """The writes of one block in flight together. The front of the sweep moves linearly
    from ``front`` at ``start`` to the block's end at ``end``."""

    __slots__ = ("end", "first", "front", "leader", "lost", "members", "pair", "start",
                 "threads")

    def __init__(self, leader: Update, start: int, end: int) -> None:
        self.leader, self.first, self.start, self.end = leader, start, start, end
        self.front = 0.0
        self.members = 1
        self.lost: dict[int, np.ndarray] = {}  # uid → coordinates of the block it loses
        self.pair: tuple[int, int, int, float, float] | None = None
        self.threads: list[int] = []  # with interference: the threads writing in it


class Convoys(Meetings):
    """Writes every block of an update in convoys (``write``, in place of the engine's
    block writes).

    Raises:
        ScenarioError: interference with more than one block, or threads that wait for a
            core pool or a bus inside a write.
    """

    spec: ConvoySpec

    def __init__(self, engine: Engine, spec: ConvoySpec, interference: Interference | None,
                 sweeping: Sweeping | None) -> None:
        super().__init__(engine, spec)
        if interference is not None and engine.scenario.run.blocks > 1:
            raise ScenarioError("run.blocks", engine.scenario.run.blocks,
                                "write convoys with interference (hardware.interference) "
                                "need run.blocks = 1")
        if not engine.own_cores:
            raise ScenarioError("hardware.convoys", plain(spec),
                                "write convoys need no bus and a core per thread or "
                                "time slices (hardware.time_slices)")
        self.interference, self.sweeping = interference, sweeping
        self.inflight: list[Convoy | None] = [None] * engine.scenario.run.blocks
        self.paired: list[Convoy] = []
        self.drawn_ns: list[int] = []  # each op's drawn write duration, in trace order

    def write(self, thread: int, u: Update, step: np.ndarray) -> Generator[Any, Any, None]:
        """Write ``u``'s blocks in turn, each alone (a new convoy) or joining the writes of
        it in flight; a write that joined late ends ``end_gap``·max(0, lag −
        ``end_catch_up``) after its convoy's end."""
        engine, spec = self.engine, self.spec
        clock, interfered = engine.clock, (self.interference is not None
                                           and self.interference.on(thread))
        drawn = u.drawn_write_ns = u.write_ns
        u.write_ns = []
        for i, (block, index, vsel, _) in enumerate(u.ops):
            if engine.skip_holds(thread):  # a slice that moved the start: simpy catches up
                yield from engine.catch_up(thread)
            begun = clock[thread]
            convoy, duration = self._join(thread, u, block, index, drawn[i])
            tail = round(spec.end_gap * max(0, begun - convoy.first - spec.end_catch_up))
            if self.sweeping is not None:
                writing = self.sweeping.enter(block, Writing(
                    u, begun, 0, step[vsel], lost=convoy.lost, convoy=convoy, tail=tail))
            if interfered:  # alone, its end follows the others; met, the convoy's
                self.interference.convoy_moved(thread, convoy)  # type: ignore[union-attr]
            yield from engine.advance(thread, duration, True)
            while convoy.end + tail > clock[thread]:
                yield engine.env.timeout(convoy.end + tail - clock[thread])
                clock[thread] = int(engine.env.now)
            self.land(u, block, index, step[vsel], convoy.lost)
            u.stored[block] = clock[thread]
            if self.sweeping is not None:
                self.sweeping.leave(block, writing)
            u.write_ns.append(clock[thread] - begun)
            if interfered:
                self.interference.left_convoy(thread)  # type: ignore[union-attr]

    def _join(self, thread: int, u: Update, block: int, index: slice,
              drawn: int) -> tuple[Convoy, int]:
        """``u`` starts writing ``block`` now: alone (a new convoy) or joining the writes in
        flight, whose end it moves; returns the convoy and the write's duration."""
        now = self.engine.clock[thread]
        convoy = self.inflight[block]
        if convoy is None or convoy.end <= now:
            convoy = self.inflight[block] = Convoy(u, now, now + drawn)
            return convoy, drawn
        spec = self.spec
        front = convoy.front + (1 - convoy.front) * (now - convoy.start) / (convoy.end
                                                                             - convoy.start)
        # The joiner sweeps along at most one write's worth of the convoy's rest: a chain of
        # joiners (many threads) lengthens the convoy by at most (join + rest)·W each, where
        # rest·(E − t) alone would grow it geometrically whenever rest > 1.
        end = max(convoy.end, now + round(spec.join * drawn + spec.rest
                                          * min(convoy.end - now, drawn)))
        size = index.stop - index.start
        counts = self.losses(convoy.leader, u, size, front, convoy.lost)
        if convoy.members == 1:
            convoy.pair = (convoy.leader.uid, u.uid, now - convoy.first, counts[0] / size,
                           counts[1] / size)
            self.paired.append(convoy)
        else:
            convoy.pair = None  # three or more: not a pair
        convoy.start, convoy.front, convoy.end = now, front, end
        convoy.members += 1
        return convoy, end - now

    def row(self, u: Update) -> None:
        """``u``'s trace row was written: keep its drawn write durations (for replay)."""
        self.drawn_ns.extend(u.write_ns if u.drawn_write_ns is None else u.drawn_write_ns)

    def report(self) -> dict[str, np.ndarray]:
        """The drawn write durations (for replay) and the pairs of writes that met."""
        return {"write_drawn_ns": np.asarray(self.drawn_ns, dtype=np.int64),
                "convoy_pairs": np.asarray([c.pair for c in self.paired if c.pair is not None],
                                           dtype=np.float64).ravel()}
