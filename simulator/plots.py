"""Figures of a trace: thread timeline, loss curve, gradient-error histogram.

Built on ``matplotlib.figure.Figure`` (no pyplot state), so they render the same in scripts,
tests and notebooks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simulator.metrics import (
    ERROR_THRESHOLD,
    busy_intervals,
    error_mask,
    error_rate,
    finite_mask,
    relative_error,
)
from simulator.trace import Trace

__all__ = ["LOG_LIMIT", "draw_timeline", "drawable", "error_histogram_figure", "loss_figure",
           "sweep_figure", "timeline_figure", "utilisation_figure"]

PHASES = (("read", "R", "#4C72B0"), ("grad", "G", "#DD8452"), ("write", "W", "#55A868"))


def timeline_figure(trace: Trace, window: int | None = None,
                    lanes: Sequence[str] | None = None) -> Figure:
    """One lane per thread with its R/G/W segments; lost and torn updates marked.

    Shows the updates that complete in the first ``window`` completions (default: about six
    per thread), so individual interleavings stay readable on long runs. ``lanes`` names the
    lanes (default: ``thread i``).
    """
    threads = (len(lanes) if lanes is not None
               else int(trace["thread"].max()) + 1 if len(trace) else 1)
    fig = Figure(figsize=(11, 1.2 + 0.45 * threads), layout="constrained")
    draw_timeline(fig.add_subplot(), trace, window, lanes)
    fig.legend(loc="outside lower center", ncol=5, frameon=False)
    return fig


def draw_timeline(ax: Axes, trace: Trace, window: int | None = None,
                  lanes: Sequence[str] | None = None) -> None:
    """The timeline of :func:`timeline_figure` on ``ax``."""
    threads = (len(lanes) if lanes is not None
               else int(trace["thread"].max()) + 1 if len(trace) else 1)
    steps = trace.source == "scheduled"  # controlled schedules count steps, not ns
    # Start once every thread is running (real workers start at different times).
    begin = 0 if steps else max((int(trace["read_start"][trace["thread"] == t].min())
                                 for t in range(threads) if np.any(trace["thread"] == t)),
                                default=0)
    after = np.flatnonzero(trace["write_end"] >= begin)
    shown = min(after.size, window or max(24, 6 * threads))
    end = int(trace["write_end"][after[shown - 1]]) if shown else 1
    rows = np.flatnonzero((trace["read_start"] <= end) & (trace["write_end"] >= begin))
    scale = 1.0 if steps else 1e-3  # ns -> µs
    for phase, label, colour in PHASES:
        start, stop = trace[f"{phase}_start"][rows], trace[f"{phase}_end"][rows]
        ax.barh(trace["thread"][rows], (stop - start) * scale, left=start * scale, height=0.6,
                color=colour, edgecolor="white", linewidth=0.4, label=label)
    lost = rows[trace["lost_blocks"][rows] > 0]
    ax.plot(trace["write_end"][lost] * scale, trace["thread"][lost], "x", color="#C44E52",
            markersize=8, mew=2, label="write lost (overwritten)")
    torn = rows[trace["torn"][rows]]
    ax.plot(trace["read_end"][torn] * scale, trace["thread"][torn], "v", color="#8172B3",
            markersize=7, label="torn read")
    ax.set_xlim(begin * scale, max(end, begin + 1) * scale)
    ax.set_yticks(range(threads), lanes or [f"thread {t}" for t in range(threads)])
    ax.invert_yaxis()
    ax.set_xlabel("step" if steps else "time (µs)")
    ax.set_title(f"Thread timeline: {shown} of {len(trace)} updates"
                 + (f", from {begin * scale:.0f} µs (all running)" if begin else ""))


def utilisation_figure(trace: Trace, threads: int, lanes: Sequence[str],
                       windows: int = 60) -> Figure:
    """A pipeline's utilisation: for each stage (thread), the share of each of ``windows``
    equal spans of the run that it spent at work (``simulator.metrics.busy_intervals``)."""
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.add_subplot()
    start = int(trace["read_start"].min()) if len(trace) else 0
    end = max(int(trace["write_end"].max()) if len(trace) else 1, start + 1)
    edges = np.linspace(start, end, windows + 1)
    lo, hi = edges[:-1, None], edges[1:, None]
    for thread in range(threads):
        begin, stop = busy_intervals(trace, thread)
        busy = np.clip(np.minimum(stop[None, :], hi) - np.maximum(begin[None, :], lo), 0,
                       None).sum(axis=1) / (hi[:, 0] - lo[:, 0])
        share = (stop - begin).sum() / (end - start)
        ax.step((edges[:-1] - start) * 1e-6, busy, where="post",
                label=f"{lanes[thread]}: {share:.0%} at work")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("share of the time at work")
    ax.set_title(f"Pipeline utilisation per stage ({windows} windows)")
    ax.legend(loc="lower right", frameon=False)
    return fig


def loss_figure(updates: Sequence[float] | np.ndarray,
                suboptimality: Sequence[float] | np.ndarray, label: str = "") -> Figure:
    """f(w_t) − f* against completed updates, log scale."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.semilogy(updates, _positive(suboptimality), marker=".", label=label or None)
    ax.set_xlabel("completed updates t")
    ax.set_ylabel("f(w_t) − f*")
    ax.set_title("Suboptimality")
    ax.grid(True, which="both", alpha=0.3)
    if label:
        ax.legend()
    return fig


def error_histogram_figure(trace: Trace) -> Figure:
    """Histogram of ‖δ‖/‖g‖ over the measured updates that carry a gradient error; the
    title's counts and rate are the summary's (:func:`~simulator.metrics.error_rate`: over
    the updates with finite ‖δ‖ and ‖g‖), and a diverged run's errors beyond
    :data:`LOG_LIMIT` are left out of the histogram and counted."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    relative = relative_error(trace)
    finite = finite_mask(trace)
    carried = error_mask(trace) & finite
    errors = relative[carried & drawable(relative)]
    rate = error_rate(trace)
    if errors.size:
        bins = np.logspace(np.log10(errors.min()), np.log10(errors.max()) + 1e-9, 40).tolist()
        ax.hist(errors, bins=bins, color="#4C72B0")
        ax.set_xscale("log")
        ax.axvline(float(np.median(errors)), color="#C44E52", linestyle="--",
                   label=f"median {np.median(errors):.3g}")
        ax.legend()
    else:
        said = ("exact metrics were off" if not relative.size
                else "no finite measurement" if not finite.any()
                else f"every gradient error is beyond {LOG_LIMIT:g}" if carried.any()
                else "no gradient errors")
        ax.text(0.5, 0.5, said, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("relative gradient error ‖δ‖/‖g‖")
    ax.set_ylabel("updates")
    beyond = int(carried.sum()) - errors.size
    unmeasured = relative.size - int(finite.sum())
    notes = ([f"{beyond} beyond {LOG_LIMIT:g} not drawn"] if beyond else []) + (
        [f"{unmeasured} not finite left out"] if unmeasured else [])
    ax.set_title(f"Gradient error: {int(carried.sum())} of {int(finite.sum())} measured "
                 f"updates (rate {'—' if rate is None else f'{rate:.3f}'}, threshold "
                 f"{ERROR_THRESHOLD:g})" + (f"\n{'; '.join(notes)}" if notes else ""),
                 fontsize=10 if notes else None)
    return fig


#: The largest value a log axis shows: a diverged run's values run past it to infinity, and
#: matplotlib's margins and log-axis ticks spanning more decades overflow (LogLocator).
LOG_LIMIT = 1e100


def drawable(values: np.ndarray) -> np.ndarray:
    """Where values can go on a log axis: finite and at most :data:`LOG_LIMIT` in size."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (np.abs(values) <= LOG_LIMIT)


def _positive(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Values for a log axis: a value at or below 0 (a suboptimality reached to rounding)
    drawn at the series' smallest positive value (the smallest positive float if it has
    none), and NaN (not drawn) where not :func:`drawable`."""
    values = np.asarray(values, dtype=np.float64)
    shown = drawable(values)
    positive = values[shown & (values > 0)]
    floor = positive.min() if positive.size else np.finfo(np.float64).tiny
    return np.where(shown, np.maximum(values, floor), np.nan)


# One curve of a sweep cell: columns simulated time (ns), gradients computed, suboptimality.
Curve = np.ndarray


def _mean_curve(curves: Sequence[Curve], column: int) -> tuple[np.ndarray, np.ndarray]:
    """Suboptimality averaged over seeds on the union of their x values (``column``), each
    seed interpolated and held at its last value past its end."""
    x = np.unique(np.concatenate([c[:, column] for c in curves]))
    y = np.mean([np.interp(x, c[:, column], c[:, 2]) for c in curves], axis=0)
    return x, y


def sweep_figure(groups: dict[tuple[str, ...], list[Curve]], names: Sequence[str]) -> Figure:
    """Suboptimality against simulated time (top) and against gradients computed (bottom),
    one line per combination of the swept values ``names`` (mean over seeds): the
    speed-versus-statistical-efficiency trade-off. Colours follow the first swept field;
    with two or more, the last one splits the figure into columns."""
    facet = len(names) >= 2
    columns = sorted({key[-1] for key in groups}, key=_natural) if facet else [""]
    colors = sorted({key[0] for key in groups}, key=_natural) if names else [""]
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
               "#8C8C8C", "#CCB974", "#64B5CD"]
    styles = ["-", "--", ":", "-."]
    middles: list[tuple[str, ...]] = (sorted({key[1:-1] for key in groups}) if len(names) > 2
                                      else [()])
    fig = Figure(figsize=(3.6 * len(columns) + 1.5, 6.4), layout="constrained")
    axes = fig.subplots(2, len(columns), squeeze=False, sharey=True)
    for key, curves in sorted(groups.items(), key=lambda item: [_natural(v) for v in item[0]]):
        col = columns.index(key[-1]) if facet else 0
        color = palette[colors.index(key[0]) % len(palette)] if names else palette[0]
        style = styles[middles.index(key[1:-1]) % len(styles)] if len(names) > 2 else "-"
        label = ", ".join(f"{n.split('.')[-1]}={v}"
                          for n, v in zip(names[:-1] if facet else names, key, strict=False))
        for row, (column, scale) in enumerate(((0, 1e-6), (1, 1.0))):
            x, y = _mean_curve(curves, column)
            axes[row][col].semilogy(x * scale, _positive(y), style, color=color,
                                    label=label or None)
    for col, value in enumerate(columns):
        title = f"{names[-1].split('.')[-1]} = {value}" if facet else ""
        axes[0][col].set_title(title)
        axes[0][col].set_xlabel("simulated time (ms)")
        axes[1][col].set_xlabel("gradients computed")
        for row in range(2):
            axes[row][col].grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("f(w) − f*")
    axes[1][0].set_ylabel("f(w) − f*")
    if names:
        handles, labels = axes[0][0].get_legend_handles_labels()
        seen = dict(zip(labels, handles, strict=True))
        for ax in axes.ravel():
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                seen.setdefault(label, handle)
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper",
                   fontsize="small")
    seeds = max(len(c) for c in groups.values())
    fig.suptitle(f"Suboptimality against simulated time and against work (mean over {seeds} "
                 f"seed{'s' if seeds > 1 else ''})")
    return fig


def _natural(value: str) -> tuple[int, float | str]:
    """Sort numbers numerically, before text."""
    try:
        return (0, float(value))
    except ValueError:
        return (1, value)
