"""How far apart two CPUs are for a cache line: the one-way latency of handing one line back
and forth between threads pinned to them (``realrun/host/_cpuprobe.c``, built at install where a C
compiler is found, Linux only).

It tells a real run's two states apart on a virtual machine: when the host keeps the guest's
CPUs in one L3 domain a line passes in tens of nanoseconds, when it puts them in different
domains in hundreds, and every line of a dense model's shared vector that one worker writes
must then cross from the other's cache (docs/fidelity.md: "Write lockstep"). A real run asked
to probe (``asyngrad real --probe``; the probes take seconds) measures it just before its
workers start and just after they finish (``summary.json`` ``real.cpu_latency``).

The second probe prices what that costs a write: a vector of the run's size and dtype, copied
by one CPU and then by the other, then written (``w[i] -= s[i]``) by the first, against the
same write when only the first copied it (``summary.json`` ``real.shared_write``, measured
before the workers start, with one worker too). A run of one worker never shows a write on
lines another worker read last; this tells ``asyngrad calibrate`` what such a write would cost
on the run's machine and placement (``[hardware.shared_lines]``).

The third probe makes two such writes meet: one process, pinned to one CPU, starts its write
(the numpy worker's own), another process on the other CPU starts its own a chosen lag later,
and the probe counts the element stores each lost to the other's (``summary.json``
``real.write_meetings``). A run of one worker has no meeting to fit write
convoys from; this gives ``asyngrad calibrate`` the meetings the run's machine makes
(``[hardware.convoys]``, ``[hardware.passing]``).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["built", "line_latency_ns", "probe_cpus", "shared_write_cost", "write_meetings"]

try:
    from realrun.host._cpuprobe import line_latency as _line_latency
    from realrun.host._cpuprobe import shared_write as _shared_write
except ImportError:  # no C compiler at install, or not Linux
    _line_latency = _shared_write = None

# The probe's vector is at most this many bytes (four such buffers are allocated); a longer
# vector's extra cost is scaled from it by length (every line pays the same invalidation).
PROBE_BYTES = 1 << 24
# Rounds are chosen so the two timed writes of all rounds move about this many bytes.
PROBE_BUDGET_BYTES = 1 << 28


def built() -> bool:
    """Whether the probe was built (``pip install`` on Linux with a C compiler)."""
    return _line_latency is not None


def probe_cpus(pinned: Sequence[int] | None = None) -> list[int] | None:
    """The two CPUs to probe: workers 0 and 1's when pinned (and different), else the first two
    this process may run on; None when there are not two."""
    if pinned is not None and len(pinned) >= 2 and pinned[0] != pinned[1]:
        return [int(pinned[0]), int(pinned[1])]
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return usable[:2] if len(usable) >= 2 else None


def line_latency_ns(cpus: Sequence[int], rounds: int = 4000, bursts: int = 5) -> float | None:
    """The median over ``bursts`` bursts of ``rounds`` round trips of the mean one-way
    latency (ns) of a cache line between the two ``cpus``; None when the probe was not built
    or could not run there (a CPU this process may not use, or one that gave the probe no
    time for 5 s).

    Raises:
        ValueError: the two CPUs are one, or ``rounds`` or ``bursts`` < 1."""
    if _line_latency is None:
        return None
    try:
        return float(statistics.median(_line_latency(int(cpus[0]), int(cpus[1]), rounds,
                                                     bursts)))
    except OSError:  # TimeoutError is one
        return None


def _probed(count: int, itemsize: int) -> int:
    """How many of a vector's ``count`` items a probe uses: all, up to :data:`PROBE_BYTES`.

    Raises:
        ValueError: ``count`` < 1 or ``itemsize`` not 4 or 8."""
    if count < 1 or itemsize not in (4, 8):
        raise ValueError(f"count {count}, itemsize {itemsize}: count must be >= 1, itemsize "
                         "4 or 8")
    return min(int(count), PROBE_BYTES // itemsize)


def shared_write_cost(cpus: Sequence[int], count: int, itemsize: int) -> dict[str, Any] | None:
    """The cost of a write on lines the other CPU copied last, for a vector of ``count``
    items of ``itemsize`` bytes (4 or 8): ``{"cpus", "count", "probed", "itemsize",
    "rounds", "own_ns", "shared_ns", "extra_ns", "line_ns"}`` where ``own_ns`` and
    ``shared_ns`` are the median write times of ``probed`` items after only the writer
    copied the vector and after the other CPU copied it too, ``extra_ns`` their difference
    scaled to ``count`` items, and ``line_ns`` the cache-line latency between the two just
    before (placement). None when the probe was not built or could not run there.

    Raises:
        ValueError: the two CPUs are one, ``count`` < 1 or ``itemsize`` not 4 or 8."""
    if _shared_write is None:
        return None
    probed = _probed(count, itemsize)
    rounds = max(5, min(200, PROBE_BUDGET_BYTES // (2 * probed * itemsize)))
    line = line_latency_ns(cpus, rounds=1000, bursts=3)
    try:
        own, shared = _shared_write(int(cpus[0]), int(cpus[1]), probed, itemsize, rounds)
    except OSError:  # TimeoutError is one
        return None
    own_ns, shared_ns = float(statistics.median(own)), float(statistics.median(shared))
    return {"cpus": [int(cpus[0]), int(cpus[1])], "count": int(count), "probed": probed,
            "itemsize": itemsize, "rounds": rounds, "own_ns": own_ns, "shared_ns": shared_ns,
            "extra_ns": (shared_ns - own_ns) * count / probed, "line_ns": line}


# Meetings probed: lags spread evenly over [0, 1.5 D), D the time two writes that start
# together take (the median of TOGETHER such meetings, probed first), each lag twice, in a
# fixed shuffled order (a change of pace during the probe then hits every lag alike).
MEETING_LAGS = 64
MEETING_REPEATS = 2
TOGETHER = 3
_ROUNDS = TOGETHER + MEETING_LAGS * MEETING_REPEATS
# Meetings are probed for vectors up to this many bytes: each round clears, copies twice,
# writes twice and counts the whole vector, and only a whole vector gives the lags in a run's
# own ns.
MEETING_BYTES = 1 << 20
# The first side plans each meeting this far ahead (ns): the second sees the plan in about a
# microsecond.
MEETING_LEAD_NS = 20_000
# A side that waits this long for the other (ns) gives up; the parent, this long in all (s).
MEETING_WAIT_NS = 5_000_000_000
MEETING_TIMEOUT_S = 60.0
# The meeting probe's vector starts on a page of its own, its control words on the page before.
PAGE = 4096
# The control words, each on a line of its own (int64 index ×8): the turn, the first's
# planned start t0, the second's planned start, the second's start and end, its readiness.
_TURN, _T0, _START, _B0, _B1, _READY = (8 * i for i in range(6))
_CONTROL = 48
_ROW = 6


def write_meetings(cpus: Sequence[int], count: int, itemsize: int) -> dict[str, Any] | None:
    """Pairs of writes of one vector (``count`` items of ``itemsize`` bytes) by two processes
    pinned to the two ``cpus``, the second starting a lag after the first, both having
    copied the vector first: ``{"cpus", "count", "probed", "itemsize", "rows"}`` (``probed``
    = ``count``), a row per meeting ``[first's start, first's end, second's start, second's
    end, stores of the first lost, of the second lost]`` in ns from the first's planned start
    and in elements. None when the CPUs cannot be pinned or the probe could not run there,
    or the vector is over :data:`MEETING_BYTES`.

    The write is the numpy worker's own (``w[:] -= s``, realrun/worker.py) in processes
    of their own, as a real run's workers make it: the same write in C, from two threads of
    one process, took 0.6 of its time and met otherwise (docs/fidelity.md, "Runs of one
    worker"). The vector starts at 0 and the steps are u and 2u (u = 2^-10, exact in
    float32 and float64), so each element ends at −3u (both stores landed), −u (the
    second's lost) or −2u (the first's lost).

    Raises:
        ValueError: the two CPUs are one, ``count`` < 1 or ``itemsize`` not 4 or 8."""
    probed = _probed(count, itemsize)
    if cpus[0] == cpus[1]:
        raise ValueError(f"cpus: {cpus[0]} and {cpus[1]} are one CPU")
    if not hasattr(os, "sched_setaffinity") or probed * itemsize > MEETING_BYTES:
        return None  # then probed = count
    context = multiprocessing.get_context("spawn")
    # The vector starts on a page of its own (the control words and rows fill the first).
    shared = context.RawArray("b", 2 * PAGE + _rows_at(count, itemsize) + 8 * _ROW * _ROUNDS)
    offset = (-ctypes.addressof(shared)) % PAGE + PAGE
    sides = [context.Process(target=_meeting_side, daemon=True, name=f"asyngrad-meet-{first}",
                             args=(shared, offset, first, int(cpu), count, itemsize))
             for first, cpu in ((1, cpus[0]), (0, cpus[1]))]
    try:
        for side in sides:
            side.start()
        deadline = time.monotonic() + MEETING_TIMEOUT_S
        running = list(sides)
        while running and time.monotonic() < deadline:  # a side that fails ends the probe
            multiprocessing.connection.wait([side.sentinel for side in running],
                                            deadline - time.monotonic())
            running = [side for side in running if side.exitcode is None]
            if any(side.exitcode for side in sides):
                break
        if any(side.exitcode != 0 for side in sides):
            return None
    finally:
        for side in sides:
            if side.is_alive():
                side.kill()
                side.join()
    table = _views(shared, offset, count, itemsize)[2]
    return {"cpus": [int(cpus[0]), int(cpus[1])], "count": int(count), "probed": probed,
            "itemsize": itemsize, "rows": table[TOGETHER:].tolist()}


def _rows_at(count: int, itemsize: int) -> int:
    """Where the rows start, in bytes after the vector's first: on the line after its last."""
    return -(-count * itemsize // 64) * 64


def _views(shared: Any, offset: int, count: int, itemsize: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The meeting probe's control words, vector and rows in its shared buffer."""
    control = np.frombuffer(shared, np.int64, _CONTROL, offset - PAGE)
    w = np.frombuffer(shared, np.float64 if itemsize == 8 else np.float32, count, offset)
    rows = np.frombuffer(shared, np.int64, _ROW * _ROUNDS,
                         offset + _rows_at(count, itemsize)).reshape(_ROUNDS, _ROW)
    return control, w, rows


def _meeting_side(shared: Any, offset: int, first: int, cpu: int, count: int,
                  itemsize: int) -> None:
    """One side of :func:`write_meetings`, in a process of its own: exits 0 when done, 1 when
    the other side stopped answering or the parent is gone (it dies with the parent, as a
    worker does), 2 when the CPU cannot be had."""
    from realrun.worker import die_with_parent

    die_with_parent()
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        sys.exit(2)
    control, w, rows = _views(shared, offset, count, itemsize)
    step = np.full(count, (1 if first else 2) / 1024, dtype=w.dtype)
    copy = np.empty(count, dtype=w.dtype)
    clock = time.monotonic_ns

    def wait(slot: int, value: int) -> None:
        deadline = clock() + MEETING_WAIT_NS
        while control[slot] < value:
            if clock() > deadline:
                sys.exit(1)

    if not first:
        control[_READY] = 1
        for i in range(_ROUNDS):
            wait(_TURN, 4 * i + 1)
            copy[:] = w
            control[_TURN] = 4 * i + 2
            wait(_TURN, 4 * i + 3)
            t0, start = int(control[_T0]), int(control[_START])
            while clock() < start:
                pass
            b0 = clock() - t0
            np.subtract(w, step, out=w)  # the worker's w[index] -= step[values]
            b1 = clock() - t0
            control[_B0], control[_B1] = b0, b1
            control[_TURN] = 4 * i + 4
        return
    wait(_READY, 1)
    lags = [0] * TOGETHER
    for i in range(_ROUNDS):
        if i == TOGETHER:  # the span of two writes that start together sets the lags
            span = float(np.median(np.maximum(rows[:TOGETHER, 1], rows[:TOGETHER, 3])))
            spread = [int(1.5 * span * j / MEETING_LAGS) for j in range(MEETING_LAGS)]
            lags += [spread[(7 * j) % MEETING_LAGS] for j in range(MEETING_LAGS)] * MEETING_REPEATS
        w[:] = 0
        control[_TURN] = 4 * i + 1
        wait(_TURN, 4 * i + 2)
        copy[:] = w
        t0 = clock() + MEETING_LEAD_NS
        control[_T0], control[_START] = t0, t0 + lags[i]
        control[_TURN] = 4 * i + 3
        while clock() < t0:
            pass
        a0 = clock() - t0
        np.subtract(w, step, out=w)
        a1 = clock() - t0
        wait(_TURN, 4 * i + 4)
        rows[i] = (a0, a1, int(control[_B0]), int(control[_B1]),
                   np.count_nonzero(w == -2 / 1024), np.count_nonzero(w == -1 / 1024))
