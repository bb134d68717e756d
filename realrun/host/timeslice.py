"""Measure the operating system's time slice: how long a process runs before the scheduler
hands its core to another runnable process.

With more worker processes than cores, a worker descheduled between its read and its write
sees every update the others make for a whole slice, which sets the tail of the staleness
distribution (the ``quantum`` of ``[hardware.time_slices]`` in the simulator). The slice is a
scheduler setting (on Linux: the base slice, rounded up to timer ticks), so it is measured,
not guessed: two processes pinned to one core spin on ``time.monotonic_ns()``, and each gap
in one's clock readings is the other's turn on the core.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

from simulator.errors import AsyngradError

__all__ = ["measure_migration", "measure_time_slice"]

# A gap in a spinning process's clock readings longer than this is a turn of another process
# (interrupts and cache misses take microseconds).
GAP_NS = 50_000
# A gap this long is another process's time slice, not an interrupt (when telling which
# spinners share a core).
TURN_NS = 1_000_000


def _spin(cpus: set[int], seconds: float, start: Any, queue: Any) -> None:
    os.sched_setaffinity(0, cpus)
    start.wait()
    began = now = time.monotonic_ns()
    stop, last, gaps = now + int(seconds * 1e9), now, []
    while now < stop:
        now = time.monotonic_ns()
        if now - last > GAP_NS:
            gaps.append((last, now))
        last = now
    queue.put((began, gaps))


def _spinners(cpus: set[int], count: int,
              seconds: float) -> list[tuple[int, list[tuple[int, int]]]]:
    """Per process of ``count`` spinning on ``cpus`` for ``seconds``: when it began, and
    the gaps in its clock readings (from, to) in ns."""
    context = mp.get_context("spawn")
    start, queue = context.Event(), context.Queue()
    spinners = [context.Process(target=_spin, args=(cpus, seconds, start, queue), daemon=True)
                for _ in range(count)]
    for process in spinners:
        process.start()
    try:
        time.sleep(0.2)  # all spawned and placed before they start spinning
        start.set()
        return [queue.get(timeout=seconds + 30) for _ in spinners]
    finally:
        for process in spinners:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()


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
    gaps = [last - first for _, seen in _spinners({cpu}, 2, seconds) for first, last in seen]
    if not gaps:
        raise AsyngradError("--quantum auto: the two pinned processes never took turns; "
                            "give the time slice in ns")
    return int(np.median(gaps)), len(gaps)


def measure_migration(cores: int, quantum: int, seconds: float = 3.0) -> tuple[int, int]:
    """(mean ns between load-balancer moves, moves seen): ``cores`` + 1 processes spin on
    ``cores`` CPUs for ``seconds``, so two of them share a core and take turns.

    In each window of two time slices the spinners that lost a turn (a gap in their clock
    readings of 1 ms or more) are the pair sharing a core; the balancer moved a process when
    the pair changes from one window where exactly two lost turns to the next such window.
    The mean interval is the time in such windows over the changes seen
    (``DeviceSpec.migrate``; with none seen, the whole time, a lower bound).

    Raises:
        AsyngradError: the platform cannot place processes, has fewer than ``cores`` CPUs,
            or no two spinners were seen sharing a core.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise AsyngradError("--migrate auto: this platform cannot place processes on CPUs; "
                            "give the mean interval in ns")
    allowed = sorted(os.sched_getaffinity(0))
    if cores < 1 or len(allowed) < cores:
        raise AsyngradError(f"--migrate auto: needs --cores CPUs to spin on ({cores} asked, "
                            f"{len(allowed)} available)")
    if quantum <= 0:
        raise AsyngradError("--migrate auto: needs the time slice (--quantum)")
    seen = _spinners(set(allowed[:cores]), cores + 1, seconds)
    window = 2 * quantum
    begin = max(start for start, _ in seen) + window  # all spinning, settled
    end = begin + int(seconds * 1e9) - 2 * window
    windows = max(0, (end - begin) // window)
    lost = np.zeros((len(seen), windows), dtype=bool)
    for spinner, (_, gaps) in enumerate(seen):
        for first, last in gaps:
            if last - first < TURN_NS:
                continue
            lo, hi = max(0, (first - begin) // window), min(windows - 1, (last - begin) // window)
            if hi >= lo:
                lost[spinner, lo:hi + 1] = True
    pairs = [tuple(np.flatnonzero(lost[:, w])) for w in range(windows)
             if int(lost[:, w].sum()) == 2]
    if not pairs:
        raise AsyngradError("--migrate auto: no two spinning processes were seen sharing a "
                            "core; give the mean interval in ns")
    moves = sum(1 for a, b in itertools.pairwise(pairs) if a != b)
    return int(len(pairs) * window / max(moves, 1)), moves
