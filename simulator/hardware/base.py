"""The plug-in points of a hardware model around the engine's update loop."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from simulator.update import Update

__all__ = ["Hardware", "overrides"]


class Hardware:
    """One hardware effect. The engine runs read → gradient → write; a model changes only
    what it needs through these hooks, whose defaults do nothing, and the engine calls a hook
    only for the models that override it (a model that is off is not built at all).

    * ``on``: whether the model acts on a thread at all;
    * ``drawn``: an update begins, its durations drawn (speed episodes change them);
    * ``hold``: the earliest time from ``t`` at which ``thread`` may start an action (time
      slices: its next slice);
    * ``stretch``: how long ``duration`` ns of work started at ``start`` takes (preemption);
    * ``phase``: a phase starts: its actions' durations, changed (interference, shared
      lines); ``overrun`` then waits at the phase's end for what others moved later;
    * ``copied``: a read copied a block into the thread's local vector (sweeping reads);
    * ``row``: an update's trace row was written;
    * ``finished`` / ``died``: a thread's loop ended / an injected death stopped it;
    * ``report``: arrays for the trace (stored as ``extra_<name>``).

    ``lookahead`` false: the model needs every action in time order, so no thread runs
    ahead of simpy's clock.
    """

    lookahead: ClassVar[bool] = True

    def on(self, thread: int) -> bool:
        """Whether the model acts on ``thread`` (the engine calls its hooks only then)."""
        return True

    def drawn(self, thread: int, u: Update) -> None:
        """``u`` begins on ``thread``, its durations drawn: they may change (speed
        episodes)."""

    def hold(self, thread: int, t: int) -> int:
        return t

    def stretch(self, thread: int, start: int, duration: int) -> int:
        return duration

    def phase(self, thread: int, phase: int, u: Update, durations: list[int]) -> list[int]:
        return durations

    def overrun(self, thread: int) -> Generator[Any, Any, int]:
        """Wait past the phase's planned end while others moved it later; the ns added."""
        return 0
        yield  # a generator

    def copied(self, thread: int, block: int, index: slice, local: np.ndarray,
               now: int) -> None:
        """``thread`` copied ``block`` into ``local`` at ``now``."""

    def row(self, u: Update) -> None:
        """``u``'s trace row was written."""

    def finished(self, thread: int, at: int) -> None:
        """``thread`` starts no more updates; its loop ended at ``at``."""

    def died(self, thread: int) -> None:
        """An injected death stopped ``thread`` with its update in flight."""

    def report(self) -> dict[str, np.ndarray]:
        return {}


def overrides(model: Hardware, hook: str) -> bool:
    """Whether ``model`` implements ``hook`` itself (the engine calls only those)."""
    return getattr(type(model), hook) is not getattr(Hardware, hook)
