"""Each protocol's defining behaviour on small constant-duration cases worked out by hand.

Constant durations (B = 1): read 2000 ns, gradient 6000 ns, write 2000 ns. Where a protocol
defines an iteration in closed form (delayed SGD, synchronous minibatch, accumulation), the
trace is compared bit for bit with that iteration computed directly in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import Engine, simulate
from simulator.errors import ScenarioError
from simulator.metrics import error_mask, summarize
from simulator.problems import make_problem
from simulator.rules import dc_compensate, dc_correction, mean_step, staleness_scale
from simulator.scenario import with_overrides
from tests.conftest import CONSTANT, scenario

SMALL = ("problem.name=quadratic", "problem.dim=4", "problem.n_samples=20", "run.lr=0.05",
         "metrics.curve_points=0", *CONSTANT)


def small(*overrides: str):
    s = scenario(*SMALL, *overrides)
    return s, make_problem(s.problem)


def averaged_sgd(problem, trace, lr):
    """w_T of the iteration w_t = w_{t−1} − mean over step t's samples of lr·∇f(w_{t−1})."""
    w = problem.initial()
    for step in range(1, int(trace["step"].max()) + 1):
        steps = []
        for sample in trace["sample"][trace["step"] == step].tolist():
            g = problem.grad(w.copy(), sample)[0]
            g *= lr
            steps.append(g)
        w = w - mean_step(steps)
    return w


def test_roundrobin_turns_and_staleness_worked_by_hand():
    """k=3, T=9: the turn covers a write and the writer's next read, so writes end every
    4000 ns once the pipeline fills; threads leave the rotation as they finish."""
    s, problem = small("run.protocol=roundrobin", "run.threads=3", "run.updates=9")
    trace = simulate(s, problem)
    assert trace["write_end"].tolist() == [10000, 14000, 18000, 22000, 26000, 30000, 34000,
                                           36000, 40000]
    assert trace["thread"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert trace["staleness"].tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 2]


def test_roundrobin_is_delayed_sgd_with_delay_k_minus_1():
    """Update t applies ∇f_{z_t}(w_{t−k}) (w_0 for the first k): Langford et al.'s delayed
    SGD with τ = k−1, bit for bit."""
    k = 4
    s, problem = small("run.protocol=roundrobin", f"run.threads={k}", "run.updates=40",
                       "timing.grad={dist='exponential', mean=6000}")
    trace = simulate(s, problem)
    assert (trace["staleness"][k:] == k - 1).all()
    ws = [problem.initial()]
    for t, sample in enumerate(trace["sample"].tolist(), start=1):
        step = problem.grad(ws[max(t - k, 0)].copy(), sample)[0]
        step *= s.run.lr
        ws.append(ws[-1] - step)
    assert np.array_equal(ws[-1], trace["w_final"])


def test_minibatch_rounds_average_and_wait_for_the_slowest():
    """k=3: every round reads the same vector, the last arrival writes the mean; with
    thread 1 three times slower each round lasts as long as thread 1."""
    s, problem = small("run.protocol=minibatch", "run.threads=3", "run.updates=9")
    trace = simulate(s, problem)
    assert trace["step"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert trace["write_end"].tolist() == [10000] * 3 + [20000] * 3 + [30000] * 3
    assert (trace["staleness"] == 0).all() and not error_mask(trace).any()
    assert trace["measured"].sum() == 3  # one measurement per applied step
    assert np.array_equal(averaged_sgd(problem, trace, s.run.lr), trace["w_final"])

    slow, _ = small("run.protocol=minibatch", "run.threads=3", "run.updates=9",
                    "inject.stragglers=[{thread=1, factor=3}]")
    trace = simulate(slow, problem)
    # thread 1: read 6000 + gradient 18000 = 24000, then it writes (6000): 30000 per round.
    assert sorted(set(trace["write_end"].tolist())) == [30000, 60000, 90000]
    writers = trace["thread"][trace["measured"]]
    assert writers.tolist() == [1, 1, 1]
    fast = trace["thread"] != 1
    assert (trace["write_start"][fast] - trace["grad_end"][fast] == 22000).all()  # idle


def test_minibatch_with_one_thread_and_paramserver_without_latency_are_serial_sgd():
    s, problem = small("run.updates=50", "timing.grad={dist='exponential', mean=6000}",
                       "run.protocol=serial")
    serial = simulate(s, problem)
    for protocol in ("minibatch", "paramserver"):
        other, _ = small("run.updates=50", "timing.grad={dist='exponential', mean=6000}",
                         f"run.protocol={protocol}", "run.threads=1")
        trace = simulate(other, problem)
        assert np.array_equal(trace["w_final"], serial["w_final"]), protocol
        assert np.array_equal(trace["write_end"], serial["write_end"]), protocol
        assert np.array_equal(trace["s_norm"], serial["s_norm"]), protocol


def test_minibatch_partial_last_round_and_dead_worker_stall():
    s, problem = small("run.protocol=minibatch", "run.threads=4", "run.updates=10")
    trace = simulate(s, problem)
    assert trace["step"].tolist() == [1] * 4 + [2] * 4 + [3] * 2
    dead, _ = small("run.protocol=minibatch", "run.threads=4", "run.updates=40",
                    "inject.deaths=[{thread=2, at=15000}]")
    trace = simulate(dead, problem)
    # Round 1 completes at 10000; thread 2 dies during round 2, which never completes.
    assert len(trace) == 4 and trace["extra_dead_threads"].tolist() == [2]


def test_paramserver_link_latency_and_bandwidth():
    """Pull and push each pay latency once and 8 bytes per coordinate over the bandwidth."""
    s, problem = small("run.protocol=paramserver", "run.threads=1", "run.updates=3",
                       "devices.0.latency=500", "devices.0.bandwidth=0.016")
    trace = simulate(s, problem)
    link = 500 + 4 * 8 / 0.016  # 500 ns + 2000 ns
    per_update = 2000 + link + 6000 + 2000 + link
    assert trace["write_end"].tolist() == [per_update * i for i in (1, 2, 3)]


def test_paramserver_staleness_limit_discards_pushes_stale_on_arrival():
    """The server decides when a push reaches it, as the real server does: with one shard,
    when it would be applied, so every applied push has staleness <= S and every discarded
    one more. A discarded push's write time passes and nothing of it is stored."""
    s, problem = small("run.protocol=paramserver", "run.threads=6", "run.updates=120",
                       "timing.grad={dist='exponential', mean=6000}",
                       "paramserver.staleness_limit=2")
    trace = simulate(s, problem)
    applied = trace["step"] > 0
    assert 0 < (~applied).sum() < applied.sum()
    assert (trace["staleness"][applied] <= 2).all()
    assert (trace["staleness"][~applied] > 2).all()
    assert trace["step"][applied].tolist() == list(range(1, applied.sum() + 1))
    assert not trace["measured"][~applied].any()
    assert ((trace["write_end"] - trace["write_start"]) == 2000).all()  # every push was sent
    # Nothing a discarded push sent was stored: w_T is w0 less the applied steps alone, each
    # lr·∇f at the vector its pull copied (w after the completions before its read's end).
    rows = np.flatnonzero(applied)[np.argsort(trace["step"][applied])]
    ends = trace["write_end"][rows]
    states = [problem.initial()]
    for row in rows:
        read = states[np.searchsorted(ends, trace["read_end"][row], side="right")]
        states.append(states[-1] - s.run.lr * problem.grad(read.copy(), trace["sample"][row])[0])
    assert np.allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["staleness_lr", "dcasgd"])
def test_paramserver_rule_applies_to_each_push_as_it_arrives(rule):
    """``paramserver.rule``: the server applies the rule to each push it keeps when it
    arrives, with its exact staleness τ. Checked against an independent replay of the
    applied pushes in order (one shard: a push arrives when it is applied): each is
    lr·∇f at the vector its pull copied (w after the completions before its read's end),
    then scaled by 1/τ (``staleness_lr``, the factor recorded as ``lr_scale``) or
    compensated towards the vector it is applied to (``dcasgd``)."""
    from simulator.rules import dc_step

    s, problem = small("run.protocol=paramserver", "run.threads=5", "run.updates=150",
                       "timing.grad={dist='exponential', mean=6000}", "devices.0.latency=700",
                       "paramserver.staleness_limit=4", f"paramserver.rule={rule}",
                       "dcasgd.lam=2.0")
    trace = simulate(s, problem)
    applied = trace["step"] > 0
    assert (~applied).sum() > 0 and trace["staleness"][applied].max() > 1
    rows = np.flatnonzero(applied)[np.argsort(trace["step"][applied])]
    ends = trace["write_end"][rows]
    states = [problem.initial()]
    for row in rows:
        read = states[np.searchsorted(ends, trace["read_end"][row], side="right")]
        step = s.run.lr * problem.dense_grad(read.copy(), int(trace["sample"][row]))
        if rule == "staleness_lr":
            scale = staleness_scale(int(trace["staleness"][row]))
            assert trace["lr_scale"][row] == scale
            step = step * scale
        else:
            step = dc_step(step, s.run.lr, states[-1], read, s.dcasgd.lam)
        states.append(states[-1] - step)
    assert np.allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)
    assert (trace["lr_scale"][~applied] == 1).all()
    plain = simulate(with_overrides(s, ["paramserver.rule=none"]), problem)
    assert not np.array_equal(plain["w_final"], trace["w_final"])
    if rule == "dcasgd":  # λ = 0 compensates nothing
        unchanged = simulate(with_overrides(s, ["dcasgd.lam=0"]), problem)
        assert np.array_equal(unchanged["w_final"], plain["w_final"])


@pytest.mark.parametrize("rule", ["none", "staleness_lr", "dcasgd"])
def test_the_server_applies_the_schedule_on_arrival_and_its_rule_takes_it_once(rule):
    """With a learning-rate schedule the server scales each push by the factor f at m = the
    completions when the push arrives (the end of its first shard's write) + 1, as a real
    server knows them; its rule then keeps f once (``staleness_lr``: lr_scale = f/τ;
    ``dcasgd``: the compensation at the rate f·lr the push took, f·lr·(g + λ·g⊙g⊙Δ)). The
    same replay as above, with f = 1/(c + 1) (``inverse``), over a link whose latency puts
    the arrival (here, with one shard, the push's completion) well after its write's start."""
    from simulator.rules import dc_step

    s, problem = small("run.protocol=paramserver", "run.threads=4", "run.updates=100",
                       "timing.grad={dist='exponential', mean=6000}",
                       "devices.0.latency=2000", f"paramserver.rule={rule}",
                       "dcasgd.lam=2.0", "run.lr_schedule=inverse")
    trace = simulate(s, problem)
    rows = np.argsort(trace["step"])
    ends = trace["write_end"][rows]
    offsets, write_ns = trace["op_offsets"], trace["op_write_ns"]
    states = [problem.initial()]
    for row in rows:
        read = states[np.searchsorted(ends, trace["read_end"][row], side="right")]
        g = problem.dense_grad(read.copy(), int(trace["sample"][row]))
        arrived = trace["write_start"][row] + write_ns[offsets[row]]
        f = 1.0 / (np.searchsorted(ends, arrived, side="left") + 1)
        lr = s.run.lr
        if rule == "staleness_lr":
            tau = max(1, int(trace["staleness"][row]))
            assert trace["lr_scale"][row] == pytest.approx(f / tau, rel=1e-12)
            step = f * lr * g / tau
        elif rule == "dcasgd":
            assert trace["lr_scale"][row] == pytest.approx(f, rel=1e-12)
            step = dc_step(f * lr * g, f * lr, states[-1], read, s.dcasgd.lam)
        else:
            assert trace["lr_scale"][row] == pytest.approx(f, rel=1e-12)
            step = f * lr * g
        states.append(states[-1] - step)
    assert np.allclose(trace["w_final"], states[-1], rtol=0, atol=1e-12)
    # Some push saw a completion land during its transfer (the factor differs from the one
    # at its write's start).
    starts = np.searchsorted(ends, trace["write_start"][rows], side="right")
    firsts = np.searchsorted(ends, trace["write_start"][rows] + write_ns[offsets[rows]],
                             side="left")
    assert (firsts > starts).any()


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_lock_free_server_with_a_free_link_is_the_lock_free_protocol(blocks):
    """``paramserver.lock_free``: with no link time a shard is loaded as its write begins,
    so the server's run is the ``lockfree`` protocol's, every trace array equal, lost
    updates included; the default server adds each shard atomically and loses none."""
    options = ("run.threads=4", "run.updates=600", f"run.blocks={blocks}")
    server = simulate(scenario(*options, "run.protocol=paramserver",
                               "paramserver.lock_free=true"))
    lockfree = simulate(scenario(*options, "run.protocol=lockfree"))
    for name in lockfree.arrays:
        if name in server.arrays:
            assert np.array_equal(server[name], lockfree[name]), name
    assert server["overwrote"].sum() > 0
    atomic = simulate(scenario(*options, "run.protocol=paramserver"))
    assert atomic["overwrote"].sum() == 0 and atomic["lost_blocks"].sum() == 0


def test_a_lock_free_server_loads_a_shard_once_it_has_arrived():
    """Over a link (latency on a push's first shard, bytes over the bandwidth on each) a
    shard's update loads it the shard's link time after its write began and stores at the
    write's end: each update overwrote exactly the other updates' stores of its shards that
    landed in between, recounted from the rows' times with the link costs worked out here."""
    latency, bandwidth, dim, blocks = 3000, 0.02, 10, 2
    s = scenario("run.protocol=paramserver", "paramserver.lock_free=true", "run.threads=5",
                 "run.updates=800", f"run.blocks={blocks}", f"problem.dim={dim}",
                 "timing.grad={dist='exponential', mean=4000}",
                 "timing.write={dist='exponential', mean=1500}",
                 f"devices.0.latency={latency}", f"devices.0.bandwidth={bandwidth}")
    trace = simulate(s)
    per_block = [round(dim / blocks * 8 / bandwidth)] * blocks
    link = [per_block[0] + latency, *per_block[1:]]
    offsets, write_ns = trace["op_offsets"], trace["op_write_ns"]
    loads, stores = [], []  # per row: per block, when its update loaded and stored it
    for row in range(len(trace)):
        ns = write_ns[offsets[row]:offsets[row + 1]]
        ends = trace["write_start"][row] + np.cumsum(ns)
        loads.append(ends - ns + np.minimum(link, ns))
        stores.append(ends)
    loads, stores = np.array(loads), np.array(stores)
    ties = 0
    for row in range(len(trace)):
        # (a store at the very ns of the load may land on either side of it)
        inside = [(stores[:, b] > loads[row, b]) & (stores[:, b] < stores[row, b])
                  for b in range(blocks)]
        at = [stores[:, b] == loads[row, b] for b in range(blocks)]
        landed = sum(int(m.sum()) for m in inside)
        tied = sum(int(m.sum()) for m in at)
        assert landed <= trace["overwrote"][row] <= landed + tied, row
        ties += tied > 0
    assert trace["overwrote"].sum() > 0 and ties < len(trace) / 50
    # The load after the link: counting from the write's start would find more.
    early = sum(int(((stores[:, b] > stores[row, b] - write_ns[offsets[row] + b])
                     & (stores[:, b] < stores[row, b])).sum())
                for row in range(len(trace)) for b in range(blocks))
    assert early > trace["overwrote"].sum()


def test_a_paused_lock_free_server_thread_loads_its_shard_after_the_pause():
    """A thread whose pause begins while its push is on the link loads the shard when the
    pause ends (it starts no action in it), so it loses only the stores that land between
    the pause's end and its own store; a bus held through the link and the memory time
    keeps the recorded write the drawn one."""
    base = ("run.protocol=paramserver", "paramserver.lock_free=true", "run.threads=4",
            "run.updates=400", "devices.0.latency=10000",
            "timing.grad={dist='exponential', mean=4000}")
    free = simulate(scenario(*base))
    rows = np.flatnonzero(free["thread"] == 1)
    start = int(free["write_start"][rows[len(rows) // 2]]) + 5000  # in its push's 10 µs link
    end = start + 55000
    trace = simulate(scenario(*base, f"inject.pauses=[{{thread=1, start={start}, end={end}}}]"))
    row = np.flatnonzero((trace["thread"] == 1) & (trace["write_start"] < start)
                         & (trace["write_end"] > start))
    assert len(row) == 1 and trace["write_end"][row[0]] > end
    landed = (trace["write_end"] > end) & (trace["write_end"] < trace["write_end"][row[0]])
    assert trace["overwrote"][row[0]] == landed.sum()
    early = ((trace["write_end"] > trace["write_start"][row[0]] + 10000)
             & (trace["write_end"] < trace["write_end"][row[0]]))
    assert early.sum() > landed.sum()  # (a load at the link's end would lose these)
    bus = simulate(scenario(*base[:-1], "devices.0.bus=1", "run.updates=600"))
    assert np.array_equal(bus["write_end"] - bus["write_start"],
                          bus["op_write_ns"][bus["op_offsets"][:-1]])


def test_a_lock_free_server_reports_its_write_mode_and_refuses_meeting_writes():
    s = scenario("run.protocol=paramserver", "paramserver.lock_free=true", "run.threads=3",
                 "run.updates=200")
    assert summarize(simulate(s), make_problem(s.problem), s)["write_mode"] == "load_store"
    atomic = scenario("run.protocol=paramserver", "run.threads=3", "run.updates=200")
    assert summarize(simulate(atomic), make_problem(atomic.problem),
                     atomic)["write_mode"] == "atomic_add"
    for table in ("hardware.convoys={}", "hardware.passing={}"):
        with pytest.raises(ScenarioError, match=r"paramserver\.lock_free"):
            simulate(scenario("run.protocol=paramserver", "paramserver.lock_free=true",
                              "run.threads=3", "run.updates=20", table))


def test_a_lock_free_server_is_refused_with_atomic_adds_or_grains():
    with pytest.raises(ScenarioError, match=r"^paramserver\.lock_free = True: .*atomic_add"):
        scenario("run.protocol=paramserver", "paramserver.lock_free=true",
                 "run.write_mode=atomic_add")
    with pytest.raises(ScenarioError, match=r"^paramserver\.lock_free = True: .*store_grain"):
        scenario("run.protocol=paramserver", "paramserver.lock_free=true",
                 "run.store_grain=2")


def test_paramserver_rule_is_refused_with_rounds():
    with pytest.raises(ScenarioError, match=r"paramserver\.rule"):
        scenario("run.protocol=paramserver", "paramserver.fraction=0.5",
                 "paramserver.rule=staleness_lr")


@pytest.mark.parametrize("lock_free", ["false", "true"])
def test_paramserver_staleness_limit_decides_at_the_first_shard(lock_free):
    """With three shards the server sees a push when its first shard arrives: a push is
    discarded exactly when more than S completions landed between its read's start and its
    first shard's end (recounted from the rows' times), and a discarded push's write takes
    its time; on a lock-free server too (the limit wrapping its delayed loads), where a
    discarded push overwrites nothing."""
    s, problem = small("run.protocol=paramserver", "run.threads=5", "run.updates=150",
                       "run.blocks=3", "timing.grad={dist='exponential', mean=5000}",
                       "timing.write={dist='exponential', mean=900}",
                       "paramserver.staleness_limit=1", "devices.0.latency=300",
                       f"paramserver.lock_free={lock_free}")
    trace = simulate(s, problem)
    assert (trace["overwrote"][trace["step"] == 0] == 0).all()
    assert (trace["overwrote"].sum() > 0) == (lock_free == "true")
    applied = trace["step"] > 0
    assert 0 < (~applied).sum() < applied.sum()
    ends = np.sort(trace["write_end"][applied])
    offsets, write_ns = trace["op_offsets"], trace["op_write_ns"]
    for row in range(len(trace)):
        first = trace["write_start"][row] + write_ns[offsets[row]]
        seen = np.searchsorted(ends, trace["read_start"][row], side="right")
        arrived = np.searchsorted(ends, first, side="left")
        assert applied[row] == (arrived - seen <= 1), row
        assert trace["write_end"][row] - trace["write_start"][row] == \
            write_ns[offsets[row]:offsets[row + 1]].sum()


def test_paramserver_accumulation_pushes_the_mean_of_n_gradients_at_one_pull():
    s, problem = small("run.protocol=paramserver", "run.threads=1", "run.updates=9",
                       "paramserver.accumulate=3")
    trace = simulate(s, problem)
    assert trace["step"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    reads = trace["read_end"] - trace["read_start"]
    assert reads.tolist() == [2000, 0, 0] * 3  # one pull per push
    assert np.array_equal(averaged_sgd(problem, trace, s.run.lr), trace["w_final"])
    leftover, _ = small("run.protocol=paramserver", "run.threads=1", "run.updates=8",
                        "paramserver.accumulate=3")
    trace = simulate(leftover, problem)
    assert trace["step"].tolist() == [1, 1, 1, 2, 2, 2, 0, 0]  # never pushed


def test_paramserver_warm_start_backup_workers_and_rebalance():
    s, problem = small("run.protocol=paramserver", "run.threads=4", "run.updates=40",
                       "paramserver.warm_start=5")
    trace = simulate(s, problem)
    assert (trace["thread"][:5] == 0).all()
    others = trace["thread"] != 0
    assert trace["read_start"][others].min() >= trace["write_end"][4]

    backup, _ = small("run.protocol=paramserver", "run.threads=4", "run.updates=60",
                      "paramserver.fraction=0.75", "inject.stragglers=[{thread=3, factor=10}]")
    trace = simulate(backup, problem)
    applied = trace["step"] > 0
    sizes = np.bincount(trace["step"][applied])[1:]
    assert (sizes == 3).all()  # each round: the first 3 of 4
    assert (trace["step"][trace["thread"] == 3] == 0).all()  # the straggler is always late
    assert not error_mask(trace).any()

    retire, _ = small("run.protocol=paramserver", "run.threads=4", "run.updates=200",
                      "paramserver.rebalance=2", "paramserver.rebalance_after=3",
                      "inject.stragglers=[{thread=2, factor=5}]")
    trace = simulate(retire, problem)
    assert trace["extra_retired_threads"].tolist() == [2]
    assert (trace["thread"] == 2).sum() <= 4
    assert len(trace) == 200


def test_rebalancing_retires_a_second_slow_worker_after_the_first():
    """Threads 1 and 2 slowed 5× and 30×: thread 2 is retired first, and thread 1, still
    5× slower than thread 0 (above 1.2× the median of the two), after it; thread 0 makes
    the rest. Before, the first retirement counted twice against the working workers and
    thread 1 was never retired."""
    t = simulate(scenario("run.protocol=paramserver", "run.threads=3", "run.updates=300",
                          "paramserver.rebalance=1.2", "paramserver.rebalance_after=3",
                          "inject.stragglers=[{thread=1, factor=5}, {thread=2, factor=30}]"))
    assert t["extra_retired_threads"].tolist() == [2, 1]
    last = max(t["read_start"][t["thread"] == thread].max() for thread in (1, 2))
    assert len(t) == 300 and set(t["thread"][t["read_start"] > last].tolist()) == {0}
    assert (t["thread"] == 1).sum() < 30


def test_staleness_lr_divides_the_rate_by_the_staleness():
    """Serial with an injected delay of 3: every update after the third has staleness 3 and
    applies lr/3 times the gradient at w_{t−4}."""
    s, problem = small("run.protocol=staleness_lr", "run.threads=1", "run.updates=30",
                       "inject.delay=3")
    trace = simulate(s, problem)
    assert trace["lr_scale"].tolist() == [staleness_scale(int(v)) for v in trace["staleness"]]
    assert trace["lr_scale"][3:].tolist() == [1 / 3] * 27
    ws, norms = [problem.initial()], []
    for t, sample in enumerate(trace["sample"].tolist(), start=1):
        step = problem.grad(ws[max(t - 4, 0)].copy(), sample)[0]
        norms.append(np.linalg.norm(step))
        step *= s.run.lr
        step *= staleness_scale(min(t - 1, 3))
        ws.append(ws[-1] - step)
    assert np.array_equal(ws[-1], trace["w_final"])
    # The view divides the factor out: s_t is the (stale) gradient itself.
    assert np.allclose(trace["s_norm"], norms, rtol=1e-12)


def test_dcasgd_adds_the_compensation_term_at_write_time():
    g = np.array([1.0, -2.0, 0.5])
    w_now, w_read = np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.4, 0.3])
    assert np.allclose(dc_compensate(g, w_now, w_read, 0.5),
                       [1.0 + 0.5 * 1 * 0.1, -2.0 + 0.5 * 4 * -0.2, 0.5])
    s, problem = small("run.protocol=dcasgd", "run.threads=1", "run.updates=30",
                       "inject.delay=2", "dcasgd.lam=0.3")
    trace = simulate(s, problem)
    ws = [problem.initial()]
    lr = s.run.lr
    for t, sample in enumerate(trace["sample"].tolist(), start=1):
        read = ws[max(t - 3, 0)]
        step = problem.grad(read.copy(), sample)[0]
        step *= lr
        step = step + lr * dc_correction(step / lr, ws[-1], read, 0.3)
        ws.append(ws[-1] - step)
    assert np.array_equal(ws[-1], trace["w_final"])
    serial, _ = small("run.updates=30", "run.protocol=serial")
    one, _ = small("run.protocol=dcasgd", "run.threads=1", "run.updates=30")
    assert np.array_equal(simulate(one, problem)["w_final"],
                          simulate(serial, problem)["w_final"])


@pytest.mark.parametrize("protocol", ["roundrobin", "minibatch", "paramserver",
                                      "staleness_lr", "dcasgd", "admm"])
def test_protocols_are_deterministic_and_telescoping(protocol, tmp_path):
    s = scenario("run.updates=300", "run.threads=5", "problem.dim=20", "run.blocks=3",
                 f"run.protocol={protocol}", "paramserver.staleness_limit=6",
                 "devices.0.latency=300", "devices.0.bandwidth=1.0")
    a, b = simulate(s), simulate(s)
    a.save(tmp_path / "a.npz")
    b.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    engine = Engine(s)
    trace = engine.run()
    lr = s.run.lr
    steps = trace["step"]
    measured = trace["measured"]
    if protocol == "admm":
        return
    # Σ over completions of lr·factor·s_t telescopes to w_0 − w_T (factor 1 but staleness_lr).
    assert measured.sum() == steps.max()
    total = (lr * trace["lr_scale"][measured] * trace["s_norm"][measured]).sum()
    assert total >= np.linalg.norm(trace["w0"] - trace["w_final"]) - 1e-9


@st.composite
def protocol_scenarios(draw):
    dim = draw(st.integers(2, 10))
    protocol = draw(st.sampled_from(["roundrobin", "minibatch", "paramserver", "staleness_lr",
                                     "dcasgd", "admm"]))
    overrides = [
        "problem.name=logistic", f"problem.dim={dim}", "problem.n_samples=30",
        f"run.protocol={protocol}", f"run.threads={draw(st.integers(1, 5))}",
        f"run.updates={draw(st.integers(1, 40))}",
        f"run.blocks={draw(st.integers(1, min(dim, 3)))}",
        f"run.write_mode={draw(st.sampled_from(['load_store', 'atomic_add']))}",
        f"run.seed={draw(st.integers(0, 1000))}",
        f"devices.0.cores={draw(st.integers(0, 3))}",
        f"devices.0.latency={draw(st.integers(0, 3000))}",
        *draw(st.sampled_from([[f"paramserver.accumulate={n}"] for n in (1, 2, 3)]
                              + [[f"paramserver.fraction={p}"] for p in (0.5, 1.0)])),
        f"timing.read={{dist='exponential', mean={draw(st.integers(100, 9000))}}}",
        f"inject.delay={draw(st.integers(0, 3))}",
        "timing.grad={dist='exponential', mean=5000}",
    ]
    return scenario(*overrides)


@settings(max_examples=40, deadline=None)
@given(protocol_scenarios())
def test_protocol_invariants(s):
    """Every gradient gets a row; applied steps are numbered 1..T' in completion order with
    one measurement each; synchronous rounds and turns lose nothing."""
    trace = simulate(s)
    assert len(trace) == s.run.updates
    applied = trace["step"][trace["step"] > 0]
    assert (np.diff(applied) >= 0).all()
    assert set(applied.tolist()) == set(range(1, int(applied.max(initial=0)) + 1))
    if s.run.protocol != "admm":
        assert trace["measured"].sum() == applied.max(initial=0)
    assert (trace["staleness"] >= trace["delay"]).all()
    if s.run.protocol in ("minibatch", "roundrobin", "paramserver"):
        assert trace["lost_blocks"].sum() == 0
    synchronous = s.run.protocol == "minibatch" or (s.run.protocol == "paramserver"
                                                    and s.paramserver.fraction > 0)
    if synchronous and s.inject.delay == 0:  # every applied gradient saw the same vector
        applied = trace["step"] > 0
        assert not error_mask(trace).any() and (trace["staleness"][applied] == 0).all()


def test_admm_reaches_the_consensus_optimum_and_its_residuals_vanish():
    """One sample per shard makes every local SGD step exact gradient descent, so async
    consensus ADMM must converge to the global optimum w* of f = Σ f_i (closed form for the
    quadratic), with primal and dual residuals going to zero."""
    s, problem = small("run.protocol=admm", "run.threads=3", "problem.n_samples=3",
                       "run.updates=3000", "admm.local_steps=40", "admm.rho=0.5", "run.lr=0.1",
                       "timing.grad={dist='exponential', mean=6000}")
    engine = Engine(s, problem)
    trace = engine.run()
    w_star = problem.optimum()[0]
    assert np.linalg.norm(trace["w_final"] - w_star) < 1e-6
    primal, dual = trace["extra_primal_residual"], trace["extra_dual_residual"]
    assert primal.size == dual.size == 3000
    assert primal[-1] < 1e-6 and dual[-1] < 1e-6 and primal[:10].max() > 1e-3
    # z is the mean of the workers' x_i + u_i, and the residual is recomputed from them.
    admm = engine.protocol
    z = trace["w_final"]
    assert np.allclose((admm.x + admm.u).mean(axis=0), z, atol=1e-14)
    assert primal[-1] == pytest.approx(np.sqrt(((admm.x - z) ** 2).sum()), abs=1e-15)
    assert not trace["measured"].any()  # not an SGD step: no serialized-view δ
    # Every worker samples only its own shard; a local solve lasts local_steps gradients.
    assert (trace["sample"] == trace["thread"]).all()
    constant, _ = small("run.protocol=admm", "run.threads=3", "run.updates=6",
                        "admm.local_steps=40")
    assert set(simulate(constant, problem)["grad_ns"].tolist()) == {6000 * 40}


@pytest.mark.parametrize("protocol", ["roundrobin", "minibatch", "paramserver",
                                      "staleness_lr", "dcasgd", "admm"])
def test_replay_reproduces_every_protocol(protocol):
    from simulator.replay import replay

    s = scenario("run.updates=200", "run.threads=4", "problem.dim=12", "run.blocks=2",
                 f"run.protocol={protocol}", "paramserver.accumulate=2",
                 "devices.0.latency=300", "inject.pauses=[{thread=1, start=3000, end=9000}]")
    trace = simulate(s)
    _, _, again = replay(trace)
    for name, values in trace.arrays.items():
        assert np.array_equal(values, again[name], equal_nan=True), name


def test_replay_refuses_to_change_what_shapes_the_interleaving():
    from simulator.errors import ScenarioError
    from simulator.replay import replay

    trace = simulate(scenario("run.updates=50", "run.protocol=paramserver"))
    with pytest.raises(ScenarioError, match=r"paramserver\.accumulate = 3: is fixed"):
        replay(trace, ["paramserver.accumulate=3"])


def test_backup_rounds_never_apply_a_read_that_overlapped_the_previous_write():
    """Slow links make a round's write long; a straggler that starts reading during it read
    a half-written vector and must be discarded, so every applied gradient is exact."""
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).parents[2] / "scenarios" / "paramserver_backup.toml"
    trace = simulate(load_scenario(path, ["run.updates=600"]))
    applied = trace["step"] > 0
    assert (~applied).sum() > 0
    assert (trace["staleness"][applied] == 0).all() and not error_mask(trace).any()
