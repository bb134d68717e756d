"""How far apart two CPUs are for a cache line: the one-way latency of handing one line back
and forth between threads pinned to them (``realrun/_cpuprobe.c``, built at install where a C
compiler is found, Linux only).

It tells a real run's two states apart on a virtual machine: when the host keeps the guest's
CPUs in one L3 domain a line passes in tens of nanoseconds, when it puts them in different
domains in hundreds, and every line of a dense model's shared vector that one worker writes
must then cross from the other's cache (bench/README.md: "write lockstep"). A real run measures
it just before its workers start and just after they finish (``summary.json``
``real.cpu_latency``).

The second probe prices what that costs a write: a vector of the run's size and dtype, copied
by one CPU and then by the other, then written (``w[i] -= s[i]``) by the first, against the
same write when only the first copied it (``summary.json`` ``real.shared_write``, measured
before the workers start, with one worker too). A run of one worker never shows a write on
lines another worker read last; this tells ``asyngrad calibrate`` what such a write would cost
on the run's machine and placement (``timing.write_shared``).

The third probe makes two such writes meet: one CPU starts its write, the other starts its
own a chosen lag later, and the probe counts the element stores each lost to the other's
(``summary.json`` ``real.write_meetings``). A run of one worker has no meeting to fit write
convoys from; this gives ``asyngrad calibrate`` the meetings the run's machine makes
(``timing.convoy_*``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["built", "line_latency_ns", "probe_cpus", "shared_write_cost", "write_meetings"]

try:
    from realrun._cpuprobe import line_latency as _line_latency
    from realrun._cpuprobe import shared_write as _shared_write
    from realrun._cpuprobe import write_meetings as _write_meetings
except ImportError:  # no C compiler at install, or not Linux
    _line_latency = _shared_write = _write_meetings = None

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
# together take, each lag twice, in a fixed shuffled order (a change of pace during the probe
# then hits every lag alike).
MEETING_LAGS = 64
MEETING_REPEATS = 2
# Meetings are probed for vectors up to this many bytes: each of the 131 rounds clears, copies
# twice, writes twice and counts the whole vector (about 3 s for 8 MB, against 0.03 s for
# 80 KB), and only a whole vector gives the lags in a run's own ns.
MEETING_BYTES = 1 << 20


def write_meetings(cpus: Sequence[int], count: int, itemsize: int) -> dict[str, Any] | None:
    """Pairs of writes ``w[i] -= s[i]`` of one vector (``count`` items of ``itemsize`` bytes)
    by the two ``cpus``, the second starting a lag after the first, both having copied the
    vector first: ``{"cpus", "count", "probed", "itemsize", "rows"}`` (``probed`` =
    ``count``), a row per meeting ``[first's start, first's end, second's start, second's
    end, stores of the first lost, of the second lost]`` in ns from the first's planned start
    and in elements. None when the probe was not built or could not run, or
    the vector is over :data:`MEETING_BYTES`.

    Raises:
        ValueError: the two CPUs are one, ``count`` < 1 or ``itemsize`` not 4 or 8."""
    probed = _probed(count, itemsize)
    if _write_meetings is None or probed * itemsize > MEETING_BYTES:  # then probed = count
        return None
    a, b = int(cpus[0]), int(cpus[1])
    try:
        together = _write_meetings(a, b, probed, itemsize, [0, 0, 0])
        span = float(statistics.median(max(row[1], row[3]) for row in together))
        lags = [int(1.5 * span * i / MEETING_LAGS) for i in range(MEETING_LAGS)]
        order = [lags[(7 * i) % MEETING_LAGS] for i in range(MEETING_LAGS)] * MEETING_REPEATS
        rows = _write_meetings(a, b, probed, itemsize, order)
    except OSError:  # TimeoutError is one
        return None
    return {"cpus": [a, b], "count": int(count), "probed": probed, "itemsize": itemsize,
            "rows": [list(row) for row in rows]}
