"""Calibration: fit the simulator's timing model to a recorded run.

From a run directory (real or simulated) this module fits, per worker and per operation, the
distribution of durations the simulator draws from, and writes a normal scenario whose
devices carry the fitted timings (one device per worker, so worker r is simulated by thread
r with worker r's own timing).

What is fitted:

* a read or write block duration is a draw of the whole-vector duration times the fraction of
  coordinates the block moves (DESIGN §3), so each recorded block duration divided by its
  fraction is one sample of the whole-vector read or write duration; gradient durations are
  the recorded ``grad_ns`` (the gradient's own time, without waiting for a core), and the
  local work between a worker's updates is the recorded ``idle_ns`` (real workers spend it
  drawing the sample and recording timestamps: about 30% of a small update's cycle);
* families by maximum likelihood: lognormal (closed form) and gamma (scipy, location 0); the
  larger log-likelihood wins unless neither passes a Kolmogorov–Smirnov test at the 1% level
  on at least 50 samples, in which case the empirical distribution (up to 512 quantiles) is
  used. Every candidate's log-likelihood and KS statistic is reported;
* only the updates made while every worker was running are used (real workers start and
  finish at different times);
* contention, reported: the slope of read and write durations against the number of other
  workers reading or writing at the same time (least squares), and the gradient's slope
  against the number of other workers computing. The calibrated scenario keeps one core per
  worker and no bus: the fitted distributions already contain the contention of the recorded
  run at its worker count;
* write convoys (one block per update): when writes that met end together (the median gap
  between their ends under half the median gap between their starts, over at least
  30 pairs of writes that met and no third), the time from the joiner's start to the
  leader's end is fitted by least squares as ``convoy_join``·W + ``convoy_rest``·E[min(R,
  D)] (the rule's min(E − t, W) in expectation: R the leader's time alone left at the lag,
  given it had not ended, D a joiner's time alone; :meth:`Survival.expected_rest`), and
  ``convoy_end_gap`` is the median end gap over the median start lag (the joiner's end
  trails the leader's), or, where writes that met end together up to some lag and apart by
  the rest beyond it, g of g·max(0, lag − a) with ``convoy_end_catch_up`` = a
  (:func:`end_gap_hinge`). The time a write runs alone is survival data
  (:func:`write_survival`): a write no other met shows it whole, a write another started
  into shows only that it exceeds the lag (right-censored there), and writes that started
  into another's are left out. The write distribution (so the convoys are not counted
  twice) and W, its mean, are fitted on both: the families by censored maximum likelihood,
  the empirical one from the Kaplan–Meier estimate. Writes that met no other are the
  short ones (a long write is the likelier to be met: on a 2-core MLP run in write
  lockstep their mean is 6.2 µs, the censored estimate's 16 µs, docs/fidelity.md), so a fit
  on them alone draws writes too short to meet as often as the run's did.
  ``convoy_lost_pairs`` is the share of the pairs a
  measure-mode run classified (``extra_convoy_pairs``) that lost any coordinate, among those
  that met within half a write (lag ≤ W/2: half the block or more swept together), and the
  lost shares are the lossy pairs' lost coordinates over their shared part
  max(1 − lag/W, 0); without
  classified pairs convoys are fitted only when asked (``convoys = "on"``), losing nothing.
  When writes that met end apart, they pass each other (``TimingSpec.passing``): the
  ``convoy_lost_*`` values are fitted as above from the classified pairs (none lost: nothing
  fitted), ``convoy_join`` and ``convoy_rest`` stay 0, and the write distribution is fitted on
  every write. In both cases, when the share of pairs that lose anything falls with the lag
  (:func:`lossy_falloff`: q·exp(−f/λ) in the leader's swept share f = lag/W, by maximum
  likelihood over all classified pairs, kept when a likelihood-ratio test against one share
  rejects at 1%), ``convoy_lost_pairs`` = q and ``convoy_lost_within`` = λ; when the lossy
  meetings within half a write are unlike each other (:func:`lossy_spread`: a
  beta-binomial count of lost coordinates, zero-inflated by the meetings drawn lossless, by
  maximum likelihood, against one rate for all at 1%, ρ ≥ 0.01), ``convoy_lost_spread`` =
  ρ, the two shares are scaled to the fitted mean rate, and ``convoy_lost_pairs`` is raised
  by the fitted share of meetings drawn lossy over the share seen losing anything (a lossy
  draw near 0 loses nothing). Runs of one worker have no writes that meet: their convoys
  are fitted the same way from the meetings the real run's probe made
  (:func:`probed_meetings`, ``real.write_meetings``);
* common factors (``timing.*_common``, ``common_ns``; two or more workers): how alike the
  durations of one phase are on two workers when the phases start Δt apart. Durations become
  normal scores per worker (from their ranks); for every update and every other worker, the
  other worker's first phase of the same kind starting in [Δ_lo, Δ_hi) after it forms a pair,
  in bins of Δt from 0–250 ns to 32–64 µs (at least 30 pairs a bin). Each bin's correlation is
  estimated from the median absolute difference of the pair's scores, c = 1 −
  (median/0.6745)²/2 (exact for normal scores of correlation c; robust to the rare long
  stalls that hit one worker and not the other, which a plain correlation weighs most), and
  c_p·exp(−Δt/τ) is fitted by least squares weighted by pairs, one τ for all phases and one
  c_p per phase (in [0, 1]). With convoys, the write's bins use writes that met no other,
  which are the short ones, so two of them are less alike than two writes (a 2-core MLP
  run's close pairs −1): the write then takes the other phases' c (their mean weighted by
  pairs) and its bins are only reported; a
  phase with fewer than 8 distinct durations (no local work, say) gets c = 0. With
  ``common = "rhythm"`` the bins give τ only and one c for every phase is chosen so that the
  calibrated scenario, simulated at the run's worker count and seed (at most 20,000 updates,
  exact metrics off), keeps the run's rhythm: its staleness over the independent-phase value
  (:func:`simulator.metrics.rhythm`) equals the run's (bisection on c in [0, 0.999], 10
  steps; several runs: the mean over their worker counts; none when the runs' coupling is
  0.95 or more, sampling noise around independence). The pair correlations measure
  how alike two concurrent phases are, not what holds real workers in step; this targets
  the latter;
* interference (``timing.*_under_*``; two or more workers): a phase's draw is its duration
  with the time spent under another worker's phase q counted 1/(1 + slowdown_q)
  (:func:`undisturbed`; exact for two workers, the shares add for more). Rows are grouped
  by what the other workers were doing when the phase began, which its own duration cannot
  have chosen: all idle, or one in phase q with at least 10% of a typical duration to go
  (30 rows a group at least). A group whose median duration is not above the idle
  group's by three standard errors fits no slowdown (:func:`_slower`); the others' solve
  "each group's median draw equals the idle group's" (least squares, in [0, 20], with a
  pull of 0.05 per unit slowdown toward none: a phase that every group's rows spend under
  the same other phase, as a long gradient under the other's, leaves its slowdown
  undetermined, and it is then none, not the search's start); with convoys a write is
  not slowed by another write, and the writes are those that met no other, or with
  ``write_shared`` fitted their times alone (a met write's censored at the meeting, the
  groups' medians then Kaplan–Meier ones). The durations' distributions are then fitted
  on the draws;
* shared lines (``timing.write_shared``; ``shared``; two or more workers): a write whose
  worker still holds the vector from its own read (no other write began since) while
  another worker read it after that (:func:`shared_writes`) runs longer: on hardware its
  cache lines are shared with the core that read them last and each store waits for that
  copy's invalidation (on the 2-core machine of docs/fidelity.md 4× far apart, 2× near).
  The factor is the median time of the marked writes over the others' (with convoys, their
  times alone, met writes censored: Kaplan–Meier medians); the marked writes are divided by
  it before anything else is fitted, interference included, and the convoys are refitted
  with each pair's leader and joiner scaled by it where marked;
* core speeds (``speeds``; pooled, one worker per core): worker r's speed s_r is the
  geometric mean of all workers' median gradient times over its own (the gradient touches
  no shared memory, so its pace is the core's); every duration of worker r is multiplied by
  s_r before pooling (what it would take at speed 1), and the scenario gets one device of one
  core per CPU with ``speed`` = s_r, so thread j runs on core j mod cores at that core's pace.
  A core that ran slower for a whole run (a sibling hyperthread busy on the host, say: 1.7×
  on the 2-core machine of docs/fidelity.md) is then not averaged into one speed for all.
  Which core takes the extra threads when threads outnumber cores is the OS's choice per
  unpinned run; the simulation's placement is that of ``asyngrad real --pin``;
* speed episodes (``episodes``; :func:`fit_episodes`): when cores switch between their own
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
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.ndimage
import scipy.optimize
import scipy.stats

from simulator.distributions import Duration, beta_shapes
from simulator.errors import AsyngradError, TraceError
from simulator.memory import block_bounds
from simulator.metrics import overlaps, trace_rhythm, write_pairs
from simulator.problems import make_problem
from simulator.rundir import latency_line, placement, run_shared_write, run_write_meetings
from simulator.scenario import COMMON_FIELDS, DeviceSpec, Scenario, TimingSpec, scenario_from_dict
from simulator.trace import Trace, convoy_pairs, read_sweeps

__all__ = ["CONVOYS", "Fit", "Survival", "alone_writes", "calibrate", "calibrate_counts",
           "common_bins", "fit_common", "fit_convoys", "fit_durations", "fit_interference",
           "fit_shared", "fit_store_window", "lossy_spread", "operation_samples",
           "phase_meetings", "run_workers", "shared_writes", "store_shares", "under_times",
           "undisturbed", "write_survival"]

_KS_LEVEL = 0.01
_MIN_FOR_TEST = 50
_QUANTILES = 512
_MIN_PAIRS = 30
_TOGETHER = 0.5  # convoys: median end gap below this share of the median start gap
_HINGE_GAIN = 0.95  # convoys: a catch-up kept when it cuts the end gaps' error to this share
_LR_1PCT = 6.635  # χ² with one degree of freedom, 99th percentile
_MIN_SPREAD = 0.01  # lossy meetings: a smaller spread is kept as none
CONVOYS = ("auto", "on", "off")  # also the choices of common factors
# Common factors: bins of the start offset (ns), pairs a bin needs, the weakest c that
# "auto" keeps, and the correlation times tried.
COMMON_BINS = (0, 250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000)
_MIN_BIN = 30
_MIN_DISTINCT = 8  # a phase with fewer distinct durations tells nothing (e.g. no idle)
_MIN_COMMON = 0.05
# A run whose staleness is below this share of the independent-phase value kept a common
# rhythm (said in the report; fitted by --common rhythm): above it, sampling noise.
RHYTHM_NOTE = 0.95
# calibrate --common rhythm: the largest c tried, bisection steps, longest fitting run.
_RHYTHM_HIGH = 0.999
_RHYTHM_STEPS = 10
_RHYTHM_UPDATES = 20_000
_TAUS = np.geomspace(100.0, 1e6, 81)
_MEDIAN_ABS = 0.6744897501960817  # median of |Z| for a standard normal Z
# Interference: the other workers' phases that slow one (idle is the reference), the
# largest slowdown fitted, the weakest "auto" keeps, rounds of the coordinate-wise fit.
_OTHERS = ("read", "grad", "write")
_MAX_SLOWDOWN = 20.0
_RIDGE = 0.05  # interference: pull toward none per unit slowdown, in log-median units
_SIGNIFICANT = 3.0  # interference: standard errors a group's median must lie above
_MAD_TO_SD = 1.4826  # a normal sample's standard deviation over its median absolute deviation
_MEDIAN_SE = 1.2533  # a normal sample's median's standard error over its mean's
_MIN_UNDER = 0.1
_COVER = 0.1  # rows under another's phase: for this share of a typical duration at least
_FLOOR = 0.05  # the least share of a recorded duration its draw is taken to be
_MIN_SHARED = 1.2  # write_shared: the least factor (or its inverse) "auto" keeps


@dataclass(frozen=True)
class Fit:
    """The chosen distribution of one operation and how every candidate fitted."""

    duration: Duration
    n: int
    candidates: dict[str, dict[str, float]]
    censored: int = 0

    def describe(self) -> str:
        d = self.duration
        shape = (f"mean {d.mean:.4g} ns, cv {d.cv:.3g}" if d.dist != "empirical"
                 else f"{len(d.values)} quantiles, mean {d.mean:.4g} ns")
        scores = ", ".join(f"{name} loglik {c['loglik']:.6g} KS {c['ks']:.3f}"
                           for name, c in self.candidates.items())
        count = (f"n = {self.n}" if not self.censored else
                 f"n = {self.n}, {self.censored} of them met by another write first: "
                 "censored there, Kaplan–Meier")
        return f"{d.dist} ({shape}; {count}; {scores})"


def fit_durations(values: np.ndarray, censored: np.ndarray | None = None) -> Fit:
    """Fit lognormal and gamma by maximum likelihood and choose (see the module docstring);
    fewer than two distinct positive durations give a constant (0 when there are none).
    ``censored``: durations known only to exceed these values (writes met by another
    before they ended, :func:`write_survival`), fitted with ``values`` as right-censored
    data; the empirical candidate is then the Kaplan–Meier estimate's quantiles."""
    x = np.asarray(values, dtype=np.float64)
    x = x[x > 0]
    right = (np.zeros(0) if censored is None else np.asarray(censored, dtype=np.float64))
    right = right[right > 0]
    if right.size and x.size >= 2 and not np.all(x == x[0]):
        return _censored_fit(x, right)
    if x.size < 2 or np.all(x == x[0]):  # nothing to fit: no time, or a constant one
        return Fit(Duration("constant", float(x[0]) if x.size else 0.0), int(x.size), {})
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    lognormal = scipy.stats.lognorm(s=sigma, scale=math.exp(mu))
    shape, _, scale = scipy.stats.gamma.fit(x, floc=0)
    gamma = scipy.stats.gamma(shape, scale=scale)
    candidates: dict[str, dict[str, float]] = {}
    for name, dist in (("lognormal", lognormal), ("gamma", gamma)):
        test = scipy.stats.kstest(x, dist.cdf)
        candidates[name] = {"loglik": float(dist.logpdf(x).sum()), "ks": float(test.statistic),
                            "p": float(test.pvalue)}
    best = max(candidates, key=lambda name: candidates[name]["loglik"])
    if x.size >= _MIN_FOR_TEST and all(c["p"] < _KS_LEVEL for c in candidates.values()):
        points = min(_QUANTILES, x.size)
        quantiles = np.quantile(x, (np.arange(points) + 0.5) / points)
        return Fit(Duration("empirical", values=tuple(float(q) for q in quantiles)),
                   int(x.size), candidates)
    return Fit(_family(best, (mu, sigma) if best == "lognormal" else (shape, scale)),
               int(x.size), candidates)


def _family(name: str, params: tuple[float, float]) -> Duration:
    """The scenario's form of a fitted lognormal (μ, σ of the log) or gamma (shape, scale)."""
    if name == "lognormal":
        mu, sigma = params
        return Duration("lognormal", math.exp(mu + sigma**2 / 2),
                        math.sqrt(math.expm1(sigma**2)))
    shape, scale = params
    return Duration("gamma", float(shape * scale), float(1 / math.sqrt(shape)))


def _censored_fit(x: np.ndarray, right: np.ndarray) -> Fit:
    """:func:`fit_durations` with right-censored values: each family by maximum likelihood
    (density at the values seen whole, survival function at the censored ones); KS is the
    largest gap between the family's distribution function and the Kaplan–Meier estimate at
    its times, its p-value taken for as many values as were seen whole."""
    data = scipy.stats.CensoredData(uncensored=x, right=right)
    estimate = Survival.of(x, right)
    times, cdf = estimate.times, estimate.cdf
    before = np.concatenate([[0.0], cdf[:-1]])
    candidates: dict[str, dict[str, float]] = {}
    params: dict[str, tuple[float, float]] = {}
    for name, family in (("lognormal", scipy.stats.lognorm), ("gamma", scipy.stats.gamma)):
        shape, _, scale = family.fit(data, floc=0)
        params[name] = ((math.log(scale), float(shape)) if name == "lognormal"
                        else (float(shape), float(scale)))
        dist = family(shape, scale=scale)
        model = dist.cdf(times)
        gap = float(max(np.abs(model - cdf).max(), np.abs(model - before).max()))
        candidates[name] = {"loglik": float(dist.logpdf(x).sum() + dist.logsf(right).sum()),
                            "ks": gap, "p": float(scipy.stats.kstwo(x.size).sf(gap))}
    best = max(candidates, key=lambda name: candidates[name]["loglik"])
    n = int(x.size + right.size)
    if x.size >= _MIN_FOR_TEST and all(c["p"] < _KS_LEVEL for c in candidates.values()):
        quantiles = estimate.quantiles(min(_QUANTILES, n))
        return Fit(Duration("empirical", values=tuple(float(q) for q in quantiles)), n,
                   candidates, int(right.size))
    return Fit(_family(best, params[best]), n, candidates, int(right.size))


def operation_samples(trace: Trace, scenario: Scenario, rows: np.ndarray | None = None,
                      write_share: np.ndarray | None = None
                      ) -> dict[int, dict[str, np.ndarray]]:
    """Per worker: whole-vector read and write durations (block durations over the fraction
    of coordinates moved) and gradient durations, from ``rows`` (default: all); the write
    durations times ``write_share`` (one per row of ``rows``) where given."""
    problem = make_problem(scenario.problem)
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
                            "grad": trace["grad_ns"][rows_of].astype(float),
                            "idle": trace["idle_ns"][rows_of].astype(float)}
    return out


def _pooled(samples: dict[int, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Every worker's samples of each operation together."""
    return {op: np.concatenate([ops[op] for ops in samples.values()])
            for op in next(iter(samples.values()))}


def _alone_samples(trace: Trace, scenario: Scenario, rows: np.ndarray
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


def _write_fit(ops: dict[str, np.ndarray], op: str) -> Fit:
    """An operation's fit, the censored writes with the write (:func:`fit_durations`)."""
    return fit_durations(ops[op], ops.get("write_censored") if op == "write" else None)


def _overlaps(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """For each interval, how many intervals of other owners overlap its midpoint."""
    mid = (starts + ends) / 2
    order = np.argsort(starts, kind="stable")
    count = np.zeros(starts.size)
    for i in range(starts.size):
        j = order[: np.searchsorted(starts[order], mid[i], side="right")]
        count[i] = np.sum((ends[j] > mid[i]) & (owners[j] != owners[i]))
    return count


def _slope(load: np.ndarray, durations: np.ndarray) -> dict[str, float] | None:
    """Least-squares duration = base + slope·load, or None when load never varies."""
    if load.size < 3 or np.ptp(load) == 0:
        return None
    slope, base = np.polyfit(load, durations, 1)
    return {"base_ns": float(base), "ns_per_concurrent": float(slope),
            "mean_concurrent": float(load.mean())}


def running_together(trace: Trace) -> np.ndarray:
    """Rows of the span in which every worker was running (real workers start and finish
    at different times; durations outside that span carry no contention)."""
    threads = np.unique(trace["thread"])
    begin = max(int(trace["read_start"][trace["thread"] == t].min()) for t in threads)
    end = min(int(trace["write_end"][trace["thread"] == t].max()) for t in threads)
    rows = np.flatnonzero((trace["read_start"] >= begin) & (trace["write_end"] <= end))
    return rows if rows.size >= 100 else np.arange(len(trace))


def contention(runs: list[tuple[Trace, np.ndarray]]) -> dict[str, Any]:
    """How phase durations grow with the number of other workers in the same phase, over the
    given rows of one or more runs."""
    result: dict[str, Any] = {}
    for phase in ("read", "grad", "write"):
        loads, durations = [], []
        for trace, rows in runs:
            rows = rows[:: max(1, rows.size * len(runs) // 4000)]  # the O(n²) scan stays cheap
            start = trace[f"{phase}_start"][rows].astype(np.float64)
            end = trace[f"{phase}_end"][rows].astype(np.float64)
            loads.append(_overlaps(start, end, trace["thread"][rows]))
            durations.append(end - start)
        result[phase] = _slope(np.concatenate(loads), np.concatenate(durations))
    return result


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
               probes: list[dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """``timing.write_shared`` from the rows of one or more traces with two or more workers:
    the median time a write :func:`shared_writes` marks runs over the others' (each run's
    write durations, or with ``censor`` (writes that meet form convoys) their times alone,
    met writes censored at the meeting: :func:`write_survival`, Kaplan–Meier medians), in
    ``"fields"`` when fitted (``auto``: when it is 1.2 or more, or 1/1.2 or less), and in
    ``"deflate"`` (not for the report) each run's marked rows and the factor that takes
    their writes to the draw. Runs of one worker alone show no such write: then the runs'
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
    if flag.sum() < _MIN_PAIRS or (~flag).sum() < _MIN_PAIRS:
        report["why"] = (f"{int(flag.sum())} writes on lines another worker read last and "
                         f"{int((~flag).sum())} others (fewer than {_MIN_PAIRS})")
        return report
    time, censored = np.concatenate(seen), np.concatenate(cut)
    on, off = (_log_median(time[m], censored[m]) for m in (flag, ~flag))
    factor = math.exp(on - off)
    report.update(factor=factor, median_shared_ns=math.exp(on), median_other_ns=math.exp(off))
    if mode == "auto" and abs(on - off) < math.log(_MIN_SHARED):
        report["why"] = f"writes on lines another worker read last differ by under {_MIN_SHARED}x"
        return report
    report["fields"] = {"write_shared": factor}
    report["deflate"] = [{"write": (rows[mark[rows]], np.full(int(mark[rows].sum()), 1 / factor))}
                         for (_, rows), mark in zip(runs, marks, strict=True)]
    return report


def _median_write(runs: list[tuple[Trace, np.ndarray]]) -> float:
    """The median write duration over the runs' rows (0 when none is positive)."""
    writes = np.concatenate([(trace["write_end"][rows] - trace["write_start"][rows])
                             .astype(np.float64) for trace, rows in runs])
    return float(np.median(writes[writes > 0])) if (writes > 0).any() else 0.0


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
    median = _median_write(runs)
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


@dataclass(frozen=True)
class Survival:
    """The Kaplan–Meier estimate of a duration from values seen whole and values known only
    to exceed what was seen (right-censored), values ≤ 0 left out: the times, the
    distribution function just after each, and the longest value seen, where the mass the
    estimate leaves undetermined (when the longest value is a censored one) is put."""

    times: np.ndarray
    cdf: np.ndarray
    longest: float

    @classmethod
    def of(cls, alone: np.ndarray, censored: np.ndarray) -> Survival:
        exact, right = alone[alone > 0], censored[censored > 0]
        result = scipy.stats.ecdf(scipy.stats.CensoredData(uncensored=exact, right=right))
        return cls(result.cdf.quantiles, result.cdf.probabilities,
                   float(max(exact.max(initial=0.0), right.max(initial=0.0))))

    def survival(self, t: np.ndarray) -> np.ndarray:
        """P(duration > t), right-continuous."""
        at = np.searchsorted(self.times, t, side="right") - 1
        inside = np.where(at < 0, 1.0, 1 - self.cdf[np.maximum(at, 0)])
        return np.where(t >= self.longest, 0.0, inside)

    def mean(self) -> float:
        mass = np.diff(np.concatenate([[0.0], self.cdf]))
        return float(self.times @ mass + (1 - self.cdf[-1]) * self.longest)

    def quantiles(self, points: int) -> np.ndarray:
        """``points`` quantiles, at (i + ½)/points."""
        levels = (np.arange(points) + 0.5) / points
        at = np.searchsorted(self.cdf, levels, side="left")  # the first time a level is reached
        return np.where(at < self.times.size,
                        self.times[np.minimum(at, self.times.size - 1)], self.longest)

    def expected_rest(self, lags: np.ndarray, lead: np.ndarray | None = None,
                      join: np.ndarray | None = None) -> np.ndarray:
        """For a write met ``lags`` ns after it began, E[min(R, D)]: R the rest of its time
        alone given that it had not ended by the lag (a met write is the likelier the longer
        it is), D an independent draw of the time alone (the joiner's). The convoy rule's
        min(E − t, W) term (``convoy_rest``), in expectation; exact for the estimate's step
        function: ∫ S(lag + t)·S(t) dt / S(lag). With ``lead`` and ``join`` (one each per
        lag), the leader's time alone is ``lead`` times a draw and the joiner's ``join``
        times one (``timing.write_shared``): ∫ S((lag + t)/a)·S(t/b) dt / S(lag/a)."""
        knots = np.concatenate([[0.0], self.times, [self.longest]])
        a = np.ones(lags.size) if lead is None else lead
        b = np.ones(lags.size) if join is None else join
        left = self.survival(lags / a)
        out = np.zeros(lags.size)
        for i, lag in enumerate(lags.tolist()):
            if left[i] <= 0:
                continue
            edges = np.unique(np.concatenate([a[i] * knots - lag, b[i] * knots]))
            edges = edges[(edges >= 0) & (edges <= min(a[i] * self.longest - lag,
                                                       b[i] * self.longest))]
            starts = edges[:-1]
            out[i] = float(np.sum(self.survival(starts / b[i])
                                  * self.survival((lag + starts) / a[i])
                                  * np.diff(edges))) / left[i]
        return out


def fit_convoys(runs: list[tuple[Trace, np.ndarray]], mode: str = "auto",
                shared: float = 1.0) -> dict[str, Any]:
    """Write convoys from the rows of one or more traces (the module docstring): the
    ``timing.convoy_*`` values in ``"fields"`` when convoys are found (or forced with
    ``mode = "on"``), and what was measured. ``shared``: the fitted ``write_shared``, by
    which the writes :func:`shared_writes` marks ran alone longer (their times alone are
    divided by it, and each pair's leader and joiner scaled back by it where marked)."""
    lags, durations, shares, rests, gaps, fronts, flags = [], [], [], [], [], [], []
    counts: list[np.ndarray] = []
    spans: list[np.ndarray] = []
    lost = np.zeros(2)
    shared_total, classified, close, close_lossy = 0.0, 0, 0, 0
    for trace, rows in runs:
        if len(trace) and int(np.diff(trace["op_offsets"]).max()) > 1:
            return {"pairs": 0, "fields": None, "why": "writes of more than one block"}
        kept, share = write_survival(trace, rows)
        if not np.any(share >= 1):
            continue
        # W: the mean time a write runs alone, the met ones counted as censored (a long
        # write is the likelier to be met, so writes that met no other are the short ones).
        # Each row's time-alone factor.
        factor = (np.where(shared_writes(trace), shared, 1.0) if shared != 1
                  else np.ones(len(trace)))
        whole = (trace["write_end"][kept] - trace["write_start"][kept]) / factor[kept]
        alone_time = Survival.of(whole[share >= 1], (whole * share)[share < 1])
        mean = alone_time.mean()
        ws, we = trace["write_start"][rows], trace["write_end"][rows]
        lead, join, _, _ = write_pairs(ws, we, trace["thread"][rows])
        lags.append((ws[join] - ws[lead]).astype(np.float64))
        gaps.append(np.abs(we[join] - we[lead]).astype(np.float64))
        # The convoy's end is the leader's: the joiner's own end trails it by the end gap.
        durations.append((we[lead] - ws[join]).astype(np.float64))
        shares.append(mean * factor[rows][join])
        rests.append(alone_time.expected_rest(lags[-1], factor[rows][lead], factor[rows][join]))
        pairs = convoy_pairs(trace)
        if pairs is not None and pairs.size:
            # Shares given that the pair lost anything (most meetings lose nothing), in the
            # leader's own time alone.
            lossy_rows = (pairs[:, 3] > 0) | (pairs[:, 4] > 0)
            by_uid = np.argsort(trace["uid"], kind="stable")
            at = np.searchsorted(trace["uid"][by_uid], pairs[:, 0].astype(np.int64))
            pair_mean = mean * factor[by_uid[np.minimum(at, len(trace) - 1)]]
            fronts.append(np.clip(pairs[:, 2] / pair_mean, 0, 1))
            flags.append(lossy_rows)
            part = np.clip(1 - pairs[lossy_rows, 2] / pair_mean[lossy_rows], 0, 1)
            shared_total += float(part.sum())
            lost += pairs[lossy_rows, 3:5].sum(axis=0)
            classified += len(pairs)
            # Whether a meeting loses anything: pairs that swept at least half the block
            # together (a smaller shared part may lose nothing by chance alone).
            half = pairs[:, 2] <= pair_mean / 2
            close += int(half.sum())
            close_lossy += int((half & lossy_rows).sum())
            # How much each such meeting lost, in coordinates of its shared part.
            size = int(trace["w0"].size)
            counts.append(np.rint((pairs[half, 3] + pairs[half, 4]) * size))
            spans.append(np.rint(np.clip(1 - pairs[half, 2] / pair_mean[half], 0, 1) * size))
    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts or [np.zeros(0)])

    return fit_meetings(Meetings(
        lag=joined(lags), gap=joined(gaps), duration=joined(durations), alone=joined(shares),
        rest=joined(rests), fronts=joined(fronts), lossy=joined(flags).astype(bool),
        lost=lost, shared_total=shared_total, classified=classified, close=close,
        close_lossy=close_lossy, counts=joined(counts), spans=joined(spans)), mode)


def probed_meetings(probes: list[dict[str, Any] | None], mode: str = "auto",
                    write_ns: float | None = None) -> dict[str, Any]:
    """Write convoys for runs of one worker from the meetings their probes made
    (realrun/host/probe.py ``write_meetings``: the first CPU's write at 0, the second's a lag
    later, the stores each lost), fitted as :func:`fit_convoys` fits a trace's pairs. A
    write's time alone is the median of the probe's writes that met none (the first's for
    the leader's rest, the second's for the joiner); pairs are the rows where the second
    started before the first ended. How long a convoy takes is fitted in the probe's own
    time (a share of a write alone); what a meeting loses, by its lag in ns: the simulator
    puts a meeting at the front lag / W of a write it drew as W, so the fronts and shared
    parts are taken at ``write_ns`` (the runs' median write; the probe's own when None),
    which makes a meeting at a given lag lose what the probe's lost."""
    present = [p for p in probes if p is not None and len(p.get("rows", ()))]
    if not present:
        return {"pairs": 0, "fields": None,
                "why": "one worker: no writes that met, and no probe in the runs "
                       "(real.write_meetings; record the runs with asyngrad real --probe)"}
    parts: list[dict[str, Any]] = []
    for probe in present:
        table = np.asarray(probe["rows"], dtype=np.float64)
        first = table[:, 0] <= table[:, 2]
        lead = np.where(first[:, None], table[:, [0, 1, 4]], table[:, [2, 3, 5]])
        join = np.where(first[:, None], table[:, [2, 3, 5]], table[:, [0, 1, 4]])
        apart = join[:, 0] >= lead[:, 1]
        if apart.sum() < 2 or (~apart).sum() < 2:
            continue
        leader_alone = float(np.median(lead[apart, 1] - lead[apart, 0]))
        joiner_alone = float(np.median(join[apart, 1] - join[apart, 0]))
        met = ~apart
        size = float(probe["probed"])
        lag = join[met, 0] - lead[met, 0]
        planned = write_ns if write_ns else leader_alone
        front = np.clip(lag / planned, 0, 1)
        lost_lead, lost_join = lead[met, 2] / size, join[met, 2] / size
        lossy = (lost_lead > 0) | (lost_join > 0)
        half = lag <= planned / 2
        parts.append(dict(
            lag=lag, gap=np.abs(join[met, 1] - lead[met, 1]), duration=lead[met, 1] - join[met, 0],
            alone=np.full(lag.size, joiner_alone),
            rest=np.maximum(lead[met, 0] + leader_alone - join[met, 0], 0.0), fronts=front,
            lossy=lossy, lost=np.array([lost_lead[lossy].sum(), lost_join[lossy].sum()]),
            shared_total=float((1 - front[lossy]).sum()), classified=int(lag.size),
            close=int(half.sum()), close_lossy=int((half & lossy).sum()),
            counts=(lead[met, 2] + join[met, 2])[half], spans=np.rint((1 - front[half]) * size)))
    if not parts:
        return {"pairs": 0, "fields": None,
                "why": "the probes' writes all met, or none did (no time alone to fit from)"}
    totals = ("lost", "shared_total", "classified", "close", "close_lossy")
    merged: dict[str, Any] = {key: (sum(part[key] for part in parts) if key in totals else
                                    np.concatenate([part[key] for part in parts]))
                              for key in parts[0]}
    meetings = Meetings(**merged)
    report = fit_meetings(meetings, mode)
    report["probes"] = len(parts)
    return report


@dataclass(frozen=True)
class Meetings:
    """Pairs of writes that met (a leader and the joiner that started ``lag`` ns after it),
    as the convoy fit reads them, from a trace (:func:`fit_convoys`) or a probe
    (:func:`probed_meetings`). Per pair: ``lag``; ``gap``, how far apart the two ended;
    ``duration``, the leader's end less the joiner's start; ``alone``, the joiner's time
    alone; ``rest``, the leader's expected time left at the join. Per classified pair:
    ``fronts``, the share of the block the leader had swept at the join, and ``lossy``,
    whether it lost any coordinate. ``lost``: the leader's and joiner's lost shares summed
    over lossy pairs, ``shared_total`` their shared parts summed; ``close`` pairs that swept
    at least half the block together, ``close_lossy`` of them lossy, and per close pair
    ``counts`` lost coordinates of ``spans`` shared."""

    lag: np.ndarray
    gap: np.ndarray
    duration: np.ndarray
    alone: np.ndarray
    rest: np.ndarray
    fronts: np.ndarray
    lossy: np.ndarray
    lost: np.ndarray
    shared_total: float
    classified: int
    close: int
    close_lossy: int
    counts: np.ndarray
    spans: np.ndarray


def fit_meetings(meetings: Meetings, mode: str = "auto") -> dict[str, Any]:
    """The ``timing.convoy_*`` values from pairs of writes that met (:func:`fit_convoys`)."""
    m = meetings
    lag, gap, lost, shared_total = m.lag, m.gap, m.lost, m.shared_total
    classified, close, close_lossy = m.classified, m.close, m.close_lossy
    report: dict[str, Any] = {"pairs": int(lag.size), "fields": None}
    if lag.size < _MIN_PAIRS or mode == "off":
        report["why"] = ("--convoys off" if mode == "off" else
                         f"{lag.size} pairs of writes that met (fewer than {_MIN_PAIRS})")
        return report
    together = float(np.median(gap) / max(np.median(lag), 1e-9))
    report["end_gap_over_start_gap"] = together
    apart = together >= _TOGETHER and mode == "auto"
    unclassified = ("no pair's lost coordinates were classified (record the run with "
                    "asyngrad real --measure)")
    if apart and not lost.any():
        report["why"] = ("writes that met ended apart (no convoys) and "
                         + ("no classified pair lost a coordinate" if classified
                            else unclassified))
        return report
    if not classified and mode == "auto":  # without losses, convoys would lose nothing
        report["why"] = f"writes that met ended together, but {unclassified}"
        return report
    leader, joiner = ((lost / shared_total).tolist() if shared_total > 0 else [0.0, 0.0])
    total = leader + joiner
    if total > 1:
        leader, joiner = leader / total, joiner / total
    losses = {"convoy_lost_leader": leader, "convoy_lost_joiner": joiner,
              "convoy_lost_pairs": close_lossy / close if close_lossy else 1.0,
              "convoy_lost_within": 0.0}
    if m.fronts.size:
        falling = lossy_falloff(m.fronts, m.lossy)
        if falling is not None:
            losses["convoy_lost_pairs"], losses["convoy_lost_within"] = falling
    close_lost, close_shared = m.counts, m.spans
    spread = lossy_spread(close_lost, close_shared)
    if spread is not None and leader + joiner > 0:
        # Each lossy meeting draws its own rate from the fitted law (mean μ, split between
        # the two writes as measured). A draw near 0 loses nothing, so more meetings are
        # drawn lossy than are seen losing anything: q over the share seen, as fitted.
        drawn, rate, rho = spread
        scale = rate / (leader + joiner)
        seen = float(np.mean(close_lost[close_shared >= 1] > 0))
        losses.update(convoy_lost_leader=leader * scale, convoy_lost_joiner=joiner * scale,
                      convoy_lost_spread=rho,
                      convoy_lost_pairs=min(1.0, losses["convoy_lost_pairs"] * drawn / seen))
        report["lossy_meetings_losing_nothing"] = 1 - _loses_anything(
            rate, rho, float(np.median(close_shared)))
    report["classified"] = classified
    if apart:  # they pass each other: their own durations, the losses as measured
        report["fields"] = {"convoy_join": 0.0, "convoy_rest": 0.0, **losses}
        return report
    alone_mean = m.alone
    design = np.column_stack([alone_mean, m.rest])
    solution = np.linalg.lstsq(design, m.duration, rcond=None)[0]
    joined, rest = max(float(solution[0]), 1e-3), max(float(solution[1]), 0.0)
    hinge = end_gap_hinge(lag, gap)
    report["end_gap_hinge"] = hinge
    end = ({"convoy_end_gap": hinge["slope"], "convoy_end_catch_up": hinge["catch_up_ns"]}
           if hinge["kept"] else {"convoy_end_gap": together, "convoy_end_catch_up": 0.0})
    report.update(fields={"convoy_join": joined, "convoy_rest": rest, **end, **losses},
                  alone_write_ns=float(alone_mean.mean()))
    return report


def end_gap_hinge(lag: np.ndarray, gap: np.ndarray) -> dict[str, Any]:
    """How far apart writes that met ended (``gap``) against how far apart they started
    (``lag``), as g·max(0, lag − a): the ``convoy_end_gap`` g and ``convoy_end_catch_up`` a
    that fit with the least absolute error, a tried at 0 and at the lags' 5th … 95th
    percentiles (then in 40 steps between the best one's neighbours), g for each a the
    weighted median of gap / (lag − a) (weights lag − a, the
    least-absolute-error slope). ``kept`` when that error is at most ``_HINGE_GAIN`` of the
    error of g·lag alone (a = 0); otherwise the convoy fit keeps its median ratio. On a 2-core
    MLP run with both CPUs near, met writes ended together up to a lag of about 0.9 µs and
    apart by the rest of the lag beyond it (g = 1.00, a = 935 ns, the error 0.73 of the
    proportional one's); on runs that never meet that way, a = 0 fits as well."""
    def slope(shift: float) -> tuple[float, float]:
        excess = np.maximum(lag - shift, 0.0)
        used = excess > 0
        if not used.any():
            return 0.0, float(np.abs(gap).sum())
        ratio, weight = gap[used] / excess[used], excess[used]
        order = np.argsort(ratio, kind="stable")
        total = np.cumsum(weight[order])
        g = float(ratio[order][np.searchsorted(total, 0.5 * total[-1])])
        return g, float(np.abs(gap - g * excess).sum())

    shifts = [0.0, *np.quantile(lag, np.arange(1, 20) / 20).tolist()] if lag.size else [0.0]
    fits = [(shift, *slope(shift)) for shift in shifts]
    proportional = fits[0][2]
    best = min(range(len(fits)), key=lambda i: (fits[i][2], fits[i][0]))
    if best > 0:  # then 40 steps between the neighbouring percentiles
        low, high = shifts[best - 1], shifts[min(best + 1, len(shifts) - 1)]
        fits += [(shift, *slope(shift)) for shift in np.linspace(low, high, 41).tolist()]
    shift, g, error = min(fits, key=lambda fit: (fit[2], fit[0]))
    kept = shift > 0 and g > 0 and error <= _HINGE_GAIN * proportional
    return {"catch_up_ns": float(shift), "slope": g, "error": error,
            "proportional_error": proportional, "kept": bool(kept)}


def lossy_falloff(fronts: np.ndarray, lossy: np.ndarray) -> tuple[float, float] | None:
    """How the share of meetings that lose anything falls with the leader's swept share f
    at the meeting: (q, λ) of q·exp(−f/λ) by maximum likelihood over the classified pairs,
    or None when that fits no better than one share for every f (likelihood-ratio test at
    the 1% level; fewer than ``_MIN_PAIRS`` pairs, or none lossy or all lossy: None)."""
    if fronts.size < _MIN_PAIRS or not 0 < lossy.sum() < lossy.size:
        return None

    def loglik(q: np.ndarray) -> float:
        q = np.clip(q, 1e-12, 1 - 1e-12)
        return float(np.sum(np.where(lossy, np.log(q), np.log1p(-q))))

    def negative(params: np.ndarray) -> float:
        q0 = 1 / (1 + math.exp(-params[0]))
        return -loglik(q0 * np.exp(-fronts / math.exp(params[1])))

    share = float(lossy.mean())
    best = min((scipy.optimize.minimize(negative, [math.log(share / (1 - share)), math.log(w)],
                                        method="Nelder-Mead") for w in (0.1, 0.3, 1.0)),
               key=lambda r: r.fun)
    if 2 * (-best.fun - loglik(np.full(fronts.size, share))) < _LR_1PCT:
        return None
    return 1 / (1 + math.exp(-best.x[0])), math.exp(best.x[1])


def lossy_spread(lost: np.ndarray, shared: np.ndarray) -> tuple[float, float, float] | None:
    """How unlike the lossy meetings are, from meetings that lost ``lost`` of their
    ``shared`` coordinates (0 for those that lost nothing): (q, μ, ρ) of the engine's law,
    by maximum likelihood — a meeting is drawn lossy with probability q, and a lossy one
    loses a beta-binomial count of mean rate μ in which two coordinates' losses correlate ρ
    (so a lossy draw may lose nothing: a meeting seen losing nothing is either). None when
    that fits no better than one rate for every lossy meeting (ρ = 0, a binomial;
    likelihood-ratio test at the 1% level), when ρ < ``_MIN_SPREAD`` (as much as the shared
    part's own estimate, from the mean write, adds), or from fewer than ``_MIN_PAIRS``
    lossy meetings."""
    keep = shared >= 1
    lost, shared = np.minimum(lost[keep], shared[keep]), shared[keep]
    lossy = lost > 0
    if lossy.sum() < _MIN_PAIRS or lossy.all():
        return None
    mean = float(np.sum(lost) / np.sum(shared[lossy]))
    if not 0 < mean < 1:
        return None
    some, none = lost[lossy], shared[~lossy]

    def logit(x: float) -> float:
        return math.log(x / (1 - x))

    def unit(params: np.ndarray) -> list[float]:
        return [min(max(1 / (1 + math.exp(-p)), 1e-9), 1 - 1e-9) for p in params]

    def loglik(q: float, log_zero: np.ndarray, log_some: np.ndarray) -> float:
        # A meeting that lost nothing was not lossy, or lossy and drew no coordinate.
        zero = np.log1p(-q + q * np.exp(log_zero))
        return float(zero.sum() + some.size * math.log(q) + log_some.sum())

    def binomial(params: np.ndarray) -> float:
        q, rate = unit(params)
        return -loglik(q, none * math.log1p(-rate),
                       scipy.stats.binom.logpmf(some, shared[lossy], rate))

    def beta_binomial(params: np.ndarray) -> float:
        q, rate, rho = unit(params)
        a, b = beta_shapes(rate, rho)
        return -loglik(q, scipy.stats.betabinom.logpmf(0, none, a, b),
                       scipy.stats.betabinom.logpmf(some, shared[lossy], a, b))

    start = [logit(min(max(float(lossy.mean()), 0.01), 0.99)), logit(mean)]
    null = scipy.optimize.minimize(binomial, start, method="Nelder-Mead")
    best = min((scipy.optimize.minimize(beta_binomial, [*start, logit(r)], method="Nelder-Mead",
                                        options={"maxiter": 2000})
                for r in (0.01, 0.1, 0.5)), key=lambda r: r.fun)
    q, rate, rho = unit(best.x)
    if 2 * (null.fun - best.fun) < _LR_1PCT or rho < _MIN_SPREAD:
        return None
    return q, rate, min(rho, 0.999)


def _loses_anything(rate: float, rho: float, shared: float) -> float:
    """The chance that a meeting of ``shared`` coordinates, at a Beta(rate, ρ) draw of its
    own rate, loses at least one."""
    a, b = beta_shapes(rate, rho)
    return float(-math.expm1(scipy.stats.betabinom.logpmf(0, max(int(shared), 1), a, b)))


def _forms_convoys(report: dict[str, Any]) -> bool:
    """Whether a :func:`fit_convoys` report fitted convoys (not passing writes)."""
    return bool(report["fields"]) and report["fields"]["convoy_join"] > 0


def _phase_windows(trace: Trace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each update's start and duration of each phase (ns)."""
    read_start = trace["read_start"].astype(np.int64)
    return {"read": (read_start, trace["read_end"] - read_start),
            "grad": (trace["grad_start"].astype(np.int64), trace["grad_ns"]),
            "write": (trace["write_start"].astype(np.int64),
                      trace["write_end"] - trace["write_start"]),
            "idle": (read_start - trace["idle_ns"], trace["idle_ns"])}


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
    windows = windows if windows is not None else _phase_windows(trace)
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
    windows = {id(trace): _phase_windows(trace) for trace, _, _ in runs}
    for phase in ("read", "grad", "write", "idle"):
        states[phase], starts, cuts, scales = [], [], [], []
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
                states[phase].append((use, duration, under))
                starts.append((others, remaining))
                cuts.append(cut)
                scales.append(write_scale[index][use] if write_scale is not None
                              and phase == "write" else np.ones(use.size))
        if not states[phase]:
            continue
        duration = np.concatenate([d for _, d, _ in states[phase]])
        under = np.concatenate([u for _, _, u in states[phase]])
        censored, scale = np.concatenate(cuts), np.concatenate(scales)
        width = max(o.shape[1] for o, _ in starts)
        others = np.concatenate([np.pad(o, ((0, 0), (0, width - o.shape[1])),
                                        constant_values=-1) for o, _ in starts])
        remaining = np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1])))
                                    for _, r in starts])
        keep = duration > 0
        duration, under = duration[keep], under[keep]
        censored, scale = censored[keep], scale[keep]
        others, remaining = others[keep], remaining[keep]
        # Rows grouped by what the others were doing when the phase began (which its own
        # duration cannot have chosen): all idle, or one in phase q for a while yet.
        quiet = np.all(others < 0, axis=1)
        typical = float(np.median(duration)) if duration.size else 0.0
        slowdown = np.zeros(len(_OTHERS))
        groups = {}
        for q, name in enumerate(_OTHERS):
            if phase == "write" and name == "write" and convoys:
                continue  # writes that meet are the convoys' (fitted on their own)
            group = np.any((others == q) & (remaining >= _COVER * typical), axis=1)
            if group.sum() >= _MIN_PAIRS and quiet.sum() >= _MIN_PAIRS:
                groups[q] = group
        if not groups:
            continue
        free = [q for q, group in groups.items()
                if _slower(duration / scale, censored, group, quiet)]

        def gaps(x: np.ndarray, free: list[int] = free, groups: dict = groups,
                 duration: np.ndarray = duration, under: np.ndarray = under,
                 quiet: np.ndarray = quiet, censored: np.ndarray = censored,
                 scale: np.ndarray = scale) -> np.ndarray:
            trial = np.zeros(len(_OTHERS))
            trial[free] = x
            work = undisturbed(duration, under, trial) / scale
            base = _log_median(work[quiet], censored[quiet])
            return np.array([_log_median(work[groups[q]], censored[groups[q]]) - base
                             for q in free])

        # Each group's median draw equal to the quiet rows' (one equation per slowdown),
        # and a small pull toward no slowdown that only a slowdown the groups leave
        # undetermined feels.
        def penalized(x: np.ndarray, gaps: Callable = gaps) -> np.ndarray:
            return np.concatenate([gaps(x), _RIDGE * x])

        if free:
            fit = scipy.optimize.least_squares(penalized, np.full(len(free), 0.5),
                                               bounds=(0.0, _MAX_SLOWDOWN), diff_step=1e-2)
            slowdown[free] = fit.x
        slowed = {_OTHERS[q]: float(slowdown[q]) for q in groups}
        phases[phase] = {"slowdown": slowed, "rows": int(duration.size),
                         "within_noise": [_OTHERS[q] for q in groups if q not in free],
                         "rows_other_idle": int(quiet.sum()),
                         "rows_under": {_OTHERS[q]: int(g.sum()) for q, g in groups.items()}}
        fields.update({f"{phase}_under_{q}": value for q, value in slowed.items()})
    report["phases"] = phases
    if not phases:
        report["why"] = ("fewer than two workers ran together" if not any(
            np.unique(t["thread"]).size > 1 for t, _, _ in runs) else
            f"no phase met another worker's at its start in {_MIN_PAIRS} rows")
        return report
    if mode == "auto" and max(fields.values(), default=0.0) < _MIN_UNDER:
        report["why"] = f"no phase slowed by {_MIN_UNDER:.0%} under another's"
        return report
    report["fields"] = fields
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
    report["deflate"] = deflate
    return report


def _slower(duration: np.ndarray, censored: np.ndarray, group: np.ndarray,
            quiet: np.ndarray) -> bool:
    """Whether the ``group`` rows' median duration is above the ``quiet`` rows' by more
    than ``_SIGNIFICANT`` standard errors of the difference of the two log medians (the
    median's standard error taken as for a normal sample of log durations, its spread from
    the median absolute deviation): a group no slower than its noise fits no slowdown."""
    logs = np.log(duration[group | quiet])
    spread = _MAD_TO_SD * float(np.median(np.abs(logs - np.median(logs))))
    error = _MEDIAN_SE * spread * math.sqrt(1 / group.sum() + 1 / quiet.sum())
    gap = (_log_median(duration[group], censored[group])
           - _log_median(duration[quiet], censored[quiet]))
    return gap > _SIGNIFICANT * error


def _log_median(values: np.ndarray, censored: np.ndarray) -> float:
    """The log of the median of positive ``values``; with right-censored values among them
    (``censored``), of the Kaplan–Meier estimate's median (all censored: of the values',
    a lower bound)."""
    if not censored.any() or censored.all():
        return float(np.median(np.log(values)))
    return math.log(float(Survival.of(values[~censored], values[censored]).quantiles(1)[0]))


def _deflated(trace: Trace, factors: dict[str, tuple[np.ndarray, np.ndarray]]) -> Trace:
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


def _scores(values: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """Normal scores of ``values`` within each owner's (from average ranks)."""
    scores = np.empty(values.size)
    for owner in np.unique(owners):
        mine = owners == owner
        ranks = scipy.stats.rankdata(values[mine])
        scores[mine] = scipy.stats.norm.ppf((ranks - 0.5) / mine.sum())
    return scores


def common_bins(starts: np.ndarray, durations: np.ndarray, owners: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin of ``COMMON_BINS``: the number of pairs, their median start offset (ns) and
    the robust correlation of their normal scores (the module docstring)."""
    scores = _scores(durations.astype(np.float64), owners)
    workers = np.unique(owners)
    bins = len(COMMON_BINS) - 1
    firsts, seconds, offsets, which = [], [], [], []
    for worker in workers:
        mine = np.flatnonzero(owners == worker)
        for other in workers[workers != worker]:
            theirs = np.flatnonzero(owners == other)
            order = theirs[np.argsort(starts[theirs], kind="stable")]
            sorted_starts = starts[order]
            for b in range(bins):
                lo, hi = COMMON_BINS[b], COMMON_BINS[b + 1]
                j = np.searchsorted(sorted_starts, starts[mine] + lo)
                ok = j < order.size
                j = np.minimum(j, order.size - 1)
                offset = sorted_starts[j] - starts[mine]
                ok &= offset < hi
                firsts.append(mine[ok])
                seconds.append(order[j[ok]])
                offsets.append(offset[ok])
                which.append(np.full(int(ok.sum()), b))
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    offset, where = np.concatenate(offsets), np.concatenate(which)
    diff = np.abs(scores[first] - scores[second])
    count, middle, corr = np.zeros(bins, dtype=np.int64), np.zeros(bins), np.zeros(bins)
    for b in range(bins):
        inside = where == b
        count[b] = int(inside.sum())
        if count[b]:
            middle[b] = float(np.median(offset[inside]))
            corr[b] = max(1 - (float(np.median(diff[inside])) / _MEDIAN_ABS) ** 2 / 2, -1.0)
    return count, middle, corr


def fit_common(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]],
               mode: str = "off") -> dict[str, Any]:
    """Common factors from the rows of one or more traces with two or more workers (each
    run: trace, rows, the rows whose writes met no other or None for all rows): the
    ``timing.*_common`` and ``common_ns`` values in ``"fields"`` when fitted, and the
    measured bins."""
    report: dict[str, Any] = {"fields": None}
    if mode == "off":
        report["why"] = "--common off"
        return report
    measured: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    windows = [_phase_windows(trace) for trace, _, _ in runs]
    for phase in ("read", "grad", "write", "idle"):
        count, middle = np.zeros(len(COMMON_BINS) - 1), np.zeros(len(COMMON_BINS) - 1)
        weighted = np.zeros(len(COMMON_BINS) - 1)
        for (trace, rows, alone), window in zip(runs, windows, strict=True):
            use = alone if phase == "write" and alone is not None else rows
            if np.unique(trace["thread"][use]).size < 2:
                continue
            start, duration = window[phase]
            if np.unique(duration[use]).size < _MIN_DISTINCT:  # ranks would be ties
                continue
            n, mid, corr = common_bins(start[use], duration[use], trace["thread"][use])
            count += n
            middle += n * mid
            weighted += n * corr
        with np.errstate(invalid="ignore", divide="ignore"):
            measured[phase] = (count, np.where(count > 0, middle / count, 0.0),
                               np.where(count > 0, weighted / count, 0.0))
    report["bins"] = {phase: {"pairs": c.astype(int).tolist(), "offset_ns": m.tolist(),
                              "correlation": r.tolist()}
                      for phase, (c, m, r) in measured.items()}
    usable = {phase: (c >= _MIN_BIN) for phase, (c, _, _) in measured.items()}
    # Writes that met no other are the short ones: two of them, both selected so, are less
    # alike than two writes (a simulated run with write c = 0.6 fits 0.23 from them, a
    # 2-core MLP run's close pairs −1). With convoys the write takes the other phases' c.
    borrowed = any(alone is not None for _, _, alone in runs)
    if borrowed:
        report["write_from_others"] = True
    if not any(u.any() for u in usable.values()):
        report["why"] = ("fewer than two workers ran together" if not any(
            c.any() for c, _, _ in measured.values()) else
            f"no offset bin with {_MIN_BIN} pairs of phases")
        return report
    best: tuple[float, float, dict[str, float]] | None = None
    for tau in _TAUS:
        total, weights, pairs = 0.0, {}, {}
        for phase, (count, middle, corr) in measured.items():
            keep = usable[phase]
            if not keep.any() or (borrowed and phase == "write"):
                weights[phase] = 0.0
                continue
            decay = np.exp(-middle[keep] / tau)
            n = count[keep]
            c = float(np.clip(np.sum(n * decay * corr[keep]) / np.sum(n * decay**2), 0, 1))
            weights[phase], pairs[phase] = c, float(np.sum(n))
            total += float(np.sum(n * (corr[keep] - c * decay) ** 2))
        if borrowed and pairs:
            weights["write"] = sum(weights[q] * n for q, n in pairs.items()) / sum(
                pairs.values())
        if best is None or total < best[0]:
            best = (total, float(tau), weights)
    assert best is not None
    _, tau, weights = best
    report.update(common_ns=tau, weights=weights)
    if mode == "auto" and max(weights.values()) < _MIN_COMMON:
        report["why"] = f"concurrent phases alike by less than {_MIN_COMMON} (independent)"
        return report
    report["fields"] = {**{f"{phase}_common": weights[phase] for phase in weights},
                        "common_ns": tau}
    return report


def fit_rhythm(scenario: Scenario, targets: list[tuple[int, int, float | None]],
               bins: dict[str, Any]) -> dict[str, Any]:
    """Common factors that give the recorded runs' rhythm (``calibrate --common rhythm``).

    ``targets``: (workers, updates, coupling) of each run; ``bins``: :func:`fit_common`'s
    report in ``on`` mode, whose τ is kept. One c for every phase, chosen by bisection so
    that ``scenario`` simulated at each run's worker count gives the runs' mean coupling.
    Returns a report like :func:`fit_common`'s, with the bisection's steps."""
    report: dict[str, Any] = {"fields": None, "bins": bins.get("bins")}
    wanted = [t for t in targets if t[2] is not None]
    if not wanted:
        report["why"] = "fewer than two workers ran together"
        return report
    if "common_ns" not in bins:
        report["why"] = bins.get("why", "no offset bins to measure τ")
        return report
    from simulator.engine import Engine

    tau = float(bins["common_ns"])
    goal = float(np.mean([coupling for _, _, coupling in wanted]))
    problem = make_problem(scenario.problem)
    steps: list[tuple[float, float]] = []

    def coupling_at(c: float) -> float:
        coupled = _with_common(scenario, {**{name: c for name in COMMON_FIELDS},
                                          "common_ns": tau if c > 0 else 0.0})
        found = []
        for workers, updates, _ in wanted:
            trial = replace(coupled, run=replace(scenario.run, threads=workers,
                                        updates=min(updates, _RHYTHM_UPDATES)),
                            metrics=replace(scenario.metrics, exact=False, curve_points=0))
            value = trace_rhythm(Engine(trial, problem).run())["coupling"]
            found.append(1.0 if value is None else value)
        steps.append((c, float(np.mean(found))))
        return steps[-1][1]

    report.update(goal=goal, common_ns=tau, steps=steps)
    if goal >= RHYTHM_NOTE:
        report["why"] = (f"the run's workers are independent: staleness {goal:.3f} × the "
                         f"independent-phase value, at least {RHYTHM_NOTE}")
        return report
    if coupling_at(0.0) <= goal:
        report["why"] = (f"the simulation keeps the run's rhythm already: staleness "
                         f"{steps[0][1]:.3f} × the independent-phase value, the run's {goal:.3f}")
        return report
    low, high = 0.0, _RHYTHM_HIGH
    if coupling_at(high) >= goal:
        low = high  # the strongest common factors tried: said in the report
    else:
        for _ in range(_RHYTHM_STEPS):
            middle = (low + high) / 2
            if coupling_at(middle) > goal:
                low = middle
            else:
                high = middle
    c = low if low == _RHYTHM_HIGH else (low + high) / 2
    report["weights"] = {phase: c for phase in ("read", "grad", "write", "idle")}
    report["fields"] = {**{name: c for name in COMMON_FIELDS}, "common_ns": tau}
    return report


def _common_fits(runs: list[tuple[Trace, np.ndarray, np.ndarray | None]], common: str
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pair bins and the common factors fitted from them: the same report, except that
    ``--common rhythm`` measures the bins (for τ) whatever they say and fits nothing yet."""
    if common != "rhythm":
        shared = fit_common(runs, common)
        return shared, shared
    return fit_common(runs, "on"), {"fields": None}


def _with_common(scenario: Scenario, fields: dict[str, Any]) -> Scenario:
    """A calibrated ``scenario`` (every device has its timing) with common-factor
    ``fields`` on each device's timing."""
    devices = []
    for device in scenario.devices:
        assert device.timing is not None  # calibrate gives every device its timing
        devices.append(replace(device, timing=replace(device.timing, **fields)))
    return replace(scenario, devices=tuple(devices))


def _with_rhythm(scenario: Scenario, targets: list[tuple[int, int, float | None]],
                 bins: dict[str, Any]) -> tuple[Scenario, dict[str, Any]]:
    """``scenario`` with the common factors :func:`fit_rhythm` finds, and its report."""
    report = fit_rhythm(scenario, targets, bins)
    if not report["fields"]:
        return scenario, report
    return _with_common(scenario, report["fields"]), report


def store_shares(rows: np.ndarray, lead: float, tail: float) -> np.ndarray:
    """Per row of ``simulator.trace.READ_SWEEP_COLUMNS``: the share of the write's
    coordinates a read ending ``begun_ns`` after the write began copies when the write stores
    them in order over its window less ``lead`` and ``tail`` ns (``timing.write_sweep_lead``,
    ``write_sweep_tail``; the engine's rule)."""
    begun, span, size = rows[:, 0], rows[:, 1], np.maximum(rows[:, 2], 1)
    first = np.minimum(lead, span)
    stores = np.maximum(span - lead - tail, 0.0)
    reached = np.ceil(np.divide((begun - first) * size, stores, out=np.full(begun.size, np.inf),
                                where=stores > 0))
    return np.where(begun <= first, 0.0, np.minimum(reached, size) / size)


def fit_store_window(traces: list[Trace]) -> dict[str, Any]:
    """``timing.write_sweep_lead`` and ``write_sweep_tail`` from the reads under a write
    (:func:`simulator.trace.read_sweeps`: measure-mode real runs of one block record them)
    of ``traces``, runs that read what writes in flight stored (``run.read_view =
    "sweep"``): the pair whose :func:`store_shares` are nearest the copied shares (least
    mean absolute difference; a grid up to the writes' 95th percentile, refined once), in
    ``"fields"`` when there are enough rows."""
    report: dict[str, Any] = {"fields": None}
    found = [rows for rows in map(read_sweeps, traces) if rows is not None]
    rows = np.concatenate(found) if found else np.zeros((0, 4))
    rows = rows[rows[:, 2] > 0]
    report["rows"] = int(rows.shape[0])
    if rows.shape[0] < _MIN_PAIRS:
        report["why"] = (f"{rows.shape[0]} reads under a write recorded (fewer than "
                         f"{_MIN_PAIRS}; a measure-mode real run of one block with read_view = "
                         "sweep records them)")
        return report
    seen = rows[:, 3] / rows[:, 2]

    def miss(lead: float, tail: float) -> float:
        return float(np.mean(np.abs(store_shares(rows, lead, tail) - seen)))

    top = float(np.percentile(rows[:, 1], 95))
    grid = np.linspace(0.0, top, 33)
    best = min(itertools.product(grid.tolist(), grid.tolist()), key=lambda p: miss(*p))
    step = grid[1] - grid[0]
    fine = [np.clip(v + np.linspace(-step, step, 17), 0.0, None).tolist() for v in best]
    lead, tail = min(itertools.product(*fine), key=lambda p: miss(*p))
    report.update(lead_ns=lead, tail_ns=tail, miss=miss(lead, tail), miss_whole=miss(0.0, 0.0),
                  whole=float(np.mean(seen == 1)), none=float(np.mean(seen == 0)),
                  write_median_ns=float(np.median(rows[:, 1])))
    report["fields"] = {"write_sweep_lead": lead, "write_sweep_tail": tail}
    return report


def _with_fitted(timing: TimingSpec, *reports: dict[str, Any]) -> TimingSpec:
    """``timing`` with the fields each report (convoys, common factors) fitted."""
    for report in reports:
        if report.get("fields"):
            timing = replace(timing, **report["fields"])
    return timing


def _public(report: dict[str, Any]) -> dict[str, Any]:
    """A fit report without its working arrays."""
    return {key: value for key, value in report.items() if key != "deflate"}


def _convoys_and_shared(runs: list[tuple[Trace, np.ndarray]], convoys: str, shared: str,
                        cores: int, quantum: int, paths: list[Path]
                        ) -> tuple[dict[str, Any], dict[str, Any], list[np.ndarray] | None]:
    """The convoy report (:func:`fit_convoys`; from the runs' probes, read from ``paths``,
    when every run has one worker: :func:`probed_meetings`), the ``write_shared`` one
    (:func:`fit_shared`, on the writes' times alone when convoys form; from the probes too
    when every run has one worker) and per run each row's write factor (None when not
    fitted); with a factor the convoys are fitted again with it."""
    alone = all(np.unique(trace["thread"]).size < 2 for trace, _ in runs)
    if alone and convoys != "off":
        convoy = probed_meetings([run_write_meetings(path) for path in paths], convoys,
                                 _median_write(runs) or None)
    else:
        convoy = fit_convoys(runs, convoys)
    sharing = fit_shared(runs, shared, censor=_forms_convoys(convoy),
                         probes=[run_shared_write(path) for path in paths])
    if not sharing["fields"]:
        return _convoy_report(convoy, cores, quantum), sharing, None
    factor = sharing["fields"]["write_shared"]
    if _forms_convoys(convoy) and not alone:
        convoy = fit_convoys(runs, convoys, factor)
    scales = []
    for (trace, _), deflate in zip(runs, sharing["deflate"], strict=True):
        scale = np.ones(len(trace))
        scale[deflate["write"][0]] = factor
        scales.append(scale)
    return _convoy_report(convoy, cores, quantum), sharing, scales


def _convoy_report(report: dict[str, Any], cores: int, quantum: int) -> dict[str, Any]:
    """Convoys cannot be simulated on a core pool without time slices: say so, drop them."""
    if _forms_convoys(report) and cores and not quantum:
        report = {**report, "fields": None,
                  "why": "convoys found, not used: they need --quantum with --cores"}
    return report


# Core speeds are kept (``speeds = "auto"``) when the slowest worker's median gradient is this
# many times the fastest's.
SPEED_SPREAD = 1.1


def core_speeds(samples: dict[int, dict[str, np.ndarray]], workers: int, cores: int,
                mode: str) -> dict[str, Any]:
    """Each worker's speed when every worker had a core of its own: its median gradient time
    against the geometric mean of all workers' (the gradient touches no shared memory, so it
    is the core's own pace). ``mode`` ``auto`` keeps the speeds when they differ by more than
    :data:`SPEED_SPREAD`, ``on`` whenever they can be fitted, ``off`` never.

    Raises:
        AsyngradError: ``on`` where they cannot be fitted (one worker, or workers ≠ cores).
    """
    if mode == "off":
        return {"kept": False, "why": "not asked for (--speeds off)"}
    why = ("one worker shows no spread of speeds" if workers < 2 else
           f"needs one worker per core: {workers} workers, --cores {cores}"
           if cores != workers else None)
    if why is not None:
        if mode == "on":
            raise AsyngradError(f"--speeds = 'on': {why}")
        return {"kept": False, "why": why}
    medians = np.array([float(np.median(samples[w]["grad"])) for w in sorted(samples)])
    speeds = float(np.exp(np.mean(np.log(medians)))) / medians
    spread = float(speeds.max() / speeds.min())
    kept = mode == "on" or spread > SPEED_SPREAD
    return {"kept": kept, "speeds": [round(float(v), 4) for v in speeds],
            "spread": round(spread, 4),
            "why": ("" if kept else f"speeds within {SPEED_SPREAD}× of each other")}


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
    levels = np.concatenate(smooth)
    low, high = np.quantile(levels, [0.1, 0.9])
    for _ in range(100):  # 1-D 2-means from the 10% and 90% quantiles
        slow = levels > (low + high) / 2
        if slow.all() or not slow.any():
            break
        new = float(np.mean(levels[~slow])), float(np.mean(levels[slow]))
        if new == (low, high):
            break
        low, high = new
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
    time, ended = np.zeros(2), np.zeros(2)
    for index, rows in orders:
        trace = runs[index]
        state = slow_of[index][rows].astype(int)
        start = trace["read_start"][rows].astype(np.float64)
        spans = np.append(np.diff(start), float(trace["write_end"][rows[-1]]) - start[-1])
        np.add.at(time, state, spans)
        np.add.at(ended, state[:-1][state[1:] != state[:-1]], 1)
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


def _at_speed_one(samples: dict[int, dict[str, np.ndarray]],
                  speeds: list[float]) -> dict[int, dict[str, np.ndarray]]:
    """Every duration as it would be on a core of speed 1 (a device's speed divides them)."""
    return {w: {op: values * speeds[i] for op, values in ops.items()}
            for i, (w, ops) in enumerate(sorted(samples.items()))}


def calibrate(run_dir: str | Path | list[str | Path], pool: bool = False, cores: int = 0,
              quantum: int = 0, slicing: str = "per_core",
              convoys: str = "auto", common: str = "off",
              interference: str = "off", speeds: str = "off",
              episodes: str = "off", shared: str = "off") -> tuple[Scenario, dict[str, Any]]:
    """The calibrated scenario of a run directory, or of repeats of one run (several run
    directories of one problem at one worker count, fitted together), and the fit report.

    ``pool`` fits one timing to all workers together and puts every thread on one device
    with ``cores`` cores (0: one per thread): the form to predict other worker counts on the
    same machine, where threads beyond the cores time-share them (per action, or in time
    slices of ``quantum`` ns as an OS scheduler does, rotating per core or over all cores
    as ``slicing`` says, preemptively: a slice's end stops an action midway).
    ``convoys``: fit write convoys when found (``auto``), whenever there are pairs to fit
    (``on``), or never (``off``); ``common``: likewise for common
    factors (``auto`` keeps them when some phase's c reaches 0.05; off unless asked for:
    see docs/fidelity.md for what they do to a prediction); ``interference``: likewise for
    the slowdowns of one worker's phases under another's (``auto`` keeps them when one
    reaches 0.1), the durations then fitted as drawn with the others idle; ``speeds`` (with
    ``pool``, one worker per core, one run): each core's own speed (:func:`core_speeds`), so
    the simulation puts thread j on a device of one core with core j mod ``cores``'s speed;
    ``episodes``: the cores' speed episodes (:func:`fit_episodes`; ``auto`` keeps them when
    found), taken out of every duration before the rest is fitted; ``shared``: likewise for
    ``timing.write_shared`` (:func:`fit_shared`; ``auto`` keeps a factor of 1.2 or more, or
    1/1.2 or less), taken out of the marked writes before the rest is fitted. Repeats add up: every
    fit sees the updates of all of them (a core's pace that changes between runs but holds
    within one shows as long episodes).

    Raises:
        AsyngradError: not a run directory, an unreadable trace, fewer than 2 updates,
            repeats of different problems, block or worker counts, or ``speeds`` with repeats.
    """
    paths = [Path(d) for d in (run_dir if isinstance(run_dir, list) else [run_dir])]
    loaded = [(path, *_load(path)) for path in paths]
    base_path, _, scenario = loaded[0]
    for path, _, other in loaded[1:]:
        if (other.problem, other.run.blocks, other.run.threads) != (
                scenario.problem, scenario.run.blocks, scenario.run.threads):
            raise AsyngradError(f"calibrate: {path} is not a repeat of {base_path} (another "
                                "problem, block count or worker count)")
    if len(loaded) > 1 and speeds != "off":
        raise AsyngradError(f"--speeds = '{speeds}': fits one run (which core was slow "
                            "changes between runs: --episodes fits that)")
    traces = [trace for _, trace, _ in loaded]
    spans = [running_together(trace) for trace in traces]
    convoy, sharing, scales = _convoys_and_shared(list(zip(traces, spans, strict=True)),
                                                  convoys, shared, cores, quantum, paths)
    alones = [alone_writes(trace, together) if _forms_convoys(convoy) else None
              for trace, together in zip(traces, spans, strict=True)]
    threads = scenario.run.threads
    rhythms = {(str(threads) if len(loaded) == 1 else f"{threads} ({path.name})"):
               trace_rhythm(trace) for path, trace, _ in loaded}
    stores = fit_store_window([trace for _, trace, run in loaded
                               if run.run.read_view == "sweep"])
    episode = fit_episodes(traces, episodes)
    if episode["fields"]:  # the durations at the cores' own pace
        own = 1 / episode["fields"]["slow_factor"]
        traces = [_deflated(trace, {phase: (rows, np.full(rows.size, own))
                                    for phase in ("read", "grad", "write", "idle")})
                  for trace, rows in zip(traces, episode["slow_rows"], strict=True)]
    if sharing["fields"]:  # the marked writes as drawn
        traces = [_deflated(trace, factors)
                  for trace, factors in zip(traces, sharing["deflate"], strict=True)]
    runs = list(zip(traces, spans, alones, strict=True))
    bins, common_fit = _common_fits(runs, common)
    slowed = fit_interference(runs, interference, scales)
    per_run = []
    for index, (trace, together, alone_rows) in enumerate(runs):
        if slowed["deflate"] and slowed["deflate"][index]:
            trace = _deflated(trace, slowed["deflate"][index])  # drawn with the others idle
        mine = operation_samples(trace, scenario, together)
        if alone_rows is not None:  # the write alone: convoys stretch it again
            alone = _alone_samples(trace, scenario, together)
            for worker, ops in mine.items():
                ops.update(alone[worker])
        per_run.append(mine)
    samples = {worker: {op: np.concatenate([mine[worker][op] for mine in per_run])
                        for op in ops} for worker, ops in per_run[0].items()}
    pace: dict[str, Any] = (core_speeds(samples, threads, cores, speeds) if pool
            else {"kept": False, "why": "per-worker timings (no --pool) carry each one's speed"})
    if pace["kept"]:
        samples = _at_speed_one(samples, pace["speeds"])
    if pool:
        samples = {-1: _pooled(samples)}
    devices, report = [], {}
    for worker, ops in samples.items():
        fits = {op: _write_fit(ops, op) for op in ("read", "grad", "write", "idle")}
        name = "all workers" if worker < 0 else f"worker {worker}"
        report[name] = {op: fit.describe() for op, fit in fits.items()}
        timing = _with_fitted(TimingSpec(read=fits["read"].duration, grad=fits["grad"].duration,
                                         write=fits["write"].duration,
                                         idle=fits["idle"].duration), convoy, common_fit,
                              slowed, sharing, stores)
        devices.append(DeviceSpec(name=name.replace(" ", ""), cores=cores, quantum=quantum,
                                  slicing=slicing, preempt=quantum > 0, timing=timing,
                                  **(episode["fields"] or {})))
    if pace["kept"]:  # one device per core, thread j on device j mod cores
        devices = [replace(devices[0], name=f"core{j}", cores=1, speed=speed)
                   for j, speed in enumerate(pace["speeds"])]
    # The recorded durations already contain stragglers and network links: drop them.
    calibrated = replace(scenario, name=f"{scenario.name}-calibrated", devices=tuple(devices),
                         inject=replace(scenario.inject, stragglers=()))
    if common == "rhythm":  # the repeats' mean rhythm, at the longest repeat's length
        couplings = [r["coupling"] for r in rhythms.values() if r["coupling"] is not None]
        calibrated, common_fit = _with_rhythm(
            calibrated, [(threads, max(len(t) for t in traces),
                          float(np.mean(couplings)) if couplings else None)], bins)
    return calibrated, {"source": traces[0].source,
                        "run": ", ".join(str(path) for path in paths), "fits": report,
                        "rows_fitted": int(sum(together.size for together in spans)),
                        "rows": sum(len(trace) for trace in traces),
                        "contention": contention(list(zip(traces, spans, strict=True))),
                        "convoys": convoy,
                        "common": common_fit, "interference": _public(slowed),
                        "shared": _public(sharing), "stores": stores, "rhythm": rhythms,
                        "speeds": pace,
                        "episodes": {k: v for k, v in episode.items() if k != "slow_rows"}}


def run_workers(run_dir: str | Path) -> int | None:
    """The worker count a run directory's ``summary.json`` records (None when it cannot be
    read: loading the run says why)."""
    import json

    try:
        threads = json.loads((Path(run_dir) / "summary.json").read_text())["threads"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return threads if isinstance(threads, int) else None


def _load(path: Path) -> tuple[Trace, Scenario]:

    if not (path / "trace.npz").is_file():
        raise AsyngradError(f"calibrate: {path}: not a run directory (no trace.npz)")
    try:
        trace = Trace.load(path / "trace.npz")
    except TraceError as err:
        raise AsyngradError(f"calibrate: {err}") from None
    if len(trace) < 2:
        raise AsyngradError(f"calibrate: {path}: the trace has {len(trace)} updates")
    return trace, scenario_from_dict(tomllib.loads(trace.scenario_toml))


def _scaled(duration: Duration, factor: float) -> Duration:
    """``duration`` with every draw divided by ``factor``."""
    factor = float(factor)
    if duration.dist == "empirical":
        return replace(duration, values=tuple(float(v) / factor for v in duration.values),
                       mean=float(duration.mean) / factor)
    return replace(duration, mean=float(duration.mean) / factor,
                   low=float(duration.low) / factor, high=float(duration.high) / factor)


def calibrate_counts(run_dirs: list[str | Path], cores: int = 0, quantum: int = 0,
                     slicing: str = "per_core", convoys: str = "auto",
                     common: str = "off", interference: str = "off", shared: str = "off",
                     ) -> tuple[Scenario, dict[str, Any]]:
    """One pooled timing fitted from runs of one problem at two or more worker counts, with
    the contention between them as a slowdown per other worker.

    For each of read, gradient, write (whole-vector durations) and the local work between
    updates (idle), the mean duration of every run (the updates made while all its workers
    ran) is fitted by least squares as b·(1 + x·(k − 1)) over the worker counts k: x (at
    least 0) is the scenario's ``*_per_thread`` and the distribution is the one fitted on
    the fewest-worker run with its draws divided by 1 + x·(k_min − 1), i.e. one worker
    alone. Everything lands on one device with ``cores`` cores (0: one per thread) and
    time slices of ``quantum`` ns (``slicing`` as in :func:`calibrate`). Write convoys are
    fitted from the runs' pairs together; with convoys, the write means are those of the
    time a write runs alone, met writes censored at the meeting (:func:`write_survival`).
    Common factors are fitted from the runs' pairs of phases
    together (runs of one worker have none), and so are interference, whose fitted
    slowdowns are taken out of every duration before the means are compared, and
    ``write_shared`` (``shared``, :func:`fit_shared`), taken out of the marked writes.

    Raises:
        AsyngradError: fewer than two runs, a repeated worker count, runs of different
            problems or block counts, or a run directory that cannot be read.
    """
    if len(run_dirs) < 2:
        raise AsyngradError("calibrate: contention needs runs at two or more worker counts")
    loaded = [(Path(d), *_load(Path(d))) for d in run_dirs]
    loaded.sort(key=lambda item: item[2].run.threads)
    counts = [scenario.run.threads for _, _, scenario in loaded]
    if len(set(counts)) != len(counts):
        raise AsyngradError(f"calibrate: the runs' worker counts {counts} repeat; give one "
                            "run per worker count (repeats of a single count are fitted "
                            "together)")
    base_path, _, base = loaded[0]
    for path, _, scenario in loaded[1:]:
        if scenario.problem != base.problem or scenario.run.blocks != base.run.blocks:
            raise AsyngradError(f"calibrate: {path} trains another problem or block count "
                                f"than {base_path}")
    pooled, fitted_rows, spans = [], 0, []
    for _, trace, _ in loaded:
        spans.append(running_together(trace))
        fitted_rows += int(spans[-1].size)
    convoy, sharing, scales = _convoys_and_shared(
        [(trace, rows) for (_, trace, _), rows in zip(loaded, spans, strict=True)],
        convoys, shared, cores, quantum, [path for path, _, _ in loaded])
    traces = [trace for _, trace, _ in loaded]
    stores = fit_store_window([trace for _, trace, run in loaded
                               if run.run.read_view == "sweep"])
    if sharing["fields"]:  # the marked writes as drawn
        traces = [_deflated(trace, factors)
                  for trace, factors in zip(traces, sharing["deflate"], strict=True)]
    runs = [(trace, together, alone_writes(trace, together) if _forms_convoys(convoy)
             else None)
            for trace, together in zip(traces, spans, strict=True)]
    bins, common_fit = _common_fits(runs, common)
    slowed = fit_interference(runs, interference, scales)
    for index, ((_, _, scenario), (trace, together, alone_rows)) in enumerate(
            zip(loaded, runs, strict=True)):
        if slowed["deflate"] and slowed["deflate"][index]:
            trace = _deflated(trace, slowed["deflate"][index])
        samples = _pooled(operation_samples(trace, scenario, together))
        if alone_rows is not None:
            samples.update(_pooled(_alone_samples(trace, scenario, together)))
        pooled.append(samples)
    k = np.asarray(counts, dtype=np.float64) - 1
    contention: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    fits: dict[str, str] = {}
    for op in ("read", "grad", "write", "idle"):
        means = np.array([_mean(p, op) for p in pooled])
        slope, intercept = np.polyfit(k, means, 1)
        per_thread = max(float(slope / intercept), 0.0) if intercept > 0 else 0.0
        fit = _write_fit(pooled[0], op)
        timing[op] = _scaled(fit.duration, 1 + per_thread * k[0])
        timing[f"{op}_per_thread"] = per_thread
        fits[op] = fit.describe()
        contention[op] = {"per_thread": per_thread, "alone_ns": float(intercept),
                          "means_ns": {str(c): float(m) for c, m in zip(counts, means,
                                                                          strict=True)}}
    device = DeviceSpec(name="allworkers", cores=cores, quantum=quantum, slicing=slicing,
                        preempt=quantum > 0,
                        timing=_with_fitted(TimingSpec(**timing), convoy, common_fit, slowed,
                                            sharing, stores))
    calibrated = replace(base, name=f"{base.name}-calibrated", devices=(device,),
                         inject=replace(base.inject, stragglers=()))
    rhythms = {str(c): trace_rhythm(t) for c, (_, t, _) in zip(counts, loaded, strict=True)}
    if common == "rhythm":
        calibrated, common_fit = _with_rhythm(
            calibrated, [(c, len(t), rhythms[str(c)]["coupling"])
                         for c, (_, t, _) in zip(counts, loaded, strict=True)], bins)
    return calibrated, {"source": loaded[0][1].source, "run": ", ".join(str(d) for d in
                                                                       run_dirs),
                        "fits": {f"all workers at k = {counts[0]}": fits},
                        "rows_fitted": fitted_rows,
                        "rows": sum(len(t) for _, t, _ in loaded), "worker_counts": counts,
                        "contention": contention, "convoys": convoy, "common": common_fit,
                        "interference": _public(slowed), "shared": _public(sharing),
                        "stores": stores, "rhythm": rhythms}


def _mean(samples: dict[str, np.ndarray], op: str) -> float:
    """An operation's mean duration in one run's samples (writes: with the censored)."""
    censored = samples.get("write_censored") if op == "write" else None
    if censored is not None and censored.size and samples[op].size:
        return Survival.of(samples[op], censored).mean()
    return float(samples[op].mean()) if samples[op].size else 0.0


MARKER = "# asyngrad-lab calibrated scenario"


def calibrated_toml(scenario: Scenario, report: dict[str, Any]) -> str:
    """The calibrated scenario as TOML, the fit report in comments above it."""
    from simulator.scenario import scenario_to_toml

    lines = [MARKER, f"# fitted from {report['run']} ({report['source']} run; "
             f"{report['rows_fitted']} of {report['rows']} updates, those made while every "
             "worker was running)"]
    for worker, fits in report["fits"].items():
        for op, text in fits.items():
            lines.append(f"#   {worker} {op}: {text}")
    if "time_slice" in report:
        lines.append(f"#   time slice: {report['time_slice']}")
    if "migrate" in report:
        lines.append(f"#   load balancer: {report['migrate']}")
    for phase, fit in report["contention"].items():
        if fit is not None and "per_thread" in fit:
            means = ", ".join(f"k = {k}: {m:.4g} ns" for k, m in fit["means_ns"].items())
            lines.append(f"#   contention, {phase}: ×(1 + {fit['per_thread']:.4g}·(k − 1)), "
                         f"alone {fit['alone_ns']:.4g} ns (means {means})")
            continue
        lines.append(f"#   contention, {phase}: " + (
            "no variation in concurrency" if fit is None else
            f"{fit['ns_per_concurrent']:.4g} ns per other worker in the same phase "
            f"(base {fit['base_ns']:.4g} ns, mean {fit['mean_concurrent']:.3g} others)"))
    lines.append(f"#   write convoys: {_describe_convoys(report['convoys'])}")
    lines.append(f"#   common factors: {_describe_common(report['common'])}")
    lines.append(f"#   interference: {_describe_interference(report['interference'])}")
    if "shared" in report:
        lines.append(f"#   lines another worker read last: {_describe_shared(report['shared'])}")
    if "stores" in report:
        lines.append(f"#   stores in a write's window: {_describe_stores(report['stores'])}")
    lines.append(f"#   rhythm: {_describe_rhythm(report['rhythm'], report['common'])}")
    if "speeds" in report:
        lines.append(f"#   core speeds: {_describe_speeds(report['speeds'])}")
    if "episodes" in report:
        lines.append(f"#   speed episodes: {_describe_episodes(report['episodes'])}")
    for run, latency in report.get("cpu_latency", {}).items():
        if latency is not None:
            lines.append(f"#   CPUs of {run}: {latency_line(latency)}: a prediction holds for "
                         "runs whose CPUs are placed alike (dense shared writes take many times "
                         "as long far apart)")
    states = [placement(latency) for latency in report.get("cpu_latency", {}).values()]
    if len(set(states) - {None}) > 1:
        counts = ", ".join(f"{state} {states.count(state)}" for state in ("near", "far",
                                                                          "changing")
                           if state in states)
        lines.append(f"#   placements differ between the runs ({counts}): fitted together, "
                     "a rhythm or convoys that hold in one placement are averaged away; "
                     "fit runs of one placement")
    body = scenario_to_toml(scenario).split("\n", 1)[1]  # its own header line replaced
    return "\n".join(lines) + "\n" + body


def _describe_episodes(report: dict[str, Any]) -> str:
    """One line on the cores' speed episodes."""
    if "factor" not in report:
        return f"none ({report['why']})"
    found = (f"slow level {report['factor']:.3g}× the fast one (D = {report['separation']:.3g}),"
             f" {report['slow_share']:.3g} of the updates slow; episodes fast "
             f"{report['fast_ns'] / 1e6:.3g} ms, slow {report['slow_ns'] / 1e6:.3g} ms on "
             f"average ({report['episodes_ended'][0]:.0f} and {report['episodes_ended'][1]:.0f} "
             + ("ended within the run)" if report["runs"] == 1 else
                "ended within the runs); slow share per run "
                + ", ".join(f"{v:.2g}" for v in report["slow_share_per_run"])))
    return found if report["fields"] else f"none fitted: {found}; {report['why']}"


def _describe_speeds(report: dict[str, Any]) -> str:
    if "speeds" not in report:
        return f"none ({report['why']})"
    speeds = ", ".join(f"{v:.3g}" for v in report["speeds"])
    return (f"{speeds} (worker r's median gradient against all workers'; the slowest "
            f"{report['spread']:.3g}× the fastest)" + (
                "; thread j simulated on core j mod cores at its speed" if report["kept"]
                else f"; not kept: {report['why']}"))


def _describe_rhythm(report: dict[str, dict[str, Any]], common: dict[str, Any]) -> str:
    found = {k: r for k, r in report.items() if r["coupling"] is not None}
    if not found:
        return "one worker at a time: nothing to say"
    parts = ", ".join(f"k = {k}: staleness {r['staleness']:.3g} = {r['coupling']:.3f} × the "
                      f"independent-phase value {r['independent_staleness']:.3g}"
                      for k, r in found.items())
    low = min(r["coupling"] for r in found.values())
    if low >= RHYTHM_NOTE:
        return f"{parts} (phases independent, as simulated)"
    if common.get("fields") and "goal" in common:
        return f"{parts}: the workers kept a common rhythm, modelled by the common factors above"
    expect = ("no update saw another's completion (a lock)" if low == 0 else
              f"expect simulated staleness up to {1 / low:.2f}× the real one")
    return (f"{parts}: the workers kept a common rhythm that the simulator's independent "
            f"draws lack, so {expect} (calibrate --common rhythm models it)")


def _describe_convoys(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return f"none fitted ({report.get('why', '')})"
    measured = (f"lost coordinates from {report['classified']} classified pairs"
                if report.get("classified") else "no classified pairs: nothing lost")
    if report.get("probes"):
        measured = f"from {report['classified']} meetings the runs' probes made"
    within = fields.get("convoy_lost_within", 0.0)
    falls = (f" (at lag 0, falling as exp(−f/{within:.3g}) with the share f the leader had "
             "swept)" if within else "")
    spread = fields.get("convoy_lost_spread", 0.0)
    unlike = (f", each meeting at its own rate (spread ρ = {spread:.3g})" if spread else "")
    losses = (f"{fields['convoy_lost_pairs']:.3g} of the pairs lose coordinates{falls}, shares "
              f"then: leader {fields['convoy_lost_leader']:.3g}, joiner "
              f"{fields['convoy_lost_joiner']:.3g}{unlike} ({measured})")
    gap = f"end gap {report['end_gap_over_start_gap']:.3g} × start gap"
    caught, hinge = fields.get("convoy_end_catch_up", 0.0), report.get("end_gap_hinge")
    catch_up = (f" beyond its first {caught:.4g} ns (the end gaps' error "
                f"{hinge['error'] / hinge['proportional_error']:.2f} of the proportional "
                "fit's)" if caught and hinge else "")
    if not _forms_convoys(report):
        return (f"none: {report['pairs']} pairs of writes that met ended apart ({gap}), so "
                f"writes pass each other; {losses}")
    return (f"{report['pairs']} pairs of writes that met ended together ({gap}); joiner "
            f"ends after {fields['convoy_join']:.3g} × its write + "
            f"{fields['convoy_rest']:.3g} × the leader's rest (a write alone: "
            f"{report['alone_write_ns']:.4g} ns, "
            + ("in the probe" if report.get("probes") else "met writes censored at the meeting")
            + ") and "
            "trails the leader's end by "
            f"{fields['convoy_end_gap']:.3g} × its start lag{catch_up}; {losses}")


def _describe_common(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return f"none fitted ({report.get('why', '')})"
    if "goal" in report:
        last = min(report["steps"], key=lambda step: abs(step[1] - report["goal"]))
        bound = " (the largest tried)" if fields["read_common"] == _RHYTHM_HIGH else ""
        return (f"fitted to the rhythm: c = {fields['read_common']:.4g}{bound} for every phase, "
                f"τ = {fields['common_ns']:.4g} ns (from the pair bins): simulated, staleness "
                f"{last[1]:.3f} × the independent-phase value at c = {last[0]:.4g}, the run's "
                f"{report['goal']:.3f} ({len(report['steps'])} simulations)")
    near = ", ".join(f"{phase} {bins['correlation'][0]:.2f} ({bins['pairs'][0]} pairs)"
                     for phase, bins in report["bins"].items())
    borrowed = (" (the others' mean: writes that met no other are the short ones)"
                if report.get("write_from_others") else "")
    weights = ", ".join(f"{phase} {fields[phase + '_common']:.3g}"
                        f"{borrowed if phase == 'write' else ''}"
                        for phase in ("read", "grad", "write", "idle"))
    return (f"c·exp(−Δt/τ) with τ = {fields['common_ns']:.4g} ns, c: {weights} (phases "
            f"starting under 250 ns apart alike by {near})")


def _describe_interference(report: dict[str, Any]) -> str:
    fields = report.get("fields")
    if not fields:
        return f"none fitted ({report.get('why', '')})"
    parts = []
    for phase, fit in report["phases"].items():
        noise = fit.get("within_noise", [])
        slowed = ", ".join(f"{q} {value:.3g} ({fit['rows_under'][q]} rows"
                           f"{', within noise' if q in noise else ''})"
                           for q, value in fit["slowdown"].items())
        parts.append(f"{phase} under {slowed}")
    return ("slowdown per other worker in a phase, against "
            f"the others idle: {'; '.join(parts)}")


def _describe_stores(report: dict[str, Any]) -> str:
    if not report.get("fields"):
        return f"the whole window ({report.get('why', '')})"
    return (f"from {report['lead_ns']:.4g} ns after its start to {report['tail_ns']:.4g} ns "
            f"before its end (median write {report['write_median_ns']:.4g} ns), from "
            f"{report['rows']} reads under a write ({report['whole']:.2f} held all of it, "
            f"{report['none']:.2f} none): copied share off by {report['miss']:.3f} on average, "
            f"{report['miss_whole']:.3f} with the whole window")


def _describe_shared(report: dict[str, Any]) -> str:
    measured = ""
    if "factor" in report and "probes" in report:
        line = report.get("line_ns")
        measured = (f"from the runs' probes ({report['probes']}): such a write took "
                    f"{report['extra_ns']:.4g} ns more, on a median write of "
                    f"{report['median_write_ns']:.4g} ns"
                    + (f" (a cache line between the CPUs: {line:.0f} ns)" if line else ""))
    elif "factor" in report:
        measured = (f"{report['rows_shared']} writes on lines another worker read last, "
                    f"median {report['median_shared_ns']:.4g} ns, against "
                    f"{report['median_other_ns']:.4g} ns for the {report['rows_other']} others")
    if not report.get("fields"):
        return f"none fitted ({report.get('why', '')})" + (f": {measured}" if measured else "")
    return f"write_shared {report['factor']:.3g}: {measured}"
