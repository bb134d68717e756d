"""Synchronous minibatch SGD: k gradients at the same vector, a barrier, one averaged update.

Every worker reads the same vector, computes one gradient and waits at the barrier; the last
to arrive writes the mean step, and only then may anyone read again. Gradient error is zero
(up to rounding) and staleness zero; the price is that each round lasts as long as its
slowest worker, which the timeline shows as the others' idle wait. A worker that dies stalls
the barrier for good (the run ends early, and the summary says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from simulator.protocols.base import Protocol
from simulator.protocols.rounds import Rounds

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["MiniBatch"]


class MiniBatch(Protocol):
    """One round = one update averaging every live worker's gradient."""

    name = "minibatch"
    gated = True

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.dense = True

    def setup(self, engine: Engine) -> None:
        self.rounds = Rounds(engine, 1.0)

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        return self.rounds.before_read(u)

    def after_read(self, engine: Engine, u: Update) -> None:
        self.rounds.after_read(u)

    def before_write(self, engine: Engine, u: Update) -> simpy.Event | None:
        return self.rounds.before_write(u)

    def after_write(self, engine: Engine, u: Update) -> None:
        self.rounds.after_write(u)

    def finish(self, engine: Engine, thread: int) -> None:
        self.rounds.finish()
