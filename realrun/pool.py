"""A pool of parameter servers (``paramserver.servers`` S > 1) on torch.distributed (gloo).

The vector is cut into S shards, ``run.blocks`` = S of them (``simulator.memory
.block_bounds``); shard 0 lives on the coordinating server (rank 0, ``realrun.ps.serve``),
which also hands out the budget and runs the stalls, and shard s > 0 on its own server
process, rank K + s after the K trainers. A trainer pulls and pushes shard by shard, in
block order (rank 0 first, which grants the gradients, then each shard server), as a
simulated pull or push moves its blocks, each shard a message of its own; each server
serves the messages it receives one at a time, in arrival order, as the simulator's pool
(``simulator.clock.Pool``) serves the transfers each of its servers receives. A shard
server answers a pull with its shard and applies a push's part as it arrives; it decides
nothing on a push. What the simulator's server decides on a push with a pool is decided
where a real pool can decide it as the simulator does:

* the injections are the trainer's (``realrun.ps.train``): it draws each update's delay,
  error and drop from the simulator's injector stream of its thread, in the simulator's
  order, adds the error to its gradient before it pushes, and sends a dropped push to every
  server as a header alone (lost in transit: each server counts it as a version that changes
  nothing and records an empty part);
* a delayed pull (τ travels with it) gets from each server its shard as it was τ of that
  server's versions back (clipped at them): every server counts a version per push it
  receives, its part or a lost one's header, and keeps the shards of its last τ_max + 1
  versions. With one trainer every server's versions are the simulator's completions (a
  push reaches every server before its trainer's next pull), so the pulled vector is the
  simulator's w τ completions back; with several, each shard is τ pushes back on its own
  server, where the simulator's whole vector is as it was at one completion;
* the learning-rate schedule's factor is the coordinating server's, at m = the pushes it
  received + 1 when a push's shard 0 arrives (the simulator's server decides when a push's
  first shard has arrived): it scales its own part and sends the factor back to the
  trainer, which scales the other parts before it sends them;
* the staleness limit and the update rule are the coordinating server's too, with the
  push's staleness τ when its shard 0 arrives (the pushes it received since the trainer's
  pull, plus the pull's injected τ: the simulator's server decides at a push's first
  shard's arrival, with the completions since its read): a discarded push goes to every
  shard server as a header alone, which is no version (the simulator's discarded push
  stores nothing and completes nothing: an empty part in the records, flagged, and a row
  with ``step`` 0); ``staleness_lr``'s factor 1/τ goes back to the trainer with the
  schedule's, and the trainer scales the other parts by the one, then the other, as the
  simulator scales the whole push; ``dcasgd``'s correction λ·g⊙g⊙(w_now − w_read) is
  elementwise, so each server compensates its own part (``simulator.rules.dc_step``, at
  the rate the push took: lr times the schedule's factor, which travels with the part)
  towards its shard as the part arrives from the shard it answered that trainer's pull
  with (kept per trainer, float64). With one trainer that is the simulator's whole
  vector then, element by element; with several, each shard's w_now is its own server's
  when the part arrives, where the simulator's is the whole vector at shard 0's arrival;
* ``write_bits``: each server rounds every value of its shard after it applied a part (a
  sparse problem's untouched coordinates are 0 or rounded already: the simulator's rounding
  of what the push stored);
* a warm start and rebalancing are the coordinating server's, which answers every pull
  first, by the one server's code (``realrun.ps._warming``, ``realrun.ps._rebalance``):
  during a warm start of W it holds the other trainers' pulls back until trainer 0 pulls
  after its W-th completion, or is done. It counts a push when its shard 0 arrives, and
  trainer 0 pulls again only once every shard server has taken its push's last part (gloo
  sends data only to a receive its receiver posted), which the server applies before it
  serves a later message: so every released pull reads every shard after the W-th
  completion, as the simulator's pool releases them at the W-th completion (its last
  shard's). Rebalancing
  retires a trainer by the simulator's rule (``simulator.rules.retirements``), on each
  trainer's mean time per gradient from its pull's arrival to its push's shard 0
  application (the simulator's ends at its last shard's), and answers its next pull with
  no gradients, so it tells every server it is done (``extra_retired_threads``).

* accumulation (``accumulate`` n) is the one server's: the coordinating server grants at
  most n gradients per pull, the trainer computes them at the pulled vector (dense, each
  with its own draws) and pushes their mean shard by shard; a push the budget left short
  of n is dropped by the coordinating server and goes to every shard server as a header
  alone, which is no version (the simulator never pushes the gradients left pending).

* backup-worker rounds (``fraction`` p > 0) are the coordinating server's: it decides a
  round's members as the one server does and, when the round closes, tells every shard
  server its members, the schedule's factor and whether its write was lost; each trainer
  sends its parts tagged with the round it pulled, and a shard server applies the members'
  mean once they are all there, drops the other parts of the round and says so
  (``APPLIED``); the coordinating server holds every pull until each server applied the
  round (``serve_shard``; ``realrun.ps._close_round``, ``_applied``).

A lock-free server (updates that meet on a shard) is refused with a pool
(``realrun.support``).

Every server stamps its own pulls and pushes (``time.monotonic_ns``, one clock: the pool runs
on one machine) and keeps the part of each push it applied. When the run ends the parent
merges them with the CPU workers' merge (``realrun.timeline.merge``): a push's read ends
with its last shard's answer and it completes with its last shard's application, as a
simulated update with a block per server (an accumulated push is a row per gradient, as
the simulator's group: ``pool_trace``); the serialized view, and so the loss curve, is
rebuilt from the parts in each shard's order of application (``realrun.rebuild``), which
is the servers' own order: where a server stamped a part after the next server stamped the
next part of the same push, its stamps are raised into block order, as the trace's block
durations need, and the parts each server applied after it with them (``_raise``), so the
rebuilt final vector equals the servers' one to the bit, rounded stores included (the
summary's ``hardware_loss`` says how far apart they are). The pool is a local run's
(``asyngrad real --backend ps --servers S``): the shard servers keep their records in
shared memory the parent reads, also after a failure (a partial trace keeps the pushes
every server applied).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun.timeline import Measure, WorkerRecord, merge
from realrun.worker import one_thread_each
from simulator.memory import block_bounds
from simulator.problems import Problem
from simulator.rules import dc_step, mean_step, round_significand
from simulator.scenario import Scenario, scenario_to_toml
from simulator.trace import Trace

__all__ = ["DISCARDED", "KEPT", "LOST", "Applied", "ShardBuffers", "ShardServers",
           "pool_trace", "round_stored", "serve_shard", "shard_main"]

# A shard server's messages: kind, sender rank, a pull's injected delay τ (as drawn) or what
# becomes of a push (``KEPT``: its part follows; ``LOST`` in transit, ``DISCARDED`` by the
# coordinating server: no part follows), and the factor on lr a kept push took (float64
# bits: DC-ASGD's rate).
PULL, PUSH, DONE, CLOSE = 1, 2, 3, 4
APPLIED = 5  # to the coordinating server: a round is applied (``realrun.ps`` reads it too)
KEPT, LOST, DISCARDED, ROUND = 0, 1, 2, 3
POOL_GONE = 4  # a shard server's exit status when a receive failed or timed out


@dataclass(frozen=True)
class Applied:
    """One server's pushes, in the order it applied them: the trainer (thread), when the
    pull the push was computed on arrived and was answered, when the push arrived and was
    applied (ns), the part of the step it subtracted (rows) and whether the coordinating
    server discarded the push (its part is empty and it is no version)."""

    thread: np.ndarray
    pull_arrival: np.ndarray
    pull_answer: np.ndarray
    arrival: np.ndarray
    applied: np.ndarray
    parts: np.ndarray
    discarded: np.ndarray


@dataclass(frozen=True)
class ShardBuffers:
    """A shard server's records, in shared memory that the parent reads when the run ends
    (whatever it wrote by then, if it was stopped): per push it applied, ``rows`` (thread,
    pull arrival, pull answer, push arrival, applied: ns; discarded) and ``parts`` (the part
    it subtracted); ``count`` the pushes written; ``w`` the shard itself, which it updates in
    place."""

    rows: Any
    parts: Any
    count: Any
    w: Any

    @classmethod
    def allocate(cls, pushes: int, shard: np.ndarray) -> ShardBuffers:
        import torch

        w = torch.from_numpy(shard.copy())
        return cls(torch.zeros((pushes, 6), dtype=torch.int64).share_memory_(),
                   torch.zeros((pushes, w.numel()), dtype=w.dtype).share_memory_(),
                   torch.zeros(1, dtype=torch.int64).share_memory_(), w.share_memory_())

    def applied(self) -> Applied:
        n = int(self.count[0])
        rows = self.rows[:n].numpy().T
        return Applied(rows[0], rows[1], rows[2], rows[3], rows[4], self.parts[:n].numpy(),
                       rows[5].astype(bool))


def round_stored(values: np.ndarray, bits: int) -> None:
    """``inject.write_bits``: round stored ``values`` in place to ``bits`` significand bits,
    in float64 whatever their dtype, as the simulator's memory rounds what a store left."""
    if values.dtype == np.float64:
        round_significand(values, bits)
        return
    rounded = values.astype(np.float64)
    round_significand(rounded, bits)
    np.copyto(values, rounded, casting="same_kind")


def serve_shard(buffers: ShardBuffers, trainers: int, timeout: float, bits: int = 0,
                max_delay: int = 0, dc: tuple[float, float] | None = None,
                rounds: int = 0) -> None:
    """A shard server's loop (rank K + s of an initialised gloo group): answer each trainer's
    pull with the shard, subtract each push's part as it arrives (rounding the shard to
    ``bits`` significand bits after it, ``inject.write_bits``; a lost or discarded push's
    header: nothing), and record it (:class:`ShardBuffers`), until every trainer is done.
    Each push received is a version, but a discarded one; with injected delays
    (``max_delay`` > 0) it keeps the shards of its last ``max_delay`` + 1 versions and
    answers a pull that asks for τ with the shard τ versions back (clipped at its
    versions). ``dc`` (lr, λ): ``paramserver.rule = "dcasgd"``, each part compensated
    towards the shard now from the one its trainer's pull was answered with
    (``simulator.rules.dc_step``, at lr times the factor the push took).

    ``rounds`` (``paramserver.fraction`` > 0: the size of the coordinating server's
    header): a version is a round. A part comes tagged with the round its trainer pulled
    and is held; the coordinating server says when a round closed (``CLOSE``: its members
    in order, the schedule's factor, and whether its write was lost), and once every
    member's part is here the server subtracts their mean (the factor on it), records the
    members (the last, the writer, with the mean; the others with nothing), drops the parts
    held that were not members, as it drops one that comes for a round already applied,
    and tells the coordinating server (``APPLIED``), which holds every pull until each
    server has applied the round (the simulator's rounds: no read overlaps a round's
    write).

    Raises:
        RuntimeError: a receive or a send failed or timed out.
    """
    import torch
    import torch.distributed as dist

    shard = _Shard(buffers, datetime.timedelta(seconds=timeout), bits, max_delay, dc,
                   trainers if rounds else 0, rounds)
    header = torch.zeros(4, dtype=torch.int64)
    done: set[int] = set()
    while len(done) < trainers:
        work: Any = dist.irecv(header)
        work.wait(shard.wait)
        kind, source, arrived = int(header[0]), int(header[1]), time.monotonic_ns()
        if kind == PULL:
            shard.pull(source, int(header[2]), arrived)
        elif kind == PUSH:
            shard.push(source, int(header[2]), header[3:].numpy().copy(), arrived)
        elif kind == CLOSE:
            shard.close(int(header[2]), float(header[3:].numpy().view(np.float64)[0]))
        elif kind == DONE:
            done.add(source)


class _Shard:
    """A shard server's state (:func:`serve_shard`)."""

    def __init__(self, buffers: ShardBuffers, wait: datetime.timedelta, bits: int,
                 max_delay: int, dc: tuple[float, float] | None, trainers: int,
                 ack: int) -> None:
        import torch

        self.buffers, self.wait, self.bits, self.dc = buffers, wait, bits, dc
        self.w = buffers.w
        self.part = torch.zeros_like(self.w)
        self.pulled: dict[int, tuple[int, int]] = {}  # rank: its last pull's arrival, answer
        self.sent: dict[int, np.ndarray] = {}  # dcasgd: rank: the shard its pull got
        self.work = (np.zeros(self.w.numel()), np.zeros(self.w.numel()))  # (dc_step's)
        # ring[v mod H]: version v's shard
        self.ring = self.w.repeat(max_delay + 1, 1) if max_delay else None
        self.versions = 0
        # rounds: the closing round's message (trainers + 1: lost, then its members), the
        # parts held (rank: part, arrival, round, its pull's arrival and answer), and what
        # tells the coordinating server a round is applied (its header's size)
        self.closing = torch.zeros(trainers + 1, dtype=torch.int64) if trainers else None
        self.closed: tuple[float, bool, list[int]] | None = None  # factor, lost, members
        self.held: dict[int, tuple[np.ndarray, int, int, tuple[int, int]]] = {}
        self.ack = torch.zeros(ack, dtype=torch.int64)

    def pull(self, source: int, tau: int, arrived: int) -> None:
        """Answer a pull with the shard, τ versions back."""
        import torch.distributed as dist

        shard = self.w if self.ring is None else self.ring[
            (self.versions - min(tau, self.versions)) % len(self.ring)]
        if self.dc is not None:
            self.sent[source] = shard.numpy().astype(np.float64)
        work: Any = dist.isend(shard, source)
        work.wait(self.wait)
        self.pulled[source] = (arrived, time.monotonic_ns())

    def push(self, source: int, fate: int, value: np.ndarray, arrived: int) -> None:
        """A push's header (``fate``; ``value``: the factor on lr the push took, float64
        bits, or with rounds the round it was computed for) and its part, if one follows."""
        import torch.distributed as dist

        if fate in (LOST, DISCARDED):  # lost in transit (a version that changes nothing),
            self.part.zero_()  # or discarded (no version)
            if fate == LOST:
                self._version()
            self._record(source, self.pulled[source], arrived, discarded=fate == DISCARDED)
            return
        work: Any = dist.irecv(self.part, source)
        work.wait(self.wait)
        arrived = time.monotonic_ns()
        if fate == ROUND:
            self._hold(source, int(value[0]), arrived)
            return
        if self.dc is not None:
            _compensate(self.part.numpy(), self.w.numpy(), self.sent[source], self.dc,
                        value.view(np.float64)[0], self.work)
        self._apply(self.part)
        self._record(source, self.pulled[source], arrived)

    def _apply(self, step: Any) -> None:
        """Subtract ``step``, round the shard's stores, count the version."""
        self.w -= step
        if self.bits:
            round_stored(self.w.numpy(), self.bits)
        self._version()

    def _version(self) -> None:
        self.versions += 1
        if self.ring is not None:
            self.ring[self.versions % len(self.ring)] = self.w

    def _record(self, source: int, pulled: tuple[int, int], arrived: int,
                discarded: bool = False, part: Any = None) -> None:
        """Write one push's record: ``part`` (default: the part received) applied now."""
        import torch

        buffers = self.buffers
        n = int(buffers.count[0])
        buffers.rows[n] = torch.tensor([source - 1, *pulled, arrived, time.monotonic_ns(),
                                        int(discarded)])
        buffers.parts[n] = self.part if part is None else part
        buffers.count[0] = n + 1

    def _hold(self, source: int, round_: int, arrived: int) -> None:
        """Hold a round's part until the round closes here (one for a round applied
        already came too late: dropped now)."""
        if round_ < self.versions:
            self.part.zero_()
            self._record(source, self.pulled[source], arrived, discarded=True)
            return
        self.held[source] = (self.part.numpy().copy(), arrived, round_, self.pulled[source])
        self._apply_round()

    def close(self, members: int, factor: float) -> None:
        """The coordinating server closed the open round: its message follows."""
        import torch.distributed as dist

        assert self.closing is not None
        work: Any = dist.irecv(self.closing, 0)
        work.wait(self.wait)
        lost, *ranks = self.closing.tolist()
        self.closed = (factor, bool(lost), [r + 1 for r in ranks[:members]])
        self._apply_round()

    def _apply_round(self) -> None:
        """Apply the closed round once every member's part is here: the held parts that
        are no members are dropped, the members' mean (times the factor) subtracted unless
        its write was lost; then tell the coordinating server."""
        import torch
        import torch.distributed as dist

        if self.closed is None:
            return
        factor, lost, members = self.closed
        if any(rank not in self.held for rank in members):
            return
        for rank in [r for r in self.held if r not in members]:
            _, arrived, _, pulled = self.held.pop(rank)
            self._record(rank, pulled, arrived, discarded=True,
                         part=torch.zeros_like(self.w))
        mean = torch.from_numpy(mean_step([self.held[rank][0] for rank in members]) * factor)
        if lost:
            mean.zero_()
            self._version()
        else:
            self._apply(mean)
        nothing = torch.zeros_like(self.w)
        for rank in members:
            _, arrived, _, pulled = self.held.pop(rank)
            self._record(rank, pulled, arrived, part=mean if rank == members[-1] else nothing)
        self.closed = None
        self.ack[:2] = torch.tensor([APPLIED, dist.get_rank()])
        work: Any = dist.isend(self.ack, 0)
        work.wait(self.wait)


def _compensate(part: np.ndarray, w: np.ndarray, read: np.ndarray, dc: tuple[float, float],
                scale: float, work: tuple[np.ndarray, np.ndarray]) -> None:
    """DC-ASGD on a shard server: ``part`` (in place) compensated towards its shard ``w``
    from ``read``, the shard its trainer pulled, at lr·``scale`` (the rate the push took),
    λ = ``dc[1]``: the simulator's ``dc_step`` on these coordinates, which is elementwise."""
    lr, lam = dc
    compensated = dc_step(part.astype(np.float64), lr * scale, w.astype(np.float64), read,
                          lam, work)
    np.copyto(part, compensated, casting="same_kind")


class ShardServers:
    """A trainer's side of the pool: the shard servers' ranks and the slices of the vector
    they hold (shard 0 is the coordinating server's, rank 0). A trainer goes shard by shard,
    in block order, as the simulator's pulls and pushes do: rank 0 first (which grants the
    gradients), then each shard server."""

    def __init__(self, trainers: int, servers: int, dim: int,
                 timeout: datetime.timedelta) -> None:
        self.bounds = block_bounds(dim, servers)
        self.ranks = [trainers + s for s in range(1, servers)]
        self.timeout = timeout

    @property
    def first(self) -> int:
        """The size of shard 0 (the coordinating server's)."""
        return self.bounds[1]

    def _each(self, kind: int, rank: int, vector: Any, value: int, receive: bool,
              extra: int = 0) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor([kind, rank, value, extra], dtype=torch.int64)
        for s, server in enumerate(self.ranks, start=1):
            dist.send(header, server)
            if kind == PUSH and value in (LOST, DISCARDED):  # the header alone
                continue
            part = vector[self.bounds[s]:self.bounds[s + 1]]
            work: Any = dist.irecv(part, server) if receive else dist.isend(part, server)
            work.wait(self.timeout)

    def pull(self, rank: int, w: Any, delay: int = 0) -> None:
        """Pull every shard server's shard into its slice of ``w``, one after the other
        (``delay``: the injected τ drawn for the pull; each server clips it at its
        versions)."""
        self._each(PULL, rank, w, delay, receive=True)

    def push(self, rank: int, step: Any, fate: int = KEPT, scale: float = 1.0,
             round_: int = 0) -> None:
        """Push every shard server its part of ``step``, one after the other; ``fate``
        ``LOST``: lost in transit, which every server counts as a version that changes
        nothing; ``DISCARDED`` by the coordinating server: no version; ``ROUND``: a part for
        ``round_``, held until the round closes. ``scale``: the factor on lr the push took
        (DC-ASGD's rate on the shard servers)."""
        self._each(PUSH, rank, step, fate, receive=False,
                   extra=round_ if fate == ROUND else int(np.float64(scale).view(np.int64)))

    def close(self, members: list[int], factor: float, lost: bool, trainers: int) -> None:
        """From the coordinating server: the open round closed with ``members`` (threads,
        in order, the writer last), the schedule's ``factor`` on its mean, and whether its
        write is ``lost``."""
        import torch
        import torch.distributed as dist

        header = torch.tensor([CLOSE, 0, len(members), int(np.float64(factor).view(np.int64))],
                              dtype=torch.int64)
        message = torch.full((trainers + 1,), -1, dtype=torch.int64)
        message[:1 + len(members)] = torch.tensor([int(lost), *members])
        for server in self.ranks:
            dist.send(header, server)
            dist.send(message, server)

    def done(self, rank: int) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor([DONE, rank, 0, 0], dtype=torch.int64)
        for server in self.ranks:
            dist.send(header, server)


def shard_main(shard: int, world: int, address: str, port: int, trainers: int,
               buffers: ShardBuffers, timeout: float,
               group_timeout: datetime.timedelta, bits: int = 0, max_delay: int = 0,
               dc: tuple[float, float] | None = None, rounds: int = 0) -> None:
    """A spawned shard server: join the group, serve (:func:`serve_shard`), leave; one line
    if a peer went."""
    import signal

    import torch.distributed as dist

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    one_thread_each()
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}",
                            rank=trainers + shard, world_size=world, timeout=group_timeout)
    try:
        serve_shard(buffers, trainers, timeout, bits, max_delay, dc, rounds)
    except RuntimeError as err:
        print(f"asyngrad ps server {shard}: {str(err).strip().splitlines()[0][:200]}; "
              "exiting", file=sys.stderr)
        os._exit(POOL_GONE)
    dist.destroy_process_group()


def pool_trace(problem: Problem, scenario: Scenario, shards: list[Applied],
               w_final: np.ndarray, samples: list[list[list[int]]],
               grad_ns: list[list[list[int]]], dtype: str, measure: bool, dead: list[int],
               origin: int | None, scales: list[list[float]] | None = None,
               injected: list[list[list[tuple[float, float, int]]]] | None = None,
               retired: list[int] | None = None,
               rounds: list[list[tuple[int, bool]]] | None = None
               ) -> tuple[Trace, dict[str, Any]]:
    """The run's trace, merged from every server's records (``shards``, in shard order) and
    each trainer's pushes, in its order: per push its gradients' ``samples`` and compute
    times, its ``scales`` (the factor on lr: the schedule's, a rule's) and per gradient
    ``injected`` (‖e‖, 1.0 if lost, τ) (a push the coordinating server discarded, or one
    the budget left short of ``accumulate`` gradients: rows with ``step`` 0 that store
    nothing); and what the hardware lost (the rebuilt final vector against the servers'
    ``w_final``, rounded as the servers rounded their stores). A push of n gradients is n
    rows, as the simulator's accumulated group: its first reads, each computes after the
    one before it, its last writes the push and the others share its completion
    (``realrun.timeline.merge``'s members). ``origin``: the trace's time 0 (the first
    pull's arrival where stalls count from it; None: the first read's start).
    ``retired``: the trainers the coordinating server retired (``paramserver.rebalance``:
    ``extra_retired_threads``, as the simulator's paramserver records them). ``rounds``
    (``paramserver.fraction`` > 0): per push, the completion of the round it joined (0:
    none) and whether it wrote it; a round's other members store nothing and share its
    writer's completion, as the simulator's round (``realrun.timeline.merge``'s
    ``writers``)."""
    servers = len(shards)
    bounds = block_bounds(problem.dim, servers)
    timelines, steps, discarded, spent = [], [], [], []
    for thread, pushed in enumerate(grad_ns):
        # Its pushes every server applied (a run that stopped may have left its last ones
        # on some servers only: left out, as pushes that never completed).
        n = min(len(pushed), *(int((shard.thread == thread).sum()) for shard in shards))
        starts, copy_end, arrivals, store_end = (np.zeros((n, servers), dtype=np.int64)
                                                 for _ in range(4))
        step = np.zeros((n, problem.dim), dtype=dtype)
        for s, shard in enumerate(shards):
            mine = np.flatnonzero(shard.thread == thread)[:n]  # its pushes, in its order
            starts[:, s], copy_end[:, s] = shard.pull_arrival[mine], shard.pull_answer[mine]
            arrivals[:, s], store_end[:, s] = shard.arrival[mine], shard.applied[mine]
            step[:, bounds[s]:bounds[s + 1]] = shard.parts[mine]
            if s == 0:  # (the coordinating server's decision)
                discarded.append(shard.discarded[mine])
        if rounds is not None:
            # A server stamps an answer once its send returned, which under load can be
            # after the trainer, which had the shard, pushed to the coordinating server:
            # lowered to that arrival, so the round's members end their gradients in the
            # order the coordinating server saw them join (the last, its writer, last).
            np.minimum(copy_end, arrivals[:, :1], out=copy_end)
        # Its compute, from the last shard's answer, ends by its first part's arrival.
        read_end = copy_end.max(axis=1)
        spent.append([np.cumsum(ns, dtype=np.int64) for ns in pushed[:n]])
        total = np.asarray([ends[-1] for ends in spent[-1]], dtype=np.int64)
        # In rounds it ends at that arrival, where the coordinating server saw it join its
        # round (the last to arrive writes it, as the simulator's last to end its gradient;
        # the one server's rounds place it so too).
        grad_end = np.maximum(arrivals[:, 0] if rounds is not None
                              else np.minimum(read_end + total, arrivals[:, 0]), read_end)
        # The trainer's events in its order: its pull's start, each shard's answer, its
        # compute's end, each part's application (then its next pull).
        timelines.append(np.concatenate([starts.min(axis=1)[:, None], copy_end,
                                         grad_end[:, None], store_end], axis=1))
        steps.append(step)
    _raise(timelines, shards)
    if rounds is not None:  # a push too late for its round: its write ends as it joined none
        for events, late in zip(timelines, discarded, strict=True):
            events[late, -len(shards):] = events[late, len(shards) + 1][:, None]
    silent = [d.copy() for d in discarded]  # (pushes that store nothing: a round's members)
    if rounds is not None:
        for thread, flags in enumerate(rounds):
            silent[thread] |= [joined > 0 and not wrote
                               for joined, wrote in flags[:len(silent[thread])]]
    records = [_gradient_rows(events, discarded[thread], spent[thread], samples[thread],
                              None if scales is None else scales[thread],
                              None if injected is None else injected[thread],
                              silent[thread])
               for thread, events in enumerate(timelines)]
    # Each row's step (the rebuild's): a push's on its writer's row, 0 on its members'.
    rows = [np.cumsum([len(ends) for ends in pushes], dtype=np.int64) - 1
            for pushes in spent]
    row_steps = []
    for step, last, record in zip(steps, rows, records, strict=True):
        full = np.zeros((len(record.samples), problem.dim), dtype=dtype)
        full[last] = step
        row_steps.append(full)
    metrics = scenario.metrics
    trace, loss = merge(records, problem.initial(), w_final, [], scenario_to_toml(scenario),
                        Measure(problem, scenario.run.lr, bounds, dtype, metrics.every,
                                metrics.curve_points, scenario.inject.write_bits, row_steps,
                                exact=measure),
                        dead=dead, origin=origin,
                        writers=None if rounds is None else _writers(rounds, records))
    assert loss is not None
    arrays = {**trace.arrays,
              "extra_retired_threads": np.asarray(retired or [], dtype=np.int64)}
    return dataclasses.replace(trace, arrays=arrays), loss


def _writers(rounds: list[list[tuple[int, bool]]], records: list[WorkerRecord]
             ) -> np.ndarray:
    """Per row, stacked as ``merge`` stacks the records (one row per push: rounds take one
    gradient each), the row that writes its round (its own where it joined none). A member
    whose round's writer has no row (a run stopped before every server applied the
    writer's push) is marked discarded in its record: no row of it completes the round."""
    sizes = [len(r.samples) for r in records]
    offsets = np.cumsum([0, *sizes])
    writers = np.arange(int(offsets[-1]))
    joined = np.zeros(writers.size, dtype=np.int64)
    writer_of: dict[int, int] = {}
    for thread, flags in enumerate(rounds):
        for i, (completion, wrote) in enumerate(flags[:sizes[thread]]):
            joined[offsets[thread] + i] = completion
            if wrote:
                writer_of[completion] = int(offsets[thread] + i)
    writes = set(writer_of.values())
    for row in np.flatnonzero(joined).tolist():
        writers[row] = writer_of.get(int(joined[row]), row)
        if row not in writes and writers[row] == row:  # (its round's writer is cut)
            thread = int(np.searchsorted(offsets, row, side="right")) - 1
            discarded = records[thread].discarded
            assert discarded is not None
            discarded[row - offsets[thread]] = True
    return writers


def _gradient_rows(events: np.ndarray, discarded: np.ndarray, spent: list[np.ndarray],
                   samples: list[list[int]], scales: list[float] | None,
                   injected: list[list[tuple[float, float, int]]] | None,
                   silent: np.ndarray) -> WorkerRecord:
    """One trainer's rows, a gradient each, from its pushes' ``events`` (raised: pull start,
    each shard's answer, compute end, each part's application): a push's first gradient
    reads (its shards' answers), each gradient computes from the end of the one before it
    (``spent``: the compute times summed, placed in the push's window, the last ending with
    the push's compute), and its last one writes (each part's application; a discarded
    push's write ends with its last header's arrival and stores nothing), the others are
    the push's members (``realrun.timeline.merge``); a ``silent`` push (discarded, or a
    round's member) stores nothing."""
    servers = (events.shape[1] - 2) // 2
    read_end, grad_end = events[:, servers], events[:, servers + 1]
    copy_end, store_end = events[:, 1:servers + 1], events[:, servers + 2:]
    times, copies, stores = [], [], []
    for i, ends in enumerate(spent):
        k = len(ends)
        computed = np.minimum(read_end[i] + ends, grad_end[i])
        computed[-1] = grad_end[i]
        begun = np.concatenate([[read_end[i]], computed[:-1]])
        times.append(np.stack([np.concatenate([[events[i, 0]], begun[1:]]), begun, computed,
                               np.full(k, store_end[i, -1])], axis=1))
        copies.append(np.full((k, servers), -1, dtype=np.int64))
        copies[-1][0] = copy_end[i]
        stores.append(np.full((k, servers), -1, dtype=np.int64))
        if not silent[i]:
            stores[-1][-1] = store_end[i]
    sizes = [len(ends) for ends in spent]
    last = np.cumsum(sizes, dtype=np.int64) - 1
    member = np.ones(int(sum(sizes)), dtype=bool)
    member[last] = False
    scale = None
    if scales is not None:
        scale = np.ones(member.size)
        scale[last] = scales[:len(sizes)]
    return WorkerRecord(
        np.concatenate(times) if times else np.zeros((0, 4), dtype=np.int64),
        np.concatenate(copies) if copies else np.zeros((0, servers), dtype=np.int64),
        np.concatenate(stores) if stores else np.zeros((0, servers), dtype=np.int64),
        np.asarray([s for pushed in samples[:len(sizes)] for s in pushed], dtype=np.int64),
        scale,
        None if injected is None else np.asarray(
            [row for pushed in injected[:len(sizes)] for row in pushed],
            dtype=np.float64).reshape(-1, 3),
        discarded=np.repeat(discarded, sizes), member=member)


def _raise(timelines: list[np.ndarray], shards: list[Applied], rounds: int = 100) -> None:
    """Raise the stamps of every trainer's events (``timelines``, a row per push: pull start,
    each shard's answer, compute end, each part's application) in place until each is at
    least the latest before it in its trainer's order, and each part's application later
    than the part its server applied before it (``shards``: each server's records, in its
    order of application), which the trace's block durations and the rebuild's order need:
    a server stamps an answer or an application after the send that carried it returned, so
    the next server, or the trainer's next pull, can stamp earlier; raised, a part could
    pass another one its server applied later, and the rebuild, which applies each shard's
    parts in their stamps' order, would round them in another order than the server did (a
    rounding step apart with ``write_bits``). Each sweep only raises, and they end once both
    orders hold, which they do together in real time unless a server took a later message
    first; after ``rounds`` sweeps the trainers' order alone is kept."""
    servers = len(shards)
    sizes = [len(events) for events in timelines]
    starts = np.cumsum([0, *sizes])
    flat = np.concatenate(timelines) if timelines else np.zeros((0, 2 * servers + 2), np.int64)
    orders = []  # per server: the rows of the parts it applied, in its order
    for shard in shards:
        seq = np.zeros(len(shard.thread), dtype=np.int64)
        for thread in range(len(timelines)):
            mine = shard.thread == thread
            seq[mine] = np.arange(int(mine.sum()))
        kept = seq < np.asarray(sizes, dtype=np.int64)[shard.thread]
        orders.append(starts[shard.thread[kept]] + seq[kept])
    spans = list(itertools.pairwise(starts.tolist()))

    def each_trainer() -> None:
        for lo, hi in spans:
            flat[lo:hi] = np.maximum.accumulate(flat[lo:hi].ravel()).reshape(hi - lo,
                                                                             flat.shape[1])

    for _ in range(rounds):
        each_trainer()
        moved = False
        for s, rows in enumerate(orders):
            column, k = servers + 2 + s, np.arange(len(rows))
            applied = flat[rows, column]
            raised = np.maximum.accumulate(applied - k) + k  # (strictly increasing)
            if (raised != applied).any():
                flat[rows, column], moved = raised, True
        if not moved:
            break
    else:
        each_trainer()
    for events, (lo, hi) in zip(timelines, spans, strict=True):
        events[:] = flat[lo:hi]
