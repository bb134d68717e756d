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

from typing import TYPE_CHECKING

import numpy as np

from simulator.protocols.base import Protocol
from simulator.rules import admm_push, admm_residuals, admm_samples, admm_shard

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["ADMM"]


class ADMM(Protocol):
    """Consensus ADMM: local solves on shards, asynchronous averaging into z
    (``simulator.rules.admm_push``, which real workers call too)."""

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
        self.shards = [admm_shard(n, k, i) for i in range(k)]
        # f = Σ_i f_i: shard i's sample losses carry weight 1/n each, i.e. |S_i|/n of a mean.
        self.weights = [len(shard) / n for shard in self.shards]
        self.draws = [admm_samples(self.scenario.run.seed, i) for i in range(k)]
        self.previous = w0.copy()
        self.primal: list[float] = []
        self.dual: list[float] = []

    def compute(self, engine: Engine, u: Update, z: np.ndarray) -> np.ndarray:
        """The local solve and dual update; returns the step subtracted from z."""
        i = u.thread
        shard = self.shards[i]
        if shard.size == 0:  # more workers than samples: nothing to learn
            return np.zeros_like(z)
        samples = self.draws[i](shard, self.options.local_steps)
        u.sample = int(samples[0])  # the row records the first local sample
        return admm_push(engine.problem.dense_grad, self.x[i], self.u[i], z, samples,
                         self.weights[i], self.options.rho, engine.lr, engine.threads)

    def after_write(self, engine: Engine, u: Update) -> None:
        z = engine.mem.w
        primal, dual = admm_residuals(self.x, z, z - self.previous, self.options.rho)
        self.primal.append(primal)
        self.dual.append(dual)
        np.copyto(self.previous, z)

    def report(self) -> dict[str, np.ndarray]:
        return {"primal_residual": np.asarray(self.primal, dtype=np.float64),
                "dual_residual": np.asarray(self.dual, dtype=np.float64)}
