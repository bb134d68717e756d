"""The shared shape of a protocol: plug-in points around the engine's update loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import simpy

if TYPE_CHECKING:
    from simulator.engine import Engine, Update
    from simulator.scenario import RunSpec

__all__ = ["Protocol"]


class Protocol:
    """The engine runs read → gradient → write for every update; a protocol changes only
    what it needs through these plug-in points, whose defaults do nothing.

    * ``threads``: how many virtual threads run;
    * ``setup``: create state (locks, barriers) on the engine's clock;
    * ``acquire``: the event an update waits for before its read;
    * ``release``: called when the update's write has completed.

    ``acquire`` and ``release`` are called only when ``gated`` is true, and then at simpy's
    own time (the engine first catches up with the thread's clock), since they touch state
    other threads wait on.
    """

    name: ClassVar[str] = ""
    gated: ClassVar[bool] = False

    def threads(self, run: RunSpec) -> int:
        return run.threads

    def setup(self, engine: Engine) -> None:
        """Create protocol state on the engine's clock."""

    def acquire(self, engine: Engine, u: Update) -> simpy.Event:
        """The event ``u`` waits for before reading."""
        return engine.env.timeout(0)

    def release(self, engine: Engine, u: Update) -> None:
        """``u`` has completed its write."""
