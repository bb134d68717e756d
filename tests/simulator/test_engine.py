"""The engine: exact invariants and hand-worked interleavings (log-and-compare)."""

import itertools

import numpy as np
import pytest

from simulator.engine import Engine, simulate
from simulator.errors import ScenarioError
from simulator.metrics import error_mask
from simulator.problems import make_problem
from tests.conftest import CONSTANT, scenario

ROW = ("uid", "thread", "thread_seq", "read_start", "read_end", "grad_start", "grad_end",
       "write_start", "write_end", "staleness", "read_overwrites", "torn", "lost_blocks",
       "overwrote")


def _rows(trace):
    return [tuple(int(trace[name][i]) for name in ROW) for i in range(len(trace))]


def _hand_case(*extra):
    """2 threads, 2 blocks of a 4-d quadratic, constant durations (per block: half)."""
    return scenario(*CONSTANT, "problem.name=quadratic", "problem.dim=4",
                    "problem.n_samples=10", "run.blocks=2", "run.threads=2",
                    "timing.read.mean=200", "timing.grad.mean=1000", "timing.write.mean=200",
                    *extra)


def test_lockstep_threads_lose_the_first_write():
    """Two identical threads: both load before either stores, so thread 0's stores are lost.

    Each block read/write takes 100 ns. Both read [0,200], compute [200,1200], then write
    block 0 (load 1200, store 1300) and block 1 (load 1300, store 1400). At equal times thread
    0 acts first: it stores first, thread 1 stores over it from an older load.
    """
    trace = simulate(_hand_case("run.updates=2"))
    assert _rows(trace) == [
        # uid thr seq  R        G           W         stale ro torn lost overwrote
        (0, 0, 0, 0, 200, 200, 1200, 1200, 1400, 0, 0, 0, 2, 0),
        (1, 1, 0, 0, 200, 200, 1200, 1200, 1400, 1, 0, 0, 0, 2),
    ]
    problem = make_problem(_hand_case().problem)
    lr, w0 = 0.02, np.zeros(4)
    g0 = problem.grad(w0, int(trace["sample"][0]))[0]  # both computed at w0
    g1 = problem.grad(w0, int(trace["sample"][1]))[0]
    assert np.array_equal(trace["w_final"], -lr * g1)  # only thread 1's update survived
    # Serialized view by hand: completion 1 sees block 0 from thread 1, block 1 from thread 0.
    w1 = -lr * np.concatenate([g1[:2], g0[2:]])
    s1, s2 = (w0 - w1) / lr, (w1 + lr * g1) / lr
    delta1 = s1 - problem.grad(w0, int(trace["sample"][0]))[0]
    delta2 = s2 - problem.grad(w1, int(trace["sample"][1]))[0]
    assert np.allclose(trace["delta_norm"], [np.linalg.norm(delta1), np.linalg.norm(delta2)],
                       rtol=1e-12)
    assert np.allclose(trace["s_norm"], [np.linalg.norm(s1), np.linalg.norm(s2)], rtol=1e-12)


def test_grains_of_one_block_lose_what_two_blocks_lose():
    """``store_grain = 2`` on one 4-d block sweeps the write in two read-modify-writes
    (load 1200 / store 1300, load 1300 / store 1400), exactly the writes of two 2-d blocks:
    the same rows, the same lost stores, the same final vector and gradient errors."""
    blocks = simulate(_hand_case("run.updates=2"))
    grains = simulate(_hand_case("run.updates=2", "run.blocks=1", "run.store_grain=2"))
    assert _rows(grains) == _rows(blocks)
    for name in ("w_final", "delta_norm", "s_norm"):
        assert np.array_equal(grains[name], blocks[name]), name


def test_a_grain_as_large_as_the_block_is_the_whole_block_write():
    """One grain per block is the block's own read-modify-write: every array of the trace is
    bit-identical to ``store_grain = 0``, on dense and on sparse supports; finer grains lose
    stores as grains, with lost and overwritten counts balanced, reproducibly."""
    for extra in (("run.blocks=4",),
                  ("problem.name=sparse_logistic", "problem.density=0.5", "run.blocks=4")):
        base = scenario("run.updates=800", "run.threads=6", *extra)
        whole = simulate(base)
        coarse = simulate(scenario("run.updates=800", "run.threads=6", *extra,
                                   f"run.store_grain={base.problem.dim}"))
        for name, array in whole.arrays.items():
            assert np.array_equal(coarse[name], array, equal_nan=array.dtype.kind == "f"), name
        fine = scenario("run.updates=800", "run.threads=6", *extra, "run.store_grain=3")
        first, again = simulate(fine), simulate(fine)
        assert first["lost_blocks"].sum() > 0
        assert first["lost_blocks"].sum() == first["overwrote"].sum()
        for name, array in first.arrays.items():
            assert np.array_equal(again[name], array, equal_nan=array.dtype.kind == "f"), name


def test_fast_thread_tears_a_slow_read():
    """A 4× faster thread completes two updates while a slow thread reads: a torn read.

    Slow thread 0: block reads of 500 ns (copies at 500 and 1000), gradient [1000,2000],
    block writes of 100 ns. Fast thread 1: reads 125 ns/block, gradient 250 ns, writes
    25 ns/block: update 1 stores block 0 at 525 and block 1 at 550; update 2 stores them at
    1075 and 1100. Thread 0's block-0 copy (at 500) precedes both, its block-1 copy (at 1000)
    contains update 1's store: versions that never coexisted, since update 1 changed block 0
    at 525. Block 1 changed after the read began (a read-overwrite); thread 0's update is two
    completions stale.
    """
    trace = simulate(_hand_case("run.updates=3", "timing.read.mean=1000",
                                "devices=[{name='slow'}, {name='fast', speed=4.0}]"))
    assert _rows(trace) == [
        (1, 1, 0, 0, 250, 250, 500, 500, 550, 0, 0, 0, 0, 0),
        (2, 1, 1, 550, 800, 800, 1050, 1050, 1100, 0, 0, 0, 0, 0),
        (0, 0, 0, 0, 1000, 1000, 2000, 2000, 2200, 2, 1, 1, 0, 0),
    ]
    assert error_mask(trace).tolist() == [False, False, True]


def test_one_core_time_shares_every_action():
    """With one core for two threads no two actions overlap: the span is the sum of work."""
    trace = simulate(_hand_case("run.updates=6", "devices.0.cores=1"))
    work = trace["op_read_ns"].sum() + trace["grad_ns"].sum() + trace["op_write_ns"].sum()
    assert trace["write_end"].max() - trace["read_start"].min() == work


def test_bus_serialises_block_transfers():
    """A bus of capacity 1 lets one block move at a time: transfers never overlap."""
    trace = simulate(_hand_case("run.updates=8", "run.threads=4", "devices.0.bus=1",
                                "timing.grad.mean=0"))
    transfers = trace["op_read_ns"].sum() + trace["op_write_ns"].sum()
    assert trace["write_end"].max() == transfers



@pytest.mark.parametrize("device", ["devices.0.cores=1", "devices.0.bus=1"])
def test_a_write_that_waits_for_its_core_loads_once_it_runs(device):
    """A block write holds the device's one core (or its bus of one place) from its load to
    its store, so with four lock-free threads no store can land in between: nothing is lost.
    Each phase starts when it holds them: a read's start is never inside another update's
    block write. (The load was made before the wait: 900 of 600 block stores lost.)"""
    for blocks in (2, 1):
        t = simulate(scenario("run.updates=300", "run.threads=4", f"run.blocks={blocks}",
                              device))
        assert t["lost_blocks"].sum() == 0 and t["overwrote"].sum() == 0
        assert t["staleness"].max() > 0  # the threads still interleave their updates
    starts, ends = t["write_start"], t["write_end"]  # B = 1: one block write each
    assert not any(((starts < r) & (r < ends)).any() for r in t["read_start"])


def test_a_thread_that_dies_waiting_for_a_core_gives_it_back():
    """A thread that dies while it queues for the one core leaves the queue (a place it
    had been granted would be held for ever, and the others would starve): the two
    survivors make every update but the one it had begun."""
    t = simulate(scenario("run.updates=200", "run.threads=3", "run.blocks=2",
                          "devices.0.cores=1", "inject.deaths=[{thread=1, at=20000}]"))
    assert t["extra_dead_threads"].tolist() == [1]
    assert len(t) == 199 and set(t["thread"][t["read_start"] > 20000].tolist()) == {0, 2}

def test_single_thread_lockfree_is_plain_sgd_to_the_bit():
    """k=1 lock-free performs exactly w ← w − lr·∇f_z(w) on the recorded samples."""
    s = scenario("run.threads=1", "run.updates=300", "run.blocks=3")
    trace = simulate(s)
    problem = make_problem(s.problem)
    w = np.zeros(problem.dim)
    for z in trace["sample"]:
        w = w - s.run.lr * problem.grad(w, int(z))[0]
    assert np.array_equal(trace["w_final"], w)
    assert not error_mask(trace).any()
    assert trace["staleness"].max() == 0


def test_serial_protocol_equals_single_thread_lockfree():
    """serial (any thread count) runs thread 0's stream: the same trace as k=1 lock-free."""
    serial = simulate(scenario("run.protocol=serial", "run.threads=8", "run.updates=200"))
    single = simulate(scenario("run.threads=1", "run.updates=200"))
    for name in ("sample", "write_end", "w_final", "delta_norm", "curve_loss"):
        assert np.array_equal(serial[name], single[name])


@pytest.mark.parametrize("mode", ["load_store", "atomic_add"])
def test_locked_has_no_error_and_no_staleness(mode):
    """Under a whole-update lock every update sees the latest vector."""
    trace = simulate(scenario("run.protocol=locked", "run.updates=800", "run.blocks=4",
                              f"run.write_mode={mode}"))
    assert error_mask(trace).sum() == 0
    assert trace["staleness"].max() == 0
    assert trace["lost_blocks"].sum() == 0 and trace["torn"].sum() == 0


def test_atomic_add_never_loses_a_block():
    """atomic_add: no store is overwritten, even with heavy contention."""
    trace = simulate(scenario("run.write_mode=atomic_add", "run.threads=16", "run.blocks=4",
                              "run.updates=1500"))
    assert trace["lost_blocks"].sum() == 0 and trace["overwrote"].sum() == 0
    assert trace["staleness"].mean() > 5  # contention was real


def test_load_store_loses_blocks_under_contention():
    """The same run with load_store does lose stores, and lost counts balance overwrites."""
    trace = simulate(scenario("run.threads=16", "run.blocks=4", "run.updates=1500"))
    assert trace["lost_blocks"].sum() > 100
    assert trace["lost_blocks"].sum() == trace["overwrote"].sum()


def test_dense_errors_far_exceed_sparse_errors():
    """The paper's observation: lock-free k=8 gives gradient errors on nearly every dense
    update, but rarely on a sparse (Hogwild) problem with the same timings."""
    dense = simulate(scenario("run.updates=2000"))
    sparse = simulate(scenario("run.updates=2000", "problem.name=sparse_logistic",
                               "problem.dim=5000", "problem.density=0.002"))
    dense_rate, sparse_rate = error_mask(dense).mean(), error_mask(sparse).mean()
    assert dense_rate > 0.9
    assert sparse_rate < 0.2
    assert dense_rate - sparse_rate > 0.7


def test_sparse_updates_move_only_their_blocks():
    """A sparse update reads and writes only the blocks its support touches."""
    s = scenario("problem.name=sparse_logistic", "problem.dim=1000", "problem.density=0.003",
                 "run.blocks=50", "run.updates=100")
    trace = simulate(s)
    problem = make_problem(s.problem)
    for row in range(len(trace)):
        blocks = trace["op_block"][trace.ops_of(row)]
        expected = np.unique(problem.support(int(trace["sample"][row])) // 20)
        assert np.array_equal(blocks, expected)


def test_completions_are_in_time_order_and_phases_ordered():
    """Rows are write completions in time order; each update has R ≤ G ≤ W."""
    trace = simulate(scenario("run.updates=500", "run.blocks=3"))
    assert np.all(np.diff(trace["write_end"]) >= 0)
    for a, b in (("read_start", "read_end"), ("read_end", "grad_start"),
                 ("grad_start", "grad_end"), ("grad_end", "write_start"),
                 ("write_start", "write_end")):
        assert np.all(trace[a] <= trace[b])
    assert sorted(trace["uid"].tolist()) == list(range(500))


def test_blocks_above_dimension_is_a_scenario_error():
    """More blocks than coordinates is rejected with the field named."""
    with pytest.raises(ScenarioError, match=r"run\.blocks"):
        Engine(scenario("problem.data=breast_cancer", "run.blocks=31"))


def test_sampled_metrics_measure_every_nth_update():
    """metrics.every=n measures completions n, 2n, ...; exact=false measures none."""
    trace = simulate(scenario("run.updates=100", "metrics.every=7"))
    assert np.flatnonzero(trace["measured"]).tolist() == list(range(6, 100, 7))
    off = simulate(scenario("run.updates=100", "metrics.exact=false"))
    assert not off["measured"].any() and np.isnan(off["delta_norm"]).all()
    full = simulate(scenario("run.updates=100"))
    assert np.array_equal(full["delta_norm"][6::7], trace["delta_norm"][6::7])


def test_lookahead_matches_one_event_per_action_on_long_runs():
    """On the default scenario and on many blocks, both clock paths agree bit for bit."""
    for extra in ((), ("run.blocks=16", "run.threads=3"), ("devices.0.cores=3",)):
        s = scenario("run.updates=1500", *extra)
        fast, slow = simulate(s), simulate(s, lookahead=False)
        for name, array in slow.arrays.items():
            assert np.array_equal(fast[name], array, equal_nan=array.dtype.kind == "f"), name



def test_a_thread_woken_with_others_does_not_run_ahead_of_them():
    """A warm start's end wakes threads 1 and 2 at once (t = 1 ns); thread 1's read takes
    0 ns, so with lookahead it read, computed, wrote and completed before thread 2 had read
    (thread 2's staleness 1 instead of the 2 one event per action gives): the others woken
    by the same event act at the same instant, and the event queue does not show them."""
    s = scenario("run.protocol=paramserver", "paramserver.warm_start=1", "run.threads=3",
                 "run.updates=4", "timing.read={dist='constant', mean=1}",
                 "timing.grad={dist='constant', mean=0}",
                 "timing.write={dist='constant', mean=0}",
                 "inject.stragglers=[{thread=1, factor=0.25}]")
    fast, slow = simulate(s), simulate(s, lookahead=False)
    assert slow["staleness"].tolist() == [0, 0, 1, 2]
    for name, array in slow.arrays.items():
        assert np.array_equal(fast[name], array, equal_nan=array.dtype.kind == "f"), name

def test_time_slices_run_only_cores_threads_at_a_time():
    """k = 3 threads on 2 cores in 100 µs slices: slot s runs threads (2s + j) mod 3, so no
    phase of a thread starts in a slot that is not its own, and every thread progresses."""
    s = scenario(*CONSTANT, "run.threads=3", "run.updates=300", "devices.0.cores=2",
                 "devices.0.quantum=100000")
    trace = simulate(s)
    for column in ("read_start", "grad_start", "write_start"):
        slot = trace[column] // 100_000
        assert ((trace["thread"] - slot * 2) % 3 < 2).all(), column
    assert np.bincount(trace["thread"]).min() >= 90
    per_action = simulate(scenario(*CONSTANT, "run.threads=3", "run.updates=300",
                                   "devices.0.cores=2"))
    assert not np.array_equal(per_action["write_end"], trace["write_end"])


def _slot_threads(trace, column, quantum):
    """Per slot of ``quantum`` ns: the set of threads that started a ``column`` phase in it."""
    slots: dict[int, set[int]] = {}
    for slot, thread in zip((trace[column] // quantum).tolist(), trace["thread"].tolist(),
                            strict=True):
        slots.setdefault(slot, set()).add(thread)
    return slots


def test_per_core_slices_keep_each_thread_on_its_core():
    """k = 3 on 2 cores, per-core slicing: thread 1 has core 1 to itself and runs in every
    slot; threads 0 and 2 share core 0 and take alternate slots (0 even, 2 odd) until thread
    1 has finished. Then core 1 takes thread 0, the one waiting, and both run in every slot.

    Each update takes 10 µs (CONSTANT): thread 1 makes its 200 in 2 ms, while 0 and 2 make
    100 each; their last 100 take 1 ms more on a core each, so they end at about 3 ms, 1.5
    times thread 1's end (not 4 ms, as two threads left on one core would)."""
    s = scenario(*CONSTANT, "run.threads=3", "run.updates=600", "devices.0.cores=2",
                 "devices.0.quantum=100000", "devices.0.slicing=per_core", "run.split=even")
    trace = simulate(s)
    assert np.bincount(trace["thread"]).tolist() == [200, 200, 200]
    end = [int(trace["write_end"][trace["thread"] == t].max()) for t in range(3)]
    shared = (trace["thread"] != 1) & (trace["write_end"] <= end[1])
    for column in ("read_start", "grad_start", "write_start"):
        slot = trace[column][shared] // 100_000
        assert (slot % 2 == trace["thread"][shared] // 2).all(), column
    after = trace["read_start"] >= (end[1] // 100_000 + 1) * 100_000
    for t in (0, 2):
        slots = np.unique(trace["read_start"][after & (trace["thread"] == t)] // 100_000)
        assert len(slots) >= 2 and (np.diff(slots) == 1).all()  # every slot
    assert abs(end[1] - 2_000_000) < 20_000
    assert all(abs(end[t] - 3_000_000) < 150_000 for t in (0, 2))
    assert np.array_equal(simulate(s)["write_end"], trace["write_end"])  # deterministic


def test_the_balancer_moves_threads_between_cores():
    """``devices.migrate``: k = 3 on 2 cores in per-core slices of 100 µs, a balancer move
    every 1 ms on average. Which thread runs alone changes; over 1,000 slots the number of
    changes is near the expected 100 (each move between 2 and 1 threads swaps it). The run is
    deterministic, and another seed moves at other times."""
    base = (*CONSTANT, "run.threads=3", "run.updates=30000", "devices.0.cores=2",
            "devices.0.quantum=100000", "devices.0.slicing=per_core", "run.split=even",
            "devices.0.migrate=1000000")
    trace = simulate(scenario(*base))
    running = _slot_threads(trace, "read_start", 100_000)
    alone = []  # the thread alone on its core runs in a slot and the next one
    for slot in sorted(running):
        both = running[slot] & running.get(slot + 1, set())
        if len(both) == 1:
            alone.extend(both)
    changes = sum(1 for a, b in itertools.pairwise(alone) if a != b)
    slots = len(alone)
    assert slots > 1000
    assert 0.7 * slots / 10 < changes < 1.3 * slots / 10
    short = (*base, "run.updates=3000")  # determinism needs no long run
    again = simulate(scenario(*short))["write_end"]
    assert np.array_equal(again, simulate(scenario(*short))["write_end"])
    other = simulate(scenario(*short, "run.seed=1"))
    assert not np.array_equal(other["write_end"], again)
    with pytest.raises(ScenarioError, match="migrate"):
        scenario(*base, "devices.0.slicing=global")
    with pytest.raises(ScenarioError, match="migrate"):
        scenario(*base, "devices.0.migrate=-1")


def test_shuffled_placement_changes_which_thread_runs_alone_with_the_seed():
    """``run.placement = "shuffled"``: k = 3 on 2 cores, per-core slices. The thread in slot
    1 has core 1 to itself and finishes first; which thread that is follows the seed's
    permutation, every thread's turn comes across seeds, and each seed's run is deterministic.
    ``round_robin`` (the default) keeps thread 1 alone whatever the seed."""
    base = (*CONSTANT, "run.threads=3", "run.updates=600", "devices.0.cores=2",
            "devices.0.quantum=100000", "devices.0.slicing=per_core", "run.split=even")
    alone = []
    for seed in range(12):
        s = scenario(*base, "run.placement=shuffled", f"run.seed={seed}")
        assert sorted(s.slot_of(t) for t in range(3)) == [0, 1, 2]  # one device: 3 slots
        trace = simulate(s)
        end = [int(trace["write_end"][trace["thread"] == t].max()) for t in range(3)]
        first = int(np.argmin(end))
        assert s.slot_of(first) == 1 and end[first] < 0.75 * min(np.delete(end, first))
        alone.append(first)
        assert np.array_equal(simulate(s)["write_end"], trace["write_end"])
    assert set(alone) == {0, 1, 2}
    for seed in (0, 5):
        s = scenario(*base, f"run.seed={seed}")
        assert [s.slot_of(t) for t in range(3)] == [0, 1, 2]


def test_shuffled_placement_spreads_threads_over_devices_by_slot():
    """Two one-core devices of different speeds (as ``calibrate --speeds`` writes them): three
    threads take three of four slots, a thread runs on device slot mod 2, so across seeds the
    device with two threads is sometimes the fast one, sometimes the slow one."""
    devices = ("devices=[{name='core0', cores=1, speed=1.25, quantum=100000, "
               "slicing='per_core'}, {name='core1', cores=1, speed=0.8, quantum=100000, "
               "slicing='per_core'}]")
    crowded = set()
    for seed in range(6):
        s = scenario(*CONSTANT, "run.threads=3", "run.updates=300", devices, "run.split=even",
                     "run.placement=shuffled", f"run.seed={seed}")
        on = [s.device_of(t) for t in range(3)]
        assert on == [s.slot_of(t) % 2 for t in range(3)]
        assert len({s.slot_of(t) for t in range(3)}) == 3 and sorted(set(on)) == [0, 1]
        crowded.add(max(set(on), key=on.count))
        simulate(s)
    assert crowded == {0, 1}


def test_a_thread_that_stops_leaves_its_cores_rotation():
    """Thread 0 dies at 1 ms: from then on thread 2, which shared core 0 with it, runs in
    every slot instead of every other one."""
    base = (*CONSTANT, "run.threads=3", "run.updates=900", "devices.0.cores=2",
            "devices.0.quantum=100000", "devices.0.slicing=per_core")
    trace = simulate(scenario(*base, "inject.deaths=[{thread = 0, at = 1000000}]"))
    late = (trace["thread"] == 2) & (trace["read_start"] > 1_200_000)
    slots = np.unique(trace["read_start"][late] // 100_000)
    assert late.sum() > 20 and (slots % 2 == 0).any() and (slots % 2 == 1).any()
    early = (trace["thread"] == 2) & (trace["read_start"] < 900_000)
    assert (trace["read_start"][early] // 100_000 % 2 == 1).all()


def _preempt_case(*extra):
    """k = 3 on 2 cores in per-core slices of 1 µs; read 200, gradient 1000, write 200 ns."""
    return scenario(*CONSTANT, "problem.name=quadratic", "problem.dim=4", "run.threads=3",
                    "timing.read.mean=200", "timing.grad.mean=1000", "timing.write.mean=200",
                    "devices.0.cores=2", "devices.0.quantum=1000", "devices.0.slicing=per_core",
                    "run.split=even", *extra)


def test_a_preemptive_slice_stops_an_action_midway():
    """Threads 0 and 2 share core 0 (slots 0, 2, 4, ... are 0's). Thread 0 reads [0, 200]
    and computes from 200: the slice ends at 1000 with 200 ns of gradient left, which run in
    its next slice, [2000, 2200]; then it writes [2200, 2400]. Without preemption the
    gradient finishes at 1200 (into thread 2's slice) and the write waits for 2000."""
    first = {}
    for preempt in (True, False):
        flag = f"devices.0.preempt={str(preempt).lower()}"
        trace = simulate(_preempt_case("run.updates=3", flag))
        first[preempt] = {int(t): (int(trace["grad_end"][i]), int(trace["write_start"][i]),
                                   int(trace["write_end"][i]))
                          for i, t in enumerate(trace["thread"])}
    assert first[True][0] == (2200, 2200, 2400)
    assert first[False][0] == (1200, 2000, 2200)
    # Thread 2 starts in slot 1 [1000, 2000]: read to 1200, gradient 800 ns there, 200 more
    # in slot 3, then its write.
    assert first[True][2] == (3200, 3200, 3400)
    assert first[True][1] == (1200, 1200, 1400)  # alone on core 1: never stopped


def test_preempted_threads_work_only_in_their_own_slices():
    """Per update of a thread sharing a core, the time between its read's start and its
    write's end, less the other thread's slices in between, is exactly its work (1400 ns),
    and no phase of it starts or ends inside the other's slice, while thread 1 has core 1
    (after it finished, core 1 takes one of them); bit-identical twice."""
    s = _preempt_case("run.updates=600", "devices.0.preempt=true")
    trace = simulate(s)
    assert np.array_equal(simulate(s)["write_end"], trace["write_end"])
    alone_until = int(trace["write_end"][trace["thread"] == 1].max()) // 1000 * 1000
    for thread, own in ((0, 0), (2, 1)):
        rows = (trace["thread"] == thread) & (trace["write_end"] <= alone_until)
        assert rows.sum() > 50
        start, end = trace["read_start"][rows], trace["write_end"][rows]
        others = np.array([sum(1 for slot in range(a // 1000, (b - 1) // 1000 + 1)
                               if slot % 2 != own) for a, b in zip(start, end, strict=True)])
        assert (end - start - 1000 * others == 1400).all()
        for column in ("read_start", "grad_start", "grad_end", "write_start"):
            t = trace[column][rows]
            inside = (t // 1000) % 2 == own
            assert (inside | (t % 1000 == 0)).all(), column


def test_preempt_needs_time_slices():
    with pytest.raises(ScenarioError, match="preempt"):
        scenario("devices.0.preempt=true")


def test_global_slices_rotate_all_threads_over_all_cores():
    s = scenario(*CONSTANT, "run.threads=3", "run.updates=300", "devices.0.cores=2",
                 "devices.0.quantum=100000", "devices.0.slicing=global")
    slots = _slot_threads(simulate(s), "read_start", 100_000)
    assert all(threads <= {(2 * slot) % 3, (2 * slot + 1) % 3}
               for slot, threads in slots.items())


def test_even_split_gives_each_thread_its_share_and_shared_lets_fast_threads_take_more():
    straggler = "inject.stragglers=[{thread = 0, factor = 3.0}]"
    even = simulate(scenario(*CONSTANT, "run.threads=3", "run.updates=301", straggler,
                             "run.split=even"))
    assert np.bincount(even["thread"]).tolist() == [101, 100, 100]
    shared = simulate(scenario(*CONSTANT, "run.threads=3", "run.updates=301", straggler))
    counts = np.bincount(shared["thread"])
    assert counts.sum() == 301 and counts[0] < 0.5 * counts[1]


@pytest.mark.parametrize(("override", "field"), [
    ("run.split=half", "split"), ("devices.0.slicing=random", "slicing")])
def test_bad_split_or_slicing_names_the_field(override, field):
    with pytest.raises(ScenarioError, match=field):
        scenario(override)


def test_bad_store_grain_names_the_field():
    with pytest.raises(ScenarioError, match="store_grain"):
        scenario("run.store_grain=-1")


def test_even_split_is_refused_for_the_parameter_server():
    """A fixed share each serves every protocol real workers run, rounds, turns and ADMM
    included; the server hands out its updates to whoever asks."""
    with pytest.raises(ScenarioError, match=r"split.*paramserver"):
        scenario("run.protocol=paramserver", "run.split=even")
    for protocol in ("minibatch", "roundrobin", "admm"):
        assert scenario(f"run.protocol={protocol}", "run.split=even").run.split == "even"
