"""Locked (synchronous) SGD: the whole update runs under one global lock."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simulator.protocols.base import Protocol

if TYPE_CHECKING:
    from simulator.engine import Engine, Update

__all__ = ["Locked"]


class Locked(Protocol):
    """k threads take turns (FIFO) holding the lock for read, gradient and write, so every
    update sees the latest vector: zero gradient error and zero staleness."""

    name = "locked"

    def setup(self, engine: Engine) -> None:
        self.lock = simpy.Resource(engine.env, capacity=1)

    def update(self, engine: Engine, u: Update, local: np.ndarray) -> Generator[Any, Any, None]:
        with self.lock.request() as request:
            yield request
            yield from super().update(engine, u, local)
