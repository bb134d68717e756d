"""Writes of one block that meet: what their meeting loses (the ``lost_*`` values of
``[hardware.convoys]`` and ``[hardware.passing]``), the part that write convoys and passing
writes share."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.distributions import beta_shapes
from simulator.errors import ScenarioError
from simulator.hardware.base import Hardware
from simulator.scenario import ConvoySpec, PassingSpec, plain

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["Meetings", "meeting_spec"]

_CONVOY_TAG = 0xC0


def meeting_spec(engine: Engine) -> ConvoySpec | PassingSpec | None:
    """The values every thread's writes follow when writes that meet form convoys or pass
    each other; None where they do neither. Checks that the run's writes can: dense
    ``load_store`` writes of whole blocks, the same table on every device.

    Raises:
        ScenarioError: the first value that stops the run's writes from meeting so.
    """
    scenario = engine.scenario
    specs = {(h.convoys, h.passing) for h in (scenario.hardware_of(scenario.device_of(t))
                                              for t in range(engine.threads))}
    asked = [c or p for c, p in specs if c or p]
    if not asked or engine.protocol.atomic:
        return None
    spec = asked[0]
    name, what = (("hardware.convoys", "write convoys") if isinstance(spec, ConvoySpec) else
                  ("hardware.passing", "writes that pass"))
    value = plain(spec)
    if len(specs) > 1:
        raise ScenarioError(name, value, "must be the same on every device")
    if engine.protocol.name == "paramserver":
        raise ScenarioError(name, value, f"{what} are memory writes that meet; a lock-free "
                            "server's shard updates (paramserver.lock_free) are not modelled "
                            "so")
    run = scenario.run
    if run.write_mode != "load_store":
        raise ScenarioError(name, value, f"{what} need run.write_mode = load_store")
    if run.store_grain:
        raise ScenarioError(name, value, f"{what} sweep whole blocks: set run.store_grain = 0")
    if engine.sparse:
        raise ScenarioError(name, value,
                            f"{what} need dense writes (this problem's are sparse)")
    return spec


class Meetings(Hardware):
    """The draws of what meetings lose, from the run's own stream (seed, 0xC0)."""

    def __init__(self, engine: Engine, spec: ConvoySpec | PassingSpec) -> None:
        self.engine, self.spec = engine, spec
        self.rng = np.random.default_rng([engine.scenario.run.seed, _CONVOY_TAG])

    def losses(self, leader: Update, joiner: Update, size: int, front: float,
               lost: dict[int, np.ndarray]) -> list[int]:
        """Draw what a meeting of two writes of one block of ``size`` coordinates loses: in
        the part both sweep (from ``front``, the leader's position, to the end), each
        coordinate is lost by the leader or by the joiner with the ``lost_*``
        probabilities (never both), when the meeting loses anything at all
        (``lost_pairs``, falling with ``front`` as ``lost_within`` says), at the meeting's
        own rate with ``lost_spread``. The victims' masks in ``lost``
        (uid → lost coordinates) grow; returns the coordinates each lost (leader,
        joiner)."""
        spec = self.spec
        shared = size - min(size, math.ceil(front * size))
        lossy = spec.lost_pairs
        if spec.lost_within > 0:
            lossy *= math.exp(-front / spec.lost_within)
        if lossy < 1 and self.rng.random() >= lossy:
            shared = 0  # this meeting loses nothing (one draw per meeting, only when asked)
        leader_share = spec.lost_leader
        total = spec.lost_leader + spec.lost_joiner
        if spec.lost_spread > 0 and shared and 0 < total < 1:
            rate = self._rate(total, spec.lost_spread)
            leader_share, total = rate * leader_share / total, rate
        draws = self.rng.random(shared)
        leader_loses = draws < leader_share
        joiner_loses = ~leader_loses & (draws < total)
        counts = []
        for victim, winner, loses in ((leader, joiner, leader_loses),
                                      (joiner, leader, joiner_loses)):
            counts.append(int(loses.sum()))
            if counts[-1]:
                mask = lost.setdefault(victim.uid, np.zeros(size, dtype=bool))
                mask[size - shared:] |= loses
                self.engine.lost[victim.uid] += 1
                winner.overwrote += 1
        return counts

    def _rate(self, mean: float, rho: float) -> float:
        """A lossy meeting's own loss rate (``lost_spread`` = ρ > 0): a Beta draw of
        mean ``mean`` in which two coordinates' losses correlate ρ."""
        return float(self.rng.beta(*beta_shapes(mean, rho)))

    def land(self, u: Update, block: int, index: slice, step: np.ndarray,
             lost: dict[int, np.ndarray]) -> None:
        """``u``'s write of ``block`` lands whole, less the coordinates it lost."""
        mask = lost.pop(u.uid, None)
        self.engine.mem.add(block, index, None,
                            -step if mask is None else np.where(mask, 0.0, -step), u.uid)
