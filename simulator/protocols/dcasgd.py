"""Delay-compensated asynchronous SGD (Zheng et al. 2017).

Lock-free threads; when a write begins, the gradient computed at the read copy w_read is
corrected towards the current vector w_now: g + λ·g⊙g⊙(w_now − w_read)
(``simulator.rules.dc_compensate``, λ = ``dcasgd.lam``). The serialized view compares the
applied step with the exact gradient at w_{t−1}, so its δ shows how much of the delay error
the compensation removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.protocols.base import Protocol
from simulator.rules import dc_step

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["DCASGD"]


class DCASGD(Protocol):
    """Lock-free with the delay-compensation term added at write time."""

    name = "dcasgd"
    rule = True

    def step(self, engine: Engine, u: Update, step: np.ndarray,
             local: np.ndarray) -> np.ndarray:
        # lr as the step took it (on a server the schedule's factor is in it already).
        lr, lam = engine.lr * u.lr_scale, self.scenario.dcasgd.lam
        coords = None if u.ops is engine.dense_ops else np.concatenate(
            [np.arange(op[1].start, op[1].stop) if isinstance(op[1], slice) else op[1]
             for op in u.ops])
        w_now = engine.mem.w if coords is None else engine.mem.w[coords]
        w_read = local if coords is None else local[coords]
        return dc_step(step, lr, w_now, w_read, lam)
