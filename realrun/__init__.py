"""asyngrad-lab real backend: lock-free training with real processes and shared memory.

The names below load the runner (and the simulator behind it: 0.85 s of imports) on first
use: a process that needs only a light module of this package (the write-meeting probe's
sides, realrun/host/probe.py: 0.22 s) starts without it."""

from __future__ import annotations

from typing import Any

__all__ = ["MODES", "RealRun", "run_real"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from realrun import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'realrun' has no attribute {name!r}")
