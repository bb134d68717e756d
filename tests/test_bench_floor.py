"""bench/floor.py runs (its loops agree with plain SGD at one thread before any timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_floor_bench_checks_its_loops_and_prints_its_table():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "floor.py"), "--quick"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = [line.split(" | ")[0][2:] for line in out.splitlines() if line.startswith("| ")]
    assert [row for row in rows if row != "loop"] == [
        "bare SGD loop", "heapq, one pop or replace per touch", "the same, one record per update",
        "the same loop, one simpy timeout per touch",
        "one simpy timeout per update, copies and loads taken at the next store", "the engine",
        "plain Python loop, one choice per step", "the same, one simpy event per step",
        "explore (the engine's loop, records, trace, objective)"]
