"""Controlled delays and gradient errors (the ``[inject]`` section of a scenario).

Every random choice comes from the injecting thread's own generator, seeded from
``(run.seed, thread)`` apart from the sample and timing streams, so switching an injection on
never changes which samples a thread draws or how long its actions take. What was injected is
recorded per update in the trace (``delay``, ``error_norm``, ``dropped``).

Stragglers act through the duration source (a slower speed), pauses and deaths through the
engine's clock; the rest is here.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.rules import round_significand
from simulator.scenario import InjectSpec

if TYPE_CHECKING:
    import simpy

    from simulator.scenario import Scenario

__all__ = ["Injector", "Pauses", "start_deaths"]

_TAG = 0x1A7EC7  # separates these streams from the sample and timing streams


class Injector:
    """Draws the injected delay and error of each update, thread by thread."""

    def __init__(self, spec: InjectSpec, seed: int, threads: int, w_star: np.ndarray) -> None:
        self.spec = spec
        self.w_star = w_star
        self._rngs = [np.random.default_rng([seed, _TAG, thread]) for thread in range(threads)]
        self.max_delay = spec.max_delay
        self.errors = spec.error != "none" and spec.error_bound > 0
        self.bits = spec.write_bits

    def delay(self, thread: int) -> int:
        """τ for the next update of ``thread`` (how many completions older its read is)."""
        spec = self.spec
        if spec.delay_dist == "fixed":
            return spec.delay
        return int(self._rngs[thread].integers(spec.delay, spec.delay_max + 1))

    def dropped(self, thread: int) -> bool:
        """Whether the next update's write is lost."""
        return bool(self.spec.drop) and bool(self._rngs[thread].random() < self.spec.drop)

    def error(self, thread: int, g: np.ndarray, w_read: np.ndarray,
              coords: np.ndarray | None) -> tuple[np.ndarray, float]:
        """``g`` plus the injected error e (over the gradient's coordinates), and ‖e‖.

        ``noise``: a uniformly random direction. ``adversarial``: −(w − w*)/‖w − w*‖, so the
        step −lr·e points away from the optimum and −⟨e, w − w*⟩ = ‖e‖·‖w − w*‖ is as large
        as the bound allows (condition (7) of Theorem 1 at its worst).
        """
        spec = self.spec
        bound = spec.error_bound * (math.sqrt(float(g @ g)) if spec.error_relative else 1.0)
        if bound == 0:
            return g, 0.0
        if spec.error == "noise":
            direction = self._rngs[thread].standard_normal(g.size)
        else:
            star = self.w_star if coords is None else self.w_star[coords]
            read = w_read if coords is None else w_read[coords]
            direction = star - read
        norm = math.sqrt(float(direction @ direction))
        if norm == 0:
            return g, 0.0
        return g + direction * (bound / norm), bound

    def quantize(self, values: np.ndarray) -> None:
        """Round stored values in place to ``write_bits`` significand bits."""
        round_significand(values, self.bits)


class Pauses:
    """The injected pauses (``[[inject.pauses]]``): a thread whose clock falls in one of its
    pause windows starts its next action when the window ends."""

    def __init__(self, spec: InjectSpec, threads: int) -> None:
        self.windows: list[list[tuple[int, int]]] = [[] for _ in range(threads)]
        for pause in spec.pauses:
            if pause.thread < threads:
                self.windows[pause.thread].append((pause.start, pause.end))

    def paused(self, thread: int) -> bool:
        return bool(self.windows[thread])

    def hold(self, thread: int, t: int) -> int:
        for start, end in self.windows[thread]:
            if start <= t < end:
                t = end
        return t


def start_deaths(env: simpy.Environment, scenario: Scenario,
                 processes: list[simpy.Process]) -> None:
    """Schedule the injected deaths (``[[inject.deaths]]``): each interrupts its thread's
    process (or every thread of its device) at its time, if it is still running."""
    threads = len(processes)
    for death in scenario.inject.deaths:
        victims = ([death.thread] if death.thread >= 0 else
                   [t for t in range(threads) if scenario.device_of(t) == death.device])
        for thread in victims:
            if thread < threads:
                env.process(_kill(env, processes[thread], death.at))


def _kill(env: simpy.Environment, process: simpy.Process, at: int) -> Generator[Any, Any, None]:
    yield env.timeout(at)
    if process.is_alive:
        process.interrupt("death")
