"""The ``[hardware.*]`` tables: opt-in hardware-effect models (``simulator.hardware``).

The paper's semantics need none of them; each table a scenario sets switches one model on,
and the resolved scenario shows only the tables that are set. ``[hardware]`` applies to
every device; a device's own ``[devices.hardware]`` tables take the place of the same tables
there (``Scenario.hardware_of``). ``asyngrad calibrate`` writes the tables it fits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from simulator.keys import key
from simulator.scenario.base import PHASES, SLICINGS, check, check_ints

__all__ = ["CommonSpec", "ConvoySpec", "EpisodeSpec", "HardwareSpec", "InterferenceSpec",
           "PassingSpec", "SharedLinesSpec", "SweepingReadsSpec", "TimeSliceSpec"]


def _nonnegative(spec: object, *names: str, what: str) -> None:
    for name in names:
        value = getattr(spec, name)
        check(math.isfinite(value) and value >= 0, name, value, f"must be >= 0 ({what})")


@dataclass(frozen=True)
class _Losses:
    """What a meeting of two writes of one block loses, in the part both sweep (from the
    first write's position when the second starts, to the block's end): each coordinate's
    store is lost with probability ``lost_leader`` for the first write and ``lost_joiner``
    for the other (never both), as two in-place sweeps ``w -= step`` that meet on hardware
    lose element stores. ``lost_pairs`` < 1: a meeting loses anything only with that
    probability (on hardware most meetings lose nothing and the others lose many coordinates
    together); ``lost_within`` > 0: that probability falls with how far the first write had
    swept when the other came, f (0 to 1), as ``lost_pairs``·exp(−f / ``lost_within``).
    ``lost_spread`` = ρ in [0, 1): a meeting that loses anything loses at its own rate,
    drawn per meeting from a Beta distribution with mean ``lost_leader`` + ``lost_joiner``
    and intra-meeting correlation ρ, split between the two writes in that ratio."""

    lost_leader: float = key(0.0, "share of the shared coordinates the first write of a "
                             "meeting loses", bounds="[0, 1]")
    lost_joiner: float = key(0.0, "share of the shared coordinates the other write loses "
                             "(plus lost_leader <= 1)", bounds="[0, 1]")
    lost_pairs: float = key(1.0, "probability that a meeting loses anything", bounds="(0, 1]")
    lost_within: float = key(0.0, "share of the block swept over which lossy meetings fall "
                             "by e (0: they do not fall)", bounds=">= 0")
    lost_spread: float = key(0.0, "correlation of two coordinates' losses in one meeting "
                             "(0: every meeting loses at the mean rate)", bounds="[0, 1)")

    def __post_init__(self) -> None:
        for name in ("lost_leader", "lost_joiner"):
            value = getattr(self, name)
            check(math.isfinite(value) and 0 <= value <= 1, name, value,
                   "must be in [0, 1] (share of the shared coordinates lost)")
        check(math.isfinite(self.lost_pairs) and 0 < self.lost_pairs <= 1, "lost_pairs",
               self.lost_pairs, "must be in (0, 1] (share of the meetings that lose "
               "coordinates)")
        _nonnegative(self, "lost_within", what="share of the block swept over which lossy "
                     "meetings fall by e; 0: they do not fall")
        check(math.isfinite(self.lost_spread) and 0 <= self.lost_spread < 1, "lost_spread",
               self.lost_spread, "must be in [0, 1) (correlation of two coordinates' losses "
               "in one meeting; 0: every meeting loses at the same rate)")
        check(self.lost_leader + self.lost_joiner <= 1, "lost_joiner", self.lost_joiner,
               f"plus lost_leader ({self.lost_leader}) must be <= 1")


@dataclass(frozen=True)
class PassingSpec(_Losses):
    """``[hardware.passing]``: ``load_store`` writes of one block that meet keep their own
    durations and each lands whole at its end, less what the meeting lost (see the losses
    above), where two plain read-modify-writes would lose the first one's whole step. On
    hardware two in-place sweeps that do not end in lockstep lose a few coordinates or
    none. ``asyngrad calibrate`` fits it when a real run's overlapping writes end apart."""


@dataclass(frozen=True)
class ConvoySpec(_Losses):
    """``[hardware.convoys]``: a ``load_store`` write that starts while other writes of the
    same block are in flight joins them, and all of them end together, ``join`` × its own
    drawn duration plus ``rest`` × the time the in-flight writes had left after it starts
    (never earlier than they would have). The convoy's front sweeps the block from the
    leader's position at the join to its end, and the meeting loses coordinates there (see
    the losses above). ``end_gap`` = g: a member that started its write ``lag`` ns after the
    convoy's first write ends g·max(0, lag − ``end_catch_up``) after the convoy's end, as
    the follower of two real sweeps in lockstep ends a little after the leader.
    ``asyngrad calibrate`` fits it from a real run whose overlapping writes end together."""

    join: float = key(1.0, "a joining write's own duration in a convoy, as a multiple",
                      bounds="> 0")
    rest: float = key(0.0, "share of the in-flight writes' remaining time a joining write "
                      "adds", bounds=">= 0")
    end_gap: float = key(0.0, "a member's end after the convoy's, per ns of its start after "
                         "the first write's", bounds=">= 0")
    end_catch_up: float = key(0.0, "ns of its start lag a member makes up by the end",
                              bounds=">= 0")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(math.isfinite(self.join) and self.join > 0, "join", self.join,
               "must be > 0 (multiple of a write duration)")
        _nonnegative(self, "rest", what="multiple of the in-flight writes' remaining time")
        _nonnegative(self, "end_gap", what="ns of end per ns of start lag")
        _nonnegative(self, "end_catch_up", what="ns of start lag made up")


@dataclass(frozen=True)
class CommonSpec:
    """``[hardware.common]``: durations of one phase that start at nearly the same time on
    different threads go together, as on a machine whose state (caches, memory traffic,
    clock) slows every worker at once. A draw of phase p that starts at time t is
    timing.p's quantile at the normal score √c·z_p(t) + √(1 − c)·ε, with c the phase's
    weight here, ε the thread's own standard normal draw and z_p a standard Gaussian process
    shared by every thread, of correlation exp(−|Δt| / ``ns``) (an AR(1) on a grid of
    ``ns``/8). Each draw keeps exactly timing.p's distribution. ``asyngrad calibrate`` fits
    it from runs with two or more workers."""

    read: float = key(0.0, "weight of the common factor in read draws", bounds="[0, 1]")
    grad: float = key(0.0, "weight of the common factor in gradient draws", bounds="[0, 1]")
    write: float = key(0.0, "weight of the common factor in write draws", bounds="[0, 1]")
    idle: float = key(0.0, "weight of the common factor in idle draws", bounds="[0, 1]")
    ns: float = key(1000.0, "correlation time of the common factors (ns)", bounds=">= 8")

    def __post_init__(self) -> None:
        for name in PHASES:
            value = getattr(self, name)
            check(math.isfinite(value) and 0 <= value <= 1, name, value,
                   "must be in [0, 1] (correlation of draws that start together)")
        check(math.isfinite(self.ns) and self.ns >= 8, "ns", self.ns,
               "must be >= 8 (correlation time of the common factors, ns)")

    @property
    def weights(self) -> tuple[float, float, float, float]:
        """The read, gradient, write and idle weights."""
        return (self.read, self.grad, self.write, self.idle)


def _under(p: str, q: str) -> float:
    what = {"read": "reading", "grad": "in a gradient", "write": "writing"}[q]
    phase = {"read": "read", "grad": "gradient", "write": "write", "idle": "idle"}[p]
    return key(0.0, f"{phase} slowdown per other thread of the device {what}",  # type: ignore[no-any-return]
               bounds=">= 0")


@dataclass(frozen=True)
class InterferenceSpec:
    """``[hardware.interference]``: a phase runs slower while other threads of its device
    are in phases that compete with it, as a write that sweeps the shared vector slows while
    another core streams its gradient's data. A phase p of drawn duration X that starts at t
    progresses at the rate 1 / (1 + Σ_j ``p_under_q(j)``) over the other threads j in phase
    q(j), each for as long as the phase j was in at t lasts (afterwards j counts as idle):
    its duration is X where nothing interferes, up to X·(1 + Σ) where all of it does. The
    durations in [timing] describe a phase with every other thread idle. ``asyngrad
    calibrate`` fits it from runs with two or more workers."""

    read_under_read: float = _under("read", "read")
    read_under_grad: float = _under("read", "grad")
    read_under_write: float = _under("read", "write")
    grad_under_read: float = _under("grad", "read")
    grad_under_grad: float = _under("grad", "grad")
    grad_under_write: float = _under("grad", "write")
    write_under_read: float = _under("write", "read")
    write_under_grad: float = _under("write", "grad")
    write_under_write: float = _under("write", "write")
    idle_under_read: float = _under("idle", "read")
    idle_under_grad: float = _under("idle", "grad")
    idle_under_write: float = _under("idle", "write")

    def __post_init__(self) -> None:
        _nonnegative(self, *(f.name for f in dataclasses.fields(self)),
                     what="slowdown per other thread in that phase")

    @property
    def slowdowns(self) -> tuple[tuple[float, float, float, float], ...] | None:
        """Slowdowns by [phase][other thread's phase] (READ, GRAD, WRITE, IDLE; an other
        thread's idle slows nothing), or None when no phase is slowed by another's."""
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        if not any(values):
            return None
        return tuple((*values[3 * p: 3 * p + 3], 0.0) for p in range(4))


@dataclass(frozen=True)
class SharedLinesSpec:
    """``[hardware.shared_lines]``: a write of a block takes ``factor`` times its draw when
    the writing thread still holds the block from its own read (no thread has written it
    since) and another thread has read it since, judged for each block of the update when
    its write begins. On hardware each store then waits for the copy in the other core's
    cache to be invalidated (on the 2-core machine of docs/fidelity.md, MLP writes 4× as
    long with the CPUs far apart, 2× near). ``asyngrad calibrate --shared`` fits it."""

    factor: float = key(1.0, "a block write's duration factor on lines another thread read "
                        "last (1: none)", bounds="> 0")

    def __post_init__(self) -> None:
        check(math.isfinite(self.factor) and self.factor > 0, "factor", self.factor,
               "must be > 0 (a write's duration factor; 1: none)")


@dataclass(frozen=True)
class SweepingReadsSpec:
    """``[hardware.sweeping_reads]``: a block's read, copied when it ends, holds the part of
    each other thread's write of the block in flight that has been stored by then, as a copy
    of a vector that another core's in-place ``w -= step`` is sweeping (dense writes only). A
    write of planned duration W stores its coordinates in order, at a constant pace, from
    ``lead`` ns after its start to ``tail`` ns before its end (at one instant, ``lead`` after
    its start, when W ≤ lead + tail); the rest of its window is the call around the stores.
    A read ending a share u of the way through that store window copies the first ⌈u·n⌉ of
    the n coordinates of the write's step; a write that landed before the read's end shows
    whole. The writer's device's values apply. ``asyngrad calibrate`` fits lead and tail from a
    measure-mode real run's read copies."""

    lead: float = key(0.0, "ns of a write's window before its first store", bounds=">= 0")
    tail: float = key(0.0, "ns of a write's window after its last store", bounds=">= 0")

    def __post_init__(self) -> None:
        _nonnegative(self, "lead", "tail", what="ns of a write's window outside its stores")


@dataclass(frozen=True)
class TimeSliceSpec:
    """``[hardware.time_slices]``: threads that outnumber their device's ``cores`` run in
    time slices of ``quantum`` ns, as an OS scheduler runs processes (without this table
    they take turns per action, FIFO). ``slicing`` says how: ``global`` — in each slice,
    ``cores`` of the device's threads run (round robin over all of them); ``per_core`` — the
    device's j-th thread starts on core j mod ``cores`` and each core runs its own threads in
    turn, one slice each (as Linux keeps a process on its CPU's run queue); a core whose
    threads have all finished takes a waiting thread from the busiest core at the next slice.
    A thread outside its slice starts no action; an action already running finishes, unless
    ``preempt``: then the slice's end stops it, and the rest of it runs in the thread's next
    slice. ``migrate`` > 0 (``per_core`` only) adds a load balancer: at exponential intervals
    of mean ``migrate`` ns it moves a waiting thread from the busiest core to the least busy
    one (``simulator.hardware.slices``)."""

    quantum: int = key(4_000_000, "the time slice (ns)", bounds="> 0")
    slicing: str = key("global", "how time slices go round: over all cores, or per core",
                       choices=SLICINGS)
    preempt: bool = key(False, "a slice's end stops the running action")
    migrate: int = key(0, "mean ns between load-balancer moves (per_core slicing; 0: none)",
                       bounds=">= 0")

    def __post_init__(self) -> None:
        check_ints(self)
        check(self.quantum > 0, "quantum", self.quantum, "must be > 0 (ns)")
        check(self.slicing in SLICINGS, "slicing", self.slicing,
               f"must be one of {', '.join(SLICINGS)}")
        check(self.migrate >= 0, "migrate", self.migrate,
               "must be >= 0 (mean ns between load-balancer moves; 0: none)")
        check(not self.migrate or self.slicing == "per_core", "migrate", self.migrate,
               "needs slicing = per_core")


@dataclass(frozen=True)
class EpisodeSpec:
    """``[hardware.episodes]``: each core of the device alternates between fast episodes
    (durations as drawn) and slow ones, in which every duration of an update that starts
    there (idle, read, gradient, write) is ``factor`` times as long; episodes last
    exponential times of means ``fast_ns`` and ``slow_ns``, and a core starts slow with
    probability slow_ns / (fast_ns + slow_ns), each core on its own stream of the run's seed
    (a virtual CPU whose host sibling is busy now and then, docs/fidelity.md)."""

    factor: float = key(2.0, "duration factor in a core's slow episodes", bounds=">= 1")
    slow_ns: int = key(1_000_000, "mean length of a slow episode (ns)", bounds="> 0")
    fast_ns: int = key(1_000_000, "mean length of a fast episode (ns)", bounds="> 0")

    def __post_init__(self) -> None:
        check_ints(self)
        check(math.isfinite(self.factor) and self.factor >= 1, "factor", self.factor,
               "must be >= 1")
        for name in ("slow_ns", "fast_ns"):
            value = getattr(self, name)
            check(value > 0, name, value, "must be > 0 (mean episode length, ns)")


@dataclass(frozen=True)
class HardwareSpec:
    """The hardware models a run switches on (each unset: off)."""

    convoys: ConvoySpec | None = key(None, "writes of one block that meet end together")
    passing: PassingSpec | None = key(None, "writes of one block that meet pass each other")
    common: CommonSpec | None = key(None, "durations that start together go together")
    interference: InterferenceSpec | None = key(None, "phases of a device's threads slow "
                                                "each other")
    shared_lines: SharedLinesSpec | None = key(None, "writes of blocks another thread read "
                                               "last take longer")
    sweeping_reads: SweepingReadsSpec | None = key(None, "reads copy part of the writes in "
                                                   "flight")
    time_slices: TimeSliceSpec | None = key(None, "threads that outnumber cores run in time "
                                            "slices")
    episodes: EpisodeSpec | None = key(None, "cores alternate between fast and slow episodes")

    def __post_init__(self) -> None:
        check(self.convoys is None or self.passing is None, "passing",
              dataclasses.asdict(self.passing) if self.passing else None,
               "writes that meet either form convoys or pass each other: set one of "
               "hardware.convoys and hardware.passing")

    def over(self, base: HardwareSpec) -> HardwareSpec:
        """These tables in place of the same tables of ``base``."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if getattr(self, f.name) is not None}
        return dataclasses.replace(base, **own) if own else base
