"""Training protocols: each module states only how it differs from the shared update loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.protocols.admm import ADMM
from simulator.protocols.base import Protocol
from simulator.protocols.dcasgd import DCASGD
from simulator.protocols.locked import Locked
from simulator.protocols.lockfree import LockFree
from simulator.protocols.minibatch import MiniBatch
from simulator.protocols.paramserver import ParamServer
from simulator.protocols.roundrobin import RoundRobin
from simulator.protocols.sandblaster import Sandblaster
from simulator.protocols.serial import Serial
from simulator.protocols.staged import Amp, BlockADMM, Local
from simulator.protocols.staleness_lr import StalenessLR

if TYPE_CHECKING:
    from simulator.scenario import Scenario

__all__ = ["ADMM", "DCASGD", "PROTOCOLS", "Amp", "BlockADMM", "Local", "LockFree", "Locked",
           "MiniBatch", "ParamServer", "Protocol", "RoundRobin", "Sandblaster", "Serial",
           "StalenessLR", "make_protocol"]

PROTOCOLS: dict[str, type[Protocol]] = {p.name: p for p in (
    Serial, Locked, LockFree, RoundRobin, MiniBatch, ParamServer, StalenessLR, DCASGD,
    ADMM, Sandblaster, Amp, Local, BlockADMM)}


def make_protocol(name: str, scenario: Scenario) -> Protocol:
    """A fresh protocol instance by name (names are validated by the scenario)."""
    return PROTOCOLS[name](scenario)
