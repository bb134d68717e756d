"""Speed episodes: cores that switch between their own pace and a slower one for stretches of
milliseconds (``devices.slow_factor``, ``slow_ns``, ``fast_ns``), simulated and calibrated."""

import numpy as np
import pytest

from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import AsyngradError
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.episodes import _without_blips, fit_episodes
from simulator.replay import load_trace
from simulator.scenario import ScenarioError, load_scenario
from simulator.timing import SampledSource, SpeedEpisodes

EPISODES = ("devices.0.slow_factor=1.7", "devices.0.slow_ns=1000000",
            "devices.0.fast_ns=2000000")


def _scenario(*overrides):
    return load_scenario(None, ["run.threads=2", "run.updates=3000", *overrides])


def test_episodes_alternate_with_the_asked_means_whatever_order_times_are_asked_in():
    """Over a long horizon the share of time slow is slow/(fast + slow), the switches are
    those of the core's own stream, and asking later times first changes nothing."""
    a = SpeedEpisodes(7, 0, 1, 1.7, fast_ns=3_000_000, slow_ns=1_000_000)
    grid = np.arange(0, 4_000_000_000, 50_000)
    states = np.array([a.slow(t) for t in grid])
    assert states.mean() == pytest.approx(0.25, abs=0.04)
    flips = int(np.count_nonzero(np.diff(states.astype(int))))
    assert 2 * 4000 / 4 * 0.8 < flips < 2 * 4000 / 4 * 1.2  # one cycle per 4 ms on average
    b = SpeedEpisodes(7, 0, 1, 1.7, fast_ns=3_000_000, slow_ns=1_000_000)
    assert [b.factor(t) for t in grid[::-1]][::-1] == [1.7 if s else 1.0 for s in states]
    other = SpeedEpisodes(7, 0, 0, 1.7, fast_ns=3_000_000, slow_ns=1_000_000)
    assert [other.slow(t) for t in grid] != states.tolist()  # each core its own stream


def test_a_slow_episode_stretches_every_duration_of_the_updates_begun_in_it(tmp_path):
    """Constant durations come out at exactly two levels, 1.7× apart, idle included, and the
    run is bit-identical per seed and different with another seed."""
    constant = ("timing.read={dist='constant', mean=500}",
                "timing.grad={dist='constant', mean=3000}",
                "timing.write={dist='constant', mean=1000}",
                "timing.idle={dist='constant', mean=400}")
    trace = simulate(_scenario(*EPISODES, *constant, "run.updates=4000"))
    grads = np.unique(trace["grad_ns"])
    assert grads.tolist() == [3000, 5100]
    slow = trace["grad_ns"] == 5100
    assert 0.1 < slow.mean() < 0.7
    assert np.unique(trace["idle_ns"][slow & (trace["idle_ns"] > 0)]).tolist() == [680]
    assert np.unique(trace["op_write_ns"]).tolist() == [1000, 1700]
    again = simulate(_scenario(*EPISODES, *constant, "run.updates=4000"))
    assert all(np.array_equal(trace[k], again[k]) for k in trace.arrays)
    other = simulate(_scenario(*EPISODES, *constant, "run.updates=4000", "run.seed=9"))
    assert not np.array_equal(trace["grad_ns"], other["grad_ns"])
    plain = simulate(_scenario(*constant, "run.updates=4000"))
    assert np.unique(plain["grad_ns"]).tolist() == [3000]


def test_threads_on_one_core_share_its_episodes():
    """Three threads on a device of two cores (per-core time slices): threads 0 and 2 on
    core 0, thread 1 on core 1, as the time slices place them."""
    scenario = _scenario(*EPISODES, "run.threads=3", "devices.0.cores=2",
                         "devices.0.quantum=4000000", "devices.0.slicing='per_core'")
    assert [scenario.core_of(t) for t in range(3)] == [0, 1, 0]
    source = SampledSource(scenario, 3, 100, dense=[1.0])
    assert source._episodes[0] is source._episodes[2]
    assert source._episodes[1] is not source._episodes[0]


def test_a_thread_moved_to_another_core_takes_that_cores_episodes():
    """Per-core slices with balancer moves (``devices.migrate``): every update's durations
    follow the episodes of the core its thread was on when the update began (when its
    previous update ended; as ``simulator.hardware.slices`` placed it), not of the core it started
    the run on."""
    constant = ("timing.read={dist='constant', mean=500}",
                "timing.grad={dist='constant', mean=3000}",
                "timing.write={dist='constant', mean=1000}")
    scenario = _scenario(*EPISODES, *constant, "run.threads=3", "run.updates=6000",
                         "devices.0.cores=2", "devices.0.quantum=500000",
                         "devices.0.slicing='per_core'", "devices.0.migrate=2000000")
    trace = simulate(scenario)
    cores = [SpeedEpisodes(0, 0, core, 1.7, fast_ns=2_000_000, slow_ns=1_000_000)
             for core in range(2)]
    from simulator.hardware.slices import Migrating

    ends = [float(trace["write_end"][trace["thread"] == t].max()) for t in range(3)]
    places = Migrating([0, 1, 2], 2, 500_000, 2_000_000, 0, 0)
    for thread, end in enumerate(ends):
        places.finish(thread, end)
    moved, last = 0, [0, 0, 0]
    for i in np.lexsort((trace["thread_seq"], trace["thread"])):
        thread = int(trace["thread"][i])
        begun, last[thread] = last[thread], int(trace["write_end"][i])
        core = places.core_of(thread, begun // 500_000)
        assert core is not None
        moved += core != scenario.core_of(thread)
        slow = cores[core].slow(begun)
        assert int(trace["grad_ns"][i]) == (5100 if slow else 3000), i
    assert moved > 500  # many updates ran on a core other than their thread's first


@pytest.mark.parametrize("field, value, said", [
    ("slow_factor", 0.5, "must be >= 1"), ("slow_ns", 0, "must be > 0"),
    ("fast_ns", -3, "must be > 0")])
def test_bad_episode_values_are_refused_naming_the_field(field, value, said):
    overrides = [o for o in EPISODES if not o.startswith(f"devices.0.{field}=")]
    with pytest.raises(ScenarioError, match=f"devices.0.{field}.*{said}"):
        _scenario(*overrides, f"devices.0.{field}={value}")


def test_blips_shorter_than_the_shortest_stretch_are_merged():
    states = np.array([0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1], dtype=bool)
    assert _without_blips(states, 3).astype(int).tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1,
                                                              1, 1, 1, 1]
    assert _without_blips(np.array([1, 0, 0, 0], dtype=bool), 2).tolist() == [False] * 4


def test_calibration_recovers_known_episodes_and_the_fast_durations(tmp_path):
    """A simulated run of two cores with episodes 1.7× slow (1 ms slow, 2 ms fast on average):
    the factor within 5%, the mean episode lengths within 35% (about 20 episodes each), the
    gradient's fast mean within 5%; a run without episodes gets none under auto."""
    out = tmp_path / "source"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=30000",
                 "--set", "timing.grad={dist='lognormal', mean=6000, cv=0.1}",
                 *(arg for o in EPISODES for arg in ("--set", o))]) == 0
    scenario, report = calibrate(out, pool=True, cores=2, episodes="auto")
    episodes = scenario.hardware_of(0).episodes
    assert episodes is not None
    assert episodes.factor == pytest.approx(1.7, rel=0.05), report["episodes"]
    assert episodes.slow_ns == pytest.approx(1_000_000, rel=0.35)
    assert episodes.fast_ns == pytest.approx(2_000_000, rel=0.35)
    assert scenario.timing_of(0).grad.mean == pytest.approx(6000, rel=0.05)
    fitted = report["episodes"]
    assert fitted["separation"] > 2 and 0.2 < fitted["slow_share"] < 0.5
    # Simulated again: the slow share of the updates comes back.
    again = simulate(scenario)
    source = load_trace(out)
    cut = 6000 * 1.35
    assert (again["grad_ns"] > cut).mean() == pytest.approx((source["grad_ns"] > cut).mean(),
                                                           abs=0.1)
    plain = tmp_path / "plain"
    assert main(["simulate", "--out", str(plain), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=3000"]) == 0
    none = fit_episodes(load_trace(plain), "auto")
    assert none["fields"] is None and none["why"]
    assert fit_episodes(load_trace(plain), "off")["why"] == "not asked for (--episodes off)"


def test_cli_writes_the_episodes_and_refuses_them_for_several_runs(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=6000",
                 "--set", "timing.grad={dist='lognormal', mean=6000, cv=0.1}",
                 *(arg for o in EPISODES for arg in ("--set", o))]) == 0
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(run), "--pool", "--cores", "2", "--episodes", "auto",
                 "--out", str(out), "--quiet"]) == 0
    text = out.read_text()
    assert "#   speed episodes: slow level 1." in text
    episodes = load_scenario(out).hardware_of(0).episodes
    assert episodes is not None and episodes.factor == pytest.approx(1.7, rel=0.05)
    one = tmp_path / "one"
    assert main(["simulate", "--out", str(one), "--quiet", "--set", "run.threads=1",
                 "--set", "run.updates=500"]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(run), str(one), "--episodes", "on", "--out",
                 str(tmp_path / "two.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("asyngrad: error: --episodes = 'on': fits one run or repeats of one worker "
                   "count, not several worker counts")
    assert not (tmp_path / "two.toml").exists()
    repeat = tmp_path / "repeat"
    assert main(["simulate", "--out", str(repeat), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=6000", "--set", "run.seed=1",
                 "--set", "timing.grad={dist='lognormal', mean=6000, cv=0.1}",
                 *(arg for o in EPISODES for arg in ("--set", o))]) == 0
    assert main(["calibrate", str(run), str(repeat), "--pool", "--cores", "2", "--episodes",
                 "on", "--out", str(out), "--quiet"]) == 0
    text = out.read_text()
    assert f"# fitted from {run}, {repeat} (simulated run; " in text
    assert "ended within the runs)" in text


def _repeats(tmp_path, count, *overrides):
    """``count`` runs of one worker that differ only in the seed (trace files only)."""
    runs = []
    for seed in range(count):
        out = tmp_path / f"repeat{seed}"
        out.mkdir(parents=True)
        scenario = _scenario("run.threads=1", "run.updates=2000", f"run.seed={seed}",
                             "timing.grad={dist='lognormal', mean=6000, cv=0.1}", *overrides)
        simulate(scenario).save(out / "trace.npz")
        runs.append(out)
    return runs


def test_repeats_that_each_keep_one_pace_give_episodes_as_long_as_their_time(tmp_path):
    """Cores whose pace holds for far longer than a run (means of 1,000 s, runs of about
    25 ms): each run alone shows one level, the repeats together two, 1.7× apart. No episode
    ended, so each state's mean length is the time seen in it (a lower bound), and the odds
    of starting slow are the share of the time slow."""
    runs = _repeats(tmp_path, 6, "devices.0.slow_factor=1.7", "devices.0.slow_ns=1000000000000",
                    "devices.0.fast_ns=1000000000000")
    traces = [load_trace(run) for run in runs]
    for trace in traces:
        assert fit_episodes(trace, "auto")["fields"] is None
    fitted = fit_episodes(traces, "auto")
    assert fitted["fields"]["slow_factor"] == pytest.approx(1.7, rel=0.02)
    assert fitted["episodes_ended"] == [0.0, 0.0]
    shares = fitted["slow_share_per_run"]
    assert set(shares) == {0.0, 1.0}
    seen = [float(t["write_end"].max() - t["read_start"].min()) for t in traces]
    slow_time = sum(span for span, share in zip(seen, shares, strict=True) if share == 1.0)
    assert fitted["slow_ns"] == pytest.approx(slow_time, rel=0.01)
    assert fitted["fast_ns"] == pytest.approx(sum(seen) - slow_time, rel=0.01)


def test_repeats_are_fitted_together(tmp_path, capsys):
    """Repeats with episodes of 8 ms slow, 12 ms fast, 1.7×, in runs of about 25 ms: the
    factor within 5% and the lengths within 40% from all twelve together, the fast gradient
    within 5%; the same repeats give the same scenario; repeats of another problem are
    refused, and so are core speeds (which core is slow changes between runs)."""
    runs = _repeats(tmp_path, 12, "devices.0.slow_factor=1.7", "devices.0.slow_ns=8000000",
                    "devices.0.fast_ns=12000000")
    scenario, report = calibrate(runs, pool=True, cores=2, episodes="auto")
    episodes = scenario.hardware_of(0).episodes
    assert episodes is not None
    fitted = report["episodes"]
    assert episodes.factor == pytest.approx(1.7, rel=0.05), fitted
    assert episodes.slow_ns == pytest.approx(8_000_000, rel=0.4), fitted
    assert episodes.fast_ns == pytest.approx(12_000_000, rel=0.4), fitted
    assert scenario.timing_of(0).grad.mean == pytest.approx(6000, rel=0.05)
    assert fitted["runs"] == 12 and len(fitted["slow_share_per_run"]) == 12
    assert report["rows"] == 12 * 2000 and report["run"] == ", ".join(map(str, runs))
    assert calibrate(runs, pool=True, cores=2, episodes="auto")[0] == scenario
    other = _repeats(tmp_path / "other", 1, "problem.dim=20")[0]
    with pytest.raises(AsyngradError, match=f"{other} is not a repeat of {runs[0]}"):
        calibrate([runs[0], other], pool=True)
    with pytest.raises(AsyngradError, match="--speeds = 'on': fits one run"):
        calibrate(runs[:2], pool=True, cores=1, speeds="on")
