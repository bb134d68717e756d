"""Staleness-aware asynchronous SGD (Zhang, Gupta, Lian & Liu 2016).

Lock-free threads, but each update's learning rate is divided by its staleness τ (the
completions since its read began, counted when its write begins; τ = 0 keeps the rate). The
factor is recorded per update (``lr_scale``), and the serialized view divides it out, so δ
still measures only what concurrency did to the gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.protocols.base import Protocol
from simulator.rules import staleness_scale

if TYPE_CHECKING:
    from simulator.engine import Engine
    from simulator.update import Update

__all__ = ["StalenessLR"]


class StalenessLR(Protocol):
    """Lock-free, learning rate lr/τ."""

    name = "staleness_lr"
    rule = True

    def step(self, engine: Engine, u: Update, step: np.ndarray,
             local: np.ndarray) -> np.ndarray:
        scale = staleness_scale(engine.completed - u.start_completed + u.delay)
        u.lr_scale *= scale  # (on a server, after the schedule's factor)
        if scale != 1.0:
            step *= scale
        return step
