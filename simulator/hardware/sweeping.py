"""Sweeping reads: a read copies part of the writes of its block in flight, stored over
each write's store window (``[hardware.sweeping_reads]``, ``SweepingReadsSpec``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import ScenarioError
from simulator.hardware.base import Hardware
from simulator.scenario import plain

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.hardware.convoys import Convoy
    from simulator.update import Update

__all__ = ["Sweeping", "Writing"]


class Writing:
    """A block write in flight that a read sees part of: whose, from when, until when as
    planned (a convoy member: its convoy's end plus its tail), and the step its stores take
    off the memory, less the coordinates in ``lost`` under its uid. A read sees the stores
    of an in-place sweep, each the value it replaces less the step, even where the write
    itself lands as ``loaded − step`` at its end (``load_store``): a write stopped by a time
    slice does not show the block as it was at the write's start."""

    __slots__ = ("convoy", "end", "lost", "start", "step", "tail", "thread", "uid")

    def __init__(self, u: Update, start: int, end: int, step: np.ndarray,
                 lost: dict[int, np.ndarray] | None = None, convoy: Convoy | None = None,
                 tail: int = 0) -> None:
        self.thread, self.uid, self.start, self.end = u.thread, u.uid, start, end
        self.step, self.lost, self.convoy, self.tail = step, lost, convoy, tail

    def planned_end(self) -> int:
        return self.end if self.convoy is None else self.convoy.end + self.tail


class Sweeping(Hardware):
    """Per block, the writes sweeping it now; per thread, its store window (lead, tail) in
    ns. A read's copy needs the writes in flight at its end, so no thread runs ahead of
    simpy's clock. Writes of whole blocks register here (``enter``/``leave``); writes swept
    grain by grain (``run.store_grain``) land as they sweep and need no registration."""

    lookahead = False

    def __init__(self, engine: Engine) -> None:
        if engine.sparse:
            raise ScenarioError("hardware.sweeping_reads",
                                plain(engine.scenario.hardware.sweeping_reads),
                                "sweeps dense blocks; the problem's updates are sparse")
        scenario = engine.scenario
        self.in_write: list[list[Writing]] = [[] for _ in range(scenario.run.blocks)]
        specs = [scenario.hardware_of(scenario.device_of(t)).sweeping_reads
                 for t in range(engine.threads)]
        self.window = [(0, 0) if s is None else (round(s.lead), round(s.tail)) for s in specs]
        self.rows: list[tuple[int, int, int, int]] = []  # trace.READ_SWEEP_COLUMNS

    def enter(self, block: int, writing: Writing) -> Writing:
        self.in_write[block].append(writing)
        return writing

    def leave(self, block: int, writing: Writing) -> None:
        self.in_write[block].remove(writing)

    def copied(self, thread: int, block: int, index: slice, local: np.ndarray,
               now: int) -> None:
        """``thread``'s read of ``block`` just copied it into ``local`` at its end, ``now``:
        add the coordinates each other thread's write in flight had stored by then, and
        record each such (read, write) row."""
        size = index.stop - index.start
        for writing in self.in_write[block]:
            if writing.thread == thread:
                continue
            span = writing.planned_end() - writing.start  # W
            lead, tail = self.window[writing.thread]
            begins = writing.start + min(lead, span)  # the first store
            stores = max(span - lead - tail, 0)  # from the first store to the last
            m = (0 if now <= begins else size if stores == 0
                 else min(size, -((begins - now) * size // stores)))
            self.rows.append((now - writing.start, span, size, m))
            if m == 0:
                continue
            part = slice(index.start, index.start + m)
            step = writing.step[:m]
            lost = None if writing.lost is None else writing.lost.get(writing.uid)
            local[part] -= step if lost is None else np.where(lost[:m], 0.0, step)

    def report(self) -> dict[str, np.ndarray]:
        """Reads under a write and what they copied of it."""
        return {"read_sweeps": np.asarray(self.rows, dtype=np.float64).ravel()}
