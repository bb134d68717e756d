"""Serial SGD: one thread does all T updates (the baseline of every speedup)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.protocols.base import Protocol

if TYPE_CHECKING:
    from simulator.scenario import RunSpec

__all__ = ["Serial"]


class Serial(Protocol):
    """One thread, whatever ``run.threads`` says; it uses thread 0's streams."""

    name = "serial"

    @classmethod
    def threads(cls, run: RunSpec) -> int:
        return 1
