"""The figure of a comparison (``compare.png``): both runs overlaid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from simulator.fidelity.runs import Run, load_run
from simulator.metrics import PHASE_BINS, error_mask, relative_error, trace_rhythm
from simulator.plots import LOG_LIMIT, draw_timeline, drawable


def _say(ax: Any, text: str) -> None:
    """A panel with nothing to draw says why, in its middle."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _label(run: Run, left_out: int) -> str:
    """A run's legend entry, counting the values it has beyond ``LOG_LIMIT``."""
    return run.label + (f" ({left_out} beyond {LOG_LIMIT:g} left out)" if left_out else "")


def _draw_rhythm(ax: Any, runs: tuple[Run, Run], colours: tuple[str, str]) -> None:
    """Where the other workers' completions fall in a worker's cycle (1 = uniform)."""
    centres = (np.arange(PHASE_BINS) + 0.5) / PHASE_BINS
    drawn = False
    for run, colour in zip(runs, colours, strict=True):
        found = trace_rhythm(run.trace)
        if found["phase_profile"] is not None:
            ax.step(centres, found["phase_profile"], where="mid", color=colour,
                    label=f"{run.label}: staleness / independent {found['coupling']:.3f}"
                    if found["coupling"] is not None else run.label)
            drawn = True
    if drawn:
        ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    else:
        _say(ax, "fewer than two workers ran together")
    ax.set_xlabel("phase in a worker's cycle (0: its read starts; 1: its next read)")
    ax.set_ylabel("others' completions (1 = uniform)")
    ax.set_title("Rhythm: where the other workers complete")


def _draw_staleness(ax: Any, runs: tuple[Run, Run], colours: tuple[str, str]) -> None:
    """Both runs' staleness histograms."""
    # One bar per staleness value up to the 99th percentile, the rarer tail in one last bar
    # (a descheduled worker's few updates can be hundreds stale: bars to there are invisible).
    both = np.concatenate([runs[0].trace["staleness"], runs[1].trace["staleness"]])
    top = int(both.max(initial=0))
    cap = min(top, max(int(np.percentile(both, 99)) if both.size else 0, 3))
    bins = (np.arange(cap + (3 if top > cap else 2)) - 0.5).tolist()
    for run, colour in zip(runs, colours, strict=True):
        ax.hist(np.minimum(run.trace["staleness"], cap + 1), bins=bins, density=True,
                alpha=0.5, color=colour, label=run.label)
    if top > cap:
        ticks = list(range(0, cap + 1, max(1, (cap + 1) // 8)))
        ax.set_xticks([*ticks, cap + 1], [*map(str, ticks), f"{cap + 1}–{top}"])
    ax.set_xlabel("staleness (completions between read and write)")
    ax.set_ylabel("fraction of updates")
    ax.set_title("Staleness")
    ax.legend(fontsize=7)


def _draw_errors(ax: Any, runs: tuple[Run, Run], colours: tuple[str, str]) -> None:
    """Both runs' histograms of the relative gradient error, where measured and plottable
    (a diverged run's errors beyond ``LOG_LIMIT`` are left out: the legend counts them)."""
    errors = [relative_error(r.trace)[error_mask(r.trace)] for r in runs]
    shown = [e[drawable(e)] for e in errors]
    present = [e for e in shown if e.size]
    if present:
        low = min(float(e.min()) for e in present)
        high = max(float(e.max()) for e in present)
        edges = np.logspace(np.log10(low), np.log10(high) + 1e-9, 40).tolist()
        for run, values, every, colour in zip(runs, shown, errors, colours, strict=True):
            if values.size:
                ax.hist(values, bins=edges, alpha=0.5, color=colour,
                        label=_label(run, every.size - values.size),
                        weights=np.full(values.size, 1 / values.size))
        ax.set_xscale("log")
        ax.set_ylabel("fraction of those updates")
        ax.legend(fontsize=7)
    elif any(e.size for e in errors):
        _say(ax, f"every measured gradient error is beyond {LOG_LIMIT:g}")
    else:
        _say(ax, "no measured gradient errors")
    ax.set_xlabel("relative gradient error ‖δ‖/‖g‖")
    ax.set_title("Gradient error (updates that carry one)")


def _draw_loss(ax: Any, runs: tuple[Run, Run], colours: tuple[str, str]) -> None:
    """Both runs' loss curves against gradients computed (a diverged run's points beyond
    ``LOG_LIMIT`` are left out: the legend counts them)."""
    floor = np.finfo(np.float64).tiny
    for run, colour in zip(runs, colours, strict=True):
        kept = drawable(run.curve[:, 1])
        ax.semilogy(run.curve[kept, 0], np.maximum(run.curve[kept, 1], floor), color=colour,
                    label=_label(run, int((~kept).sum())))
    ax.set_xlabel("gradients computed")
    ax.set_ylabel("f(w) − f*")
    ax.set_title("Loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def compare_figure(a: str | Path, b: str | Path) -> Figure:
    """Both runs overlaid: staleness histogram, relative-error histogram, loss curve against
    gradients computed, where the other workers complete in a worker's cycle, and a timeline
    excerpt of each."""
    ra, rb = load_run(a), load_run(b)
    fig = Figure(figsize=(12, 10), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.1])
    colours = ("#4C72B0", "#DD8452")
    _draw_staleness(fig.add_subplot(grid[0, 0]), (ra, rb), colours)
    _draw_errors(fig.add_subplot(grid[0, 1]), (ra, rb), colours)
    _draw_loss(fig.add_subplot(grid[1, 0]), (ra, rb), colours)
    _draw_rhythm(fig.add_subplot(grid[1, 1]), (ra, rb), colours)
    for col, run in enumerate((ra, rb)):
        ax = fig.add_subplot(grid[2, col])
        draw_timeline(ax, run.trace, window=12)
        ax.set_title(f"{run.path.name}: " + ax.get_title(), fontsize=9)
    return fig
