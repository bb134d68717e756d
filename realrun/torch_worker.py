"""A real worker whose gradient runs in torch on any device: CUDA, or the CPU.

Two placements of the parameters (``pattern``):

* ``shared``: the parameter tensor lives on the compute device (a CUDA tensor shared by CUDA
  IPC with worker processes, or by worker threads of one process, each on its own CUDA
  stream) and every worker updates it in place, block by block, with no coordination:
  ``w[block].sub_(step[block])`` is one elementwise kernel per block, a non-atomic
  read-modify-write per element, the Hogwild! update on a GPU.
* ``host``: the master parameters live in host shared memory (the GPU ASGD pattern of the
  literature); a worker copies them to its device (the read), computes there, copies its step
  back (part of the gradient phase) and subtracts it from the host copy in place (the write).

Each update is one gradient at one sample, as the simulator's lock-free protocols state.
Timestamps are ``time.monotonic_ns()`` taken after synchronising the
worker's CUDA stream, so each phase's end is when its kernels finished (synchronised
monotonic time: one clock for every process and thread); the trace schema is the CPU
backend's. A gradient is autograd of the problem's ``torch_loss`` on the device, with the
problem's data copied there once.
"""

from __future__ import annotations

import threading
import time
import tomllib
from collections.abc import Callable
from typing import Any

import numpy as np

from realrun.worker import (
    START,
    STATUS_DEAD,
    STATUS_DONE,
    Buffers,
    Died,
    Slowed,
    WorkerSpec,
    die_with_parent,
    pin,
    record_failure,
    same_problem,
    touch_records,
    wait_for_release,
    wait_for_start,
)

__all__ = ["ThreadWorker", "TorchGradient", "torch_worker_main"]


class TorchGradient:
    """The gradient of ``problem``'s torch loss at one sample, by autograd."""

    def __init__(self, problem: Any) -> None:
        self.problem = problem

    def __call__(self, w: Any, sample: int) -> Any:
        import torch

        leaf = w.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.problem.torch_loss(leaf, sample), leaf)
        return grad


def torch_worker_main(spec: WorkerSpec, buffers: Buffers, lock: Any, block_locks: Any,
                      device: str,
                      stop: threading.Event | None = None) -> None:
    """Set up, wait for the common start, run ``spec.quota`` updates on ``device``, then
    wait for the release (as ``realrun.worker.worker_main``); record a failure in the shared
    status and message and raise ``SystemExit(1)``. In a worker process (``stop`` None)
    SIGINT is ignored (the parent decides how to stop) and the worker dies with its parent;
    a worker thread stops early when ``stop`` is set."""
    import torch

    if stop is None:
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        gone = die_with_parent()
        torch.set_num_threads(1)
    else:
        gone = stop.is_set
    try:
        target = torch.device(device)
        if target.type == "cuda":
            if target.index is not None:
                torch.cuda.set_device(target)
            with torch.cuda.stream(torch.cuda.Stream(device=target)):
                _loop(spec, buffers, lock, block_locks, device, stop, gone)
        else:
            _loop(spec, buffers, lock, block_locks, device, stop, gone)
        buffers.status[spec.rank] = STATUS_DONE
        if stop is None:  # a finished thread costs nothing more
            wait_for_release(buffers, gone)
    except Died:  # an injected death: it stops here, and the others go on
        buffers.status[spec.rank] = STATUS_DEAD
        if stop is None:
            wait_for_release(buffers, gone)
    except BaseException as err:  # every failure, SystemExit included, must reach the parent
        record_failure(buffers, spec.rank, err)
        raise SystemExit(1) from None


def _ops(bounds: list[int], support: np.ndarray | None, w_device: Any,
         device: Any) -> list[tuple[int, Any, Any]]:
    """Per touched block: (block, where in w, where in the local copy): slices for a dense
    gradient, index tensors on each side's device for a sparse one."""
    import torch

    from simulator.memory import block_ops

    if support is None:
        return [(block, index, index) for block, index, _, _ in block_ops(bounds, None)]
    return [(block, torch.as_tensor(index, device=w_device), torch.as_tensor(index, device=device))
            for block, index, _, _ in block_ops(bounds, support)]


def _loop(spec: WorkerSpec, buffers: Buffers, lock: Any, block_locks: Any, device: str,
          stop: threading.Event | None, gone: Callable[[], bool]) -> None:
    import torch

    from simulator.memory import block_bounds
    from simulator.problems import make_problem
    from simulator.rules import LR_FACTORS, staleness_scale
    from simulator.scenario import scenario_from_dict
    from simulator.timing import sample_stream

    scenario = scenario_from_dict(tomllib.loads(spec.scenario_toml))
    problem = make_problem(scenario.problem)
    same_problem(problem, spec.fingerprint, f"worker {spec.rank}")
    w = buffers.w
    dev = torch.device(device)
    local = torch.empty(problem.dim, dtype=w.dtype, device=dev)
    host = w.device != dev  # the host pattern: the step comes back before the write
    sync: Callable[[], None] = (torch.cuda.current_stream().synchronize if dev.type == "cuda"
                                else _nothing)
    times, copy_end = buffers.times[spec.rank].numpy(), buffers.copy_end[spec.rank].numpy()
    store_end, samples = buffers.store_end[spec.rank].numpy(), buffers.samples[spec.rank].numpy()
    progress = buffers.progress.numpy()
    bounds = block_bounds(problem.dim, scenario.run.blocks)
    stream = sample_stream(scenario.run.seed, spec.workers, spec.rank, problem.n_samples)
    grad, lr, clock = TorchGradient(problem), scenario.run.lr, time.monotonic_ns
    steps = None if buffers.steps is None else buffers.steps[spec.rank]
    schedule = LR_FACTORS.get(scenario.run.lr_schedule)
    stale = scenario.run.protocol == "staleness_lr"  # lr/τ, τ counted read to write
    scales = None if buffers.scales is None else buffers.scales[spec.rank].numpy()
    factor, seen = 1.0, 0
    dense = _ops(bounds, None, w.device, dev) if problem.support(0) is None else None
    local.copy_(w)
    grad(local, 0)  # warm up: data to the device, kernels loaded, allocator primed
    sync()
    touch_records(buffers, spec.rank)
    pin(spec)
    wait_for_start(buffers, spec.rank, gone)
    # Injected pauses, stragglers and deaths (realrun.worker.Slowed), as CPU workers run them.
    slowed = Slowed(scenario.inject, spec.rank, int(buffers.control.numpy()[START]))
    slow = slowed if slowed.active else None
    for i in range(spec.quota):
        if stop is not None and stop.is_set():
            break
        sample = int(stream.take())
        ops = dense if dense is not None else _ops(bounds, problem.support(sample), w.device,
                                                   dev)
        if slow is not None and not slow.hold(gone):  # (before the lock: a death must not
            break  # hold it; a thread stopped during a pause stops there)
        if lock is not None:
            lock.acquire()
        read_start = clock()
        if stale:
            seen = int(progress.sum())
        if slow is not None:
            began = slow.before(0)
        for block, at_w, at_local in ops:
            local[at_local] = w[at_w]
            sync()
            copy_end[i, block] = clock()
        if slow is not None:
            slow.after(0, began)
        read_end = clock()
        step = grad(local, sample).mul_(lr)
        if host:
            step = step.to(w.device)
        sync()
        if slow is not None:
            slow.stretch(read_end)
        grad_end = clock()
        if stale or schedule is not None:  # the CPU workers' rules, as the write begins
            completed = int(progress.sum())
            factor = staleness_scale(completed - seen) if stale else 1.0
            if schedule is not None:  # at m = the updates counted + 1
                factor *= schedule(completed + 1)
            if factor != 1.0:
                step.mul_(factor)
        if slow is not None:
            began = slow.before(1)
        for block, at_w, _ in ops:  # the step is on w's device now: index it from w's side
            if block_locks is None:
                _subtract(w, at_w, step[at_w], dense is not None)
            else:
                with block_locks[block]:
                    _subtract(w, at_w, step[at_w], dense is not None)
                    sync()
            sync()
            store_end[i, block] = clock()
        if slow is not None:
            slow.after(1, began)
        write_end = clock()
        times[i] = (read_start, read_end, grad_end, write_end)
        samples[i] = sample
        # Counted before the next writer may start (τ and a schedule's m count it).
        progress[spec.rank] = i + 1
        if lock is not None:
            lock.release()
        if steps is not None:  # outside the timed phases
            steps[i].copy_(step)
        if scales is not None:
            scales[i] = factor


def _subtract(w: Any, where: Any, values: Any, dense: bool) -> None:
    """``w[where] -= values`` in place and without atomics: one elementwise read-modify-write
    for a slice, a gather, subtract and scatter for an index tensor."""
    if dense:
        w[where].sub_(values)
    else:
        w[where] = w[where] - values


def _nothing() -> None:
    return None


class ThreadWorker:
    """A worker thread behind the interface the runner uses for processes (``start``,
    ``is_alive``, ``exitcode``, ``terminate``, ``kill``, ``join``, ``pid``). Threads cannot
    be killed: ``terminate`` asks the loop to stop after its current update."""

    pid = None

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...],
                 stop: threading.Event) -> None:
        self.exitcode: int | None = None
        self._stop = stop
        self._thread = threading.Thread(target=self._run, args=(target, args), daemon=True)

    def _run(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            target(*args)
            self.exitcode = 0
        except SystemExit as err:
            self.exitcode = err.code if isinstance(err.code, int) else 1
        except BaseException:  # the worker recorded it in the shared status already
            self.exitcode = 1

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def terminate(self) -> None:
        self._stop.set()

    def kill(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (at most 10 s when no timeout is given: a thread stuck in a
        device call must not hang the parent, which stops anyway)."""
        self._thread.join(10.0 if timeout is None else timeout)
