"""The run directory: scenario, summary, trace, loss curve and plots, written all-or-nothing.

Everything is written into a hidden sibling directory first and swapped into place at the end,
so an interrupted run never leaves a half-written or mixed result behind.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simulator.errors import AsyngradError
from simulator.metrics import curve_rows, summarize
from simulator.plots import (
    error_histogram_figure,
    loss_figure,
    timeline_figure,
    utilisation_figure,
)
from simulator.problems import Problem
from simulator.scenario import Scenario, scenario_to_toml
from simulator.trace import Trace

__all__ = ["FILES", "HOLD", "check_out", "hold", "publish", "remove_stale", "strict",
           "write_json", "write_run"]

FILES = ("scenario.toml", "summary.json", "trace.npz", "curve.csv", "timeline.png", "loss.png",
         "error_hist.png")


def strict(value: Any) -> Any:
    """``value`` as a JSON file written by :func:`write_json` gives it back: every float that
    is not finite (a diverged run's) None, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON that strict readers take: NaN and ±inf are written null."""
    path.write_text(json.dumps(strict(value), indent=2, allow_nan=False) + "\n")


def _write_files(where: Path, scenario: Scenario, trace: Trace, summary: dict[str, Any],
                 f_star: float, plots: bool) -> None:
    (where / "scenario.toml").write_text(scenario_to_toml(scenario))
    write_json(where / "summary.json", summary)
    trace.save(where / "trace.npz")
    rows = curve_rows(trace, f_star)
    with open(where / "curve.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["update", "time_ns", "loss", "suboptimality", "dist2", "gradients"])
        writer.writerows((t, time, repr(loss), repr(sub), repr(dist2), n)
                         for t, time, loss, sub, dist2, n in rows)
    if not plots:
        return
    devices = scenario.devices
    kind = "stage" if "stages" in summary else "thread"  # (a model-parallel run's threads)
    lanes = ([f"{kind} {t} ({devices[scenario.device_of(t)].name})"
              for t in range(summary["threads"])] if len(devices) > 1
             else [f"{kind} {t}" for t in range(summary["threads"])] if kind == "stage"
             else None)
    timeline_figure(trace, lanes=lanes).savefig(where / "timeline.png", dpi=110)
    if lanes is not None and kind == "stage":
        utilisation_figure(trace, summary["threads"], lanes).savefig(
            where / "pipeline.png", dpi=110)
    loss_figure([r[0] for r in rows], [r[3] for r in rows],
                f"{scenario.run.protocol}, k={summary['threads']}").savefig(
        where / "loss.png", dpi=110)
    error_histogram_figure(trace).savefig(where / "error_hist.png", dpi=110)


def file_above(path: Path) -> Path | None:
    """The file that the nearest existing path above ``path`` is, where it is one (then
    nothing can be written at ``path``), else None."""
    above = next((p for p in path.parents if p.exists()), Path("."))
    return None if above.is_dir() else above


def check_out(out: str | Path, files: tuple[str, ...] = FILES) -> Path:
    """The directory to write: new, empty, or one holding only ``files`` (it is replaced).

    Raises:
        AsyngradError: ``out`` is a file, or a directory holding anything else (so nothing of
            the user's is ever replaced).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AsyngradError(f"--out = '{out}': exists and is not a directory")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in files)
        if foreign:
            raise AsyngradError(f"--out = '{out}': is a directory with other files "
                                f"({', '.join(foreign[:3])}); choose a new or empty one")
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(out: Path) -> None:
    """Remove the staging and retired directories (``.NAME.partial-PID``, ``.NAME.old-PID``)
    that runs writing ``out`` left when they were killed: only those whose process PID is
    gone (a live one may be writing)."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:partial|old)-(\d+)")
    if not out.parent.is_dir():
        return
    for entry in out.parent.iterdir():
        found = pattern.fullmatch(entry.name)
        if found and entry.is_dir() and not _alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def publish(out: str | Path, files: tuple[str, ...], write: Callable[[Path], None]) -> None:
    """Let ``write`` fill a staging directory, then swap it in for ``out`` in one step.
    Staging directories that killed runs left beside ``out`` go first (:func:`remove_stale`).

    Raises:
        AsyngradError: ``out`` is not a place for these files (see ``check_out``), or it
            cannot be written.
    """
    out = check_out(out, files)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        remove_stale(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        hold("writing")
        write(staging)
        if out.exists():
            retired = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired)
        else:
            staging.rename(out)
    except OSError as err:
        raise AsyngradError(f"--out = '{out}': cannot be written ({err.strerror or err})"
                            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# Fault tests' pause (tests/realrun/test_faults.py): ``ASYNGRAD_HOLD=STAGE:PATH``.
HOLD = "ASYNGRAD_HOLD"


def hold(stage: str, pids: Sequence[int] = ()) -> None:
    """Nothing, unless a fault test set ``ASYNGRAD_HOLD=STAGE:PATH``: then a run reaching
    STAGE (a real run's ``spawned``, ``ready``, ``probing``, ``running``; any run's
    ``writing``, with its staging directory made) writes its worker ``pids`` to PATH and
    waits until the file is gone, so the test can kill a worker, or signal this process,
    at that very stage."""
    at, _, path = os.environ.get(HOLD, "").partition(":")
    if at != stage or not path:
        return
    Path(f"{path}.tmp").write_text(" ".join(str(pid) for pid in pids))
    os.replace(f"{path}.tmp", path)  # whole when it appears
    while os.path.exists(path):
        time.sleep(0.01)


def write_run(out: str | Path, scenario: Scenario, trace: Trace, problem: Problem,
              plots: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the run directory ``out`` (replacing an earlier run there); return the summary.

    ``plots=False`` leaves out the PNG figures (sweeps write many cells); ``extra`` adds
    sections to the summary (real runs add theirs).

    Raises:
        AsyngradError: as :func:`publish`.
    """
    summary = {**summarize(trace, problem, scenario), **(extra or {})}
    f_star = problem.optimum()[1]
    publish(out, FILES, lambda where: _write_files(where, scenario, trace, summary, f_star,
                                                   plots))
    return summary


def cpu_latency(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A real run's ``real.cpu_latency`` from its summary (None for a simulated run, or where
    it was not measured)."""
    real = summary.get("real")
    return real.get("cpu_latency") if isinstance(real, dict) else None


def run_real(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``real`` section of the run directory's ``summary.json``: what a real backend
    recorded (None without a readable summary, or for a simulated or replayed run)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    real = summary.get("real") if isinstance(summary, dict) else None
    return real if isinstance(real, dict) else None


def _real_field(run_dir: str | Path, key: str) -> dict[str, Any] | None:
    """``real.<key>`` of the run directory's ``summary.json`` (None without a readable one,
    for a simulated run, or where it was not measured)."""
    value = (run_real(run_dir) or {}).get(key)
    return value if isinstance(value, dict) else None


def run_cpu_latency(run_dir: str | Path) -> dict[str, Any] | None:
    """:func:`cpu_latency` of the run directory's ``summary.json`` (None without a readable
    one)."""
    return _real_field(run_dir, "cpu_latency")


def run_shared_write(run_dir: str | Path) -> dict[str, Any] | None:
    """A real run's ``real.shared_write``: what a write of its vector cost on lines the other
    CPU copied last, probed before its workers started (realrun/host/probe.py); None where not
    measured."""
    return _real_field(run_dir, "shared_write")


def run_write_meetings(run_dir: str | Path) -> dict[str, Any] | None:
    """A real run's ``real.write_meetings``: two writes of its vector made to meet at chosen
    lags before its workers started, with the stores each lost (realrun/host/probe.py); None
    where not measured."""
    return _real_field(run_dir, "write_meetings")


FAR_NS = 150.0  # CPUs "far apart": a cache line takes at least this long between them


def placement(latency: dict[str, Any] | None) -> str | None:
    """Where the host had a real run's two CPUs, from its ``real.cpu_latency``: ``"far"`` when
    every probe took at least :data:`FAR_NS` one way (different L3 domains: a dense shared
    write then takes many times as long), ``"near"`` when none did, ``"changing"`` when the
    host moved them during the run, None where nothing was measured."""
    if latency is None:
        return None
    far = [latency[key] >= FAR_NS for key in ("before_ns", "after_ns")
           if latency[key] is not None]
    if not far:
        return None
    return "far" if all(far) else "near" if not any(far) else "changing"


def latency_pair(latency: dict[str, Any] | None) -> str:
    """``before / after`` ns of a ``real.cpu_latency`` ("—" where unmeasured)."""
    if latency is None:
        return "—"
    return " / ".join("—" if latency[key] is None else f"{latency[key]:.0f}"
                      for key in ("before_ns", "after_ns"))


def latency_line(latency: dict[str, Any]) -> str:
    """A real run's CPU-to-CPU cache-line latency (``summary.json`` ``real.cpu_latency``)."""
    a, b = latency["cpus"]
    said = [f"{latency[key]:.0f} ns {when}" for key, when in (("before_ns", "before the run"),
                                                              ("after_ns", "after"))
            if latency[key] is not None]
    if not said:
        return f"CPU {a} to CPU {b}: the latency probe could not run"
    where = {"far": "far apart", "near": "near", "changing": "moved during the run"}
    return (f"a cache line passes between CPUs {a} and {b} in " + ", ".join(said)
            + f" ({where[str(placement(latency))]}; far from {FAR_NS:.0f} ns)")
