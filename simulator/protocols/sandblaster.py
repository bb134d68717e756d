"""DistBelief's Sandblaster L-BFGS (Dean et al. 2012, §4.2): batch optimization in which a
coordinator hands out many small work units, so slow machines simply do fewer of them.

The data are cut into ``sandblaster.units`` U contiguous chunks. Each round hands its U work
units out one by one to whichever thread asks next: a unit pulls the vector (the read), computes
its chunk's gradient (the gradient phase lasts ⌈n/U⌉ gradient durations) and sends it to the
coordinator, which takes no time of the thread's (the unit's write durations are unused). A
thread whose round has no unit left waits for the next round. When the round's last unit
arrives, its thread writes the coordinator's L-BFGS step: with g_r the mean of the U unit
gradients (the full gradient ∇f(x_r): every unit of a round read x_r, since nothing is
written within a round), the curvature pair (s, y) = (x_r − x_{r−1}, g_r − g_{r−1}) joins
a history of the last ``sandblaster.memory`` pairs and the step is x_{r+1} = x_r − α·H_r·g_r
(:class:`Lbfgs`; α = ``run.lr``, at the schedule's factor; no line search). A unit's
gradient is :func:`unit_of`. The parameter server runs the same protocol for real
(``realrun.ps``), with the same two. ``run.updates`` counts work units, a whole number of
rounds. Each unit is one trace row (its chunk's first sample); a round is one completion.
The step is not an SGD step: the serialized view measures no δ (as for ADMM); the loss
curve of x is exact.

Stragglers show the point: a thread ``factor`` times slower takes fewer units (DistBelief's
backup copies of a round's last outstanding units are not modelled: the straggler's last
unit holds its round up). Without a line search the loss can rise between rounds. Injected
errors, drops, delays, rounded stores and deaths are refused (a dead replica's unit would
never come back); ``units`` must not exceed the problem's samples.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simulator.errors import ScenarioError
from simulator.protocols.base import GROUPED, MEMBER, Protocol
from simulator.rules import lbfgs_direction, lbfgs_pair, unit_work

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.problems import Problem
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["Lbfgs", "Sandblaster", "unit_chunks", "unit_of"]


def unit_chunks(samples: int, units: int) -> list[np.ndarray]:
    """The samples of each of ``units`` work units: contiguous chunks (``numpy.array_split``)."""
    return np.array_split(np.arange(samples), units)


def unit_of(problem: Problem, chunks: list[np.ndarray], unit: int,
            w: np.ndarray) -> tuple[int, np.ndarray]:
    """Work unit ``unit`` at ``w``: its row's sample (its chunk's first) and its share of ∇f,
    the chunk's summed gradients × U/n (so that the mean of the U units' is ∇f)."""
    chunk = chunks[unit]
    total = np.zeros_like(w)
    for i in chunk.tolist():
        total += problem.dense_grad(w, i)
    return int(chunk[0]), total * (len(chunks) / problem.n_samples)


class Lbfgs:
    """Sandblaster's coordinator: the L-BFGS step of each round from its vector and gradient
    (Nocedal & Wright 2006, Algorithm 7.5 with a fixed step: ``simulator.rules``'
    ``lbfgs_direction`` and ``lbfgs_pair``), keeping the last ``memory`` curvature pairs.
    The simulator's protocol and the parameter server's coordinator (``realrun.ps``) run
    it."""

    def __init__(self, memory: int) -> None:
        self.pairs: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=memory)
        self.previous: tuple[np.ndarray, np.ndarray] | None = None  # x_{r−1}, g_{r−1}

    def step(self, x: np.ndarray, g: np.ndarray, lr: float) -> np.ndarray:
        """α·H_r·g_r, with (s, y) = (x_r − x_{r−1}, g_r − g_{r−1}) joining the history first
        where ``lbfgs_pair`` keeps it; ``x`` = x_r and ``g`` = g_r (float64), α = ``lr``."""
        if self.previous is not None:
            s, y = x - self.previous[0], g - self.previous[1]
            if lbfgs_pair(s, y):
                self.pairs.append((s, y))
        self.previous = (x.copy(), g.copy())
        return lr * lbfgs_direction(g, self.pairs)


class Sandblaster(Protocol):
    """Rounds of U work units handed out on demand; one L-BFGS step per round."""

    name = "sandblaster"
    gated = True
    network = True
    atomic = True
    computes = True
    exact_view = False

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.dense = True
        self.options = scenario.sandblaster

    def bind(self, problem: Problem) -> None:
        """The chunks of the problem's samples.

        Raises:
            ScenarioError: more units than samples (a unit would compute nothing).
        """
        units, n = self.options.units, problem.n_samples
        if units > n:
            raise ScenarioError("sandblaster.units", units, f"must be <= the problem's "
                                f"samples ({n}): a unit is a chunk of them")
        self.chunks = unit_chunks(n, units)
        self.grad_work = unit_work(n, units)  # ⌈n/U⌉ gradients a unit

    def setup(self, engine: Engine) -> None:
        self.env = engine.env
        self.handed = 0  # units of the open round handed out
        self.writing = False  # the round's step is being written
        self.opened = self.env.event()  # the next round opens
        self.unit: dict[int, int] = {}  # uid → its unit in the round
        self.waiting: list[int] = []  # updates waiting for the next round (uids, in order)
        self.arrivals: list[Update] = []
        self.coordinator = Lbfgs(self.options.memory)

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        """A unit of the open round, or the next round's opening (which hands it one: units
        >= threads, so every waiting update gets one)."""
        if u.uid in self.unit:  # asked again after its wait: it has its unit
            return None
        if self.writing or self.handed == self.options.units:
            self.waiting.append(u.uid)
            return self.opened
        self._hand(u.uid)
        return None

    def _hand(self, uid: int) -> None:
        self.unit[uid] = self.handed
        self.handed += 1

    def compute(self, engine: Engine, u: Update, local: np.ndarray) -> np.ndarray:
        """The unit's share of ∇f at the pulled vector: its chunk's summed gradients × U/n."""
        u.sample, g = unit_of(engine.problem, self.chunks, self.unit.pop(u.uid), local)
        return g

    def before_write(self, engine: Engine, u: Update) -> simpy.Event | None:
        self.arrivals.append(u)
        if len(self.arrivals) < self.options.units:
            u.role = MEMBER  # its gradient is with the coordinator; the thread goes on
            return None
        u.role, u.group, self.arrivals = GROUPED, self.arrivals, []
        self.writing = True
        return None

    def grouped(self, engine: Engine, u: Update, mean: np.ndarray) -> np.ndarray:
        """The coordinator's L-BFGS step α·H·g from the round's gradient g = ``mean``."""
        # x_r: every unit of the round read it
        return self.coordinator.step(engine.read_copy(u.thread), mean, engine.lr)

    def after_write(self, engine: Engine, u: Update) -> None:
        if u.role == GROUPED:
            self.handed, self.writing = 0, False
            waiting, self.waiting = self.waiting, []
            for uid in waiting:
                self._hand(uid)
            opened, self.opened = self.opened, self.env.event()
            opened.succeed()
