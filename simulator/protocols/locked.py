"""Locked (synchronous) SGD: the whole update runs under one global lock."""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy
import simpy.resources.resource

from simulator.protocols.base import Protocol

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["Locked"]


class Locked(Protocol):
    """k threads take turns (FIFO) holding the lock for read, gradient and write, so every
    update sees the latest vector: zero gradient error and zero staleness."""

    name = "locked"
    gated = True

    def setup(self, engine: Engine) -> None:
        self.lock = simpy.Resource(engine.env, capacity=1)
        self.held: dict[int, simpy.resources.resource.Request] = {}

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        if u.thread in self.held:  # asked again once its request was granted
            return None
        request = self.lock.request()
        self.held[u.thread] = request
        return request

    def after_write(self, engine: Engine, u: Update) -> None:
        self.lock.release(self.held.pop(u.thread))
