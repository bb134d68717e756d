"""What every test of a pool of parameter servers starts from: a tiny dense problem, its
vector cut into a shard per server."""

from simulator.scenario import Scenario
from tests.conftest import scenario

TINY = ("problem.dim=20", "problem.n_samples=200", "run.lr=0.05")


def pooled(servers: int, *extra: str) -> Scenario:
    """The paramserver scenario on ``servers`` servers, one shard (block) each."""
    return scenario(*TINY, "run.protocol=paramserver", f"run.blocks={servers}",
                    f"paramserver.servers={servers}", *extra)
