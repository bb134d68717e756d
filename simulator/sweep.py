"""Sweeps: one scenario over a grid of field values, each cell a run directory.

Every cell's scenario is built and validated before anything runs or is written. Cells are
written all-or-nothing (``rundir.write_run``), so an interrupted sweep resumes: a rerun skips
each cell whose directory already holds a summary for the same resolved scenario. Cells run on
any ``concurrent.futures.Executor`` (local processes by default; a Dask ``Client``'s
``get_executor()`` spreads them over a cluster) and, being deterministic, give the same table
whatever ran them and in whatever order.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.budget import preflight
from simulator.errors import AsyngradError, ScenarioError
from simulator.scenario import Scenario, load_scenario, scenario_to_toml

__all__ = ["MAX_CELLS", "METRICS", "Axis", "Cell", "parse_axis", "plan_sweep", "run_sweep"]

# The most cells one sweep plans: each is a run directory and a scenario held in memory.
MAX_CELLS = 100_000
# (column, path in summary.json) of the metrics a sweep tabulates.
METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("error_rate", ("gradient_error", "rate")),
    ("rel_error_p50", ("gradient_error", "relative", "p50")),
    ("rel_error_p95", ("gradient_error", "relative", "p95")),
    ("staleness_mean", ("staleness", "mean")),
    ("staleness_max", ("staleness", "max")),
    ("lost_blocks", ("overwrites", "lost_blocks")),
    ("torn_reads", ("overwrites", "torn_reads")),
    ("read_overwrite_blocks", ("overwrites", "read_overwrite_blocks")),
    ("final_suboptimality", ("loss", "final_suboptimality")),
    ("span_ns", ("time", "span_ns")),
    ("updates_per_second", ("time", "updates_per_second")),
)


@dataclass(frozen=True)
class Axis:
    """One swept field and its values (as ``--set`` value text)."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One point of the grid: its index, its axis values and its resolved scenario."""

    index: int
    values: tuple[str, ...]
    overrides: tuple[str, ...]
    scenario: Scenario

    @property
    def name(self) -> str:
        return f"{self.index:04d}"


def parse_axis(text: str) -> Axis:
    """``key=v1,v2,...`` or ``key=[v1, v2, ...]`` (a TOML array, for values with commas).

    Raises:
        ScenarioError: no ``=``, or no values.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise ScenarioError("--grid", text, "must look like key=v1,v2,...")
    raw = raw.strip()
    if raw.startswith("["):
        try:
            items = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError as err:
            raise ScenarioError("--grid", text, f"is not a TOML array ({err})") from None
        values = tuple(_toml_text(v) for v in items)
    else:
        values = tuple(v.strip() for v in raw.split(","))
    if not values or any(not v for v in values):
        raise ScenarioError("--grid", text, "has an empty value")
    return Axis(key.strip(), values)


def _toml_text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_text(v) for v in value) + "]"
    return repr(value)


def plan_sweep(scenario: str | Path | None, overrides: Sequence[str],
               axes: Sequence[Axis]) -> list[Cell]:
    """Every cell of the grid, in row-major order, each validated and judged runnable on
    this machine (``simulator.budget.preflight``).

    Raises:
        ScenarioError: a repeated axis, more than ``MAX_CELLS`` cells, or any cell with an
            invalid value or one that cannot run here.
    """
    keys = [axis.key for axis in axes]
    if len(set(keys)) != len(keys):
        raise ScenarioError("--grid", keys, "names a field twice")
    count = math.prod(len(a.values) for a in axes)
    if count > MAX_CELLS:
        raise ScenarioError("--grid", count, f"cells: more than {MAX_CELLS:,}, each a run "
                            "directory (split the sweep)")
    cells = []
    for index, values in enumerate(itertools.product(*(a.values for a in axes))):
        cell_overrides = (*overrides, *(f"{k}={v}" for k, v in zip(keys, values, strict=True)))
        cell = Cell(index, values, cell_overrides, load_scenario(scenario, list(cell_overrides)))
        preflight(cell.scenario)
        cells.append(cell)
    return cells


def _run_cell(cell: Cell, out: str) -> dict[str, Any]:
    """Simulate one cell and write its run directory (no plots); returns its summary."""
    from simulator.engine import Engine
    from simulator.rundir import write_run

    engine = Engine(cell.scenario)
    trace = engine.run()
    return write_run(Path(out), cell.scenario, trace, engine.problem, plots=False)


def _finished(cell: Cell, where: Path) -> dict[str, Any] | None:
    """The summary of a cell run earlier with the same scenario, if there is one.

    Raises:
        AsyngradError: the directory holds a different scenario.
    """
    if not (where / "summary.json").is_file():
        return None
    if (where / "scenario.toml").read_text() != scenario_to_toml(cell.scenario):
        raise AsyngradError(f"sweep: {where} holds a run of a different scenario; "
                            "use another --out or remove it")
    return dict(json.loads((where / "summary.json").read_text()))


def _row(cell: Cell, axes: Sequence[Axis], summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell.name}
    row.update({axis.key: value for axis, value in zip(axes, cell.values, strict=True)})
    for column, path in METRICS:
        value: Any = summary
        for part in path:
            value = value[part]
        row[column] = value
    return row


def _write_table(out: Path, axes: Sequence[Axis], rows: list[dict[str, Any]]) -> None:
    columns = ["cell", *(a.key for a in axes), *(c for c, _ in METRICS)]
    staging = out / f".sweep.csv.partial-{os.getpid()}"
    with open(staging, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(rows)
    staging.replace(out / "sweep.csv")


def run_sweep(cells: list[Cell], axes: Sequence[Axis], out: str | Path,
              executor: Executor | None = None,
              progress: Callable[[int], object] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Run the cells not finished yet; write ``sweep.csv``. Returns the table and how many
    cells ran now (the others were resumed from disk)."""
    out = Path(out)
    try:
        (out / "cells").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AsyngradError(f"--out = '{out}': cannot hold a sweep ({err.strerror or err})"
                            ) from None
    summaries: dict[int, dict[str, Any]] = {}
    pending = []
    for cell in cells:
        done = _finished(cell, out / "cells" / cell.name)
        if done is None:
            pending.append(cell)
        else:
            summaries[cell.index] = done
            if progress:
                progress(1)
    if executor is None:
        for cell in pending:
            summaries[cell.index] = _run_cell(cell, str(out / "cells" / cell.name))
            if progress:
                progress(1)
    else:
        futures = {executor.submit(_run_cell, cell, str(out / "cells" / cell.name)): cell
                   for cell in pending}
        for future in as_completed(futures):
            summaries[futures[future].index] = future.result()
            if progress:
                progress(1)
    rows = [_row(cell, axes, summaries[cell.index]) for cell in cells]
    _write_table(out, axes, rows)
    _write_figure(out, cells, axes)
    return rows, len(pending)


def _curve(where: Path) -> np.ndarray:
    """A cell's (time_ns, gradients, suboptimality) rows from its curve.csv."""
    with open(where / "curve.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return np.array([[float(r["time_ns"]), float(r["gradients"]), float(r["suboptimality"])]
                     for r in rows])


def _write_figure(out: Path, cells: list[Cell], axes: Sequence[Axis]) -> None:
    """``sweep.png``: suboptimality against simulated time and against gradients, one line
    per combination of the swept values other than ``run.seed`` (mean over seeds)."""
    from simulator.plots import sweep_figure

    keep = [i for i, axis in enumerate(axes) if axis.key != "run.seed"]
    groups: dict[tuple[str, ...], list[np.ndarray]] = {}
    for cell in cells:
        key = tuple(cell.values[i] for i in keep)
        groups.setdefault(key, []).append(_curve(out / "cells" / cell.name))
    staging = out / f".sweep.png.partial-{os.getpid()}.png"
    sweep_figure(groups, [axes[i].key for i in keep]).savefig(staging, dpi=110)
    staging.replace(out / "sweep.png")
