"""The scenario's frozen, validated specs: one per TOML table.

Every field has a default, so ``Scenario()`` is a complete scenario (the embedded default: dense
logistic regression, 8 lock-free threads, load_store writes). Each field is declared once with
:func:`simulator.keys.key`, its one-line description beside its default; ``docs/scenario.md``
lists them all (:mod:`simulator.scenario_reference`). The opt-in hardware tables are in
:mod:`simulator.scenario.hardware`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from simulator.distributions import Duration
from simulator.keys import key
from simulator.scenario.base import (
    DATA_SOURCES,
    EVEN_SPLIT_PROTOCOLS,
    FILE_PROBLEMS,
    FILE_SUFFIXES,
    LR_SCHEDULES,
    MAX_THREADS,
    PLACEMENTS,
    PROTOCOLS,
    REAL_DATA,
    REAL_SHAPES,
    SERVER_RULES,
    SPLITS,
    WRITE_MODES,
    check,
    check_ints,
    is_file,
)
from simulator.scenario.hardware import HardwareSpec

__all__ = ["ADMMSpec", "BlockADMMSpec", "DCASGDSpec", "DeathSpec", "DeviceSpec", "InjectSpec",
           "MetricsSpec", "ParamServerSpec", "PauseSpec", "PipelineSpec", "ProblemSpec",
           "RunSpec", "SandblasterSpec", "Scenario", "StragglerSpec", "TimingSpec"]


def _real_shape(spec: ProblemSpec) -> None:
    """A real data set's dimension, sample count (and classes) in its spec: a field left at
    its default takes the data's value; any other value than the data's is refused."""
    for name, real, what in REAL_SHAPES.get(spec.data, ()):
        value = getattr(spec, name)
        check(value in (real, ProblemSpec.__dataclass_fields__[name].default), name, value,
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
    refused (a field at its default counts as unset).

    ``name = "torch"`` trains the PyTorch model whose factory ``model`` names
    (``simulator.problems.torchmodel``): the model and its data set the parameter count and
    the samples, so ``dim``, ``n_samples``, ``density``, ``hidden``, ``classes`` and ``length``
    stay unset; ``batch`` rows make one sample (a minibatch per update), ``holdout`` keeps a
    seeded share of the rows out of training, ``seed`` seeds the model's initial parameters,
    the split and the minibatches, and ``l2`` adds (λ/2)‖w‖². ``split_at`` names the
    children of an ``nn.Sequential`` model where its stages after the first start, for the
    model-parallel protocols.

    ``data`` may name a file (``path.csv``, ``path.npz``, ``path.svm``;
    ``simulator.problems.files``) for ``quadratic``, ``logistic`` (two classes, the larger
    value +1), ``sparse_logistic`` (a libsvm file stays sparse), ``mlp`` (integer classes) and
    ``torch`` (its factory then returns ``(model, loss_fn)``); ``target`` names its target.
    The file sets ``dim``, ``n_samples``, ``density`` and ``classes`` (left unset);
    ``holdout`` keeps a seeded share of its rows out of training."""

    name: str = key("logistic", "the problem to train (a name in simulator.problems.PROBLEMS)")
    data: str = key("synthetic", "synthetic (generated), a real data set a package ships "
                    "(breast_cancer, digits), or a file: path.csv, path.npz, path.svm")
    model: str = key("", "the torch problem's factory: 'package.module:function' or "
                     "'path/to/file.py:function' (problem.name = torch)")
    target: str = key("", "a data file's target: a CSV column (name or 0-based index; "
                      "default the last) or an npz array (default y)")
    dim: int = key(100, "features (mlp: inputs; lstm_tagger, dense_crf: vocabulary)",
                   bounds=">= 1")
    n_samples: int = key(1000, "training samples (a real data set: the whole set)",
                         bounds=">= 1")
    batch: int = key(1, "rows in one sample, a minibatch per update (torch)", bounds=">= 1")
    split_at: tuple[str, ...] = key((), "a torch nn.Sequential's children each stage after "
                                    "the first starts at (model-parallel protocols: amp, "
                                    "local, block_admm)")
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
        check(self.data in DATA_SOURCES or is_file(self.data), "data", self.data,
               f"must be one of {', '.join(DATA_SOURCES)}, or a data file "
               f"({', '.join(FILE_SUFFIXES)})")
        check(self.data not in REAL_DATA or REAL_DATA[self.data] == self.name, "data",
               self.data, f"serves the {REAL_DATA.get(self.data)} problem, not {self.name}")
        check(not is_file(self.data) or self.name in FILE_PROBLEMS, "data", self.data,
               f"data files serve {', '.join(FILE_PROBLEMS)}; {self.name} trains on "
               "sequences it generates")
        check(not self.target or is_file(self.data), "target", self.target,
               "names the target in a data file (problem.data = path.csv, .npz)")
        for field in ("dim", "n_samples", "density", "classes"):
            check(not is_file(self.data) or getattr(self, field) == _DEFAULTS[field], field,
                   getattr(self, field), "is set by the data file (leave it unset)")
        check_ints(self)
        _real_shape(self)
        check(self.dim >= 1, "dim", self.dim, "must be >= 1")
        check(self.n_samples >= 1, "n_samples", self.n_samples, "must be >= 1")
        check(math.isfinite(self.l2) and self.l2 >= 0, "l2", self.l2, "must be >= 0")
        check(0 < self.density <= 1, "density", self.density, "must be in (0, 1]")
        check(self.hidden >= 1, "hidden", self.hidden, "must be >= 1 (mlp hidden units)")
        check(self.classes >= 2, "classes", self.classes, "must be >= 2 (mlp classes)")
        check(self.length >= 1, "length", self.length, "must be >= 1 (lstm_tagger tokens)")
        check(self.seed >= 0, "seed", self.seed, "must be >= 0")
        check(math.isfinite(self.holdout) and 0 <= self.holdout < 1, "holdout", self.holdout,
               "must be in [0, 1)")
        check(self.holdout == 0 or self.data != "synthetic" or self.name == "torch",
               "holdout", self.holdout, "splits a real data set or a torch problem's data; "
               "synthetic problems draw their own held-out samples")
        check(self.batch >= 1, "batch", self.batch, "must be >= 1")
        check(not self.split_at or self.name == "torch", "split_at", list(self.split_at),
              "splits a torch model into stages (problem.name = torch); the built-in "
              "problems have theirs")
        check(self.batch == 1 or self.name == "torch", "batch", self.batch,
               "minibatches serve problem.name = torch; the built-in problems take one "
               "sample per update")
        for field in ("dim", "n_samples", "density", "hidden", "classes", "length"):
            check(self.name != "torch" or getattr(self, field) == _DEFAULTS[field], field,
                   getattr(self, field), "is set by the torch model and its data (leave it "
                   "unset)")
        check(bool(self.model) == (self.name == "torch"), "model", self.model,
               "names the factory of problem.name = torch ('package.module:function' or "
               "'path/to/file.py:function'), and only of it")


_DEFAULTS = {item.name: item.default for item in dataclasses.fields(ProblemSpec)}


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

    Effects beyond these (write convoys, interference, common factors, shared lines ...) are
    opt-in hardware models in their own tables (``simulator.scenario.hardware``).
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

    def __post_init__(self) -> None:
        for name in ("read_per_thread", "grad_per_thread", "write_per_thread",
                     "idle_per_thread"):
            value = getattr(self, name)
            check(math.isfinite(value) and value >= 0, name, value,
                  "must be >= 0 (slowdown per other worker)")

    def slowdown(self, threads: int) -> tuple[float, float, float, float]:
        """The read, gradient, write and idle scale factors at ``threads`` workers."""
        others = max(threads - 1, 0)
        return (1 + self.read_per_thread * others, 1 + self.grad_per_thread * others,
                1 + self.write_per_thread * others, 1 + self.idle_per_thread * others)


@dataclass(frozen=True)
class DeviceSpec:
    """A virtual device: its speed, cores, memory bus and network link.

    When threads outnumber ``cores``, they take turns per action (FIFO), or in time slices
    (``[hardware.time_slices]``).

    ``latency`` (ns per message) and ``bandwidth`` (bytes per ns, i.e. GB/s) describe the
    device's network link to a server; only protocols that communicate over a network
    (``paramserver``, ``admm``, ``sandblaster``) pay them, on every pull and push, and
    ``amp``'s and ``local``'s stages on every message they send."""

    name: str = key("cpu", "the device's name, for reports")
    speed: float = key(1.0, "divides every duration of the device's threads", bounds="> 0")
    cores: int = key(0, "cores its threads share (0: one per thread)", bounds=">= 0")
    bus: int = key(0, "the most block transfers at once (0: unlimited)", bounds=">= 0")
    latency: int = key(0, "ns per message on the network link (paramserver, admm, "
                       "sandblaster, amp, local)", bounds=">= 0")
    bandwidth: float = key(0.0, "bytes per ns (GB/s) of the network link (0: unlimited)",
                           bounds=">= 0")
    timing: TimingSpec | None = key(None, "the device's own timing, in place of [timing]")
    hardware: HardwareSpec | None = key(None, "the device's own hardware tables, each in "
                                        "place of the same [hardware] table")

    def __post_init__(self) -> None:
        check_ints(self)
        check(math.isfinite(self.speed) and self.speed > 0, "speed", self.speed, "must be > 0")
        check(self.cores >= 0, "cores", self.cores, "must be >= 0 (0: one core per thread)")
        check(self.bus >= 0, "bus", self.bus, "must be >= 0 (0: unlimited)")
        check(self.latency >= 0, "latency", self.latency, "must be >= 0 (ns per message)")
        check(math.isfinite(self.bandwidth) and self.bandwidth >= 0, "bandwidth",
              self.bandwidth, "must be >= 0 (bytes per ns; 0: unlimited)")


@dataclass(frozen=True)
class RunSpec:
    """How to train: protocol, threads, total updates T, learning rate, blocks, write mode.

    ``lr_schedule`` scales the learning rate of the update whose write begins after m − 1
    updates have completed (on an asynchronous parameter server: of the push that arrives
    then): ``constant`` (lr), ``inv_sqrt`` (lr/√m, Langford et al. 2009, Theorem 1) or
    ``inverse`` (lr/m; lr = 1/λ gives their Theorem 2's 1/(λm)).

    ``split`` says who makes the T updates: ``shared`` — any thread starts the next one until
    T have started (fast threads make more); ``even`` — thread i makes T // k updates, one
    more for i < T mod k, as the real backend's workers do (a slow thread then finishes last;
    under ``minibatch`` the last round takes the threads with one more, as real rounds do;
    under ``roundrobin`` a thread with no updates left leaves the rotation).

    ``store_grain`` (``load_store`` writes): 0 — a block's write is one read-modify-write,
    loaded at its start and stored at its end, so a store landing in between loses the whole
    block's step; g > 0 — the write sweeps the block g coordinates at a time, each grain
    loaded and stored within its share of the write duration, so overlapping writes lose the
    grains they race on, as in-place ``w -= step`` on hardware loses elements (8 float64 are
    one 64-byte cache line).

    A block's read copies the block as it is when the read ends (a write lands whole, at
    its end, so a read of one block is never torn; ``[hardware.sweeping_reads]`` lets reads
    see part of the writes in flight).

    ``placement`` says where threads go: ``round_robin`` — thread t in slot t; ``shuffled`` —
    the k threads in k distinct slots drawn from ``seed`` among D·⌈k/D⌉ (D devices), as an
    OS places unpinned processes (which of 3 processes on 2 cores runs alone, and on which
    core, changes from run to run). Slot i is on device i mod D and, on a device with
    ``per_core`` time slices, the device's threads in slot order take its cores in turn.
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

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.protocol in PROTOCOLS, "protocol", self.protocol,
               f"must be one of {', '.join(PROTOCOLS)}")
        check(1 <= self.threads <= MAX_THREADS, "threads", self.threads,
               f"must be in [1, {MAX_THREADS}] (a run's setup grows with the square of the "
               "threads: each knows its device's others)")
        check(self.updates >= 1, "updates", self.updates, "must be >= 1")
        check(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        check(self.blocks >= 1, "blocks", self.blocks, "must be >= 1")
        check(self.write_mode in WRITE_MODES, "write_mode", self.write_mode,
               f"must be one of {', '.join(WRITE_MODES)}")
        check(self.seed >= 0, "seed", self.seed, "must be >= 0")
        check(self.store_grain >= 0, "store_grain", self.store_grain,
               "must be >= 0 (coordinates per read-modify-write; 0: the whole block)")
        check(self.lr_schedule in LR_SCHEDULES, "lr_schedule", self.lr_schedule,
               f"must be one of {', '.join(LR_SCHEDULES)}")
        check(self.split in SPLITS, "split", self.split, f"must be one of {', '.join(SPLITS)}")
        check(self.placement in PLACEMENTS, "placement", self.placement,
               f"must be one of {', '.join(PLACEMENTS)}")
        check(self.split == "shared" or self.protocol in EVEN_SPLIT_PROTOCOLS, "split",
               self.split, f"needs a protocol in which a thread can make a fixed share "
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
        check_ints(self)
        check(self.every >= 1, "every", self.every, "must be >= 1")
        check(self.curve_points >= 0, "curve_points", self.curve_points, "must be >= 0")


@dataclass(frozen=True)
class ParamServerSpec:
    """Options of the ``paramserver`` protocol (Downpour-style, Dean et al. 2012).

    ``staleness_limit`` S > 0 discards a push whose staleness exceeds S as it reaches the
    server; ``accumulate`` n computes n gradients at one pulled vector and pushes their mean
    (the learning rate scaled by 1/n); ``warm_start`` lets thread 0 alone make that many updates
    before the others start (``n_samples`` of them is one serial pass); ``fraction`` p < 1 runs
    synchronous rounds that end when ceil(p·k) pushes computed on the round's vector arrived
    (backup workers: later pushes of that round are discarded); ``rebalance`` r > 0 retires a
    worker whose mean update time exceeds r times the median once every worker made
    ``rebalance_after`` updates (its share of the data goes to the others); ``rule`` applies
    an update rule to each push as it reaches the server, where its staleness is known
    exactly: ``staleness_lr`` scales it by 1/τ (Zhang et al. 2016), ``dcasgd`` compensates
    it towards the server's vector from the one the worker pulled (Zheng et al. 2017,
    ``[dcasgd]``'s λ); ``lock_free`` applies pushes without locks, as DistBelief's and
    Project Adam's servers do ("the parameters on the server are not locked during
    updating"): a shard's update loads it once the shard has arrived (after the push's link
    time) and stores loaded − step when its update ends (its memory time), so two pushes
    whose updates of a shard overlap lose one (a lost update; with ``run.write_mode =
    "load_store"`` and no ``run.store_grain``); ``servers`` S > 0 spreads the shards
    (``run.blocks``) over a pool of S servers (DistBelief's and Project Adam's), each serving
    one message at a time, so the shard transfers one server receives queue (0: the server
    takes no time of its own)."""

    staleness_limit: int = key(0, "a push staler than this when it reaches the server "
                               "is discarded (0: keep every push)", bounds=">= 0")
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
    rule: str = key("none", "update rule the server applies to each push on arrival: none, "
                    "staleness_lr or dcasgd", choices=SERVER_RULES)
    lock_free: bool = key(False, "the server applies pushes without locks: a shard is loaded "
                          "once it has arrived and stored as loaded - step when its update "
                          "ends, so pushes to a shard can overwrite each other (false: an "
                          "atomic add per shard)")
    servers: int = key(0, "servers the shards (run.blocks) are spread over, each serving one "
                       "shard transfer at a time (0: the server takes no time of its own)",
                       bounds=">= 0")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.servers >= 0, "servers", self.servers,
              "must be >= 0 (0: the server takes no time of its own)")
        check(self.staleness_limit >= 0, "staleness_limit", self.staleness_limit,
               "must be >= 0 (0: keep every push)")
        check(self.accumulate >= 1, "accumulate", self.accumulate, "must be >= 1")
        check(self.warm_start >= 0, "warm_start", self.warm_start, "must be >= 0")
        check(0 <= self.fraction <= 1, "fraction", self.fraction,
               "must be in [0, 1] (0: asynchronous)")
        check(self.rebalance == 0 or self.rebalance > 1, "rebalance", self.rebalance,
               "must be 0 (off) or > 1")
        check(self.rebalance_after >= 1, "rebalance_after", self.rebalance_after,
               "must be >= 1")
        check(self.fraction == 0 or self.accumulate == 1, "accumulate", self.accumulate,
               "must be 1 with synchronous rounds (fraction > 0)")
        check(self.fraction == 0 or self.staleness_limit == 0, "staleness_limit",
               self.staleness_limit, "must be 0 with synchronous rounds (fraction > 0)")
        check(self.rule in SERVER_RULES, "rule", self.rule,
              f"must be one of {', '.join(SERVER_RULES)}")
        check(self.fraction == 0 or self.rule == "none", "rule", self.rule,
              "must be none with synchronous rounds (fraction > 0: no push is stale)")


@dataclass(frozen=True)
class DCASGDSpec:
    """Delay compensation (Zheng et al. 2017): g + lam·g⊙g⊙(w_now − w_read)."""

    lam: float = key(0.04, "delay-compensation weight λ", bounds=">= 0")

    def __post_init__(self) -> None:
        check(math.isfinite(self.lam) and self.lam >= 0, "lam", self.lam, "must be >= 0")


@dataclass(frozen=True)
class ADMMSpec:
    """Consensus ADMM (asynchronous; docs/semantics.md, Protocols)."""

    rho: float = key(1.0, "penalty ρ of the consensus term", bounds="> 0")
    local_steps: int = key(10, "SGD steps of each local solve", bounds=">= 1")

    def __post_init__(self) -> None:
        check_ints(self)
        check(math.isfinite(self.rho) and self.rho > 0, "rho", self.rho, "must be > 0")
        check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")


@dataclass(frozen=True)
class SandblasterSpec:
    """DistBelief's Sandblaster L-BFGS (Dean et al. 2012; docs/semantics.md, Protocols): each
    round hands out ``units`` work units (the data cut into that many chunks) to whichever
    thread asks, and the coordinator takes one L-BFGS step from their mean gradient, with a
    history of ``memory`` pairs."""

    units: int = key(16, "work units per round (the data cut into that many chunks)",
                     bounds=">= 1")
    memory: int = key(10, "L-BFGS history: the last m (s, y) pairs", bounds=">= 1")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.units >= 1, "units", self.units, "must be >= 1")
        check(self.memory >= 1, "memory", self.memory, "must be >= 1")


@dataclass(frozen=True)
class PipelineSpec:
    """A model-parallel pipeline (``amp``, ``local``; docs/semantics.md, Protocols): each
    thread is a stage of the network holding its own parameters; at most ``max_active``
    samples are in the pipeline at once, and a stage applies the mean of every
    ``update_every`` gradients of its parameters (AMPNet's max_active_keys and
    min_update_frequency)."""

    max_active: int = key(4, "samples in the pipeline at once (max_active_keys)",
                          bounds=">= 1")
    update_every: int = key(1, "gradients a stage averages into one update of its parameters "
                            "(min_update_frequency)", bounds=">= 1")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.max_active >= 1, "max_active", self.max_active, "must be >= 1")
        check(self.update_every >= 1, "update_every", self.update_every, "must be >= 1")


@dataclass(frozen=True)
class BlockADMMSpec:
    """Stochastic block ADMM (docs/semantics.md, Protocols): two stages joined by an auxiliary
    variable per sample and its scaled dual, with penalty ``rho``; the auxiliary variable
    steps by ``aux_lr``."""

    rho: float = key(1.0, "penalty ρ of the coupling term", bounds="> 0")
    aux_lr: float = key(0.3, "step size of the auxiliary variables' updates", bounds="> 0")

    def __post_init__(self) -> None:
        for name in ("rho", "aux_lr"):
            value = getattr(self, name)
            check(math.isfinite(value) and value > 0, name, value, "must be > 0")


@dataclass(frozen=True)
class StragglerSpec:
    """Thread ``thread`` runs ``factor`` times slower than its device."""

    thread: int = key(0, "the slow thread (below run.threads)", bounds=">= 0")
    factor: float = key(1.0, "its durations' factor", bounds="> 0")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.thread >= 0, "thread", self.thread, "must be >= 0")
        check(math.isfinite(self.factor) and self.factor > 0, "factor", self.factor,
               "must be > 0")


@dataclass(frozen=True)
class PauseSpec:
    """Thread ``thread`` starts no action in the window [start, end) ns."""

    thread: int = key(0, "the paused thread (below run.threads)", bounds=">= 0")
    start: int = key(0, "the pause's start (ns)", bounds=">= 0")
    end: int = key(0, "the pause's end (ns, > start)")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.thread >= 0, "thread", self.thread, "must be >= 0")
        check(self.start >= 0, "start", self.start, "must be >= 0")
        check(self.end > self.start, "end", self.end, f"must be > start ({self.start})")


@dataclass(frozen=True)
class DeathSpec:
    """A thread (or every thread of ``device``) stops for good at time ``at`` ns; an update
    in flight is abandoned, with whatever blocks it already stored."""

    thread: int = key(-1, "the thread that dies (or give device; -1: none)")
    device: int = key(-1, "the device whose threads all die (or give thread; -1: none)")
    at: int = key(0, "the time of death (ns)", bounds=">= 0")

    def __post_init__(self) -> None:
        check_ints(self)
        check((self.thread >= 0) != (self.device >= 0), "thread", self.thread,
               "give exactly one of thread or device (both >= 0)")
        check(self.at >= 0, "at", self.at, "must be >= 0")


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
        check_ints(self)
        check(self.delay >= 0, "delay", self.delay, "must be >= 0")
        check(self.delay_dist in DELAYS, "delay_dist", self.delay_dist,
               f"must be one of {', '.join(DELAYS)}")
        check(self.delay_dist == "fixed" or self.delay_max >= self.delay, "delay_max",
               self.delay_max, f"must be >= delay ({self.delay}) for a uniform delay")
        check(self.error in ERRORS, "error", self.error, f"must be one of {', '.join(ERRORS)}")
        check(math.isfinite(self.error_bound) and self.error_bound >= 0, "error_bound",
               self.error_bound, "must be >= 0")
        check(0 <= self.drop < 1, "drop", self.drop, "must be in [0, 1)")
        check(0 <= self.write_bits <= 52, "write_bits", self.write_bits,
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
    hardware: HardwareSpec = key(HardwareSpec, "opt-in hardware-effect models (each table "
                                 "set switches one on)")
    metrics: MetricsSpec = key(MetricsSpec, "the serialized view's exact metrics and the "
                               "loss curve")
    devices: tuple[DeviceSpec, ...] = key((DeviceSpec(),), "the virtual devices threads are "
                                          "placed on")
    inject: InjectSpec = key(InjectSpec, "injected delays, faults and gradient errors")
    paramserver: ParamServerSpec = key(ParamServerSpec, "options of the paramserver protocol")
    dcasgd: DCASGDSpec = key(DCASGDSpec, "options of the dcasgd protocol")
    admm: ADMMSpec = key(ADMMSpec, "options of the admm protocol")
    sandblaster: SandblasterSpec = key(SandblasterSpec, "options of the sandblaster protocol")
    amp: PipelineSpec = key(PipelineSpec, "options of the amp protocol (model-parallel "
                            "stages, gradients passed back)")
    local: PipelineSpec = key(PipelineSpec, "options of the local protocol (model-parallel "
                              "stages, each trained by its own local loss)")
    block_admm: BlockADMMSpec = key(BlockADMMSpec, "options of the block_admm protocol")

    def __post_init__(self) -> None:
        check(len(self.devices) >= 1, "devices", [], "needs at least one device")
        threads = self.run.threads
        for kind in ("stragglers", "pauses", "deaths"):
            for i, item in enumerate(getattr(self.inject, kind)):
                check(item.thread < threads, f"inject.{kind}.{i}.thread", item.thread,
                       f"must be below run.threads ({threads})")
        for i, death in enumerate(self.inject.deaths):
            check(death.device < len(self.devices), f"inject.deaths.{i}.device",
                   death.device, f"must be below the number of devices ({len(self.devices)})")
        if self.run.protocol == "paramserver" and self.paramserver.lock_free:
            check(self.run.write_mode == "load_store", "paramserver.lock_free", True,
                  f"a lock-free server loads and stores each shard; run.write_mode = "
                  f"'{self.run.write_mode}' says otherwise")
            check(self.run.store_grain == 0, "paramserver.lock_free", True,
                  "a lock-free server updates a shard whole; run.store_grain must be 0")
        if self.run.protocol == "sandblaster":
            units = self.sandblaster.units
            check(self.run.updates % units == 0, "run.updates", self.run.updates,
                  f"counts sandblaster's work units: a whole number of rounds of "
                  f"sandblaster.units = {units}")
            check(units >= threads, "sandblaster.units", units,
                  f"must be >= run.threads ({threads}): every replica gets work")
            self._unmodelled("deaths", reason="sandblaster's units go to a coordinator that "
                             "waits for every one of a round: injected errors, drops, delays, "
                             "rounding and deaths are not modelled there")
        if self.run.protocol in ("amp", "local", "block_admm"):
            joined = ("share auxiliary variables" if self.run.protocol == "block_admm"
                      else "pass activations (and gradients) to each other")
            self._unmodelled(reason=f"{self.run.protocol}'s stages {joined}: injected "
                             "errors, drops, delays and rounding of their updates are not "
                             "modelled")
        if self.run.protocol == "paramserver" and self.paramserver.servers:
            servers = self.paramserver.servers
            check(servers <= self.run.blocks, "paramserver.servers", servers,
                  f"must be <= run.blocks ({self.run.blocks}): each server holds at least "
                  "one shard")
            check(not self.paramserver.lock_free, "paramserver.servers", servers,
                  "a lock-free server's shard loads are not modelled with a server pool "
                  "(paramserver.lock_free)")

    def _unmodelled(self, *more: str, reason: str) -> None:
        """Refuse injected values (errors, drops, delays, rounding, and ``more``) that the
        run's protocol does not model."""
        for name in ("error", "drop", "delay", "delay_max", "write_bits", *more):
            value = getattr(self.inject, name)
            check(value == getattr(InjectSpec(), name), f"inject.{name}", value, reason)

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

    def hardware_of(self, device: int) -> HardwareSpec:
        """The scenario's hardware tables, with the device's own in place of the same
        ones."""
        own = self.devices[device].hardware
        return self.hardware if own is None else own.over(self.hardware)


@functools.lru_cache(maxsize=64)
def _shuffled(seed: int, threads: int, slots: int) -> tuple[int, ...]:
    """``placement = "shuffled"``: each thread's slot, ``threads`` distinct ones of ``slots``
    drawn from the run's seed (its own stream: it changes no other draw)."""
    rng = np.random.default_rng([seed, _PLACEMENT_STREAM])
    return tuple(int(slot) for slot in rng.choice(slots, size=threads, replace=False))


_PLACEMENT_STREAM = 0x504C4143  # "PLAC": keeps the placement's draws apart from every other
