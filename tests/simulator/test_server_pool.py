"""The parameter server's pool (``paramserver.servers``): shards spread over servers that each
serve one transfer at a time, checked against timelines worked by hand and a recount of each
server's time from the trace's durations."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import Engine, simulate
from simulator.errors import ScenarioError
from simulator.replay import replay
from tests.conftest import CONSTANT, same_every_way, scenario

# Constant durations on the 4-coordinate quadratic: a pull 2000 ns, a gradient 6000 ns, a
# push 2000 ns, split evenly over the blocks.
SMALL = ("problem.name=quadratic", "problem.dim=4", "problem.n_samples=20", "run.lr=0.05",
         "metrics.curve_points=0", "run.protocol=paramserver", *CONSTANT)


def pool(*overrides: str):
    return scenario(*SMALL, *overrides)


def test_one_server_serves_one_transfer_at_a_time_worked_by_hand():
    """Two threads, one update each. Thread 0 pulls [0, 2000), computes to 8000, pushes
    [8000, 10000); thread 1's pull waits for the server until 2000, [2000, 4000), it computes
    to 10000 and pushes [10000, 12000). Without a pool both pull at once and end at 10000."""
    trace = simulate(pool("run.threads=2", "run.updates=2", "paramserver.servers=1"))
    order = np.argsort(trace["thread"])
    assert trace["read_start"][order].tolist() == [0, 0]
    assert trace["read_end"][order].tolist() == [2000, 4000]
    assert trace["write_end"][order].tolist() == [10000, 12000]
    assert trace["extra_server_busy_ns"].tolist() == [8000]
    assert trace["extra_server_wait_ns"].tolist() == [2000]
    free = simulate(pool("run.threads=2", "run.updates=2"))
    assert free["write_end"].tolist() == [10000, 10000]
    assert "extra_server_busy_ns" not in free.arrays


@pytest.mark.parametrize(("servers", "ends"), [(1, [3000, 4000]), (2, [2000, 3000])])
def test_shards_on_their_own_servers_are_served_in_parallel(servers, ends):
    """Two shards of 1000 ns each. On one server the second thread's first shard goes before
    the first thread's second (first come, first served): pulls end at 3000 and 4000. On two
    servers the threads pipeline through them: 2000 and 3000."""
    trace = simulate(pool("run.threads=2", "run.updates=2", "run.blocks=2",
                          f"paramserver.servers={servers}"))
    order = np.argsort(trace["thread"])
    assert trace["read_end"][order].tolist() == ends


def test_a_message_in_flight_does_not_hold_its_server():
    """Latency 1000 ns: both pulls are in flight [0, 1000); thread 0's is served [1000,
    3000), thread 1's [3000, 5000). (A server held through the latency would end it at
    6000.)"""
    trace = simulate(pool("run.threads=2", "run.updates=2", "paramserver.servers=1",
                          "devices.0.latency=1000"))
    order = np.argsort(trace["thread"])
    assert trace["read_end"][order].tolist() == [3000, 5000]
    assert trace["extra_server_wait_ns"].tolist() == [2000]  # its push found it free


@pytest.mark.parametrize(("servers", "end"), [(0, 3000), (1, 3000), (2, 4000)])
def test_each_servers_message_pays_the_latency(servers, end):
    """One thread, two shards of 1000 ns, latency 1000: one server gets one message
    (1000 in flight, then both shards: 3000, as without a pool); two servers get a message
    each (1000 + 1000, then 1000 + 1000: 4000)."""
    trace = simulate(pool("run.threads=1", "run.updates=1", "run.blocks=2",
                          f"paramserver.servers={servers}", "devices.0.latency=1000"))
    assert trace["read_end"].tolist() == [end]


def test_each_servers_time_is_its_shards_transfers_less_their_latency():
    """Random durations, eight threads, four shards on three servers, a link: each server's
    busy time is the sum, over every pull and push, of its shards' recorded transfer times
    (which carry no latency: each message's is spent in flight); the run is at least as
    long as the busiest server; and with a pool the run takes longer than without one."""
    latency = 700
    base = ("run.threads=8", "run.updates=600", "run.blocks=4", "problem.name=quadratic",
            "problem.dim=40", f"devices.0.latency={latency}", "devices.0.bandwidth=0.05",
            "run.protocol=paramserver", "metrics.curve_points=0")
    trace = simulate(scenario(*base, "paramserver.servers=3"))
    server = np.array([b * 3 // 4 for b in range(4)])
    busy = np.zeros(3, dtype=np.int64)
    offsets = trace["op_offsets"]
    for row in range(len(trace)):
        ops = slice(offsets[row], offsets[row + 1])
        for column in ("op_read_ns", "op_write_ns"):
            np.add.at(busy, server[trace["op_block"][ops]], trace[column][ops])
    assert trace["extra_server_busy_ns"].tolist() == busy.tolist()
    assert trace["write_end"].max() >= busy.max()
    assert (trace["extra_server_wait_ns"] > 0).all()
    free = simulate(scenario(*base))
    assert trace["write_end"].max() > free["write_end"].max()


def test_a_pool_is_deterministic_every_way_and_replays():
    """Bit for bit across runs, without lookahead and replayed; a replay may change the
    pool (what-if: the recorded transfers on more servers), which shortens the run."""
    s = scenario("run.protocol=paramserver", "run.threads=6", "run.updates=300",
                 "run.blocks=3", "paramserver.servers=1", "metrics.curve_points=0")
    trace = same_every_way(s)
    _, _, more = replay(trace, ["paramserver.servers=3"])
    assert more["write_end"].max() < trace["write_end"].max()
    assert per_thread(more) == per_thread(trace)


def per_thread(trace):
    """The samples each thread took, in its order."""
    return trace["sample"][np.lexsort((trace["thread_seq"], trace["thread"]))].tolist()


def test_the_pool_is_refused_where_it_cannot_be_modelled():
    with pytest.raises(ScenarioError, match=r"paramserver\.servers.*run\.blocks"):
        pool("paramserver.servers=2")
    with pytest.raises(ScenarioError, match=r"paramserver\.servers.*lock_free"):
        pool("run.write_mode=load_store", "paramserver.lock_free=true",
             "paramserver.servers=1")
    with pytest.raises(ScenarioError, match=r"paramserver\.servers.*scheduler"):
        Engine(pool("run.threads=2", "run.updates=2", "paramserver.servers=1"),
               choose=lambda runnable: runnable[0])


def test_a_lost_push_flies_for_the_latency_and_reaches_no_server():
    """A dropped push is lost in transit: its message flies for the link's latency (as
    without a pool, where the latency is in its drawn duration) and takes no server's
    time."""
    base = ("run.threads=1", "run.updates=40", "devices.0.latency=1000", "inject.drop=0.5")
    spans = {}
    for servers in (0, 1):
        trace = simulate(pool(*base, f"paramserver.servers={servers}"))
        dropped = trace["dropped"].astype(bool)
        assert dropped.any() and not dropped.all()
        spans[servers] = (trace["write_end"] - trace["write_start"])[dropped].tolist()
        if servers:
            kept = int((~dropped).sum())  # (every update pulls; only kept pushes land)
            assert trace["extra_server_busy_ns"].tolist() == [40 * 2000 + kept * 2000]
    assert spans[0] == spans[1] == [3000] * len(spans[0])


def test_a_thread_that_dies_waiting_for_its_server_is_never_served():
    """Three threads pull at 0 from one server (2000 ns each); thread 2, queued behind the
    other two, dies at 1000: its pull never reaches the server, so the server serves the
    others' transfers only (busy = their recorded durations)."""
    trace = simulate(pool("run.threads=3", "run.updates=6", "paramserver.servers=1",
                          "inject.deaths=[{thread=2, at=1000}]"))
    assert trace["extra_dead_threads"].tolist() == [2]
    assert (trace["thread"] != 2).all()
    busy = int(trace["op_read_ns"].sum() + trace["op_write_ns"].sum())
    assert trace["extra_server_busy_ns"].tolist() == [busy]


def test_a_preempted_transfer_holds_its_server_from_when_it_took_it():
    """One core sliced preemptively every 1500 ns between two threads; their pulls take
    2000 ns on one server. Thread 0 takes the server at 0 and is preempted at 1500 until
    3000, so its pull ends at 3500 and the server was busy that long; thread 1 (whose
    slice it was) waits for the server until 3500. Without a pool, thread 1 pulls in its
    own slice."""
    base = ("run.threads=2", "run.updates=2", "devices.0.cores=1",
            "hardware.time_slices={quantum=1500, preempt=true}")
    trace = simulate(pool(*base, "paramserver.servers=1"))
    order = np.argsort(trace["thread"])
    assert trace["read_end"][order].tolist()[0] == 3500
    assert trace["read_end"][order].tolist()[1] > 3500
    assert trace["extra_server_busy_ns"][0] > int(trace["op_read_ns"].sum()
                                                  + trace["op_write_ns"].sum())


def test_a_replay_may_change_the_servers_not_whether_there_is_a_pool_over_a_link():
    """With a latency the drawn durations carry it without a pool and leave it out with
    one: a replay onto more servers is fine, one that adds or removes the pool is
    refused."""
    link = ("run.threads=2", "run.updates=20", "run.blocks=2", "devices.0.latency=1000")
    without, one = simulate(pool(*link)), simulate(pool(*link, "paramserver.servers=1"))
    _, _, two = replay(one, ["paramserver.servers=2"])
    assert len(two) == 20
    for trace, servers in ((without, 1), (one, 0)):
        with pytest.raises(ScenarioError, match=r"paramserver\.servers.*latency"):
            replay(trace, [f"paramserver.servers={servers}"])
    _, _, free = replay(simulate(pool("run.threads=2", "run.updates=20")),
                        ["paramserver.servers=1"])  # (no latency: nothing to carry)
    assert len(free) == 20
