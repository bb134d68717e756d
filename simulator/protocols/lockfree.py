"""Lock-free asynchronous SGD (AsynGrad, Sun 2016; Hogwild!, Niu et al. 2011).

Threads read, compute and write the shared vector with no coordination at all, which is the
engine's loop with every plug-in point left at its default.
"""

from simulator.protocols.base import Protocol

__all__ = ["LockFree"]


class LockFree(Protocol):
    """k threads, no locks: reads may be torn and load_store writes may be lost."""

    name = "lockfree"
