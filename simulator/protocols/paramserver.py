"""A Downpour-style parameter server (Dean et al. 2012), with the options of practice.

The shared vector lives on a server, split into shards (the blocks). Each worker pulls the
shards (reads), computes, and pushes its step (writes); the server applies each push to a
shard atomically (unless ``lock_free``), so nothing is lost, but pulls can mix shard versions
and pushes are stale.
Every pull and push pays the worker's link: ``latency`` ns per message plus bytes/``bandwidth``
per shard (``DeviceSpec``). Options (``[paramserver]``):

* ``staleness_limit`` S: the server discards a push whose staleness exceeds S when the push
  reaches it, at the end of its first shard's write (with one shard: when it would be
  applied), as the real server decides on arrival; the push's time passes, nothing of it is
  stored (row ``step`` 0);
* ``accumulate`` n: n gradients at one pulled vector, pushed as their mean (lr/n per gradient);
* ``warm_start`` W: thread 0 alone makes the first W updates, then the others join (with
  rounds, each of its pushes closes a round: it is the one worker that may arrive);
* ``fraction`` p > 0: synchronous rounds with backup workers: a round ends when ceil(p·k)
  pushes computed on its vector arrived, later ones are discarded (Chen et al. 2016; Project
  Adam waited for 75%);
* ``rebalance`` r: once every worker made ``rebalance_after`` updates, a worker whose mean
  update time exceeds r times the median is retired and its share of the data goes to the
  others (samples are drawn uniformly, so the others simply do its remaining updates);
* ``rule``: an update rule the server applies to each push it keeps, where its staleness τ
  is known exactly: when the push reaches it (with the staleness limit's decision):
  ``staleness_lr`` scales it by 1/τ, ``dcasgd`` compensates it towards the server's vector
  now from the vector the worker pulled; the protocols' own rules
  (:class:`~simulator.protocols.staleness_lr.StalenessLR`,
  :class:`~simulator.protocols.dcasgd.DCASGD`), applied to the push (with ``accumulate``,
  to the mean it pushes);
* ``lock_free``: the server applies pushes without locks (DistBelief, Project Adam: "the
  parameters on the server are not locked during updating"): a shard is loaded once it has
  arrived (its link time into its write) and stored as loaded − step when the write ends,
  so pushes whose updates of a shard overlap lose one; with a free link it is exactly the
  ``lockfree`` protocol;
* ``servers`` S > 0: a server pool (DistBelief's, Project Adam's): the shards are spread
  over S servers (block b of B on server ⌊b·S/B⌋) and each serves one shard transfer at a
  time, so the transfers one server receives queue (``simulator.clock.Pool``: a pull or
  push sends each server its shards as one message, in flight for the link's latency, then
  each shard's transfer holds the server for its duration); the trace's
  ``extra_server_busy_ns`` and ``extra_server_wait_ns`` give each server's load;
* ``run.lr_schedule``: applied by the server too, to each push it keeps as the push arrives
  (m = the completions then + 1, as a real server counts them), before its rule; with rounds
  by the engine as the round's writer begins.

With one worker and no latency it is serial SGD, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simulator.clock import Pool
from simulator.memory import Coords, LoadStore, Op, SharedMemory, WriteMode
from simulator.protocols.base import GROUPED, MEMBER, Protocol
from simulator.protocols.dcasgd import DCASGD
from simulator.protocols.rounds import Rounds
from simulator.protocols.staleness_lr import StalenessLR
from simulator.rules import retirements, too_stale, warmed_up
from simulator.timing import link_ns, link_of

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["ParamServer"]


class ParamServer(Protocol):
    """Pull, compute, push; pushes applied atomically per shard."""

    name = "paramserver"
    gated = True
    network = True
    atomic = True

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.options = scenario.paramserver
        self.dense = self.options.accumulate > 1 or self.options.fraction > 0
        self.atomic = not self.options.lock_free
        self.latency = not self.options.servers  # a pool adds each server's message's

    def setup(self, engine: Engine) -> None:
        k = engine.threads
        self.env = engine.env
        self.rounds = Rounds(engine, self.options.fraction) if self.options.fraction else None
        self.pending: list[list[Update]] = [[] for _ in range(k)]
        self.warm = self.env.event()
        if self.options.warm_start == 0:
            self.warm.succeed()
        elif self.rounds:
            self.rounds.held = k - 1  # the threads the warm start holds back
        self.busy = np.zeros(k, dtype=np.int64)   # summed update times (ns)
        self.count = np.zeros(k, dtype=np.int64)
        self.retired: list[int] = []
        self.finished: set[int] = set()
        self.pool = self._pool(engine) if self.options.servers else None
        if self.options.lock_free:  # each shard loaded once it has arrived
            engine.stores = _Arrived(engine.mem, engine.lost, engine.scenario,
                                     engine.problem.dim, engine.dense_ops)
        rule, schedule = self.options.rule, engine.schedule
        if (self.options.staleness_limit or rule != "none" or schedule) and not self.rounds:
            engine.schedule = None  # the server applies it to each push as it arrives
            engine.stores = _Arrivals(engine, engine.stores, self.options.staleness_limit,
                                      None if rule == "none"
                                      else _RULES[rule](self.scenario), schedule)

    def _pool(self, engine: Engine) -> Pool:
        """The server pool: block b of B on server ⌊b·S/B⌋ (contiguous shards), each
        serving one transfer at a time; each server's message pays its thread's link's
        latency."""
        scenario, servers = engine.scenario, self.options.servers
        blocks = scenario.run.blocks
        pool = Pool(engine.env, servers, [b * servers // blocks for b in range(blocks)],
                    [link_of(scenario.devices[scenario.device_of(t)])[0]
                     for t in range(engine.threads)])
        engine.serve(pool)
        return pool

    def active(self, engine: Engine, thread: int) -> bool:
        return thread not in self.retired

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        if u.thread != 0 and not self.warm.triggered:
            if self.rounds:
                rounds = self.rounds

                def tag(_: simpy.Event) -> None:
                    # Its read starts when the warm start ends, in the round open then (no
                    # round's write runs then: it ends after a write, or with thread 0).
                    rounds.before_read(u)

                self.warm.callbacks.append(tag)
            return self.warm
        if self.pending[u.thread]:
            u.read = False  # keep accumulating on the vector already pulled
            return None
        return self.rounds.before_read(u) if self.rounds else None

    def after_read(self, engine: Engine, u: Update) -> None:
        if self.rounds and u.read:
            self.rounds.after_read(u)

    def before_write(self, engine: Engine, u: Update) -> simpy.Event | None:
        if self.rounds:
            return self.rounds.before_write(u)
        n = self.options.accumulate
        if n > 1:
            pending = self.pending[u.thread]
            pending.append(u)
            if len(pending) < n:
                u.role = MEMBER
                return None
            u.role, u.group, self.pending[u.thread] = GROUPED, pending, []
        return None

    def after_write(self, engine: Engine, u: Update) -> None:
        if self.rounds:
            self.rounds.after_write(u)
        if not self.warm.triggered and warmed_up(engine.completed, self.options.warm_start):
            self._warmed()
        if not u.discard:
            for member in u.group or [u]:
                self.busy[member.thread] += member.write_end - member.read_start
                self.count[member.thread] += 1
            self._rebalance(engine)

    def _rebalance(self, engine: Engine) -> None:
        if not self.options.rebalance:
            return
        working = [t for t in range(engine.threads)
                   if t not in self.retired and t not in self.finished]
        self.retired += retirements(self.busy, self.count, working, self.options.rebalance,
                                    self.options.rebalance_after)

    def finish(self, engine: Engine, thread: int) -> None:
        self.finished.add(thread)
        pending = self.pending[thread]
        if pending:  # accumulated gradients the budget left unpushed: never applied
            last = pending[-1]
            last.group, self.pending[thread] = pending, []
            engine.discard(last)
        if thread == 0 and not self.warm.triggered:
            self._warmed()
        if self.rounds:
            self.rounds.finish()

    def _warmed(self) -> None:
        """The warm start is over: every thread may read, and arrive in rounds."""
        self.warm.succeed()
        if self.rounds:
            self.rounds.held = 0

    def report(self) -> dict[str, np.ndarray]:
        extras = {"retired_threads": np.asarray(self.retired, dtype=np.int64)}
        if self.pool is not None:  # per server: the time it served, transfers waited for it
            extras["server_busy_ns"] = np.asarray(self.pool.busy, dtype=np.int64)
            extras["server_wait_ns"] = np.asarray(self.pool.waited, dtype=np.int64)
        return extras


_RULES: dict[str, type[Protocol]] = {"staleness_lr": StalenessLR, "dcasgd": DCASGD}


class _Arrived(LoadStore):
    """A lock-free server's shard updates (``paramserver.lock_free``): a push's shard is
    loaded once it has arrived, its link time after the start of its write (``lead``), and
    stored as loaded − step when its write ends, so the window in which another push's store
    of that shard is lost is the shard's memory time, not its transfer."""

    leads = True

    def __init__(self, memory: SharedMemory, lost: list[int], scenario: Scenario, dim: int,
                 dense: list[Op]) -> None:
        super().__init__(memory, lost)
        self.dim, self.dense = dim, dense
        self.links = [link_of(scenario.devices[scenario.device_of(t)])
                      for t in range(scenario.run.threads)]
        fractions = [_coords(op) / dim for op in dense]
        self.dense_links = [link_ns(link, dim, fractions).tolist() for link in self.links]

    def lead(self, u: Update, i: int) -> int:
        if u.ops is self.dense:
            return int(self.dense_links[u.thread][i])
        return int(link_ns(self.links[u.thread], self.dim,
                           [_coords(op) / self.dim for op in u.ops])[i])


def _coords(op: Op) -> int:
    """The coordinates a block op moves."""
    return op[2].stop - op[2].start


class _Arrivals(WriteMode):
    """The server under a staleness limit, an update rule or a learning-rate schedule: it
    sees a push when the push's first shard arrives (the end of its first block's write) and
    throws the whole push away if its staleness exceeds the limit then (``u.discard``: the
    engine's row for it has step 0); otherwise it scales the whole push by the schedule's
    factor at m = the completions then + 1 and applies ``rule`` to it (in place, before any
    shard is stored; the factors on lr it took join ``u.lr_scale``), and its shards land as
    ``stores`` (the run's write mode) says. (With rounds the engine applies the schedule as
    the round's writer begins, which no completion can come between.)"""

    runs = False  # every shard's end is an action of its own: the first one decides

    def __init__(self, engine: Engine, stores: WriteMode, limit: int,
                 rule: Protocol | None = None,
                 schedule: Callable[[int], float] | None = None) -> None:
        self.engine, self.stores, self.limit, self.rule = engine, stores, limit, rule
        self.schedule = schedule

    def begin(self, u: Update, block: int, index: slice, now: int, duration: int) -> Any:
        return self.stores.begin(u, block, index, now, duration)

    @property
    def leads(self) -> bool:  # type: ignore[override]
        return self.stores.leads

    def lead(self, u: Update, i: int) -> int:
        return self.stores.lead(u, i)

    def end(self, u: Update, block: int, index: slice, coords: Coords, begun: Any,
            step: np.ndarray) -> None:
        if block == u.ops[0][0]:
            u.discard = too_stale(self.engine.completed - u.start_completed + u.delay,
                                  self.limit)
            if (self.rule is not None or self.schedule is not None) and not u.discard:
                step = self._applied(u)
        if not u.discard:
            self.stores.end(u, block, index, coords, begun, step)

    def _applied(self, u: Update) -> np.ndarray:
        """Scale ``u``'s whole push in place by the schedule's factor, then apply the rule to
        it (which finds that factor in ``u.lr_scale``); its first block's part."""
        engine = self.engine
        if self.schedule is not None:
            factor = self.schedule(engine.completed + 1)
            u.step *= factor
            u.lr_scale *= factor
        if self.rule is not None:
            ruled = self.rule.step(engine, u, u.step, engine.read_copy(u.thread))
            if ruled is not u.step:
                np.copyto(u.step, ruled)
        return u.step[u.ops[0][2]]

    def lost_of(self, block: int) -> dict[int, np.ndarray] | None:
        return self.stores.lost_of(block)
