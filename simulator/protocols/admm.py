"""Asynchronous consensus ADMM across devices (Boyd et al. 2011 §7; Zhang & Kwok 2014).

The data are split into k shards (sample i belongs to worker i mod k) and f = Σ_i f_i with
f_i the shard's share of the loss. Worker i keeps a local copy x_i and a scaled dual u_i;
the shared vector is the consensus z. Each update of worker i:

1. pulls z (the read);
2. updates its dual with the pulled z, u_i ← u_i + x_i − z (the scaled-form dual step of
   its previous round), then solves its subproblem inexactly: ``admm.local_steps`` SGD steps
   with rate ``run.lr``, from x_i, on f_i(x) + ρ/2‖x − z + u_i‖² with samples from its shard
   (the gradient phase lasts that many gradient durations);
3. pushes the change of x_i + u_i divided by k, added atomically to z (the write), so z is
   always the mean of the workers' x_i + u_i however the pushes interleave.

Per update the trace records the primal residual ‖(x_1 − z, …, x_k − z)‖ and the dual
residual ρ·√k·‖z_t − z_{t−1}‖ (``extra_primal_residual``, ``extra_dual_residual``). The
update is not an SGD step, so the serialized view's δ is not computed (``measured`` false);
the loss curve of z is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.protocols.base import Protocol

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["ADMM"]

_TAG = 0xAD77  # the shard-sample streams, apart from every other stream


class ADMM(Protocol):
    """Consensus ADMM: local solves on shards, asynchronous averaging into z."""

    name = "admm"
    gated = True
    network = True
    atomic = True
    computes = True
    exact_view = False

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.dense = True
        self.options = scenario.admm
        self.grad_work = self.options.local_steps

    def setup(self, engine: Engine) -> None:
        k, problem = engine.threads, engine.problem
        w0 = problem.initial()
        self.x = np.tile(w0, (k, 1))
        self.u = np.zeros((k, problem.dim))
        n = problem.n_samples
        self.shards = [np.arange(i, n, k) for i in range(k)]
        # f = Σ_i f_i: shard i's sample losses carry weight 1/n each, i.e. |S_i|/n of a mean.
        self.weights = [len(shard) / n for shard in self.shards]
        seed = self.scenario.run.seed
        self.rngs = [np.random.default_rng([seed, _TAG, i]) for i in range(k)]
        self.previous = w0.copy()
        self.primal: list[float] = []
        self.dual: list[float] = []

    def compute(self, engine: Engine, u: Update, z: np.ndarray) -> np.ndarray:
        """The local solve and dual update; returns the step subtracted from z."""
        i, problem = u.thread, engine.problem
        rho, lr = self.options.rho, engine.lr
        shard = self.shards[i]
        if shard.size == 0:  # more workers than samples: nothing to learn
            return np.zeros_like(z)
        before = self.x[i] + self.u[i]
        self.u[i] += self.x[i] - z  # the dual step of the previous round, with the new z
        x = self.x[i].copy()
        picks = self.rngs[i].integers(0, shard.size, self.options.local_steps)
        u.sample = int(shard[picks[0]])  # the row records the first local sample
        for index in picks.tolist():
            g = problem.dense_grad(x, int(shard[index]))
            g *= self.weights[i]
            g += rho * (x - z + self.u[i])
            x -= lr * g
        self.x[i] = x
        return (before - (x + self.u[i])) / engine.threads

    def after_write(self, engine: Engine, u: Update) -> None:
        z = engine.mem.w
        gap = self.x - z
        self.primal.append(math.sqrt(float(np.sum(gap * gap))))
        moved = z - self.previous
        self.dual.append(self.options.rho * math.sqrt(engine.threads)
                         * math.sqrt(float(moved @ moved)))
        np.copyto(self.previous, z)

    def report(self) -> dict[str, np.ndarray]:
        return {"primal_residual": np.asarray(self.primal, dtype=np.float64),
                "dual_residual": np.asarray(self.dual, dtype=np.float64)}
