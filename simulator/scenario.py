"""Scenarios: frozen, validated dataclasses read from TOML, with ``key=value`` overrides.

Every field has a default, so ``Scenario()`` is a complete scenario (the embedded default: dense
logistic regression, 8 lock-free threads, load_store writes). Files and overrides are merged
over the defaults field by field; every value is type-checked and validated on creation, and a
bad one raises :class:`ScenarioError` naming its full dotted field and the value. Each field is
declared once with :func:`simulator.keys.key`, its one-line description beside its default;
``docs/scenario.md`` lists them all (:mod:`simulator.scenario_reference`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.distributions import Duration
from simulator.errors import ScenarioError
from simulator.keys import key

__all__ = ["ADMMSpec", "DCASGDSpec", "DeathSpec", "DeviceSpec", "InjectSpec", "MetricsSpec",
           "ParamServerSpec", "PauseSpec", "ProblemSpec", "RunSpec", "Scenario", "StragglerSpec",
           "TimingSpec",
           "load_scenario", "scenario_from_dict", "scenario_to_dict", "scenario_to_toml",
           "with_overrides"]

PROTOCOLS = ("serial", "locked", "lockfree", "roundrobin", "minibatch", "paramserver",
             "staleness_lr", "dcasgd", "admm")
WRITE_MODES = ("load_store", "atomic_add")
LR_SCHEDULES = ("constant", "inv_sqrt", "inverse")
SPLITS = ("shared", "even")
PLACEMENTS = ("round_robin", "shuffled")
READ_VIEWS = ("end", "sweep")
# Protocols without rounds or turns: their threads may stop at a fixed quota each.
EVEN_SPLIT_PROTOCOLS = ("serial", "locked", "lockfree", "staleness_lr", "dcasgd")
SLICINGS = ("global", "per_core")
# Writes that meet: convoys (convoy_join > 0) or passing writes, and what they lose.
CONVOY_FIELDS = ("convoy_join", "convoy_rest", "convoy_lost_leader", "convoy_lost_joiner",
                 "convoy_lost_pairs", "convoy_lost_within", "convoy_lost_spread",
                 "convoy_end_gap", "convoy_end_catch_up")
COMMON_FIELDS = ("read_common", "grad_common", "write_common", "idle_common")
PHASES = ("read", "grad", "write", "idle")  # in the order of simulator.timing.READ ... IDLE
# Interference: the slowdown of phase p per other thread of the device in phase q (an other
# thread's idle is the reference: it slows nothing).
INTERFERENCE_FIELDS = tuple(f"{p}_under_{q}" for p in PHASES for q in PHASES[:3])
# Real data that a package ships, and the problem each serves.
REAL_DATA = {"breast_cancer": "logistic", "digits": "mlp"}
DATA_SOURCES = ("synthetic", *REAL_DATA)
# The shape of each real data set, which its resolved ProblemSpec shows: (field, value, what).
REAL_SHAPES = {
    "breast_cancer": (("dim", 30, "features"), ("n_samples", 569, "samples")),
    "digits": (("dim", 64, "pixels"), ("n_samples", 1797, "samples"), ("classes", 10, "classes")),
}
INT64_MAX = 2 ** 63 - 1
# The most virtual threads a run may have: setting a run up takes time and
# memory that grow with the square of the threads (each thread knows its device's others),
# about 4 s and 0.7 GB at this cap.
MAX_THREADS = 4096


def _check(ok: bool, name: str, value: Any, reason: str) -> None:
    if not ok:
        raise ScenarioError(name, value, reason)


def _check_ints(spec: Any) -> None:
    """Every integer field fits the int64 the engine and the trace store it in."""
    for item in dataclasses.fields(spec):
        value = getattr(spec, item.name)
        if isinstance(value, int) and not isinstance(value, bool):
            _check(-INT64_MAX - 1 <= value <= INT64_MAX, item.name, value,
                   "must fit in a 64-bit integer (|value| < 2^63)")


def _real_shape(spec: ProblemSpec) -> None:
    """A real data set's dimension, sample count (and classes) in its spec: a field left at
    its default takes the data's value; any other value than the data's is refused."""
    for name, real, what in REAL_SHAPES.get(spec.data, ()):
        value = getattr(spec, name)
        _check(value in (real, ProblemSpec.__dataclass_fields__[name].default), name, value,
               f"the {spec.data} data has {real} {what} (leave it unset)")
        object.__setattr__(spec, name, real)


@dataclass(frozen=True)
class ProblemSpec:
    """Which problem to train and how to generate its data (``seed`` is the data seed).

    ``dim`` is the number of features (for ``mlp``, its input size; the parameter count is
    hidden·(dim + 1) + classes·(hidden + 1)); ``density`` serves ``sparse_logistic``;
    ``hidden`` and ``classes`` serve ``mlp``. For ``lstm_tagger`` and ``dense_crf``, ``dim`` is
    the vocabulary, ``hidden`` the embedding (and LSTM) size, ``classes`` the tags and
    ``length`` the tokens per sequence (a sample). Synthetic problems draw a held-out set of
    n/4 samples from the same model; ``holdout`` keeps that fraction of a real data set
    (``breast_cancer``, ``digits``) out of training, a seeded split. A real data set fixes
    ``dim`` and ``n_samples`` (for ``digits`` also ``classes``): the resolved spec shows its
    values (breast_cancer 30 features and 569 samples, digits 64 pixels, 1,797 samples and 10
    classes; ``n_samples`` counts the whole set, before ``holdout``), and any other value is
    refused (a field at its default counts as unset)."""

    name: str = key("logistic", "the problem to train (a name in simulator.problems.PROBLEMS)")
    data: str = key("synthetic", "generated data, or a real data set a package ships",
                    choices=DATA_SOURCES)
    dim: int = key(100, "features (mlp: inputs; lstm_tagger, dense_crf: vocabulary)",
                   bounds=">= 1")
    n_samples: int = key(1000, "training samples (a real data set: the whole set)",
                         bounds=">= 1")
    l2: float = key(0.01, "L2 regularisation weight λ", bounds=">= 0")
    density: float = key(0.01, "share of features a sample has (sparse_logistic)",
                         bounds="(0, 1]")
    hidden: int = key(32, "hidden units (mlp); embedding and LSTM size (taggers)",
                      bounds=">= 1")
    classes: int = key(4, "classes (mlp); tags (taggers)", bounds=">= 2")
    length: int = key(8, "tokens per sequence, one sample (taggers)", bounds=">= 1")
    seed: int = key(0, "the data seed (synthetic data; a real set's holdout split)", bounds=">= 0")
    holdout: float = key(0.0, "share of a real data set held out of training", bounds="[0, 1)")

    def __post_init__(self) -> None:
        _check(self.data in DATA_SOURCES, "data", self.data,
               f"must be one of {', '.join(DATA_SOURCES)}")
        _check(self.data == "synthetic" or REAL_DATA[self.data] == self.name, "data",
               self.data, f"serves the {REAL_DATA.get(self.data)} problem, not {self.name}")
        _check_ints(self)
        _real_shape(self)
        _check(self.dim >= 1, "dim", self.dim, "must be >= 1")
        _check(self.n_samples >= 1, "n_samples", self.n_samples, "must be >= 1")
        _check(math.isfinite(self.l2) and self.l2 >= 0, "l2", self.l2, "must be >= 0")
        _check(0 < self.density <= 1, "density", self.density, "must be in (0, 1]")
        _check(self.hidden >= 1, "hidden", self.hidden, "must be >= 1 (mlp hidden units)")
        _check(self.classes >= 2, "classes", self.classes, "must be >= 2 (mlp classes)")
        _check(self.length >= 1, "length", self.length, "must be >= 1 (lstm_tagger tokens)")
        _check(self.seed >= 0, "seed", self.seed, "must be >= 0")
        _check(math.isfinite(self.holdout) and 0 <= self.holdout < 1, "holdout", self.holdout,
               "must be in [0, 1)")
        _check(self.holdout == 0 or self.data != "synthetic", "holdout", self.holdout,
               "splits a real data set; synthetic problems draw their own held-out samples")


@dataclass(frozen=True)
class TimingSpec:
    """Durations of one whole-vector read, one gradient, one whole-vector write (ns), and of
    the local work before each update (``idle``: drawing the sample, bookkeeping; it touches
    no shared memory and holds a core).

    A block's read or write takes a draw times the fraction of coordinates it moves.

    Contention that grows with the number of workers (shared caches, the memory bus): with
    k the workers that run at once (``run.threads``, or the device's cores when fewer), every
    read draw is scaled by 1 + ``read_per_thread``·(k − 1), and likewise gradient, write and
    idle draws: the draws describe one worker alone.
    ``asyngrad calibrate`` fits these from runs at two or more worker counts.

    Write convoys (``convoy_join`` > 0; ``load_store`` writes of whole blocks): a write that
    starts while other writes of the same block are in flight joins them, and all of them end
    together, ``convoy_join`` × its own drawn duration plus ``convoy_rest`` × the time the
    in-flight writes had left after it starts (never earlier than they would have). The
    convoy's front sweeps the block from the leader's position at the join to its end; in
    that shared part each coordinate's store is lost with probability ``convoy_lost_leader``
    for the convoy's first write and ``convoy_lost_joiner`` for the one joining (never both),
    as two in-place sweeps ``w -= step`` that meet on hardware end in lockstep and lose
    element stores. ``convoy_lost_pairs`` < 1: a join loses anything only with that
    probability (then each coordinate as above): on hardware most meetings lose nothing and
    the others lose many coordinates together. ``convoy_lost_within`` > 0: that probability
    falls with how far the leader had swept when the other write came, f (0 to 1), as
    ``convoy_lost_pairs``·exp(−f / ``convoy_lost_within``): sweeps that start together
    meet at every coordinate, one that starts late trails behind. ``convoy_lost_spread`` =
    ρ in [0, 1): a meeting that loses anything loses at its own rate s, drawn per meeting
    from a Beta distribution with mean μ = ``convoy_lost_leader`` + ``convoy_lost_joiner``
    and intra-meeting correlation ρ (two coordinates of one meeting are lost together with
    correlation ρ), split between the two writes in that ratio (so a lossy meeting may
    still lose nothing): on hardware one lossy meeting loses a cache line or two and the
    next most of its shared part. 0 (the default): every meeting loses each
    coordinate at μ, as before. ``convoy_end_gap`` = g:
    a member that started its write ``lag`` ns after the convoy's first write ends g·lag
    after the convoy's end (0: all end together), as the follower of two real sweeps in
    lockstep ends a little after the leader (the leader's next read then runs under the
    follower's write). ``convoy_end_catch_up`` = a ns: it ends g·max(0, lag − a) after
    instead, a member makes up the first a ns of its lag (0, the default: g·lag), as on a
    2-core MLP run whose met writes end together up to a lag of about a microsecond and
    apart by the rest of the lag beyond it. ``asyngrad calibrate`` fits all of them from a
    real run when its overlapping writes end together (``convoy_lost_within`` too when the
    lossy meetings fall with the lag; g as the median end gap over the median start lag, or
    g and a together where that fits the end gaps better).

    Passing writes (``convoy_join`` = 0 and ``convoy_lost_leader`` + ``convoy_lost_joiner``
    > 0; ``load_store`` writes of whole blocks): writes that meet keep their own durations
    and each lands whole at its end, less what the meeting lost, drawn as for a convoy: the
    shared part runs from the first write's position when the second starts (the share of
    its own duration gone by) to the block's end. Without these values a meeting is two
    read-modify-writes of the whole block and the first to end loses its whole step, where
    two in-place sweeps on hardware that do not end in lockstep lose a few coordinates or
    none. ``asyngrad calibrate`` fits the ``convoy_lost_*`` values when a real run's
    overlapping writes end apart.

    Common factors (``*_common`` > 0, with ``common_ns``): durations of one phase that start
    at nearly the same time on different threads go together, as on a machine whose state
    (caches, memory traffic, clock) slows every worker at once. A draw of phase p that starts
    at time t is timing.p's quantile at the normal score √c·z_p(t) + √(1 − c)·ε, with c =
    ``p_common``, ε the thread's own standard normal draw and z_p a standard Gaussian process
    shared by every thread, of correlation exp(−|Δt| / ``common_ns``) (an AR(1) on a grid of
    ``common_ns``/8). Each draw keeps exactly timing.p's distribution; two draws of phase p
    starting Δt apart correlate c·exp(−|Δt| / ``common_ns``) in normal scores.
    ``asyngrad calibrate`` fits them from runs with two or more workers.

    Interference (``p_under_q`` >= 0, p and q among read, grad, write, idle; q not idle):
    a phase runs slower while other threads of its device are in phases that compete with
    it, as a write that sweeps the shared vector slows while another core streams its
    gradient's data. A phase p of drawn duration X that starts at t progresses at the rate
    1 / (1 + Σ_j ``p_under_q(j)``) over the other threads j in phase q(j), each for as long
    as the phase j was in at t lasts (afterwards j counts as idle): its duration is X where
    nothing interferes, up to X·(1 + Σ) where all of it does. Both what the others do and
    until when are known when the phase starts (the slowdown a starting phase adds to the
    phases already running is not modelled). The draws describe a phase with every other
    thread idle. ``asyngrad calibrate`` fits them from runs with two or more workers.

    Shared lines (``write_shared`` = f, default 1): a write of a block takes f times its
    draw when the writing thread still holds the block from its own read (no thread has
    written it since) and another thread has read it since: judged for each block of the
    update when its write begins. On hardware the block's cache lines are then shared with
    the core that read them last, and each store waits for that copy to be invalidated; when
    another core wrote them meanwhile, the store fetches them whole, which the prefetcher
    hides (on the 2-core machine of docs/fidelity.md, MLP writes 4× as long with the CPUs far
    apart, 2× near). ``asyngrad calibrate --shared`` fits f from a run with two or more
    workers.

    Store windows (``write_sweep_lead`` = a, ``write_sweep_tail`` = b, ns, default 0; with
    ``run.read_view = "sweep"``): a write of planned duration W stores its block's
    coordinates in order, at a constant pace, from a after its start to b before its end
    (at one instant, a after its start, when W ≤ a + b); the rest of its window is the call
    around the stores. On hardware a timed ``w -= step`` of a cached vector spends most of
    its window outside the stores (docs/fidelity.md). ``asyngrad calibrate`` fits a and b
    from a measure-mode real run's read copies.
    """

    read: Duration = key(Duration("lognormal", 2000.0, 0.3),
                         "duration of one whole-vector read, one worker alone (ns)")
    grad: Duration = key(Duration("lognormal", 6000.0, 0.3),
                         "duration of one gradient, one worker alone (ns)")
    write: Duration = key(Duration("lognormal", 2000.0, 0.3),
                          "duration of one whole-vector write, one worker alone (ns)")
    idle: Duration = key(Duration("constant", 0.0),
                         "local work before each update's read, holding a core (ns)")
    read_per_thread: float = key(0.0, "read slowdown per other running worker", bounds=">= 0")
    grad_per_thread: float = key(0.0, "gradient slowdown per other running worker",
                                 bounds=">= 0")
    write_per_thread: float = key(0.0, "write slowdown per other running worker",
                                  bounds=">= 0")
    idle_per_thread: float = key(0.0, "idle slowdown per other running worker", bounds=">= 0")
    convoy_join: float = key(0.0, "a joining write's own duration in a convoy, as a multiple "
                             "(0: no convoys)", bounds=">= 0")
    convoy_rest: float = key(0.0, "share of the in-flight writes' remaining time a joining "
                             "write adds", bounds=">= 0")
    convoy_lost_leader: float = key(0.0, "share of the shared coordinates the first write of "
                                    "a meeting loses", bounds="[0, 1]")
    convoy_lost_joiner: float = key(0.0, "share of the shared coordinates the joining write "
                                    "loses (plus convoy_lost_leader <= 1)", bounds="[0, 1]")
    convoy_lost_pairs: float = key(1.0, "probability that a meeting loses anything",
                                   bounds="(0, 1]")
    convoy_lost_within: float = key(0.0, "share of the block swept over which lossy meetings "
                                    "fall by e (0: they do not fall)", bounds=">= 0")
    convoy_lost_spread: float = key(0.0, "correlation of two coordinates' losses in one "
                                    "meeting (0: every meeting loses at the mean rate)",
                                    bounds="[0, 1)")
    convoy_end_gap: float = key(0.0, "a convoy member's end after the convoy's, per ns of its "
                                "start after the first write's", bounds=">= 0")
    convoy_end_catch_up: float = key(0.0, "ns of its start lag a convoy member makes up by "
                                     "the end", bounds=">= 0")
    read_common: float = key(0.0, "weight of the common factor in read draws that start "
                             "together", bounds="[0, 1]")
    grad_common: float = key(0.0, "weight of the common factor in gradient draws that start "
                             "together", bounds="[0, 1]")
    write_common: float = key(0.0, "weight of the common factor in write draws that start "
                              "together", bounds="[0, 1]")
    idle_common: float = key(0.0, "weight of the common factor in idle draws that start "
                             "together", bounds="[0, 1]")
    common_ns: float = key(0.0, "correlation time of the common factors (ns; >= 8 when a "
                           "*_common > 0)", bounds=">= 0")
    read_under_read: float = key(0.0, "read slowdown per other thread of the device reading",
                                 bounds=">= 0")
    read_under_grad: float = key(0.0, "read slowdown per other thread of the device in a "
                                 "gradient", bounds=">= 0")
    read_under_write: float = key(0.0, "read slowdown per other thread of the device writing",
                                  bounds=">= 0")
    grad_under_read: float = key(0.0, "gradient slowdown per other thread of the device "
                                 "reading", bounds=">= 0")
    grad_under_grad: float = key(0.0, "gradient slowdown per other thread of the device in a "
                                 "gradient", bounds=">= 0")
    grad_under_write: float = key(0.0, "gradient slowdown per other thread of the device "
                                  "writing", bounds=">= 0")
    write_under_read: float = key(0.0, "write slowdown per other thread of the device "
                                  "reading", bounds=">= 0")
    write_under_grad: float = key(0.0, "write slowdown per other thread of the device in a "
                                  "gradient", bounds=">= 0")
    write_under_write: float = key(0.0, "write slowdown per other thread of the device "
                                   "writing", bounds=">= 0")
    idle_under_read: float = key(0.0, "idle slowdown per other thread of the device reading",
                                 bounds=">= 0")
    idle_under_grad: float = key(0.0, "idle slowdown per other thread of the device in a "
                                 "gradient", bounds=">= 0")
    idle_under_write: float = key(0.0, "idle slowdown per other thread of the device writing",
                                  bounds=">= 0")
    write_shared: float = key(1.0, "a block write's duration factor on lines another thread "
                              "read last (1: none)", bounds="> 0")
    write_sweep_lead: float = key(0.0, "ns of a write's window before its first store "
                                  "(read_view = \"sweep\")", bounds=">= 0")
    write_sweep_tail: float = key(0.0, "ns of a write's window after its last store "
                                  "(read_view = \"sweep\")", bounds=">= 0")

    def __post_init__(self) -> None:
        for name in ("read_per_thread", "grad_per_thread", "write_per_thread",
                     "idle_per_thread"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value,
                   "must be >= 0 (slowdown per other worker)")
        for name in ("convoy_join", "convoy_rest"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value,
                   "must be >= 0 (multiple of a write duration; convoy_join 0: no convoys)")
        for name in ("convoy_lost_leader", "convoy_lost_joiner"):
            value = getattr(self, name)
            _check(math.isfinite(value) and 0 <= value <= 1, name, value,
                   "must be in [0, 1] (share of the shared coordinates lost)")
        _check(math.isfinite(self.convoy_lost_pairs) and 0 < self.convoy_lost_pairs <= 1,
               "convoy_lost_pairs", self.convoy_lost_pairs,
               "must be in (0, 1] (share of the joins that lose coordinates)")
        _check(math.isfinite(self.convoy_end_gap) and self.convoy_end_gap >= 0,
               "convoy_end_gap", self.convoy_end_gap,
               "must be >= 0 (a convoy member's end after the convoy's, per ns of its start "
               "after the first write's)")
        _check(math.isfinite(self.convoy_end_catch_up) and self.convoy_end_catch_up >= 0,
               "convoy_end_catch_up", self.convoy_end_catch_up,
               "must be >= 0 (ns of its start lag a convoy member makes up by the end)")
        _check(math.isfinite(self.convoy_lost_within) and self.convoy_lost_within >= 0,
               "convoy_lost_within", self.convoy_lost_within,
               "must be >= 0 (share of the block swept over which lossy meetings fall by e; "
               "0: they do not fall)")
        _check(math.isfinite(self.convoy_lost_spread) and 0 <= self.convoy_lost_spread < 1,
               "convoy_lost_spread", self.convoy_lost_spread,
               "must be in [0, 1) (correlation of two coordinates' losses in one meeting; "
               "0: every meeting loses at the same rate)")
        _check(self.convoy_lost_leader + self.convoy_lost_joiner <= 1, "convoy_lost_joiner",
               self.convoy_lost_joiner,
               f"plus convoy_lost_leader ({self.convoy_lost_leader}) must be <= 1")
        for name in COMMON_FIELDS:
            value = getattr(self, name)
            _check(math.isfinite(value) and 0 <= value <= 1, name, value,
                   "must be in [0, 1] (correlation of draws that start together)")
        _check(math.isfinite(self.common_ns) and self.common_ns >= 0, "common_ns",
               self.common_ns, "must be >= 0 (correlation time of the common factors, ns)")
        _check(self.common_ns >= 8 or not self.coupled, "common_ns", self.common_ns,
               "must be >= 8 ns when a *_common field is > 0")
        for name in INTERFERENCE_FIELDS:
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value,
                   "must be >= 0 (slowdown per other thread in that phase)")
        _check(math.isfinite(self.write_shared) and self.write_shared > 0, "write_shared",
               self.write_shared, "must be > 0 (a write's duration factor on lines another "
               "thread read last; 1: none)")
        for name in ("write_sweep_lead", "write_sweep_tail"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value,
                   "must be >= 0 (ns of a write's window before its first store, or after "
                   "its last)")

    @property
    def common(self) -> tuple[float, float, float, float]:
        """The read, gradient, write and idle common-factor weights."""
        return (self.read_common, self.grad_common, self.write_common, self.idle_common)

    @property
    def coupled(self) -> bool:
        """Whether some phase's draws share a common factor between threads."""
        return any(c > 0 for c in self.common)

    @property
    def interference(self) -> tuple[tuple[float, float, float, float], ...] | None:
        """Slowdowns by [phase][other thread's phase] (READ, GRAD, WRITE, IDLE; an other
        thread's idle slows nothing), or None when no phase is slowed by another's."""
        values = [getattr(self, name) for name in INTERFERENCE_FIELDS]
        if not any(values):
            return None
        return tuple((*values[3 * p: 3 * p + 3], 0.0) for p in range(4))

    @property
    def convoys(self) -> bool:
        """Whether concurrent writes of one block form convoys."""
        return self.convoy_join > 0

    @property
    def passing(self) -> bool:
        """Whether concurrent writes of one block pass each other, losing coordinates."""
        return not self.convoys and self.convoy_lost_leader + self.convoy_lost_joiner > 0

    def slowdown(self, threads: int) -> tuple[float, float, float, float]:
        """The read, gradient, write and idle scale factors at ``threads`` workers."""
        others = max(threads - 1, 0)
        return (1 + self.read_per_thread * others, 1 + self.grad_per_thread * others,
                1 + self.write_per_thread * others, 1 + self.idle_per_thread * others)


@dataclass(frozen=True)
class DeviceSpec:
    """A virtual device: its speed, cores, memory bus, network link and time slicing.

    When threads outnumber ``cores``, they take turns per action (FIFO), or, with
    ``quantum`` > 0, in time slices as an OS scheduler runs processes. ``slicing`` says how:
    ``global`` — in each slice of ``quantum`` ns, ``cores`` of the device's threads run (round
    robin over all of them); ``per_core`` — the device's j-th thread starts on core j mod
    ``cores`` and each core runs its own threads in turn, one slice each (as Linux keeps a
    process on its CPU's run queue: with 3 processes on 2 cores one runs alone, two alternate);
    a core whose threads have all finished takes a waiting thread from the busiest core at
    the next slice, as an idle Linux CPU pulls one.
    A thread outside its slice starts no action; an action already running finishes,
    unless ``preempt``: then the slice's end stops it, and the rest of it runs in the
    thread's next slice (a timer interrupt preempts a process anywhere). ``migrate`` > 0
    (``per_core`` only) adds a load balancer: at exponential intervals of mean ``migrate`` ns
    it moves a waiting thread from the busiest core to the least busy one
    (``simulator.hardware.slices``: with 3 processes on 2 cores, which one runs alone
    changes; a core whose threads finished takes one from the other).

    ``latency`` (ns per message) and ``bandwidth`` (bytes per ns, i.e. GB/s) describe the
    device's network link to a server; only protocols that communicate over a network
    (``paramserver``, ``admm``) pay them, on every pull and push.

    Speed episodes (``slow_factor`` > 1): each core of the device alternates between fast
    episodes (durations as drawn) and slow ones, in which every duration of an update that
    starts there (idle, read, gradient, write) is ``slow_factor`` times as long; episodes
    last exponential times of means ``fast_ns`` and ``slow_ns``, and a core starts slow with
    probability slow_ns / (fast_ns + slow_ns), each core on its own stream of the run's seed
    (a virtual CPU whose host sibling is busy now and then, docs/fidelity.md)."""

    name: str = key("cpu", "the device's name, for reports")
    speed: float = key(1.0, "divides every duration of the device's threads", bounds="> 0")
    cores: int = key(0, "cores its threads share (0: one per thread)", bounds=">= 0")
    bus: int = key(0, "the most block transfers at once (0: unlimited)", bounds=">= 0")
    latency: int = key(0, "ns per message on the network link (paramserver, admm)",
                       bounds=">= 0")
    bandwidth: float = key(0.0, "bytes per ns (GB/s) of the network link (0: unlimited)",
                           bounds=">= 0")
    quantum: int = key(0, "time slice of threads sharing cores (ns; 0: turns per action)",
                       bounds=">= 0")
    slicing: str = key("global", "how time slices go round: over all cores, or per core",
                       choices=SLICINGS)
    preempt: bool = key(False, "a slice's end stops the running action (needs quantum > 0)")
    migrate: int = key(0, "mean ns between load-balancer moves (per_core slices; 0: none)",
                       bounds=">= 0")
    timing: TimingSpec | None = key(None, "the device's own timing, in place of [timing]")
    slow_factor: float = key(1.0, "duration factor in a core's slow episodes (1: none)",
                             bounds=">= 1")
    slow_ns: int = key(0, "mean length of a slow episode (ns; > 0 when slow_factor > 1)",
                       bounds=">= 0")
    fast_ns: int = key(0, "mean length of a fast episode (ns; > 0 when slow_factor > 1)",
                       bounds=">= 0")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(math.isfinite(self.speed) and self.speed > 0, "speed", self.speed, "must be > 0")
        _check(math.isfinite(self.slow_factor) and self.slow_factor >= 1, "slow_factor",
               self.slow_factor, "must be >= 1 (1: no speed episodes)")
        for name in ("slow_ns", "fast_ns"):
            value = getattr(self, name)
            _check(value >= 0, name, value, "must be >= 0 (ns)")
            _check(self.slow_factor == 1 or value > 0, name, value,
                   "must be > 0 (mean episode length, ns) when slow_factor > 1")
        _check(self.cores >= 0, "cores", self.cores, "must be >= 0 (0: one core per thread)")
        _check(self.bus >= 0, "bus", self.bus, "must be >= 0 (0: unlimited)")
        _check(self.latency >= 0, "latency", self.latency, "must be >= 0 (ns per message)")
        _check(math.isfinite(self.bandwidth) and self.bandwidth >= 0, "bandwidth",
               self.bandwidth, "must be >= 0 (bytes per ns; 0: unlimited)")
        _check(self.quantum >= 0, "quantum", self.quantum,
               "must be >= 0 (ns; 0: threads take turns per action)")
        _check(self.slicing in SLICINGS, "slicing", self.slicing,
               f"must be one of {', '.join(SLICINGS)}")
        _check(not self.preempt or self.quantum > 0, "preempt", self.preempt,
               "needs time slices (quantum > 0)")
        _check(self.migrate >= 0, "migrate", self.migrate,
               "must be >= 0 (mean ns between load-balancer moves; 0: none)")
        _check(not self.migrate or (self.quantum > 0 and self.slicing == "per_core"),
               "migrate", self.migrate, "needs per_core time slices (quantum > 0)")


@dataclass(frozen=True)
class RunSpec:
    """How to train: protocol, threads, total updates T, learning rate, blocks, write mode.

    ``lr_schedule`` scales the learning rate of the update whose write begins after m − 1
    updates have completed: ``constant`` (lr), ``inv_sqrt`` (lr/√m, Langford et al. 2009,
    Theorem 1) or ``inverse`` (lr/m; lr = 1/λ gives their Theorem 2's 1/(λm)).

    ``split`` says who makes the T updates: ``shared`` — any thread starts the next one until
    T have started (fast threads make more); ``even`` — thread i makes T // k updates, one
    more for i < T mod k, as the real backend's workers do (a slow thread then finishes last).

    ``store_grain`` (``load_store`` writes): 0 — a block's write is one read-modify-write,
    loaded at its start and stored at its end, so a store landing in between loses the whole
    block's step; g > 0 — the write sweeps the block g coordinates at a time, each grain
    loaded and stored within its share of the write duration, so overlapping writes lose the
    grains they race on, as in-place ``w -= step`` on hardware loses elements (8 float64 are
    one 64-byte cache line).

    ``read_view`` says what a block's read copies: ``end`` — the block as it is when the read
    ends (a write lands whole, at its end, so a read of one block is never torn); ``sweep`` —
    the block when the read ends together with the coordinates each other thread's write in
    flight has stored by then: a write stores its block's coordinates in order at a constant
    pace over its store window (its whole window less ``timing.write_sweep_lead`` at the
    start and ``write_sweep_tail`` at the end), so a read ending a share u of the way
    through that window copies the first ⌈u·n⌉ of the n coordinates of its step, as a copy
    of ``w`` made while another core runs ``w -= step`` over it holds part of that step. A
    write that landed before the read's end shows whole. Dense problems.

    ``placement`` says where threads go: ``round_robin`` — thread t in slot t; ``shuffled`` —
    the k threads in k distinct slots drawn from ``seed`` among D·⌈k/D⌉ (D devices), as an
    OS places unpinned processes (which of 3 processes on 2 cores runs alone, and on which
    core, changes from run to run). Slot i is on device i mod D and, on a device with
    ``per_core`` slicing, the device's threads in slot order take its cores in turn.
    """

    protocol: str = key("lockfree", "the training protocol (docs/semantics.md, Protocols)",
                        choices=PROTOCOLS)
    threads: int = key(8, "virtual threads k", bounds=f"[1, {MAX_THREADS}]")
    updates: int = key(5000, "gradients T the run makes", bounds=">= 1")
    lr: float = key(0.02, "learning rate γ", bounds="> 0")
    blocks: int = key(1, "contiguous blocks the shared vector is read and written in",
                      bounds=">= 1")
    write_mode: str = key("load_store", "how a block write stores: read-modify-write, or an "
                          "atomic add", choices=WRITE_MODES)
    seed: int = key(0, "seed of samples, durations, placement and injection", bounds=">= 0")
    lr_schedule: str = key("constant", "the learning rate after m - 1 completions: lr, "
                           "lr/√m or lr/m", choices=LR_SCHEDULES)
    split: str = key("shared", "who makes the T updates: any thread, or T/k each",
                     choices=SPLITS)
    store_grain: int = key(0, "coordinates per read-modify-write of a load_store write "
                           "(0: the whole block)", bounds=">= 0")
    placement: str = key("round_robin", "threads' slots: in order, or drawn from the seed",
                         choices=PLACEMENTS)
    read_view: str = key("end", "what a read copies: blocks as at its end, or also the "
                         "stores of writes in flight", choices=READ_VIEWS)

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.protocol in PROTOCOLS, "protocol", self.protocol,
               f"must be one of {', '.join(PROTOCOLS)}")
        _check(1 <= self.threads <= MAX_THREADS, "threads", self.threads,
               f"must be in [1, {MAX_THREADS}] (a run's setup grows with the square of the "
               "threads: each knows its device's others)")
        _check(self.updates >= 1, "updates", self.updates, "must be >= 1")
        _check(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        _check(self.blocks >= 1, "blocks", self.blocks, "must be >= 1")
        _check(self.write_mode in WRITE_MODES, "write_mode", self.write_mode,
               f"must be one of {', '.join(WRITE_MODES)}")
        _check(self.seed >= 0, "seed", self.seed, "must be >= 0")
        _check(self.store_grain >= 0, "store_grain", self.store_grain,
               "must be >= 0 (coordinates per read-modify-write; 0: the whole block)")
        _check(self.lr_schedule in LR_SCHEDULES, "lr_schedule", self.lr_schedule,
               f"must be one of {', '.join(LR_SCHEDULES)}")
        _check(self.split in SPLITS, "split", self.split, f"must be one of {', '.join(SPLITS)}")
        _check(self.placement in PLACEMENTS, "placement", self.placement,
               f"must be one of {', '.join(PLACEMENTS)}")
        _check(self.read_view in READ_VIEWS, "read_view", self.read_view,
               f"must be one of {', '.join(READ_VIEWS)}")
        _check(self.split == "shared" or self.protocol in EVEN_SPLIT_PROTOCOLS, "split",
               self.split, f"needs a protocol without rounds or turns "
               f"({', '.join(EVEN_SPLIT_PROTOCOLS)}), not {self.protocol}")


@dataclass(frozen=True)
class MetricsSpec:
    """Exact serialized-view metrics (cost: one extra gradient per measured update) and the
    loss curve."""

    exact: bool = key(True, "measure the serialized view's gradient errors exactly")
    every: int = key(1, "measure every n-th update", bounds=">= 1")
    curve_points: int = key(100, "full-loss evaluations along the run (0: the final loss "
                            "only)", bounds=">= 0")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.every >= 1, "every", self.every, "must be >= 1")
        _check(self.curve_points >= 0, "curve_points", self.curve_points, "must be >= 0")


@dataclass(frozen=True)
class ParamServerSpec:
    """Options of the ``paramserver`` protocol (Downpour-style, Dean et al. 2012).

    ``staleness_limit`` S > 0 discards a push whose staleness exceeds S; ``accumulate`` n
    computes n gradients at one pulled vector and pushes their mean (the learning rate scaled
    by 1/n); ``warm_start`` lets thread 0 alone make that many updates before the others
    start (``n_samples`` of them is one serial pass); ``fraction`` p < 1 runs synchronous
    rounds that end when ceil(p·k) pushes computed on the round's vector arrived (backup
    workers: later pushes of that round are discarded); ``rebalance`` r > 0 retires a worker
    whose mean update time exceeds r times the median once every worker made
    ``rebalance_after`` updates (its share of the data goes to the others)."""

    staleness_limit: int = key(0, "a push staler than this is discarded (0: keep every "
                               "push)", bounds=">= 0")
    accumulate: int = key(1, "gradients per pull, their mean pushed (1 with fraction > 0)",
                          bounds=">= 1")
    warm_start: int = key(0, "updates thread 0 makes alone before the others start",
                          bounds=">= 0")
    fraction: float = key(0.0, "share of workers whose pushes close a synchronous round "
                          "(0: asynchronous)", bounds="[0, 1]")
    rebalance: float = key(0.0, "retire a worker slower than this × the median (0: off, "
                           "else > 1)")
    rebalance_after: int = key(20, "updates every worker makes before rebalancing",
                               bounds=">= 1")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.staleness_limit >= 0, "staleness_limit", self.staleness_limit,
               "must be >= 0 (0: keep every push)")
        _check(self.accumulate >= 1, "accumulate", self.accumulate, "must be >= 1")
        _check(self.warm_start >= 0, "warm_start", self.warm_start, "must be >= 0")
        _check(0 <= self.fraction <= 1, "fraction", self.fraction,
               "must be in [0, 1] (0: asynchronous)")
        _check(self.rebalance == 0 or self.rebalance > 1, "rebalance", self.rebalance,
               "must be 0 (off) or > 1")
        _check(self.rebalance_after >= 1, "rebalance_after", self.rebalance_after,
               "must be >= 1")
        _check(self.fraction == 0 or self.accumulate == 1, "accumulate", self.accumulate,
               "must be 1 with synchronous rounds (fraction > 0)")
        _check(self.fraction == 0 or self.staleness_limit == 0, "staleness_limit",
               self.staleness_limit, "must be 0 with synchronous rounds (fraction > 0)")


@dataclass(frozen=True)
class DCASGDSpec:
    """Delay compensation (Zheng et al. 2017): g + lam·g⊙g⊙(w_now − w_read)."""

    lam: float = key(0.04, "delay-compensation weight λ", bounds=">= 0")

    def __post_init__(self) -> None:
        _check(math.isfinite(self.lam) and self.lam >= 0, "lam", self.lam, "must be >= 0")


@dataclass(frozen=True)
class ADMMSpec:
    """Consensus ADMM (asynchronous; docs/semantics.md, Protocols)."""

    rho: float = key(1.0, "penalty ρ of the consensus term", bounds="> 0")
    local_steps: int = key(10, "SGD steps of each local solve", bounds=">= 1")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(math.isfinite(self.rho) and self.rho > 0, "rho", self.rho, "must be > 0")
        _check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")


@dataclass(frozen=True)
class StragglerSpec:
    """Thread ``thread`` runs ``factor`` times slower than its device."""

    thread: int = key(0, "the slow thread (below run.threads)", bounds=">= 0")
    factor: float = key(1.0, "its durations' factor", bounds="> 0")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.thread >= 0, "thread", self.thread, "must be >= 0")
        _check(math.isfinite(self.factor) and self.factor > 0, "factor", self.factor,
               "must be > 0")


@dataclass(frozen=True)
class PauseSpec:
    """Thread ``thread`` starts no action in the window [start, end) ns."""

    thread: int = key(0, "the paused thread (below run.threads)", bounds=">= 0")
    start: int = key(0, "the pause's start (ns)", bounds=">= 0")
    end: int = key(0, "the pause's end (ns, > start)")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.thread >= 0, "thread", self.thread, "must be >= 0")
        _check(self.start >= 0, "start", self.start, "must be >= 0")
        _check(self.end > self.start, "end", self.end, f"must be > start ({self.start})")


@dataclass(frozen=True)
class DeathSpec:
    """A thread (or every thread of ``device``) stops for good at time ``at`` ns; an update
    in flight is abandoned, with whatever blocks it already stored."""

    thread: int = key(-1, "the thread that dies (or give device; -1: none)")
    device: int = key(-1, "the device whose threads all die (or give thread; -1: none)")
    at: int = key(0, "the time of death (ns)", bounds=">= 0")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check((self.thread >= 0) != (self.device >= 0), "thread", self.thread,
               "give exactly one of thread or device (both >= 0)")
        _check(self.at >= 0, "at", self.at, "must be >= 0")


ERRORS = ("none", "noise", "adversarial")
DELAYS = ("fixed", "uniform")


@dataclass(frozen=True)
class InjectSpec:
    """Controlled delays and gradient errors, seeded by ``run.seed`` and recorded per update.

    Delays: ``delay`` τ makes every gradient be computed on the vector as it was τ completions
    before its read began (``delay_dist = "uniform"``: τ uniform in [delay, delay_max]);
    stragglers, pauses and deaths act on threads. Errors, added to the gradient before the
    update rule: ``error = "noise"`` adds a uniformly random direction of norm
    ``error_bound`` (times ‖g‖ when ``error_relative``); ``"adversarial"`` adds that norm
    along w − w*, the most harmful direction for Theorem 1; ``drop`` is the probability that
    an update's write is lost (it completes without changing w); ``write_bits`` > 0 rounds
    every stored value to that many significand bits."""

    delay: int = key(0, "completions τ a read lags behind (uniform: the least)", bounds=">= 0")
    delay_dist: str = key("fixed", "τ = delay, or uniform in [delay, delay_max]",
                          choices=DELAYS)
    delay_max: int = key(0, "the greatest τ of a uniform delay (>= delay)")
    error: str = key("none", "the error added to each gradient", choices=ERRORS)
    error_bound: float = key(0.0, "the error's norm (times ‖g‖ when error_relative)",
                             bounds=">= 0")
    error_relative: bool = key(False, "error_bound is relative to the gradient's norm")
    drop: float = key(0.0, "probability that an update's write is lost", bounds="[0, 1)")
    write_bits: int = key(0, "significand bits every stored value is rounded to (0: full "
                          "float64)", bounds="[0, 52]")
    stragglers: tuple[StragglerSpec, ...] = key((), "threads slower than their device")
    pauses: tuple[PauseSpec, ...] = key((), "windows in which a thread starts nothing")
    deaths: tuple[DeathSpec, ...] = key((), "threads or devices that stop for good")

    def __post_init__(self) -> None:
        _check_ints(self)
        _check(self.delay >= 0, "delay", self.delay, "must be >= 0")
        _check(self.delay_dist in DELAYS, "delay_dist", self.delay_dist,
               f"must be one of {', '.join(DELAYS)}")
        _check(self.delay_dist == "fixed" or self.delay_max >= self.delay, "delay_max",
               self.delay_max, f"must be >= delay ({self.delay}) for a uniform delay")
        _check(self.error in ERRORS, "error", self.error, f"must be one of {', '.join(ERRORS)}")
        _check(math.isfinite(self.error_bound) and self.error_bound >= 0, "error_bound",
               self.error_bound, "must be >= 0")
        _check(0 <= self.drop < 1, "drop", self.drop, "must be in [0, 1)")
        _check(0 <= self.write_bits <= 52, "write_bits", self.write_bits,
               "must be in [0, 52] (0: full float64)")

    @property
    def max_delay(self) -> int:
        return self.delay if self.delay_dist == "fixed" else self.delay_max

    @property
    def active(self) -> bool:
        """Whether anything is injected at all."""
        return bool(self.max_delay or self.error != "none" or self.drop or self.write_bits
                    or self.stragglers or self.pauses or self.deaths)


@dataclass(frozen=True)
class Scenario:
    """A complete simulation: problem, run, timing, metrics, devices, injected delays and
    errors, and the options of the protocols that have any."""

    name: str = key("default", "the scenario's name, for reports")
    problem: ProblemSpec = key(ProblemSpec, "the problem to train and its data")
    run: RunSpec = key(RunSpec, "how to train: protocol, threads, updates, learning rate")
    timing: TimingSpec = key(TimingSpec, "durations of reads, gradients, writes and idle work")
    metrics: MetricsSpec = key(MetricsSpec, "the serialized view's exact metrics and the "
                               "loss curve")
    devices: tuple[DeviceSpec, ...] = key((DeviceSpec(),), "the virtual devices threads are "
                                          "placed on")
    inject: InjectSpec = key(InjectSpec, "injected delays, faults and gradient errors")
    paramserver: ParamServerSpec = key(ParamServerSpec, "options of the paramserver protocol")
    dcasgd: DCASGDSpec = key(DCASGDSpec, "options of the dcasgd protocol")
    admm: ADMMSpec = key(ADMMSpec, "options of the admm protocol")

    def __post_init__(self) -> None:
        _check(len(self.devices) >= 1, "devices", [], "needs at least one device")
        threads = self.run.threads
        for kind in ("stragglers", "pauses", "deaths"):
            for i, item in enumerate(getattr(self.inject, kind)):
                _check(item.thread < threads, f"inject.{kind}.{i}.thread", item.thread,
                       f"must be below run.threads ({threads})")
        for i, death in enumerate(self.inject.deaths):
            _check(death.device < len(self.devices), f"inject.deaths.{i}.device",
                   death.device, f"must be below the number of devices ({len(self.devices)})")

    def slot_of(self, thread: int) -> int:
        """The thread's slot (``RunSpec`` docstring, ``placement``)."""
        if self.run.placement == "round_robin":
            return thread
        devices = len(self.devices)
        slots = devices * -(-self.run.threads // devices)
        return _shuffled(self.run.seed, self.run.threads, slots)[thread]

    def device_of(self, thread: int) -> int:
        """Slots are placed on devices round-robin."""
        return self.slot_of(thread) % len(self.devices)

    def core_of(self, thread: int) -> int:
        """The core of its device the thread runs on: its place among the device's threads
        in slot order, modulo the device's cores (``cores`` = 0: a core each)."""
        device = self.device_of(thread)
        mates = sorted((t for t in range(self.run.threads) if self.device_of(t) == device),
                       key=self.slot_of)
        cores = self.devices[device].cores
        place = mates.index(thread)
        return place % cores if cores else place

    def timing_of(self, device: int) -> TimingSpec:
        """The device's own timing, or the scenario's."""
        return self.devices[device].timing or self.timing


@functools.lru_cache(maxsize=64)
def _shuffled(seed: int, threads: int, slots: int) -> tuple[int, ...]:
    """``placement = "shuffled"``: each thread's slot, ``threads`` distinct ones of ``slots``
    drawn from the run's seed (its own stream: it changes no other draw)."""
    rng = np.random.default_rng([seed, _PLACEMENT_STREAM])
    return tuple(int(slot) for slot in rng.choice(slots, size=threads, replace=False))


_PLACEMENT_STREAM = 0x504C4143  # "PLAC": keeps the placement's draws apart from every other


# ---------------------------------------------------------------------------------------------
# Building from plain data (TOML tables) with type checks; the inverse for writing.


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, base: Any, name: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and build it (merging over ``base``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return _convert(inner, value, base, name)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        _check(isinstance(value, list | tuple), name, value, "must be a list")
        return tuple(_convert(item, v, None, f"{name}.{i}") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), name, value, "must be a table")
        return _build(tp, value, base, name)
    if tp is float:
        _check(isinstance(value, int | float) and not isinstance(value, bool), name, value,
               "must be a number")
        return float(value)
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), name, value,
               "must be an integer")
        return value
    _check(isinstance(value, tp), name, value, f"must be a {_describe(tp)}")
    return value


def _build(cls: Any, data: dict[str, Any], base: Any, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for given in data:
        _check(given in names, f"{prefix}.{given}" if prefix else given, data[given],
               "unknown key")
    values = {}
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING
                else f.default_factory() for f in dataclasses.fields(cls)}
    for name in names:
        path = f"{prefix}.{name}" if prefix else name
        current = getattr(base, name) if base is not None else defaults[name]
        values[name] = (_convert(hints[name], data[name], current, path) if name in data
                        else current)
    try:
        return cls(**values)
    except ScenarioError as err:
        raise err.under(prefix) from None


def scenario_from_dict(data: dict[str, Any]) -> Scenario:
    """Build and validate a scenario from plain data, missing fields taken from the defaults.

    Raises:
        ScenarioError: an unknown key, a value of the wrong type, or an invalid value.
    """
    return _build(Scenario, data, Scenario(), "")


def _plain(value: Any) -> Any:
    if isinstance(value, Duration):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain data that ``scenario_from_dict`` turns back into an equal scenario."""
    return typing.cast(dict[str, Any], _plain(scenario))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):  # plain repr: a numpy scalar's is not TOML
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"


def _toml_table(header: str, table: dict[str, Any], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v)}
    if header:
        lines.append(f"\n{header}")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
    for entry, value in table.items():
        if isinstance(value, dict) and _is_table(value):
            name = f"{header.strip('[]')}.{entry}" if header else entry
            _toml_table(f"[{name}]", value, lines)
        elif isinstance(value, list) and _is_table(value):
            name = f"{header.strip('[]')}.{entry}" if header else entry
            for item in value:
                _toml_table(f"[[{name}]]", item, lines)


def _is_table(value: Any) -> bool:
    """Sections get headers; durations (which carry ``dist``) stay inline tables."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value)
    return isinstance(value, dict) and "dist" not in value


def scenario_to_toml(scenario: Scenario) -> str:
    """The fully resolved scenario as a TOML document."""
    lines: list[str] = ["# asyngrad-lab scenario (fully resolved)"]
    _toml_table("", scenario_to_dict(scenario), lines)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Files and overrides.


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    _check(bool(sep) and bool(key.strip()), "--set", text, "must look like key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def apply_override(data: dict[str, Any], text: str) -> None:
    """Set one dotted ``key=value`` in plain scenario data (list items by index)."""
    path, value = _parse_override(text)
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        where = ".".join(path[: depth + 1])
        if isinstance(node, list):
            _check(part.isdigit() and int(part) < len(node), where, part,
                   f"must be an index below {len(node)}")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
            _check(isinstance(node, dict | list), where, node, "is not a table")
    if isinstance(node, list):
        _check(path[-1].isdigit() and int(path[-1]) < len(node), ".".join(path), path[-1],
               f"must be an index below {len(node)}")
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value


def with_overrides(scenario: Scenario, overrides: list[str] | tuple[str, ...]) -> Scenario:
    """A copy of ``scenario`` with ``key=value`` overrides applied (and validated)."""
    data = scenario_to_dict(scenario)
    for text in overrides:
        apply_override(data, text)
    return scenario_from_dict(data)


def load_scenario(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                  ) -> Scenario:
    """Read a scenario file (``None``: the embedded default) and apply ``key=value`` overrides.

    Raises:
        ScenarioError: a missing or unparsable file, or any invalid field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as err:
            raise ScenarioError("scenario", str(path), err.strerror or "cannot be read") from None
        except tomllib.TOMLDecodeError as err:
            raise ScenarioError("scenario", str(path), f"is not valid TOML ({err})") from None
    if any(o.split("=", 1)[0].startswith("devices.") for o in overrides):
        data.setdefault("devices", scenario_to_dict(Scenario())["devices"])
    for text in overrides:
        apply_override(data, text)
    return scenario_from_dict(data)
