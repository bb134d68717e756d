"""Speed episodes: each core of a device alternates between fast and slow episodes
(``[hardware.episodes]``, ``EpisodeSpec``; drawn by the duration source,
``simulator.timing.SpeedEpisodes``), as a virtual CPU whose host sibling is busy now and
then."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.hardware.base import Hardware

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.hardware.slices import TimeSlices
    from simulator.update import Update

__all__ = ["Episodes"]


class Episodes(Hardware):
    """Every duration of an update that begins in a slow episode of its core is
    ``factor`` times as long (threads whose durations are drawn as each phase starts
    get it from the source itself)."""

    def __init__(self, engine: Engine, slices: TimeSlices | None) -> None:
        self.engine, self.slices = engine, slices

    def drawn(self, thread: int, u: Update) -> None:
        engine = self.engine
        now = engine.clock[thread]
        if self.slices is not None:  # per-core slices move threads: follow its core
            core = self.slices.core_of(thread, now)
            if core is not None:
                engine.source.place(thread, core)
        slow = engine.source.slowness(thread, now)
        if slow != 1.0:
            u.read_ns = [int(d * slow + 0.5) for d in u.read_ns]
            u.write_ns = [int(d * slow + 0.5) for d in u.write_ns]
            u.grad_ns, u.idle_ns = int(u.grad_ns * slow + 0.5), int(u.idle_ns * slow + 0.5)
