"""asyngrad-lab real backend: lock-free training with real processes and shared memory."""

from realrun.runner import MODES, RealRun, run_real

__all__ = ["MODES", "RealRun", "run_real"]
