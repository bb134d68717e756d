"""How far apart two CPUs are for a cache line: the one-way latency of handing one line back
and forth between threads pinned to them (``realrun/_cpuprobe.c``, built at install where a C
compiler is found, Linux only).

It tells a real run's two states apart on a virtual machine: when the host keeps the guest's
CPUs in one L3 domain a line passes in tens of nanoseconds, when it puts them in different
domains in hundreds, and every line of a dense model's shared vector that one worker writes
must then cross from the other's cache (bench/README.md: "write lockstep"). A real run measures
it just before its workers start and just after they finish (``summary.json``
``real.cpu_latency``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

__all__ = ["built", "line_latency_ns", "probe_cpus"]

try:
    from realrun._cpuprobe import line_latency as _line_latency
except ImportError:  # no C compiler at install, or not Linux
    _line_latency = None


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
