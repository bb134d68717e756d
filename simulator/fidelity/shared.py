"""Shared lines (``timing.write_shared``): writes on lines another worker read last.

With ``--shared`` (two or more workers): a write whose
worker still holds the vector from its own read (no other write began since) while
another worker read it after that (:func:`shared_writes`) runs longer: on hardware its
cache lines are shared with the core that read them last and each store waits for that
copy's invalidation (on the 2-core machine of docs/fidelity.md 4× far apart, 2× near).
The factor is the median time of the marked writes over the others' (with convoys, their
times alone, met writes censored: Kaplan–Meier medians), or, unless ``--interference off``,
fitted together with the writes' slowdowns under the other workers' phases
(:func:`~simulator.fidelity.interference.shared_with_interference`: a marked write begins
while another worker computes, so a write slowed under its gradient would pass for one on
shared lines); the marked writes are divided by it before anything else is fitted,
interference included, and the convoys are refitted with each pair's leader and joiner
scaled by it where marked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simulator.fidelity.durations import MIN_PAIRS, log_median
from simulator.fidelity.interference import shared_with_interference
from simulator.fidelity.runs import median_write, write_survival
from simulator.trace import Trace

_MIN_SHARED = 1.2  # write_shared: the least factor (or its inverse) "auto" keeps


def shared_writes(trace: Trace) -> np.ndarray:
    """Per row: whether its write began on lines another worker read last — some other
    worker's read ended after this row's read ended and before its write began, and no other
    worker's write began in between (the rule of ``timing.write_shared``, judged per update:
    exact for writes of one block)."""
    owners = trace["thread"]
    read_end = trace["read_end"].astype(np.int64)
    write_start = trace["write_start"].astype(np.int64)
    marked = np.zeros(len(trace), dtype=bool)
    for worker in np.unique(owners).tolist():
        mine, theirs = owners == worker, owners != worker
        reads, writes = np.sort(read_end[theirs]), np.sort(write_start[theirs])
        since, until = read_end[mine], write_start[mine]
        read_since = (np.searchsorted(reads, until, side="left")
                      - np.searchsorted(reads, since, side="right"))
        written = (np.searchsorted(writes, until, side="left")
                   - np.searchsorted(writes, since, side="right"))
        marked[mine] = (read_since > 0) & (written == 0)
    return marked


def fit_shared(runs: list[tuple[Trace, np.ndarray]], mode: str = "off",
               censor: bool = False,
               probes: list[dict[str, Any] | None] | None = None,
               interference: bool = False) -> dict[str, Any]:
    """``timing.write_shared`` from the rows of one or more traces with two or more workers:
    the median time a write :func:`shared_writes` marks runs over the others' (each run's
    write durations, or with ``censor`` (writes that meet form convoys) their times alone,
    met writes censored at the meeting: :func:`write_survival`, Kaplan–Meier medians), in
    ``"fields"`` when fitted (``auto``: when it is 1.2 or more, or 1/1.2 or less), and in
    ``"deflate"`` (not for the report) each run's marked rows and the factor that takes
    their writes to the draw. With ``interference`` the factor is fitted together with the
    writes' slowdowns under the others' phases (:func:`shared_with_interference`; the
    median ratio where the runs have too few rows for it), which the ratio alone would take
    for shared lines. Runs of one worker alone show no such write: then the runs'
    probes (``real.shared_write``, one per run or None) give it, by :func:`probed_shared`."""
    report: dict[str, Any] = {"fields": None, "deflate": None}
    if mode == "off":
        report["why"] = "--shared off"
        return report
    if all(np.unique(trace["thread"]).size < 2 for trace, _ in runs):
        return probed_shared(runs, mode, probes or [None] * len(runs))
    seen, cut, marked = [], [], []
    marks = [shared_writes(trace) for trace, _ in runs]  # one worker: none marked
    for (trace, rows), mark in zip(runs, marks, strict=True):
        if np.unique(trace["thread"]).size < 2:
            continue
        kept, share = (write_survival(trace, rows) if censor else
                       (rows, np.ones(rows.size)))
        duration = (trace["write_end"][kept] - trace["write_start"][kept]) * share
        use = duration > 0
        seen.append(duration[use])
        cut.append(share[use] < 1)
        marked.append(mark[kept][use])
    flag = np.concatenate(marked) if marked else np.zeros(0, dtype=bool)
    report.update(rows_shared=int(flag.sum()), rows_other=int((~flag).sum()))
    if flag.sum() < MIN_PAIRS or (~flag).sum() < MIN_PAIRS:
        report["why"] = (f"{int(flag.sum())} writes on lines another worker read last and "
                         f"{int((~flag).sum())} others (fewer than {MIN_PAIRS})")
        return report
    time, censored = np.concatenate(seen), np.concatenate(cut)
    on, off = (log_median(time[m], censored[m]) for m in (flag, ~flag))
    factor = math.exp(on - off)
    report.update(factor=factor, median_shared_ns=math.exp(on), median_other_ns=math.exp(off))
    joint = shared_with_interference(runs, marks, censor) if interference else None
    if joint is not None:
        factor = joint["factor"]
        report.update(factor=factor, median_ratio=math.exp(on - off),
                      with_write_slowdowns=joint["slowdown"])
    if mode == "auto" and abs(math.log(factor)) < math.log(_MIN_SHARED):
        report["why"] = (f"writes on lines another worker read last differ by under "
                         f"{_MIN_SHARED}x" + (" with the writes' slowdowns under the others' "
                                              "phases taken out" if joint else ""))
        return report
    report["fields"] = {"write_shared": factor}
    report["deflate"] = [{"write": (rows[mark[rows]], np.full(int(mark[rows].sum()), 1 / factor))}
                         for (_, rows), mark in zip(runs, marks, strict=True)]
    return report


def probed_shared(runs: list[tuple[Trace, np.ndarray]], mode: str,
                  probes: list[dict[str, Any] | None]) -> dict[str, Any]:
    """``timing.write_shared`` for runs of one worker from what their probes measured
    (realrun/host/probe.py ``shared_write_cost``): a write on lines the other CPU copied last
    took ``extra_ns`` more there, so the factor is (m + extra) / m with m the runs' median
    write and extra the probes' median; in ``"fields"`` as :func:`fit_shared` keeps it.
    Nothing to take out of the runs' writes: none of them was such a write."""
    report: dict[str, Any] = {"fields": None, "deflate": None}
    probed = [p for p in probes if p is not None and p.get("extra_ns") is not None]
    if not probed:
        report["why"] = ("one worker: no write on lines another worker read last, and no "
                         "probe in the runs (real.shared_write; record the runs with "
                         "asyngrad real --probe)")
        return report
    median = median_write(runs)
    extra = float(np.median([p["extra_ns"] for p in probed]))
    lines = [p["line_ns"] for p in probed if p.get("line_ns") is not None]
    report.update(probes=len(probed), extra_ns=extra, median_write_ns=median,
                  line_ns=float(np.median(lines)) if lines else None)
    if median <= 0 or median + extra <= 0:
        report["why"] = f"probe: extra {extra:.0f} ns on a median write of {median:.0f} ns"
        return report
    factor = (median + extra) / median
    report["factor"] = factor
    if mode == "auto" and abs(math.log(factor)) < math.log(_MIN_SHARED):
        report["why"] = (f"probe: a write on lines another worker read last takes {factor:.2f}"
                         f"x, under {_MIN_SHARED}x")
        return report
    report["fields"] = {"write_shared": factor}
    report["deflate"] = [{"write": (np.zeros(0, dtype=np.int64), np.zeros(0))} for _ in runs]
    return report
