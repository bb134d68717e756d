"""Store windows (``timing.write_sweep_lead``, ``write_sweep_tail``): where in its window a
write stores, from what reads under it copied (measure-mode runs with ``run.read_view =
"sweep"``).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from simulator.fidelity.durations import MIN_PAIRS
from simulator.trace import Trace, read_sweeps


def store_shares(rows: np.ndarray, lead: float, tail: float) -> np.ndarray:
    """Per row of ``simulator.trace.READ_SWEEP_COLUMNS``: the share of the write's
    coordinates a read ending ``begun_ns`` after the write began copies when the write stores
    them in order over its window less ``lead`` and ``tail`` ns (``timing.write_sweep_lead``,
    ``write_sweep_tail``; the engine's rule)."""
    begun, span, size = rows[:, 0], rows[:, 1], np.maximum(rows[:, 2], 1)
    first = np.minimum(lead, span)
    stores = np.maximum(span - lead - tail, 0.0)
    reached = np.ceil(np.divide((begun - first) * size, stores, out=np.full(begun.size, np.inf),
                                where=stores > 0))
    return np.where(begun <= first, 0.0, np.minimum(reached, size) / size)


def fit_store_window(traces: list[Trace]) -> dict[str, Any]:
    """``timing.write_sweep_lead`` and ``write_sweep_tail`` from the reads under a write
    (:func:`simulator.trace.read_sweeps`: measure-mode real runs of one block record them)
    of ``traces``, runs that read what writes in flight stored (``run.read_view =
    "sweep"``): the pair whose :func:`store_shares` are nearest the copied shares (least
    mean absolute difference; a grid up to the writes' 95th percentile, refined once), in
    ``"fields"`` when there are enough rows."""
    report: dict[str, Any] = {"fields": None}
    found = [rows for rows in map(read_sweeps, traces) if rows is not None]
    rows = np.concatenate(found) if found else np.zeros((0, 4))
    rows = rows[rows[:, 2] > 0]
    report["rows"] = int(rows.shape[0])
    if rows.shape[0] < MIN_PAIRS:
        report["why"] = (f"{rows.shape[0]} reads under a write recorded (fewer than "
                         f"{MIN_PAIRS}; a measure-mode real run of one block with read_view = "
                         "sweep records them)")
        return report
    seen = rows[:, 3] / rows[:, 2]

    def miss(lead: float, tail: float) -> float:
        return float(np.mean(np.abs(store_shares(rows, lead, tail) - seen)))

    top = float(np.percentile(rows[:, 1], 95))
    grid = np.linspace(0.0, top, 33)
    best = min(itertools.product(grid.tolist(), grid.tolist()), key=lambda p: miss(*p))
    step = grid[1] - grid[0]
    fine = [np.clip(v + np.linspace(-step, step, 17), 0.0, None).tolist() for v in best]
    lead, tail = min(itertools.product(*fine), key=lambda p: miss(*p))
    report.update(lead_ns=lead, tail_ns=tail, miss=miss(lead, tail), miss_whole=miss(0.0, 0.0),
                  whole=float(np.mean(seen == 1)), none=float(np.mean(seen == 0)),
                  write_median_ns=float(np.median(rows[:, 1])))
    report["fields"] = {"write_sweep_lead": lead, "write_sweep_tail": tail}
    return report
