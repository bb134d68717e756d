"""Interference (``timing.*_under_*``): one worker's phase slowed under another's.

With ``--interference`` (two or more workers): a phase's draw is its duration
with the time spent under another worker's phase q counted 1/(1 + slowdown_q)
(:func:`undisturbed`; exact for two workers, the shares add for more). Rows are grouped
by what the other workers were doing when the phase began, which its own duration cannot
have chosen: all idle, or one in phase q with at least 10% of a typical duration to go
(30 rows a group at least), and each group is compared with the idle group of its own run
(runs at several worker counts differ by their contention, ``*_per_thread``, which slows
every row of a run alike; pooled, the idle rows were mostly the fewer-worker runs' and
contention came out as interference). A group whose median duration is not above the idle
group's by three standard errors (the runs' gaps weighted by their inverse variances) fits
no slowdown (:func:`_slower`); the others' solve
"each group's median draw equals its run's idle group's" (least squares, in [0, 20], with a
pull of 0.05 per unit slowdown toward none: a phase that every group's rows spend under
the same other phase, as a long gradient under the other's, leaves its slowdown
undetermined, and it is then none, not the search's start); with convoys a write is
not slowed by another write, and the writes are those that met no other, or with
``write_shared`` fitted their times alone (a met write's censored at the meeting, the
groups' medians then Kaplan–Meier ones). The durations' distributions are then fitted
on the draws.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.optimize

from simulator.fidelity.durations import MIN_PAIRS, log_median
from simulator.fidelity.runs import phase_windows, write_survival
from simulator.trace import Trace

# Interference: the other workers' phases that slow one (idle is the reference), the
# largest slowdown fitted, the weakest "auto" keeps, rounds of the coordinate-wise fit.
_OTHERS = ("read", "grad", "write")


_MAX_SLOWDOWN = 20.0


_RIDGE = 0.005  # interference: pull toward none per unit slowdown, in log-median units


_SIGNIFICANT = 3.0  # interference: standard errors a group's median must lie above


_MAD_TO_SD = 1.4826  # a normal sample's standard deviation over its median absolute deviation


_MEDIAN_SE = 1.2533  # a normal sample's median's standard error over its mean's


_MIN_UNDER = 0.1


_COVER = 0.1  # rows under another's phase: for this share of a typical duration at least


_FLOOR = 0.05  # the least share of a recorded duration its draw is taken to be


def _covered(starts: np.ndarray, ends: np.ndarray, other_starts: np.ndarray,
             other_ends: np.ndarray) -> np.ndarray:
    """How long each [start, end) lies inside the union of the disjoint intervals
    [other_starts, other_ends), sorted by start (ns)."""
    lengths = other_ends - other_starts
    before = np.concatenate([[0.0], np.cumsum(lengths)])  # covered before interval i

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(other_starts, t, side="right")  # intervals begun by t
        last = np.maximum(i - 1, 0)
        inside = np.clip(t - other_starts[last], 0.0, lengths[last])
        return np.where(i > 0, before[last] + inside, 0.0)

    return upto(ends) - upto(starts)


def phase_meetings(trace: Trace, rows: np.ndarray, phase: str,
                   windows: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                   lengths: np.ndarray | None = None,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For ``rows``: the duration of ``phase`` (ns; ``lengths`` in its place where given:
    the part of it seen, such as a met write's time before the meeting); how long of it the
    other workers spent reading, computing and writing (columns of ``_OTHERS``, summed over
    the others); and per other worker (columns) the phase it was in when this one began (an
    index into ``_OTHERS``; -1: idle or not running) and how much longer that went on (ns)."""
    windows = windows if windows is not None else phase_windows(trace)
    start, duration = (w.astype(np.float64) for w in windows[phase])
    if lengths is not None:
        duration = duration.copy()
        duration[rows] = lengths
    owners = trace["thread"]
    workers = np.unique(owners).tolist()
    under = np.zeros((rows.size, len(_OTHERS)))
    others = np.full((rows.size, max(len(workers) - 1, 1)), -1, dtype=np.int64)
    remaining = np.zeros(others.shape)
    intervals = {}  # each worker's intervals of each phase, sorted by start
    for other in workers:
        theirs = np.flatnonzero(owners == other)
        for name in _OTHERS:
            q_start, q_length = (w[theirs].astype(np.float64) for w in windows[name])
            order = np.argsort(q_start, kind="stable")
            intervals[other, name] = (q_start[order], (q_start + q_length)[order])
    for worker in np.unique(owners[rows]).tolist():
        mine = np.flatnonzero(owners[rows] == worker)
        begun = start[rows][mine]
        ended = begun + duration[rows][mine]
        for column, other in enumerate(w for w in workers if w != worker):
            for q, name in enumerate(_OTHERS):
                q_start, q_end = intervals[other, name]
                under[mine, q] += _covered(begun, ended, q_start, q_end)
                i = np.maximum(np.searchsorted(q_start, begun, side="right") - 1, 0)
                inside = (q_start[i] <= begun) & (q_end[i] > begun)
                others[mine[inside], column] = q
                remaining[mine[inside], column] = q_end[i][inside] - begun[inside]
    return duration[rows], under, others, remaining


def under_times(trace: Trace, rows: np.ndarray, phase: str) -> tuple[np.ndarray, np.ndarray]:
    """For ``rows``: the duration of ``phase`` (ns) and how long of it the other workers
    spent reading, computing and writing (:func:`phase_meetings`)."""
    return phase_meetings(trace, rows, phase)[:2]


def undisturbed(duration: np.ndarray, under: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
    """The drawn durations that processor sharing turns into ``duration``: the time under
    another worker's phase q counts 1 / (1 + slowdown[q]) (exact with one other worker;
    with more, their shares add), never less than ``_FLOOR`` of the duration."""
    work = duration - under @ (slowdown / (1 + slowdown))
    return np.maximum(work, _FLOOR * duration)


def fit_interference(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]],
                     mode: str = "off", write_scale: list[np.ndarray] | None = None
                     ) -> dict[str, Any]:
    """Interference (``timing.*_under_*``) from the rows of one or more traces with two or
    more workers (each run: trace, rows, and the rows whose writes met no other, or None
    when no convoys were fitted): the fitted fields in ``"fields"``, the per-phase fits, and in
    ``"deflate"`` (not for the report) each run's rows and the factors that take their
    recorded durations (a met write's: the part before the meeting) to the draws with the
    others idle, per phase (the module docstring). ``write_scale``: per run, each row's
    ``write_shared`` factor (1 where unmarked), by which its draws are divided besides
    (the traces' recorded write durations already are). With convoys, the writes are their
    times alone, met ones censored at the meeting (:func:`write_survival`), when
    ``write_scale`` is given, and the writes that met no other when it is not: without the
    factor the writes on lines another worker read last, 4× as long alone on the far-CPU
    runs of docs/fidelity.md and mostly begun while the other computed, would count as
    slowed by the other's gradient at every worker count."""
    report: dict[str, Any] = {"fields": None, "deflate": None}
    if mode == "off":
        report["why"] = "--interference off"
        return report
    fields: dict[str, float] = {}
    phases: dict[str, Any] = {}
    states: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    convoys = bool(runs) and runs[0][2] is not None
    windows = {id(trace): phase_windows(trace) for trace, _, _ in runs}
    for phase in ("read", "grad", "write", "idle"):
        states[phase], rows = _phase_rows(runs, phase, windows, write_scale)
        fit = None if rows is None else _phase_slowdown(rows, phase == "write" and convoys)
        if fit is not None:
            phases[phase], slowed = fit
            fields.update({f"{phase}_under_{q}": value for q, value in slowed.items()})
    report["phases"] = phases
    if not phases:
        report["why"] = ("fewer than two workers ran together" if not any(
            np.unique(t["thread"]).size > 1 for t, _, _ in runs) else
            f"no phase met another worker's at its start in {MIN_PAIRS} rows")
        return report
    if mode == "auto" and max(fields.values(), default=0.0) < _MIN_UNDER:
        report["why"] = f"no phase slowed by {_MIN_UNDER:.0%} under another's"
        return report
    report.update(fields=fields, deflate=_deflate(runs, states, fields))
    return report


def _phase_rows(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]], phase: str,
                windows: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]],
                write_scale: list[np.ndarray] | None,
                marks: list[np.ndarray] | None = None,
                ) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], _Rows | None]:
    """The rows of ``phase`` that interference is fitted on, over the runs of two or more
    workers: per run its rows, durations and times under the others' phases (for
    :func:`_deflate`), and all of them together with a positive duration (None if none);
    ``marks``: per run, which rows' writes are on lines another worker read last."""
    states, starts, cuts, scales, runs_of, marked = [], [], [], [], [], []
    for index, (trace, rows, alone) in enumerate(runs):
        if np.unique(trace["thread"]).size < 2:
            continue
        use, share = rows, np.ones(rows.size)
        if phase == "write" and alone is not None and write_scale is None:
            use, share = alone, np.ones(alone.size)  # the writes that met no other
        elif phase == "write" and alone is not None:  # the time alone, censored when met
            use, share = write_survival(trace, rows)
        cut = share < 1
        lengths = (share * (trace["write_end"][use] - trace["write_start"][use])
                   if cut.any() else None)
        if use.size:
            duration, under, others, remaining = phase_meetings(
                trace, use, phase, windows[id(trace)], lengths)
            states.append((use, duration, under))
            starts.append((others, remaining))
            cuts.append(cut)
            scales.append(write_scale[index][use] if write_scale is not None
                          and phase == "write" else np.ones(use.size))
            runs_of.append(np.full(use.size, index))
            marked.append(marks[index][use] if marks is not None
                          else np.zeros(use.size, dtype=bool))
    if not states:
        return states, None
    width = max(o.shape[1] for o, _ in starts)
    found = _Rows(duration=np.concatenate([d for _, d, _ in states]),
                 under=np.concatenate([u for _, _, u in states]),
                 censored=np.concatenate(cuts), scale=np.concatenate(scales),
                 run=np.concatenate(runs_of), marked=np.concatenate(marked),
                 others=np.concatenate([np.pad(o, ((0, 0), (0, width - o.shape[1])),
                                               constant_values=-1) for o, _ in starts]),
                 remaining=np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1])))
                                           for _, r in starts]))
    return states, found.where(found.duration > 0)


@dataclasses.dataclass(frozen=True)
class _Rows:
    """One phase's rows of every run: duration, time under each other phase, whether the
    duration is censored, the ``write_shared`` factor, the run's index, whether the write
    is on lines another worker read last, and per other worker the phase it was in at the
    start and how much of it was left."""

    duration: np.ndarray
    under: np.ndarray
    censored: np.ndarray
    scale: np.ndarray
    run: np.ndarray
    marked: np.ndarray
    others: np.ndarray
    remaining: np.ndarray

    def where(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


def _phase_slowdown(rows: _Rows, skip_write: bool
                    ) -> tuple[dict[str, Any], dict[str, float]] | None:
    """A phase's slowdowns under each other phase from its ``rows`` (the module docstring),
    ``skip_write`` leaving writes under writes to the convoys; the phase's report and the
    slowdowns, or None when no group of rows met another phase at its start."""
    groups = _groups(rows, skip_write)
    if not groups:
        return None
    free = _free(rows, groups)
    slowdown = np.zeros(len(_OTHERS))
    if free:
        slowdown[free] = _solve(rows, {q: groups[q] for q in free})
    slowed = {_OTHERS[q]: float(slowdown[q]) for q in groups}
    return {"slowdown": slowed, "rows": int(rows.duration.size),
            "within_noise": [_OTHERS[q] for q in groups if q not in free],
            "rows_other_idle": int(np.all(rows.others < 0, axis=1).sum()),
            "rows_under": {_OTHERS[q]: int(sum(g.sum() for g, _ in strata))
                           for q, strata in groups.items()}}, slowed


def _groups(rows: _Rows, skip_write: bool) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Per other phase q with rows enough: per run, its rows begun under q and its rows
    begun with the others idle (``skip_write``: no group under writes)."""
    # Rows grouped by what the others were doing when the phase began (which its own
    # duration cannot have chosen): all idle, or one in phase q for a while yet. Each group
    # is compared with the idle rows of its own run: runs at other worker counts differ by
    # their contention (``*_per_thread``), which slows every row of a run alike, and the
    # idle rows are mostly the fewer-worker runs'.
    quiet = np.all(rows.others < 0, axis=1)
    typical = float(np.median(rows.duration)) if rows.duration.size else 0.0
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for q, name in enumerate(_OTHERS):
        if skip_write and name == "write":
            continue  # writes that meet are the convoys' (fitted on their own)
        group = np.any((rows.others == q) & (rows.remaining >= _COVER * typical), axis=1)
        strata = _per_run(rows, group, quiet)
        if strata:
            groups[q] = strata
    return groups


def _per_run(rows: _Rows, one: np.ndarray, other: np.ndarray
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per run: its ``one`` rows and its ``other`` rows, where both number ``MIN_PAIRS``."""
    strata = [(one & mine, other & mine) for mine in
              (rows.run == r for r in np.unique(rows.run).tolist())]
    return [(a, b) for a, b in strata if a.sum() >= MIN_PAIRS and b.sum() >= MIN_PAIRS]


def _free(rows: _Rows, groups: dict[int, list[tuple[np.ndarray, np.ndarray]]]) -> list[int]:
    """The phases whose groups are slower than their noise (:func:`_slower`)."""
    return [q for q, strata in groups.items()
            if _slower(rows.duration / rows.scale, rows.censored, strata)]


def shared_with_interference(runs: list[tuple[Trace, np.ndarray]], marks: list[np.ndarray],
                             censor: bool) -> dict[str, Any] | None:
    """``write_shared`` fitted together with the writes' slowdowns under the other workers'
    phases, from the runs' write rows (``censor``: their times alone, met writes censored at
    the meeting) and ``marks`` (per run, per row: on lines another worker read last). The
    marked writes begin while another worker computes (it read after them), so a write
    slowed under the other's gradient is a marked write more often than not: compared with
    every other write, the factor took that slowdown (2.02 for none, beside
    ``write_under_grad`` = 1.7). One least squares solves :func:`_solve`'s equations and,
    per run, "the marked writes' median draw equals the others' begun while another worker
    computed" (compared with all others, the factor and the slowdowns under reads and
    gradients traded against each other: 1.19, 0.59, 1.21); the factor and the slowdowns,
    or None where a run has too few of either."""
    windows = {id(trace): phase_windows(trace) for trace, _ in runs}
    _, rows = _phase_rows([(trace, used, used if censor else None) for trace, used in runs],
                          "write", windows, [np.ones(len(trace)) for trace, _ in runs], marks)
    if rows is None:
        return None
    computing = np.any(rows.others == _OTHERS.index("grad"), axis=1)  # as every marked one
    shared = _per_run(rows, rows.marked & computing, ~rows.marked & computing)
    if not shared:
        return None
    groups = _groups(rows, censor)
    free = _free(rows, groups)
    solved = _solve(rows, {q: groups[q] for q in free}, shared)
    return {"factor": float(math.exp(solved[-1])),
            "slowdown": {_OTHERS[q]: float(x) for q, x in zip(free, solved[:-1], strict=True)}}


def _solve(rows: _Rows, groups: dict[int, list[tuple[np.ndarray, np.ndarray]]],
           shared: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """The slowdowns under the phases of ``groups`` that make each group's median draw equal
    to the idle rows' of the same run (one equation per slowdown and run), with a small pull
    toward no slowdown that only a slowdown the groups leave undetermined feels. With
    ``shared`` (per run: its marked and its other writes) the log of the ``write_shared``
    factor too, last, that the marked draws are divided by: one equation more per run, the
    marked writes' median draw equal to the others'."""
    free = list(groups)
    strata = [pair for q in free for pair in groups[q]] + (shared or [])
    n = len(free)

    def gaps(x: np.ndarray) -> np.ndarray:
        trial = np.zeros(len(_OTHERS))
        trial[free] = x[:n]
        work = undisturbed(rows.duration, rows.under, trial) / rows.scale
        if shared:
            work = work / np.where(rows.marked, math.exp(x[n]), 1.0)
        return np.array([log_median(work[g], rows.censored[g])
                         - log_median(work[quiet], rows.censored[quiet])
                         for g, quiet in strata])

    def penalized(x: np.ndarray) -> np.ndarray:
        return np.concatenate([gaps(x), _RIDGE * x[:n]])

    extra = 1 if shared else 0
    low = [0.0] * n + [-math.log(1 + _MAX_SLOWDOWN)] * extra
    high = [_MAX_SLOWDOWN] * n + [math.log(1 + _MAX_SLOWDOWN)] * extra
    return scipy.optimize.least_squares(penalized, np.array([0.5] * n + [0.0] * extra),
                                        bounds=(low, high), diff_step=1e-2).x


def _deflate(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]],
             states: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
             fields: dict[str, float]) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per run and phase: the rows and the factors that take their recorded durations to
    the draws with the others idle."""
    deflate: list[dict[str, tuple[np.ndarray, np.ndarray]]] = [{} for _ in runs]
    for phase, per_run in states.items():
        slowdown = np.array([fields.get(f"{phase}_under_{q}", 0.0) for q in _OTHERS])
        r = 0
        for index, (trace, _, _) in enumerate(runs):
            if np.unique(trace["thread"]).size < 2 or r >= len(per_run):
                continue
            use, duration, under = per_run[r]
            r += 1
            work = undisturbed(duration, under, slowdown)
            deflate[index][phase] = (use, work / np.maximum(duration, 1.0))
    return deflate


def _slower(duration: np.ndarray, censored: np.ndarray,
            strata: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the group rows' median duration is above the quiet rows' by more than
    ``_SIGNIFICANT`` standard errors of the difference of the two log medians, over the
    ``strata`` (per run: its group rows and its quiet rows) weighted by their inverse
    variances (the median's standard error taken as for a normal sample of log durations,
    its spread from the median absolute deviation): a group no slower than its noise fits
    no slowdown."""
    weights, gaps = [], []
    for group, quiet in strata:
        logs = np.log(duration[group | quiet])
        spread = _MAD_TO_SD * float(np.median(np.abs(logs - np.median(logs))))
        error = _MEDIAN_SE * spread * math.sqrt(1 / group.sum() + 1 / quiet.sum())
        weights.append(1 / max(error, 1e-12) ** 2)
        gaps.append(log_median(duration[group], censored[group])
                    - log_median(duration[quiet], censored[quiet]))
    gap = float(np.average(gaps, weights=weights))
    return gap > _SIGNIFICANT / math.sqrt(sum(weights))
