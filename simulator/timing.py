"""Where each update's sample and durations come from: seeded draws, or a recorded trace.

``SampledSource`` gives every thread its own streams, from ``SeedSequence(seed).spawn``: one
for samples and one per operation (read, gradient, write), so changing a timing distribution
never changes which samples a thread draws. ``ReplaySource`` hands back, thread by thread and
update by update, exactly the samples and per-block durations a trace recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import numpy as np

from simulator.errors import TraceError
from simulator.scenario import Scenario

__all__ = ["DurationSource", "ReplaySource", "SampledSource", "sample_stream", "thread_seeds"]

_CHUNK = 1024


def thread_seeds(seed: int, threads: int) -> list[np.random.SeedSequence]:
    """One seed sequence per thread; each spawns (samples, read, grad, write) streams."""
    return np.random.SeedSequence(seed).spawn(threads)


def _thread_generators(seed: int, threads: int, thread: int) -> list[np.random.Generator]:
    # Five streams: samples, read, gradient, write, idle (spawn(n) children do not depend on
    # n, so adding a stream never changed the others).
    return [np.random.default_rng(s) for s in thread_seeds(seed, threads)[thread].spawn(5)]


def sample_stream(seed: int, threads: int, thread: int, n_samples: int) -> _Stream:
    """Thread ``thread``'s samples: the same sequence in the simulator and in real runs."""
    return _Stream(partial(_integers, _thread_generators(seed, threads, thread)[0], n_samples))


class DurationSource(Protocol):
    """What the engine asks for at the start of each update."""

    def next_sample(self, thread: int) -> int: ...

    def remaining(self, thread: int) -> int | None:
        """Updates ``thread`` may still start (None: as many as the run needs)."""
        ...

    def durations(self, thread: int, fractions: Sequence[float]) -> tuple[list[int], int,
                                                                          list[int]]: ...

    def idle(self, thread: int) -> int:
        """The local work before the update whose durations were just drawn (ns)."""
        ...


class _Stream:
    """Values drawn in chunks from one generator; deterministic whatever the consumer does."""

    def __init__(self, draw: Callable[[int], np.ndarray]) -> None:
        self.draw = draw
        self._buffer: list[float] = []
        self._pos = 0

    def take(self) -> float:
        if self._pos == len(self._buffer):
            self._buffer, self._pos = self.draw(_CHUNK).tolist(), 0
        self._pos += 1
        return self._buffer[self._pos - 1]


def _integers(rng: np.random.Generator, high: int, size: int) -> np.ndarray:
    return rng.integers(0, high, size)


def _ns(raw: np.ndarray | float, scale: np.ndarray | float) -> np.ndarray:
    """Durations in whole ns: raw draw × fraction / speed, rounded half up."""
    return np.floor(np.multiply(raw, scale) + 0.5).astype(np.int64)


class SampledSource:
    """Samples uniform with replacement; durations from each thread's device timing.

    A block moving a fraction ``f`` of the coordinates takes ``round(draw · f / speed)`` ns.
    Updates that move every block (dense problems: ``fractions is dense``) are served from
    chunks drawn and scaled with numpy, about one thread's share of the run at a time; others
    draw one value per block moved.
    """

    def __init__(self, scenario: Scenario, threads: int, n_samples: int,
                 dense: Sequence[float], network: bool = False, dim: int = 0,
                 grad_work: int = 1) -> None:
        self.dense = dense
        self.grad_work = grad_work
        self.dim = dim
        slow = [1.0] * threads
        for straggler in scenario.inject.stragglers:
            if straggler.thread < threads:
                slow[straggler.thread] *= straggler.factor
        # Link cost per message (latency, ns per coordinate moved), for networked protocols.
        self._link: list[tuple[int, float]] = []
        # Pre-draw about one thread's share of the run per chunk (at most _CHUNK updates).
        self._chunk = min(_CHUNK, max(16, scenario.run.updates // threads + 1))
        self._dense_scale: list[np.ndarray] = []
        self._speed: list[float] = []
        self._slowdown: list[tuple[float, float, float, float]] = []
        self._streams: list[tuple[_Stream, _Stream, _Stream, _Stream]] = []
        self._idle: list[_Stream | None] = []
        self._idle_scale: list[float] = []
        self._chunks: list[list[tuple[list[int], int, list[int]]]] = []
        self._pos: list[int] = []
        for thread in range(threads):
            device = scenario.device_of(thread)
            timing = scenario.timing_of(device)
            gens = _thread_generators(scenario.run.seed, threads, thread)
            spec = scenario.devices[device]
            speed = spec.speed / slow[thread]
            self._speed.append(speed)
            # Contention grows with the workers that run at once: all of them, or as many
            # as the device has cores.
            self._slowdown.append(timing.slowdown(min(threads, spec.cores or threads)))
            self._dense_scale.append(np.asarray(dense, dtype=np.float64) / speed)
            per_coord = 8.0 / spec.bandwidth if network and spec.bandwidth else 0.0
            self._link.append((spec.latency if network else 0, per_coord))
            self._streams.append((
                sample_stream(scenario.run.seed, threads, thread, n_samples),
                _Stream(partial(timing.read.sample, gens[1])),
                _Stream(partial(timing.grad.sample, gens[2])),
                _Stream(partial(timing.write.sample, gens[3])),
            ))
            idle = timing.idle
            zero = idle.dist == "constant" and idle.mean == 0
            self._idle.append(None if zero else _Stream(partial(idle.sample, gens[4])))
            self._idle_scale.append(self._slowdown[-1][3] / speed)
            self._chunks.append([])
            self._pos.append(0)

    def next_sample(self, thread: int) -> int:
        return int(self._streams[thread][0].take())

    def remaining(self, thread: int) -> int | None:
        return None

    def _refill(self, thread: int) -> None:
        _, read, grad, write = self._streams[thread]
        scale, blocks = self._dense_scale[thread], len(self.dense)
        n = self._chunk
        link = self._link_ns(thread, self.dense)
        fr, fg, fw, _ = self._slowdown[thread]
        reads = (_ns(read.draw(n * blocks).reshape(n, blocks), scale * fr) + link).tolist()
        grads = _ns(grad.draw(n), self.grad_work * fg / self._speed[thread]).tolist()
        writes = (_ns(write.draw(n * blocks).reshape(n, blocks), scale * fw) + link).tolist()
        self._chunks[thread] = list(zip(reads, grads, writes, strict=True))
        self._pos[thread] = 0

    def durations(self, thread: int, fractions: Sequence[float]) -> tuple[list[int], int,
                                                                          list[int]]:
        if fractions is self.dense:
            if self._pos[thread] == len(self._chunks[thread]):
                self._refill(thread)
            self._pos[thread] += 1
            return self._chunks[thread][self._pos[thread] - 1]
        _, read, grad, write = self._streams[thread]
        speed = self._speed[thread]
        fr, fg, fw, _ = self._slowdown[thread]
        link = self._link_ns(thread, fractions).tolist()
        return ([int(read.take() * f * fr / speed + 0.5) + c for f, c in zip(fractions, link,
                                                                             strict=True)],
                int(grad.take() * self.grad_work * fg / speed + 0.5),
                [int(write.take() * f * fw / speed + 0.5) + c for f, c in zip(fractions, link,
                                                                              strict=True)])

    def idle(self, thread: int) -> int:
        stream = self._idle[thread]
        if stream is None:
            return 0
        return int(stream.take() * self._idle_scale[thread] + 0.5)

    def _link_ns(self, thread: int, fractions: Sequence[float]) -> np.ndarray:
        """What one message over the thread's link adds to each block it moves: the latency
        on the first block, and every block's bytes over the bandwidth."""
        latency, per_coord = self._link[thread]
        cost = np.floor(np.asarray(fractions, dtype=np.float64) * self.dim * per_coord + 0.5)
        cost = cost.astype(np.int64)
        if cost.size:
            cost[0] += latency
        return cost


class ReplaySource:
    """The recorded samples and durations of a trace, per thread in the order it ran them."""

    def __init__(self, per_thread: list[list[tuple[int, list[int], int, list[int], int]]],
                 ) -> None:
        self._updates = per_thread
        self._pos = [0] * len(per_thread)
        self._idle = [0] * len(per_thread)

    def _current(self, thread: int) -> tuple[int, list[int], int, list[int], int]:
        if thread >= len(self._updates) or self._pos[thread] >= len(self._updates[thread]):
            raise TraceError(f"replay: thread {thread} needs more updates than the trace "
                             "recorded for it (the scenario does not match the trace)")
        return self._updates[thread][self._pos[thread]]

    def next_sample(self, thread: int) -> int:
        return self._current(thread)[0]

    def remaining(self, thread: int) -> int | None:
        """A thread runs exactly the updates it recorded (real workers have fixed quotas)."""
        if thread >= len(self._updates):
            return 0
        return len(self._updates[thread]) - self._pos[thread]

    def durations(self, thread: int, fractions: Sequence[float]) -> tuple[list[int], int,
                                                                          list[int]]:
        _, read, grad, write, self._idle[thread] = self._current(thread)
        self._pos[thread] += 1
        if len(read) != len(fractions):
            raise TraceError(f"replay: thread {thread} update {self._pos[thread] - 1} moves "
                             f"{len(fractions)} blocks but the trace recorded {len(read)}")
        return read, grad, write

    def idle(self, thread: int) -> int:
        return self._idle[thread]
