"""Training protocols: each module states only how it differs from the shared update loop."""

from simulator.protocols.base import Protocol
from simulator.protocols.locked import Locked
from simulator.protocols.lockfree import LockFree
from simulator.protocols.serial import Serial

__all__ = ["PROTOCOLS", "LockFree", "Locked", "Protocol", "Serial", "make_protocol"]

PROTOCOLS: dict[str, type[Protocol]] = {p.name: p for p in (Serial, Locked, LockFree)}


def make_protocol(name: str) -> Protocol:
    """A fresh protocol instance by name (names are validated by the scenario)."""
    return PROTOCOLS[name]()
