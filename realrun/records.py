"""A real worker's per-update records: its four stamps, block stamps, sample and progress.

Per update the worker calls ``start``, ``read_end``, ``grad_end`` and ``written`` at the ends of
its phases (``copied(b)`` / ``stored(b)`` after block b's copy and store), stores what measure
mode keeps, and calls ``done(sample)``, which counts the update.

One interface, two implementations. ``realrun._records.Recorder`` (C, built at install when
a compiler is there) reads the clock and stores each stamp into the shared buffers in one call;
:class:`PyRecorder` does the same in Python, keeping the four stamps until the update ends and
storing them with one packed store. Both read ``CLOCK_MONOTONIC`` (``time.monotonic_ns``), so
every stamp of every process lies on one time line, and both count an update in ``progress``
only once its row is whole. :func:`recorder` picks the C one when it is there.
"""

from __future__ import annotations

import struct
import time
from typing import Any

__all__ = ["STAMPS", "PyRecorder", "compiled", "recorder"]

STAMPS = struct.Struct("@4q")  # one row of ``times``: native int64, as the tensor holds them

try:
    from realrun._records import Recorder as _Compiled
except ImportError:  # built without a C compiler: the Python recorder stands in
    _Compiled = None


def compiled() -> bool:
    """Whether the C recorder was built (``pip install`` with a C compiler)."""
    return _Compiled is not None


class PyRecorder:
    """Records in Python: the same calls as the C recorder, about 1 µs more per update. The
    calls are closures over the buffers (no attribute lookups); the four stamps wait in a list
    until ``done`` stores them with one packed store."""

    def __init__(self, times: Any, samples: Any, progress: Any, rank: int, copy_end: Any,
                 store_end: Any, blocks: int) -> None:
        rows, samples, progress = memoryview(times).cast("B"), memoryview(samples), \
            memoryview(progress)
        copy_end, store_end = memoryview(copy_end), memoryview(store_end)
        quota, clock, stamps, pack = len(samples), time.monotonic_ns, [0, 0, 0, 0], \
            STAMPS.pack_into
        at = [0]  # the update being recorded

        def start() -> None:
            if at[0] >= quota:
                raise IndexError(f"Recorder: all {quota} updates recorded")
            stamps[0] = clock()

        def read_end() -> None:
            stamps[1] = clock()

        def grad_end() -> None:
            stamps[2] = clock()

        def written() -> None:
            stamps[3] = clock()

        def done(sample: int) -> None:
            i = at[0]
            pack(rows, 32 * i, *stamps)
            samples[i] = sample
            at[0] = i + 1
            progress[rank] = i + 1  # last: the row is whole when it counts

        def slot(block: int) -> int:
            if not 0 <= block < blocks:
                raise IndexError(f"block {block}: not in 0..{blocks - 1}")
            return at[0] * blocks + block

        def copied(block: int) -> None:
            copy_end[slot(block)] = clock()

        def stored(block: int) -> None:
            store_end[slot(block)] = clock()

        self.start, self.read_end, self.grad_end, self.written = (start, read_end, grad_end,
                                                                  written)
        self.done, self.copied, self.stored = done, copied, stored
        self._at = at

    @property
    def count(self) -> int:
        """Updates recorded."""
        return self._at[0]


def recorder(times: Any, samples: Any, progress: Any, rank: int, copy_end: Any,
             store_end: Any, blocks: int, *, native: bool | None = None) -> Any:
    """Worker ``rank``'s recorder over flat int64 buffers: ``times`` (quota × 4: read start,
    read end, gradient end, write end), ``samples`` (quota), ``progress`` (one count per
    worker), ``copy_end`` / ``store_end`` (quota × blocks). ``native``: None picks the C
    recorder when built, True demands it, False takes the Python one."""
    if native or (native is None and _Compiled is not None):
        if _Compiled is None:
            raise RuntimeError("realrun._records was not built (no C compiler at install)")
        return _Compiled(times, samples, progress, rank, copy_end, store_end, blocks)
    return PyRecorder(times, samples, progress, rank, copy_end, store_end, blocks)
