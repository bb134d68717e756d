"""Core speeds (``DeviceSpec.speed``): a core that ran slower for a whole run.

With ``--speeds`` (pooled, one worker per core), worker r's speed s_r is the
geometric mean of all workers' median gradient times over its own (the gradient touches
no shared memory, so its pace is the core's); every duration of worker r is multiplied by
s_r before pooling (what it would take at speed 1), and the scenario gets one device of one
core per CPU with ``speed`` = s_r, so thread j runs on core j mod cores at that core's pace.
A core that ran slower for a whole run (a sibling hyperthread busy on the host, say: 1.7×
on the 2-core machine of docs/fidelity.md) is then not averaged into one speed for all.
Which core takes the extra threads when threads outnumber cores is the OS's choice per
unpinned run; the simulation's placement is that of ``asyngrad real --pin``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.errors import AsyngradError

# Core speeds are kept (``speeds = "auto"``) when the slowest worker's median gradient is this
# many times the fastest's.
SPEED_SPREAD = 1.1


def core_speeds(samples: dict[int, dict[str, np.ndarray]], workers: int, cores: int,
                mode: str) -> dict[str, Any]:
    """Each worker's speed when every worker had a core of its own: its median gradient time
    against the geometric mean of all workers' (the gradient touches no shared memory, so it
    is the core's own pace). ``mode`` ``auto`` keeps the speeds when they differ by more than
    :data:`SPEED_SPREAD`, ``on`` whenever they can be fitted, ``off`` never.

    Raises:
        AsyngradError: ``on`` where they cannot be fitted (one worker, or workers ≠ cores).
    """
    if mode == "off":
        return {"kept": False, "why": "not asked for (--speeds off)"}
    why = ("one worker shows no spread of speeds" if workers < 2 else
           f"needs one worker per core: {workers} workers, --cores {cores}"
           if cores != workers else None)
    if why is not None:
        if mode == "on":
            raise AsyngradError(f"--speeds = 'on': {why}")
        return {"kept": False, "why": why}
    medians = np.array([float(np.median(samples[w]["grad"])) for w in sorted(samples)])
    speeds = float(np.exp(np.mean(np.log(medians)))) / medians
    spread = float(speeds.max() / speeds.min())
    kept = mode == "on" or spread > SPEED_SPREAD
    return {"kept": kept, "speeds": [round(float(v), 4) for v in speeds],
            "spread": round(spread, 4),
            "why": ("" if kept else f"speeds within {SPEED_SPREAD}× of each other")}


def at_speed_one(samples: dict[int, dict[str, np.ndarray]],
                  speeds: list[float]) -> dict[int, dict[str, np.ndarray]]:
    """Every duration as it would be on a core of speed 1 (a device's speed divides them)."""
    return {w: {op: values * speeds[i] for op, values in ops.items()}
            for i, (w, ops) in enumerate(sorted(samples.items()))}
