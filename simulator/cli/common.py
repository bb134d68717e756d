"""What the command groups share: the parser that exits 2 on a bad flag, the common
arguments of a subcommand, the progress bar and the printed summary of a run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from simulator.errors import ScenarioError

__all__ = ["Parser", "command", "floats", "ns", "print_diverged", "print_summary", "progress"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def print_summary(summary: dict[str, Any], out: Path, seconds: float) -> None:
    error, stale, over = summary["gradient_error"], summary["staleness"], summary["overwrites"]
    rate = "off" if error["rate"] is None else f"{error['rate']:.3f}"
    median = error["relative"]["p50"]
    real = summary.get("real")  # a real run: the backend and the mode that ran
    ran = (f"{summary['protocol']}" if real is None else
           f"{real.get('backend', 'shm')} {real.get('mode', summary['protocol'])}")
    print(f"{ran} k={summary['threads']} T={summary['updates']} "
          f"B={summary['blocks']}{'' if real else ' ' + summary['write_mode']} on "
          f"{summary['problem']['name']} (d={summary['problem']['dim']})")
    print(f"  gradient error rate {rate}, median relative error "
          f"{'n/a' if median is None else f'{median:.3g}'}")
    if summary.get("steps", summary["updates"]) != summary["updates"]:
        print(f"  {summary['steps']} applied steps, {summary['discarded']} gradients discarded")
    if summary.get("ended_early"):
        print(f"  ended early: {summary['updates']} gradients; dead threads "
              f"{summary.get('dead_threads', [])} (a protocol waiting on them stalls)")
    if stale["mean"] is not None:
        print(f"  staleness mean {stale['mean']:.2f}, p95 {stale['p95']:.0f}, "
              f"max {stale['max']}")
    print(f"  lost blocks {over['lost_blocks']}, torn reads {over['torn_reads']}, "
          f"read-overwritten blocks {over['read_overwrite_blocks']}")
    met = summary.get("writes", {})
    if summary["threads"] > 1 and met.get("met_rate"):
        lone = met["lone_median_ns"]
        print(f"  writes met by another {met['met_rate']:.3f} (median "
              f"{met['met_median_ns'] / 1e3:.3g} µs, lone "
              f"{'n/a' if lone is None else f'{lone / 1e3:.3g}'} µs)")
    clock = "wall-clock span" if summary["source"] == "real" else "simulated time"
    print(f"  final suboptimality {summary['loss']['final_suboptimality']:.4g}, "
          f"{clock} {summary['time']['span_ns'] / 1e6:.3f} ms "
          f"({summary['time']['updates_per_second']:.4g} updates/s)")
    task = summary.get("task", {})
    if task.get("accuracy") is not None:
        held = task["held_out_accuracy"]
        print(f"  accuracy {task['accuracy']:.3f}"
              + ("" if held is None else f", held out {held:.3f}"))
    print(f"  wrote {out}/ in {seconds:.2f} s")


def default_out(out: str | None, command: str, name: str | None = None) -> Path:
    """``--out``, or where it is left out ``runs/COMMAND`` (``runs/COMMAND-NAME`` with the
    scenario's ``name``).

    Raises:
        ScenarioError: a name that is not a plain file name (``../x`` wrote outside runs/).
    """
    if out is not None:  # (an empty one is refused in ``main``)
        return Path(out)
    if name is None:
        return Path("runs") / command
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ScenarioError("name", name, f"cannot name the default --out "
                            f"runs/{command}-NAME (give --out)")
    return Path("runs") / f"{command}-{name}"


def progress(total: int, quiet: bool) -> Any:
    """A progress bar on stderr when it is a terminal. A terminal that reports no size (a
    pseudo-terminal nobody sized) counts as 80 × 24: tqdm would draw nothing in 0 × 0."""
    from tqdm import tqdm
    shown = not quiet and sys.stderr.isatty()
    columns, lines = os.get_terminal_size(sys.stderr.fileno()) if shown else (0, 0)
    return tqdm(total=total, unit="upd", disable=not shown, leave=False,
                ncols=columns or 80, nrows=lines or 24)


def print_diverged(summary: dict[str, Any]) -> None:
    """The line a run that diverged gets after its summary (summary.json: diverged_at)."""
    if summary.get("diverged_at") is not None:
        print(f"  diverged at update {summary['diverged_at']}: w or f(w) stopped being finite "
              f"(lr {summary['lr']:g})")


def floats(name: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise ScenarioError(name, text, "must be numbers separated by commas") from None


def ns(flag: str, text: str) -> int:
    """A flag's value in ns: a non-negative integer (``auto`` handled by the caller)."""
    try:
        value = int(text)
    except ValueError:
        raise ScenarioError(flag, text, "must be ns (an integer) or auto") from None
    if value < 0:
        raise ScenarioError(flag, value, "must be >= 0 ns")
    return value


def command(commands: Any, name: str, summary: str, run: Any,
            out: str | None = "run directory to write", scenario: bool = True,
            out_required: bool = True) -> argparse.ArgumentParser:
    """A subcommand of ``commands`` (the parser's subparsers) with the arguments most share:
    a scenario file, --out, --quiet and --set overrides (``out=None``: no --out;
    ``scenario=False``: no scenario or --set)."""
    sub = commands.add_parser(name, help=summary)
    if scenario:
        sub.add_argument("scenario", nargs="?",
                         help="scenario TOML (default: embedded default)")
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a scenario field, e.g. run.threads=4 (repeatable)")
    if out is not None:
        sub.add_argument("--out", required=out_required, help=out)
        sub.add_argument("--quiet", action="store_true", help="print nothing on success")
    sub.set_defaults(run=run)
    return sub
