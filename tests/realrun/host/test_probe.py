"""The CPU-to-CPU cache-line probe (realrun/host/_cpuprobe.c): what it measures, what it refuses,
and that real runs carry it."""

import math
import os

import pytest

from realrun.host.probe import built, line_latency_ns, probe_cpus, shared_write_cost
from simulator.rundir import FAR_NS, latency_line, placement

pytestmark = pytest.mark.alone  # real processes, or the CPUs probed: see conftest

needs_probe = pytest.mark.skipif(not built(), reason="realrun.host._cpuprobe not built (no C "
                                 "compiler at install, or not Linux)")
needs_two = pytest.mark.skipif(probe_cpus() is None, reason="needs two usable CPUs")


@needs_probe
@needs_two
def test_the_probe_measures_each_burst_on_two_cpus():
    from realrun.host._cpuprobe import line_latency

    a, b = probe_cpus()
    bursts = line_latency(a, b, rounds=500, bursts=3)
    # One way, a line between two cores takes at least a few nanoseconds and, on any machine
    # this runs on, far less than a millisecond.
    assert len(bursts) == 3 and all(math.isfinite(x) and 1 < x < 1e6 for x in bursts)
    median = line_latency_ns([a, b], rounds=500, bursts=3)
    assert median is not None and 1 < median < 1e6


def test_the_latency_is_the_median_of_the_bursts(monkeypatch):
    """``line_latency_ns`` reports the median burst, whatever the spread (one slow burst,
    a descheduled core, does not move it), and None when the probe cannot run there."""
    import realrun.host.probe as probe

    asked = []

    def bursts(a, b, rounds, count):
        asked.append((a, b, rounds, count))
        return [90.0, 41.0, 5000.0, 40.0, 43.0][:count]

    monkeypatch.setattr(probe, "_line_latency", bursts)
    assert probe.line_latency_ns([3, 1], rounds=200, bursts=5) == 43.0
    assert probe.line_latency_ns([3, 1], rounds=200, bursts=4) == (41.0 + 90.0) / 2
    assert asked == [(3, 1, 200, 5), (3, 1, 200, 4)]

    def gone(*_):
        raise TimeoutError("CPU 1 gave the probe no time for 5 s")

    monkeypatch.setattr(probe, "_line_latency", gone)
    assert probe.line_latency_ns([3, 1]) is None


@needs_probe
def test_the_probe_refuses_one_cpu_and_names_a_cpu_it_cannot_use():
    from realrun.host._cpuprobe import line_latency

    with pytest.raises(ValueError, match="cpus: 0 and 0"):
        line_latency(0, 0)
    with pytest.raises(ValueError, match="rounds 0"):
        line_latency(0, 1, rounds=0)
    with pytest.raises(ValueError, match="cpus: 0 and 0"):
        line_latency_ns([0, 0])
    mine = min(os.sched_getaffinity(0))
    absent = 1023  # a valid CPU number that no test machine lets this process use
    assert absent not in os.sched_getaffinity(0)
    with pytest.raises(OSError, match=f"CPU {absent}: cannot run there"):
        line_latency(mine, absent, rounds=10, bursts=1)
    assert line_latency_ns([mine, absent], rounds=10, bursts=1) is None  # a run goes on


def test_the_cpus_probed_are_the_pinned_workers_or_the_first_two_usable():
    usable = sorted(os.sched_getaffinity(0))
    first_two = usable[:2] if len(usable) >= 2 else None
    assert probe_cpus([5, 3, 5]) == [5, 3]
    assert probe_cpus([2, 2]) == first_two  # two workers on one CPU: the usable ones instead
    assert probe_cpus(None) == first_two


def test_the_latency_line_says_what_was_measured():
    assert latency_line({"cpus": [0, 1], "before_ns": 47.6, "after_ns": 412.2}) == (
        "a cache line passes between CPUs 0 and 1 in 48 ns before the run, 412 ns after "
        "(moved during the run; far from 150 ns)")
    assert latency_line({"cpus": [0, 1], "before_ns": 40.0, "after_ns": None}) == (
        "a cache line passes between CPUs 0 and 1 in 40 ns before the run (near; far from 150 "
        "ns)")
    assert latency_line({"cpus": [2, 3], "before_ns": None, "after_ns": None}) == (
        "CPU 2 to CPU 3: the latency probe could not run")


def test_placement_reads_the_state_from_both_probes():
    """Far when every probe is at or over FAR_NS, near when none is, changing when the host
    moved the CPUs between the two probes; an unmeasured side does not count."""
    def state(before, after):
        return placement({"cpus": [0, 1], "before_ns": before, "after_ns": after})

    assert FAR_NS == 150
    assert state(150.0, 412.0) == "far" and state(149.9, 30.0) == "near"
    assert state(40.0, 150.0) == "changing" == state(600.0, 24.0)
    assert state(None, 200.0) == "far" and state(20.0, None) == "near"
    assert state(None, None) is None and placement(None) is None


def test_the_probe_is_built_where_a_compiler_and_headers_are():
    """The extension is optional at install; on Linux where it could be built, it must have
    been."""
    import shutil
    import sys
    import sysconfig
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        pytest.skip("the probe pins threads with sched_setaffinity (Linux)")
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("no Python headers here")
    assert built()


@needs_probe
@needs_two
def test_the_write_probe_times_every_round_of_both_kinds():
    from realrun.host._cpuprobe import shared_write

    a, b = probe_cpus()
    for itemsize in (4, 8):
        own, shared = shared_write(a, b, 1000, itemsize, rounds=7)
        # Each timed write of 1000 items takes some nanoseconds and far less than a second.
        assert len(own) == len(shared) == 7
        assert all(0 < ns < 1e9 for ns in own + shared)


@needs_probe
def test_the_write_probe_refuses_bad_arguments():
    from realrun.host._cpuprobe import shared_write

    with pytest.raises(ValueError, match="cpus: 1 and 1"):
        shared_write(1, 1, 100)
    for bad in ({"count": 0}, {"count": 10, "itemsize": 2}, {"count": 10, "rounds": 0}):
        with pytest.raises(ValueError, match=r"count \d+, rounds \d+, itemsize \d+"):
            shared_write(0, 1, **bad)
    with pytest.raises(ValueError, match="itemsize 3"):
        shared_write_cost([0, 1], 10, 3)


@needs_probe
@needs_two
def test_the_write_cost_scales_a_long_vector_from_the_part_probed(monkeypatch):
    """A vector longer than the probe's buffer is probed in part; the extra time is scaled
    by length (every line pays the same invalidation)."""
    import realrun.host.probe as probe

    monkeypatch.setattr(probe, "PROBE_BYTES", 8 * 500)
    cost = shared_write_cost(probe_cpus(), 2000, 8)
    assert cost is not None and cost["probed"] == 500 and cost["count"] == 2000
    assert cost["itemsize"] == 8 and 5 <= cost["rounds"] <= 200
    assert cost["extra_ns"] == pytest.approx(4 * (cost["shared_ns"] - cost["own_ns"]))
    assert cost["line_ns"] is None or cost["line_ns"] > 1
