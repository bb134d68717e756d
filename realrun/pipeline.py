"""Model-parallel real runs: asynchronous model parallelism (``amp``, AMPNet), layer-wise
local parallelism (``local``) and stochastic block ADMM (``block_admm``), one worker process
per stage, as the simulator's protocols (``simulator.protocols.staged``) state them.

Stage s's process owns block s of the shared vector (its parameters, ``Problem.stages``):
it alone writes it. Stages talk through one-way pipes between neighbours, each with one
writer and one reader (so a stage killed at any point holds no lock the others wait for):
forward activations to the next stage, for ``amp`` the gradient with respect to its input
back to the previous one, for ``local`` the last stage's "a place is free" to the first. A
stage takes its messages one at a time in the order they were sent (each carries its
``monotonic_ns`` send stamp; the simulator's order of arrival when messages fly for no
time); the first stage's own entries (the first ``max_active`` places, and under ``amp``
each place its backward frees) are messages it sends itself.

The math is the simulator's: ``Problem.forward``, ``backward``, ``local_head`` and
``local_backward``, and ``simulator.rules.mean_step`` for ``update_every`` gradients
written as their mean (and a head's step); the first stage draws its samples from the
simulator's stream of thread 0 (``simulator.timing.sample_stream``). A row is a (stage,
sample): its forward is the READ phase (θ_s in float64 and the forward pass), its backward
the GRADIENT phase (θ_s as it is then, ``up`` the gradient received), then its WRITE (a
group's members write nothing: theirs ends with their writer's). Each stage stamps its rows
with ``monotonic_ns`` into preallocated shared buffers (``realrun.runner``'s, plus the
gradient's and the write's starts and the time the row's sample entered the pipeline: its
first stage's forward start), and the parent builds the trace with the one builder
(``simulator.trace.TraceBuilder``): completions are write ends in time order, a row's
``seen`` the completions that ended by its sample's entry (the simulator's staleness counts
from there). The parent starts, watches and stops the stages as every real run's
(``realrun.runner.drive``): a stage that fails, the timeout or Ctrl-C stops them all, with
the partial trace kept.

With one sample in the pipeline every step is the simulator's to rounding (``amp``: serial
SGD; ``local``: greedy layer-wise SGD; tested against ``simulate`` of the recorded
scenario). Measure mode keeps each write's step and rebuilds the serialized view from them
(:func:`_rebuilt`). Injections, with ``realrun.worker.Slowed``: stragglers (each of a
stage's phases takes ``factor`` times as long), pauses (a stage starts no phase inside its
window) and deaths (the stage stops before its next phase; the others stop once no message
can come, :meth:`_Inbox.stalled`, and the run ends early, as simulated); every other one is
refused.

``block_admm`` passes no message: its two stages are joined by every sample's auxiliary
variable z_i, scaled dual u_i and stage 0's kept output h_i, in shared memory
(:class:`Coupling`; stage 0 writes h, stage 1 z and u, lock-free). Each stage loops on
samples of its own stream (the simulator's thread s's) while the run has updates left, a
count both stages share, taken one update at a time under a lock held for nothing else (so
a slow stage makes fewer rows, and a dead one, stopped by its death before a phase, never
holds it: the other goes on to the run's count, as simulated). An update is a row: its READ
(θ_s in float64), its GRADIENT (``simulator.protocols.staged.block_admm_step``, the
simulator's one copy of the math, on z_i, u_i, h_i in place) and its WRITE; its staleness
counts from its read. The parent adds the run's ``aux_residual`` to the trace
(``simulator.protocols.staged.aux_residual`` at the final θ_0, from the shared z).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from realrun.support import PIPELINE_MODES, recorded, refuse_unsupported
from realrun.timeline import hardware_loss
from realrun.worker import (
    START,
    STATUS_DEAD,
    STATUS_DONE,
    Buffers,
    Died,
    Slowed,
    Stalled,
    WorkerSpec,
    die_with_parent,
    one_thread_each,
    pin,
    pinned_cpus,
    record_failure,
    same_problem,
    touch_records,
    wait_for_release,
    wait_for_start,
)
from simulator.errors import ScenarioError
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.protocols.staged import aux_residual, block_admm_step, stage_outputs
from simulator.scenario import Scenario, scenario_to_toml
from simulator.trace import RECORD, Trace, TraceBuilder

if TYPE_CHECKING:
    from realrun.runner import RealRun
    from simulator.scenario.specs import PipelineSpec

__all__ = ["Coupling", "Links", "run_pipeline", "stage_main"]

# A message's kind, as the simulator's stages send them (a forward message without an
# activation, to the first stage: a sample may enter).
FORWARD, BACKWARD = 0, 1
# Per row, besides realrun.runner's four stamps: the gradient's start, the write's start and
# when the row's sample entered the pipeline (its first stage's forward start).
GRAD_START, WRITE_START, ENTERED = 0, 1, 2
# A message's pickled size beyond its activation's 8 bytes per coordinate (measured: 187).
_MESSAGE_BYTES = 512
_WAIT_S = 0.05  # a stage waiting for a message looks at its parent (and for a stall) this often
# ``Links.flow``, a row per stage r: word s < stages counts the messages stage s sent to r
# (written by s alone), then the messages r took and whether r waits with none to take (a
# stall's test: ``_Inbox.stalled``).
TAKEN, IDLE = -2, -1


@dataclass(frozen=True)
class Links:
    """A stage's ends of the pipes (``multiprocessing`` connections): the readers it takes
    its messages from, and the writers to the next stage, the previous one and the first;
    under ``block_admm`` no pipe, the state both stages share instead."""

    inbox: list[Any]
    ahead: Any = None  # forward activations (not the last stage)
    behind: Any = None  # amp: gradients back (not the first stage)
    first: Any = None  # local, last stage: a place is free
    flow: Any = None  # the messages each stage sent to each and took, and its IDLE (shared)
    coupling: Coupling | None = None  # block_admm


@dataclass(frozen=True)
class Coupling:
    """What ``block_admm``'s two stages share: every sample i's auxiliary variable z_i,
    scaled dual u_i and stage 0's kept output h_i, each one flat float64 shared tensor with
    sample i's values from ``offsets[i]`` in ``shapes[i]`` (a torch model's last minibatch
    can be shorter), and the updates the stages started (``started``, one int64), counted
    under ``lock`` up to ``updates``."""

    z: Any
    u: Any
    h: Any
    offsets: list[int]
    shapes: list[tuple[int, ...]]
    started: Any
    lock: Any
    updates: int

    def samples(self, flat: np.ndarray) -> list[np.ndarray]:
        """Each sample's values in ``flat`` (one of the buffers, as numpy): views."""
        return [flat[a:b].reshape(shape) for a, b, shape in
                zip(self.offsets, self.offsets[1:], self.shapes, strict=False)]


def run_pipeline(scenario: Scenario, dtype: str = "float32", timeout: float | None = None,
                 progress: Callable[[int], object] | None = None,
                 on_start: Callable[[list[int]], object] | None = None,
                 problem: Problem | None = None, pin_cpus: bool = False,
                 notice: Callable[[str], object] | None = None,
                 measure_every: int | None = None) -> RealRun:
    """Train ``scenario``'s problem stage by stage as its ``run.protocol`` (``amp``,
    ``local`` or ``block_admm``) says, one process per stage; returns the run (a
    ``realrun.runner.RealRun``, failed or not; its ``mode`` the protocol). ``progress``
    hears rows as they complete, ``on_start`` gets the stages' pids, ``pin_cpus`` pins stage
    s to a CPU of its own (``realrun.worker.pinned_cpus``), ``notice`` hears what the parent
    does once the run is stopped; ``problem`` reuses a prebuilt problem in the parent.
    ``measure_every = n``: the stages also keep their steps, and the parent rebuilds the
    serialized view from them and measures every n-th completion's δ on its stage
    (:func:`_rebuilt`).

    The fields every real backend refuses (a simulated machine: ``[timing]``, devices ...)
    are ``realrun.runner.run_real``'s check (``realrun.support``); this checks what the
    stages run.

    Raises:
        ScenarioError: another protocol, an unknown dtype, timeout <= 0, what the
            simulator's protocol refuses (a problem without stages, threads or blocks other
            than its stages, ``run.updates`` not a multiple of stages × update_every,
            block_admm on other than two stages, a split or a hardware model), an injection
            other than stragglers, pauses and deaths (or a straggler faster than its core),
            or more samples in flight than the pipes between stages hold (``max_active``).
    """
    import torch

    from realrun.runner import (
        DTYPES,
        RealRun,
        _allocate,
        _check_buffers,
        _host,
        _one_of,
        curve_every,
        drive,
    )

    protocol = scenario.run.protocol
    _one_of("run.protocol", protocol, PIPELINE_MODES)
    _one_of("--dtype", dtype, DTYPES)
    if timeout is not None and not timeout > 0:
        raise ScenarioError("--timeout", timeout, "must be > 0 seconds")
    refuse_unsupported(scenario, "shm", protocol)
    problem = problem if problem is not None else make_problem(scenario.problem)
    stages = _stages(scenario, problem)
    if measure_every is not None and measure_every < 1:
        raise ScenarioError("--measure-every", measure_every, "must be >= 1")
    scenario = recorded(scenario, protocol, stages, problem.sparse, measure_every)
    updates, every = scenario.run.updates, _every(scenario)
    context = torch.multiprocessing.get_context("spawn")
    if protocol == "block_admm":  # a stage may make every update (the other too slow)
        quota, links = updates, _coupling(context, problem, updates)
    else:
        quota = updates // stages
        links = _links(context, stages, protocol, _options(scenario).max_active,
                       _message_bytes(problem, stages))
    _check_buffers(scenario, problem, stages * quota, dtype, measure_every is not None,
                   True)
    w_star, _ = problem.optimum()
    buffers = _allocate(problem.dim, stages, stages, quota, dtype, False, "cpu", False,
                        True, scaled=True)
    buffers.w.copy_(torch.as_tensor(problem.initial()))
    begun = torch.full((stages, quota, 3), -1, dtype=torch.int64).share_memory_()
    # Measure mode: write k of stage s keeps its step in row k, on the stage's coordinates.
    steps = (torch.zeros((quota // every, problem.dim), dtype=torch.float64).share_memory_()
             if measure_every is not None else None)
    toml = scenario_to_toml(scenario)
    cpus = pinned_cpus(stages) if pin_cpus else None
    processes = [context.Process(target=stage_main, args=(
        WorkerSpec(s, stages, quota, toml, -1 if cpus is None else cpus[s],
                   problem.fingerprint()), buffers, begun, links[s], steps), daemon=True)
        for s in range(stages)]
    run = drive(buffers, processes, updates, timeout, progress, on_start, notice,
                curve_every(updates, scenario.metrics.curve_points))
    finished = time.monotonic()
    rebuilt = None if steps is None else (scenario, steps.numpy(), dtype)
    extras = {"dead_threads": np.asarray(sorted(run.dead), dtype=np.int64)}
    coupling = links[0].coupling
    if coupling is not None:  # the simulator's BlockADMM.report, on the shared z
        first = (problem.stages() or [])[0]
        residual = aux_residual(problem, _host(buffers.w)[first],
                                coupling.samples(coupling.z.numpy()))
        extras["aux_residual"] = np.array([residual])
    trace, w_rebuilt = _trace(buffers, begun.numpy(), every, problem, w_star, run.snapshots,
                              toml, updates, extras, rebuilt)
    loss = None if w_rebuilt is None else hardware_loss(
        w_rebuilt, trace["w_final"], problem.initial(), "rebuilt")
    return RealRun(scenario, problem, trace, stages, protocol, dtype, run.seconds,
                   run.failure, cpus=cpus, start_seconds=run.start_seconds,
                   finish_seconds=time.monotonic() - finished, measure_every=measure_every,
                   hardware_loss=loss)


def _stages(scenario: Scenario, problem: Problem) -> int:
    """The problem's stages, checked as the simulator's protocol checks them.

    Raises:
        ScenarioError: as ``Amp.bind``."""
    make_protocol(scenario.run.protocol, scenario).bind(problem)
    return len(problem.stages() or [])


def _options(scenario: Scenario) -> PipelineSpec:
    """The pipeline's options: ``scenario.local`` or ``scenario.amp`` (``max_active``,
    ``update_every``)."""
    return scenario.local if scenario.run.protocol == "local" else scenario.amp


def _every(scenario: Scenario) -> int:
    """The gradients a stage's write takes: ``update_every`` (amp, local); 1 under
    block_admm, whose every update writes."""
    return 1 if scenario.run.protocol == "block_admm" else _options(scenario).update_every


def _coupling(context: Any, problem: Problem, updates: int) -> list[Links]:
    """block_admm's two stages' links: no pipe, the :class:`Coupling` both share, set up as
    ``BlockADMM.setup`` does: every z_i and h_i at stage 0's output h(θ_0; x_i) from w_0,
    every u_i at 0."""
    import torch

    outputs = stage_outputs(problem, problem.initial()[(problem.stages() or [])[0]])
    flat = np.concatenate([h.ravel() for h in outputs]).astype(np.float64)
    h = torch.from_numpy(flat).share_memory_()
    coupling = Coupling(
        z=h.clone().share_memory_(), u=torch.zeros_like(h).share_memory_(), h=h,
        offsets=np.cumsum([0, *(o.size for o in outputs)]).tolist(),
        shapes=[o.shape for o in outputs],
        started=torch.zeros(1, dtype=torch.int64).share_memory_(), lock=context.Lock(),
        updates=updates)
    return [Links([], coupling=coupling) for _ in range(2)]


def _message_bytes(problem: Problem, stages: int) -> int:
    """The largest message a stage sends, pickled (an activation, or a gradient as wide)."""
    widths = [problem.stage_width(s) for s in range(stages - 1)]
    return 8 * max(widths, default=0) + _MESSAGE_BYTES


def _links(context: Any, stages: int, protocol: str, max_active: int,
           message: int) -> list[Links]:
    """The pipes between the stages: forward from each to the next; under ``amp`` back from
    each to the previous; under ``local`` from the last to the first. Every sample in
    flight has at most one message on its way, so at most ``max_active`` messages of up to
    ``message`` bytes wait in a pipe: each is made to hold that much, and a send never
    blocks (two stages each blocked on the other's full pipe would wait for ever).

    Raises:
        ScenarioError: naming ``protocol``.max_active, where a pipe cannot be made to hold
            that much (Linux: ``/proc/sys/fs/pipe-max-size``, 1 MiB by default)."""
    import torch

    local = protocol == "local"
    inbox: list[list[Any]] = [[] for _ in range(stages)]
    out: list[dict[str, Any]] = [{} for _ in range(stages)]

    def pipe(sender: int, receiver: int, name: str) -> None:
        reader, writer = context.Pipe(duplex=False)
        _hold(writer, max_active, message, protocol)
        inbox[receiver].append(reader)
        out[sender][name] = writer

    for s in range(stages - 1):
        pipe(s, s + 1, "ahead")
        if not local:
            pipe(s + 1, s, "behind")
    if local and stages > 1:
        pipe(stages - 1, 0, "first")
    flow = torch.zeros((stages, stages + 2), dtype=torch.int64).share_memory_()
    return [Links(inbox[s], **out[s], flow=flow) for s in range(stages)]


def _hold(writer: Any, max_active: int, message: int, section: str) -> None:
    """Make the pipe of ``writer`` hold ``max_active`` messages of ``message`` bytes (a
    pipe holds 64 KiB unless made larger, on Linux).

    Raises:
        ScenarioError: naming ``section``.max_active, where it cannot."""
    most, size = max_active * message, 65536
    if most > size:
        with contextlib.suppress(OSError, AttributeError):
            size = fcntl.fcntl(writer.fileno(), fcntl.F_SETPIPE_SZ, most)
    if most > size:
        raise ScenarioError(f"{section}.max_active", max_active,
                            f"its samples' messages (up to {most} bytes) would not fit in a "
                            f"pipe between stages ({size} bytes): fewer samples in flight")


# -- a stage's process ----------------------------------------------------------------------

def stage_main(spec: WorkerSpec, buffers: Buffers, begun: Any, links: Links,
               steps: Any = None) -> None:
    """Stage ``spec.rank``: set up, wait for the common start, take and answer messages until
    it has written every sample's gradient, then wait for the release; on any exception
    record it and exit with status 1 (as ``realrun.worker.worker_main``). Ignores SIGINT:
    the parent decides how to stop. ``steps`` (measure mode): where it keeps each write's
    step."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gone = die_with_parent()
    try:
        _Stage(spec, buffers, begun, links, gone, steps).run()
        buffers.status[spec.rank] = STATUS_DONE
        wait_for_release(buffers, gone)
    except (Died, Stalled) as stop:  # an injected death; or a pipeline a dead stage stalled
        buffers.status[spec.rank] = STATUS_DEAD if isinstance(stop, Died) else STATUS_DONE
        wait_for_release(buffers, gone)
    except BaseException as err:  # every failure, SystemExit included, must reach the parent
        record_failure(buffers, spec.rank, err)
        raise SystemExit(1) from None


class _Inbox:
    """A stage's messages in the order they were sent: the next message of each pipe, and
    the ones it sends itself (``put``), taken by their send stamps. It counts what it takes
    in its row of ``flow`` (the senders count what they send there) and says there when it
    waits with nothing to take (``IDLE``), so that a stage can tell a pipeline a dead stage
    stalled (:meth:`stalled`)."""

    def __init__(self, readers: list[Any], gone: Callable[[], bool], flow: np.ndarray,
                 stage: int, status: np.ndarray) -> None:
        self.readers, self.gone = readers, gone
        self.flow, self.stage, self.status = flow, stage, status
        self.heads: list[tuple[int, int, Any]] = []  # (sent, tie, message), a heap
        self.waiting = [False] * len(readers)  # whether the reader's next one is in heads
        self.tie = 0

    def put(self, message: tuple[Any, ...], sent: int) -> None:
        self.tie += 1
        heapq.heappush(self.heads, (sent, self.tie, (-1, message)))

    def take(self) -> tuple[Any, ...]:
        """The earliest sent message; waits for one.

        Raises:
            SystemExit: the parent is gone.
            Stalled: no message can come any more (:meth:`stalled`)."""
        from multiprocessing.connection import wait

        mine = self.flow[self.stage]
        while True:
            for k, reader in enumerate(self.readers):
                if not self.waiting[k] and reader.poll():
                    mine[IDLE] = 0  # (before the count: see ``stalled``)
                    sent, message = reader.recv()
                    mine[TAKEN] += 1
                    self.waiting[k] = True
                    self.tie += 1
                    heapq.heappush(self.heads, (sent, self.tie, (k, message)))
            if self.heads:
                _, _, (k, message) = heapq.heappop(self.heads)
                if k >= 0:
                    self.waiting[k] = False
                return message
            mine[IDLE] = 1
            if not wait(self.readers, _WAIT_S):
                if self.gone():
                    raise SystemExit("the parent is gone")
                if self.stalled():
                    raise Stalled

    def stalled(self) -> bool:
        """Whether a stage died and no message can come any more: every stage is dead,
        done, or waiting with nothing to take, and every message sent to a stage not dead
        was taken (the counts read before and after the flags, and unchanged: a stage clears
        its ``IDLE`` before it counts a message taken, so one that took a message while the
        flags were read shows either as not idle or in the counts). The simulator's dead
        stage stalls its pipeline for good, and its run ends there."""
        status = self.status.copy()
        dead = status == STATUS_DEAD
        if not dead.any():
            return False
        before = self.flow.copy()
        quiet = all(int(status[s]) in (STATUS_DONE, STATUS_DEAD) or self.flow[s, IDLE]
                    for s in range(len(status)))
        unchanged = bool((before[:, :IDLE] == self.flow[:, :IDLE]).all())
        waiting = before[~dead, :TAKEN].sum(axis=1) - before[~dead, TAKEN]
        return quiet and unchanged and not waiting.any()


class _Stage:
    """One stage's loop, as ``simulator.protocols.staged.Amp``'s ``loop`` and
    ``_backward`` run it, or ``BlockADMM``'s ``loop`` and ``compute``."""

    def __init__(self, spec: WorkerSpec, buffers: Buffers, begun: Any, links: Links,
                 gone: Callable[[], bool], steps: Any = None) -> None:
        from simulator.rules import LR_FACTORS
        from simulator.scenario import scenario_from_dict
        from simulator.timing import sample_stream

        scenario = scenario_from_dict(tomllib.loads(spec.scenario_toml))
        self.problem = problem = make_problem(scenario.problem)
        same_problem(problem, spec.fingerprint, f"stage {spec.rank}")
        one_thread_each()  # after the problem: the pools its libraries loaded are limited too
        self.spec, self.buffers, self.links, self.gone = spec, buffers, links, gone
        self.stage, stages = spec.rank, spec.workers
        self.last = self.stage == stages - 1
        self.local = scenario.run.protocol == "local"
        self.every, self.coupling = _every(scenario), links.coupling
        self.part = (problem.stages() or [])[self.stage]
        self.w = buffers.w.numpy()
        size = self.part.stop - self.part.start
        single = self.w.dtype != np.float64
        self.copy = np.zeros(size) if single else None
        self.rounded = np.zeros(size, dtype=self.w.dtype) if single else None
        self.lr, self.schedule = scenario.run.lr, LR_FACTORS.get(scenario.run.lr_schedule)
        # The simulator's thread s's samples: amp's and local's first stage's, each of
        # block_admm's.
        self.stream = (sample_stream(scenario.run.seed, stages, self.stage, problem.n_samples)
                       if self.stage == 0 or self.coupling is not None else None)
        self.inject = scenario.inject
        self.head = (problem.local_head(self.stage) if self.local and not self.last else None)
        self.head_grads: list[np.ndarray] = []
        rank = self.stage
        self.times, self.begun = buffers.times[rank].numpy(), begun[rank].numpy()
        self.copy_end, self.store_end = (buffers.copy_end[rank].numpy(),
                                         buffers.store_end[rank].numpy())
        self.samples, self.scales = buffers.samples[rank].numpy(), buffers.scales[rank].numpy()
        self.progress = buffers.progress.numpy()
        self.rows: dict[int, tuple[Any, np.ndarray, int]] = {}  # seq → forward's
        self.pending: list[tuple[int, np.ndarray]] = []  # (seq, lr·g) to average
        self.steps = None if steps is None else steps.numpy()  # measure mode: each write's
        self.writes = 0
        if self.coupling is None:
            self.max_active = _options(scenario).max_active
            self.flow = links.flow.numpy()
            self.inbox = _Inbox(links.inbox, gone, self.flow, self.stage,
                                buffers.status.numpy())
        else:
            coupling = self.coupling
            self.z, self.u, self.h = (coupling.samples(t.numpy())
                                      for t in (coupling.z, coupling.u, coupling.h))
            self.started = coupling.started.numpy()
            self.rho, self.aux_lr = scenario.block_admm.rho, scenario.block_admm.aux_lr
        self._warm_up()

    def _warm_up(self) -> None:
        """Every stage's passes once on w_0 (first-call costs stay out of the timed loop)."""
        problem, w = self.problem, self.problem.initial()
        parts, a, caches, outs = problem.stages() or [], None, [], []
        for s, part in enumerate(parts):
            a, cache = problem.forward(s, w[part], a, 0)
            caches.append(cache)
            outs.append(a)
        up = None
        for s in reversed(range(len(parts))):
            _, up = problem.backward(s, w[parts[s]], caches[s], up, 0)
        if self.head is not None:
            problem.local_backward(self.stage, w[self.part], self.head, caches[self.stage],
                                   outs[self.stage], 0)

    def run(self) -> None:
        """From the common start, the stage's loop: :meth:`_pipeline` or, under
        block_admm, :meth:`_coupled`."""
        touch_records(self.buffers, self.stage)
        self.begun += 0  # its pages mapped before the start (touch_records)
        pin(self.spec)
        wait_for_start(self.buffers, self.stage, self.gone)
        slowed = Slowed(self.inject, self.stage, int(self.buffers.control.numpy()[START]))
        self.slow = slowed if slowed.factor > 1 else None
        self.held = slowed if slowed.windows or slowed.death is not None else None
        if self.coupling is None:
            self._pipeline()
        else:
            self._coupled()

    def _pipeline(self) -> None:
        """Forwards and backwards, in the order their messages were sent, until the stage
        has written every sample's gradient."""
        samples, seq, done = self.spec.quota, 0, 0
        self.entered = min(self.max_active, samples)  # samples let into the pipeline
        if self.stage == 0:
            for _ in range(self.entered):
                self.inbox.put((FORWARD, None, -1, -1, []), 0)
        while done < samples:
            kind, payload, sample, entered, seqs = self.inbox.take()
            if kind == BACKWARD:
                self._backward(seqs[-1], payload, seqs[:-1])
                done += 1
                continue
            self._forward(seq, payload, sample, entered, seqs)  # (and its backward, there)
            seq += 1
            done += self.last or self.local

    def _forward(self, i: int, a: np.ndarray | None, sample: int, entered: int,
                 seqs: list[int]) -> None:
        """Row ``i``: the READ phase (θ_s's copy and the forward pass), the activation sent
        on; the last stage's backward (or, under ``local``, every stage's) right after."""
        self._hold()
        began = time.monotonic_ns()
        if self.stage == 0:  # the sample enters: drawn now, from thread 0's stream
            sample, entered = int(self.stream.take()), began  # type: ignore[union-attr]
        theta = self._theta()
        out, cache = self.problem.forward(self.stage, theta, a, sample)
        self._read_end(i, began, sample, entered)
        if not self.last:
            self._send(self.links.ahead, self.stage + 1,
                       (FORWARD, out, sample, entered, [*seqs, i]))
        self.rows[i] = (cache, out, sample)
        if self.last or self.local:
            self._backward(i, None, [] if self.local else seqs)

    def _backward(self, i: int, up: np.ndarray | None, seqs: list[int]) -> None:
        """Row ``i``'s GRADIENT phase from the gradient ``up`` it received, with θ_s as it is
        now; the gradient with respect to its input sent back to ``seqs``' last; its write (or
        its place among the gradients to average); then, where the sample leaves the
        pipeline, the next one's entry."""
        problem, stage = self.problem, self.stage
        self._hold()
        cache, out, sample = self.rows.pop(i)
        began = time.monotonic_ns()
        theta = self._theta()
        if self.head is not None:
            g, head = problem.local_backward(stage, theta, self.head, cache, out, sample)
            self.head_grads.append(head)
            back = None
        else:
            g, back = problem.backward(stage, theta, cache, up, sample)
        g *= self.lr  # (a new array: the step, as the simulator's lr·g)
        self._gradient_end(i, began)
        if seqs:
            self._send(self.links.behind, self.stage - 1, (BACKWARD, back, sample, -1, seqs))
        self._keep(i, g)
        if stage == (self.spec.workers - 1 if self.local else 0):
            self._free()

    def _coupled(self) -> None:
        """block_admm: while the run has updates left, an update of the next sample of the
        stage's own stream (``BlockADMM.loop``); no message passes."""
        i = 0
        while self._claim():
            self._update(i, int(self.stream.take()))  # type: ignore[union-attr]
            i += 1

    def _claim(self) -> bool:
        """Count an update started, if the run has one left (the simulator's
        ``engine.started < engine.updates``, counted as the update starts): the lock is
        held for the count alone, before any phase (where a death can stop the stage)."""
        assert self.coupling is not None
        with self.coupling.lock:
            if self.started[0] >= self.coupling.updates:
                return False
            self.started[0] += 1
        return True

    def _update(self, i: int, sample: int) -> None:
        """block_admm's row ``i``, of ``sample``: the READ (θ_s in float64), the GRADIENT
        (:func:`~simulator.protocols.staged.block_admm_step` on the sample's shared
        auxiliary variables, read and written in place without a lock) and the WRITE; its
        staleness counts from its read (``ENTERED``)."""
        self._hold()
        began = time.monotonic_ns()
        theta = self._theta()
        self._read_end(i, began, sample, began)
        self._hold()
        began = time.monotonic_ns()
        g = block_admm_step(self.problem, self.stage, theta, sample, self.z[sample],
                            self.u[sample], self.h[sample], self.rho, self.aux_lr)
        g *= self.lr  # (the simulator's lr·g)
        self._gradient_end(i, began)
        self._keep(i, g)

    def _read_end(self, i: int, began: int, sample: int, entered: int) -> None:
        """Row ``i``'s READ, begun at ``began`` (ns), is done: stretched for a straggler,
        stamped with its sample and the time the sample entered (``entered``)."""
        if self.slow is not None:
            self.slow.stretch(began)
        end = time.monotonic_ns()
        self.times[i, 0], self.times[i, 1] = began, end
        self.copy_end[i, self.stage] = end  # the block's copy ends with the read, as simulated
        self.begun[i, ENTERED], self.samples[i] = entered, sample

    def _gradient_end(self, i: int, began: int) -> None:
        """Row ``i``'s GRADIENT, begun at ``began`` (ns), is done: stretched, stamped."""
        if self.slow is not None:
            self.slow.stretch(began)
        self.times[i, 2], self.begun[i, GRAD_START] = time.monotonic_ns(), began

    def _keep(self, i: int, step: np.ndarray) -> None:
        """Row ``i``'s ``step`` (lr·g): written now, or with its group's last
        (``update_every``)."""
        self.pending.append((i, step))
        if len(self.pending) == self.every:
            self._write()

    def _write(self) -> None:
        """The WRITE of the pending gradients' mean step (``simulator.rules.mean_step``; a
        learning-rate schedule's factor at the completions counted + 1), and the head's step
        with it; the group's rows recorded, its members' writes ending with it."""
        from simulator.rules import mean_step

        self._hold()
        began = time.monotonic_ns()
        rows = [i for i, _ in self.pending]
        step = (self.pending[0][1] if self.every == 1
                else mean_step([s for _, s in self.pending]))
        scale = 1.0
        if self.schedule is not None:
            scale = self.schedule(int(self.progress.sum()) // self.every + 1)
            step = step * scale
        if self.rounded is not None:  # one same-dtype subtraction, as realrun.worker's
            np.copyto(self.rounded, step, casting="same_kind")
            step = self.rounded
        self.w[self.part] -= step
        if self.steps is not None:  # (after the store: the step as subtracted, exactly)
            self.steps[self.writes, self.part] = step
        self.writes += 1
        if self.slow is not None:
            self.slow.stretch(began)
        end = time.monotonic_ns()
        if self.head is not None:  # the head's step, as the stage's (local)
            self.head -= self.lr * scale * mean_step(self.head_grads)
            self.head_grads.clear()
        writer = rows[-1]
        for i in rows:
            self.times[i, 3] = end
            self.begun[i, WRITE_START] = began if i == writer else end
            self.store_end[i, self.stage] = end if i == writer else -1
            self.scales[i] = scale if i == writer else 1.0
        self.pending.clear()
        # Counted last, once its rows are whole (the parent reads that many).
        self.progress[self.stage] += len(rows)

    def _hold(self) -> None:
        """Before a phase: wait out a pause window the clock is in (``[[inject.pauses]]``),
        and stop once the stage's death has come (``[[inject.deaths]]``), as the simulator's
        stage does before each of its phases.

        Raises:
            Died: the stage's death has come."""
        if self.held is not None:
            self.held.hold()

    def _free(self) -> None:
        """A sample left the pipeline here: the next one enters (the first stage's own
        message, or one sent to it)."""
        if self.entered == self.spec.quota:
            return
        self.entered += 1
        message: tuple[Any, ...] = (FORWARD, None, -1, -1, [])
        if self.stage == 0:
            self.inbox.put(message, time.monotonic_ns())
        else:
            self._send(self.links.first, 0, message)

    def _theta(self) -> np.ndarray:
        """θ_s as it is now, in float64: the shared block itself, or its copy into the
        stage's one buffer (a forward's cache holds none of it: the simulator's read copy is
        overwritten by the next read too). Allocating a copy per pass made a 131,584-value
        stage's backward 5 times as long (its heap trimmed and faulted in again)."""
        if self.copy is None:
            return self.w[self.part]
        np.copyto(self.copy, self.w[self.part])
        return self.copy

    def _send(self, link: Any, to: int, message: tuple[Any, ...]) -> None:
        self.flow[to, self.stage] += 1  # (counted before it can be taken)
        link.send((time.monotonic_ns(), message))


# -- the trace -------------------------------------------------------------------------------

def _trace(buffers: Buffers, begun: np.ndarray, every: int, problem: Problem,
           w_star: np.ndarray, snapshots: list[tuple[int, int, np.ndarray]],
           toml: str, updates: int, extras: dict[str, np.ndarray],
           rebuilt: tuple[Scenario, np.ndarray, str] | None = None,
           ) -> tuple[Trace, np.ndarray | None]:
    """The trace of the rows the stages completed, through the one builder: rows in
    completion order (a group's members just before their writer), each row's ``seen`` the
    completions that ended by its sample's entry, one block operation per row (its stage's
    block); the loss curve from the parent's snapshots (taken every so many rows: a stage
    counts its rows a group at a time, so rows / ``every`` completions) and the final
    vector; ``updates``: the rows of a whole run; ``extras``: the trace's (``dead_threads``,
    the stages an injected death stopped; block_admm's ``aux_residual``). ``rebuilt``
    (measure mode: the
    scenario, the stages' steps and the run's dtype): the measured rows and the exact loss
    curve of :func:`_rebuilt` instead, and the rebuilt final vector with the trace."""
    from realrun.runner import _host

    stages = int(buffers.progress.numel())
    counts = [int(buffers.progress[s]) for s in range(stages)]
    times = np.concatenate([buffers.times[s, :n].numpy() for s, n in enumerate(counts)])
    extra = np.concatenate([begun[s, :n] for s, n in enumerate(counts)])
    thread = np.concatenate([np.full(n, s) for s, n in enumerate(counts)]).astype(np.int64)
    seq = np.concatenate([np.arange(n) for n in counts]).astype(np.int64)
    writer = np.concatenate([buffers.store_end[s, :n, s].numpy() >= 0
                             for s, n in enumerate(counts)])
    origin = int(times[:, 0].min()) if len(times) else 0
    rel, extra = times - origin, extra - origin
    write_end = rel[:, 3]
    order = np.lexsort((thread, writer, write_end))  # completion order
    # Completion t of each writer, by its write's end; a member takes its group's writer's.
    step = np.zeros(len(rel), dtype=np.int64)
    written = order[writer[order]]
    step[written] = np.arange(1, written.size + 1)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    step = step[first[thread] + (seq // every) * every + every - 1]
    ends = np.sort(write_end[writer])
    seen = np.searchsorted(ends, extra[:, ENTERED], side="right")
    write_start = np.where(writer, extra[:, WRITE_START], write_end)
    columns = {
        "uid": np.argsort(np.lexsort((thread, rel[:, 0]))), "thread": thread,
        "thread_seq": seq, "sample": np.concatenate(
            [buffers.samples[s, :n].numpy() for s, n in enumerate(counts)]),
        "step": step, "read_start": rel[:, 0], "read_end": rel[:, 1],
        "grad_start": extra[:, GRAD_START], "grad_end": rel[:, 2],
        "write_start": write_start, "write_end": write_end,
        "grad_ns": rel[:, 2] - extra[:, GRAD_START],
        # A stage does no local work before a forward: it waits for its messages, which the
        # simulator's pipeline models as such (its timing.idle is 0).
        "idle_ns": np.zeros(len(rel)), "seen": seen, "completed": step,
        "overwrote": np.zeros(len(rel)), "delay": np.zeros(len(rel)),
        "error_norm": np.zeros(len(rel)), "dropped": np.zeros(len(rel), dtype=bool),
        "lr_scale": np.concatenate([buffers.scales[s, :n].numpy()
                                    for s, n in enumerate(counts)]),
        "measured": np.zeros(len(rel), dtype=bool),
        **{name: np.full(len(rel), np.nan) for name in ("s_norm", "g_norm", "delta_norm",
                                                        "delta_dot")}}
    w_rebuilt = None
    if rebuilt is not None:
        scenario, steps, dtype = rebuilt
        w_rebuilt, measured, exact_curve = _rebuilt(
            scenario, problem, steps, dtype, order, writer, thread, seq, columns, every, first)
        columns.update(measured)
    records = {name: np.asarray(columns[name])[order] for name in RECORD}
    ops = {"block": thread[order], "read_ns": (rel[:, 1] - rel[:, 0])[order],
           "write_ns": np.where(writer, write_end - write_start, 0)[order],
           "copied": rel[order, 1], "stored": np.where(writer, write_end, -1)[order]}
    builder = TraceBuilder()
    builder.extend(records, np.ones(len(rel), dtype=np.int64), ops)
    w_final = _host(buffers.w)
    done = int(written.size)
    finished = int(buffers.progress.sum()) == updates
    last = int(times[:, 3].max()) if finished and len(times) else time.monotonic_ns()
    points = [(t // every, stamp, w) for t, stamp, w in snapshots]
    points.append((done, max(last, points[-1][1]), w_final))
    t = np.asarray([p[0] for p in points], dtype=np.int64)
    curve = {"curve_t": t,
             "curve_time": np.asarray([max(p[1] - origin, 0) for p in points],
                                      dtype=np.int64),
             "curve_loss": np.asarray([problem.full_loss(p[2]) for p in points]),
             "curve_dist2": np.asarray([float((p[2] - w_star) @ (p[2] - w_star))
                                        for p in points]),
             "curve_n": np.searchsorted(np.sort(step), t, side="right").astype(np.int64)}
    if rebuilt is not None:
        curve = exact_curve
    return builder.build(toml, problem.initial(), w_final, curve,
                         extras=extras, source="real"), w_rebuilt


def _rebuilt(scenario: Scenario, problem: Problem, steps: np.ndarray, dtype: str,
             order: np.ndarray, writer: np.ndarray, thread: np.ndarray, seq: np.ndarray,
             columns: dict[str, Any], every: int,
             first: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray],
                                         dict[str, np.ndarray]]:
    """Measure mode: the serialized view rebuilt from w_0 by every write's step, in
    completion order and in the run's dtype, as the stage subtracted it (each stage alone
    writes its block, so nothing can be lost: the rebuilt vector is the real one), measured
    by the simulator's :class:`~simulator.view.SerializedView` as the simulator's stages are:
    every ``metrics.every``-th completion's δ on its stage's block, against the exact
    gradient of its samples there at w_{t−1}, on the group's writer row (its members
    unmeasured); and the loss curve at the simulator's checkpoints. Returns the rebuilt final
    vector, the measured columns (by row, as ``columns``) and the curve."""
    from simulator.view import UNMEASURED, SerializedView

    parts, rows = problem.stages() or [], len(thread)
    view = SerializedView(problem, scenario.run.lr, problem.initial(), scenario.run.updates,
                          True, scenario.metrics.every, scenario.metrics.curve_points)
    w = problem.initial().astype(dtype)
    measures = [UNMEASURED] * rows
    t = n = 0
    samples, scales, ends = columns["sample"], columns["lr_scale"], columns["write_end"]
    for j in order.tolist():
        n += 1
        if not writer[j]:
            continue
        stage, k = int(thread[j]), int(seq[j]) // every
        part = parts[stage]
        w[part] -= steps[k, part].astype(dtype)
        t += 1
        group = samples[first[stage] + k * every:first[stage] + (k + 1) * every].tolist()
        measures[j] = view.complete(t, w.astype(np.float64), group, int(ends[j]),
                                    float(scales[j]), n, part)
    view.finish(t, w.astype(np.float64), int(ends.max()) if rows else 0, n)
    measured = {name: np.asarray([getattr(m, name) for m in measures])
                for name in ("measured", "s_norm", "g_norm", "delta_norm", "delta_dot")}
    return w.astype(np.float64), measured, view.curve_arrays()
