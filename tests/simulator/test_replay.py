"""Replay: recorded samples and durations reproduce the run; other values keep the schedule."""

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import ScenarioError, TraceError
from simulator.replay import replay
from simulator.trace import Trace
from tests.conftest import scenario

SCHEDULE = ("uid", "thread", "thread_seq", "sample", "read_start", "read_end", "grad_start",
            "grad_end", "write_start", "write_end", "staleness", "read_overwrites", "torn",
            "lost_blocks", "overwrote", "op_block", "op_read_ns", "op_write_ns")


@pytest.fixture(scope="module")
def recorded():
    return simulate(scenario("run.updates=600", "run.blocks=3", "devices.0.cores=4"))


def test_replay_reproduces_the_run_bit_for_bit(recorded):
    """Replaying with the trace's own scenario gives identical arrays, metrics included."""
    _, _, again = replay(recorded)
    for name, array in recorded.arrays.items():
        assert np.array_equal(again[name], array, equal_nan=array.dtype.kind == "f"), name
    assert again.source == "replay"


def test_replay_with_another_lr_keeps_the_interleaving(recorded):
    """A new learning rate changes the values, not the schedule."""
    _, _, again = replay(recorded, ["run.lr=0.001"])
    for name in SCHEDULE:
        assert np.array_equal(again[name], recorded[name]), name
    assert not np.array_equal(again["w_final"], recorded["w_final"])


def test_replay_on_a_larger_problem_keeps_the_interleaving(recorded):
    """A larger dense problem (same samples) replays the same schedule."""
    _, problem, again = replay(recorded, ["problem.dim=300"])
    assert problem.dim == 300
    for name in SCHEDULE:
        assert np.array_equal(again[name], recorded[name]), name


def test_replay_ignores_timing_distributions(recorded):
    """Durations come from the trace, so a new timing distribution changes nothing."""
    _, _, again = replay(recorded, ["timing.grad.mean=1"])
    assert np.array_equal(again["write_end"], recorded["write_end"])


@pytest.mark.parametrize("override", ["run.threads=3", "run.blocks=2", "run.updates=10",
                                      "run.protocol=locked", "devices.0.cores=2"])
def test_replay_refuses_to_change_what_the_trace_fixes(recorded, override):
    """Thread, block and update counts, the protocol and the devices come from the trace."""
    field = override.split("=")[0].split(".")[0 if override.startswith("devices") else 1]
    with pytest.raises(ScenarioError, match=field):
        replay(recorded, [override])


@pytest.mark.parametrize("override", ["run.split=even", "run.placement=shuffled"])
def test_replay_refuses_another_split_or_placement(recorded, override):
    """Who makes the updates and where threads sit shape the schedule: fixed by the trace."""
    with pytest.raises(ScenarioError, match=override.split("=")[0].replace(".", r"\.")):
        replay(recorded, [override])


def test_replay_of_a_shuffled_placement_refuses_another_seed():
    """The seed draws a shuffled placement, so it is fixed; with slots in order it is not."""
    devices = 'devices=[{name="a", cores=1}, {name="b", cores=3}]'
    common = ("problem.dim=10", "run.threads=4", "run.updates=100", devices)
    shuffled = simulate(scenario(*common, "run.placement=shuffled"))
    with pytest.raises(ScenarioError, match=r"run\.seed = 7: draws the shuffled placement"):
        replay(shuffled, ["run.seed=7"])
    in_order = simulate(scenario(*common))
    _, _, again = replay(in_order, ["run.seed=7"])
    assert np.array_equal(again["write_end"], in_order["write_end"])


def test_replay_of_migrating_time_slices_refuses_another_seed():
    """The seed draws the load balancer's moves of per-core time slices, which decide when
    each thread runs: another seed replayed another interleaving with exit 0. The same seed
    replays bit for bit."""
    slices = "hardware.time_slices={quantum=20000, slicing='per_core', migrate=30000}"
    trace = simulate(scenario("problem.dim=10", "run.threads=3", "run.updates=300",
                              "devices=[{cores=2}]", slices))
    with pytest.raises(ScenarioError, match=r"run\.seed = 7: draws the load balancer's moves"):
        replay(trace, ["run.seed=7"])
    _, _, again = replay(trace)
    assert np.array_equal(again["write_end"], trace["write_end"])
    assert np.array_equal(again["w_final"], trace["w_final"])
    # With a core per thread nothing is sliced and the seed draws nothing of the schedule.
    unsliced = simulate(scenario("problem.dim=10", "run.threads=2", "run.updates=100",
                                 "devices=[{cores=2}]", slices))
    _, _, again = replay(unsliced, ["run.seed=7"])
    assert np.array_equal(again["write_end"], unsliced["write_end"])


@pytest.mark.parametrize(("column", "value", "said"), [
    ("sample", -1, r"sample\[3\] = -1: must be >= 0"),
    ("thread", 500, r"thread\[3\] = 500: must be in 0\.\.7"),
    ("grad_ns", -5, r"grad_ns\[3\] = -5: must be >= 0")])
def test_replay_refuses_rows_it_cannot_replay(recorded, column, value, said):
    """A negative sample was read as the last one, a thread the scenario lacks never ran its
    updates, a negative duration ran backwards: each replayed with exit 0."""
    arrays = dict(recorded.arrays)
    arrays[column] = arrays[column].copy()
    arrays[column][3] = value
    damaged = Trace(arrays, recorded.scenario_toml, source=recorded.source)
    with pytest.raises(TraceError, match=said):
        replay(damaged)


def test_replay_needs_the_recorded_samples(recorded):
    """A problem with fewer samples than the trace used is refused with the field named."""
    with pytest.raises(ScenarioError, match=r"problem\.n_samples"):
        replay(recorded, ["problem.n_samples=10"])


@pytest.mark.alone  # real worker processes
def test_a_real_run_and_its_replay_count_the_same_overwrites_and_torn_reads():
    """Both traces take read-overwrites and torn reads from the same block copy and store
    ends (``simulator.trace.read_report``); the replay puts every event at its recorded
    time, so the counts agree update by update (a dense problem: the real run records
    ``[hardware.sweeping_reads]``, whose copies of writes in flight are recorded apart)."""
    from realrun.runner import run_real
    from simulator.metrics import summarize

    s = scenario("problem.dim=40", "problem.n_samples=200", "run.updates=3000", "run.blocks=3")
    real = run_real(s, 2, "lockfree")
    assert real.failure is None and len(real.trace) == 3000
    scenario_, problem, again = replay(real.trace)
    assert scenario_.hardware.sweeping_reads is not None
    a, b = (np.lexsort((t["thread_seq"], t["thread"])) for t in (real.trace, again))
    for column in ("read_overwrites", "torn"):
        assert np.array_equal(real.trace[column][a], again[column][b]), column
    assert real.trace["read_overwrites"].sum() > 0
    counts = [summarize(t, problem, scenario_)["overwrites"] for t in (real.trace, again)]
    for key in ("read_overwrite_blocks", "updates_with_read_overwrite", "torn_reads"):
        assert counts[0][key] == counts[1][key], key


def test_a_scheduled_trace_is_replayed_only_by_its_schedule(tmp_path, capsys):
    """A controlled run's durations count steps: replayed as durations they would give
    another run, so replay refuses it in one line pointing to --schedule (exit 2, nothing
    written)."""
    from simulator.cli import main
    from simulator.errors import TraceError
    from simulator.rundir import write_run
    from simulator.schedule import Scheduler, run_schedule

    s = scenario("problem.dim=4", "problem.n_samples=20", "metrics.curve_points=0",
                 "run.threads=2", "run.updates=4", "run.blocks=2")
    run = run_schedule(s, Scheduler("random", 2))
    with pytest.raises(TraceError, match=r"under a scheduler .* --schedule"):
        replay(run.trace)
    write_run(tmp_path / "run", s, run.trace, run.problem)
    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "r"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--schedule" in err and not (tmp_path / "r").exists()
    assert main(["replay", str(tmp_path / "run"), "--schedule", run.text, "--out",
                 str(tmp_path / "r"), "--quiet"]) == 0
    assert (tmp_path / "r" / "trace.npz").read_bytes() == \
        (tmp_path / "run" / "trace.npz").read_bytes()


def test_a_trace_with_a_dead_thread_is_refused(tmp_path, capsys):
    """A dead thread's abandoned update has no row, so the replay would give another run:
    replay refuses it in one line naming the dead thread (exit 2, nothing written)."""
    from simulator.cli import main
    from simulator.errors import TraceError
    from simulator.problems import make_problem
    from simulator.rundir import write_run

    s = scenario("problem.dim=10", "run.threads=2", "run.blocks=3", "run.updates=20",
                 "inject.deaths=[{thread=0, at=43496}]")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    assert trace["extra_dead_threads"].tolist() == [0]
    with pytest.raises(TraceError, match=r"thread\(s\) 0 died"):
        replay(trace)
    write_run(tmp_path / "run", s, trace, problem)
    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "r"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "died" in err and not (tmp_path / "r").exists()
