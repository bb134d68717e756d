"""Hardware effects as opt-in models around the engine's loop (DESIGN §2).

The engine runs the paper's semantics; each model here adds one effect that a machine
shows, is switched on by its scenario values, and costs nothing when off (it is not built,
and the engine calls only the hooks of the models that are on, ``Hardware``):

* ``slices``: time slices, preemption and migration of threads that outnumber their cores;
* ``episodes``: speed episodes of a device's cores;
* ``shared_lines``: writes of blocks another thread read since;
* ``interference``: phases that slow each other;
* ``convoys`` and ``passing``: writes of one block that meet;
* ``sweeping``: reads that see part of the writes in flight.

Each has its own scenario table (``[hardware.time_slices]``, ...:
``simulator.scenario.hardware``). Durations that go together across threads
(``[hardware.common]``) are drawn by the duration source (``simulator.timing``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from simulator.hardware.base import Hardware, overrides
from simulator.hardware.convoys import Convoys
from simulator.hardware.episodes import Episodes
from simulator.hardware.interference import Interference
from simulator.hardware.meetings import meeting_spec
from simulator.hardware.passing import Passing
from simulator.hardware.shared_lines import SharedLines
from simulator.hardware.slices import TimeSlices
from simulator.hardware.sweeping import Sweeping, Writing
from simulator.memory import WriteMode
from simulator.scenario import PassingSpec

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["Hardware", "Machine", "Writer", "Writing", "build", "overrides"]


class Writer(Protocol):
    """A model that writes an update's blocks itself, in place of the engine's writes."""

    def write(self, thread: int, u: Update, step: np.ndarray) -> Generator[Any, Any, None]: ...


@dataclass
class Machine:
    """The models a run switches on: all of them (in hook order), the one that writes
    updates itself (or None), the write mode they impose (or None: the run's own), and the
    model of reads that see writes in flight (or None)."""

    models: list[Hardware]
    writer: Writer | None = None
    mode: WriteMode | None = None
    sweeping: Sweeping | None = None

    def hooks(self, name: str, threads: int) -> list[list[Any]]:
        """Per thread, the hook ``name`` of each model that implements it and acts on the
        thread, in model order."""
        if not self.models:
            return [[] for _ in range(threads)]
        return [[getattr(m, name) for m in self.models if overrides(m, name) and m.on(t)]
                for t in range(threads)]


def build(engine: Engine) -> Machine:
    """The hardware models ``engine``'s scenario switches on.

    Raises:
        ScenarioError: a model's values that the run's other values rule out.
    """
    scenario = engine.scenario
    hardware = [scenario.hardware_of(d) for d in range(len(scenario.devices))]
    if all(spec is None for h in hardware for table, spec in vars(h).items()
           if table != "common"):  # (common factors shape the drawn durations alone)
        return Machine([])
    slices = TimeSlices(scenario, engine.threads)
    sliced = slices if slices.active else None
    episodes = (Episodes(engine, sliced) if any(h.episodes for h in hardware) else None)
    under = Interference.slowdowns(engine)
    interference = Interference(engine, under) if any(under) else None
    factors = SharedLines.factors_of(engine)
    lines = (SharedLines(factors, scenario.run.blocks) if any(f is not None for f in factors)
             else None)
    sweeping = Sweeping(engine) if any(h.sweeping_reads for h in hardware) else None
    spec = meeting_spec(engine)
    writer = mode = None
    if isinstance(spec, PassingSpec):
        mode = Passing(engine, spec)
    elif spec is not None:
        writer = Convoys(engine, spec, interference, sweeping)
    models = [m for m in (sliced, episodes, lines, interference, writer, mode, sweeping)
              if m is not None]
    return Machine(models, writer, mode, sweeping)  # type: ignore[arg-type]
