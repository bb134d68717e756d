"""Where each update's sample and durations come from: seeded draws, or a recorded trace.

``SampledSource`` gives every thread its own streams, from ``SeedSequence(seed).spawn``: one
for samples and one per operation (read, gradient, write, idle), so changing a timing
distribution never changes which samples a thread draws. With common factors
(``[hardware.common]``) a phase's durations are drawn when the phase starts, from the thread's
own normal draw and a factor every thread shares (:class:`CommonFactor`). ``ReplaySource``
hands back, thread by thread and update by update, exactly the samples and per-block
durations a trace recorded.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import numpy as np

from simulator.errors import TraceError
from simulator.scenario import CommonSpec, DeviceSpec, Scenario, TimingSpec

__all__ = ["GRAD", "IDLE", "READ", "WRITE", "CommonFactor", "DurationSource", "ReplaySource",
           "SampledSource", "SpeedEpisodes", "link_ns", "link_of", "sample_stream", "thread_seed",
           "thread_seeds"]

_CHUNK = 1024
READ, GRAD, WRITE, IDLE = range(4)  # the phases, in the order of CommonSpec.weights
_COMMON_TAG = 0xC1
_EPISODE_TAG = 0xE9
_GRID = 8  # grid points of a common factor per correlation time
_KNOTS = 4096  # grid points drawn at a time


class CommonFactor:
    """A stationary standard Gaussian process z(t) of correlation exp(−|Δt| / ``tau``), on
    a grid of ``tau``/8 ns (an AR(1); z is constant within a grid cell), seeded by ``seed``
    and ``key``. The grid is drawn in order of time, chunk by chunk, whatever order the
    times are asked in, so ``at`` is a function of (seed, key, tau, t) alone. Chunks before
    ``forget(t)``'s time are dropped (each thread asks at times that never decrease)."""

    def __init__(self, seed: int, key: int, tau: float) -> None:
        self.step = max(1, int(tau) // _GRID)
        self.a = math.exp(-self.step / tau)
        self._innovation = math.sqrt(1.0 - self.a * self.a)
        self._rng = np.random.default_rng([seed, _COMMON_TAG, key, int(tau)])
        self._last = float(self._rng.standard_normal())
        self._chunks: dict[int, list[float]] = {}
        self._drawn = 0  # chunks drawn so far
        self._forgotten = 0  # chunks below this were dropped

    def at(self, t: int) -> float:
        cell = t // self.step
        chunk, pos = divmod(cell, _KNOTS)
        while self._drawn <= chunk:
            self._draw()
        if chunk < self._forgotten:
            raise RuntimeError(f"common factor asked at {t} ns, before the time forgotten")
        return self._chunks[chunk][pos]

    def forget(self, t: int) -> None:
        """No time before ``t`` will be asked again."""
        below = t // self.step // _KNOTS
        while self._forgotten < min(below, self._drawn):
            self._chunks.pop(self._forgotten, None)
            self._forgotten += 1

    def _draw(self) -> None:
        noise = self._rng.standard_normal(_KNOTS) * self._innovation
        values, z, a = [], self._last, self.a
        for e in noise.tolist():
            z = a * z + e
            values.append(z)
        self._chunks[self._drawn] = values
        self._drawn += 1
        self._last = z


def thread_seeds(seed: int, threads: int) -> list[np.random.SeedSequence]:
    """One seed sequence per thread; each spawns (samples, read, grad, write) streams."""
    return [thread_seed(seed, thread) for thread in range(threads)]


def thread_seed(seed: int, thread: int) -> np.random.SeedSequence:
    """Thread ``thread``'s seed sequence: ``SeedSequence(seed).spawn(k)[thread]`` for any
    k > thread (a spawned child is the parent's entropy with spawn key (thread,)), made
    alone so that setting up k threads costs k sequences, not k²."""
    return np.random.SeedSequence(seed, spawn_key=(thread,))


def _thread_generators(seed: int, thread: int) -> list[np.random.Generator]:
    # Five streams: samples, read, gradient, write, idle (spawn(n) children do not depend on
    # n, so adding a stream never changed the others).
    return [np.random.default_rng(s) for s in thread_seed(seed, thread).spawn(5)]


def sample_stream(seed: int, threads: int, thread: int, n_samples: int) -> _Stream:
    """Thread ``thread``'s samples: the same sequence in the simulator and in real runs
    (whatever ``threads``: a thread's streams depend on its index alone)."""
    return _Stream(partial(_integers, _thread_generators(seed, thread)[0], n_samples))


class SpeedEpisodes:
    """One core's speed episodes (``DeviceSpec`` docstring): fast and slow in turn, each
    lasting an exponential time (means ``fast_ns``, ``slow_ns``), the first state slow with
    probability slow_ns / (fast_ns + slow_ns). The switch times are drawn in order of time
    from the core's own stream (seed, device, core), so ``factor`` is a function of those and
    ``t`` alone, whatever order the times are asked in."""

    def __init__(self, seed: int, device: int, core: int, slow_factor: float, fast_ns: int,
                 slow_ns: int) -> None:
        self.slow_factor = slow_factor
        self._means = (float(fast_ns), float(slow_ns))
        self._rng = np.random.default_rng([seed, _EPISODE_TAG, device, core])
        self.starts_slow = bool(self._rng.random() < slow_ns / (fast_ns + slow_ns))
        self._switches: list[float] = []  # times at which the state flips
        self._last = 0.0

    def slow(self, t: float) -> bool:
        """Whether the core is in a slow episode at ``t`` ns."""
        while self._last <= t:
            state = self.starts_slow ^ (len(self._switches) % 2 == 1)
            self._last += float(self._rng.exponential(self._means[state]))
            self._switches.append(self._last)
        return self.starts_slow ^ (bisect.bisect_right(self._switches, t) % 2 == 1)

    def factor(self, t: float) -> float:
        """How many times as long a duration starting at ``t`` takes."""
        return self.slow_factor if self.slow(t) else 1.0


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

    def coupled(self, thread: int) -> bool:
        """Whether ``thread``'s durations are drawn when each phase starts (``at``)."""
        ...

    def slowness(self, thread: int, t: int) -> float:
        """How many times as long the durations of an update ``thread`` begins at ``t`` are
        (speed episodes; 1 without); ``at`` applies it itself."""
        ...

    def place(self, thread: int, core: int) -> None:
        """``thread`` now runs on ``core`` of its device (per-core slices move threads):
        its speed episodes are that core's from now on."""
        ...

    def at(self, thread: int, phase: int, t: int) -> list[int]:
        """The durations (one per block; one for gradient and idle) of ``phase`` of the
        update just begun, which starts at ``t`` ns (coupled threads only)."""
        ...

    def done(self, thread: int) -> None:
        """``thread`` begins no more updates."""
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


def _normals(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.standard_normal(size)


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
                 grad_work: int = 1, latency: bool = True) -> None:
        self.scenario = scenario
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
        # Common factors: per coupled thread, each phase's (quantile of a normal score,
        # scale of a draw, √c, √(1 − c), factor) and its normal streams; the normal draws
        # of the update just begun wait in _pending until their phase starts.
        self._coupling: list[tuple[list[tuple[Callable[[float], float], float, float, float,
                                              CommonFactor | None]],
                                   list[_Stream]] | None] = []
        self._factors: dict[tuple[int, float], CommonFactor] = {}
        self._pending: list[list[list[float]]] = []
        self._fractions: list[Sequence[float]] = [()] * threads
        self._dense_link: list[list[int]] = []
        self._asked = [0] * threads  # the last time each thread asked (for forgetting)
        self._asks = 0
        self._episodes: list[SpeedEpisodes | None] = []  # each thread's core's, if any
        self._cores: dict[tuple[int, int], SpeedEpisodes] = {}
        for thread in range(threads):
            device = scenario.device_of(thread)
            timing, hardware = scenario.timing_of(device), scenario.hardware_of(device)
            gens = _thread_generators(scenario.run.seed, thread)
            spec = scenario.devices[device]
            self._episodes.append(self._core_episodes(device, scenario.core_of(thread))
                                  if hardware.episodes else None)
            speed = spec.speed / slow[thread]
            self._speed.append(speed)
            # Contention grows with the workers that run at once: all of them, or as many
            # as the device has cores.
            self._slowdown.append(timing.slowdown(min(threads, spec.cores or threads)))
            self._dense_scale.append(np.asarray(dense, dtype=np.float64) / speed)
            link = link_of(spec) if network else (0, 0.0)
            self._link.append(link if latency else (0, link[1]))
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
            self._pending.append([[], [], [], []])
            self._dense_link.append(link_ns(self._link[thread], dim, dense).tolist())
            common = hardware.common
            self._coupling.append(
                self._coupled(timing, common, speed, gens)
                if common is not None and any(common.weights) else None)

    def _coupled(self, timing: TimingSpec, common: CommonSpec, speed: float,
                 gens: list[np.random.Generator]
                 ) -> tuple[list[tuple[Callable[[float], float], float, float, float,
                                       CommonFactor | None]], list[_Stream]]:
        """A coupled thread's phases (quantile of a normal score, scale of a draw, √c,
        √(1 − c), the factor its device shares) and its normal streams
        (``[hardware.common]``); the thread's scales are the last appended."""
        fr, fg, fw, _ = self._slowdown[-1]
        scales = (fr / speed, self.grad_work * fg / speed, fw / speed, self._idle_scale[-1])
        dists = (timing.read, timing.grad, timing.write, timing.idle)
        phases = []
        for phase, weight in enumerate(common.weights):
            factor = None
            if weight > 0:
                key = (phase, common.ns)
                if key not in self._factors:
                    self._factors[key] = CommonFactor(self.scenario.run.seed, phase, common.ns)
                factor = self._factors[key]
            phases.append((dists[phase].quantile_of_score(), scales[phase],
                           math.sqrt(weight), math.sqrt(1.0 - weight), factor))
        return phases, [_Stream(partial(_normals, gens[1 + p])) for p in range(4)]

    def next_sample(self, thread: int) -> int:
        return int(self._streams[thread][0].take())

    def remaining(self, thread: int) -> int | None:
        return None

    def _refill(self, thread: int) -> None:
        _, read, grad, write = self._streams[thread]
        scale, blocks = self._dense_scale[thread], len(self.dense)
        n = self._chunk
        link = np.asarray(self._dense_link[thread], dtype=np.int64)
        fr, fg, fw, _ = self._slowdown[thread]
        reads = (_ns(read.draw(n * blocks).reshape(n, blocks), scale * fr) + link).tolist()
        grads = _ns(grad.draw(n), self.grad_work * fg / self._speed[thread]).tolist()
        writes = (_ns(write.draw(n * blocks).reshape(n, blocks), scale * fw) + link).tolist()
        self._chunks[thread] = list(zip(reads, grads, writes, strict=True))
        self._pos[thread] = 0

    def durations(self, thread: int, fractions: Sequence[float]) -> tuple[list[int], int,
                                                                          list[int]]:
        coupling = self._coupling[thread]
        if coupling is not None:  # normal draws now, durations when each phase starts
            normals, blocks = coupling[1], len(fractions)
            self._fractions[thread] = fractions
            self._pending[thread] = [[normals[READ].take() for _ in range(blocks)],
                                     [normals[GRAD].take()],
                                     [normals[WRITE].take() for _ in range(blocks)],
                                     [normals[IDLE].take()]]
            return [0] * blocks, 0, [0] * blocks
        if fractions is self.dense:
            if self._pos[thread] == len(self._chunks[thread]):
                self._refill(thread)
            self._pos[thread] += 1
            return self._chunks[thread][self._pos[thread] - 1]
        _, read, grad, write = self._streams[thread]
        speed = self._speed[thread]
        fr, fg, fw, _ = self._slowdown[thread]
        link = link_ns(self._link[thread], self.dim, fractions).tolist()
        return ([int(read.take() * f * fr / speed + 0.5) + c for f, c in zip(fractions, link,
                                                                             strict=True)],
                int(grad.take() * self.grad_work * fg / speed + 0.5),
                [int(write.take() * f * fw / speed + 0.5) + c for f, c in zip(fractions, link,
                                                                              strict=True)])

    def idle(self, thread: int) -> int:
        stream = self._idle[thread]
        if stream is None or self._coupling[thread] is not None:
            return 0
        return int(stream.take() * self._idle_scale[thread] + 0.5)

    def coupled(self, thread: int) -> bool:
        return self._coupling[thread] is not None

    def slowness(self, thread: int, t: int) -> float:
        episodes = self._episodes[thread]
        return 1.0 if episodes is None else episodes.factor(t)

    def _core_episodes(self, device: int, core: int) -> SpeedEpisodes:
        """The speed episodes of ``core`` of ``device`` (made once, on first use)."""
        key = (device, core)
        if key not in self._cores:
            spec = self.scenario.hardware_of(device).episodes
            assert spec is not None
            self._cores[key] = SpeedEpisodes(self.scenario.run.seed, device, core,
                                             spec.factor, spec.fast_ns, spec.slow_ns)
        return self._cores[key]

    def place(self, thread: int, core: int) -> None:
        if self._episodes[thread] is not None:
            self._episodes[thread] = self._core_episodes(self.scenario.device_of(thread),
                                                         core)

    def at(self, thread: int, phase: int, t: int) -> list[int]:
        coupling = self._coupling[thread]
        assert coupling is not None
        quantile, scale, shared, own, factor = coupling[0][phase]
        scale *= self.slowness(thread, t)
        z = factor.at(t) if factor is not None else 0.0
        self._forget(thread, t)
        if phase in (READ, WRITE):
            fractions = self._fractions[thread]
            link = (self._dense_link[thread] if fractions is self.dense
                    else link_ns(self._link[thread], self.dim, fractions).tolist())
            return [int(quantile(shared * z + own * e) * f * scale + 0.5) + c
                    for e, f, c in zip(self._pending[thread][phase], fractions, link,
                                       strict=True)]
        return [int(quantile(shared * z + own * self._pending[thread][phase][0]) * scale
                    + 0.5)]

    def done(self, thread: int) -> None:
        self._asked[thread] = -1

    def _forget(self, thread: int, t: int) -> None:
        """Drop common-factor values no thread can ask for again, now and then."""
        self._asked[thread] = t
        self._asks += 1
        if self._asks % _KNOTS == 0:
            live = [a for a in self._asked if a >= 0]
            if live:
                for factor in self._factors.values():
                    factor.forget(min(live))


def link_of(spec: DeviceSpec) -> tuple[int, float]:
    """A device's network link to a server (``DeviceSpec``): the latency of one message
    (ns) and the ns each 8-byte coordinate takes over its bandwidth (0: unlimited)."""
    return spec.latency, (8.0 / spec.bandwidth if spec.bandwidth else 0.0)


def link_ns(link: tuple[int, float], dim: int, fractions: Sequence[float]) -> np.ndarray:
    """What one message over ``link`` (:func:`link_of`) adds to each block it moves, the
    blocks moving ``fractions`` of ``dim`` coordinates: the latency on the first block, and
    every block's bytes over the bandwidth."""
    latency, per_coord = link
    cost = np.floor(np.asarray(fractions, dtype=np.float64) * dim * per_coord + 0.5)
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

    def coupled(self, thread: int) -> bool:
        return False

    def slowness(self, thread: int, t: int) -> float:
        return 1.0  # recorded durations carry whatever slowed them

    def place(self, thread: int, core: int) -> None:
        pass

    def at(self, thread: int, phase: int, t: int) -> list[int]:
        raise TraceError("replay: durations are recorded, never drawn at a phase's start")

    def done(self, thread: int) -> None:
        pass
