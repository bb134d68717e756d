"""Speed episodes (``DeviceSpec.slow_factor``, ``slow_ns``, ``fast_ns``).

With ``--episodes`` (:func:`fit_episodes`): when cores switch between their own
pace and a slower one for stretches of milliseconds (on the 2-core machine of
docs/fidelity.md: 1.7× for 5–30 ms, now on one core, now on the other), each worker's log
gradient times in start order are smoothed by a running median of
:data:`EPISODE_WINDOW` updates and all workers' smoothed values split in two by 1-D
2-means; the factor is the ratio of the two levels, every update in the slow level is
slow (all four of its durations divided by the factor before anything else is fitted),
and the mean fast and slow episode lengths are the time spent in each state over the
episodes of that state that ended within the run (at least one); repeats of one run are
split and counted together, so a pace held through each run but changing between runs
gives long episodes (docs/fidelity.md: repeats fitted together). Kept under ``auto`` when
the levels differ by at least :data:`EPISODE_FACTOR` and are well apart (Ashman's D > 2).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import scipy.ndimage

from simulator.trace import Trace

EPISODE_WINDOW = 25  # updates in the running median of a worker's log gradient times


EPISODE_FACTOR = 1.2  # auto: the slow level at least this many times the fast one


def fit_episodes(traces: Trace | list[Trace], mode: str = "off") -> dict[str, Any]:
    """Speed episodes of the cores of one run or of several runs of one setting (the module
    docstring): ``"fields"`` (the ``DeviceSpec`` values ``slow_factor``, ``slow_ns``,
    ``fast_ns``) when kept, what was measured, and ``"slow_rows"`` (not for the report), the
    rows found slow in each run.

    Several runs are split into levels together, and their time in each state and episodes
    ended are added up: a run that stayed in one state throughout adds time and no ended
    episode (its state lasted at least that long), so a pace that holds across whole runs
    gets long episodes, and the share of time slow gives the odds that a core starts slow.
    """
    runs = [traces] if isinstance(traces, Trace) else list(traces)
    report: dict[str, Any] = {"fields": None, "slow_rows": None}
    if mode == "off":
        report["why"] = "not asked for (--episodes off)"
        return report
    levels, orders = _smoothed(runs)
    low, high, slow = _two_levels(levels)
    if slow.all() or not slow.any():
        report["why"] = "the gradient times show one level"
        return report
    slow_of = np.split(slow, np.cumsum([len(trace) for trace in runs])[:-1])
    for index, rows in orders:  # stretches shorter than half the window join the one before
        slow_of[index][rows] = _without_blips(slow_of[index][rows], EPISODE_WINDOW // 2 + 1)
    slow = np.concatenate(slow_of)
    spread = math.sqrt((float(np.var(levels[~slow])) + float(np.var(levels[slow]))) / 2)
    apart = math.sqrt(2) * (high - low) / spread if spread > 0 else math.inf
    factor = math.exp(high - low)
    time, ended = _time_in_states(runs, orders, slow_of)
    means = time / np.maximum(ended, 1)
    report.update(factor=round(factor, 4), separation=round(apart, 3),
                  slow_share=round(float(slow.mean()), 4), episodes_ended=ended.tolist(),
                  fast_ns=round(float(means[0])), slow_ns=round(float(means[1])),
                  runs=len(runs))
    if len(runs) > 1:
        report["slow_share_per_run"] = [round(float(s.mean()), 4) for s in slow_of]
    if mode == "auto" and (factor < EPISODE_FACTOR or apart <= 2):
        report["why"] = (f"levels {factor:.3g}× apart (D = {apart:.3g}): kept from "
                         f"{EPISODE_FACTOR}× and D > 2")
        return report
    report["fields"] = {"slow_factor": round(factor, 4), "slow_ns": max(1, round(means[1])),
                        "fast_ns": max(1, round(means[0]))}
    report["slow_rows"] = [np.flatnonzero(s) for s in slow_of]
    return report


def _smoothed(runs: list[Trace]) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """Every update's log gradient time smoothed by a running median over its worker's
    updates in start order (runs one after the other), and each worker's rows in that order
    (run index, rows)."""
    smooth = [np.empty(len(trace)) for trace in runs]
    orders: list[tuple[int, np.ndarray]] = []
    for index, trace in enumerate(runs):
        for thread in np.unique(trace["thread"]):
            rows = np.flatnonzero(trace["thread"] == thread)
            rows = rows[np.argsort(trace["read_start"][rows], kind="stable")]
            orders.append((index, rows))
            grad = np.log(np.maximum(trace["grad_ns"][rows], 1).astype(np.float64))
            smooth[index][rows] = scipy.ndimage.median_filter(grad, size=EPISODE_WINDOW,
                                                              mode="nearest")
    return np.concatenate(smooth), orders


def _two_levels(levels: np.ndarray) -> tuple[float, float, np.ndarray]:
    """1-D 2-means from the 10% and 90% quantiles: the low and high level and which values
    are in the high one."""
    low, high = np.quantile(levels, [0.1, 0.9])
    for _ in range(100):
        slow = levels > (low + high) / 2
        if slow.all() or not slow.any():
            break
        new = float(np.mean(levels[~slow])), float(np.mean(levels[slow]))
        if new == (low, high):
            break
        low, high = new
    return low, high, slow


def _time_in_states(runs: list[Trace], orders: list[tuple[int, np.ndarray]],
                    slow_of: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The time spent fast and slow, and the episodes of each that ended, over every
    worker's updates in order."""
    time, ended = np.zeros(2), np.zeros(2)
    for index, rows in orders:
        trace = runs[index]
        state = slow_of[index][rows].astype(int)
        start = trace["read_start"][rows].astype(np.float64)
        spans = np.append(np.diff(start), float(trace["write_end"][rows[-1]]) - start[-1])
        np.add.at(time, state, spans)
        np.add.at(ended, state[:-1][state[1:] != state[:-1]], 1)
    return time, ended


def _without_blips(states: np.ndarray, shortest: int) -> np.ndarray:
    """``states`` (booleans in time order) with every stretch of one state shorter than
    ``shortest`` given the state of the stretch before it (the first: the one after)."""
    out = states.copy()
    edges = np.flatnonzero(np.diff(out.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), out.size]
    runs = list(itertools.pairwise(bounds))
    for index, (start, stop) in enumerate(runs):
        if stop - start < shortest and len(runs) > 1:
            out[start:stop] = out[start - 1] if index else out[stop]
    return out
