"""A pool of parameter servers (``paramserver.servers`` S > 1) on torch.distributed (gloo).

The vector is cut into S shards, ``run.blocks`` = S of them (``simulator.memory
.block_bounds``); shard 0 lives on the coordinating server (rank 0, ``realrun.ps.serve``),
which also hands out the budget and runs the stalls, and shard s > 0 on its own server
process, rank K + s after the K trainers. A trainer pulls and pushes shard by shard, in
block order (rank 0 first, which grants the gradients, then each shard server), as a
simulated pull or push moves its blocks, each shard a message of its own; each server
serves the messages it receives one at a time, in arrival order, as the simulator's pool
(``simulator.clock.Pool``) serves the transfers each of its servers receives. A shard
server answers a pull with its shard and applies a push's part as it arrives: it decides
nothing, so the options that decide on a push (a staleness limit, a rule, a schedule,
rounds, injected errors, drops, delays, rounding, a lock-free server, rebalancing, a warm
start) and accumulation are refused with a pool (``realrun.support``).

Every server stamps its own pulls and pushes (``time.monotonic_ns``, one clock: the pool runs
on one machine) and keeps the part of each push it applied. When the run ends the parent
merges them with the CPU workers' merge (``realrun.timeline.merge``): a push's read ends
with its last shard's answer and it completes with its last shard's application, as a
simulated update with a block per server; the serialized view, and so the loss curve, is
rebuilt from the parts in each shard's order of application (``realrun.rebuild``), which
is the servers' own order: the rebuilt final vector equals the servers' one (to the bit
unless a server applied a part after the next server applied the next part of the same push:
its stamps are then put in block order, as the trace's block durations need), and the
summary's ``hardware_loss`` says how far apart they are. The pool is a local run's
(``asyngrad real --backend ps --servers S``): the shard servers keep their records in
shared memory the parent reads, also after a failure (a partial trace keeps the pushes
every server applied).
"""

from __future__ import annotations

import datetime
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
from simulator.scenario import Scenario, scenario_to_toml
from simulator.trace import Trace

__all__ = ["Applied", "ShardBuffers", "ShardServers", "pool_trace", "serve_shard",
           "shard_main"]

PULL, PUSH, DONE = 1, 2, 3  # a shard server's messages: kind, sender rank
POOL_GONE = 4  # a shard server's exit status when a receive failed or timed out


@dataclass(frozen=True)
class Applied:
    """One server's pushes, in the order it applied them: the trainer (thread), when the
    pull the push was computed on arrived and was answered, when the push arrived and was
    applied (ns), and the part of the step it subtracted (rows)."""

    thread: np.ndarray
    pull_arrival: np.ndarray
    pull_answer: np.ndarray
    arrival: np.ndarray
    applied: np.ndarray
    parts: np.ndarray


@dataclass(frozen=True)
class ShardBuffers:
    """A shard server's records, in shared memory that the parent reads when the run ends
    (whatever it wrote by then, if it was stopped): per push it applied, ``rows`` (thread,
    pull arrival, pull answer, push arrival, applied: ns) and ``parts`` (the part it
    subtracted); ``count`` the pushes written; ``w`` the shard itself, which it updates in
    place."""

    rows: Any
    parts: Any
    count: Any
    w: Any

    @classmethod
    def allocate(cls, pushes: int, shard: np.ndarray) -> ShardBuffers:
        import torch

        w = torch.from_numpy(shard.copy())
        return cls(torch.zeros((pushes, 5), dtype=torch.int64).share_memory_(),
                   torch.zeros((pushes, w.numel()), dtype=w.dtype).share_memory_(),
                   torch.zeros(1, dtype=torch.int64).share_memory_(), w.share_memory_())

    def applied(self) -> Applied:
        n = int(self.count[0])
        rows = self.rows[:n].numpy().T
        return Applied(rows[0], rows[1], rows[2], rows[3], rows[4], self.parts[:n].numpy())


def serve_shard(buffers: ShardBuffers, trainers: int, timeout: float) -> None:
    """A shard server's loop (rank K + s of an initialised gloo group): answer each trainer's
    pull with the shard, subtract each push's part as it arrives, and record it
    (:class:`ShardBuffers`), until every trainer is done.

    Raises:
        RuntimeError: a receive or a send failed or timed out.
    """
    import torch
    import torch.distributed as dist

    w, rows, parts, count = buffers.w, buffers.rows, buffers.parts, buffers.count
    part = torch.zeros_like(w)
    header = torch.zeros(2, dtype=torch.int64)
    wait = datetime.timedelta(seconds=timeout)
    pulled: dict[int, tuple[int, int]] = {}  # rank: its last pull's arrival and answer
    done: set[int] = set()
    while len(done) < trainers:
        work: Any = dist.irecv(header)
        work.wait(wait)
        kind, source, arrived = int(header[0]), int(header[1]), time.monotonic_ns()
        if kind == PULL:
            work = dist.isend(w, source)
            work.wait(wait)
            pulled[source] = (arrived, time.monotonic_ns())
        elif kind == PUSH:
            work = dist.irecv(part, source)
            work.wait(wait)
            arrived = time.monotonic_ns()
            w -= part
            n = int(count[0])
            rows[n] = torch.tensor([source - 1, *pulled[source], arrived, time.monotonic_ns()])
            parts[n] = part
            count[0] = n + 1
        elif kind == DONE:
            done.add(source)


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

    def _each(self, kind: int, rank: int, vector: Any, receive: bool) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor([kind, rank], dtype=torch.int64)
        for s, server in enumerate(self.ranks, start=1):
            dist.send(header, server)
            part = vector[self.bounds[s]:self.bounds[s + 1]]
            work: Any = dist.irecv(part, server) if receive else dist.isend(part, server)
            work.wait(self.timeout)

    def pull(self, rank: int, w: Any) -> None:
        """Pull every shard server's shard into its slice of ``w``, one after the other."""
        self._each(PULL, rank, w, receive=True)

    def push(self, rank: int, step: Any) -> None:
        """Push every shard server its part of ``step``, one after the other."""
        self._each(PUSH, rank, step, receive=False)

    def done(self, rank: int) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor([DONE, rank], dtype=torch.int64)
        for server in self.ranks:
            dist.send(header, server)


def shard_main(shard: int, world: int, address: str, port: int, trainers: int,
               buffers: ShardBuffers, timeout: float,
               group_timeout: datetime.timedelta) -> None:
    """A spawned shard server: join the group, serve, leave; one line if a peer went."""
    import signal

    import torch.distributed as dist

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    one_thread_each()
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}",
                            rank=trainers + shard, world_size=world, timeout=group_timeout)
    try:
        serve_shard(buffers, trainers, timeout)
    except RuntimeError as err:
        print(f"asyngrad ps server {shard}: {str(err).strip().splitlines()[0][:200]}; "
              "exiting", file=sys.stderr)
        os._exit(POOL_GONE)
    dist.destroy_process_group()


def pool_trace(problem: Problem, scenario: Scenario, shards: list[Applied],
               w_final: np.ndarray, samples: list[list[int]], grad_ns: list[list[int]],
               dtype: str, measure: bool, dead: list[int],
               origin: int | None) -> tuple[Trace, dict[str, Any]]:
    """The run's trace, merged from every server's records (``shards``, in shard order) and
    each trainer's ``samples`` and compute times per push, in its order; and what the
    hardware lost (the rebuilt final vector against the servers' ``w_final``). ``origin``:
    the trace's time 0 (the first pull's arrival where stalls count from it; None: the
    first read's start)."""
    servers = len(shards)
    bounds = block_bounds(problem.dim, servers)
    records, steps = [], []
    for thread, (drawn, spent) in enumerate(zip(samples, grad_ns, strict=True)):
        # Its pushes every server applied (a run that stopped may have left its last ones
        # on some servers only: left out, as pushes that never completed).
        n = min(len(drawn), *(int((shard.thread == thread).sum()) for shard in shards))
        starts, copy_end, arrivals, store_end = (np.zeros((n, servers), dtype=np.int64)
                                                 for _ in range(4))
        step = np.zeros((n, problem.dim), dtype=dtype)
        for s, shard in enumerate(shards):
            mine = np.flatnonzero(shard.thread == thread)[:n]  # its pushes, in its order
            starts[:, s], copy_end[:, s] = shard.pull_arrival[mine], shard.pull_answer[mine]
            arrivals[:, s], store_end[:, s] = shard.arrival[mine], shard.applied[mine]
            step[:, bounds[s]:bounds[s + 1]] = shard.parts[mine]
        # Its compute, from the last shard's answer, ends by its first part's arrival.
        read_end = copy_end.max(axis=1)
        grad_end = np.maximum(np.minimum(read_end + np.asarray(spent[:n], dtype=np.int64),
                                         arrivals[:, 0]), read_end)
        # The trainer's events in its order (its pull's start, each shard's answer, its
        # compute's end, each part's application; then its next pull), each stamp raised to
        # the latest before it: a server stamps a part's application after the send that
        # carried it returned, so its next pull, or the next server, can stamp earlier.
        events = np.concatenate([starts.min(axis=1)[:, None], copy_end, grad_end[:, None],
                                 store_end], axis=1)
        events = np.maximum.accumulate(events.ravel()).reshape(events.shape)
        copy_end, store_end = events[:, 1:servers + 1], events[:, servers + 2:]
        times = np.stack([events[:, 0], copy_end[:, -1], events[:, servers + 1],
                          store_end[:, -1]], axis=1)
        records.append(WorkerRecord(times, copy_end, store_end, np.asarray(drawn[:n])))
        steps.append(step)
    metrics = scenario.metrics
    trace, loss = merge(records, problem.initial(), w_final, [], scenario_to_toml(scenario),
                        Measure(problem, scenario.run.lr, bounds, dtype, metrics.every,
                                metrics.curve_points, 0, steps, exact=measure),
                        dead=dead, origin=origin)
    assert loss is not None
    return trace, loss
