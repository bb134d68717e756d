"""What a run keeps as its updates end: each completion t (the shared vector's new serialized
state w_t), the serialized view's measurement of it, each update's trace row (through the one
builder, ``simulator.trace.TraceBuilder``), and the last states w_t an injected delay reads."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.memory import Op, SharedMemory
from simulator.trace import Trace, TraceBuilder
from simulator.update import Update
from simulator.view import UNMEASURED, SerializedView

__all__ = ["Ledger"]

_TRIM_EVERY = 2048
_PROGRESS_EVERY = 256


class Ledger:
    """The completions and records of one run.

    ``active`` maps each thread to its update in flight (the engine's); ``history`` holds
    w_t for the last ``max_delay`` + 1 completions (an injected delay τ reads
    ``history[-1 - τ]``); ``progress``, when set, is called with the number of new rows every
    so often; ``hooks`` are called with each update as its row is written (hardware models).
    """

    def __init__(self, mem: SharedMemory, view: SerializedView, dense_ops: list[Op],
                 active: dict[int, Update], max_delay: int, partial: bool = False) -> None:
        self.mem, self.view, self.active = mem, view, active
        self._partial = partial  # δ on the block an update writes (a model's stage)
        self.completed = 0
        self.builder = TraceBuilder()
        self.rows = self.builder.rows  # the records so far (trace.RECORD)
        self._dense_ops, self._dense_blocks = dense_ops, [op[0] for op in dense_ops]
        self.history: deque[np.ndarray] = deque([mem.w.copy()], maxlen=max_delay + 1)
        self._keep_history = max_delay > 0
        self.hooks: list[Callable[[Update], object]] = []
        self.progress: Callable[[int], object] | None = None

    def _row(self, u: Update, step: int, m: tuple[Any, ...]) -> None:
        """Append ``u``'s trace record; ``step`` is its completion t (0: never applied)."""
        stored = u.stored  # in op order when every block was stored (blocks are written in
        # op order; a block's grains keep its first place)
        self.builder.add(
            (u.uid, u.thread, u.seq, u.sample, step, u.read_start, u.read_end, u.grad_start,
             u.grad_end, u.write_start, u.write_end, u.grad_ns, u.idle_ns, u.start_completed,
             self.completed, u.overwrote, u.delay, u.error_norm, u.dropped, u.lr_scale, *m),
            self._dense_blocks if u.ops is self._dense_ops else [op[0] for op in u.ops],
            u.read_ns, u.write_ns, u.copied if u.copied else [-1] * len(u.ops),
            stored.values() if len(stored) == len(u.ops) else
            [stored.get(op[0], -1) for op in u.ops])
        for hook in self.hooks:
            hook(u)
        if self.active.get(u.thread) is u:
            del self.active[u.thread]
        if self.progress is not None and len(self.rows) % _PROGRESS_EVERY == 0:
            self.progress(_PROGRESS_EVERY)

    def _count(self) -> int:
        """Count a completion: the shared vector has a new serialized state w_t."""
        self.completed += 1
        if self._keep_history:
            self.history.append(self.mem.w.copy())
        if self.completed % _TRIM_EVERY == 0:
            self._trim()
        return self.completed

    def complete(self, u: Update) -> None:
        """``u``'s write has ended: one completion."""
        t = self._count()
        m = self.view.complete(t, self.mem.w, [u.sample], u.write_end, u.lr_scale,
                               len(self.rows) + 1, u.ops[0][1] if self._partial else None)
        self._row(u, t, m)

    def complete_group(self, writer: Update) -> None:
        """One completion applying the mean step of the group's gradients; the exact metrics
        sit on the writer's row (the last of the group), the others share its step and get an
        empty write at its end."""
        group = writer.group
        t = self._count()
        m = self.view.complete(t, self.mem.w, [v.sample for v in group], writer.write_end,
                               writer.lr_scale, len(self.rows) + len(group),
                               writer.ops[0][1] if self._partial else None)
        for member in group:
            if member is not writer:  # applied, without writing itself, when the write ended
                member.write_start = member.write_end = writer.write_end
                self._row(member, t, UNMEASURED)
        self._row(writer, t, m)

    def discard(self, u: Update, wrote: bool = False) -> None:
        """A gradient the protocol threw away: a row with step 0, no completion. With
        ``wrote`` its write ran until ``u.write_end`` but stored nothing (a server that
        threw the push away as it arrived); else it never wrote."""
        if wrote:
            u.stored.clear()
        else:
            u.write_end = u.write_start
        for member in u.group or [u]:
            if member is not u:
                member.write_start = member.write_end = u.write_end
            self._row(member, 0, UNMEASURED)

    def _trim(self) -> None:
        """Forget the memory's store records no update in flight can still need."""
        keep = list(self.mem.count)
        for u in self.active.values():
            for op, version in zip(u.ops, u.start_versions, strict=False):
                keep[op[0]] = min(keep[op[0]], version)
        self.mem.trim(keep)

    def finish(self) -> None:
        """The run has ended: the view's last state and the progress left."""
        end = max((row[10] for row in self.rows), default=0)  # write_end
        self.view.finish(self.completed, self.mem.w, end, len(self.rows))
        if self.progress is not None:
            self.progress(len(self.rows) % _PROGRESS_EVERY)

    def trace(self, text: str, w0: np.ndarray, lost: list[int],
              extras: dict[str, np.ndarray], source: str) -> Trace:
        """The run's trace (``text``: its scenario as TOML)."""
        return self.builder.build(text, w0, self.mem.w.copy(), self.view.curve_arrays(),
                                  lost=lost, extras=extras, source=source)
