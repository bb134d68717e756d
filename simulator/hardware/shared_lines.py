"""Shared lines: a write of a block takes ``[hardware.shared_lines]``'s factor times its draw
when the
writer still holds the block from its own read and another thread has read it since
(``SharedLinesSpec``), as a store waits for the copy in another core's cache to be
invalidated."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.hardware.base import Hardware
from simulator.timing import WRITE

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["SharedLines"]


class SharedLines(Hardware):
    """Per thread its factor (None: 1); per block the threads holding a copy (a bit each)
    since the block's last write and the thread that read it last. It needs every thread's
    reads and writes in time order, so no thread runs ahead of simpy's clock."""

    lookahead = False

    def __init__(self, factors: list[float | None], blocks: int) -> None:
        self.factor = factors
        self.holders = [0] * blocks
        self.last_reader = [-1] * blocks

    @staticmethod
    def factors_of(engine: Engine) -> list[float | None]:
        """Per thread: its device's factor, or None (none, 1, or the durations are
        replayed, which carry it)."""
        scenario = engine.scenario
        specs = [scenario.hardware_of(scenario.device_of(t)).shared_lines
                 for t in range(engine.threads)]
        return [None if engine.replayed or s is None or s.factor == 1 else s.factor
                for s in specs]

    def copied(self, thread: int, block: int, index: slice, local: np.ndarray,
               now: int) -> None:
        """``thread`` copied ``block``: it holds it and read it last."""
        self.holders[block] |= 1 << thread
        self.last_reader[block] = thread

    def phase(self, thread: int, phase: int, u: Update, durations: list[int]) -> list[int]:
        """``thread`` starts writing the blocks of ``u``: each block's write ``durations``
        times the thread's factor where it still holds the block from its read and another
        thread read it since; the writer then holds each block alone. A dropped write
        stores nothing."""
        if phase != WRITE or u.dropped:
            return durations
        factor, bit = self.factor[thread], 1 << thread
        out = list(durations)
        for i, op in enumerate(u.ops):
            block = op[0]
            if (factor is not None and self.holders[block] & bit
                    and self.last_reader[block] != thread):
                out[i] = round(out[i] * factor)
            self.holders[block], self.last_reader[block] = bit, thread
        return out
