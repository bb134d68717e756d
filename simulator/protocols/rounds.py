"""Synchronous rounds: gradients computed on the same vector are averaged into one update.

Shared by ``minibatch`` (every worker, every round) and ``paramserver`` with backup workers
(a round ends when a fraction of the workers reported). A round closes when its quota of
gradients has arrived: the last to arrive writes the mean step of all of them, the others
wait until that write completed, and a read that wants to start during the write waits for
its end. Each read is tagged with the round it starts in, so a read already running when
its round closed (and therefore overlapping the write) belongs to the old round, and a
gradient that arrives after its round closed is discarded (its worker then reads again).
Every applied gradient of a round was computed on the same vector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from simulator.protocols.base import GROUPED, MEMBER
from simulator.rules import round_quota

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["Rounds"]


class Rounds:
    """The barrier state of one run."""

    def __init__(self, engine: Engine, fraction: float) -> None:
        self.engine, self.env = engine, engine.env
        self.fraction = fraction
        self.live = engine.threads  # threads that may still start updates
        self.held = 0  # live threads held back from the rounds for now (a warm start)
        self.round = 0
        self.tags: dict[int, int] = {}  # uid → round whose vector it read
        self.arrivals: list[Update] = []
        self.waits: dict[int, simpy.Event] = {}
        self.writing = False
        self.opened = self.env.event()

    def quota(self) -> int:
        return round_quota(self.fraction, self.engine.threads, self.live - self.held)

    def before_read(self, u: Update) -> simpy.Event | None:
        # The round whose vector this read starts on: the round number moves on when a round
        # closes, before its write, so a read that waits for that write belongs to it too.
        self.tags[u.uid] = self.round
        return self.opened if self.writing else None

    def after_read(self, u: Update) -> None:
        """Nothing: reads are tagged when they start."""

    def before_write(self, u: Update) -> simpy.Event | None:
        if self.tags.pop(u.uid) != self.round:
            u.discard = True  # its round closed without it
            return None
        self.arrivals.append(u)
        if len(self.arrivals) >= self.quota():
            self._close(u)
            return None
        u.role = MEMBER
        event = self.env.event()
        self.waits[u.uid] = event
        return event

    def _close(self, writer: Update) -> None:
        writer.role, writer.group = GROUPED, self.arrivals
        self.arrivals = []
        self.round += 1
        self.writing = True

    def after_write(self, u: Update) -> None:
        if u.role != GROUPED:
            return
        for member in u.group:
            event = self.waits.pop(member.uid, None)
            if event is not None:
                event.succeed()
        self.writing = False
        opened, self.opened = self.opened, self.env.event()
        opened.succeed()

    def finish(self) -> None:
        """A thread stopped: a round waiting for it may now be complete."""
        self.live -= 1
        if self.arrivals and len(self.arrivals) >= self.quota():
            writer = self.arrivals[-1]
            event = self.waits.pop(writer.uid)
            self._close(writer)
            event.succeed()
