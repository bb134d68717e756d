"""Measure the operating system's time slice: how long a process runs before the scheduler
hands its core to another runnable process.

With more worker processes than cores, a worker descheduled between its read and its write
sees every update the others make for a whole slice, which sets the tail of the staleness
distribution (``DeviceSpec.quantum`` in the simulator). The slice is a scheduler setting
(on Linux: the base slice, rounded up to timer ticks), so it is measured, not guessed: two
processes pinned to one core spin on ``time.monotonic_ns()``, and each gap in one's clock
readings is the other's turn on the core.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

from simulator.errors import AsyngradError

__all__ = ["measure_time_slice"]

# A gap in a spinning process's clock readings longer than this is a turn of another process
# (interrupts and cache misses take microseconds).
GAP_NS = 50_000


def _spin(cpu: int, seconds: float, start: Any, queue: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()
    now = time.monotonic_ns()
    stop, last, gaps = now + int(seconds * 1e9), now, []
    while now < stop:
        now = time.monotonic_ns()
        if now - last > GAP_NS:
            gaps.append(now - last)
        last = now
    queue.put(gaps)


def measure_time_slice(seconds: float = 0.5, cpu: int | None = None) -> tuple[int, int]:
    """(median slice in ns, slices seen): two processes share one core for ``seconds``.

    Raises:
        AsyngradError: the platform cannot pin processes to a core, or no slice was seen
            (the two processes never took turns).
    """
    if not hasattr(os, "sched_setaffinity"):
        raise AsyngradError("--quantum auto: this platform cannot pin processes to a core; "
                            "give the time slice in ns")
    if cpu is None:
        cpu = min(os.sched_getaffinity(0))
    context = mp.get_context("spawn")
    start, queue = context.Event(), context.Queue()
    spinners = [context.Process(target=_spin, args=(cpu, seconds, start, queue), daemon=True)
                for _ in range(2)]
    for process in spinners:
        process.start()
    try:
        time.sleep(0.2)  # both spawned and pinned before they start spinning
        start.set()
        gaps = [gap for _ in spinners for gap in queue.get(timeout=seconds + 30)]
    finally:
        for process in spinners:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    if not gaps:
        raise AsyngradError("--quantum auto: the two pinned processes never took turns; "
                            "give the time slice in ns")
    return int(np.median(gaps)), len(gaps)
