"""The trace: one record per update, the one format every backend produces, made by the one
builder every backend uses (:class:`TraceBuilder`, which derives staleness, read-overwrites,
torn reads and lost blocks from the records).

Rows are gradients in the order they were applied or discarded. Most protocols apply each
gradient in its own write, so row t−1 is completion t of the serialized view; protocols that
average several gradients in one write (minibatch, accumulation, rounds) give them the same
``step`` (the last row writes; the others have an empty write at its end), and gradients a
protocol discards have ``step`` 0.
Per-block durations are ragged (sparse updates move only some blocks): the ``op_*`` arrays hold
them flat, update i owning ``op_offsets[i]:op_offsets[i+1]``. The file is a ``.npz`` written
with fixed zip timestamps, so the same run gives the same bytes, and it is read with
``allow_pickle=False``; the resolved scenario travels inside it as TOML text.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import AsyngradError, TraceError

__all__ = ["COLUMNS", "CONVOY_PAIR_COLUMNS", "CURVE", "OP_RECORD", "READ_SWEEP_COLUMNS", "RECORD",
           "SCHEMA", "Frames", "Trace", "TraceBuilder", "convoy_pairs", "idle_gaps",
           "read_report", "read_sweeps", "staleness"]

SCHEMA = 2

# Per-update columns and their dtypes.
COLUMNS: dict[str, type] = {
    "uid": np.int64,            # update id in start order
    "thread": np.int32,
    "thread_seq": np.int64,     # the update's index among its thread's updates
    "sample": np.int64,
    "step": np.int64,           # the completion t that applied this gradient (0: discarded)
    "read_start": np.int64, "read_end": np.int64,
    "grad_start": np.int64, "grad_end": np.int64,
    "write_start": np.int64, "write_end": np.int64,
    "grad_ns": np.int64,        # the gradient's own duration (without waiting for a core)
    "idle_ns": np.int64,        # local work before the update's read (sampling, bookkeeping)
    "staleness": np.int64,      # completions between this update's read start and write end
    "read_overwrites": np.int32,  # blocks copied after a store to them that ended after the
    "torn": np.bool_,             # read's start; the copies mix versions (``read_report``)
    "lost_blocks": np.int32,    # this update's block stores overwritten by others (load_store)
    "overwrote": np.int32,      # other updates' block stores this update's stores overwrote
    "delay": np.int32,          # injected staleness τ (its read saw w from τ completions back)
    "error_norm": np.float64,   # ‖e‖ of the injected gradient error (0: none)
    "dropped": np.bool_,        # injected: the write was lost (the completion changed nothing)
    "lr_scale": np.float64,     # the update rule's factor on the learning rate
    "measured": np.bool_,       # exact metrics were computed for this completion
    "s_norm": np.float64, "g_norm": np.float64,
    "delta_norm": np.float64, "delta_dot": np.float64,  # ‖δ_t‖, ⟨δ_t, w_{t−1} − w*⟩
}
OPS: dict[str, type] = {"op_block": np.int32, "op_read_ns": np.int64, "op_write_ns": np.int64}
# The loss curve: completions t, time (ns), f(w_t), ‖w_t − w*‖², gradients computed by then.
CURVE: dict[str, type] = {"curve_t": np.int64, "curve_time": np.int64,
                          "curve_loss": np.float64, "curve_dist2": np.float64,
                          "curve_n": np.int64}
OTHER: dict[str, type] = {"op_offsets": np.int64, "w0": np.float64, "w_final": np.float64,
                          **CURVE}
# Every array a trace must hold, with its dtype (checked when a trace is made).
_EXPECTED = {name: np.dtype(t) for name, t in {**COLUMNS, **OPS, **OTHER}.items()}
# What a backend records per gradient, in this order (``TraceBuilder.add``): the columns
# above less the derived ones, plus two completion counts: ``seen``, the completions before
# the vector the gradient read (−1: not counted, taken from the times), and ``completed``,
# the completions when it was applied (its own included) or discarded. ``idle_ns`` −1: not
# measured, taken from the times (from the thread's previous write end, or time 0).
RECORD = ("uid", "thread", "thread_seq", "sample", "step", "read_start", "read_end",
          "grad_start", "grad_end", "write_start", "write_end", "grad_ns", "idle_ns", "seen",
          "completed", "overwrote", "delay", "error_norm", "dropped", "lr_scale", "measured",
          "s_norm", "g_norm", "delta_norm", "delta_dot")
# Per block operation: the block, its read and write durations, when its copy and its store
# ended (−1: none; ``read_report``).
OP_RECORD = ("block", "read_ns", "write_ns", "copied", "stored")
EXTRA = "extra_"  # protocol- and run-specific 1-d arrays (dead threads, residuals, ...)
# Two writes of one block that met in time and no third (write convoys): one row per pair,
# stored flat. Lost shares are of the block's coordinates; simulated with timing.convoy_*,
# classified coordinate by coordinate in real measure-mode runs.
CONVOY_PAIR_COLUMNS = ("leader_uid", "joiner_uid", "lag_ns", "leader_lost", "joiner_lost")
# A read that another worker's write overlapped: one row per (read, write), stored flat. How
# long before the read's end the write began, the write's duration (planned, in a
# simulation), the coordinates its step changes and how many of them the read's copy holds
# (``[hardware.sweeping_reads]``: recorded by simulations, and by measure-mode real runs from
# the workers' read copies).
READ_SWEEP_COLUMNS = ("begun_ns", "write_ns", "coordinates", "stored")


@dataclass
class Trace:
    """Arrays of one run plus the resolved scenario (TOML text) and where it came from."""

    arrays: dict[str, np.ndarray]
    scenario_toml: str
    source: str = "simulated"

    def __post_init__(self) -> None:
        self._validate()

    def __len__(self) -> int:
        return int(self.arrays["uid"].size)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def _validate(self) -> None:
        missing = sorted(set(_EXPECTED) - set(self.arrays))
        if missing:
            raise TraceError(f"trace: missing arrays {', '.join(missing)}")
        rows = self.arrays["uid"].shape
        for name, dtype in _EXPECTED.items():
            array = self.arrays[name]
            if array.dtype != dtype or array.ndim != 1:
                raise TraceError(f"trace: array {name} has dtype {array.dtype} and shape "
                                 f"{array.shape}; expected 1-d {dtype}")
            if name in COLUMNS and array.shape != rows:
                raise TraceError(f"trace: column {name} has {array.size} rows, uid has {rows[0]}")
        for name, array in self.arrays.items():
            if name not in _EXPECTED and not (name.startswith(EXTRA) and array.ndim == 1
                                             and array.dtype.kind in "biuf"):
                raise TraceError(f"trace: unexpected array {name}")
        offsets = self.arrays["op_offsets"]
        ops = self.arrays["op_block"].size
        if (offsets.size != rows[0] + 1 or offsets[0] != 0 or offsets[-1] != ops
                or np.any(np.diff(offsets) < 0)):
            raise TraceError("trace: op_offsets do not describe the op arrays")
        if any(self.arrays[n].size != ops for n in OPS):
            raise TraceError("trace: op arrays differ in length")

    def ops_of(self, row: int) -> slice:
        """The slice of the ``op_*`` arrays that belongs to update ``row``."""
        offsets = self.arrays["op_offsets"]
        return slice(int(offsets[row]), int(offsets[row + 1]))

    def save(self, path: str | Path) -> None:
        """Write a ``.npz`` with deterministic bytes (fixed member order and timestamps)."""
        members = {**self.arrays, "schema": np.array(SCHEMA),
                   "scenario": np.array(self.scenario_toml), "source": np.array(self.source)}
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(members):
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, np.array(members[name], order="C"),
                                          allow_pickle=False)
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                # Level 1: a 450,000-row trace in 0.4 s instead of 2.7 s at zlib's default
                # level, 6% larger (a stopped run's user waits for it).
                archive.writestr(info, buffer.getvalue(), compresslevel=1)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read and validate a trace file.

        Raises:
            TraceError: the file is missing, not a trace, of another schema, or inconsistent.
        """
        if not Path(path).is_file():
            raise TraceError(f"trace: {path}: no such file")
        if not zipfile.is_zipfile(path):
            raise TraceError(f"trace: {path}: not an .npz trace file")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays: dict[str, Any] = {name: data[name] for name in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
            raise TraceError(f"trace: {path}: not a readable trace file ({err})") from None
        for key in ("schema", "scenario", "source"):
            if key not in arrays:
                raise TraceError(f"trace: {path}: missing {key!r}; not an asyngrad trace")
        schema = arrays.pop("schema")
        if schema.shape != () or int(schema) != SCHEMA:
            raise TraceError(f"trace: {path}: schema is not {SCHEMA}")
        scenario, source = str(arrays.pop("scenario")), str(arrays.pop("source"))
        return cls(arrays, scenario, source)

    def to_pandas(self) -> Frames:
        """The trace as pandas DataFrames (``pip install asyngrad-lab[pandas]``): one row
        per gradient (the per-update columns), one per block operation (the ``op_*``
        arrays, with the ``row`` and ``uid`` of the update that made it) and one per
        loss-curve point.

        Raises:
            AsyngradError: pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError:
            raise AsyngradError("Trace.to_pandas needs pandas: pip install pandas "
                                "(or the project's extra: pip install -e '.[pandas]')") from None
        a = self.arrays
        row = np.repeat(np.arange(len(self)), np.diff(a["op_offsets"]))
        return Frames(
            rows=pd.DataFrame({name: a[name] for name in COLUMNS}),
            ops=pd.DataFrame({"row": row, "uid": a["uid"][row], "block": a["op_block"],
                              "read_ns": a["op_read_ns"], "write_ns": a["op_write_ns"]}),
            curve=pd.DataFrame({name.removeprefix("curve_"): a[name] for name in CURVE}))


@dataclass(frozen=True)
class Frames:
    """A trace as DataFrames (``Trace.to_pandas``): ``rows`` one per gradient, ``ops`` one
    per block operation, ``curve`` one per loss-curve point (``t`` completions, ``time`` ns,
    ``loss``, ``dist2`` = ‖w − w*‖², ``n`` gradients computed)."""

    rows: Any
    ops: Any
    curve: Any


class TraceBuilder:
    """The one builder of every trace: the engine (timed or under a scheduler), the real
    workers' merge (``realrun.timeline``) and the parameter server (``realrun.ps``) add one
    record per gradient, in trace order, and :meth:`build` derives the other columns, here
    and nowhere else: ``staleness`` (:func:`staleness`), ``read_overwrites`` and ``torn``
    (:func:`read_report`), ``lost_blocks`` and the ``op_offsets``; and, where a backend
    measured none, ``idle_ns`` (:func:`idle_gaps`).

    A record is a tuple of :data:`RECORD`'s fields (``add``, one gradient; ``rows`` holds
    them) or a block of columns (``extend``, many at once); each comes with its block
    operations, :data:`OP_RECORD`'s fields."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._counts: list[int] = []
        self._ops: tuple[list[int], ...] = tuple([] for _ in OP_RECORD)
        self._columns: list[tuple[dict[str, Any], Any, dict[str, Any]]] = []

    def add(self, record: tuple[Any, ...], blocks: Sequence[int], read_ns: Iterable[int],
            write_ns: Iterable[int], copied: Iterable[int], stored: Iterable[int]) -> None:
        """Append one gradient: ``record`` holds :data:`RECORD`'s fields in order, the other
        arguments one entry per block operation (:data:`OP_RECORD`)."""
        self.rows.append(record)
        self._counts.append(len(blocks))
        block, read, write, copy, store = self._ops
        block.extend(blocks)
        read.extend(read_ns)
        write.extend(write_ns)
        copy.extend(copied)
        store.extend(stored)

    def extend(self, records: dict[str, np.ndarray], counts: np.ndarray,
               ops: dict[str, np.ndarray]) -> None:
        """Append many gradients at once: ``records`` one column per :data:`RECORD` field,
        ``counts`` each one's block operations, ``ops`` one flat column per
        :data:`OP_RECORD` field. They come before the records ``add`` appends."""
        self._columns.append((records, counts, ops))

    def build(self, scenario_toml: str, w0: np.ndarray, w_final: np.ndarray,
              curve: dict[str, np.ndarray], *, lost: Sequence[int] | np.ndarray | None = None,
              extras: dict[str, np.ndarray] | None = None, source: str = "simulated") -> Trace:
        """The trace of the records: ``lost`` counts each update's stores that others
        overwrote, by uid (none: 0); ``curve`` holds the :data:`CURVE` arrays and ``extras``
        the ``extra_*`` ones, named without the prefix."""
        records, counts, ops = self._gathered()
        if np.any(records["idle_ns"] < 0):
            records["idle_ns"] = np.where(records["idle_ns"] >= 0, records["idle_ns"],
                                          idle_gaps(records))
        step, seen = records["step"], records["seen"]
        if np.any(seen < 0):  # not counted: the applied writes that ended by the read's start
            seen = np.where(seen >= 0, seen, np.searchsorted(
                np.sort(records["write_end"][step > 0]), records["read_start"], side="right"))
        derived = {"staleness": staleness(step, seen, records["completed"], records["delay"])}
        derived["read_overwrites"], derived["torn"] = read_report(
            records["read_start"], np.repeat(np.arange(counts.size), counts), ops["block"],
            ops["copied"], ops["stored"])
        derived["lost_blocks"] = (np.zeros(step.size) if lost is None else
                                  np.asarray(lost, dtype=np.int32)[records["uid"]])
        arrays: dict[str, np.ndarray] = {
            name: np.asarray(derived[name] if name in derived else records[name], dtype=dtype)
            for name, dtype in COLUMNS.items()}
        arrays.update(
            op_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            **{f"op_{name}": ops[name].astype(OPS[f"op_{name}"])
               for name in ("block", "read_ns", "write_ns")},
            w0=np.asarray(w0, dtype=np.float64), w_final=np.asarray(w_final, dtype=np.float64),
            **curve)
        arrays.update({f"{EXTRA}{name}": values for name, values in (extras or {}).items()})
        return Trace(arrays, scenario_toml, source)

    def _gathered(self) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """Every record and op as one column each (the ``extend`` blocks, then the rows)."""
        columns = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(RECORD)
        if not self._columns:  # (the rows alone: nothing to join)
            return ({name: np.asarray(column, dtype=_RECORD_TYPES[name])
                     for name, column in zip(RECORD, columns, strict=True)},
                    np.asarray(self._counts, dtype=np.int64),
                    {name: np.asarray(values, dtype=np.int64)
                     for name, values in zip(OP_RECORD, self._ops, strict=True)})
        blocks: list[tuple[dict[str, Any], Any, dict[str, Any]]] = [
            *self._columns, (dict(zip(RECORD, columns, strict=True)), self._counts,
                             dict(zip(OP_RECORD, self._ops, strict=True)))]
        return ({name: np.concatenate([np.asarray(b[0][name], dtype=_RECORD_TYPES[name])
                                       for b in blocks]) for name in RECORD},
                np.concatenate([np.asarray(b[1], dtype=np.int64) for b in blocks]),
                {name: np.concatenate([np.asarray(b[2][name], dtype=np.int64) for b in blocks])
                 for name in OP_RECORD})


_RECORD_TYPES: dict[str, type] = {**COLUMNS, "seen": np.int64, "completed": np.int64}


def idle_gaps(records: dict[str, np.ndarray]) -> np.ndarray:
    """Per gradient, the time from its thread's previous write end (in ``thread_seq`` order;
    for a thread's first, from time 0, a real run's first read) to its read start, never
    negative: the local work before its read where a backend measures none."""
    order = np.lexsort((records["thread_seq"], records["thread"]))
    thread, read_start = records["thread"][order], records["read_start"][order]
    previous = np.zeros(order.size, dtype=np.int64)
    previous[1:] = np.where(thread[1:] == thread[:-1], records["write_end"][order][:-1], 0)
    gaps = np.empty(order.size, dtype=np.int64)
    gaps[order] = np.maximum(read_start - previous, 0)
    return gaps


def staleness(step: np.ndarray, seen: np.ndarray, completed: np.ndarray,
              delay: np.ndarray) -> np.ndarray:
    """Per gradient, the write completions between the vector it read and its own, plus the
    injected delay τ (its read saw w from τ completions further back): with ``seen``
    completions before its read and ``completed`` when it was applied (its own, step > 0,
    included) or discarded (step 0),

        staleness = completed − [step > 0] − seen + τ,

    the one definition of the column for simulated, scheduled, replayed and real traces.
    Never below τ (a real update that stored nothing has no write end after its read)."""
    return np.maximum(completed - (step > 0) - seen, 0) + delay


def read_report(read_start: np.ndarray, op_row: np.ndarray, op_block: np.ndarray,
                copy_at: np.ndarray, store_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per update (read-overwritten blocks, torn), from when each block was copied and stored:
    the one definition of both columns for simulated, replayed and real traces.

    The ops are flat: op i belongs to update ``op_row[i]`` and block ``op_block[i]``;
    ``copy_at[i]`` is when that update's copy of the block ended and ``store_at[i]`` when its
    store to the block ended (−1: none, e.g. a write dropped or never made). With S_b the
    store ends of block b over all updates:

    * block b of update u is read-overwritten when a store to b ended after u's read began
      and before u's copy of b ended: r_u < s < c_ub for some s ∈ S_b;
    * u's read is torn when its copies cannot come from one instant: copy b holds the stores
      to b that ended before c_ub and is valid from the last of them to the first later one,
      [max{s < c_ub}, min{s ≥ c_ub}); the read is torn when it copied two or more blocks and
      these intervals do not meet (the newest contained store ends after another block's
      first missed store). A read of one block is never torn. Intervals that only touch
      (a held and a missed store of one nanosecond) count as meeting: from times alone
      such a tie is ambiguous (a copy made the very nanosecond a store ended may hold it,
      as in a serial run with writes of no duration), and a read is called torn only when
      no order of the tied stores explains it.

    A block store is one instant, its end (the serialized view's completion of that block);
    what a copy holds of a write still in flight (``[hardware.sweeping_reads]``) is recorded
    apart, in the trace's ``extra_read_sweeps``, and shows in δ.
    """
    n = int(read_start.size)
    overwritten = np.zeros(n, dtype=np.int32)
    newest = np.full(n, -np.inf)
    first_later = np.full(n, np.inf)
    copied = copy_at >= 0
    order = np.argsort(op_block, kind="stable")
    blocks = op_block[order]
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    for ops in np.split(order, cuts) if order.size else []:
        stores = np.sort(store_at[ops][store_at[ops] >= 0])
        ops = ops[copied[ops]]
        rows, copies = op_row[ops], copy_at[ops]
        before_copy = np.searchsorted(stores, copies, side="left")
        after_start = np.searchsorted(stores, read_start[rows], side="right")
        np.add.at(overwritten, rows, (before_copy > after_start).astype(np.int32))
        padded = np.concatenate([[-np.inf], stores, [np.inf]])
        np.maximum.at(newest, rows, padded[before_copy])
        np.minimum.at(first_later, rows, padded[before_copy + 1])
    copies_per_row = np.bincount(op_row[copied], minlength=n)
    return overwritten, (copies_per_row > 1) & (newest > first_later)


def convoy_pairs(trace: Trace) -> np.ndarray | None:
    """The trace's write pairs as rows of :data:`CONVOY_PAIR_COLUMNS` (None: not recorded)."""
    flat = trace.arrays.get(f"{EXTRA}convoy_pairs")
    return None if flat is None else flat.reshape(-1, len(CONVOY_PAIR_COLUMNS))


def read_sweeps(trace: Trace) -> np.ndarray | None:
    """The trace's reads under a write as rows of :data:`READ_SWEEP_COLUMNS` (None: not
    recorded)."""
    flat = trace.arrays.get(f"{EXTRA}read_sweeps")
    return None if flat is None else flat.reshape(-1, len(READ_SWEEP_COLUMNS))
