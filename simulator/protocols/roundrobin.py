"""Delayed SGD in fixed turn order (Langford, Smola & Zinkevich 2009).

Workers compute gradients in parallel but write in a fixed cyclic order 0, 1, …, k−1. A
worker holds the turn for its write and for the read of its next update, so every read is a
consistent snapshot taken right after the worker's own write; by its next turn the k−1 others
have each written once. From the k-th update on, staleness is exactly k−1: the gradient
applied at step t was computed at w_{t−k}, the fixed delay τ = k−1 of the paper.

A thread that has no more updates leaves the rotation; a dead thread keeps its place and
stalls everyone (a fixed order cannot skip a worker it is waiting for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from simulator.protocols.base import Protocol

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["RoundRobin"]


class RoundRobin(Protocol):
    """A turn token passed 0 → 1 → … → k−1 → 0; writes and the next reads need it."""

    name = "roundrobin"
    gated = True

    def setup(self, engine: Engine) -> None:
        self.env = engine.env
        self.rotation = list(range(engine.threads))
        self.turn = 0
        self.holding = -1
        self.waiting: dict[int, simpy.Event] = {}

    def _wait_turn(self, thread: int) -> simpy.Event | None:
        if self.turn == thread:
            self.holding = thread
            return None
        event = self.env.event()
        self.waiting[thread] = event
        return event

    def _pass(self, thread: int) -> None:
        """Hand the turn to the next thread in the rotation after ``thread``."""
        self.holding = -1
        if not self.rotation:
            return
        later = [t for t in self.rotation if t > thread]
        self.turn = later[0] if later else self.rotation[0]
        event = self.waiting.pop(self.turn, None)
        if event is not None:
            self.holding = self.turn
            event.succeed()

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        # Only a thread's first read waits: later ones happen inside its write's turn.
        return self._wait_turn(u.thread) if self.holding != u.thread else None

    def after_read(self, engine: Engine, u: Update) -> None:
        self._pass(u.thread)

    def before_write(self, engine: Engine, u: Update) -> simpy.Event | None:
        return self._wait_turn(u.thread)

    def finish(self, engine: Engine, thread: int) -> None:
        self.rotation.remove(thread)
        if self.turn == thread:
            self._pass(thread)
