"""A parameter server on torch.distributed (gloo): one server, K trainers, point to point.

Rank 0 is the server and holds the parameters; ranks 1..K are trainers. A trainer pulls
(sends ``PULL``, receives the version, how many gradients it may compute, a time to wait
before pulling again (an injected pause; 0 otherwise) and the vector),
computes them at that vector, and pushes lr times their mean (``PUSH`` with the version it
read, its samples and each gradient's compute time, then the step). The server hands out the
``run.updates`` gradients to whichever trainer pulls (at most ``accumulate`` at a time; a
pull answered with none ends the trainer), serves messages in arrival order, from any
trainer (``irecv`` from any source), and applies each push in full before the next message,
so pushes are atomic and the serialized view is the server's own vector. The trace has one
row per gradient, as the simulator's. The options are the simulator's ``paramserver`` ones
(``[paramserver]`` of the scenario), decided by the same rules (``simulator.rules``):

* ``staleness_limit`` S > 0: a push whose staleness (pushes applied since its pull, plus an
  injected delay's τ) exceeds S
  is discarded (its rows have ``step`` 0; the summary's ``discarded``);
* ``accumulate`` n: n gradients per push (lr/n per gradient); a trainer's last push with
  fewer (the budget ran out) is dropped, as the simulator discards gradients left unpushed;
* ``warm_start`` W: trainer 0 alone is answered until W pushes were applied (or it
  finished); the others' pulls wait (with rounds, each of its pushes closes one);
* ``fraction`` p > 0: synchronous rounds with backup workers: a round applies the mean of
  the first ceil(p·K) pushes computed on its vector (fewer once trainers have finished),
  later pushes of that round are dropped, and a trainer that pushed waits for the next round
  before its pull is answered;
* ``rebalance`` r > 1: once every working trainer made ``rebalance_after`` applied gradients,
  one whose mean time per gradient (read start to application) exceeds r times the
  median is retired: its next pull is answered with no gradients, and the others make the
  rest of the budget (``retired_threads`` in the trace and summary);
* ``rule``: the server applies an update rule to each push it keeps, as it receives it,
  with its exact staleness s (pushes applied since its pull, plus an injected delay's τ):
  ``staleness_lr`` scales it by 1/s (the factor recorded as ``lr_scale``), ``dcasgd``
  compensates it towards the server's vector from the one it sent that trainer at its pull
  (``simulator.rules.dc_step``, λ = ``dcasgd.lam``).

``run.lr_schedule``: the server scales each push it keeps by the schedule's factor at m = the
versions applied + 1 when the push arrives (a round's mean when the round closes), before
its rule, as the simulator's server does; the factor is in ``lr_scale``.

Injections (``[inject]``), drawn by the server from the simulator's injector stream of the
trainer's thread, in the simulator's order (a pull's delay when it is answered, then each
gradient's error and drop when its push arrives): a delay τ answers the pull with the vector
as it was τ versions back (a ring of the last versions; τ clipped at the version) and counts
into the push's staleness (the limit, the rules and the trace's ``delay``); an error is
added to the pushed gradient (lr·g/lr: g to rounding) over its sample's support, as the
trainer's would be (with ``accumulate`` > 1 the trainers send each gradient's step apart,
and the server adds each its error, densely, and applies their mean); a push whose last
gradient's write is dropped is lost in transit: counted as a version that changes nothing,
before any limit or rule (the simulator's dropped write stores nothing); ``write_bits``
rounds the values a push stored (its samples' supports) to that many significand bits.
Pauses and deaths run on the run's clock, from the first pull's arrival (the trace's time
0): a pull in one of its trainer's pause windows is answered with the time left in it (the
trainer sleeps, then pulls again: its read starts after the window, as the simulator's
thread starts no action in it), and a pull at or after its trainer's death with no gradients
(the trainer says done; ``dead_threads`` in the trace; the push it had in flight at its
death landed, as a CPU worker's update does). A straggler trainer stretches each gradient's
compute to ``factor`` times as long. With rounds, as the simulator's rounds: a round's
members read τ rounds back, their errors reach every coordinate (the simulated round
members' gradients are dense), the round's one write is lost where its writer's (the last
push's) draw drops it and all its values are rounded; a dead trainer still counts among the
live ones (a dead simulated thread never finishes), so a round that needs it waits for good:
every trainer is then answered with no gradients and the run ends early (``_stall``).

Asynchronous consensus ADMM (``run.protocol = "admm"``, the simulator's ``admm`` with
``split = "shared"``): the server's vector is the consensus z; a pull is granted one update,
and trainer i (thread i) solves its shard's subproblem at the pulled z from its own x_i and
scaled dual u_i (float64, ``realrun.worker``'s solver: ``simulator.rules.admm_shard``,
``admm_samples``, ``admm_push``), pushes Δ(x_i + u_i)/k (applied whole, as every push)
and sends its x_i after it; the server computes the residuals after each push
(``simulator.rules.admm_residuals``, :class:`_Consensus` says why there). ``run.updates``
counts pushes, one row each (its first local sample; its compute time is the whole solve
of ``admm.local_steps`` gradients), as the simulator's admm; the serialized view measures
no row (a push is not an SGD step). Delays, drops, ``write_bits`` (every value), the
schedule and stalls act on a push as on a paramserver one; injected errors and every
``[paramserver]`` option are refused (``realrun.support``).

DistBelief's Sandblaster L-BFGS (``run.protocol = "sandblaster"``, the simulator's
``sandblaster``): the server is the coordinator. It hands the open round's work units
out one by one, a pull granted one unit (its index in the answer's fourth slot) while any is
left, and a pull after that waits for the next round. The trainer computes its unit's
share of ∇f at the pulled vector (``simulator.protocols.sandblaster.unit_of``) and pushes
it; once the round's last unit is back the server applies the L-BFGS step of their mean
from its vector (``simulator.protocols.sandblaster.Lbfgs``, :func:`_round_of_units`), one
completion whose rows are the round's units (the last to arrive its writer), and answers
the waiting pulls. ``run.updates`` counts units; the serialized view measures no row (an
L-BFGS step is not an SGD step). Stragglers run as above, pauses too, and the trainer
also holds before computing a unit and before pushing it (on the server's clock, sent with
each answer: one machine), and a pull that waited for a round is handed its unit when the
round opens, paused or not (it reads once its window ends): a paused trainer's unit holds
its round, as the simulator's thread holds before each phase. The scenario refuses the
other injections and ``[paramserver]`` options (``realrun.support``).

Every timestamp is the server's ``time.monotonic_ns()`` (a pull's arrival and answer, a
push's arrival and application; the trainer reports only its compute time), so traces from
several machines need no common clock. The run directory is the usual one.

Faults: every receive and every answer has a timeout (``timeout``, default 60 s), and a
trainer that has sent nothing for that long while the others were served stops the run,
named. A local server also looks at its trainer processes four times a second: a trainer
that died stops the run at once, named, with what the server has written. Without process
handles (under torchrun) a dead trainer is seen when a receive fails (its closed
connection), or by its silence: ``timeout`` seconds without a message from it (a hung
trainer can also stall receives from any source, as gloo pairs them one sender at a time).
A trainer whose server is gone (a closed connection, or ``TRAINER_PATIENCE`` times the
timeout) exits with one line and status ``SERVER_GONE`` (3) when spawned locally, 1 under
torchrun.

A pool of servers (``paramserver.servers`` S > 1, ``realrun.pool``) holds shard 0 here
and each other shard on a shard server that decides nothing, so there the trainer draws its
own delays, errors and drops (the same draws, ``_draw``, from the same stream, in the same
order): it sends its pull's τ with the pull, adds the error to its gradient and sends each
push's ‖e‖ and drop with it (a lost push as headers alone); this server answers with its
shard τ versions back and decides on each push as its shard 0 arrives, as the simulator's
pool decides at a push's first shard: the schedule's factor at m = the pushes it received +
1, the staleness limit and the rule with the push's staleness then (``_kept``), and sends
the trainer its decision for the other shards' parts (``_decision_back``: a discarded push
goes to them as headers alone, ``staleness_lr``'s factor scales them, and DC-ASGD
compensates each on its own server, ``realrun.pool``). A warm start and rebalancing run
here, as on the one server (this server answers every pull first); a warm start ends
when trainer 0 pulls after its W-th completion, whose parts every shard server then has
(``_completed_everywhere``). Accumulation too: this server grants the gradients and drops
a push short of ``accumulate`` of them, which the trainer sends the shard servers as a
header alone (its errors are its own, so it sends their mean, never the steps apart).
Backup-worker rounds too: this server decides a round's members and closes it as the one
server does, then tells every shard server its members, factor and fate (``CLOSE``); each
applies the members' mean once their parts are there and says so (``APPLIED``), and this
server holds every pull until all have (``_applied``), as the simulator's reads wait for a
round's write; the trainers send every part, whatever their drop draw (a round's write is
lost where its writer's is), tagged with the round they pulled.

Launch: ``asyngrad real SCENARIO --backend ps --workers K`` starts the server in that
process and K trainer processes on loopback (``--servers S``: and S − 1 shard servers, a
pool: ``realrun.pool``); on several machines each node runs
``torchrun --nnodes N --nproc-per-node M --rdzv-endpoint HOST:PORT -m realrun.ps SCENARIO
--out DIR`` (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` as torchrun
sets them; rank 0 serves and writes DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import math
import os
import queue
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from realrun.pool import (
    APPLIED,
    DISCARDED,
    KEPT,
    LOST,
    ROUND,
    Applied,
    ShardBuffers,
    ShardServers,
    pool_trace,
    round_stored,
    shard_main,
)
from realrun.runner import DTYPES, _one_of
from realrun.support import recorded, refuse_unmeasurable, refuse_unsupported
from realrun.timeline import hardware_loss
from realrun.worker import (
    Consensus,
    Slowed,
    _injector,
    _Solver,
    another_problem,
    one_thread_each,
    one_thread_env,
    same_problem,
)
from simulator.budget import check_memory, preflight
from simulator.errors import AsyngradError, ScenarioError
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.protocols.sandblaster import Lbfgs, unit_chunks, unit_of
from simulator.rules import (
    LR_FACTORS,
    admm_residuals,
    dc_step,
    mean_step,
    retirements,
    round_quota,
    staleness_scale,
    too_stale,
    warmed_up,
)
from simulator.scenario import Scenario, scenario_from_dict, scenario_to_toml
from simulator.trace import Trace, TraceBuilder
from simulator.view import UNMEASURED, Measurement, SerializedView

__all__ = ["ROWS", "PSRun", "free_port", "run_ps", "serve", "train"]

PULL, PUSH, DONE, REFUSED = 1, 2, 3, 4  # REFUSED: the trainer built another problem
# (and a pool's shard server's APPLIED: it applied a round, ``realrun.pool``)
_POLL_S = 0.25  # how often a local server looks at its trainer processes
#: Trainers wait this many times the server's receive timeout: when a trainer hangs, the
#: server (whose receives from any source stall behind it) must be the one that times out
#: and reports, not a healthy trainer that waited for its answer.
TRAINER_PATIENCE = 2.0
SERVER_GONE = 3  # a local trainer's exit status when it lost the server
# kind, sender rank, version read (a pull: the injected delay its trainer drew, with a pool),
# gradients in the push; then per gradient (``accumulate`` slots each) its sample, its compute
# time (ns) and, from a pool's trainer, its ‖e‖ (float64 bits) and whether it is lost
_HEADER = 4
DEFAULT_ADDR = "127.0.0.1"


@dataclass
class _Push:
    """One received push, as the server saw it."""

    thread: int
    seq: int  # the thread's count of gradients before this push's
    samples: list[int]
    read_start: int
    read_end: int
    arrival: int
    grad_ns: list[int]  # each gradient's compute time
    version: int
    step: np.ndarray
    applied: int = 0  # completion t (0: dropped)
    write_end: int = 0
    completed: int = 0  # completions when applied (its own included), dropped or received
    measurement: Measurement = UNMEASURED
    rounds: bool = False  # pushed for backup-worker rounds (``paramserver.fraction`` > 0)
    member: bool = False  # applied by a round another push closed
    closed: int = 0  # when the round this push closed closed (its arrival, or a trainer's end)
    scale: float = 1.0  # the factor on lr the server's rule gave it (``paramserver.rule``)
    scheduled: float = 1.0  # the schedule's factor in ``scale`` (``run.lr_schedule``)
    ruled: float = 1.0  # ``staleness_lr``'s factor in ``scale``
    # too stale (``paramserver.staleness_limit``), or short of ``accumulate`` gradients
    discarded: bool = False
    delay: int = 0  # the injected delay of its pull: it got the vector τ versions back
    errors: list[float] = field(default_factory=list)  # per gradient: ‖e‖ injected
    parts: list[np.ndarray] | None = None  # errors with accumulate > 1: each gradient's step
    lost: list[bool] = field(default_factory=list)  # per gradient: its write drawn dropped
    residuals: tuple[float, float] = (math.nan, math.nan)  # admm: primal, dual after it


@dataclass
class _Consensus:
    """The server's side of consensus ADMM (``run.protocol = "admm"``): every trainer's x_i
    and z as the previous completion left it, for the residuals after each completion
    (``simulator.rules.admm_residuals``, as the simulator's ``ADMM.after_write``).

    Where: the primal residual needs every x_i at once, and only the server sees every push,
    in its order. So each trainer sends its x_i (d float64 values) after its push, and the
    server, once it has applied the push, computes both residuals at its own z, with Δz =
    z_t − z_{t−1} of its own vector: the simulator's definition exactly (CPU workers take
    their own push as Δz: equal to rounding where pushes do not interleave). Replaying each
    trainer's solve on the server from its pulled z and samples would give the same x_i,
    but it would run every solve a second time on the one rank that applies the pushes, one
    at a time; sending x_i costs one more message of d values per push.

    Exact with one trainer (the simulator's run to the bit). With several, the x_j the
    server holds for another trainer is the one its last received push sent, where the
    simulator's thread sets x_j when its solve ends: a trainer whose push is in flight
    enters the simulator's primal residual with its new x_j and the server's with its
    previous one (the one consistent with z, which holds the pushes received)."""

    xs: np.ndarray  # (k, d) float64: trainer i's x_i as its last push sent it
    previous: np.ndarray  # z after the previous completion (float64)
    rho: float

    def residuals(self, z: np.ndarray) -> tuple[float, float]:
        """The primal and dual residuals after a completion that left ``z`` (float64)."""
        moved = z - self.previous
        np.copyto(self.previous, z)
        return admm_residuals(self.xs, z, moved, self.rho)


@dataclass
class _Blaster:
    """The server's side of Sandblaster (``run.protocol = "sandblaster"``), the simulator's
    coordinator: the open round's units handed out and the pushes of those that came back;
    once all ``units`` have, the round's L-BFGS step (:func:`_round_of_units`)."""

    units: int
    coordinator: Lbfgs
    handed: int = 0
    arrivals: list[_Push] = field(default_factory=list)


@dataclass
class _Server:
    """The server's state while it runs."""

    problem: Problem
    scenario: Scenario
    trainers: int
    dtype: Any
    w: np.ndarray
    view: SerializedView
    wait: datetime.timedelta  # the timeout of every send and receive
    version: int = 0
    gradients: int = 0
    pushes: list[_Push] = field(default_factory=list)
    # rank: its last pull's arrival, answer, version and injected delay
    pulled: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    seq: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    round_pushes: list[_Push] = field(default_factory=list)
    waiting: list[tuple[int, int]] = field(default_factory=list)  # deferred pulls: rank, time
    pushed_round: dict[int, int] = field(default_factory=dict)
    granted: int = 0  # gradients handed out
    busy: list[int] = field(default_factory=list)  # per thread: summed time per gradient (ns)
    count: list[int] = field(default_factory=list)  # per thread: applied gradients
    retired: list[int] = field(default_factory=list)  # threads retired by rebalancing
    # rank: the vector its last pull got (DC-ASGD's and an adversarial error's w_read)
    sent: dict[int, np.ndarray] = field(default_factory=dict)
    work: tuple[np.ndarray, np.ndarray] | None = None  # dcasgd: dc_step's work arrays
    injector: Any = None  # [inject]: the simulator's injector, a stream per trainer
    ring: np.ndarray | None = None  # injected delays: ring[v mod H] = the vector of version v
    # [inject] pauses and deaths: per thread, its windows and death on the run's clock (from
    # the first pull's arrival: the trace's time 0), made at that pull
    stalls: list[Slowed] | None = None
    t0: int | None = None  # the first pull's arrival, with pauses or deaths
    dead: list[int] = field(default_factory=list)  # threads an injected death stopped
    # paramserver.lock_free: the update threads that apply pushes, the lock of everything
    # but the vector (a no-op otherwise), and the vector every push applied in completion
    # order would give (measure mode's lossless view)
    appliers: _Appliers | None = None
    lock: Any = field(default_factory=contextlib.nullcontext)
    rebuilt: np.ndarray | None = None
    pooled: bool = False  # a pool's coordinating server: it holds shard 0, measures nothing
    shards: ShardServers | None = None  # a pool's: the shard servers (rounds: told of a close)
    writing: int = 0  # rounds on a pool: shard servers still applying the closed round
    asked: dict[int, int] = field(default_factory=dict)  # a pool's: rank: τ its pull drew
    # a pool's: the versions when trainer 0 last pulled, which every server has applied
    # (its pushes reached every shard server before that pull; a warm start counts these)
    landed: int = 0
    resume: dict[int, int] = field(default_factory=dict)  # rank: its pause's end (ns)
    # rounds: the open round waits for a dead trainer for good (every other one waits for
    # it): every pull is answered with no gradients, and its pushes are in no row
    stalled: bool = False
    consensus: _Consensus | None = None  # run.protocol = admm: the x_i, the residuals
    blaster: _Blaster | None = None  # run.protocol = sandblaster: the rounds of work units


def _header_size(accumulate: int) -> int:
    return _HEADER + 4 * accumulate


def _carried(header: Any, n: int, accumulate: int) -> tuple[list[float], list[bool]]:
    """What a pool's trainer drew for the ``n`` gradients of its push (``header``): each
    one's ‖e‖ and whether its write is lost."""
    at = _HEADER + 2 * accumulate
    norms = header[at:at + n].numpy().copy().view(np.float64).tolist()
    return norms, [bool(x) for x in header[at + accumulate:at + accumulate + n].tolist()]


def _apart(scenario: Scenario) -> bool:
    """Whether trainers send each gradient's step apart (the one server injects errors into
    each of several accumulated gradients; a pool's trainer adds its own) rather than their
    mean."""
    return (scenario.inject.error != "none" and scenario.paramserver.accumulate > 1
            and _servers(scenario) == 1)


def serve(problem: Problem, scenario: Scenario, trainers: int, timeout: float,
          progress: Callable[[int], object] | None = None, measure: bool = False,
          dtype: str = "float32",
          dead: Callable[[], dict[str, Any] | None] | None = None,
          limit: float | None = None, pool: _Pool | None = None
          ) -> tuple[Trace, dict[str, Any] | None, int, dict[str, Any] | None]:
    """Run the server (rank 0 of an initialised gloo group) until every trainer is done, a
    receive fails or times out, ``dead`` (polled every ``_POLL_S`` seconds between
    messages, and when a receive fails; a local run passes one that looks at its trainer
    processes) reports a dead trainer, or ``limit`` seconds have passed (looked at as
    ``dead`` is); the trace of every gradient, the failure, if any, the number of pushes
    and, for a lock-free server in measure mode, what the hardware lost. With a ``pool``
    (``paramserver.servers`` > 1, ``realrun.pool``) it holds shard 0 and the trace is
    merged from every server's records, with what the rebuild and the servers' vector
    differ by."""
    import torch
    import torch.distributed as dist

    options = scenario.paramserver
    w0 = problem.initial()
    every = scenario.metrics.every
    # (an ADMM push and an L-BFGS round are not SGD steps: no δ to measure)
    stepped = scenario.run.protocol not in ("admm", "sandblaster")
    admm = scenario.run.protocol == "admm"
    size = problem.dim if pool is None else pool.shards.first  # (shard 0's, with a pool)
    state = _Server(problem, scenario, trainers, np.dtype(dtype), w0[:size].astype(dtype),
                    SerializedView(problem, scenario.run.lr, w0, scenario.run.updates,
                                   measure and stepped, every, scenario.metrics.curve_points),
                    datetime.timedelta(seconds=timeout), busy=[0] * trainers,
                    count=[0] * trainers, pooled=pool is not None,
                    shards=None if pool is None else pool.shards)
    if admm:
        state.consensus = _Consensus(np.tile(w0, (trainers, 1)), w0.astype(np.float64),
                                     scenario.admm.rho)
    if scenario.run.protocol == "sandblaster":
        state.blaster = _Blaster(scenario.sandblaster.units,
                                 Lbfgs(scenario.sandblaster.memory))
    x_i = torch.zeros(problem.dim if admm else 0, dtype=torch.float64)  # (ADMM's, pushed)
    inject = scenario.inject
    if pool is None:  # (a pool's trainers draw their own: ``train``)
        state.injector = _injector(scenario, problem, trainers)
    decided = pool is not None and _decided(scenario)  # (never with rounds: ``_decided``)
    if inject.max_delay:
        state.ring = np.tile(state.w, (inject.max_delay + 1, 1))
    if options.lock_free and options.fraction == 0:  # (a round's mean is one write)
        state.lock = threading.Lock()
        state.appliers = _Appliers(state)
        if measure:
            state.rebuilt = state.w.copy()
    header = torch.zeros(_header_size(options.accumulate), dtype=torch.int64)
    step = torch.zeros(size, dtype=getattr(torch, dtype))
    apart = _apart(scenario)  # the trainers send each gradient's step, not their mean
    if apart:
        steps = torch.zeros(options.accumulate * problem.dim, dtype=getattr(torch, dtype))
    origin = polled = time.monotonic_ns()
    failure = None
    heard = dict.fromkeys(range(1, trainers + 1), origin)  # rank: when it last sent anything

    def receive(tensor: Any, source: int | None = None) -> None:
        work: Any = dist.irecv(tensor, source)
        work.wait(state.wait)

    try:
        while len(state.done) < trainers or state.writing:  # (a pool's last round applied)
            if time.monotonic_ns() - polled > _POLL_S * 1e9:
                polled = time.monotonic_ns()
                failure = (dead() if dead is not None else None) or _silent(
                    state, heard, polled, timeout)
                if failure is None and limit is not None and polled - origin > limit * 1e9:
                    failure = {"worker": None, "reason": f"timeout after {limit:g} s"}
                if failure is not None:
                    break
            try:
                receive(header)
            except RuntimeError as err:
                # A closed connection: find the trainer that died. A timeout: the silence is
                # the cause (gloo closes pairs when it times out, so trainers exit after it).
                # (After a timeout a dead process still explains it: a pool's shard server
                # whose trainers left.)
                timed_out = _timed_out(err)
                cause = (dead() if dead is not None else None) if timed_out else _settled(dead)
                failure = cause or _receive_failure(state, timeout, err, timed_out)
                break
            kind, source, arrived = int(header[0]), int(header[1]), time.monotonic_ns()
            if kind == APPLIED:  # a shard server applied the closed round (``realrun.pool``)
                _applied(state)
                continue
            heard[source] = arrived
            if (kind == PULL and state.appliers is not None
                    and not state.appliers.settle(source - 1, timeout)):
                failure = _applier_failure(state.appliers, source, timeout)
                break
            with state.lock:  # (a lock-free server's update threads count completions)
                if kind == PULL and state.appliers is not None:
                    # Held until its trainer's pushes were applied, the pull starts now, as a
                    # pull a warm start or a round released (a simulated thread reads after
                    # its write ends); stamped under the lock, so that every completion the
                    # version it is answered with counts ended before it (one counted between
                    # a stamp outside and the lock made a replay's staleness differ).
                    arrived = time.monotonic_ns()
                if kind == PULL:
                    if pool is not None:
                        state.asked[source] = int(header[2])
                        if source == 1:
                            state.landed = state.version
                    if state.t0 is None and (inject.pauses or inject.deaths):
                        state.t0 = arrived
                        state.stalls = [Slowed(inject, t, arrived) for t in range(trainers)]
                    _pull(state, source, arrived)
                    if pool is not None and source == 1:  # (a warm start may end now)
                        _release(state)
                elif kind == PUSH:
                    n, ns = int(header[3]), _HEADER + options.accumulate
                    norms, drops = (_carried(header, n, options.accumulate)
                                    if pool is not None else ([], []))
                    # (then no step follows; in rounds every push's does: a round's write
                    # is lost where its writer's is, ``_close_round``)
                    lost_push = bool(drops and drops[-1]) and options.fraction == 0
                    try:
                        if not lost_push:
                            receive(steps[:n * problem.dim] if apart else step, source)
                        if state.consensus is not None:
                            receive(x_i, source)
                    except RuntimeError as err:
                        raise _PeerFailed(source, err, "sent no step after its push") from None
                    if state.consensus is not None:  # (the push is applied now, below)
                        np.copyto(state.consensus.xs[source - 1], x_i.numpy())
                    push = _Push(source - 1, state.seq.get(source, 0),
                                 [int(s) for s in header[_HEADER:_HEADER + n]],
                                 *state.pulled[source][:2], arrived,
                                 [int(t) for t in header[ns:ns + n]], int(header[2]),
                                 np.zeros(0, dtype) if apart else np.zeros(size, dtype)
                                 if lost_push else step.numpy().astype(dtype),
                                 errors=norms, lost=drops)
                    if apart:
                        push.parts = list(steps[:n * problem.dim].numpy().astype(dtype)
                                          .reshape(n, problem.dim))
                    push.delay = state.pulled[source][3]
                    state.seq[source] = push.seq + n
                    state.gradients += n
                    _push(state, push)
                    if decided and not lost_push and n == options.accumulate:
                        _decision_back(state, push)  # (a short push's fate is known)
                    if progress:
                        progress(n)
                elif kind == REFUSED:
                    failure = {"worker": source - 1,
                               "reason": str(another_problem(problem, f"trainer {source}"))}
                    break
                elif kind == DONE:
                    state.done.add(source)
                    if options.fraction > 0:
                        _close_round(state, arrived)
                    _release(state)
                    _stall(state)
    except _PeerFailed as err:  # one trainer stopped in the middle of an exchange
        failure = (None if _timed_out(err.cause) else _settled(dead)) or {
            "worker": err.rank - 1, "reason": f"trainer {err.rank} {err.what} for "
            f"{timeout:g} s ({_first_line(err.cause)})"}
    except RuntimeError as err:  # a connection closed under a receive
        failure = {"worker": None, "reason": f"server: {_first_line(err)}"}
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM where the caller made it one
        failure = {"worker": None,
                   "reason": f"interrupted ({err.args[0] if err.args else 'Ctrl-C'})"}
    if state.appliers is not None:  # the pushes received are applied before the trace
        state.appliers.close(timeout)
        failure = failure or (None if state.appliers.error is None
                              else _applier_failure(state.appliers, None, timeout))
    if pool is not None:
        trace, lost, stopped = pool.trace(state, measure, dtype, failure is not None)
        return trace, failure or stopped, len(state.pushes), lost
    loss = None if state.rebuilt is None else hardware_loss(
        state.rebuilt, state.w, w0, "lossless rebuild")
    return _trace(state, origin), failure, len(state.pushes), loss


def _applier_failure(appliers: _Appliers, source: int | None,
                     timeout: float) -> dict[str, Any]:
    """Why a lock-free server stopped: an update thread failed, or (``source``'s pull)
    its pushes were not applied within ``timeout`` seconds."""
    if appliers.error is not None:
        return {"worker": None, "reason": f"server update thread: "
                f"{type(appliers.error).__name__}: {_first_line(appliers.error)}"}
    return {"worker": None if source is None else source - 1,
            "reason": f"trainer {source}'s pushes not applied within {timeout:g} s"}


def _silent(state: _Server, heard: dict[int, int], now: int,
            timeout: float) -> dict[str, Any] | None:
    """A trainer that has sent nothing for ``timeout`` seconds (``heard`` and ``now`` in
    monotonic ns) while others were served (it hangs between messages; one waiting for its
    round's answer is not counted)."""
    waiting = {source for source, _ in state.waiting}
    for rank, last in heard.items():
        last = max(last, state.resume.get(rank, 0))  # (a paused trainer is silent on purpose)
        if rank not in state.done and rank not in waiting and now - last > timeout * 1e9:
            return {"worker": rank - 1, "reason": f"trainer {rank} sent nothing for "
                    f"{timeout:g} s while the others were served"}
    return None


def _timed_out(err: RuntimeError) -> bool:
    """A gloo timeout, as opposed to a closed connection."""
    return "Timed out" in str(err)


def _settled(dead: Callable[[], dict[str, Any] | None] | None,
             seconds: float = 1.0) -> dict[str, Any] | None:
    """``dead()``, asked again for up to ``seconds``: a closed connection can be seen before
    the trainer's exit status is."""
    if dead is None:
        return None
    until = time.monotonic() + seconds
    while (failure := dead()) is None and time.monotonic() < until:
        time.sleep(0.02)
    return failure


def _receive_failure(state: _Server, timeout: float, err: RuntimeError,
                     timed_out: bool) -> dict[str, Any]:
    """Why the server stopped, from a failed receive: silence for ``timeout`` seconds or a
    connection that closed under it (gloo does not say whose)."""
    unfinished = sorted(set(range(1, state.trainers + 1)) - state.done)
    if timed_out:
        what = f"no message for {timeout:g} s; trainers {unfinished} had not finished"
    else:
        what = f"a connection closed; trainers {unfinished} had not finished"
    return {"worker": None, "reason": f"{what} ({_first_line(err)})"}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def _pull(state: _Server, source: int, arrived: int, released: bool = False) -> None:
    """Answer a pull, or defer it: a trainer other than the first during the warm start,
    or one that already pushed for the open round. First its injected stalls (``inject.pauses``,
    ``inject.deaths``), which hold a simulated thread before its read's gate: a pull in one of
    its pause windows is told to pull again at the window's end, and one at or after its
    death is answered with no gradients. A Sandblaster pull that waited for the round
    (``released``) is handed its unit at once, paused or not, as the simulator's round hands
    its waiting threads theirs when it opens (the trainer holds before computing it)."""
    if state.stalled:
        _answer(state, source, arrived)
        return
    # (a unit for it: held by the trainer)
    kept = (released and state.blaster is not None
            and state.blaster.handed < state.blaster.units)
    if state.stalls is not None and not kept and _stalled(state, source, arrived):
        return
    if kept and state.stalls is not None and (
            end := state.stalls[source - 1].paused_until(arrived)) is not None:
        _answer(state, source, arrived)  # (the trainer reads it once its window ends)
        state.pulled[source] = (end, end, *state.pulled[source][2:])
        return
    options = state.scenario.paramserver
    if state.blaster is not None and state.blaster.handed == state.blaster.units:
        state.waiting.append((source, arrived))  # (until the round's step: its last unit's)
        return
    if (source != 1 and _warming(state)) or state.writing or (
            options.fraction > 0 and state.pushed_round.get(source) == state.version):
        state.waiting.append((source, arrived))
        _stall(state)
        return
    _answer(state, source, arrived)


def _stalled(state: _Server, source: int, arrived: int) -> bool:
    """Whether an injected pause or death answered the pull of ``source`` (arrived at
    ``arrived``): a pause with the time left in its window and no gradients (the trainer
    waits, then pulls again), a death with no gradients (the trainer says done)."""
    import torch
    import torch.distributed as dist

    stalls = state.stalls[source - 1]  # type: ignore[index]
    if stalls.dead(arrived) and state.granted < state.scenario.run.updates:
        if source - 1 not in state.dead:
            state.dead.append(source - 1)
        _answer(state, source, arrived)
        return True
    end = stalls.paused_until(arrived)
    if end is None:
        return False
    state.resume[source] = end
    try:
        work: Any = dist.isend(torch.tensor([state.version, 0, end - arrived, -1, state.t0],
                                            dtype=torch.int64), source)
        work.wait(state.wait)
    except RuntimeError as err:
        raise _PeerFailed(source, err, "took no answer to its pull") from None
    return True


def _warming(state: _Server) -> bool:
    """Whether the warm start holds every trainer but the first back: until trainer 0
    finished, or W of its pushes completed (``simulator.rules.warmed_up``, the simulator's
    completions; on a pool, on every server: :func:`_completed_everywhere`)."""
    return 1 not in state.done and not warmed_up(_completed_everywhere(state),
                                                 state.scenario.paramserver.warm_start)


def _completed_everywhere(state: _Server) -> int:
    """The versions every server has applied: the one server's own; a pool's coordinating
    server counts a push when its shard 0 arrives, before its other parts reach their
    servers, so there those counted when trainer 0 last pulled (``landed``: it pulls after
    its push's last part was received, and a shard server serves a released trainer's pull
    after that part). During a warm start trainer 0 alone pushes, so the pool releases the
    others when trainer 0 pulls after its W-th completion, whose parts every shard server
    then has, as the simulator's pool releases them at that completion (its last shard)."""
    return state.landed if state.scenario.paramserver.servers > 1 else state.version


def _release(state: _Server) -> None:
    """Answer the deferred pulls that need wait no longer (the others wait on). A pull
    released now starts now: it waited at the server's gate, as a simulated read waits at
    its protocol's gate before it starts."""
    waiting, state.waiting = state.waiting, []
    now = time.monotonic_ns()
    for source, _ in waiting:
        _pull(state, source, now, released=True)


class _PeerFailed(Exception):
    """An exchange with trainer ``rank`` failed or timed out half way (it hangs, or it is
    gone): ``what`` it did not do."""

    def __init__(self, rank: int, cause: RuntimeError, what: str) -> None:
        super().__init__(rank, cause, what)
        self.rank, self.cause, self.what = rank, cause, what


def _answer(state: _Server, source: int, arrived: int) -> None:
    """Send a trainer that pulled the version, the gradients it may compute (at most
    ``accumulate`` of the budget left; none for a retired trainer, and then no vector; under
    Sandblaster one work unit, and which) and the vector (with injected delays: as it was
    τ versions back, τ drawn now, or by a pool's trainer for its pull, clipped at the
    version); a send waits at most the receive timeout (gloo's sends wait for the
    receiver, so a hung trainer blocks them)."""
    import torch
    import torch.distributed as dist

    left = state.scenario.run.updates - state.granted
    stopped = source - 1 in state.retired or source - 1 in state.dead or state.stalled
    grant = 0 if stopped else min(state.scenario.paramserver.accumulate, left)
    state.granted += grant
    unit = -1
    if state.blaster is not None and grant:  # Sandblaster: the round's next work unit
        unit, state.blaster.handed = state.blaster.handed, state.blaster.handed + 1
    tensors = [torch.tensor([state.version, grant, 0, unit, state.t0 or 0],
                            dtype=torch.int64)]
    tau = 0
    if grant:
        # (a lock-free server's vector changes under a send: one copy is sent and recorded)
        vector = state.w if state.appliers is None else state.w.copy()
        if state.ring is not None:  # an injected delay: the vector τ versions back
            drawn = (state.asked[source] if state.pooled
                     else state.injector.delay(source - 1))
            tau = min(drawn, state.version)
            if tau:
                vector = state.ring[(state.version - tau) % len(state.ring)]
        tensors.append(torch.from_numpy(vector))
        if state.scenario.paramserver.rule == "dcasgd" or (
                state.injector is not None and state.injector.errors
                and state.scenario.inject.error == "adversarial"):
            # the w_read of its next push (DC-ASGD's, an adversarial error's)
            state.sent[source] = vector.astype(np.float64)
    try:
        for tensor in tensors:
            work: Any = dist.isend(tensor, source)
            work.wait(state.wait)
    except RuntimeError as err:
        raise _PeerFailed(source, err, "took no parameters") from None
    state.pulled[source] = (arrived, time.monotonic_ns(), state.version, tau)


def _push(state: _Server, push: _Push) -> None:
    options = state.scenario.paramserver
    state.pushes.append(push)
    push.completed = state.version
    if state.injector is not None:  # (drawn for every gradient, as the simulator's updates)
        _inject(state, push)
    if state.blaster is not None:
        _round_of_units(state, push)
        return
    if len(push.samples) < options.accumulate:  # gradients the budget left unpushed
        push.write_end = push.arrival
        push.discarded = True  # (never applied: a pool's shard servers got a header alone)
        return
    if options.fraction > 0:
        push.rounds = True
        if push.version != state.version:  # computed on a closed round's vector
            push.write_end = push.arrival
            push.discarded = True
            return
        state.pushed_round[push.thread + 1] = state.version
        state.round_pushes.append(push)
        _close_round(state, push.arrival)
        return
    if push.lost and push.lost[-1]:  # lost in transit: a version that changes nothing
        _complete(state, [push])
        return
    if state.appliers is not None:  # its trainer's update thread decides and applies it
        state.appliers.apply(push)
        return
    if not _kept(state, push):
        return
    state.w -= push.step
    if state.scenario.inject.write_bits:
        _round_stored(state, push)
    _complete(state, [push])


class _Appliers:
    """A lock-free server's update threads (``paramserver.lock_free``), one per trainer, as
    DistBelief's and Project Adam's servers apply pushes "not locked during updating": each
    takes its trainer's pushes in order and, under the server's lock, decides on one as the
    simulator's server does when the push's shard has arrived (the staleness limit, the
    schedule, the rule: ``_kept``), then subtracts it from the server's vector in place with
    no lock (``_subtract``: ``np.subtract(w, step, out=w)``, the atomic server's operation)
    while the other threads and the pulls' copies run, so two pushes that overlap can lose
    element updates and a pull can copy half of one (where numpy lets threads run at once:
    it releases the interpreter's lock for large arrays). Then, under the lock again, it
    counts the completion (``_complete``), in the order the threads get there. A trainer's
    next pull is answered once its pushes are applied, as a simulated thread reads after its
    write. What was lost is what the real vector lacks against every push applied in
    completion order (``rebuilt``, measure mode: ``hardware_loss``). A failure in a thread is
    kept (``error``) and stops the run; its trainer's later pushes are not applied."""

    def __init__(self, state: _Server) -> None:
        self.state = state
        self.queues: list[queue.SimpleQueue[_Push | None]] = [
            queue.SimpleQueue() for _ in range(state.trainers)]
        self.pending = [0] * state.trainers  # per trainer: pushes handed over, not yet done
        self.settled = threading.Condition()
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True,
                                         name=f"asyngrad-ps-update-{t}")
                        for t in range(state.trainers)]
        for thread in self.threads:
            thread.start()

    def apply(self, push: _Push) -> None:
        with self.settled:
            self.pending[push.thread] += 1
        self.queues[push.thread].put(push)

    def settle(self, thread: int, timeout: float) -> bool:
        """Wait until ``thread``'s pushes are done (before answering its pull); whether
        they are (not if a thread failed or ``timeout`` seconds passed)."""
        with self.settled:
            return self.settled.wait_for(
                lambda: self.pending[thread] == 0 or self.error is not None,
                timeout) and self.error is None

    def _run(self, thread: int) -> None:
        pushes = self.queues[thread]
        while (push := pushes.get()) is not None:
            try:
                if self.error is None:
                    self._apply(push)
            except Exception as err:  # (kept for the run's failure; the others drain)
                self.error = self.error or err
            with self.settled:
                self.pending[thread] -= 1
                self.settled.notify_all()

    def _apply(self, push: _Push) -> None:
        state = self.state
        with state.lock:
            kept = _kept(state, push)
        if not kept:
            return
        _subtract(state.w, push.step)
        with state.lock:
            if state.rebuilt is not None:
                np.subtract(state.rebuilt, push.step, out=state.rebuilt)
            _complete(state, [push], release=False)  # (no pull waits: no warm start)

    def close(self, timeout: float) -> None:
        """Apply what was handed over, then end the threads (each waited for at most
        ``timeout`` seconds)."""
        for pushes in self.queues:
            pushes.put(None)
        for thread in self.threads:
            thread.join(timeout)


def _kept(state: _Server, push: _Push) -> bool:
    """The server's decision on a push now: discarded when too stale (its write ends now),
    else scaled by the schedule and its rule."""
    if too_stale(state.version - push.version + push.delay,
                 state.scenario.paramserver.staleness_limit):
        push.write_end = max(push.arrival, time.monotonic_ns() if state.appliers else 0)
        push.discarded = True
        return False
    _scheduled(state, push)
    _rule(state, push)
    return True


def _subtract(w: np.ndarray, step: np.ndarray) -> None:
    """A lock-free server's update of its vector: in place, with no lock."""
    np.subtract(w, step, out=w)


def _draw(injector: Any, thread: int, g: np.ndarray, w_read: np.ndarray,
          support: np.ndarray | None) -> tuple[np.ndarray, float, bool]:
    """One gradient's injections, from ``thread``'s stream of the simulator's injector in
    the simulator's order (``simulator.engine``: the error, then the drop): ``g`` (its
    values over ``support``; None: dense) with its error added, computed at ``w_read``
    (an adversarial error's), ‖e‖, and whether its write is lost. The one server draws them
    as a push arrives (``_inject``), a pool's trainer as it computes (``_gradients``)."""
    norm = 0.0
    if injector.errors:
        g, norm = injector.error(thread, g, w_read, support)
    return g, norm, injector.dropped(thread)


def _inject(state: _Server, push: _Push) -> None:
    """Each gradient's injected error and drop (:func:`_draw`). An error is added to its
    gradient, lr·g / lr (g to rounding): the push's one, or, with ``accumulate`` > 1, each
    of the gradients the trainer then sends apart (``push.parts``: dense, as the
    simulator's accumulated gradients), whose mean is the push; with rounds over every
    coordinate too (the simulator's round members compute dense gradients)."""
    injector, thread, lr = state.injector, push.thread, state.scenario.run.lr
    w_read = state.sent.get(thread + 1, state.w)  # (only adversarial errors use it)
    if push.parts is not None:
        for part in push.parts:
            g, norm, lost = _draw(injector, thread, part.astype(np.float64) / lr, w_read,
                                  None)
            np.copyto(part, lr * g, casting="same_kind")
            push.errors.append(norm)
            push.lost.append(lost)
        push.step, push.parts = mean_step(push.parts), None  # (the parts are not kept)
        return
    dense = state.scenario.paramserver.fraction > 0  # (a round's gradients are, simulated)
    for sample in push.samples:
        support = state.problem.support(sample) if injector.errors and not dense else None
        g = push.step.astype(np.float64) / lr if injector.errors else push.step
        g, norm, lost = _draw(injector, thread, g if support is None else g[support],
                              w_read, support)
        if injector.errors:
            if support is None:
                np.copyto(push.step, lr * g, casting="same_kind")
            else:
                push.step[support] = lr * g
        push.errors.append(norm)
        push.lost.append(lost)


def _round_stored(state: _Server, push: _Push) -> None:
    """``inject.write_bits``: round the values the push stored (its samples' supports)."""
    bits = state.scenario.inject.write_bits
    supports = [state.problem.support(s) for s in push.samples]
    if (state.scenario.paramserver.accumulate > 1 or state.consensus is not None
            or state.pooled or push.rounds or any(s is None for s in supports)):
        # dense: every value (accumulated pushes are, as the simulator's: errors reach every
        # coordinate; an ADMM push moves every coordinate; a round's mean too; a pool's
        # shard: as every shard server rounds its own, ``realrun.pool``)
        round_stored(state.w, bits)
        return
    touched = np.unique(np.concatenate([s for s in supports if s is not None]))
    values = state.w[touched]
    round_stored(values, bits)
    state.w[touched] = values


def _decided(scenario: Scenario) -> bool:
    """Whether a pool's coordinating server decides on each push for its other parts (the
    staleness limit, a rule, the schedule: ``_decision_back``; with rounds none of them: it
    decides on a round when it closes, ``_close_round``)."""
    options = scenario.paramserver
    return options.fraction == 0 and bool(options.staleness_limit or options.rule != "none"
                                           or scenario.run.lr_schedule in LR_FACTORS)


def _decision_back(state: _Server, push: _Push) -> None:
    """A pool's decision on a push, made here when its shard 0 arrived (the staleness limit,
    the schedule's factor at m = the pushes received + 1, the rule with the push's
    staleness then), sent to the trainer for the parts it sends the shard servers: the
    schedule's factor, ``staleness_lr``'s, 1.0 if discarded, and the factor on lr the push
    took (DC-ASGD's rate)."""
    import torch
    import torch.distributed as dist

    decision = torch.tensor([push.scheduled, push.ruled, float(push.discarded), push.scale],
                            dtype=torch.float64)
    try:
        work: Any = dist.isend(decision, push.thread + 1)
        work.wait(state.wait)
    except RuntimeError as err:
        raise _PeerFailed(push.thread + 1, err, "took no decision on its push") from None


def _factor(state: _Server) -> float:
    """The learning-rate schedule's factor on the next version (``run.lr_schedule``: at m =
    the versions applied + 1, as the simulator's server takes it when a push arrives)."""
    schedule = LR_FACTORS.get(state.scenario.run.lr_schedule)
    return 1.0 if schedule is None else schedule(state.version + 1)


def _scheduled(state: _Server, push: _Push) -> None:
    """Scale a push the server keeps by the schedule's factor (recorded in its scale)."""
    factor = _factor(state)
    if factor != 1.0:
        push.step *= factor
        push.scale *= factor
        push.scheduled = factor


def _rule(state: _Server, push: _Push) -> None:
    """The server's update rule (``paramserver.rule``) on a push it keeps, with the push's
    exact staleness, as the simulator's server applies it on arrival (``simulator.rules``),
    after the schedule's factor (the rate the push took: lr times its scale)."""
    rule = state.scenario.paramserver.rule
    if rule == "staleness_lr":
        scale = staleness_scale(state.version - push.version + push.delay)
        if scale != 1.0:
            push.scale *= scale
            push.step *= scale
            push.ruled = scale
    elif rule == "dcasgd":
        if state.work is None:
            state.work = (np.zeros(state.w.size), np.zeros(state.w.size))
        compensated = dc_step(push.step.astype(np.float64),
                              state.scenario.run.lr * push.scale,
                              state.w.astype(np.float64), state.sent[push.thread + 1],
                              state.scenario.dcasgd.lam, state.work)
        np.copyto(push.step, compensated, casting="same_kind")


def _close_round(state: _Server, now: int) -> None:
    """Apply the round's mean step once its quota of pushes arrived (the simulator's
    ``round_quota``; during a warm start trainer 0 is the one that may arrive), then answer
    the pulls that waited for the new round. ``now``: when the message that may close it
    arrived (a push, or a trainer's end that lowered the quota); the last push to arrive
    closes it, as in the simulator.

    Injections as the simulator's rounds: each member's error is in its push already
    (``_inject``), the round's one write is lost where its writer's draw drops it (the last
    push to arrive), its stores are rounded (every value: a round's mean moves all), and a
    dead trainer is still counted among the live ones (a dead simulated thread never
    finishes: the round may wait for it for good, :func:`_stall`)."""
    if state.stalled:
        return
    finished = state.done - {t + 1 for t in state.dead}
    live = 1 if _warming(state) else state.trainers - len(finished)
    quota = round_quota(state.scenario.paramserver.fraction, state.trainers, live)
    if not state.round_pushes or len(state.round_pushes) < quota:
        return
    group, writer = state.round_pushes, state.round_pushes[-1]
    for member in group[:-1]:
        member.member = True
    writer.closed = now
    writer.scale = _factor(state)  # (the schedule's, on the round's mean)
    lost = bool(writer.lost and writer.lost[-1])
    mean = writer.scale * mean_step([p.step for p in group])
    if not lost:
        state.w -= mean
        if state.scenario.inject.write_bits:
            _round_stored(state, writer)
    if state.shards is not None:  # a pool: every shard server applies its part of the mean
        state.shards.close([p.thread for p in group], writer.scale, lost, state.trainers)
        state.writing = len(state.shards.ranks)  # (pulls wait until each applied it)
        for p in group:  # (what each push subtracted, as the shard servers record it)
            p.step = np.zeros_like(mean) if lost or p is not writer else mean
    _complete(state, group)
    state.round_pushes = []


def _round_of_units(state: _Server, push: _Push) -> None:
    """Sandblaster: a work unit's gradient came back. Once the round's ``units`` all have,
    apply the coordinator's L-BFGS step (``simulator.protocols.sandblaster.Lbfgs``, as the
    simulator's ``Sandblaster.grouped``) from the round's vector x_r (the server's: every unit
    of the round read it, as nothing is written within a round) and the units' mean
    g_r = ∇f(x_r), at α = lr times the schedule's factor at m = the versions applied + 1
    (``_scheduled``); the last unit to arrive is the round's writer and the others its
    members, one completion (as the simulator's round), then hand the next round's units
    to the pulls that waited."""
    blaster = state.blaster
    assert blaster is not None
    push.rounds = True
    blaster.arrivals.append(push)
    if len(blaster.arrivals) < blaster.units:
        return
    group, blaster.arrivals, blaster.handed = blaster.arrivals, [], 0
    for member in group[:-1]:
        member.member = True
    push.closed = push.arrival
    mean = mean_step([p.step.astype(np.float64) for p in group])
    push.step = blaster.coordinator.step(state.w.astype(np.float64), mean,
                                         state.scenario.run.lr)
    _scheduled(state, push)
    state.w -= push.step.astype(state.dtype)
    _complete(state, group)


def _applied(state: _Server) -> None:
    """A shard server applied the closed round: once every one has, the pulls its write
    held are answered (they read the round's vector on every shard, as a simulated read
    waits for a round's write to end)."""
    with state.lock:
        state.writing -= 1
        if not state.writing:
            _release(state)
            _stall(state)


def _stall(state: _Server) -> None:
    """With rounds, end the run where the open round waits for a dead trainer for good:
    every trainer not done waits for it (its push is in), and the dead one never pushes
    again, as the simulator's round waits for a dead thread (its run ends when nothing can
    happen). Every waiting trainer is answered with no gradients and says done; one with a
    death of its own, however late, is dead too (the simulator kills its waiting thread when
    the death comes); the round's pushes are in no row (the simulator's waiting updates
    never complete)."""
    waiting = {source for source, _ in state.waiting}
    if (state.stalled or not waiting or not state.dead or state.writing
            or state.scenario.paramserver.fraction == 0
            or any(r not in state.done and r not in waiting
                   for r in range(1, state.trainers + 1))):
        return
    state.stalled = True
    for source in sorted(waiting):
        if state.stalls[source - 1].death is not None and source - 1 not in state.dead:  # type: ignore[index]
            state.dead.append(source - 1)
    _release(state)  # (each pull is answered now: ``_pull``)


def _complete(state: _Server, group: list[_Push], release: bool = True) -> None:
    """Count the completion, measure it, rebalance, and answer the pulls it releases."""
    state.version += 1
    if state.ring is not None:
        state.ring[state.version % len(state.ring)] = state.w
    now = time.monotonic_ns()
    w = (state.w if state.rebuilt is None else state.rebuilt).astype(np.float64)
    samples = [s for p in group for s in p.samples]
    m = (UNMEASURED if state.pooled  # (the parent rebuilds a pool's view)
         else state.view.complete(state.version, w, samples, now, group[-1].scale,
                                  n=state.gradients))
    if state.consensus is not None:
        group[-1].residuals = state.consensus.residuals(w)
    for p in group:
        p.applied = p.completed = state.version
        p.write_end = now
        for read_start in _rows(p)["read_start"]:
            state.busy[p.thread] += now - read_start
            state.count[p.thread] += 1
    group[-1].measurement = m
    _rebalance(state)
    if release:
        _release(state)


def _rebalance(state: _Server) -> None:
    """Retire the trainers the simulator's rebalancing rule picks now."""
    options = state.scenario.paramserver
    working = [t for t in range(state.trainers)
               if t not in state.retired and t + 1 not in state.done]
    state.retired += retirements(state.busy, state.count, working, options.rebalance,
                                 options.rebalance_after)


def _rows(p: _Push) -> dict[str, list[int]]:
    """The times of a push's gradient rows, as the simulator keeps a group's: the first
    gradient reads (the pull), each computes after the previous one's compute ended (on the
    trainer's clock, placed in the pull's answer to push's arrival window); the last one's
    write runs from the end of its compute (when the push left, as far as the server can
    tell) until the push was applied (or dropped): the push's transfer is part of its write,
    as the simulator's pushes pay their link there. The others' writes are empty at that end
    (at its arrival for a push still waiting for its round when the run stopped).

    In rounds (``_Push.rounds``) a simulated push that does not close its round pays no link:
    it arrives at its gradient's end, waits, and is applied with an empty write at the
    round's close. So there the compute is placed at the end of the window (its end is the
    push's arrival; the transfers are part of the read), the closing push's write runs from
    when it closed the round (its arrival, or a trainer's end) to the round's application,
    the other members' writes are empty at it, and a dropped push's write is empty at its
    arrival."""
    n, end = len(p.samples), p.write_end or p.arrival
    if p.rounds:  # one gradient per push (accumulate = 1 with rounds)
        start = max(p.read_end, p.arrival - p.grad_ns[0])
        closes = not p.member and p.applied
        return {"read_start": [p.read_start], "read_end": [start], "grad_start": [start],
                "grad_end": [p.arrival], "write_start": [p.closed if closes else end],
                "write_end": [end]}
    starts = [min(p.read_end + sum(p.grad_ns[:j]), p.arrival) for j in range(n)]
    ends = [min(s + ns, p.arrival) for s, ns in zip(starts, p.grad_ns, strict=True)]
    return {"read_start": [p.read_start, *starts[1:]], "read_end": [p.read_end, *starts[1:]],
            "grad_start": starts, "grad_end": ends,
            "write_start": [*[end] * (n - 1), ends[-1]], "write_end": [end] * n}


def _trace(state: _Server, origin: int) -> Trace:
    """One row per gradient, in the order of their write ends (a group's writer last), made
    by the one trace builder. One block (the server's vector): a push's first gradient copies
    it when its pull is answered, and an applied push's last one stores it when applied."""
    rows: list[tuple[Any, ...]] = []
    stuck = {id(p) for p in state.round_pushes} if state.stalled else set()
    for p in state.pushes:
        if id(p) in stuck:  # (waiting for good in a stalled round: ``_stall``)
            continue
        times, last = _rows(p), len(p.samples) - 1
        for j, sample in enumerate(p.samples):
            rows.append((times["write_end"][j], p.thread, p.seq + j, sample, p.applied,
                         p.version, p.completed, p.grad_ns[j],
                         *(times[name][j] for name in _TIMES), j == 0,
                         j == last and p.applied and not p.member
                         and not (p.lost and p.lost[-1]),
                         p.delay, p.errors[j] if p.errors else 0.0,
                         bool(p.lost[j]) if p.lost else False, p.scale if j == last else 1.0,
                         p.measurement if j == last else UNMEASURED,
                         p.residuals if j == last else (math.nan, math.nan)))
    rows.sort(key=lambda r: r[:3])
    start = (state.t0 if state.t0 is not None  # (pauses and deaths count from it)
             else min([r[8] for r in rows], default=origin))
    uid = np.argsort(np.argsort([r[8] for r in rows], kind="stable"))
    records = TraceBuilder()
    for i, (_, thread, seq, sample, step, seen, completed, grad_ns, *stamps, copies, stores,
            delay, error, lost, scale, m, _) in enumerate(rows):
        rs, re, gs, ge, ws, we = (t - start for t in stamps)
        # The compute as placed in its window (``_rows``): a trainer can start computing
        # before the server stamps its answer (the server is descheduled after the send),
        # and a duration longer than the window would replay every later event that late.
        grad_ns = min(grad_ns, ge - gs)
        # idle −1: from the thread's previous write end, by the builder
        records.add((int(uid[i]), thread, seq, sample, step, rs, re, gs, ge, ws, we, grad_ns,
                     -1, seen, completed, 0, delay, error, lost, scale, *m),
                    [0], [re - rs], [we - ws], [re if copies else -1], [we if stores else -1])
    state.view.finish(state.version,
                      (state.w if state.rebuilt is None else state.rebuilt).astype(np.float64),
                      max([0, *(r[10] for r in records.rows)]),
                      state.gradients - sum(len(p.samples) for p in state.pushes
                                            if id(p) in stuck))  # (rows' gradients)
    curve = state.view.curve_arrays()
    curve["curve_time"] = np.maximum(curve["curve_time"] - start, 0)
    extras = {"dead_threads": np.asarray(sorted(state.dead), np.int64)}
    if state.consensus is None:
        extras["retired_threads"] = np.asarray(state.retired, dtype=np.int64)
    else:  # (each push's, on its row: the simulator's admm records them in that order)
        primal, dual = zip(*(r[-1] for r in rows), strict=True) if rows else ((), ())
        extras["primal_residual"] = np.asarray(primal, dtype=np.float64)
        extras["dual_residual"] = np.asarray(dual, dtype=np.float64)
    return records.build(scenario_to_toml(state.scenario), state.problem.initial(),
                         state.w.astype(np.float64), curve, extras=extras, source="real")


_TIMES = ("read_start", "read_end", "grad_start", "grad_end", "write_start", "write_end")


def train(problem: Problem, scenario: Scenario, rank: int, trainers: int, timeout: float,
          dtype: str = "float32") -> None:
    """A trainer's loop (rank ≥ 1 of an initialised gloo group): pull, compute the gradients
    the server granted, push their mean step (under ADMM: solve, push, send x_i), until a
    pull is granted none; then say done. On a pool (``paramserver.servers`` > 1) it goes
    shard by shard and draws its own injections from its thread's stream in the simulator's
    order: each update's τ before its first pull (sent with it, and with every shard's;
    a paused pull pulls again with it), then its gradient's error and drop (:func:`_draw`),
    which it sends with the push (a lost push: headers alone); with a schedule, a staleness
    limit or a rule it waits for the coordinating server's decision on shard 0's part and
    carries it to the other parts (a discarded push: headers alone; the schedule's factor,
    then ``staleness_lr``'s, scale them; the factor on lr goes with them for DC-ASGD).
    Raises RuntimeError when the server is gone."""
    import torch
    import torch.distributed as dist

    from simulator.timing import sample_stream

    options = scenario.paramserver
    torch_dtype = getattr(torch, dtype)
    stream = sample_stream(scenario.run.seed, trainers, rank - 1, problem.n_samples)
    # version, granted, pause (ns), work unit, the run's clock origin (with pauses or deaths)
    reply = torch.zeros(5, dtype=torch.int64)
    straggles = Slowed(scenario.inject, rank - 1, 0)  # (its factor; the server runs the rest)
    # ADMM: the CPU workers' solver, on its own row of a local copy of the k rows of x (the
    # server keeps the others)
    solver = (_Solver(Consensus(torch.from_numpy(np.tile(problem.initial(), (trainers, 1)))),
                      scenario, problem, rank - 1, trainers)
              if scenario.run.protocol == "admm" else None)
    w = torch.zeros(problem.dim, dtype=torch_dtype)
    header = torch.zeros(_header_size(options.accumulate), dtype=torch.int64)
    wait = datetime.timedelta(seconds=timeout)
    shards = (ShardServers(trainers, options.servers, problem.dim, wait)
              if options.servers > 1 else None)  # a pool: shard 0 on rank 0, then these
    # A pool's trainer draws its own injections (the one server draws them itself).
    injector = None if shards is None else _injector(scenario, problem, trainers)
    decided = shards is not None and _decided(scenario)
    rounds = options.fraction > 0
    decision = torch.zeros(4, dtype=torch.float64)
    slots = options.accumulate  # (the header's, per gradient)
    delay: int | None = None
    chunks = (unit_chunks(problem.n_samples, scenario.sandblaster.units)
              if scenario.run.protocol == "sandblaster" else None)
    held: Slowed | None = None  # Sandblaster's pauses, on the server's clock

    def receive(tensor: Any) -> None:
        work: Any = dist.irecv(tensor, 0)
        work.wait(wait)

    while True:
        if delay is None:  # drawn as the simulator's read starts, once per update
            delay = (injector.delay(rank - 1) if injector is not None and injector.max_delay
                     else 0)
        header.zero_()
        header[:3] = torch.tensor([PULL, rank, delay])
        dist.send(header, 0)
        receive(reply)
        granted, hold = int(reply[1]), int(reply[2])
        if hold:  # an injected pause: pull again once it has passed
            time.sleep(hold / 1e9)
            continue
        if not granted:
            break
        receive(w if shards is None else w[:shards.first])
        if shards is not None:
            shards.pull(rank, w, delay)
        delay = None
        if chunks is not None and held is None and scenario.inject.pauses:
            held = Slowed(scenario.inject, rank - 1, int(reply[4]))
        local = w.numpy().astype(np.float64)
        drawn, pushed, spent, norms, lost = (
            _solve(solver, local, stream, straggles) if solver is not None
            else _unit(problem, chunks, int(reply[3]), local, straggles, held)
            if chunks is not None
            else _gradients(problem, scenario, local, granted, stream, straggles, injector,
                            rank - 1))
        step = torch.from_numpy(pushed).to(torch_dtype)
        header.zero_()
        header[:_HEADER + granted] = torch.tensor([PUSH, rank, int(reply[0]), granted, *drawn])
        at = _HEADER + slots
        header[at:at + granted] = torch.tensor(spent)
        if norms:  # (a pool's trainer's draws)
            header[at + slots:at + slots + granted] = torch.from_numpy(
                np.asarray(norms, dtype=np.float64).view(np.int64))
            header[at + 2 * slots:at + 2 * slots + granted] = torch.tensor(lost)
        # Lost in transit: no step goes anywhere (in rounds the coordinating server decides
        # on a round's whole write: every member's step goes).
        dropped = bool(lost and lost[-1]) and not rounds
        dist.send(header, 0)
        if not dropped:
            dist.send(step if shards is None else step[:shards.first], 0)
        if shards is not None:
            # (short of accumulate gradients: dropped by rank 0, a header alone elsewhere)
            fate = (ROUND if rounds else DISCARDED if granted < options.accumulate
                    else LOST if dropped else KEPT)
            scale = 1.0
            if decided and fate == KEPT:  # what the coordinating server decided at shard 0
                receive(decision)
                scheduled, ruled, discarded, scale = decision.tolist()
                fate = DISCARDED if discarded else KEPT
                rest = step.numpy()[shards.first:]
                rest *= scheduled  # (then the rule's factor, as the simulator scales a push)
                rest *= ruled
            shards.push(rank, step, fate, scale, round_=int(reply[0]))
        if solver is not None:  # its x_i, for the server's residuals
            dist.send(torch.from_numpy(solver.x), 0)
    header.zero_()
    header[:2] = torch.tensor([DONE, rank])
    dist.send(header, 0)
    if shards is not None:
        shards.done(rank)


def _gradients(problem: Problem, scenario: Scenario, local: np.ndarray, granted: int,
               stream: Any, straggles: Slowed, injector: Any = None, thread: int = 0
               ) -> tuple[list[int], np.ndarray, list[int], list[float], list[bool]]:
    """The ``granted`` gradients' samples, the push (their mean step, or with errors their
    steps apart: ``_apart``), each one's compute time and, with a pool trainer's
    ``injector``, each one's ‖e‖ and drop (:func:`_draw`, from ``thread``'s stream): each
    step lr·g at ``local`` (g with its error over its support), as the simulator's update
    computes it."""
    drawn, steps, spent, norms, lost = [], [], [], [], []
    lr = scenario.run.lr
    rounds = scenario.paramserver.fraction > 0  # (dense, as a simulated round's members)
    for _ in range(granted):
        began = time.monotonic_ns()
        drawn.append(int(stream.take()))
        if injector is None:
            steps.append(lr * problem.dense_grad(local, drawn[-1]))
        else:  # (dense with accumulate > 1, as the simulator's accumulated gradients)
            g, support = ((problem.dense_grad(local, drawn[-1]), None)
                          if scenario.paramserver.accumulate > 1 or rounds
                          else problem.grad(local, drawn[-1]))
            g, norm, dropped = _draw(injector, thread, g, local, support)
            g *= lr  # (a new array: the problem's, or g + e)
            if support is not None:
                g, values = np.zeros(problem.dim), g
                g[support] = values
            steps.append(g)
            norms.append(norm)
            lost.append(dropped)
        straggles.stretch(began)  # a straggler's compute takes factor times as long
        spent.append(time.monotonic_ns() - began)
    return (drawn, np.concatenate(steps) if _apart(scenario) else mean_step(steps), spent,
            norms, lost)


def _solve(solver: _Solver, z: np.ndarray, stream: Any, straggles: Slowed
           ) -> tuple[list[int], np.ndarray, list[int], list[float], list[bool]]:
    """ADMM's one update at the pulled ``z``: the row's sample (the first local one), the
    push (``simulator.rules.admm_push``, in place on the solver's x_i and u_i), the solve's
    compute time (a straggler's stretched, as a CPU worker's solve) and no draws (the
    server draws an ADMM push's)."""
    began = time.monotonic_ns()
    step, sample = solver.push(z, int(stream.take()))  # (the stream's: an empty shard's)
    straggles.stretch(began)
    return [sample], step, [time.monotonic_ns() - began], [], []


def _unit(problem: Problem, chunks: list[np.ndarray], unit: int, w: np.ndarray,
          straggles: Slowed, held: Slowed | None = None
          ) -> tuple[list[int], np.ndarray, list[int], list[float], list[bool]]:
    """Sandblaster's work unit ``unit`` at the pulled ``w``: the row's sample, the push (the
    unit's share of ∇f, ``unit_of``: the coordinator takes the units' mean, no learning
    rate yet), its compute time (a straggler's stretched) and no draws. ``held`` (injected
    pauses, on the server's clock): the trainer waits out a window before computing and
    before pushing, as the simulator's thread holds before its gradient and its write (the
    unit's hand-off to the coordinator, which its round waits for)."""
    if held is not None:
        held.hold()
    began = time.monotonic_ns()
    sample, g = unit_of(problem, chunks, unit, w)
    straggles.stretch(began)
    spent = time.monotonic_ns() - began
    if held is not None:
        held.hold()
    return [sample], g, [spent], [], []


@dataclass(frozen=True)
class PSRun:
    """A finished (or stopped) parameter-server run."""

    scenario: Scenario
    problem: Problem
    trace: Trace
    workers: int
    dtype: str
    seconds: float
    failure: dict[str, Any] | None
    pushes: int = 0
    hardware_loss: dict[str, Any] | None = None  # a lock-free server's, in measure mode


def _ps_scenario(scenario: Scenario, trainers: int, measure: bool,
                 timeout: float) -> Scenario:
    """The embedded scenario: what the server ran (``realrun.support.recorded``: ``admm`` or
    ``sandblaster`` where the scenario's protocol is, else ``paramserver``), after refusing
    what it would not honour.

    Raises:
        ScenarioError: a field the ps backend does not honour, or an injected pause as long
            as the receive timeout (the server would take the silence for a hung trainer).
    """
    protocol = scenario.run.protocol
    mode = protocol if protocol in ("admm", "sandblaster") else "paramserver"
    refuse_unsupported(scenario, "ps", mode)
    for i, pause in enumerate(scenario.inject.pauses):
        if pause.end - pause.start >= timeout * 1e9:
            raise ScenarioError(f"inject.pauses.{i}.end", pause.end, f"a pause of "
                                f"{(pause.end - pause.start) / 1e9:g} s reads as a hung "
                                f"trainer to a server whose receive timeout is {timeout:g} s")
    every = scenario.metrics.every
    scenario = recorded(scenario, mode, trainers, False, every if measure else None, "ps")
    preflight(scenario)  # the trace the server builds, as a simulation of it would hold
    return scenario


def _bound(scenario: Scenario, problem: Problem) -> None:
    """What the simulator's protocol checks against the problem, where the server's differs
    from the scenario's own checks: Sandblaster's units at most the problem's samples.

    Raises:
        ScenarioError: naming the field."""
    if scenario.run.protocol == "sandblaster":
        make_protocol("sandblaster", scenario).bind(problem)


def _group_timeout(timeout: float) -> datetime.timedelta:
    """The group's own timeout (joining, sends): the receive timeout, but at least 60 s, as
    spawned trainers take seconds to start."""
    return datetime.timedelta(seconds=max(timeout, 60.0))


def free_port() -> int:
    """A free TCP port on the loopback address (a local gloo group's rendezvous)."""
    with socket.socket() as s:
        s.bind((DEFAULT_ADDR, 0))
        return int(s.getsockname()[1])


def _trainer_main(rank: int, world: int, address: str, port: int, toml: str, dtype: str,
                  timeout: float, fingerprint: str = "") -> None:
    """A spawned local trainer: join the group, train, leave; one line if the server went."""
    import signal

    import torch
    import torch.distributed as dist

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    scenario = scenario_from_dict(tomllib.loads(toml))  # resolved by the server
    problem = make_problem(scenario.problem)
    one_thread_each()
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=world, timeout=_group_timeout(timeout))
    try:
        same_problem(problem, fingerprint, f"trainer {rank}")
    except ScenarioError as err:  # after joining: the server is told, and stops the run
        print(f"asyngrad ps trainer {rank}: {err}", file=sys.stderr)
        header = torch.zeros(_header_size(scenario.paramserver.accumulate), dtype=torch.int64)
        header[:2] = torch.tensor([REFUSED, rank])
        dist.send(header, 0)
        raise SystemExit(1) from None
    try:
        train(problem, scenario, rank, world - _servers(scenario),
              TRAINER_PATIENCE * timeout, dtype)
    except RuntimeError as err:
        print(f"asyngrad ps trainer {rank}: the server is gone ({_first_line(err)}); "
              "exiting", file=sys.stderr)
        os._exit(SERVER_GONE)
    dist.destroy_process_group()


def run_ps(scenario: Scenario, trainers: int, dtype: str = "float32",
           timeout: float | None = None, progress: Callable[[int], object] | None = None,
           measure: bool = False, problem: Problem | None = None,
           on_start: Callable[[list[int]], object] | None = None,
           limit: float | None = None) -> PSRun:
    """A parameter-server run on this machine: this process serves (rank 0) and K spawned
    trainers train, over gloo on loopback (``MASTER_ADDR`` / ``MASTER_PORT`` if set, else
    127.0.0.1 and a free port). ``timeout`` is the receive timeout (default 60 s): how long
    the server waits for a silent trainer; ``limit`` stops the run after that many seconds
    of serving, its partial trace kept (``asyngrad real --timeout``).

    Raises:
        ScenarioError: trainers < 1, an unknown dtype, timeout or limit <= 0, or a scenario
            field the ps backend does not honour (``realrun.support``).
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if trainers < 1:
        raise ScenarioError("--workers", trainers, "must be >= 1")
    _one_of("--dtype", dtype, DTYPES)
    for value in (timeout, limit):
        if value is not None and not value > 0:
            raise ScenarioError("--timeout", value, "must be > 0 seconds")
    timeout = 60.0 if timeout is None else timeout
    scenario = _ps_scenario(scenario, trainers, measure, timeout)
    problem = problem if problem is not None else make_problem(scenario.problem)
    if measure:
        refuse_unmeasurable(scenario, "paramserver", problem.sparse)
    _bound(scenario, problem)
    problem.optimum()
    address = os.environ.get("MASTER_ADDR", DEFAULT_ADDR)
    port = int(os.environ.get("MASTER_PORT", 0)) or free_port()
    toml = scenario_to_toml(scenario)
    context = mp.get_context("spawn")
    world = trainers + _servers(scenario)
    processes = [context.Process(target=_trainer_main, daemon=True, args=(
        rank, world, address, port, toml, dtype, timeout, problem.fingerprint()))
        for rank in range(1, trainers + 1)]
    pool = (_Pool.start(context, problem, scenario, trainers, address, port, dtype, timeout)
            if world > trainers + 1 else None)
    servers = [] if pool is None else pool.processes
    with one_thread_env():
        for process in [*processes, *servers]:
            process.start()
    if on_start:
        on_start([p.pid for p in [*processes, *servers] if p.pid is not None])
    started = time.monotonic()
    failure: dict[str, Any] | None = None
    pushes, loss = 0, None
    try:
        try:
            dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=0,
                                    world_size=world, timeout=_group_timeout(timeout))
        except (RuntimeError, ValueError) as err:
            raise AsyngradError(f"parameter server: cannot open {address}:{port} "
                                f"({_first_line(err)})") from None
        trace, failure, pushes, loss = serve(problem, scenario, trainers, timeout, progress,
                                             measure, dtype,
                                             dead=lambda: (_dead_trainer(processes)
                                                           or _dead_server(servers)),
                                             limit=limit, pool=pool)
    finally:
        if failure is not None:  # stop the others before the group goes
            for process in [*processes, *servers]:
                process.terminate()
        if dist.is_initialized():
            dist.destroy_process_group()
        for process in [*processes, *servers]:
            process.join(30.0 if failure is None else 0.5)  # (exiting is slow when busy)
            if process.is_alive():
                process.terminate()
                process.join(2.0)
    for rank, process in enumerate(processes, start=1):
        if failure is None and process.exitcode not in (0, None):
            failure = {"worker": rank - 1, "reason": f"trainer exited with {process.exitcode}"}
    return PSRun(scenario, problem, trace, trainers, dtype, time.monotonic() - started,
                 failure, pushes, loss)


def _servers(scenario: Scenario) -> int:
    """The server ranks: 1, or a pool's (``paramserver.servers`` > 1)."""
    return max(1, scenario.paramserver.servers)


@dataclass(frozen=True)
class _Pool:
    """A local run's pool of servers (``realrun.pool``): the shards as the trainers see
    them, the shard servers' processes (ranks K + 1 ...) and their records in shared
    memory."""

    shards: ShardServers
    processes: list[Any]
    buffers: list[ShardBuffers]

    @classmethod
    def start(cls, context: Any, problem: Problem, scenario: Scenario, trainers: int,
              address: str, port: int, dtype: str, timeout: float) -> _Pool:
        """The shard servers' records and processes (not started).

        Raises:
            ScenarioError: the records (every push's part: T·d values in all) cannot fit
                in this machine's memory.
        """
        servers, updates = scenario.paramserver.servers, scenario.run.updates
        check_memory({"paramserver.servers": float(updates * problem.dim
                                                   * np.dtype(dtype).itemsize)},
                      {"paramserver.servers": servers})
        shards = ShardServers(trainers, servers, problem.dim, _group_timeout(timeout))
        w0, bounds = problem.initial().astype(dtype), shards.bounds
        buffers = [ShardBuffers.allocate(updates, w0[bounds[s]:bounds[s + 1]])
                   for s in range(1, servers)]
        world = trainers + servers
        # A shard server hears nothing from a paused trainer (the coordinating server
        # answers its pulls): its receives wait out every pause besides the timeout.
        patience = timeout + sum(p.end - p.start for p in scenario.inject.pauses) / 1e9
        inject = scenario.inject
        dc = ((scenario.run.lr, scenario.dcasgd.lam)
              if scenario.paramserver.rule == "dcasgd" else None)
        return cls(shards, [context.Process(target=shard_main, daemon=True, args=(
            s, world, address, port, trainers, buffers[s - 1], patience,
            _group_timeout(patience), inject.write_bits, inject.max_delay, dc,
            _header_size(scenario.paramserver.accumulate)
            if scenario.paramserver.fraction > 0 else 0))
            for s in range(1, servers)], buffers)

    def trace(self, state: _Server, measure: bool, dtype: str, failed: bool
              ) -> tuple[Trace, dict[str, Any], dict[str, Any] | None]:
        """Once the shard servers are done (stopped, after a failure), the run's trace
        merged from every server's records (``realrun.pool.pool_trace``), what the rebuild
        and the servers' vector differ by, and a shard server's failure, if one failed."""
        for process in self.processes:  # (each ends once every trainer said it is done)
            if failed:
                process.terminate()
            process.join(30.0)
            if process.is_alive():
                process.terminate()
                process.join(2.0)
        stopped = None if failed else _dead_server(self.processes)
        # (in their order of application; a discarded one, or one short of ``accumulate``
        # gradients, as it arrived, with no part)
        pushes = sorted((p for p in state.pushes if p.applied or p.discarded),
                        key=lambda p: p.write_end)  # (a round's writer: its last member)

        def column(name: str) -> np.ndarray:
            return np.asarray([getattr(p, name) for p in pushes], dtype=np.int64)

        first = Applied(column("thread"), column("read_start"), column("read_end"),
                        column("arrival"), column("write_end"),
                        np.asarray([np.zeros_like(p.step) if p.discarded else p.step
                                    for p in pushes]).reshape(len(pushes), state.w.size),
                        column("discarded").astype(bool))

        def each(value: Callable[[_Push], Any]) -> list[list[Any]]:  # per thread, its order
            return [[value(p) for p in pushes if p.thread == t] for t in range(state.trainers)]

        return *pool_trace(state.problem, state.scenario,
                          [first, *(b.applied() for b in self.buffers)],
                          np.concatenate([state.w, *(b.w.numpy() for b in self.buffers)])
                          .astype(np.float64),
                          each(lambda p: p.samples), each(lambda p: p.grad_ns),
                          dtype, measure, sorted(state.dead), state.t0,
                          each(lambda p: p.scale),
                          each(lambda p: [(p.errors[j] if p.errors else 0.0,
                                           float(p.lost[j]) if p.lost else 0.0, p.delay)
                                          for j in range(len(p.samples))]),
                          state.retired,
                          each(lambda p: (p.applied if p.rounds else 0,
                                          p.rounds and p.applied > 0 and not p.member))
                          if state.scenario.paramserver.fraction > 0 else None), stopped


def _dead_server(processes: list[Any]) -> dict[str, Any] | None:
    """The first of a pool's shard server processes that ended with a non-zero status."""
    for shard, process in enumerate(processes, start=1):
        code = process.exitcode
        if code not in (None, 0):
            return {"worker": None, "reason": f"server {shard} died (exit code {code})"}
    return None


def _dead_trainer(processes: list[Any]) -> dict[str, Any] | None:
    """The first local trainer process that ended with a non-zero status, as a failure (one
    that left because it lost the server is a consequence, not a cause)."""
    for rank, process in enumerate(processes, start=1):
        code = process.exitcode
        if code not in (None, 0, SERVER_GONE):
            return {"worker": rank - 1, "reason": f"trainer {rank} died (exit code {code})"}
    return None


#: What a row of the server's trace is, by protocol (else a gradient).
ROWS = {"admm": "updates", "sandblaster": "work units"}


def summary_extra(run: PSRun) -> dict[str, Any]:
    """What summary.json adds for a parameter-server run (``updates`` are gradients, as
    everywhere, or ADMM's pushes; ``pushes`` the messages that carried them) and the options
    of its protocol (``[paramserver]`` or ``[admm]``)."""
    gradients = len(run.trace)
    discarded = int((run.trace["step"] == 0).sum())  # (injected drops: the summary's own)
    seconds = max(run.seconds, 1e-9)
    mode = run.scenario.run.protocol
    return {"real": {"backend": "ps", "mode": mode, "workers": run.workers,
                     "dtype": run.dtype, "wall_seconds": run.seconds, "pushes": run.pushes,
                     "pushes_per_wall_second": run.pushes / seconds,
                     "updates_per_wall_second": gradients / seconds,
                     "discarded_fraction": discarded / gradients if gradients else None,
                     "failure": run.failure, "hardware_loss": run.hardware_loss,
                     mode: dataclasses.asdict(getattr(run.scenario, mode))}}


def _node_main(argv: list[str] | None = None) -> int:
    """``python -m realrun.ps`` under torchrun: rank 0 serves and writes the run directory,
    the other ranks train."""
    import torch.distributed as dist

    from simulator.rundir import check_out, write_run
    from simulator.scenario import load_scenario

    parser = argparse.ArgumentParser(prog="python -m realrun.ps", description=__doc__
                                     .splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=None)
    parser.add_argument("--out", default="runs/ps")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--measure", action="store_true")
    args = parser.parse_args(argv)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        print("python -m realrun.ps: RANK and WORLD_SIZE must be set (start it with torchrun)",
              file=sys.stderr)
        return 2
    try:
        if world < 2:
            raise ScenarioError("WORLD_SIZE", world, "must be >= 2 (a server and a trainer)")
        _one_of("--dtype", args.dtype, DTYPES)
        # (checked at the trainers it runs, as the scenario will record: run.threads)
        scenario = _ps_scenario(load_scenario(args.scenario,
                                              [f"run.threads={world - 1}", *args.set]),
                                world - 1,
                                args.measure, args.timeout)
        if scenario.paramserver.servers > 1:
            raise ScenarioError("paramserver.servers", scenario.paramserver.servers,
                                "a pool of servers runs on one machine: asyngrad real "
                                "--backend ps --servers S")
        if scenario.run.protocol == "sandblaster" and scenario.inject.pauses:
            raise ScenarioError("inject.pauses", len(scenario.inject.pauses), "Sandblaster's "
                                "trainers hold their units on the server's clock: one "
                                "machine only (asyngrad real --backend ps)")
        problem = make_problem(scenario.problem)
        _bound(scenario, problem)
        if rank == 0:
            check_out(args.out)
            problem.optimum()
    except AsyngradError as err:
        print(f"python -m realrun.ps: error: {err}", file=sys.stderr)
        return 2
    try:
        dist.init_process_group("gloo", timeout=_group_timeout(args.timeout))
    except (RuntimeError, ValueError) as err:
        print(f"realrun.ps rank {rank}: cannot join the group ({_first_line(err)})",
              file=sys.stderr)
        return 1
    if rank > 0:
        try:
            train(problem, scenario, rank, world - 1, TRAINER_PATIENCE * args.timeout,
                  args.dtype)
        except RuntimeError as err:
            print(f"realrun.ps trainer {rank}: the server is gone ({_first_line(err)})",
                  file=sys.stderr)
            return 1
        dist.destroy_process_group()
        return 0
    print(f"realrun.ps: serving {world - 1} trainers", flush=True)
    started = time.monotonic()
    trace, failure, pushes, loss = serve(problem, scenario, world - 1, args.timeout, None,
                                         args.measure, args.dtype)
    run = PSRun(scenario, problem, trace, world - 1, args.dtype, time.monotonic() - started,
                failure, pushes, loss)
    write_run(args.out, scenario, trace, problem, extra=summary_extra(run))
    dist.destroy_process_group()
    if failure is not None:
        print(f"realrun.ps: stopped after {pushes} pushes ({failure['reason']}); partial "
              f"results in {args.out}/", file=sys.stderr)
        return 1
    rows = ROWS.get(scenario.run.protocol, "gradients")  # (a row each)
    print(f"realrun.ps: {len(trace)} {rows} in {pushes} pushes from {world - 1} trainers; "
          f"wrote {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(_node_main())
