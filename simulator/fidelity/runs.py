"""Reading run directories, and the samples the fits take from their traces.

A read or write block duration is a draw of the whole-vector duration times the fraction of
coordinates the block moves (DESIGN §3), so each recorded block duration divided by its
fraction is one sample of the whole-vector read or write duration; gradient durations are
the recorded ``grad_ns`` (the gradient's own time, without waiting for a core), and the
local work between a worker's updates is the recorded ``idle_ns`` (real workers spend it
drawing the sample and recording timestamps: about 30% of a small update's cycle).

Only the updates made while every worker was running are used (real workers start and
finish at different times).
"""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import AsyngradError, TraceError
from simulator.memory import block_bounds
from simulator.metrics import overlaps
from simulator.problems import make_problem
from simulator.scenario import Scenario, scenario_from_dict
from simulator.trace import Trace


class Run:
    """A run directory's summary, trace and loss curve."""

    def __init__(self, path: Path, summary: dict[str, Any], trace: Trace,
                 curve: np.ndarray) -> None:
        self.path, self.summary, self.trace, self.curve = path, summary, trace, curve

    @property
    def label(self) -> str:
        s = self.summary
        return f"{self.path.name} ({s['source']}, {s['protocol']}, k={s['threads']})"


def load_run(path: str | Path) -> Run:
    """Read a run directory.

    Raises:
        AsyngradError: not a run directory, a file in it is unreadable, ``summary.json`` lacks
            a field compare reads or holds one of another type, or ``curve.csv`` has no
            rows.
    """
    path = Path(path)
    if not path.is_dir():
        raise AsyngradError(f"compare: {path}: no such run directory")
    missing = [name for name in ("summary.json", "trace.npz", "curve.csv")
               if not (path / name).is_file()]
    if missing:
        raise AsyngradError(f"compare: {path}: not a run directory (missing "
                            f"{', '.join(missing)})")
    try:
        summary = json.loads((path / "summary.json").read_text())
        with open(path / "curve.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        curve = np.array([[float(r["gradients"]), float(r["suboptimality"]),
                           float(r["time_ns"])] for r in rows])
    except (OSError, ValueError, KeyError) as err:
        raise AsyngradError(f"compare: {path}: unreadable run files ({err})") from None
    _check_summary(path / "summary.json", summary)
    if not rows:
        raise AsyngradError(f"compare: {path / 'curve.csv'}: no rows (only a header)")
    try:
        trace = Trace.load(path / "trace.npz")
    except TraceError as err:
        raise AsyngradError(f"compare: {err}") from None
    return Run(path, summary, trace, curve)


#: What compare reads from a run's ``summary.json``: each key and the JSON types it takes.
SUMMARY_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("source", str, "a string"), ("protocol", str, "a string"), ("threads", int, "an integer"),
    ("problem", dict, "an object"), ("time", dict, "an object"))


def _check_summary(file: Path, summary: Any) -> None:
    """Raises AsyngradError naming ``file`` and the field where ``summary`` lacks what
    compare reads (:data:`SUMMARY_FIELDS`, and a number ``time.updates_per_second``)."""
    if not isinstance(summary, dict):
        raise AsyngradError(f"compare: {file}: not a JSON object ({type(summary).__name__})")
    for key, kind, name in SUMMARY_FIELDS:
        if key not in summary:
            raise AsyngradError(f"compare: {file}: no '{key}'")
        if not isinstance(summary[key], kind) or isinstance(summary[key], bool):
            raise AsyngradError(f"compare: {file}: {key} = {json.dumps(summary[key])}: not "
                                f"{name}")
    ups = summary["time"].get("updates_per_second")
    if not isinstance(ups, int | float) or isinstance(ups, bool):
        raise AsyngradError(f"compare: {file}: time.updates_per_second = {json.dumps(ups)}: "
                            "not a number")


def read_run(path: Path) -> tuple[Trace, Scenario]:

    if not (path / "trace.npz").is_file():
        raise AsyngradError(f"calibrate: {path}: not a run directory (no trace.npz)")
    try:
        trace = Trace.load(path / "trace.npz")
    except TraceError as err:
        raise AsyngradError(f"calibrate: {err}") from None
    if len(trace) < 2:
        raise AsyngradError(f"calibrate: {path}: the trace has {len(trace)} updates")
    if trace.source == "scheduled":
        raise AsyngradError(f"calibrate: {path}: recorded under a scheduler (explore), so "
                            "its durations count steps, not nanoseconds")
    return trace, scenario_from_dict(tomllib.loads(trace.scenario_toml))


def run_workers(run_dir: str | Path) -> int | None:
    """The worker count a run directory's ``summary.json`` records (None when it cannot be
    read: loading the run says why)."""
    import json

    try:
        threads = json.loads((Path(run_dir) / "summary.json").read_text())["threads"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return threads if isinstance(threads, int) else None


def running_together(trace: Trace) -> np.ndarray:
    """Rows of the span in which every worker was running (real workers start and finish
    at different times; durations outside that span carry no contention)."""
    threads = np.unique(trace["thread"])
    begin = max(int(trace["read_start"][trace["thread"] == t].min()) for t in threads)
    end = min(int(trace["write_end"][trace["thread"] == t].max()) for t in threads)
    rows = np.flatnonzero((trace["read_start"] >= begin) & (trace["write_end"] <= end))
    return rows if rows.size >= 100 else np.arange(len(trace))


def alone_writes(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The ``rows`` whose write no other write overlapped."""
    ws, we = trace["write_start"][rows], trace["write_end"][rows]
    return rows[overlaps(ws, we, ws, we) <= 1]


def write_survival(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How long each write of ``rows`` ran alone, as survival data: the rows kept and the
    share of each one's write that was alone — 1 for a write no other met (its duration is
    its time alone), below 1 for a write another started into (its time alone was longer
    than the lag: right-censored there). Writes that started into another's are left out:
    from their first nanosecond they are not alone. A long write is far likelier to be met
    than a short one, so the writes that met no other are the short ones (on a run in write
    lockstep, their mean can be a third of the time a write runs alone); the survival
    estimate counts the met ones too (:class:`Survival`)."""
    order = rows[np.argsort(trace["write_start"][rows], kind="stable")]
    ws = trace["write_start"][order].astype(np.float64)
    we = trace["write_end"][order].astype(np.float64)
    in_flight = np.maximum.accumulate(np.concatenate([[-np.inf], we[:-1]]))
    joiner = ws < in_flight
    following = np.concatenate([ws[1:], [np.inf]])  # the next write to start, any worker
    met = following < we
    share = np.ones(order.size)
    duration = we - ws
    share[met] = (following[met] - ws[met]) / np.maximum(duration[met], 1.0)
    return order[~joiner], share[~joiner]


def phase_windows(trace: Trace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each update's start and duration of each phase (ns)."""
    read_start = trace["read_start"].astype(np.int64)
    return {"read": (read_start, trace["read_end"] - read_start),
            "grad": (trace["grad_start"].astype(np.int64), trace["grad_ns"]),
            "write": (trace["write_start"].astype(np.int64),
                      trace["write_end"] - trace["write_start"]),
            "idle": (read_start - trace["idle_ns"], trace["idle_ns"])}


def operation_samples(trace: Trace, scenario: Scenario, rows: np.ndarray | None = None,
                      write_share: np.ndarray | None = None
                      ) -> dict[int, dict[str, np.ndarray]]:
    """Per worker: whole-vector read and write durations (block durations over the fraction
    of coordinates moved) and gradient durations, from ``rows`` (default: all); the write
    durations times ``write_share`` (one per row of ``rows``) where given. A row whose
    gradient phase computes several gradients (ADMM's local solve, Sandblaster's unit: the
    protocol's ``grad_work``) gives its phase over their count, one gradient's duration, as
    ``timing.grad`` describes."""
    from simulator.protocols import make_protocol

    problem = make_problem(scenario.problem)
    protocol = make_protocol(scenario.run.protocol, scenario)
    protocol.bind(problem)  # (Sandblaster's units: ⌈n/U⌉ gradients each)
    work = protocol.grad_work
    dim = problem.dim
    bounds = block_bounds(dim, scenario.run.blocks)
    sizes = np.diff(bounds)
    offsets = trace["op_offsets"]
    blocks = trace["op_block"]
    fraction = sizes[blocks] / dim
    if problem.sparse:  # the coordinates of the sample's support in each block it moved
        for row in range(len(trace)):
            support = problem.support(int(trace["sample"][row]))
            if support is None:
                continue
            counts = np.bincount(np.searchsorted(bounds, support, side="right") - 1,
                                 minlength=len(sizes))
            ops = slice(int(offsets[row]), int(offsets[row + 1]))
            fraction[ops] = counts[blocks[ops]] / dim
    owner = np.repeat(trace["thread"], np.diff(offsets))
    chosen = np.zeros(len(trace), dtype=bool)
    selected = np.arange(len(trace)) if rows is None else rows
    chosen[selected] = True
    read = trace["op_read_ns"] / np.maximum(fraction, 1e-300)
    write = trace["op_write_ns"] / np.maximum(fraction, 1e-300)
    if write_share is not None:
        factor = np.ones(len(trace))
        factor[selected] = write_share
        write = write * np.repeat(factor, np.diff(offsets))
    moved = (fraction > 0) & np.repeat(chosen, np.diff(offsets))
    out: dict[int, dict[str, np.ndarray]] = {}
    for worker in np.unique(trace["thread"]).tolist():
        mine = (owner == worker) & moved
        rows_of = (trace["thread"] == worker) & chosen
        out[int(worker)] = {"read": read[mine], "write": write[mine],
                            "grad": trace["grad_ns"][rows_of] / float(work),
                            "idle": trace["idle_ns"][rows_of].astype(float)}
    return out


def pooled_samples(samples: dict[int, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Every worker's samples of each operation together."""
    return {op: np.concatenate([ops[op] for ops in samples.values()])
            for op in next(iter(samples.values()))}


def alone_samples(trace: Trace, scenario: Scenario, rows: np.ndarray
                   ) -> dict[int, dict[str, np.ndarray]]:
    """Per worker, the whole-vector write durations alone (``write``: writes no other met)
    and the censored ones (``write_censored``: a met write's time before the other began),
    from :func:`write_survival` over ``rows``."""
    kept, share = write_survival(trace, rows)
    whole = share >= 1
    alone = operation_samples(trace, scenario, kept[whole])
    met = operation_samples(trace, scenario, kept[~whole], write_share=share[~whole])
    return {worker: {"write": alone[worker]["write"], "write_censored": met[worker]["write"]}
            for worker in alone}


def deflated(trace: Trace, factors: dict[str, tuple[np.ndarray, np.ndarray]]) -> Trace:
    """``trace`` with each phase's recorded durations on the given rows multiplied by their
    factors (what they would have been with the other workers idle)."""
    arrays = dict(trace.arrays)
    ops_per_row = np.diff(trace["op_offsets"])
    for phase, column in (("read", "op_read_ns"), ("write", "op_write_ns"),
                          ("grad", "grad_ns"), ("idle", "idle_ns")):
        if phase not in factors:
            continue
        rows, factor = factors[phase]
        per_row = np.ones(len(trace))
        per_row[rows] = factor
        if column.startswith("op_"):
            per_row = np.repeat(per_row, ops_per_row)
        arrays[column] = np.rint(trace[column] * per_row).astype(np.int64)
    return Trace(arrays, trace.scenario_toml, trace.source)


def median_write(runs: list[tuple[Trace, np.ndarray]]) -> float:
    """The median write duration over the runs' rows (0 when none is positive)."""
    writes = np.concatenate([(trace["write_end"][rows] - trace["write_start"][rows])
                             .astype(np.float64) for trace, rows in runs])
    return float(np.median(writes[writes > 0])) if (writes > 0).any() else 0.0
