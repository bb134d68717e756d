"""Calibration recovers known timing distributions from simulated traces."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import AsyngradError
from simulator.fidelity.calibrate import calibrate, calibrate_counts
from simulator.fidelity.compare import compare_runs
from simulator.fidelity.durations import fit_durations
from simulator.replay import load_trace
from simulator.scenario import load_scenario
from tests.conftest import fitted


def _source(tmp_path, *overrides):
    out = tmp_path / "source"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=3000",
                 "--set", "run.threads=2",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return out


@pytest.mark.parametrize("family", ["lognormal", "gamma"])
def test_recovers_known_distributions_within_ten_percent(tmp_path, family):
    timing = {"read": (2000, 0.3), "grad": (6000, 0.5), "write": (3000, 0.25)}
    run = _source(tmp_path, "run.blocks=4", *(
        f"timing.{op}={{dist='{family}', mean={m}, cv={cv}}}" for op, (m, cv) in timing.items()))
    scenario, report = calibrate(run)
    assert [d.name for d in scenario.devices] == ["worker0", "worker1"]
    for device in scenario.devices:
        assert device.timing is not None
        for op, (mean, cv) in timing.items():
            fitted = getattr(device.timing, op)
            assert fitted.dist == family, (op, report["fits"])
            assert fitted.mean == pytest.approx(mean, rel=0.1)
            assert fitted.cv == pytest.approx(cv, rel=0.1)


def test_sparse_blocks_are_scaled_by_the_support_they_move(tmp_path):
    run = _source(tmp_path, "problem.name=sparse_logistic", "problem.dim=200",
                  "problem.density=0.05", "run.blocks=5",
                  "timing.read={dist='lognormal', mean=4000, cv=0.2}")
    scenario, _ = calibrate(run)
    assert fitted(scenario).read.mean == pytest.approx(4000, rel=0.1)


def test_a_gradient_phase_of_several_gradients_gives_one_gradients_duration(tmp_path):
    """ADMM's gradient phase is ``admm.local_steps`` gradients: calibration fits one
    gradient's duration, so the calibrated scenario's phase is as long as the run's."""
    run = _source(tmp_path, "run.protocol=admm", "admm.local_steps=8", "run.updates=600",
                  "timing.grad={dist='lognormal', mean=5000, cv=0.3}")
    scenario, _ = calibrate(run)
    assert fitted(scenario).grad.mean == pytest.approx(5000, rel=0.1)


def test_neither_family_fits_a_bimodal_sample():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(1000, 30, 800), rng.normal(5000, 100, 800)])
    fit = fit_durations(values)
    assert fit.duration.dist == "empirical" and len(fit.duration.values) == 512
    assert fit.duration.mean == pytest.approx(values.mean(), rel=0.01)
    assert all(c["p"] < 0.01 for c in fit.candidates.values())
    assert fit_durations(np.full(10, 700.0)).duration.dist == "constant"


def test_calibrated_scenario_reproduces_the_run(tmp_path):
    """Simulate, calibrate, simulate the calibrated scenario: the staleness distribution and
    error rate of the original come back (KS distance small)."""
    run = _source(tmp_path)
    out = tmp_path / "calibrated.toml"
    assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 0
    text = out.read_text()
    assert text.startswith("# asyngrad-lab calibrated scenario") and "worker 1 grad" in text
    scenario = load_scenario(out)
    assert scenario.name == "default-calibrated"
    assert main(["simulate", str(out), "--out", str(tmp_path / "again"), "--quiet",
                 "--set", "run.seed=7"]) == 0
    report = compare_runs(run, tmp_path / "again")
    assert report["staleness"]["ks_distance"] < 0.05
    assert report["staleness"]["relative_mean_gap"] < 0.05
    assert report["gradient_error"]["rate_gap"] < 0.05


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path, capsys):
    keep = tmp_path / "mine.toml"
    keep.write_text("precious = true\n")
    run = _source(tmp_path)
    for args, needle in ((["calibrate", str(tmp_path / "nope"), "--out", str(tmp_path / "x")],
                          "not a run directory"),
                         (["calibrate", str(run), "--out", str(keep)],
                          "is not a calibrated scenario"),
                         (["calibrate", str(run), "--out", str(tmp_path / "x"), "--quantum",
                           "4ms"], "--quantum = '4ms'"),
                         (["calibrate", str(run), "--out", str(tmp_path / "x"), "--migrate",
                           "auto"], "--migrate = 'auto': needs --cores, --quantum"),
                         (["calibrate", str(run), "--out", str(tmp_path / "x"), "--pool",
                           "--cores", "2", "--quantum", "4000000", "--migrate", "80ms"],
                          "--migrate = '80ms': must be ns"),
                         (["calibrate", str(run), "--out", str(tmp_path / "x"), "--migrate",
                           "80ms"], "--migrate = '80ms': must be ns")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
    assert keep.read_text() == "precious = true\n"
    assert not (tmp_path / "x").exists()


def test_a_scheduled_run_is_not_calibrated(tmp_path, capsys):
    """explore's run directories count steps, not ns: calibrating one fitted "1 ns"
    timings with exit 0 (replay refuses the same trace)."""
    sets = [a for o in ("problem.dim=4", "run.threads=2", "run.updates=20",
                        "metrics.curve_points=0") for a in ("--set", o)]
    assert main(["explore", "--out", str(tmp_path / "ex"), "--runs", "2", "--quiet",
                 *sets]) == 0
    assert main(["calibrate", str(tmp_path / "ex" / "worst"), "--out",
                 str(tmp_path / "cal.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recorded under a scheduler" in err[0], err
    assert not (tmp_path / "cal.toml").exists()


def test_pooled_calibration_shares_cores_between_threads(tmp_path):
    run = _source(tmp_path)
    scenario, report = calibrate(run, pool=True, cores=2, quantum=4_000_000)
    assert len(scenario.devices) == 1 and scenario.devices[0].cores == 2
    # Threads beyond the cores stay on their core in OS-like time slices, which stop an
    # action midway as a timer interrupt does.
    slices = scenario.hardware_of(0).time_slices
    assert slices is not None
    assert (slices.quantum, slices.slicing, slices.preempt) == (4_000_000, "per_core", True)
    assert calibrate(run, pool=True, cores=2)[0].hardware_of(0).time_slices is None
    assert list(report["fits"]) == ["all workers"]
    assert fitted(scenario).grad.mean == pytest.approx(6000, rel=0.1)


def test_calibrate_migrate_sets_the_balancer_of_sliced_devices(tmp_path):
    """``--migrate NS`` puts the load balancer's mean interval on the per-core sliced device
    and says so in the file's comments; a run simulated from the file has it."""
    run = _source(tmp_path)
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(run), "--out", str(out), "--pool", "--cores", "2",
                 "--quantum", "4000000", "--migrate", "80000000", "--quiet"]) == 0
    text = out.read_text()
    assert "#   load balancer: 80 ms between moves (given)" in text
    slices = load_scenario(out).hardware_of(0).time_slices
    assert slices is not None
    assert (slices.migrate, slices.slicing, slices.quantum) == (80_000_000, "per_core",
                                                                4_000_000)


def _as_real(run, **real):
    """``run`` with a real backend's summary section, as ``asyngrad real`` writes it."""
    import json

    summary = json.loads((run / "summary.json").read_text())
    summary["real"] = {"backend": "shm", "host": platform.node(), "cpus": None, **real}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_calibrate_measures_the_balancer_by_default_only_where_it_moved_the_runs(
        tmp_path, monkeypatch):
    """Not given, ``--migrate`` is ``auto`` for real runs of unpinned CPU processes made on
    this host, with per-core time slices; otherwise 0, and with per-core slices the file
    says why, as it does when the measurement fails. ``--migrate 0`` still leaves the balancer
    out; ``--migrate auto`` that cannot measure is an error."""
    import realrun.host.timeslice

    asked = []

    def measured(cores, quantum):
        asked.append((cores, quantum))
        return 93_000_000, 31

    monkeypatch.setattr(realrun.host.timeslice, "measure_migration", measured)
    sliced = ["--pool", "--cores", "2", "--quantum", "4000000", "--quiet"]

    files = iter(range(100))

    def balancer(run, *options):
        out = tmp_path / f"cal{next(files)}.toml"
        assert main(["calibrate", str(run), "--out", str(out), *options]) == 0
        slices = load_scenario(out).hardware_of(0).time_slices
        lines = [x for x in out.read_text().splitlines() if x.startswith("#   load balancer")]
        return (slices.migrate if slices else None), lines

    simulated = _source(tmp_path)
    migrate, lines = balancer(simulated, *sliced)
    assert migrate == 0 and not asked
    assert lines == [f"#   load balancer: none: not measured, as {simulated} is not a real run "
                     "(--migrate auto measures this machine's balancer, --migrate NS gives one)"]
    assert balancer(simulated, "--quiet") == (None, [])  # no time slices: nothing to say
    here = _as_real(_source(tmp_path / "here"))
    migrate, lines = balancer(here, *sliced)
    assert migrate == 93_000_000 and asked == [(2, 4_000_000)]
    assert lines[0].startswith("#   load balancer: 93 ms between moves, measured on this machine")
    assert balancer(here, *sliced, "--migrate", "0") == (0, [])
    assert balancer(here, *sliced, "--slicing", "global")[0] == 0
    for real, why in (({"host": "elsewhere"}, "does not say it ran on this host"),
                      ({"cpus": [0, 1]}, "workers were pinned"),
                      ({"backend": "ps"}, "ran on the ps backend")):
        run = _as_real(_source(tmp_path / why.split()[-1]), **real)
        migrate, lines = balancer(run, *sliced)
        assert migrate == 0 and why in lines[0], lines
    assert len(asked) == 1

    def failed(cores, quantum):
        raise AsyngradError("--migrate auto: no two spinning processes were seen sharing a "
                            "core; give the mean interval in ns")

    monkeypatch.setattr(realrun.host.timeslice, "measure_migration", failed)
    migrate, lines = balancer(here, *sliced)  # the default: said, and the fit goes on
    assert migrate == 0 and lines[0].startswith("#   load balancer: none: the measurement "
                                                "failed (--migrate auto: no two spinning")
    assert main(["calibrate", str(here), "--out", str(tmp_path / "x.toml"), *sliced,
                 "--migrate", "auto"]) == 2  # asked for: an error


def test_idle_time_between_updates_is_simulated_and_recovered(tmp_path):
    """Local work before each update lengthens the cycle but not the read-to-write window,
    so it lowers staleness; calibration recovers it."""
    busy = _source(tmp_path, "timing.idle={dist='gamma', mean=3000, cv=0.4}")
    scenario, _ = calibrate(busy)
    idle = fitted(scenario).idle
    assert idle.dist == "gamma" and idle.mean == pytest.approx(3000, rel=0.1)
    report = compare_runs(tmp_path / "source", busy)  # itself: zero distance
    assert report["staleness"]["ks_distance"] == 0
    plain = tmp_path / "plain"
    assert main(["simulate", "--out", str(plain), "--quiet", "--set", "run.updates=3000",
                 "--set", "run.threads=2"]) == 0
    gap = compare_runs(plain, busy)["staleness"]
    assert gap["mean_b"] < 0.8 * gap["mean_a"]


CONTENTION = {"read": 0.2, "grad": 0.05, "write": 0.3, "idle": 0.1}


def _at(tmp_path, threads, *overrides):
    out = tmp_path / f"k{threads}"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=3000",
                 "--set", f"run.threads={threads}", "--set", "timing.idle={dist='gamma', "
                 "mean=1500, cv=0.4}",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return out


def test_contention_per_worker_is_recovered_from_three_worker_counts(tmp_path):
    """Runs at k = 1, 2, 4 with known slowdowns per other worker: calibrate fits each within
    10% and the one-worker distributions within 10% of their means."""
    slow = [f"timing.{op}_per_thread={x}" for op, x in CONTENTION.items()]
    runs = [_at(tmp_path, k, *slow) for k in (1, 2, 4)]
    scenario, report = calibrate_counts(runs[::-1], cores=4)
    assert report["worker_counts"] == [1, 2, 4]
    (device,) = scenario.devices
    assert device.cores == 4 and device.timing is not None
    for op, x in CONTENTION.items():
        assert getattr(device.timing, f"{op}_per_thread") == pytest.approx(x, rel=0.1)
    for op, mean in (("read", 2000), ("grad", 6000), ("write", 2000), ("idle", 1500)):
        assert getattr(device.timing, op).mean == pytest.approx(mean, rel=0.1)


def test_contention_is_not_taken_for_interference(tmp_path):
    """Runs at k = 1, 2, 4 with contention and no interference, calibrated with the command's
    defaults (``--interference auto --shared auto``): no slowdown is kept and the contention
    comes back within 10%. With every run's rows pooled, the rows whose other workers were
    idle were mostly the k = 1 and 2 runs', and interference took the contention (write per
    thread 0.10 for 0.5)."""
    slow = [f"timing.{op}_per_thread={x}" for op, x in CONTENTION.items()]
    runs = [_at(tmp_path, k, *slow) for k in (1, 2, 4)]
    scenario, report = calibrate_counts(runs, cores=4, interference="auto", shared="auto")
    assert report["interference"]["fields"] is None
    timing = fitted(scenario)
    assert timing.interference is None and timing.write_shared == 1
    for op, x in CONTENTION.items():
        assert getattr(timing, f"{op}_per_thread") == pytest.approx(x, rel=0.1)


def test_slowdown_scales_draws_by_the_workers_running_at_once():
    """grad_per_thread x at k threads scales gradients by 1 + x(k − 1); with fewer cores
    than threads only the cores' worth of workers contend."""
    from simulator.engine import simulate

    base = simulate(load_scenario(None, ["run.threads=3", "run.updates=3000"]))
    slow = simulate(load_scenario(None, ["run.threads=3", "run.updates=3000",
                                         "timing.grad_per_thread=0.5"]))
    capped = simulate(load_scenario(None, ["run.threads=3", "run.updates=3000",
                                           "timing.grad_per_thread=0.5",
                                           "devices=[{cores=2}]"]))
    ratio = slow["grad_ns"].mean() / base["grad_ns"].mean()
    assert ratio == pytest.approx(2.0, rel=0.02)
    assert capped["grad_ns"].mean() / base["grad_ns"].mean() == pytest.approx(1.5, rel=0.02)
    same = simulate(load_scenario(None, ["run.threads=3", "run.updates=3000",
                                         "timing.grad_per_thread=0.0"]))
    assert np.array_equal(same["write_end"], base["write_end"])


def test_contention_needs_distinct_worker_counts_of_one_problem(tmp_path, capsys):
    one, two = _at(tmp_path, 1), _at(tmp_path, 2)
    other = tmp_path / "other"
    assert main(["simulate", "--out", str(other), "--quiet", "--set", "run.updates=500",
                 "--set", "problem.dim=20"]) == 0
    for runs, needle in (([one], "two or more worker counts"), ([one, one], "repeat"),
                         ([one, other], "another problem")):
        with pytest.raises(AsyngradError, match=needle):
            calibrate_counts(runs)
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(one), str(two), "--cores", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "contention, write: ×(1 + " in text and "write_per_thread = " in text
    assert main(["simulate", str(out), "--set", "run.threads=3", "--out",
                 str(tmp_path / "predicted"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(one), str(one), "--out", str(tmp_path / "x.toml")]) == 2
    assert capsys.readouterr().err.strip() == f"asyngrad: error: RUN = '{one}': given twice"
    assert not (tmp_path / "x.toml").exists()


def test_a_gamma_fit_is_written_as_valid_toml(tmp_path):
    """Calibrated files are read back: a gamma winner's parameters are plain numbers."""
    run = _source(tmp_path, "timing.grad={dist='gamma', mean=6000, cv=0.5}")
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 0
    assert "np.float64" not in out.read_text()
    assert 'grad = { dist = "gamma"' in out.read_text()
    assert main(["simulate", str(out), "--out", str(tmp_path / "again"), "--quiet"]) == 0


def test_the_fit_says_whether_the_workers_kept_a_common_rhythm(tmp_path):
    # Independent draws give the independent-phase staleness; a lock gives none at all, the
    # extreme of workers that avoid each other's windows.
    free = _source(tmp_path)
    locked = tmp_path / "locked"
    assert main(["simulate", "--out", str(locked), "--quiet", "--set", "run.updates=1000",
                 "--set", "run.threads=2", "--set", "run.protocol=locked"]) == 0
    for run, said in ((free, "(phases independent, as simulated)"),
                      (locked, "the workers kept a common rhythm")):
        out = tmp_path / f"{run.name}.toml"
        assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 0
        line = next(x for x in out.read_text().splitlines() if x.startswith("#   rhythm:"))
        assert "k = 2: staleness" in line and said in line, line
    _, report = calibrate(free)
    assert report["rhythm"]["2"]["coupling"] == pytest.approx(1.0, abs=0.05)
    assert calibrate(locked)[1]["rhythm"]["2"]["coupling"] == 0.0


def _two_speeds(tmp_path):
    """Two threads, each on a core of its own: one 1.25× as fast, one 0.8×."""
    return _source(tmp_path, "timing.grad={dist='lognormal', mean=6000, cv=0.3}",
                   "devices=[{name='fast', speed=1.25, cores=1}, "
                   "{name='slow', speed=0.8, cores=1}]")


def test_core_speeds_are_recovered_and_simulated(tmp_path):
    run = _two_speeds(tmp_path)
    scenario, report = calibrate(run, pool=True, cores=2, speeds="auto")
    pace = report["speeds"]
    assert pace["kept"] and pace["spread"] == pytest.approx(1.5625, rel=0.05)
    assert pace["speeds"] == pytest.approx([1.25, 0.8], rel=0.05)  # geometric mean 1
    assert [(d.name, d.cores, d.speed) for d in scenario.devices] == [
        ("core0", 1, pace["speeds"][0]), ("core1", 1, pace["speeds"][1])]
    assert fitted(scenario).grad.mean == pytest.approx(6000, rel=0.1)
    # Simulated again, each thread keeps its own pace and the run its staleness.
    source, again = load_trace(run), simulate(scenario)
    for thread in (0, 1):
        assert (again["grad_ns"][again["thread"] == thread].mean() == pytest.approx(
            source["grad_ns"][source["thread"] == thread].mean(), rel=0.05))
    assert again["staleness"].mean() == pytest.approx(source["staleness"].mean(), rel=0.1)
    # Pooled without speeds, both threads run at the average pace.
    pooled, _ = calibrate(run, pool=True, cores=2)
    assert len(pooled.devices) == 1 and pooled.devices[0].speed == 1.0


def test_core_speeds_are_kept_only_where_they_differ_and_fit(tmp_path, capsys):
    alike = _source(tmp_path)
    _, report = calibrate(alike, pool=True, cores=2, speeds="auto")
    assert not report["speeds"]["kept"] and "within 1.1×" in report["speeds"]["why"]
    with pytest.raises(AsyngradError, match="--speeds = 'on': needs one worker per core: "
                                            "2 workers, --cores 4"):
        calibrate(alike, pool=True, cores=4, speeds="on")
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(_two_speeds(tmp_path / "b")), "--pool", "--cores", "2",
                 "--speeds", "auto", "--out", str(out), "--quiet"]) == 0
    assert "#   core speeds: 1.2" in out.read_text()
    capsys.readouterr()
    repeat = _source(tmp_path / "repeat", "run.seed=1")
    assert main(["calibrate", str(alike), str(repeat), "--speeds", "on", "--out",
                 str(tmp_path / "two.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyngrad: error: --speeds = 'on': fits one run") and "\n" not in err
    assert not (tmp_path / "two.toml").exists()


def test_the_calibrated_file_says_how_far_apart_the_runs_cpus_were(tmp_path):
    """A real run's ``real.cpu_latency`` goes into the calibrated file's comments (the host's
    placement of the CPUs is part of the machine the fit describes); a simulated run has none."""
    import json

    run = _source(tmp_path)
    plain = tmp_path / "plain.toml"
    assert main(["calibrate", str(run), "--out", str(plain), "--quiet"]) == 0
    assert "CPUs of" not in plain.read_text()
    summary = json.loads((run / "summary.json").read_text())
    summary["real"] = {"cpu_latency": {"cpus": [0, 1], "before_ns": 182.4, "after_ns": 176.0}}
    (run / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "calibrated.toml"
    assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 0
    assert (f"#   CPUs of {run}: a cache line passes between CPUs 0 and 1 in 182 ns before the "
            "run, 176 ns after (far apart; far from 150 ns)") in out.read_text()
    load_scenario(out)  # still a valid scenario
    assert "placements differ" not in out.read_text()
    # A repeat whose CPUs were near: fitted together, the file says the placements differ.
    near = _source(tmp_path / "near", "run.seed=1")
    summary = json.loads((near / "summary.json").read_text())
    summary["real"] = {"cpu_latency": {"cpus": [0, 1], "before_ns": 40.0, "after_ns": 52.0}}
    (near / "summary.json").write_text(json.dumps(summary))
    assert main(["calibrate", str(run), str(near), "--out", str(out), "--quiet"]) == 0
    assert ("#   placements differ between the runs (near 1, far 1): fitted together"
            in out.read_text())


def test_an_unusable_out_path_is_one_line_before_the_fit(tmp_path, capsys, monkeypatch):
    """A binary --out file or one under a file is refused in one line before any fit."""
    import sys

    module = sys.modules["simulator.fidelity.calibrate"]  # the package exports its function
    run = _source(tmp_path)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(bytes([0x39, 0xdc, 0x1f, 0x24, 0xff]))
    monkeypatch.setattr(module, "calibrate", lambda *a, **k: pytest.fail("calibrated"))
    for out, needle in ((binary, "exists and is not a calibrated scenario"),
                        (binary / "sub.toml", f"{binary} is not a directory"),
                        (binary / "a" / "sub.toml", f"{binary} is not a directory")):
        assert main(["calibrate", str(run), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--out = '{out}'" in err[0] and needle in err[0]
    assert binary.read_bytes() == bytes([0x39, 0xdc, 0x1f, 0x24, 0xff])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
