"""The shared shape of a protocol: plug-in points around the engine's update loop."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import simpy

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.problems import Problem
    from simulator.scenario import RunSpec, Scenario
    from simulator.update import Update

__all__ = ["GROUPED", "MEMBER", "SINGLE", "Protocol"]

# What an update does once it has passed ``before_write`` (``Update.role``).
SINGLE = 0   # writes its own step
MEMBER = 1   # its gradient is part of a group another update (or a later one) writes
GROUPED = 2  # writes the mean step of ``Update.group`` (itself last) and completes them all


class Protocol:
    """The engine runs read → gradient → write for every update; a protocol changes only
    what it needs through these plug-in points, whose defaults do nothing.

    * ``threads``: how many virtual threads run;
    * ``bind``: see the problem before durations are drawn;
    * ``setup``: create state (locks, barriers, events) on the engine's clock;
    * ``before_read`` / ``before_write``: an event the update waits for, or ``None``;
    * ``after_read`` / ``after_write``: the update's read / write has ended;
    * ``finish``: a thread's loop has ended (it will start no more updates);
    * ``active``: whether a thread may start another update;
    * ``step``: the update rule, from the step lr·g to the step the update applies;
    * ``grouped``: the step a group's writer applies, from its members' mean step;
    * ``compute``: replaces the gradient altogether (``computes``: ADMM's local solve);
    * ``bounds``: the blocks of the shared vector, where the protocol sets them (a model's
      stages);
    * ``loop``: a thread's whole loop, in place of the engine's (``owns_loop``: stages of a
      model-parallel protocol, driven by the messages they receive); it runs the engine's
      phases (``Engine.begin``, ``read``, ``gradient``, ``write``, ``wait``) and completes
      updates through ``Engine.ledger``.

    The four ``before``/``after`` points are called only when ``gated`` is true, and then at
    simpy's own time (the engine first catches up with the thread's clock), since they touch
    state other threads wait on. ``step`` is called only when ``rule`` is true. A thread
    that ``before_read`` made wait and that then sits out a hold (under a scheduler: waits
    to be chosen) asks it again before its read begins, so it must answer the same for a
    thread it already let through (``Locked``: the lock it holds; ``Rounds``: the round
    open now).

    Flags: ``dense`` makes every update move every block with a dense gradient (needed to
    average gradients of different samples); ``network`` makes pulls and pushes pay the
    devices' link latency and bandwidth (``latency`` false: the drawn durations carry no
    latency, the protocol adds each message's: a server pool); ``atomic`` forces atomic
    block adds whatever ``run.write_mode`` says (a server applies each push to a shard in
    one piece; an instance may say otherwise: a lock-free server);
    ``exact_view`` false switches the serialized view's δ off (updates that are not SGD
    steps); ``partial`` measures δ on the block an update writes (a stage's parameters: the
    exact gradient there, nothing elsewhere); ``grad_work`` multiplies each sampled gradient
    duration.
    """

    name: ClassVar[str] = ""
    gated: ClassVar[bool] = False
    rule: ClassVar[bool] = False
    network: ClassVar[bool] = False
    latency: bool = True
    atomic: bool = False
    computes: ClassVar[bool] = False
    exact_view: ClassVar[bool] = True
    partial: ClassVar[bool] = False
    owns_loop: ClassVar[bool] = False

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.dense = False
        self.grad_work = 1  # gradient durations per update (local solves take several)

    @classmethod
    def threads(cls, run: RunSpec) -> int:
        """How many threads the protocol runs (``run.threads`` unless it fixes its own)."""
        return run.threads

    def bind(self, problem: Problem) -> None:
        """The run's problem, before any duration is drawn (a protocol whose work per update
        depends on it sets ``grad_work`` here)."""

    def bounds(self, problem: Problem) -> list[int] | None:
        """Each block's start in the shared vector and the last one's end; None: the run's
        ``run.blocks`` equal blocks."""
        return None

    def setup(self, engine: Engine) -> None:
        """Create protocol state on the engine's clock."""

    def loop(self, engine: Engine, thread: int) -> Generator[Any, Any, None]:
        """``thread``'s loop (when ``owns_loop``)."""
        raise NotImplementedError

    def before_read(self, engine: Engine, u: Update) -> simpy.Event | None:
        return None

    def after_read(self, engine: Engine, u: Update) -> None:
        """``u``'s read has ended."""

    def before_write(self, engine: Engine, u: Update) -> simpy.Event | None:
        return None

    def after_write(self, engine: Engine, u: Update) -> None:
        """``u``'s write has completed (or ``u`` was discarded)."""

    def finish(self, engine: Engine, thread: int) -> None:
        """``thread`` starts no more updates."""

    def active(self, engine: Engine, thread: int) -> bool:
        return True

    def step(self, engine: Engine, u: Update, step: np.ndarray,
             local: np.ndarray) -> np.ndarray:
        """The step ``u`` applies, given lr·g and its read copy ``local``."""
        return step

    def grouped(self, engine: Engine, u: Update, mean: np.ndarray) -> np.ndarray:
        """The step the writer ``u`` of a group applies, given its members' mean step."""
        return mean

    def compute(self, engine: Engine, u: Update, local: np.ndarray) -> np.ndarray:
        """The step ``u`` applies, computed from its read copy (when ``computes``)."""
        raise NotImplementedError

    def report(self) -> dict[str, np.ndarray]:
        """Protocol-specific arrays for the trace (stored as ``extra_<name>``)."""
        return {}
