"""The shared shape of a protocol: read, compute, write, with nothing in between."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from simulator.engine import Engine, Update
    from simulator.scenario import RunSpec

__all__ = ["Protocol"]


class Protocol:
    """Default behaviour: every thread runs read → gradient → write with no coordination.

    Subclasses override only what their protocol changes: how many threads run
    (``threads``), state they need from the engine (``setup``), or the update (``update``).
    """

    name: ClassVar[str] = ""

    def threads(self, run: RunSpec) -> int:
        """How many virtual threads run."""
        return run.threads

    def setup(self, engine: Engine) -> None:
        """Create protocol state (locks, barriers) on the engine's clock."""

    def update(self, engine: Engine, u: Update, local: np.ndarray) -> Generator[Any, Any, None]:
        """One update of one thread."""
        yield from engine.read(u, local)
        yield from engine.compute(u, local)
        yield from engine.write(u)
