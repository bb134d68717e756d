"""One real worker process: the read / gradient / write loop on a shared parameter tensor.

The shared flat tensor is viewed as a numpy array (zero copy), so the worker runs the very same
``Problem`` code as the simulator. Lock-free mode writes each block in place with no
coordination at all (``w[block] -= lr·g[block]``: a non-atomic read-modify-write per element, the
Hogwild! update); ``blocklock`` holds one lock per block across that block's read-modify-write
(no store is lost, reads stay unlocked and can tear); ``locked`` holds one lock across the whole
update; ``minibatch`` runs synchronous rounds (:class:`Rounds`: each worker leaves its step
in a slot, worker 0 subtracts the round's mean step once all have, nobody reads until it
has); ``admm`` runs asynchronous consensus ADMM (:class:`Consensus`); ``roundrobin`` takes
turns (:class:`Turns`). Every timestamp comes from ``time.monotonic_ns()`` (one clock for all
processes) and goes into preallocated shared buffers: no locks, no I/O, no allocation of
records inside the loop.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun.records import recorder

__all__ = ["ONE_THREAD_ENV", "RELEASE", "START", "STATUS_DEAD", "STATUS_DONE", "STATUS_FAILED",
           "STATUS_RUNNING", "Buffers", "Consensus", "Died", "History", "Rounds", "Slowed",
           "Stalled", "Turns",
           "WorkerSpec", "another_problem", "die_with_parent", "one_thread_each",
           "one_thread_env", "pin", "pinned_cpus", "record_failure", "touch_records",
           "wait_for_release", "wait_for_start", "worker_main"]

# STATUS_DEAD: killed by an injected death (``[[inject.deaths]]``); the run goes on (in
# rounds the others stop where the round waits for it: ``Stalled``, their status DONE).
STATUS_RUNNING, STATUS_DONE, STATUS_FAILED, STATUS_DEAD = 0, 1, 2, 3
MESSAGE_BYTES = 512
# The parent's signals to the workers, words of ``Buffers.control``: START holds the common
# start time (monotonic ns; 0 until set), RELEASE 1 once finished workers may exit.
START, RELEASE = 0, 1
# A waiting worker sleeps this long between looks at its signal (and at its parent).
START_POLL_S, RELEASE_POLL_S = 0.001, 0.01


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs besides shared memory (picklable for ``spawn``)."""

    rank: int
    workers: int
    quota: int
    scenario_toml: str
    cpu: int = -1  # the CPU the worker pins itself to (−1: not pinned, the OS places it)
    fingerprint: str = ""  # the parent's problem's (Problem.fingerprint): the worker's must match


@dataclass(frozen=True)
class Buffers:
    """Shared tensors, allocated by the parent. Per worker r (first dimension):

    ``times[r, i]`` = read start, read end, gradient end, write end of update i;
    ``copy_end[r, i, b]`` / ``store_end[r, i, b]`` = when block b's copy / store finished
    (−1: block not touched); ``samples[r, i]``; ``progress[r]`` = updates done;
    ``status[r]`` and ``message[r]`` = how the worker ended; ``ready[r]`` = set up and
    waiting for the common start; ``control`` = the parent's start and release signals
    (:data:`START`, :data:`RELEASE`); in measure mode
    ``steps[r, i]`` = the step lr·g update i subtracted (dense, zeros off its support) and,
    for dense problems, ``reads[r, i]`` = the copy of w its gradient was computed at.
    """

    w: Any
    times: Any
    copy_end: Any
    store_end: Any
    samples: Any
    progress: Any
    status: Any
    message: Any
    steps: Any = None  # measure mode: (workers, quota, d) float64, lr·g as subtracted
    reads: Any = None  # measure mode, dense problems: (workers, quota, d) the read copies
    scales: Any = None  # update rules: (workers, quota) float64, the factor on lr applied
    injected: Any = None  # [inject]: (workers, quota, 3) float64, ‖e‖, 1.0 if dropped, τ
    residuals: Any = None  # admm: (workers, quota, 2) float64, primal and dual after the push
    ready: Any = None  # ready[r] = 1 once worker r is set up and waits for the start
    control: Any = None  # the parent's signals: control[START], control[RELEASE]


@dataclass(frozen=True)
class Rounds:
    """Synchronous minibatch rounds on real workers (``--mode minibatch``). Round r is every
    worker's r-th update: with T = q·k + m updates (``split = even``: the first m workers make
    one more), rounds 0..q−1 take all k workers, round q the first m. A worker subtracts
    nothing itself: it leaves its step lr·g in ``slots[rank]`` and raises its arrival count
    ``flags[rank]``; worker 0 (a member of every round), once every member has arrived,
    subtracts the mean step of the round's slots (``simulator.rules.mean_step``, in rank
    order) block by block and raises ``flags[-1]``, the rounds written, which the others
    wait for, so no read sees the write in flight. Only the writer stamps block stores (how
    the parent tells it apart).

    A barrier of flags in shared memory, each written by one process (no lock, no atomic
    read-modify-write), waited on by looking (with more workers than CPUs :data:`_SPINS`
    times, then sleeping between looks): a ``multiprocessing.Barrier`` (semaphores; the last
    to arrive wakes the others) cost 280 µs a round of two workers on the 2-core machine,
    this one under 10 µs with the gradients (bench/README.md). Like the workers' records it
    relies on stores becoming visible in program order (x86-64).

    ``[inject]`` as in the simulator's minibatch: each worker draws its update's delay,
    error and drop from its thread's stream (a delayed read copies w as it was τ rounds back
    from the worker's own :class:`History`, every member seeing each round's vector); the
    round's write is lost where its writer's is (worker 0's draw; the simulator's writer is
    the last to arrive), stored values are rounded; a straggling writer's stores take
    ``factor`` times as long; a worker that dies (before its next update) leaves its round
    waiting for it for good, so every other member stops there (:class:`Stalled`) and the
    run ends early, as the simulator's does."""

    flags: Any  # (workers + 1,) int64 shared: arrivals per worker, then rounds written
    slots: Any  # (workers, d) shared, in w's dtype
    full: int  # q: the rounds every worker takes part in
    last: int  # members of round q (m), the rest of the quota
    nap: bool  # more workers than CPUs: a waiting worker sleeps between looks
    # ``--mode allreduce``: the workers' gloo group (its init method), as data-parallel
    # training with torch.distributed runs: each worker keeps its own replica of w, the round's
    # steps are summed by an all-reduce and every replica subtracts their mean; worker 0's
    # replica is copied to the shared vector (the run's w, which the parent samples) and its
    # row is the round's writer. None: the shared-memory barrier above.
    group: str | None = None


@dataclass(frozen=True)
class Turns:
    """Delayed SGD in a fixed turn order on real workers (``--mode roundrobin``, Langford et
    al. 2009, as the simulator's ``roundrobin`` with ``split = even``). One turn counter in
    shared memory, raised only by the worker holding the turn: turns 0..a−1 are the a active
    workers' first reads (a = min(k, T)), then worker r's i-th write is turn a + i·a + r and
    holds on through the read of its next update (a worker with no next update leaves the
    rotation), so every read is the vector right after the reader's own write and, from the
    a-th update on, every gradient is applied a − 1 updates late.

    A worker that dies (``[[inject.deaths]]``, before its next update, so holding the turn of
    its last write; before its first: the turn of its first read) keeps its place for good,
    as the simulator's dead thread does: every other worker's wait sees its status and stops
    there (:class:`Stalled`, as a round's members do), with every write before the dead
    worker's turn made, and the run ends early."""

    turn: Any  # (1,) int64 shared: the turns passed
    active: int  # a: the workers that make updates
    nap: bool  # more workers than CPUs: a waiting worker sleeps between looks


@dataclass(frozen=True)
class Consensus:
    """Asynchronous consensus ADMM on real workers (``--mode admm``, as the simulator's
    ``admm``): the shared vector is the consensus z; worker r pulls it (the read), solves its
    shard's subproblem from its own x_r and scaled dual u_r (``simulator.rules.admm_push``,
    the gradient phase) and adds its push to z under a lock per block (the write: an atomic
    add, as the simulator's). Its x_r, published in ``xs[r]`` once the solve ends, lets the
    writer of each push compute the residuals after it (``simulator.rules.admm_residuals``,
    outside the timed phases), with Δz = the push itself.

    ``[inject]`` as in the simulator's admm, drawn from the worker's thread's stream like
    every other mode's: a delay (z pulled τ pushes back, :class:`History`), a dropped push
    (its time passes, z keeps its value, x_r and u_r move on: Δz = 0) and rounded stores
    (every coordinate of the push; Δz = what the rounded stores changed); no error (the
    simulator's admm adds none to its local solves)."""

    xs: Any  # (workers, d) float64 shared: each worker's local copy x_r


@dataclass(frozen=True)
class History:
    """Injected delays on real workers (``inject.delay``, as the simulator's): the vectors
    the last completions left, for reads that see w as it was τ completions back. After each
    update its worker copies the shared vector into ``ring[t mod H]`` (t: the completions the
    history holds, H = the largest delay + 1); at a read's start the reader takes the
    completions counted, s, draws τ (clipped at s, as the simulator's) and copies ring[(s − τ)
    mod H] as its local copy, both under ``lock``, so no slot is rewritten while it is read
    (before the read's start stamp, after any lock or turn: the copies are not the read's
    time). The read then copies the shared vector as usual (into a scratch vector, which
    measure mode records: the memory the read saw), and the gradient is computed at the old
    vector. Exact in a fixed order (one worker, ``roundrobin``) and in rounds (each worker
    keeps its own history of the rounds' vectors, :meth:`of`); lock-free, a snapshot is the
    vector as the memory held it just after its writer's write, with any write in flight."""

    ring: Any  # (H, d) float64 shared; ring[0] = w_0
    count: Any  # (1,) int64 shared: the completions the ring holds
    lock: Any

    @classmethod
    def of(cls, w0: np.ndarray, max_delay: int, lock: Any = None) -> History:
        """The history of a run whose delays reach ``max_delay``, ``w0`` first, shared
        between workers under ``lock``; None: one worker's own (a round's worker: every
        member sees each round's vector, so each keeps the rounds' vectors itself, with no
        lock)."""
        import torch

        ring = torch.zeros(max_delay + 1, w0.size, dtype=torch.float64)
        ring[0] = torch.as_tensor(w0)
        count = torch.zeros(1, dtype=torch.int64)
        if lock is None:
            return cls(ring, count, contextlib.nullcontext())
        return cls(ring.share_memory_(), count.share_memory_(), lock)


class _Past:
    """A worker's side of :class:`History`."""

    def __init__(self, history: History, dim: int) -> None:
        self.ring, self.count, self.lock = (history.ring.numpy(), history.count.numpy(),
                                            history.lock)
        self.scratch = np.zeros(dim)  # the read's own copies go here

    def load(self, local: np.ndarray, drawn: int) -> tuple[int, int]:
        """Copy w as it was ``drawn`` completions before now (fewer if fewer were made) into
        ``local``; the delay τ that ran and the completions the history held (the read's
        count, from which τ is counted)."""
        with self.lock:
            s = int(self.count[0])
            tau = min(drawn, s)
            np.copyto(local, self.ring[(s - tau) % len(self.ring)])
        return tau, s

    def add(self, w: np.ndarray) -> None:
        """The vector this worker's completion left."""
        with self.lock:
            t = int(self.count[0]) + 1
            np.copyto(self.ring[t % len(self.ring)], w, casting="same_kind")
            self.count[0] = t


class _Solver:
    """One worker's side of :class:`Consensus`: its shard, draws, x_r and u_r."""

    def __init__(self, consensus: Consensus, scenario: Any, problem: Any, rank: int,
                 workers: int) -> None:
        from simulator.rules import admm_samples, admm_shard

        self.xs = consensus.xs.numpy()
        self.row = self.xs[rank]
        self.x, self.u = self.row.copy(), np.zeros(problem.dim)
        self.shard = admm_shard(problem.n_samples, workers, rank)
        self.weight = len(self.shard) / problem.n_samples
        self.draw = admm_samples(scenario.run.seed, rank)
        self.options, self.lr, self.workers = scenario.admm, scenario.run.lr, workers
        self.grad = problem.dense_grad

    def push(self, z: np.ndarray, sample: int) -> tuple[np.ndarray, int]:
        """The push to subtract from z, computed at the pulled ``z``, and the sample the row
        records (the first local one; ``sample`` where the shard is empty)."""
        from simulator.rules import admm_push

        if self.shard.size == 0:  # more workers than samples: nothing to learn
            return np.zeros_like(z), sample
        samples = self.draw(self.shard, self.options.local_steps)
        return admm_push(self.grad, self.x, self.u, z, samples, self.weight,
                         self.options.rho, self.lr, self.workers), int(samples[0])

    def publish(self) -> None:
        """Show x_r to the writers' residuals: at the end of the gradient phase (after any
        straggler's stretch), when the simulator's thread sets it."""
        np.copyto(self.row, self.x)

    def residuals(self, z: np.ndarray, moved: np.ndarray | None) -> tuple[float, float]:
        """The primal and dual residuals just after this worker's push moved z by ``moved``
        (its push, or what its rounded stores changed; None: it was dropped, Δz = 0)."""
        from simulator.rules import admm_residuals

        moved = np.zeros(z.size) if moved is None else np.asarray(moved, dtype=np.float64)
        return admm_residuals(self.xs, z, moved, self.options.rho)


# With more workers than CPUs a waiting worker looks this many times (about 1 µs each),
# then sleeps between looks, so that the others can compute; with a CPU each, it only looks
# (a sleep's wake-up took 60-80 µs: a round of the 105,004-parameter MLP's two workers took
# 445 µs napping after 50 looks, 315 µs after 500, 207 µs looking only).
_SPINS, _NAP_S = 50, 20e-6


def _await(flags: np.ndarray, upto: int, count: int, nap: bool,
           gone: Callable[[], bool]) -> None:
    """Wait until ``flags[:upto]`` are all at least ``count``; every 1,000 looks, and at each
    nap, ask whether the parent is gone (where the kernel does not kill the worker with it).

    Raises:
        SystemExit: the parent is gone."""
    spins = 0
    while flags[:upto].min() < count:
        spins += 1
        if (nap and spins > _SPINS) or spins % 1000 == 0:
            if gone():
                raise SystemExit("the parent is gone")
            if nap and spins > _SPINS:
                time.sleep(_NAP_S)


def worker_main(spec: WorkerSpec, buffers: Buffers, lock: Any,
                block_locks: Any = None, rounds: Rounds | None = None,
                turns: Turns | None = None, consensus: Consensus | None = None,
                history: History | None = None) -> None:
    """Set up, wait for the common start (:func:`wait_for_start`), run ``spec.quota``
    updates, then wait (asleep) for the release (:func:`wait_for_release`), which the parent
    gives once every worker is done; on any exception record it and exit with status 1.

    The wait keeps a finished worker's exit off the cores while the others still train: a
    process that imported torch spends tens to hundreds of milliseconds of CPU on its way
    out, and the OS gives that time slices on a core a worker is using (docs/fidelity.md).

    Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent decides how
    to stop (it terminates the workers and keeps what they completed)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gone = die_with_parent()
    try:
        _loop(spec, buffers, lock, block_locks, gone, rounds, turns, consensus, history)
        buffers.status[spec.rank] = STATUS_DONE
        wait_for_release(buffers, gone)
    except (Died, Stalled) as stop:  # an injected death: it stops here, and the others go
        # on; or its round waits for a dead worker for good: the run ends early
        buffers.status[spec.rank] = STATUS_DEAD if isinstance(stop, Died) else STATUS_DONE
        wait_for_release(buffers, gone)  # (its exit would take the others' cores)
    except BaseException as err:  # every failure, SystemExit included, must reach the parent
        record_failure(buffers, spec.rank, err)
        raise SystemExit(1) from None


def die_with_parent() -> Callable[[], bool]:
    """In a worker process: have the kernel kill it when its parent dies (Linux
    ``PR_SET_PDEATHSIG``; a parent killed outright cannot stop its workers, and a worker in
    its loop looks at nothing else), and return the test the waits use elsewhere: whether
    the parent (the pid multiprocessing recorded at the spawn) is gone.

    Raises:
        SystemExit: the parent is gone already."""
    import ctypes
    import multiprocessing
    import signal

    parent = multiprocessing.parent_process()
    pid = os.getppid() if parent is None or parent.pid is None else parent.pid

    def gone() -> bool:
        return os.getppid() != pid

    with contextlib.suppress(OSError, AttributeError):  # not Linux: the waits still look
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if gone():  # it died before the signal was set
        raise SystemExit(1)
    return gone


def wait_for_start(buffers: Buffers, rank: int, gone: Callable[[], bool]) -> None:
    """Say ready (``ready[rank]`` = 1), then sleep in steps of :data:`START_POLL_S` until
    the parent posts the start time in ``control[START]``, and spin to it, so every worker
    starts at the same nanosecond whenever it woke.

    A flag in shared memory and not a multiprocessing Event: ``Event.set`` waits for every
    waiter to acknowledge its wake-up, so a worker killed while it waited hung the parent
    there for ever (issue 46); nothing here can block the parent. The wait ends early,
    without starting, when ``gone()`` says the parent is gone (or a thread was stopped).

    Raises:
        SystemExit: the parent is gone (the worker must not train for no one)."""
    buffers.ready[rank] = 1
    control = buffers.control.numpy()
    while control[START] == 0:
        if gone():
            raise SystemExit("stopped while waiting for the start")
        time.sleep(START_POLL_S)
    start = int(control[START])
    while time.monotonic_ns() < start:
        pass


def wait_for_release(buffers: Buffers, gone: Callable[[], bool]) -> None:
    """Sleep in steps of :data:`RELEASE_POLL_S` until the parent sets ``control[RELEASE]``,
    or until ``gone()`` says the parent is gone (a parent killed outright cannot set it;
    the worker then exits, not orphaned). A shared flag, as :func:`wait_for_start` says
    why."""
    control = buffers.control.numpy()
    while control[RELEASE] == 0 and not gone():
        time.sleep(RELEASE_POLL_S)


def _flat(tensor: Any) -> memoryview:
    """A flat int64 memoryview of a contiguous shared int64 tensor (writes land in it)."""
    return memoryview(tensor.numpy()).cast("B").cast("q")


def pinned_cpus(workers: int) -> list[int]:
    """Worker r's CPU when pinned: the r-th of the CPUs this process may run on, modulo
    their count, so k ≤ cores workers get a core each and more share cores evenly (worker r
    on core r mod cores, as the simulator's ``per_core`` slicing places threads).

    Raises:
        ScenarioError: the platform cannot pin processes to CPUs.
    """
    from simulator.errors import ScenarioError

    if not hasattr(os, "sched_setaffinity"):
        raise ScenarioError("--pin", "on", "this platform cannot pin processes to CPUs")
    cpus = sorted(os.sched_getaffinity(0))
    return [cpus[r % len(cpus)] for r in range(workers)]


def pin(spec: WorkerSpec) -> None:
    """Pin the calling process (or thread) to ``spec.cpu``, if one is given. Called once
    the worker is set up: a library initialising in it may set the affinity back to every
    CPU (seen here during a worker's set-up)."""
    if spec.cpu >= 0:
        os.sched_setaffinity(0, {spec.cpu})


# Thread counts the BLAS and OpenMP libraries read once, when they load.
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextmanager
def one_thread_env() -> Iterator[None]:
    """Start worker processes inside this: they inherit ``ONE_THREAD_ENV``, so no BLAS or
    OpenMP pool is ever created in them (the parent's own environment is restored after).

    :func:`one_thread_each` limits the pools once the worker runs, but a spawned worker
    imports numpy (and OpenBLAS starts one thread per other core) while it unpickles its
    arguments, and a multi-threaded call in its set-up leaves those threads spinning for
    about 100 ms (OpenBLAS waits 2^28 cycles before it sleeps). They spun into the run:
    each such thread took its worker's core for 4 ms every 8 ms (a time slice each) in the
    first 30–100 ms of every real run, seen on 2 and on 16 cores (docs/fidelity.md)."""
    saved = {name: os.environ.get(name) for name in ONE_THREAD_ENV}
    os.environ.update(ONE_THREAD_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def same_problem(problem: Any, fingerprint: str, who: str) -> None:
    """Refuse to train a problem other than the parent's: a user's factory that draws from
    anything but the seeded generators builds other data or other initial parameters in each
    process.

    Raises:
        ScenarioError: naming problem.model.
    """
    if fingerprint and problem.fingerprint() != fingerprint:
        raise another_problem(problem, who)


def another_problem(problem: Any, who: str) -> Any:
    """The error :func:`same_problem` raises (a parameter server says it for its trainer)."""
    from simulator.errors import ScenarioError

    return ScenarioError("problem.model", getattr(problem, "label", problem.name),
                         f"{who} built another problem than the parent (other data or "
                         "initial parameters): the factory must build the same one in every "
                         "process from problem.seed")


def one_thread_each() -> None:
    """One compute thread per worker: torch's intra-op pool and every BLAS/OpenMP pool numpy
    and scipy loaded (k workers on k cores must not start k² threads that spin)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(limits=1)


def touch_records(buffers: Buffers, rank: int) -> None:
    """Write every page of worker ``rank``'s records once, before the start: a shared page is
    mapped into a process on its first touch, and measure mode's rows (2 × d float64 per
    update) would otherwise take their page faults inside the loop — at d = 10,000 they made
    the time between updates 5× longer (78 µs against 16 µs) and moved both workers' phases
    together."""
    for tensor in (buffers.times, buffers.copy_end, buffers.store_end, buffers.samples,
                   buffers.steps, buffers.reads, buffers.scales, buffers.injected,
                   buffers.residuals):
        if tensor is not None:
            rows = tensor[rank].numpy()
            rows += 0  # rewrites each value as it is (−1 markers stay −1)


def record_failure(buffers: Buffers, rank: int, err: BaseException) -> None:
    """Put the worker's failure where the parent looks: its status and a one-line reason."""
    import torch

    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    data = text.encode()[:MESSAGE_BYTES]
    buffers.message[rank, : len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    buffers.status[rank] = STATUS_FAILED


class _Barrier:
    """The write phase of a round on the shared-memory barrier (:class:`Rounds`); ``wait``:
    the test its waits make every so often (:func:`_stalls`)."""

    def __init__(self, rounds: Rounds, rank: int, wait: Callable[[], bool]) -> None:
        self.rounds, self.rank, self.wait = rounds, rank, wait
        self.flags, self.slots = rounds.flags.numpy(), rounds.slots.numpy()

    def write(self, i: int, step: np.ndarray, dropped: bool,
              store: Callable[[np.ndarray, bool], None],
              schedule: Callable[[int], float] | None) -> tuple[float, np.ndarray]:
        """Round ``i``: this worker's step in its slot; the writer (worker 0), once every
        member has arrived, stores the round's mean step (``store``: nothing where its own
        write is ``dropped``, as the simulator's round is lost with its writer's write). The
        factor on lr the round's step took (``schedule``: the learning-rate schedule's, at
        completion i + 1, on the writer's row, as the simulator records it) and the step
        this worker subtracted (the writer: the round's mean; the others: their own, which
        nobody subtracts alone).

        Raises:
            Stalled: a worker died (``wait`` says so): the round waits for it for good (or
                Died, :func:`_stalled`)."""
        from simulator.rules import mean_step

        rounds, flags, slots = self.rounds, self.flags, self.slots
        slots[self.rank] = step
        flags[self.rank] = i + 1
        scale, mean = 1.0, step
        if self.rank == 0:  # the writer, once every member has arrived
            members = len(slots) if i < rounds.full else rounds.last
            _await(flags, members, i + 1, rounds.nap, self.wait)
            mean = mean_step(list(slots[:members]))
            if schedule is not None:
                scale = schedule(i + 1)
                mean = mean * scale
            store(mean, dropped)
            flags[-1] = i + 1
        else:
            _await(flags[-1:], 1, i + 1, rounds.nap, self.wait)
        return scale, mean

    def leave(self, i: int) -> None:
        """This worker dies before round ``i``: nothing to send (the others' waits see its
        status)."""


class _AllReduce:
    """The write phase of a round as an all-reduce (:attr:`Rounds.group`) into this worker's
    replica ``w``; the groups are made once, by every worker (a second group, of the first
    m, for the last round). Two marks travel with each round's sum: whether worker 0's
    write is dropped (its draw decides the round's, on every replica) and how many members
    died before it. A sum waits up to 120 s, plus ``paused_ns`` (the injected pauses, for
    which the others wait). ``mortal``: this worker has a death of its own
    (:func:`_stalled`)."""

    def __init__(self, rounds: Rounds, rank: int, workers: int, w: np.ndarray,
                 paused_ns: int = 0, mortal: bool = False) -> None:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=rounds.group, rank=rank, world_size=workers,
                                timeout=datetime.timedelta(seconds=120 + paused_ns / 1e9))
        self.rounds, self.rank, self.dist, self.mortal = rounds, rank, dist, mortal
        self.dim, self.dtype = w.size, w.dtype
        self.last = dist.new_group(list(range(rounds.last))) if rounds.last else None

    def _sum(self, i: int, step: np.ndarray, dropped: bool, dead: bool) -> np.ndarray:
        """Round ``i``'s steps summed over its members, then its two marks summed."""
        import torch

        total = np.zeros(self.dim + 2)
        total[:-2] = step
        total[-2:] = dropped, dead
        self.dist.all_reduce(torch.from_numpy(total),
                             group=None if i < self.rounds.full else self.last)
        return total

    def write(self, i: int, step: np.ndarray, dropped: bool,
              store: Callable[[np.ndarray, bool], None],
              schedule: Callable[[int], float] | None) -> tuple[float, np.ndarray]:
        """Round ``i``: the all-reduced mean step stored in this worker's replica
        (``store``, which worker 0's also copies to the shared vector; nothing where worker
        0's write is ``dropped``); the factor on lr and the step subtracted.

        Raises:
            Stalled: a member died before the round: it waits for it for good (Died:
                this worker has a death of its own, :func:`_stalled`)."""
        rounds, flags = self.rounds, self.rounds.flags.numpy()
        total = self._sum(i, step, dropped and self.rank == 0, False)
        if total[-1]:
            raise _stalled(self.mortal)
        members = len(flags) - 1 if i < rounds.full else rounds.last
        mean = total[:-2]
        mean /= members
        scale = 1.0
        if schedule is not None:
            scale = schedule(i + 1)
            mean = mean * scale
        mean = mean.astype(self.dtype, copy=False)  # the values subtracted (and recorded)
        if self.rank == 0:
            flags[0] = i + 1  # the shared vector is being written (curve samples wait)
        store(mean, bool(total[-2]))
        if self.rank == 0:
            flags[-1] = i + 1
        return (scale if self.rank == 0 else 1.0), mean  # the writer's row takes the factor

    def leave(self, i: int) -> None:
        """This worker dies before round ``i``: it sends the round its death, so that every
        member stops there (a dead member's round waits for it for good)."""
        self._sum(i, np.zeros(self.dim), False, True)


def _stalls(status: np.ndarray, gone: Callable[[], bool],
            mortal: bool) -> Callable[[], bool]:
    """The test of the waits of a barrier or of turns: ``gone``, and whether a worker died
    (``status``): its round or its turn would be waited for for good.

    The test raises what :func:`_stalled` says (``mortal``: the waiting worker has a death
    of its own)."""

    def wait() -> bool:
        if (status == STATUS_DEAD).any():
            raise _stalled(mortal)
        return gone()

    return wait


def _stalled(mortal: bool) -> Exception:
    """What stops a worker that waits for a dead one for good (its round or its turn):
    Died where it has a death of its own (``mortal``), however late (the simulator's
    waiting thread is killed when its death comes), else Stalled."""
    return Died() if mortal else Stalled()


def _deaths(inject: Any, rank: int) -> list[int]:
    """The times (ns from the start) of worker ``rank``'s deaths: its own, and the run's one
    device's."""
    return [d.at for d in inject.deaths if d.thread == rank or d.device >= 0]


def _rounder(rounds: Rounds, rank: int, workers: int, w: np.ndarray, status: np.ndarray,
             gone: Callable[[], bool], inject: Any) -> _Barrier | _AllReduce:
    """The write phase of the rounds: an all-reduce into this worker's replica ``w`` (with
    :attr:`Rounds.group`), else the barrier, whose waits stop once a worker died
    (``status``); either stops as :func:`_stalled` says where a round waits for a dead
    member."""
    mortal = bool(_deaths(inject, rank))
    if rounds.group is not None:
        return _AllReduce(rounds, rank, workers, w,
                          sum(p.end - p.start for p in inject.pauses), mortal)
    return _Barrier(rounds, rank, _stalls(status, gone, mortal))


def _round_stores(w: np.ndarray, shared: np.ndarray, ops: list[Any],
                  stored: Callable[[int], None], quantize: Callable[[np.ndarray], None] | None,
                  slow: Slowed | None, rank: int) -> Callable[[np.ndarray, bool], None]:
    """How a round's mean step is stored into ``w``: as a write under ``[inject]``
    (:func:`_write_injected`: nothing if dropped, rounded by ``quantize``). The round's write
    is worker 0's: only its stores are stamped (``stored``) and take a straggler's ``factor``
    times as long (``slow``); with replicas (``shared`` is not ``w``) every worker stores
    into its own, and worker 0 copies each block to the shared vector as it stores it."""
    writer = rank == 0
    slow = slow if writer else None

    def publish(block: int) -> None:
        if shared is not w:
            index = ops[block][1]
            shared[index] = w[index]
        stored(block)

    def store(mean: np.ndarray, dropped: bool) -> None:
        began = slow.before(1) if slow is not None else 0
        _write_injected(w, ops, mean, None, publish if writer else None, quantize, dropped)
        if slow is not None:
            slow.after(1, began)

    return store


def _write_rule(scenario: Any, w: np.ndarray, progress: np.ndarray,
                ) -> Callable[[np.ndarray, Any, np.ndarray, int], tuple[np.ndarray, float]] | None:
    """The update rule a lock-free worker applies when its write begins, as the simulator's
    protocol and schedule do (``simulator.rules``), or None (plain lr·g): ``staleness_lr``
    divides lr by τ, the updates completed since its read began (counted in ``progress``,
    where each update is counted once its write ended); ``dcasgd`` corrects the step towards
    the vector as it is now (read again, over the gradient's support); a learning-rate
    schedule then scales it by its factor at m = the completions counted + 1. The rule maps
    (step, support, read copy, completions counted at the read's start) to (the step to
    write, its factor on lr)."""
    from simulator.rules import LR_FACTORS, dc_step, staleness_scale

    protocol, lr, lam = scenario.run.protocol, scenario.run.lr, scenario.dcasgd.lam
    schedule = LR_FACTORS.get(scenario.run.lr_schedule)
    if protocol not in ("staleness_lr", "dcasgd") and schedule is None:
        return None
    work = (np.zeros(w.size), np.zeros(w.size)) if protocol == "dcasgd" else None
    cast = np.zeros(w.size, dtype=w.dtype) if w.dtype != np.float64 else None

    def rule(step: np.ndarray, support: Any, local: np.ndarray,
             seen: int) -> tuple[np.ndarray, float]:
        completed, scale = int(progress.sum()), 1.0
        if protocol == "staleness_lr":
            scale = staleness_scale(completed - seen)
            if scale != 1.0:
                step *= scale
        elif protocol == "dcasgd":
            where = slice(None) if support is None else support
            step = dc_step(step, lr, w[where], local[where], lam, work)
            if cast is not None:  # back to w's dtype, in a buffer of its own
                np.copyto(cast[:step.size], step, casting="same_kind")
                step = cast[:step.size]
        if schedule is not None:
            factor = schedule(completed + 1)
            step = step * factor
            scale *= factor
        return step, scale

    return rule


def _injector(scenario: Any, problem: Any, workers: int) -> Any:
    """The simulator's injector of gradient errors, dropped writes and rounded stores
    (``simulator.inject.Injector``: the same draws per worker and update as the simulator's
    thread), or None when none is injected (or only stragglers, pauses and deaths, which
    :class:`Slowed` runs). w* only for adversarial errors (the others never use it)."""
    from simulator.inject import Injector

    spec = scenario.inject
    if spec.error == "none" and not spec.drop and not spec.write_bits and not spec.max_delay:
        return None
    w_star = (problem.optimum()[0] if spec.error == "adversarial"
              else np.zeros(problem.dim))
    return Injector(spec, scenario.run.seed, workers, w_star)


class Died(Exception):
    """The worker's injected death came (``[[inject.deaths]]``)."""


class Stalled(Exception):
    """The worker's round waits for a dead worker for good (the simulator's minibatch
    stalls there, and its run ends early): the worker stops, its update in flight undone."""


class Slowed:
    """A worker's injected pauses, straggling and death (``[[inject.pauses]]``,
    ``[[inject.stragglers]]``, ``[[inject.deaths]]`` of its rank or of the run's one
    device), on the run's clock (ns since the common start).

    A death stops the worker before its next update once the clock has passed its time (the
    simulator's dead thread stops at once, abandoning the update in flight, with part of a
    write of several blocks).

    A pause holds the worker before its next update's read while the clock is in one of its
    windows, until the window ends (the simulator's thread starts no action in it, so it also
    holds a gradient or a write that would begin there; here an update that began before the
    window finishes, and every recorded phase lasts as long as it ran). A straggler's phases
    take ``factor`` (> 1) times as long, as the simulator's: the gradient by waiting out the
    rest after computing it, a read and a write by waiting (factor − 1) times the worker's
    previous copy or store before copying or storing, so a block is copied as its read ends
    and stored as its write ends, as in the simulator (a round's write: its writer's
    stores, not its wait)."""

    def __init__(self, inject: Any, rank: int, origin: int) -> None:
        self.windows = [(origin + p.start, origin + p.end) for p in inject.pauses
                        if p.thread == rank]
        factors = [s.factor for s in inject.stragglers if s.thread == rank]
        self.factor = math.prod(factors) if factors else 1.0
        self.last = [0, 0]  # the previous copy's and store's ns (read, write)
        deaths = _deaths(inject, rank)
        self.death = origin + min(deaths) if deaths else None

    @property
    def active(self) -> bool:
        return bool(self.windows) or self.factor != 1 or self.death is not None

    def before(self, phase: int) -> int:
        """Before a read's copies (0) or a write's stores (1): wait out the stretch; the time
        the copies or stores begin."""
        if self.factor > 1 and self.last[phase]:
            _until(time.monotonic_ns() + int(self.last[phase] * (self.factor - 1)))
        return time.monotonic_ns()

    def after(self, phase: int, began: int) -> None:
        """The copies or stores that began at ``began`` are done."""
        self.last[phase] = time.monotonic_ns() - began

    def paused_until(self, now: int) -> int | None:
        """The end of the pause window ``now`` (ns, this clock) falls in, or None."""
        for start, end in self.windows:
            if start <= now < end:
                return end
        return None

    def dead(self, now: int) -> bool:
        """Whether the worker's death has come by ``now``."""
        return self.death is not None and now >= self.death

    def hold(self, gone: Callable[[], bool] | None = None) -> bool:
        """Before an update: wait while the clock is in a pause window; die once it has
        passed the worker's death. False: ``gone`` said to stop during a pause (a worker
        thread's stop; looked at every 10 ms).

        Raises:
            Died: the death's time has come."""
        now = time.monotonic_ns()
        while (end := self.paused_until(now)) is not None:
            if gone is None:
                _until(end)
            else:
                while (left := end - time.monotonic_ns()) > 0:
                    if gone():
                        return False
                    time.sleep(min(left / 1e9, 0.01))
            now = time.monotonic_ns()
        if self.dead(now):
            raise Died
        return True

    def stretch(self, began: int) -> None:
        """Make the phase that began at ``began`` (ns) last ``factor`` times as long."""
        if self.factor > 1:
            _until(began + int((time.monotonic_ns() - began) * self.factor))


def _until(deadline: int) -> None:
    """Sleep, then spin, until ``time.monotonic_ns()`` reaches ``deadline``."""
    left = deadline - time.monotonic_ns()
    if left > 200_000:  # a sleep overshoots by up to ~0.1 ms
        time.sleep((left - 150_000) / 1e9)
    while time.monotonic_ns() < deadline:
        pass


def _write_injected(w: np.ndarray, ops: list[Any], step: np.ndarray, block_locks: Any,
                    stored: Callable[[int], None] | None,
                    quantize: Callable[[np.ndarray], None] | None, dropped: bool,
                    moved: np.ndarray | None = None) -> None:
    """A write under ``[inject]`` (and every round's, :func:`_round_stores`): a dropped one
    stores nothing (its blocks are stamped as the simulator times them: the write's time
    passes); a rounded one rounds each block's values after its store
    (``inject.write_bits``, as the simulator's memory does). ``moved``, if given, gets what
    each stored block's values lost (the step as stored: rounded; ADMM's Δz), taken under
    the block's lock."""
    for block, index, values, _ in ops:
        if not dropped:
            with block_locks[block] if block_locks is not None else contextlib.nullcontext():
                if moved is not None:
                    moved[index] = w[index]
                w[index] -= step[values]
                if quantize is not None:
                    if isinstance(index, slice):
                        quantize(w[index])
                    else:
                        rounded = w[index]
                        quantize(rounded)
                        w[index] = rounded
                if moved is not None:
                    moved[index] -= w[index]
        if stored is not None:
            stored(block)


def _loop(spec: WorkerSpec, buffers: Buffers, lock: Any, block_locks: Any,
          gone: Callable[[], bool], rounds: Rounds | None = None,
          turns: Turns | None = None, consensus: Consensus | None = None,
          history: History | None = None) -> None:
    from simulator.memory import block_bounds, block_ops
    from simulator.problems import make_problem
    from simulator.rules import LR_FACTORS
    from simulator.scenario import scenario_from_dict
    from simulator.timing import sample_stream

    scenario = scenario_from_dict(tomllib.loads(spec.scenario_toml))
    problem = make_problem(scenario.problem)
    same_problem(problem, spec.fingerprint, f"worker {spec.rank}")
    one_thread_each()  # after the problem: the pools its libraries loaded are limited too
    w = buffers.w.numpy()
    bounds = block_bounds(problem.dim, scenario.run.blocks)
    blocks = len(bounds) - 1
    stamp = blocks > 1  # one block's copy and store end with the read and the write
    # Records go straight into the shared buffers (flat int64 views, nothing allocated): one
    # call per stamp, in C where it was built (realrun/records.py).
    record = recorder(_flat(buffers.times[spec.rank]), _flat(buffers.samples[spec.rank]),
                      _flat(buffers.progress), spec.rank, _flat(buffers.copy_end[spec.rank]),
                      _flat(buffers.store_end[spec.rank]), blocks)
    start, read_end, grad_end, written = (record.start, record.read_end, record.grad_end,
                                          record.written)
    copied, stored, done = record.copied, record.stored, record.done
    stream = sample_stream(scenario.run.seed, spec.workers, spec.rank, problem.n_samples)
    local = np.zeros(problem.dim)
    lr = scenario.run.lr
    # Below float64 the step is rounded to w's dtype as it is scaled (part of the gradient):
    # the write is then one same-dtype subtraction, as the torch worker's, and not numpy's
    # buffered float64 loop with casts both ways (2.6x as long on the 105,004-parameter MLP).
    rounded = None if w.dtype == np.float64 else np.zeros(problem.dim, dtype=w.dtype)
    steps = None if buffers.steps is None else buffers.steps[spec.rank].numpy()
    reads = None if buffers.reads is None else buffers.reads[spec.rank].numpy()
    # A round averages gradients of different samples: every update reads and writes every
    # block, with the dense gradient (as the simulator's minibatch).
    whole = rounds is not None or consensus is not None or problem.support(0) is None
    dense = block_ops(bounds, None) if whole else None
    shared = w
    if rounds is not None and rounds.group is not None:  # each worker trains its own replica
        w = w.copy()
    rounder = None if rounds is None else _rounder(rounds, spec.rank, spec.workers, w,
                                                   buffers.status.numpy(), gone,
                                                   scenario.inject)
    progress = buffers.progress.numpy()
    rule = None if rounds is not None else _write_rule(scenario, w, progress)
    schedule = LR_FACTORS.get(scenario.run.lr_schedule)
    scales = None if buffers.scales is None else buffers.scales[spec.rank].numpy()
    seen, scale = 0, 1.0
    turn = None if turns is None else turns.turn.numpy()
    # A turn's wait stops for good once a worker died: it keeps its place (Turns).
    waits = (gone if turns is None
             else _stalls(buffers.status.numpy(), gone, bool(_deaths(scenario.inject,
                                                                     spec.rank))))
    injector = _injector(scenario, problem, spec.workers)
    injected = None if buffers.injected is None else buffers.injected[spec.rank].numpy()
    quantize = None if injector is None or not injector.bits else injector.quantize
    error_norm, dropped, delay = 0.0, False, 0
    if rounds is not None and injector is not None and injector.max_delay:
        history = History.of(np.asarray(w, dtype=np.float64), injector.max_delay)
    past = None if history is None else _Past(history, problem.dim)
    copies = local if past is None else past.scratch  # where a read's copies go
    solver = (None if consensus is None
              else _Solver(consensus, scenario, problem, spec.rank, spec.workers))
    residuals = None if buffers.residuals is None else buffers.residuals[spec.rank].numpy()
    # ADMM's Δz where its stores are rounded: what they changed (not the push itself).
    moved = None if solver is None or quantize is None else np.zeros(problem.dim, w.dtype)
    problem.grad(local, 0)  # warm up (first-call costs stay out of the timed loop)
    touch_records(buffers, spec.rank)
    pin(spec)
    wait_for_start(buffers, spec.rank, gone)  # process start-up takes tens of ms each
    slowed = Slowed(scenario.inject, spec.rank, int(buffers.control.numpy()[START]))
    slow = slowed if slowed.active else None
    store = (None if rounds is None else _round_stores(w, shared, block_ops(bounds, None),
                                                       stored, quantize, slow, spec.rank))
    for i in range(spec.quota):
        sample = int(stream.take())
        ops = dense if dense is not None else block_ops(bounds, problem.support(sample))
        # (Before any lock, which a death must not hold; taking turns, a worker holds the
        # one of its last write here, and its death keeps it for good: Turns.)
        if slow is not None:
            try:
                slow.hold()
            except Died:
                if rounder is not None:
                    rounder.leave(i)
                raise
        if lock is not None:
            lock.acquire()
        if turn is not None and i == 0:  # later reads hold the turn of the write before
            _await(turn, 1, spec.rank, turns.nap, waits)  # type: ignore[union-attr]
        if past is not None:  # the gradient sees w as it was τ completions before
            drawn = injector.delay(spec.rank)  # type: ignore[union-attr]
            delay, counted = past.load(local, drawn)
        start()
        if rule is not None:  # (with delays: the count τ was counted from)
            seen = int(progress.sum()) if past is None else counted
        if slow is not None:
            began = slow.before(0)
        for block, index, _, _ in ops:
            copies[index] = w[index]
            if stamp:
                copied(block)
        if slow is not None:
            slow.after(0, began)
        read_end()
        if turn is not None:
            turn[0] += 1  # passed on by its only holder
        if slow is not None:
            began = time.monotonic_ns()
        if solver is not None:  # the local solve: its push, lr included
            (step, sample), support = solver.push(local, sample), None
            if rounded is not None:
                np.copyto(rounded, step, casting="same_kind")
                step = rounded
        else:
            step, support = ((problem.dense_grad(local, sample), None) if rounds is not None
                             else problem.grad(local, sample))
            if injector is not None and injector.errors:
                step, error_norm = injector.error(spec.rank, step, local, support)
            if rounded is None:
                step *= lr
            else:
                step = np.multiply(step, lr, out=rounded[: step.size], casting="same_kind")
        if injector is not None:  # the simulator's draws, in its order (error, then drop)
            dropped = injector.dropped(spec.rank)
        if slow is not None:
            slow.stretch(began)
        if solver is not None:
            solver.publish()
        grad_end()
        if turn is not None:
            a = turns.active  # type: ignore[union-attr]
            _await(turn, 1, a + i * a + spec.rank, turns.nap,  # type: ignore[union-attr]
                   waits)
        if rule is not None:
            step, scale = rule(step, support, local, seen - delay)  # (τ counts a delay)
        if slow is not None and rounder is None:  # (in a round: its writer's stores)
            began = slow.before(1)
        if rounder is not None:
            scale, step = rounder.write(i, step, dropped, store,  # type: ignore[arg-type]
                                        schedule)
        elif dropped or quantize is not None:
            _write_injected(w, ops, step, block_locks, stored if stamp else None,
                            None if dropped else quantize, dropped, moved)
        else:
            for block, index, values, _ in ops:
                if block_locks is None:
                    w[index] -= step[values]
                else:
                    with block_locks[block]:
                        w[index] -= step[values]
                if stamp:
                    stored(block)
        if slow is not None and rounder is None:
            slow.after(1, began)
        written()
        # Counted before the next writer may start (τ and a schedule's m count it), and before
        # the records the parent reads once the run is over.
        done(sample)
        if past is not None:  # (before the turn or the lock passes: the next read sees it)
            past.add(w)
        if turn is not None and i == spec.quota - 1:
            turn[0] += 1  # no next read: it leaves the rotation
        if lock is not None:
            lock.release()
        if scales is not None:  # outside the timed phases
            scales[i] = scale
        if injected is not None:
            injected[i] = (error_norm, float(dropped), delay)
        if residuals is not None:  # (Δz: the push, what its rounded stores moved, or none)
            residuals[i] = solver.residuals(  # type: ignore[union-attr]
                w, None if dropped else step if moved is None else moved)
        if steps is not None:  # (a dropped write subtracted nothing: its row stays 0)
            if not dropped:
                steps[i, slice(None) if support is None else support] = step
            if reads is not None:  # (with delays: the memory the read saw, not the old w)
                reads[i] = copies
