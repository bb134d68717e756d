"""One update in flight: its sample, the blocks it moves and what happened to it."""

from __future__ import annotations

import numpy as np

from simulator.memory import Op
from simulator.protocols.base import SINGLE

__all__ = ["Update"]


class Update:
    """One update in flight, from its sample to its write's end (one trace row)."""

    __slots__ = ("copied", "delay", "discard", "drawn_write_ns", "dropped", "error_norm",
                 "grad_end", "grad_ns", "grad_start", "group", "idle_ns", "lr_scale", "ops",
                 "overwrote", "read", "read_end", "read_ns", "read_start", "role",
                 "sample", "seq", "start_completed", "start_versions", "step", "stored", "thread",
                 "uid", "write_end", "write_ns", "write_start")

    read_ns: list[int]
    grad_ns: int
    idle_ns: int
    write_ns: list[int]
    read_start: int
    read_end: int
    grad_start: int
    grad_end: int
    write_start: int
    write_end: int
    start_completed: int
    step: np.ndarray

    def __init__(self, uid: int, thread: int, seq: int, sample: int, ops: list[Op]) -> None:
        self.uid, self.thread, self.seq, self.sample, self.ops = uid, thread, seq, sample, ops
        self.start_versions: list[int] = []
        # For the read report: when each op's block copy ended, and per block when its (last)
        # store ended.
        self.copied: list[int] = []
        self.stored: dict[int, int] = {}
        self.overwrote = 0
        self.read = True        # False: reuse the thread's previous read copy (accumulation)
        self.role = SINGLE      # set by the protocol before the write
        self.group: list[Update] = []
        self.discard = False    # the protocol throws the gradient away (never applied)
        self.dropped = False    # injected: the write is lost in transit
        self.delay = 0          # injected staleness τ
        self.error_norm = 0.0   # injected ‖e‖
        self.lr_scale = 1.0     # the update rule's learning-rate factor
        self.drawn_write_ns: list[int] | None = None  # in a convoy run: before convoys
