"""Writes of one block that meet: what their meeting loses (``timing.convoy_lost_*``), the
part that write convoys (``convoys``) and passing writes (``passing``) share."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.distributions import beta_shapes
from simulator.errors import ScenarioError
from simulator.hardware.base import Hardware
from simulator.scenario import CONVOY_FIELDS, TimingSpec

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["Meetings", "meeting_timing"]

_CONVOY_TAG = 0xC0


def meeting_timing(engine: Engine) -> TimingSpec | None:
    """The timing whose ``convoy_*`` values every thread's writes follow when writes that
    meet form convoys or pass each other (``TimingSpec.passing``); None where they do
    neither. Checks that the run's writes can: dense ``load_store`` writes of whole blocks,
    the same ``convoy_*`` values on every device.

    Raises:
        ScenarioError: the first value that stops the run's writes from meeting so.
    """
    scenario = engine.scenario
    timings = {scenario.timing_of(scenario.device_of(t)) for t in range(engine.threads)}
    asked = [t for t in timings if t.convoys or t.passing]
    if not asked or engine.protocol.atomic:
        return None
    timing = asked[0]
    name, what = (("timing.convoy_join", "write convoys") if timing.convoys else
                  ("timing.convoy_lost_leader", "writes that pass"))
    value = getattr(timing, name.removeprefix("timing."))
    if len({tuple(getattr(t, f) for f in CONVOY_FIELDS) for t in timings}) > 1:
        raise ScenarioError(name, value,
                            "the convoy_* values must be the same on every device")
    run = scenario.run
    if run.write_mode != "load_store":
        raise ScenarioError(name, value, f"{what} need run.write_mode = load_store")
    if run.store_grain:
        raise ScenarioError(name, value, f"{what} sweep whole blocks: set run.store_grain = 0")
    if engine.sparse:
        raise ScenarioError(name, value,
                            f"{what} need dense writes (this problem's are sparse)")
    return timing


class Meetings(Hardware):
    """The draws of what meetings lose, from the run's own stream (seed, 0xC0)."""

    def __init__(self, engine: Engine, timing: TimingSpec) -> None:
        self.engine, self.timing = engine, timing
        self.rng = np.random.default_rng([engine.scenario.run.seed, _CONVOY_TAG])

    def losses(self, leader: Update, joiner: Update, size: int, front: float,
               lost: dict[int, np.ndarray]) -> list[int]:
        """Draw what a meeting of two writes of one block of ``size`` coordinates loses: in
        the part both sweep (from ``front``, the leader's position, to the end), each
        coordinate is lost by the leader or by the joiner with the ``convoy_lost_*``
        probabilities (never both), when the meeting loses anything at all
        (``convoy_lost_pairs``, falling with ``front`` as ``convoy_lost_within`` says), at
        the meeting's own rate with ``convoy_lost_spread``. The victims' masks in ``lost``
        (uid → lost coordinates) grow; returns the coordinates each lost (leader,
        joiner)."""
        timing = self.timing
        shared = size - min(size, math.ceil(front * size))
        lossy = timing.convoy_lost_pairs
        if timing.convoy_lost_within > 0:
            lossy *= math.exp(-front / timing.convoy_lost_within)
        if lossy < 1 and self.rng.random() >= lossy:
            shared = 0  # this meeting loses nothing (one draw per meeting, only when asked)
        leader_share = timing.convoy_lost_leader
        total = timing.convoy_lost_leader + timing.convoy_lost_joiner
        if timing.convoy_lost_spread > 0 and shared and 0 < total < 1:
            rate = self._rate(total, timing.convoy_lost_spread)
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
        """A lossy meeting's own loss rate (``convoy_lost_spread`` = ρ > 0): a Beta draw of
        mean ``mean`` in which two coordinates' losses correlate ρ."""
        return float(self.rng.beta(*beta_shapes(mean, rho)))

    def land(self, u: Update, block: int, index: slice, step: np.ndarray,
             lost: dict[int, np.ndarray]) -> None:
        """``u``'s write of ``block`` lands whole, less the coordinates it lost."""
        mask = lost.pop(u.uid, None)
        self.engine.mem.add(block, index, None,
                            -step if mask is None else np.where(mask, 0.0, -step), u.uid)
