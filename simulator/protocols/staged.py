"""Model-parallel protocols: the network's stages run on threads of their own, each updating
its own parameters. ``amp`` (asynchronous model parallelism; Gaunt et al. 2017, AMPNet) passes
activations forward and gradients back; ``local`` (layer-wise local parallelism; Laskin et al.
2020) passes activations forward and trains each stage before the last on its own local
loss; ``block_admm`` (stochastic block ADMM) joins the stages by auxiliary variables and
their duals and passes nothing.

Each thread is a stage (``Problem.stages``: the layers of the ``mlp``; the two halves of a
linear model's features), on the device its thread is placed on; the shared vector's blocks
are the stages' parameters (``run.threads`` and ``run.blocks`` must equal the problem's
stages). A stage's gradient work is the drawn gradient duration times its share of the
coordinates. Each (stage, sample) is one trace row; ``run.updates`` counts them; the
serialized view measures each row's δ against the exact gradient of its stage's parameters
at w_{t−1} (``Protocol.partial``). Injected errors, drops, delays and rounding are refused
(scenario check), as are hardware models, a scheduler and replay; stragglers, pauses and
deaths are honoured.

Under ``amp`` and ``local`` a stage works through the messages that reach it, one at a time,
in order of arrival:

* a sample's **forward** message (for the first stage: a free place in the pipeline, at most
  ``max_active`` samples in it at once): the stage reads its parameters θ_s and computes
  its activation from the one it received, which it sends on (the update's READ phase: the
  read of θ_s's block and the forward's compute, a third of the stage's gradient work);
* under ``amp``, a sample's **backward** message (for the last stage: right after its
  forward): the stage computes the gradient of its parameters from the gradient it received,
  its forward recomputed from its input at θ_s as it is now (``Problem.backward``; the
  GRADIENT phase, two thirds of its gradient work), sends the gradient with respect to its
  input back, and writes −lr·g into its block (the WRITE phase; every ``update_every``
  gradients as their mean). The first stage's backward frees the sample's place, and the
  next sample enters. Under ``local`` every stage takes its backward right after its
  forward, from its own auxiliary head's loss (``Problem.local_head``, ``local_backward``;
  the last stage from the loss), and the last stage's write frees the place.

A message from a stage flies for its device's link latency plus its activation's
coordinates over the link's bandwidth, without holding the stage. The row's staleness counts
the completions since its sample entered the pipeline, so the stages nearer the input see
staler gradients. With one sample in the pipeline (``max_active = 1``) ``amp`` is plain SGD
and ``local`` greedy layer-wise SGD. Under ``block_admm`` (two stages) each stage loops on
its own samples: :class:`BlockADMM`.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import simpy

from simulator.errors import ScenarioError
from simulator.problems.base import Problem
from simulator.protocols.base import GROUPED, MEMBER, Protocol
from simulator.rules import mean_step
from simulator.scenario import plain
from simulator.timing import link_of

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.scenario import Scenario
    from simulator.update import Update

__all__ = ["Amp", "BlockADMM", "Local", "Staged", "aux_residual", "block_admm_step",
           "stage_outputs"]

FORWARD, BACKWARD = 0, 1


class Staged(Protocol):
    """What the model-parallel protocols share: a thread per stage, a block per stage's
    parameters, and the engine's phases driven by the protocol's own loop."""

    owns_loop = True
    partial = True
    computes = True
    atomic = True

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.options = getattr(scenario, self.name)

    def bind(self, problem: Problem) -> None:
        """The problem's stages.

        Raises:
            ScenarioError: a problem without stages, or a run whose threads, blocks or
                updates do not fit them.
        """
        scenario, run = self.scenario, self.scenario.run
        stages = problem.stages()
        if stages is None and problem.name == "torch":
            raise ScenarioError("problem.split_at", [], f"{self.name} trains a model stage by "
                                "stage: name the children of its nn.Sequential where the "
                                "stages after the first start")
        if stages is None:
            raise ScenarioError("problem.name", scenario.problem.name, f"{self.name} trains a "
                                "model stage by stage: use mlp, lstm_tagger, logistic, "
                                "quadratic, or torch with problem.split_at")
        n = len(stages)
        for field, value, what in (("run.threads", run.threads, "a thread per stage"),
                                   ("run.blocks", run.blocks, "a block per stage's "
                                    "parameters")):
            if value != n:
                raise ScenarioError(field, value, f"{self.name} runs {what}: must equal "
                                    f"the problem's stages ({n})")
        if run.split != "shared":
            raise ScenarioError("run.split", run.split, f"{self.name}'s stages take the "
                                "updates as they go: must be shared")
        for d in range(len(scenario.devices)):
            for table, spec in vars(scenario.hardware_of(d)).items():
                if spec is not None:
                    raise ScenarioError(f"hardware.{table}", plain(spec), "hardware models "
                                        "of shared-memory updates do not apply to "
                                        f"{self.name}'s stages")
        self.problem, self.stages = problem, stages
        self.fractions = [(s.stop - s.start) / problem.dim for s in stages]

    def bounds(self, problem: Problem) -> list[int] | None:
        return [s.start for s in self.stages] + [self.stages[-1].stop]

    def setup(self, engine: Engine) -> None:
        """Each stage's block.

        Raises:
            ScenarioError: a replay (each stage's durations are reshaped as they are drawn;
                simulate the scenario again instead: the same seed gives the same run).
        """
        if engine.replayed:
            raise ScenarioError("run.protocol", self.name, f"a trace of {self.name}'s stages is "
                                "not replayed: simulate its scenario again (same seed, same "
                                "run)")
        self.ops = [[engine.dense_ops[s]] for s in range(len(self.stages))]

    def _start(self, engine: Engine, stage: int, seq: int, sample: int,
               forward: bool, share: float = 0.0) -> Update:
        """A stage's update of ``sample``: its durations drawn, its gradient work its share of
        the drawn gradient's (plus ``share``: an auxiliary head's); with ``forward`` a third
        of that in its read (the forward pass), the rest its gradient phase (the
        backward)."""
        u = engine.begin(stage, seq, sample, self.ops[stage], [self.fractions[stage]])
        work = int(u.grad_ns * (self.fractions[stage] + share) + 0.5)
        ahead = work // 3 if forward else 0
        u.read_ns = [u.read_ns[0] + ahead]
        u.grad_ns = work - ahead
        return u

    def _step(self, engine: Engine, stage: int, g: np.ndarray) -> np.ndarray:
        """The update's step: lr·``g`` on the stage's block, 0 elsewhere."""
        step = np.zeros(self.problem.dim)
        step[self.stages[stage]] = g
        step *= engine.lr
        return step


class Amp(Staged):
    """Stages on threads of their own, passing activations forward and gradients back."""

    name = "amp"
    local: ClassVar[bool] = False  # each stage trains on its own loss (``Local``)

    def bind(self, problem: Problem) -> None:
        """The problem's stages, and the samples the run takes through them.

        Raises:
            ScenarioError: as ``Staged.bind``; more than two stages (``local``), or updates
                that are not a whole number of each stage's writes.
        """
        super().bind(problem)
        run, n = self.scenario.run, len(self.stages)
        if self.local and n != 2:
            raise ScenarioError("run.threads", run.threads, "local's auxiliary head has the "
                                "last stage's shape: the problem must have two stages")
        per_stage = self.options.update_every * n
        if run.updates % per_stage:
            raise ScenarioError("run.updates", run.updates, f"counts every stage's gradients "
                                f"({n} per sample), applied {self.name}.update_every = "
                                f"{self.options.update_every} at a time: must be a multiple "
                                f"of {per_stage}")
        self.samples = run.updates // n

    def setup(self, engine: Engine) -> None:
        """The stages' inboxes, their messages' flight times, and the first samples'
        entry."""
        super().setup(engine)
        self.env = engine.env
        scenario, n = self.scenario, len(self.stages)
        self.inbox = [simpy.Store(engine.env) for _ in range(n)]
        # What a message from each stage takes to arrive: latency + coordinates / bandwidth;
        # an activation forward (stage s's width), a gradient back (the width of the stage
        # before), a free place (latency only).
        self.ahead: list[int] = []
        self.behind: list[int] = []
        self.token: list[int] = []
        for s in range(n):
            latency, per_coord = link_of(scenario.devices[scenario.device_of(s)])
            self.token.append(latency)
            for flights, other in ((self.ahead, s), (self.behind, s - 1)):
                width = self.problem.stage_width(other) if 0 <= other < n - 1 else 0
                flights.append(latency + int(width * per_coord + 0.5))
        self.entered = 0
        self.cache: dict[int, Any] = {}  # uid → its forward's cache
        self.up: dict[int, np.ndarray | None] = {}  # uid → the gradient it received
        self.back: dict[int, np.ndarray | None] = {}  # uid → the gradient it sends back
        self.pending: list[list[Update]] = [[] for _ in range(n)]  # gradients to average
        # ``local``: each stage before the last trains an auxiliary head on its own loss,
        # kept by the stage (not in the shared vector), stepped with the stage's writes.
        self.heads = ([self.problem.local_head(s) for s in range(n - 1)] if self.local
                      else [])
        self.head_grads: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.out: dict[int, np.ndarray] = {}  # uid → its forward's activation (local)
        for _ in range(min(self.options.max_active, self.samples)):
            self._enter()

    def _enter(self) -> None:
        """A sample enters the pipeline: a forward message for the first stage, now."""
        self.entered += 1
        self._deliver(0, (FORWARD, None, []))

    def _free(self, engine: Engine, stage: int) -> Generator[Any, Any, None]:
        """A sample has left the pipeline at ``stage``: the next one enters (told to the
        first stage by a message from another)."""
        if self.entered == self.samples:
            return
        if stage == 0:
            yield from engine.catch_up(stage)
            self._enter()
        else:
            self.entered += 1
            yield from self._send(engine, stage, 0, (FORWARD, None, []),
                                  self.token[stage])

    def _send(self, engine: Engine, stage: int, to: int, message: tuple[Any, ...],
              flight: int) -> Generator[Any, Any, None]:
        """Send ``message`` from ``stage`` (at its clock) to stage ``to``'s inbox, where it
        arrives ``flight`` ns later."""
        yield from engine.catch_up(stage)
        if flight:
            self.env.timeout(flight).callbacks.append(lambda _: self._deliver(to, message))
        else:
            self._deliver(to, message)

    def _deliver(self, to: int, message: tuple[Any, ...]) -> None:
        self.inbox[to].put(message)

    def loop(self, engine: Engine, thread: int) -> Generator[Any, Any, None]:
        """Stage ``thread``: forwards and backwards, in order of arrival, until it has
        written every sample's gradient."""
        stage, last, seq, done = thread, thread == len(self.stages) - 1, 0, 0
        problem, stages = self.problem, self.stages
        while done < self.samples:
            yield from engine.catch_up(stage)
            get = self.inbox[stage].get()
            yield from engine.wait(stage, get)
            kind, payload, trail = get.value  # type: ignore[misc]
            if kind == BACKWARD:
                done += 1
                yield from self._backward(engine, trail[-1], payload, trail[:-1])
                continue
            if stage == 0:
                sample, entry = engine.source.next_sample(0), engine.completed
            else:
                sample, entry = trail[0].sample, trail[0].start_completed
            u = self._start(engine, stage, seq, sample, forward=True,
                            share=self.fractions[-1] if self.local and not last else 0.0)
            seq += 1
            if u.idle_ns:
                yield from engine.idle(stage, u)
            yield from engine.hold(stage)
            yield from engine.read(stage, u)
            u.start_completed = entry  # staleness counts from the sample's entry
            out, self.cache[u.uid] = problem.forward(
                stage, engine.read_copy(stage)[stages[stage]], payload, sample)
            if self.local and not last:
                self.out[u.uid] = out
            if not last:
                yield from self._send(engine, stage, stage + 1, (FORWARD, out, [*trail, u]),
                                      self.ahead[stage])
            if last or self.local:  # the backward now: from the loss, or its own loss
                done += 1
                yield from self._backward(engine, u, None, [] if self.local else trail)

    def _backward(self, engine: Engine, u: Update, up: np.ndarray | None,
                  trail: list[Update]) -> Generator[Any, Any, None]:
        """``u``'s backward from the gradient ``up`` it received; its write (or its place
        among the gradients to average); the gradient it sends back to ``trail``'s last."""
        stage = u.thread
        self.up[u.uid] = up
        yield from engine.hold(stage)
        yield from engine.gradient(stage, u)
        back = self.back.pop(u.uid)
        if trail:
            yield from self._send(engine, stage, stage - 1, (BACKWARD, back, trail),
                                  self.behind[stage])
        every = self.options.update_every
        if every > 1:
            pending = self.pending[stage]
            pending.append(u)
            if len(pending) < every:
                u.role = MEMBER  # written with the group's last
            else:
                u.role, u.group, self.pending[stage] = GROUPED, pending, []
        if u.role != MEMBER:
            yield from engine.hold(stage)
            yield from engine.write(stage, u)
            if u.role == GROUPED:
                engine.ledger.complete_group(u)
            else:
                engine.ledger.complete(u)
            grads = self.head_grads[stage]
            if grads:  # the head's step, as the stage's: the mean of its gradients
                self.heads[stage] -= engine.lr * u.lr_scale * mean_step(grads)
                grads.clear()
        if stage == (len(self.stages) - 1 if self.local else 0):
            yield from self._free(engine, stage)

    def compute(self, engine: Engine, u: Update, local: np.ndarray) -> np.ndarray:
        """−(the step): lr times the gradient of the stage's parameters, from the gradient it
        received and its forward recomputed from its input at its parameters now (only it
        writes them)."""
        stage, part = u.thread, self.stages[u.thread]
        theta, cache, up = engine.mem.w[part], self.cache.pop(u.uid), self.up.pop(u.uid)
        if self.local and stage < len(self.stages) - 1:
            g, head = self.problem.local_backward(stage, theta, self.heads[stage], cache,
                                                  self.out.pop(u.uid), u.sample)
            self.head_grads[stage].append(head)
            self.back[u.uid] = None
        else:
            g, self.back[u.uid] = self.problem.backward(stage, theta, cache, up, u.sample)
        return self._step(engine, stage, g)


class Local(Amp):
    """Layer-wise local parallelism (Laskin et al. 2020): the same stages and forward
    messages, no backward ones; each stage before the last trains on its own local loss, an
    auxiliary head on its activation (``Problem.local_head``, its work charged to the
    stage), the last on the loss, and its backward frees the sample's place."""

    name = "local"
    local = True


class BlockADMM(Staged):
    """Stochastic block ADMM: two stages joined, for every sample i, by an auxiliary
    variable z_i standing for stage 0's output h_i = h(θ_0; x_i) and its scaled dual u_i,
    on the augmented Lagrangian Σ_i ℓ(θ_1; z_i, y_i) + (ρ/2)‖z_i − h(θ_0; x_i) + u_i‖² (plus
    the l2 terms). No message passes: each stage loops on samples of its own stream, reading
    the auxiliary variables where they are kept (no link cost). Stage 0's update of sample i
    is an SGD step of θ_0 on (ρ/2)‖z_i + u_i − h(θ_0; x_i)‖² (its backward from
    ρ(h − z_i − u_i)); it keeps the output h_i it computed. Stage 1's update is an SGD step
    of θ_1 on ℓ(θ_1; z_i, y_i), then a step of ``block_admm.aux_lr`` on z_i for
    ℓ(θ_1; z, y_i) + (ρ/2)‖z − h_i + u_i‖², then the dual step u_i += z_i − h_i. Every z_i
    starts at h(θ_0(w_0); x_i), every u_i at 0. At a fixed point z_i = h_i and the stages'
    conditions are those of ∇f = 0: on a convex problem it reaches the optimum."""

    name = "block_admm"

    def bind(self, problem: Problem) -> None:
        """The problem's stages (two).

        Raises:
            ScenarioError: as ``Staged.bind``; more than two stages.
        """
        super().bind(problem)
        if len(self.stages) != 2:
            raise ScenarioError("run.threads", self.scenario.run.threads, "block_admm joins "
                                "two stages: the problem must have two")

    def setup(self, engine: Engine) -> None:
        """Each sample's auxiliary variable at stage 0's output from w_0, and its dual at 0."""
        super().setup(engine)
        self.h = stage_outputs(self.problem, engine.mem.w[self.stages[0]])
        self.z = [h.copy() for h in self.h]
        self.u = [np.zeros_like(h) for h in self.h]
        self.rho, self.aux_lr = self.options.rho, self.options.aux_lr
        self.mem = engine.mem

    def report(self) -> dict[str, np.ndarray]:
        """``aux_residual``: the root mean square over samples of z_i − h(θ_0; x_i) at the
        run's end (the coupling's primal residual; θ_0 as the run left it)."""
        residual = aux_residual(self.problem, self.mem.w[self.stages[0]], self.z)
        return {"aux_residual": np.array([residual])}

    def loop(self, engine: Engine, thread: int) -> Generator[Any, Any, None]:
        """Stage ``thread``: its samples, one update each, while the run has updates left."""
        seq = 0
        while engine.started < engine.updates:
            u = self._start(engine, thread, seq, engine.source.next_sample(thread),
                            forward=False)
            seq += 1
            if u.idle_ns:
                yield from engine.idle(thread, u)
            for phase in (engine.read, engine.gradient, engine.write):
                yield from engine.hold(thread)
                yield from phase(thread, u)
            engine.ledger.complete(u)

    def compute(self, engine: Engine, u: Update, local: np.ndarray) -> np.ndarray:
        """The stage's step from its read copy (and, for stage 1, the steps of z_i, u_i)."""
        stage, i = u.thread, u.sample
        g = block_admm_step(self.problem, stage, local[self.stages[stage]], i, self.z[i],
                            self.u[i], self.h[i], self.rho, self.aux_lr)
        return self._step(engine, stage, g)


def block_admm_step(problem: Problem, stage: int, theta: np.ndarray, i: int, z: np.ndarray,
                    u: np.ndarray, h: np.ndarray, rho: float, aux_lr: float) -> np.ndarray:
    """One stochastic block ADMM update of sample ``i`` by ``stage`` at its parameters
    ``theta``: the gradient g of θ_s (the caller steps θ_s −= lr·g), with sample i's
    auxiliary variable ``z``, scaled dual ``u`` and kept output ``h`` updated in place (the
    simulator's and the real stages' one copy of the math: :class:`BlockADMM`).

    Stage 0: h = h(θ_0; x_i), g = ∂/∂θ_0 (ρ/2)‖z + u − h(θ_0; x_i)‖² (its backward from
    ρ(h − z − u)); h kept. Stage 1: g = ∂/∂θ_1 ℓ(θ_1; z, y_i) (its backward from the loss
    also gives ∂ℓ/∂z), then z ← z − aux_lr·(∂ℓ/∂z + ρ(z − h + u)) and u ← u + z − h: the
    scaled-form ADMM steps (Boyd et al. 2011, §3.1.1), each minimisation replaced by one
    gradient step."""
    if stage == 0:
        out, cache = problem.forward(0, theta, None, i)
        g, _ = problem.backward(0, theta, cache, rho * (out - z - u), i)
        h[...] = out
        return g
    _, cache = problem.forward(1, theta, z, i)
    g, back = problem.backward(1, theta, cache, None, i)
    assert back is not None
    z[...] = z - aux_lr * (back + rho * (z - h + u))
    u += z - h
    return g


def stage_outputs(problem: Problem, theta: np.ndarray) -> list[np.ndarray]:
    """h(θ_0; x_i), stage 0's output at ``theta``, for every sample i (one array each: a
    torch model's last minibatch can be shorter)."""
    return [problem.forward(0, theta, None, i)[0] for i in range(problem.n_samples)]


def aux_residual(problem: Problem, theta: np.ndarray, z: list[np.ndarray]) -> float:
    """block_admm's coupling residual: the root mean square, over every coordinate of every
    sample i, of z_i − h(θ_0; x_i) at θ_0 = ``theta`` (the primal residual z − h; Boyd et
    al. 2011, §3.3)."""
    gap = np.concatenate([(z_i - h).ravel()
                          for z_i, h in zip(z, stage_outputs(problem, theta), strict=True)])
    return math.sqrt(float(np.mean(gap ** 2)))
