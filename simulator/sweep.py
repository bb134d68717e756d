"""Sweeps: one scenario over a grid of field values, each cell a run directory.

Every cell's scenario is built and validated before anything runs or is written. Cells are
written all-or-nothing (``rundir.write_run``), so an interrupted sweep resumes: a rerun skips
each cell whose directory holds a run of the same resolved scenario whose files load, and runs
the others again. The sweep directory holds only ``SWEEP_FILES``. Cells run on
any ``concurrent.futures.Executor`` (local processes by default; a Dask ``Client``'s
``get_executor()`` spreads them over a cluster) and, being deterministic, give the same table
whatever ran them and in whatever order.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import operator
import os
import tomllib
import zipfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.budget import preflight
from simulator.errors import AsyngradError, ScenarioError
from simulator.rundir import FILES, check_out, strict, write_run
from simulator.scenario import Scenario, load_scenario, scenario_to_toml

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_CELLS", "METRICS", "SWEEP_FILES", "Axis", "Cell", "parse_axis", "plan_sweep",
           "run_sweep"]

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
# What a sweep directory holds: a directory with anything else is not one (``run_sweep``).
SWEEP_FILES = ("cells", "sweep.csv", "sweep.png")


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
        ScenarioError: a repeated axis, a value that repeats another of its axis (``2,2`` or
            ``0.5,0.50``: two cells of the same scenario), more than ``MAX_CELLS`` cells, or
            any cell with an invalid value or one that cannot run here.
    """
    keys = [axis.key for axis in axes]
    if len(set(keys)) != len(keys):
        raise ScenarioError("--grid", keys, "names a field twice")
    count = math.prod(len(a.values) for a in axes)
    if count > MAX_CELLS:
        raise ScenarioError("--grid", count, f"cells: more than {MAX_CELLS:,}, each a run "
                            "directory (split the sweep)")
    cells = []
    seen: dict[Scenario, tuple[int, ...]] = {}
    for index, picks in enumerate(itertools.product(*(range(len(a.values)) for a in axes))):
        values = tuple(a.values[i] for a, i in zip(axes, picks, strict=True))
        cell_overrides = (*overrides, *(f"{k}={v}" for k, v in zip(keys, values, strict=True)))
        cell = Cell(index, values, cell_overrides, load_scenario(scenario, list(cell_overrides)))
        first = seen.setdefault(cell.scenario, picks)
        if first != picks:
            n = next(n for n, (a, b) in enumerate(zip(first, picks, strict=True)) if a != b)
            raise ScenarioError(f"--grid {keys[n]}", values[n],
                                f"repeats {axes[n].values[first[n]]!r}: give each value once")
        preflight(cell.scenario)
        cells.append(cell)
    return cells


def _run_cell(cell: Cell, out: str) -> dict[str, Any]:
    """Simulate one cell and write its run directory (no plots); returns its summary as
    ``summary.json`` holds it (a value that is not finite is None), as a resumed cell's."""
    from simulator.engine import Engine

    engine = Engine(cell.scenario)
    trace = engine.run()
    return strict(write_run(Path(out), cell.scenario, trace, engine.problem, plots=False))


def _finished(cell: Cell, where: Path) -> dict[str, Any] | None:
    """The summary of the cell's earlier run, or None where there is none to resume: a file
    of it missing, or one that does not load (for the trace: an array whose checksum fails);
    the cell then runs again, replacing them.

    Raises:
        AsyngradError: the directory holds anything but a run's files, or a run of a
            different scenario (a ``scenario.toml`` that is TOML but not the cell's).
    """
    check_out(where, FILES)
    try:
        text = (where / "scenario.toml").read_text()
        if text != scenario_to_toml(cell.scenario):
            tomllib.loads(text)  # whole TOML: another scenario, not a damaged file
            raise AsyngradError(f"sweep: {where} holds a run of a different scenario; "
                                "use another --out or remove it")
        summary = json.loads((where / "summary.json").read_text())
        _metrics(summary)
        _curve(where)
        with zipfile.ZipFile(where / "trace.npz") as trace:
            return summary if trace.testzip() is None else None  # every array's CRC
    # (ValueError: also bad UTF-8, TOML, JSON; zlib.error: a damaged compressed array)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        return None


def _metrics(summary: Any) -> dict[str, Any]:
    """The ``METRICS`` of a summary, each a number or null.

    Raises:
        ValueError: one is missing or is not a number.
    """
    row = {}
    for column, path in METRICS:
        try:
            value = functools.reduce(operator.getitem, path, summary)
        except (KeyError, TypeError):
            raise ValueError(f"summary.json: no {'.'.join(path)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float | None):
            raise ValueError(f"summary.json: {'.'.join(path)} = {value!r} is not a number")
        row[column] = value
    return row


def _row(cell: Cell, axes: Sequence[Axis], summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell.name}
    row.update({axis.key: value for axis, value in zip(axes, cell.values, strict=True)})
    row.update(_metrics(summary))
    return row


def _staging(out: Path, name: str) -> Path:
    """Where ``name`` is written before it replaces ``out/name``: inside ``cells/``, so that
    a run killed while writing leaves nothing that makes ``out`` look like no sweep."""
    return out / "cells" / f".{name}.partial-{os.getpid()}{Path(name).suffix}"


def _write_table(out: Path, axes: Sequence[Axis], rows: list[dict[str, Any]]) -> None:
    columns = ["cell", *(a.key for a in axes), *(c for c, _ in METRICS)]
    staging = _staging(out, "sweep.csv")
    with open(staging, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(rows)
    staging.replace(out / "sweep.csv")


def run_sweep(cells: list[Cell], axes: Sequence[Axis], out: str | Path,
              executor: Executor | None = None,
              progress: Callable[[int], object] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Run the cells not finished yet (see ``_finished``); write ``sweep.csv`` and
    ``sweep.png``. Returns the table and how many cells ran now (the others were resumed from
    disk).

    Raises:
        AsyngradError: ``out`` is a file, a directory holding anything but ``SWEEP_FILES``,
            or cannot be written; a cell's directory holds anything but a run's files, or a
            run of a different scenario. Nothing is run or written then.
    """
    out = check_out(out, SWEEP_FILES)
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
    figure = _figure(out, cells, axes)  # every curve loaded before either file is replaced
    _write_table(out, axes, rows)
    staging = _staging(out, "sweep.png")
    figure.savefig(staging, dpi=110)
    staging.replace(out / "sweep.png")
    return rows, len(pending)


def _curve(where: Path) -> np.ndarray:
    """A cell's (time_ns, gradients, suboptimality) rows from its curve.csv.

    Raises:
        OSError: it cannot be read.
        ValueError: it is cut short (no rows, or a last line without its end), or a row
            lacks one of those numbers.
    """
    text = (where / "curve.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or not text.endswith("\n"):
        raise ValueError(f"{where / 'curve.csv'}: cut short")
    try:
        return np.array([[float(r[c]) for c in ("time_ns", "gradients", "suboptimality")]
                         for r in rows])
    except (KeyError, TypeError):  # a column missing, or a row shorter than the header
        raise ValueError(f"{where / 'curve.csv'}: a row lacks a number") from None


def _figure(out: Path, cells: list[Cell], axes: Sequence[Axis]) -> Figure:
    """``sweep.png``'s figure: suboptimality against simulated time and against gradients,
    one line per combination of the swept values other than ``run.seed`` (mean over
    seeds)."""
    from simulator.plots import sweep_figure

    keep = [i for i, axis in enumerate(axes) if axis.key != "run.seed"]
    groups: dict[tuple[str, ...], list[np.ndarray]] = {}
    for cell in cells:
        key = tuple(cell.values[i] for i in keep)
        groups.setdefault(key, []).append(_curve(out / "cells" / cell.name))
    return sweep_figure(groups, [axes[i].key for i in keep])
