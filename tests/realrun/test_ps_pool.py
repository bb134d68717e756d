"""A pool of parameter servers (``paramserver.servers`` > 1) on torch.distributed (gloo)
over loopback: real server and trainer processes, checked against the simulator's pool."""

import os
import signal

import numpy as np
import pytest

from realrun.ps import run_ps
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.replay import replay
from tests.conftest import scenario
from tests.realrun.pooled import TINY, pooled

pytestmark = pytest.mark.alone  # real processes: see conftest


@pytest.mark.parametrize("servers", [2, 3])
def test_one_trainer_on_a_pool_is_the_simulators_pool_to_the_bit(servers):
    """One trainer, float64: the samples, the arithmetic and the loss curve of the
    simulator's pool with one thread (serial SGD, shard by shard)."""
    s = pooled(servers, "run.updates=200")
    run = run_ps(s, 1, "float64", timeout=60)
    simulated = simulate(scenario(*TINY, "run.protocol=paramserver", "run.updates=200",
                                  f"run.blocks={servers}", f"paramserver.servers={servers}",
                                  "run.threads=1"))
    assert run.failure is None and len(run.trace) == 200
    for column in ("sample", "step", "thread_seq", "staleness", "w_final", "curve_t",
                   "curve_loss"):
        assert np.array_equal(run.trace[column], simulated[column]), column
    assert run.trace["op_block"].tolist() == list(range(servers)) * 200
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0


def test_three_trainers_on_two_servers_rebuild_the_servers_vector_exactly():
    """Three trainers, two servers, measure mode: the serialized view rebuilt from every
    server's parts in their order of application ends at the servers' own vector, to the
    bit (each server's parts keep their order when stamps are raised); every
    push completes at its last shard's application, so the trace's steps are 1..T and each
    row's staleness counts the pushes that completed between its read's start and its own
    completion (recounted here from the times); it converges. (A push with staleness 0 can
    still carry a gradient error here: another push's part applied to one shard between
    two completions is in the serialized view's step.)"""
    s = pooled(2, "run.updates=900")
    run = run_ps(s, 3, "float64", timeout=60, measure=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 900
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    assert sorted(trace["step"].tolist()) == list(range(1, 901))
    assert set(trace["thread"].tolist()) == {0, 1, 2}
    for a, b in (("read_start", "read_end"), ("read_end", "grad_end"),
                 ("grad_end", "write_end")):
        assert np.all(trace[a] <= trace[b])
    seen = np.searchsorted(np.sort(trace["write_end"]), trace["read_start"], side="right")
    assert np.array_equal(trace["staleness"], trace["step"] - 1 - seen)
    assert trace["staleness"].max() > 0 and trace["measured"].all()
    f_star = run.problem.optimum()[1]
    assert trace["curve_loss"][-1] - f_star < 0.3 * (trace["curve_loss"][0] - f_star)
    # Replayed without a pool (its durations hold the real waits), every event comes back
    # at its recorded time.
    _, _, again = replay(trace, ["paramserver.servers=0"])
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (trace, again))
    for column in ("write_end", "read_end", "staleness", "step"):
        assert np.array_equal(trace[column][a], again[column][b]), column


def test_a_pool_converges_as_its_simulation_does():
    """Three trainers on two servers, 1,500 pushes of the logistic problem: the final
    suboptimality within 2× of the simulated pool's at three threads (the simulation's
    durations are the default ones, not this machine's: the bound is the fidelity
    target's, not a calibrated prediction)."""
    base = ("problem.name=logistic", "problem.dim=50", "run.updates=1500",
            "run.protocol=paramserver", "run.blocks=2", "paramserver.servers=2")
    run = run_ps(scenario(*base), 3, "float64", timeout=60)
    simulated = simulate(scenario(*base, "run.threads=3"))
    f_star = run.problem.optimum()[1]
    real, sim = (t["curve_loss"][-1] - f_star for t in (run.trace, simulated))
    assert run.failure is None and 0.5 < real / sim < 2.0
    assert run.trace["curve_loss"][-1] < run.trace["curve_loss"][0]


def test_a_dead_trainer_leaves_a_pool_running():
    """A death at 40 ms (the coordinating server's clock): the dead trainer's pulls after it
    are answered with no gradients, it tells every server it is done, and the other makes
    the rest of the budget."""
    s = pooled(2, "problem.dim=100", "run.updates=3000",
               "inject.deaths=[{thread=1, at=40000000}]")
    run = run_ps(s, 2, "float64", timeout=60)
    assert run.failure is None and len(run.trace) == 3000
    trace = run.trace
    assert trace["extra_dead_threads"].tolist() == [1]
    mine = trace["thread"] == 1
    assert 0 < mine.sum() < 3000
    assert trace["read_start"][mine].max() < 40_000_000
    assert trace["read_start"][~mine].max() > 40_000_000


def test_shard_servers_wait_out_a_trainers_pauses():
    """Two pauses of 1.5 s back to back, each shorter than the 2 s receive timeout: the
    coordinating server hears the trainer's pull between them, the shard server nothing for
    3 s; it waits out the pauses besides its timeout, and the run completes."""
    s = pooled(2, "run.updates=100", "inject.pauses=[{thread=0, start=1000000, "
               "end=1500000000}, {thread=0, start=1500000000, end=3000000000}]")
    run = run_ps(s, 1, "float64", timeout=2)
    assert run.failure is None and len(run.trace) == 100
    assert run.trace["read_start"][1] >= 3_000_000_000  # (its first pull came before)


def test_a_dead_shard_server_stops_the_run_and_keeps_what_every_server_applied():
    """Kill shard server 1 after 50 pushes: its trainers leave, and when the coordinating
    server's receive times out (5 s) the run stops naming the server; the partial trace
    holds the pushes both servers applied (from the records in shared memory)."""
    pids, pushes = [], []

    def kill_the_server_after_50_pushes(n):
        pushes.append(n)
        if len(pushes) == 50:
            os.kill(pids[-1], signal.SIGKILL)  # (trainers first, then the shard servers)

    run = run_ps(pooled(2, "run.updates=200000"), 2, timeout=5, on_start=pids.extend,
                 progress=kill_the_server_after_50_pushes)
    assert run.failure == {"worker": None, "reason": "server 1 died (exit code -9)"}
    assert 40 <= len(run.trace) < 200000
    assert sorted(run.trace["step"].tolist()) == list(range(1, len(run.trace) + 1))


def test_a_pool_refuses_another_number_of_shards_than_servers():
    """A shard per server (every server option runs: the schedule and the injections,
    tests/realrun/test_ps_pool_inject.py; the staleness limit and the rules,
    tests/realrun/test_ps_pool_rules.py; a warm start and rebalancing,
    tests/realrun/test_ps_pool_options.py; accumulation,
    tests/realrun/test_ps_pool_accumulate.py; rounds, tests/realrun/test_ps_pool_rounds.py;
    a lock-free server the simulator's pool refuses itself)."""
    s = scenario(*TINY, "run.protocol=paramserver", "run.blocks=3", "paramserver.servers=2")
    with pytest.raises(ScenarioError, match=r"run\.blocks"):
        run_ps(s, 1, "float64", timeout=60)


def test_cli_servers_runs_a_pool(tmp_path, capsys):
    out = tmp_path / "pool"
    assert main(["real", "--backend", "ps", "--workers", "2", "--servers", "2", "--set",
                 "problem.dim=20", "--set", "run.updates=200", "--quiet", "--out",
                 str(out)]) == 0
    text = (out / "scenario.toml").read_text()
    assert "servers = 2" in text and "blocks = 2" in text
