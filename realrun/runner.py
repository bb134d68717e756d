"""The parent of a real run: start workers, watch them, stop cleanly, merge the trace.

Workers are ``torch.multiprocessing`` processes (spawn) on one shared flat parameter tensor
(host shared memory, or a CUDA tensor shared by CUDA IPC), or threads of this process (each
on its own CUDA stream; ``launch="threads"``).
The parent polls every 10 ms: it follows progress (shared counters, no locks), samples the
shared vector for the loss curve (at most once per poll, a copy during which no update was
counted), and notices a worker that died (exception or signal), the
timeout, or Ctrl-C (SIGTERM too, where the caller turns it into KeyboardInterrupt, as the CLI
does). On any of those it stops every worker (terminate, then kill) and still merges what the
workers completed, so a failed run keeps its partial trace and says why. The parent signals
the workers only through flags in shared memory (the start, the release), which nothing can
leave locked: a worker killed at any stage never blocks the parent; workers die with the
parent (``realrun.worker.die_with_parent``).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun.host.probe import (
    built,
    line_latency_ns,
    probe_cpus,
    shared_write_cost,
    write_meetings,
)
from realrun.records import compiled
from realrun.support import (
    PIPELINE_MODES,
    ROUND_MODES,
    recorded,
    refuse_torch_injections,
    refuse_unmeasurable,
    refuse_unsupported,
)
from realrun.timeline import Measure, WorkerRecord, merge
from realrun.worker import (
    MESSAGE_BYTES,
    RELEASE,
    START,
    STATUS_DEAD,
    STATUS_DONE,
    STATUS_FAILED,
    Buffers,
    Consensus,
    History,
    Rounds,
    Turns,
    WorkerSpec,
    one_thread_env,
    pinned_cpus,
    worker_main,
)
from simulator.budget import check_memory, preflight
from simulator.errors import ScenarioError
from simulator.memory import block_bounds
from simulator.problems import Problem, make_problem
from simulator.scenario import Scenario, scenario_to_toml
from simulator.trace import Trace

__all__ = ["MODES", "Driven", "RealRun", "drive", "run_real"]

MODES = ("lockfree", "blocklock", "locked", "serial", "minibatch", "allreduce", "roundrobin",
         "staleness_lr", "dcasgd", "admm", "amp", "local", "block_admm")
DTYPES = ("float32", "float64")
LAUNCHES = ("processes", "threads")
# Measured with bench/gpu.py (bench/README.md): the faster way to run CUDA workers.
CUDA_LAUNCH = "threads"
PATTERNS = ("shared", "host")
_POLL_S = 0.01
# The start is posted this far ahead (ns): every waiting worker (asleep, looking every
# realrun.worker.START_POLL_S) sees it in time and spins to the same instant.
_START_LEAD_NS = 10_000_000


@dataclass
class RealRun:
    """A finished (or stopped) real run: its scenario, problem, trace and what went wrong."""

    scenario: Scenario
    problem: Problem
    trace: Trace
    workers: int
    mode: str
    dtype: str
    seconds: float
    failure: dict[str, Any] | None
    hardware_loss: dict[str, Any] | None = None
    measure_every: int | None = None
    device: str = "cpu"
    launch: str = "processes"
    pattern: str = "shared"
    cpus: list[int] | None = None  # worker r's CPU when pinned
    recorder: str = "python"  # how workers recorded their updates: "c" (realrun/_records.c)
    # CPU-to-CPU cache-line latency just before the workers started and after they finished
    # (realrun/host/probe.py): {"cpus", "before_ns", "after_ns"}; None with one worker or no probe
    # (probes run when asked: run_real's ``probe``).
    cpu_latency: dict[str, Any] | None = None
    # What a write of the run's vector costs on lines the other CPU copied last, measured
    # before the workers started (realrun/host/probe.py ``shared_write_cost``; with one worker
    # too, on the first two usable CPUs); None for sparse problems, CUDA or no probe.
    shared_write: dict[str, Any] | None = None
    # Two writes of the run's vector made to meet at chosen lags on the same two CPUs, with
    # the stores each lost (realrun/host/probe.py ``write_meetings``); None as for shared_write.
    write_meetings: dict[str, Any] | None = None
    # Seconds from the call to the common start (spawn, set-up, probes), and from the
    # workers' stop to the merged trace (with measure mode's rebuild).
    start_seconds: float = 0.0
    finish_seconds: float = 0.0


def _quotas(updates: int, workers: int) -> list[int]:
    return [updates // workers + (1 if r < updates % workers else 0) for r in range(workers)]


def _allocate(dim: int, blocks: int, workers: int, quota: int, dtype: str, measure: bool,
              w_device: str, torch_path: bool, dense: bool, scaled: bool = False,
              injected: bool = False, residuals: bool = False) -> Buffers:
    """Shared buffers; ``w`` on ``w_device``. Workers' steps are in the run's dtype (the
    very values they subtracted: the numpy worker rounds its float64 step to w's dtype before
    the write, the torch worker computes in it). In measure mode the numpy worker on a dense
    problem also keeps its read copies (float64), from which the rebuild follows the real
    vector's losses."""
    import torch

    def shared(*shape: int, fill: int = 0, kind: Any = torch.int64) -> Any:
        return torch.full(shape, fill, dtype=kind).share_memory_()

    w = (shared(dim, kind=getattr(torch, dtype)) if w_device == "cpu"
         else torch.zeros(dim, dtype=getattr(torch, dtype), device=w_device))
    step_dtype = getattr(torch, dtype)
    return Buffers(
        w=w, times=shared(workers, quota, 4),
        copy_end=shared(workers, quota, blocks, fill=-1),
        store_end=shared(workers, quota, blocks, fill=-1),
        samples=shared(workers, quota),
        progress=shared(workers), status=shared(workers),
        message=shared(workers, MESSAGE_BYTES, kind=torch.uint8),
        steps=shared(workers, quota, dim, kind=step_dtype) if measure else None,
        reads=(shared(workers, quota, dim, kind=torch.float64)
               if measure and dense and not torch_path else None),
        scales=shared(workers, quota, kind=torch.float64) if scaled else None,
        injected=shared(workers, quota, 3, kind=torch.float64) if injected else None,
        residuals=shared(workers, quota, 2, kind=torch.float64) if residuals else None,
        ready=shared(workers), control=shared(2))


def torch_path_of(device: str, launch: str) -> bool:
    """Whether the workers run the torch worker (CUDA, or threads) and not the numpy one."""
    return device != "cpu" or launch == "threads"


def scaled(scenario: Scenario) -> bool:
    """Whether the workers apply a factor on lr per update (an update rule or a schedule),
    which the trace records (``lr_scale``)."""
    return scenario.run.protocol == "staleness_lr" or scenario.run.lr_schedule != "constant"


def _check_buffers(scenario: Scenario, problem: Problem, rows: int, dtype: str,
                   measure: bool, numpy_worker: bool) -> None:
    """Refuse buffers (``_allocate``) that cannot fit in this machine's memory: the records
    of every update, and in measure mode each update's step (and, for the numpy worker on a
    dense problem, its read copy), d values each.

    Raises:
        ScenarioError: naming run.updates or problem.dim, with the estimate.
    """
    records = 8.0 * rows * (5 + 2 * scenario.run.blocks)
    copies = (np.dtype(dtype).itemsize + (8 if numpy_worker and problem.support(0) is None
                                          else 0)) * float(rows) * problem.dim
    # A round's step slots (k·d), ADMM's local copies (k·d float64), the history of
    # injected delays ((τ_max + 1)·d float64; in rounds, one per worker).
    rounds = scenario.run.protocol == "minibatch"
    slots = float(scenario.run.threads) * problem.dim * (
        np.dtype(dtype).itemsize if rounds
        else 8 if scenario.run.protocol == "admm" else 0)
    if scenario.inject.max_delay:
        slots += (8.0 * (scenario.inject.max_delay + 1) * problem.dim
                  * (scenario.run.threads if rounds else 1))
    check_memory({"run.updates": records + 8.0 * rows,
                  "problem.dim": (copies if measure else 0.0) + slots},
                 {"run.updates": scenario.run.updates, "problem.dim": problem.dim})


def _host(w: Any) -> np.ndarray:
    """A float64 numpy copy of the shared vector, wherever it lives: always a copy (a float64
    host tensor's ``.to(float64)`` is the tensor itself, whose later values every snapshot
    would then show), and on the host cast by numpy on this thread (torch casts a float32
    vector with its intra-op thread pool, whose threads then spin on the workers' cores)."""
    import torch

    if w.device.type == "cpu":
        return np.array(w.detach().numpy(), dtype=np.float64)
    return w.detach().to("cpu", torch.float64).numpy()


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ScenarioError(name, value, f"must be one of {', '.join(allowed)}")


def curve_every(updates: int, points: int) -> int:
    """Updates between two samples of the shared vector for the loss curve: ``points``
    (``metrics.curve_points``) evenly spaced samples along the run, besides the initial and
    the final vector (0: those two only)."""
    return max(1, updates // points) if points else updates + 1


def _check_device(device: str) -> None:
    import torch

    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise ScenarioError("--device", device, "must be cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ScenarioError("--device", device, "CUDA is not available on this machine "
                            "(torch.cuda.is_available() is False)")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        raise ScenarioError("--device", device,
                            f"this machine has {torch.cuda.device_count()} CUDA device(s)")


def _failure(buffers: Buffers, processes: list[Any],
             dead: set[int] | frozenset[int] = frozenset()) -> dict[str, Any] | None:
    """The first worker that failed, with its reason, or None (``dead``: workers killed by
    an injected death, which the run goes on without)."""
    for rank, process in enumerate(processes):
        if rank in dead:
            continue
        if int(buffers.status[rank]) == STATUS_FAILED:
            text = bytes(buffers.message[rank].tolist()).rstrip(b"\0").decode(errors="replace")
            return {"worker": rank, "reason": text or "exception"}
        if process.exitcode is not None and process.exitcode != 0:
            signal = -process.exitcode if process.exitcode < 0 else None
            return {"worker": rank, "reason": (f"killed by signal {signal}" if signal
                                               else f"exited with status {process.exitcode}")}
    return None


def _stop(processes: list[Any]) -> None:
    """Stop the started workers: terminate, wait up to 2 s, then kill."""
    processes = [p for p in processes if p.exitcode is not None or p.is_alive()]
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def run_real(scenario: Scenario, workers: int, mode: str, dtype: str = "float32",
             timeout: float | None = None, progress: Callable[[int], object] | None = None,
             on_start: Callable[[list[int]], object] | None = None,
             measure_every: int | None = None, problem: Problem | None = None,
             device: str = "cpu", launch: str | None = None, pattern: str = "shared",
             pin: bool = False, *, probe: bool = False,
             notice: Callable[[str], object] | None = None) -> RealRun:
    """Train ``scenario``'s problem with real workers; returns the run (failed or not).

    ``serial`` runs one worker. ``on_start`` receives the worker pids (monitoring, tests).
    ``device`` is where gradients run (cpu, cuda, cuda:N); ``pattern`` where the parameters
    live: ``shared`` on that device, updated in place by every worker, or ``host``: master
    parameters in host memory, each worker computing on its own device copy
    (``realrun.torch_worker``). ``launch`` runs workers as spawned processes or as threads of
    this process (on CUDA, each on its own stream; None: processes on the CPU,
    ``CUDA_LAUNCH`` on CUDA). Each update is one gradient. On the CPU with processes and
    shared parameters, workers run the problem's numpy code (``realrun.worker``); otherwise
    its torch loss by autograd. ``amp`` and ``local`` run a model's stages, one CPU process
    each (``realrun.pipeline``).
    ``measure_every = n`` turns on measure mode: workers also store their steps (one vector per
    update) and the parent rebuilds the serialized view, measuring every n-th completion.
    ``problem`` reuses a prebuilt problem in the parent (its optimum is computed once); workers
    always build their own from the scenario. ``pin`` pins worker r to a CPU of its own
    (``realrun.worker.pinned_cpus``: r mod the CPUs this process may use). ``probe`` probes
    the CPUs before the start (seconds: ``RealRun.cpu_latency``, ``shared_write``,
    ``write_meetings``, realrun/host/probe.py); off, the workers start as soon as they are set
    up. ``notice`` hears what the parent does once a run is stopped (stopping the workers,
    merging what they did), for the user to see.

    A KeyboardInterrupt (Ctrl-C; the CLI raises one on SIGTERM, with the argument
    ``"SIGTERM"``) stops the run as a failure does: partial trace kept.

    Raises:
        ScenarioError: workers < 1 (other than 1 with --mode serial), an unknown mode or
            dtype, timeout <= 0, measure_every < 1, a --pattern other than shared on the
            CPU, --probe on CUDA, or a scenario field this backend does not honour
            (``realrun.support``).
    """
    import torch

    _one_of("--mode", mode, MODES)
    _one_of("--dtype", dtype, DTYPES)
    if workers < 1:
        raise ScenarioError("--workers", workers, "must be >= 1")
    if mode == "serial" and workers != 1:
        raise ScenarioError("--workers", workers, "--mode serial runs one worker")
    if timeout is not None and not timeout > 0:
        raise ScenarioError("--timeout", timeout, "must be > 0 seconds")
    if measure_every is not None and measure_every < 1:
        raise ScenarioError("--measure-every", measure_every, "must be >= 1")
    if mode in PIPELINE_MODES:
        return _pipeline(scenario, workers, mode, dtype, timeout, progress, on_start,
                         measure_every, problem, device, launch, pattern, pin, probe, notice)
    if launch is None:
        launch = "processes" if device == "cpu" else CUDA_LAUNCH
    _one_of("--launch", launch, LAUNCHES)
    _one_of("--pattern", pattern, PATTERNS)
    if device == "cpu" and pattern != "shared":
        raise ScenarioError("--pattern", pattern, "places the parameters of CUDA workers "
                            "(--device cuda); CPU workers share one vector in memory")
    if probe and device != "cpu":
        raise ScenarioError("--probe", "on", "probes the CPUs of CPU workers; not with "
                            f"--device {device}")
    _check_device(device)
    named = ("run.protocol", mode) if scenario.run.protocol == mode else ("--mode", mode)
    if mode in (*ROUND_MODES, "roundrobin") and (device != "cpu" or launch == "threads"):
        raise ScenarioError(*named, "rounds and turns run on CPU worker processes (not "
                            "--launch threads or CUDA, yet)")
    if mode in ("minibatch", "roundrobin") and platform.machine().lower() not in ("x86_64",
                                                                                  "amd64"):
        raise ScenarioError(*named, "the barrier and the turns rely on x86-64's store order; "
                            f"not on {platform.machine()}")
    if mode == "admm" and (device != "cpu" or launch == "threads"):
        raise ScenarioError(*named, "consensus ADMM runs on CPU worker processes (not "
                            "--launch threads or CUDA, yet)")
    if torch_path_of(device, launch) and mode == "dcasgd":
        raise ScenarioError(*named, "delay compensation runs on CPU worker processes (not "
                            "--launch threads or CUDA, yet)")
    if torch_path_of(device, launch):  # (torch workers run pauses, stragglers and deaths)
        refuse_torch_injections(scenario.inject)
    refuse_unsupported(scenario, "shm" if device == "cpu" else "cuda", mode)
    # The trace the parent merges, as a simulation of the run as recorded would hold it.
    preflight(recorded(scenario, mode, workers, True, measure_every))
    torch_path = torch_path_of(device, launch)
    # The embedded scenario states the closest simulator semantics (realrun.support.recorded):
    # a per-block lock makes each block's read-modify-write atomic (atomic_add); the
    # whole-update lock is `locked`; each worker makes a fixed share of the updates (split =
    # even); a copy of a dense vector made while another worker's in-place write runs holds
    # what that write has stored by then ([hardware.sweeping_reads]).
    problem = problem if problem is not None else make_problem(scenario.problem)
    if measure_every is not None:
        refuse_unmeasurable(scenario, mode, problem.sparse)
    scenario = recorded(scenario, mode, workers, problem.sparse, measure_every)
    if scenario.run.blocks > problem.dim:
        raise ScenarioError("run.blocks", scenario.run.blocks,
                            f"must be <= the problem's dimension ({problem.dim})")
    w_star, _ = problem.optimum()
    quotas = _quotas(scenario.run.updates, workers)
    _check_buffers(scenario, problem, workers * max(quotas), dtype, measure_every is not None,
                   not torch_path)
    cpus = pinned_cpus(workers) if pin else None
    buffers = _allocate(problem.dim, scenario.run.blocks, workers, max(quotas), dtype,
                        measure_every is not None, device if pattern == "shared" else "cpu",
                        torch_path, problem.support(0) is None, scaled(scenario),
                        scenario.inject.active, mode == "admm")
    buffers.w.copy_(torch.as_tensor(problem.initial()))
    toml = scenario_to_toml(scenario)
    rounds = (_rounds(workers, quotas, buffers.w, mode == "allreduce") if mode in ROUND_MODES
              else None)
    turns = (Turns(torch.zeros(1, dtype=torch.int64).share_memory_(),
                   min(workers, scenario.run.updates), workers > _cpus())
             if mode == "roundrobin" else None)
    consensus = (Consensus(torch.as_tensor(np.tile(problem.initial(), (workers, 1)))
                           .share_memory_()) if mode == "admm" else None)
    history = (History.of(problem.initial(), scenario.inject.max_delay,
                          torch.multiprocessing.get_context("spawn").Lock())
               if scenario.inject.max_delay and rounds is None else None)
    processes = _workers(buffers, workers, quotas, toml, mode, scenario.run.blocks,
                         device if torch_path else None, launch, cpus, problem.fingerprint(),
                         rounds, turns, consensus, history)
    probes: tuple[dict[str, Any] | None, ...] = (None, None, None)

    def probing(pids: list[int]) -> dict[str, Any] | None:
        nonlocal probes
        _stage("probing", pids)
        probes = _probe(cpus, workers, problem, buffers.w.element_size())
        return _failure(buffers, processes)  # a worker that died meanwhile

    completions = scenario.run.updates if rounds is None else max(quotas)
    run = drive(buffers, processes, scenario.run.updates, timeout, progress, on_start, notice,
                curve_every(completions, scenario.metrics.curve_points), rounds,
                probing if probe else None)
    failure, snapshots = run.failure, run.snapshots
    latency, shared_write, meetings = probes
    if latency is not None and failure is None:
        latency["after_ns"] = line_latency_ns(latency["cpus"])
    trace, lost = _trace(buffers, workers, scenario, problem, w_star, snapshots, toml, dtype,
                         measure_every, rounds, sorted(run.dead))
    return RealRun(scenario, problem, trace, workers, mode, dtype, run.seconds, failure,
                   lost, measure_every, device, launch, pattern, cpus,
                   "c" if compiled() and not torch_path else "python", latency, shared_write,
                   meetings, run.start_seconds, time.monotonic() - run.stopped)


@dataclass
class Driven:
    """What :func:`drive` saw of a run's workers: the failure that stopped them (None:
    finished), the loss curve's snapshots of the shared vector (at least w_0), the workers an
    injected death stopped, and its times (``time.monotonic()`` seconds)."""

    failure: dict[str, Any] | None
    snapshots: list[tuple[int, int, np.ndarray]]
    dead: set[int]
    start_seconds: float  # from the call to the common start (spawn, set-up, probes)
    seconds: float  # from the common start to the workers' stop
    stopped: float  # when the workers were stopped


def drive(buffers: Buffers, processes: list[Any], total: int, timeout: float | None,
          progress: Callable[[int], object] | None,
          on_start: Callable[[list[int]], object] | None,
          notice: Callable[[str], object] | None, every: int, rounds: Rounds | None = None,
          ready: Callable[[list[int]], dict[str, Any] | None] | None = None) -> Driven:
    """Start the worker ``processes`` (not started; ``on_start`` gets their pids), wait until
    each is set up (``ready``, if given, then runs while they wait asleep and may return a
    failure), post the common start and watch them (:func:`_watch`: ``total`` rows,
    a snapshot every ``every`` completions) until they finish, one fails, the ``timeout``
    passes or a KeyboardInterrupt comes; then stop every one of them, whatever happened
    (``notice`` hears why)."""
    called = started = time.monotonic()
    snapshots: list[tuple[int, int, np.ndarray]] = []
    failure = None
    dead: set[int] = set()  # workers an injected death stopped (their status says so)
    try:
        with one_thread_env():
            for process in processes:
                process.start()
        pids = [p.pid for p in processes if p.pid is not None]
        if on_start:
            on_start(pids)
        _stage("spawned", pids)
        failure = _start_together(buffers, processes, timeout, started)
        if failure is None:
            _stage("ready", pids)
            if ready is not None:  # the workers wait asleep: it runs alone
                failure = ready(pids)
        if failure is None:
            started = _post_start(buffers, snapshots)
            _stage("running", pids)
            failure = _watch(buffers, processes, total, timeout, started, progress, snapshots,
                             every, rounds, dead)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM where the caller made it one
        failure = {"worker": None,
                   "reason": f"interrupted ({err.args[0] if err.args else 'Ctrl-C'})"}
    finally:
        if failure is not None and notice:
            notice(f"stopping the workers ({failure['reason']})")
        _stop(processes)
    stopped = time.monotonic()
    start_seconds = (started if snapshots else stopped) - called
    if not snapshots:  # stopped before the start: the curve is w_0 alone
        snapshots.append((0, time.monotonic_ns(), _host(buffers.w)))
    if failure is not None and notice:
        notice(f"merging the {int(buffers.progress.sum()):,} updates done")
    return Driven(failure, snapshots, dead, start_seconds, stopped - started, stopped)


def _pipeline(scenario: Scenario, workers: int, mode: str, dtype: str,
              timeout: float | None, progress: Callable[[int], object] | None,
              on_start: Callable[[list[int]], object] | None, measure_every: int | None,
              problem: Problem | None, device: str, launch: str | None, pattern: str,
              pin: bool, probe: bool, notice: Callable[[str], object] | None) -> RealRun:
    """A model-parallel run (``amp``, ``local``, ``block_admm``): one CPU process per stage
    (``realrun.pipeline``), once the flags and the scenario are checked.

    Raises:
        ScenarioError: a flag the stage processes do not take, --workers other than
            run.threads, or a scenario field they do not honour (``realrun.support``, then
            ``realrun.pipeline.run_pipeline``)."""
    from realrun.pipeline import run_pipeline

    if scenario.run.protocol != mode:
        raise ScenarioError("--mode", mode, f"a model-parallel mode runs run.protocol = {mode}")
    for flag, value, default in (("--device", device, "cpu"), ("--launch", launch, None),
                                 ("--pattern", pattern, "shared"),
                                 ("--probe", "on" if probe else None, None)):
        if value != default and not (flag == "--launch" and value == "processes"):
            raise ScenarioError(flag, value, f"{mode} runs one CPU process per stage")
    if workers != scenario.run.threads:
        raise ScenarioError("--workers", workers, f"{mode} runs one process per stage: "
                            f"must equal run.threads ({scenario.run.threads})")
    refuse_unsupported(scenario, "shm", mode)
    return run_pipeline(scenario, dtype, timeout, progress, on_start, problem, pin, notice,
                        measure_every)


def _stage(stage: str, pids: list[int]) -> None:
    """Where the parent is (``rundir.hold``: the fault tests' pause; nothing otherwise)."""
    from simulator.rundir import hold

    hold(stage, pids)


def _probe(cpus: list[int] | None, workers: int, problem: Problem,
           itemsize: int) -> tuple[dict[str, Any] | None, ...]:
    """The CPU probes of a run on the CPU (realrun/host/probe.py), with the workers set up and
    asleep: the cache-line latency between two workers' CPUs (its ``after_ns`` is measured
    after the run), and for a dense problem what a write of its vector costs on lines the
    other CPU copied last and how two such writes meet (one worker too)."""
    pair = probe_cpus(cpus)
    latency = ({"cpus": pair, "before_ns": line_latency_ns(pair), "after_ns": None}
               if workers > 1 and pair is not None and built() else None)
    if pair is None or problem.support(0) is not None:
        return latency, None, None
    shared_write = shared_write_cost(pair, problem.dim, itemsize)
    with one_thread_env():  # two processes of their own
        meetings = write_meetings(pair, problem.dim, itemsize)
    return latency, shared_write, meetings


def _post_start(buffers: Buffers, snapshots: list[tuple[int, int, np.ndarray]]) -> float:
    """Post the common start (``_START_LEAD_NS`` ahead) after the loss curve's first point;
    the start, in ``time.monotonic()`` seconds (the run's time counts from it)."""
    start = time.monotonic_ns() + _START_LEAD_NS
    snapshots.append((0, start, _host(buffers.w)))
    buffers.control[START] = start
    return start / 1e9


def _cpus() -> int:
    """The CPUs this process may run on."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _rounds(workers: int, quotas: list[int], w: Any, allreduce: bool = False) -> Rounds:
    """The flags and step slots of synchronous rounds (``realrun.worker.Rounds``); with
    ``allreduce``, the address of the workers' gloo group instead of the slots."""
    import torch

    from realrun.ps import DEFAULT_ADDR, free_port

    full = min(quotas)
    slots = torch.zeros(0 if allreduce else workers, 0 if allreduce else w.numel(),
                        dtype=w.dtype).share_memory_()
    return Rounds(torch.zeros(workers + 1, dtype=torch.int64).share_memory_(), slots, full,
                  sum(q > full for q in quotas), workers > _cpus(),
                  f"tcp://{DEFAULT_ADDR}:{free_port()}" if allreduce else None)


def _workers(buffers: Buffers, workers: int, quotas: list[int], toml: str, mode: str,
             blocks: int, device: str | None, launch: str,
             cpus: list[int] | None, fingerprint: str = "",
             rounds: Rounds | None = None, turns: Turns | None = None,
             consensus: Consensus | None = None,
             history: History | None = None) -> list[Any]:
    """The worker processes or threads, not started; each carries the locks as ``.shared``.
    ``device`` None: the numpy worker; else the torch worker on that device. ``cpus``: worker
    r pins itself to ``cpus[r]``. They start and exit on the flags in ``buffers.control``.
    ``rounds``, ``turns``, ``consensus``: the synchronous rounds of ``--mode minibatch``, the
    turn order of ``--mode roundrobin``, the local copies of ``--mode admm`` (numpy worker
    processes), whose pushes take a lock per block, as ``blocklock``'s writes; ``history``:
    the vectors injected delays read (a round's worker keeps its own)."""
    import threading

    import torch.multiprocessing as mp

    from realrun.torch_worker import ThreadWorker, torch_worker_main

    specs = [WorkerSpec(rank, workers, quotas[rank], toml, -1 if cpus is None else cpus[rank],
                        fingerprint) for rank in range(workers)]

    if launch == "threads":
        lock: Any = threading.Lock() if mode == "locked" else None
        block_locks: Any = ([threading.Lock() for _ in range(blocks)] if mode == "blocklock"
                            else None)
        made: list[Any] = []
        for spec in specs:
            stop = threading.Event()
            made.append(ThreadWorker(torch_worker_main, (
                spec, buffers, lock, block_locks, device, stop), stop))
    else:
        context = mp.get_context("spawn")
        lock = context.Lock() if mode == "locked" else None
        block_locks = ([context.Lock() for _ in range(blocks)]
                       if mode in ("blocklock", "admm") else None)
        made = []
        for spec in specs:
            target, args = ((worker_main, (spec, buffers, lock, block_locks, rounds, turns,
                                           consensus, history))
                            if device is None else
                            (torch_worker_main, (spec, buffers, lock, block_locks, device)))
            made.append(context.Process(target=target, args=args, daemon=True))
    for worker in made:
        # Process.start() drops its arguments; the parent must keep the locks alive until the
        # workers end (a collected semaphore is unlinked before a spawned child can open it).
        worker.shared = (lock, block_locks, rounds, turns, consensus, history)
    return made


def _start_together(buffers: Buffers, processes: list[Any], timeout: float | None,
                    started: float) -> dict[str, Any] | None:
    """Wait until every worker is set up (or one failed, or the timeout passed)."""
    while not all(int(r) == 1 for r in buffers.ready):
        failure = _failure(buffers, processes)
        if failure is not None:
            return failure
        if timeout is not None and time.monotonic() - started > timeout:
            return {"worker": None, "reason": f"timeout after {timeout:g} s (starting)"}
        time.sleep(_POLL_S)
    return None


def _watch(buffers: Buffers, processes: list[Any], total: int, timeout: float | None,
           started: float, progress: Callable[[int], object] | None,
           snapshots: list[tuple[int, int, np.ndarray]], every: int = 1,
           rounds: Rounds | None = None,
           dead: set[int] | None = None) -> dict[str, Any] | None:
    """Poll until every worker is done (then release them, so they exit) and has exited;
    the failure that stopped the run, if any; at most one snapshot for the curve per poll,
    once ``every`` more completions were counted (updates, or with ``rounds`` rounds
    written; ``_snapshot``). ``dead`` gets the workers an injected death stopped."""
    dead = set() if dead is None else dead
    reported = 0
    while True:
        done = int(buffers.progress.sum())
        if progress and done > reported:
            progress(done - reported)
        reported = done
        count = done if rounds is None else int(rounds.flags[-1])
        if count >= snapshots[-1][0] + every and done < total:
            _snapshot(buffers, count, snapshots, rounds)
        dead.update(r for r, s in enumerate(buffers.status) if int(s) == STATUS_DEAD)
        failure = _failure(buffers, processes, dead)
        if failure is not None:
            return failure
        if all(int(s) in (STATUS_DONE, STATUS_DEAD) for s in buffers.status):
            buffers.control[RELEASE] = 1
            if all(p.exitcode is not None for p in processes):
                return None
        if timeout is not None and time.monotonic() - started > timeout:
            return {"worker": None, "reason": f"timeout after {timeout:g} s"}
        time.sleep(_POLL_S)


def _snapshot(buffers: Buffers, done: int, snapshots: list[tuple[int, int, np.ndarray]],
              rounds: Rounds | None = None) -> None:
    """Copy the shared vector for the curve as the ``done``-th completion's, unless an update
    was counted during the copy (it may hold part of it): then the next poll tries again.
    Like any read it can hold part of a write in flight. With ``rounds`` (``done`` rounds
    written) the copy is kept only if worker 0 had not arrived at the next round before it
    ended, so no round's write ran during it."""
    if rounds is not None:
        flags = rounds.flags
        if int(flags[0]) != done:  # worker 0 is writing the next round, or will
            return
        w = _host(buffers.w)
        if int(flags[0]) == done:
            snapshots.append((done, time.monotonic_ns(), w))
        return
    w = _host(buffers.w)
    if int(buffers.progress.sum()) == done:
        snapshots.append((done, time.monotonic_ns(), w))


def _trace(buffers: Buffers, workers: int, scenario: Scenario, problem: Problem,
           w_star: np.ndarray, snapshots: list[tuple[int, int, np.ndarray]], toml: str,
           dtype: str, measure_every: int | None,
           rounds: Rounds | None = None,
           dead: list[int] | None = None) -> tuple[Trace, dict[str, Any] | None]:
    records = []
    for rank in range(workers):
        n = int(buffers.progress[rank])
        times = buffers.times[rank, :n].numpy().copy()
        copy_end = buffers.copy_end[rank, :n].numpy().copy()
        store_end = buffers.store_end[rank, :n].numpy().copy()
        if copy_end.shape[1] == 1:  # the numpy worker leaves one block's stamps to these
            np.copyto(copy_end[:, 0], times[:, 1], where=copy_end[:, 0] < 0)
            if rounds is None:  # (in a round only its writer stores, and stamps it)
                np.copyto(store_end[:, 0], times[:, 3], where=store_end[:, 0] < 0)
        records.append(WorkerRecord(times, copy_end, store_end,
                                    buffers.samples[rank, :n].numpy().copy(),
                                    None if buffers.scales is None
                                    else buffers.scales[rank, :n].numpy().copy(),
                                    None if buffers.injected is None
                                    else buffers.injected[rank, :n].numpy().copy(),
                                    None if buffers.residuals is None
                                    else buffers.residuals[rank, :n].numpy().copy()))
    w_final = _host(buffers.w)
    done = (sum(len(r.samples) for r in records) if rounds is None
            else int(rounds.flags[-1]))  # completions
    # The final vector of a finished run is as the last write left it: stamped then (not when
    # the parent looks); a stopped run's may hold stores of an update in flight: stamped now.
    ends = [int(r.times[:, 3].max()) for r in records if len(r.times)]
    finished = sum(len(r.samples) for r in records) == scenario.run.updates
    last = max(ends) if finished and ends else time.monotonic_ns()
    points = [*snapshots, (done, max(last, snapshots[-1][1]), w_final)]
    curve = [(t, stamp, problem.full_loss(w), float((w - w_star) @ (w - w_star)))
             for t, stamp, w in points]
    measure = None if measure_every is None else Measure(
        problem, scenario.run.lr, block_bounds(problem.dim, scenario.run.blocks), dtype,
        measure_every, scenario.metrics.curve_points, scenario.inject.write_bits,
        [buffers.steps[r].numpy() for r in range(workers)],
        None if buffers.reads is None else [buffers.reads[r].numpy() for r in range(workers)],
        scenario.run.protocol != "admm")
    return merge(records, problem.initial(), w_final, curve, toml, measure, rounds is not None,
                 dead)


def summary_extra(run: RealRun) -> dict[str, Any]:
    """The real-run facts summary.json adds to the simulator's summary."""
    return {"real": {"backend": "shm" if run.device == "cpu" else "cuda", "mode": run.mode,
                     "workers": run.workers, "dtype": run.dtype,
                     "device": run.device, "launch": run.launch, "pattern": run.pattern,
                     "cpus": run.cpus,
                     "host": platform.node(),
                     "recorder": run.recorder, "cpu_latency": run.cpu_latency,
                     "shared_write": run.shared_write, "write_meetings": run.write_meetings,
                     "wall_seconds": run.seconds,
                     "updates_per_wall_second": len(run.trace) / max(run.seconds, 1e-9),
                     "failure": run.failure, "measure_every": run.measure_every,
                     "hardware_loss": run.hardware_loss,
                     "scenario_run": dataclasses.asdict(run.scenario.run)}}
