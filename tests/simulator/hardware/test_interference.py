"""Interference (``timing.*_under_*``): a phase slows while other threads are in phases that
compete with it, by processor sharing. Checked against an independent inverse computed from
the trace's timeline, for determinism and replay, and for calibration recovering the values."""

from __future__ import annotations

import re

import numpy as np
import pytest

from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate, calibrate_counts
from simulator.fidelity.interference import _slower, fit_interference, under_times, undisturbed
from simulator.fidelity.report import _describe_interference
from simulator.fidelity.runs import load_run, running_together
from tests.conftest import check_fit_choice, fitted, same_every_way, scenario

PHASES = ("read=lognormal:2500:0.3", "grad=lognormal:16000:0.3",
          "write=lognormal:3500:0.3", "idle=lognormal:15000:0.3")
TIMING = tuple(f"timing.{p.split('=')[0]}={{dist='{p.split('=')[1].split(':')[0]}', "
               f"mean={p.split(':')[1]}, cv={p.split(':')[2]}}}" for p in PHASES)
SLOWED = {"read": (0.3, 0.0, 0.5), "grad": (0.0, 0.0, 0.3), "write": (0.0, 1.7, 0.0),
          "idle": (0.0, 0.2, 0.0)}
UNDER = tuple(f"timing.{p}_under_{q}={v}" for p, row in SLOWED.items()
              for q, v in zip(("read", "grad", "write"), row, strict=True) if v)


def _two(updates: int, *extra: str):
    return scenario("run.threads=2", f"run.updates={updates}", "run.split=even",
                    "metrics.exact=false", *TIMING, *extra)


def test_durations_are_processor_sharing_exactly():
    """Every phase's drawn duration, recovered from the trace alone (time under the other
    thread's read, gradient, write counts 1/(1 + slowdown)), equals the draw of the same
    seed without interference, to the nanosecond's rounding."""
    slowed, plain = simulate(_two(3000, *UNDER)), simulate(_two(3000))
    # The same update of the same thread in both runs (rows are in start order).
    order = [np.lexsort((t["thread_seq"], t["thread"])) for t in (slowed, plain)]
    for phase, column in (("read", "op_read_ns"), ("grad", "grad_ns"),
                          ("write", "op_write_ns"), ("idle", "idle_ns")):
        duration, under = under_times(slowed, order[0], phase)
        drawn = undisturbed(duration, under, np.array(SLOWED[phase]))
        plain_ns = plain[column][order[1]]
        assert np.max(np.abs(drawn - plain_ns)) < 1.0, phase
        assert np.mean(duration > plain_ns + 1) > 0.2, phase  # many were slowed


def test_interference_is_deterministic_and_replays():
    same_every_way(_two(1500, *UNDER, "metrics.exact=true"))



def test_blocks_of_a_few_nanoseconds_keep_durations_of_zero_or_more():
    """Four blocks of a few ns each, slowed: rescaling the block durations rounds each share
    up or down and the rounding left over goes to the last block, which could fall below 0
    (the run stopped with simpy's "Negative delay"); the earlier blocks give it back."""
    t = simulate(scenario(
        "run.threads=2", "run.updates=72", "run.blocks=4", "run.write_mode=atomic_add",
        "run.seed=770835", "problem.dim=23", "problem.n_samples=30",
        "timing.read={dist='exponential', mean=3}", "timing.grad={dist='exponential', mean=3}",
        "timing.write={dist='lognormal', mean=3, cv=0.8}",
        "inject.stragglers=[{thread=1, factor=3.0}]",
        "hardware.interference={read_under_write=0.5, write_under_write=0.3, "
        "grad_under_read=0.2}"))
    assert len(t) == 72 and t["op_read_ns"].min() >= 0 and t["op_write_ns"].min() >= 0

def test_interference_with_convoys_is_deterministic_and_replays():
    same_every_way(_two(1500, *UNDER, "timing.convoy_join=0.9", "timing.convoy_rest=2",
                        "timing.convoy_lost_leader=0.02", "problem.dim=1000",
                        "metrics.exact=true"))


def test_a_write_slowed_by_the_other_s_gradient_pulls_the_threads_into_phase():
    """The leader's write slows while the follower computes, so the follower catches up:
    writes meet more often than with independent durations."""
    def met(trace):
        starts, ends = trace["write_start"], trace["write_end"]
        order = np.argsort(starts)
        return float(np.mean(starts[order][1:] < ends[order][:-1]))

    assert met(simulate(_two(3000, "timing.write_under_grad=1.7"))) > 2 * met(
        simulate(_two(3000)))


def test_calibration_recovers_the_slowdowns():
    """Every one of the twelve slowdowns within 0.1 of the value simulated (0 where none),
    write under gradient within 10%: the gradient's and the idle time's too, which a long
    phase spent under the other's gradient in every group leaves to the pull toward none."""
    trace = simulate(_two(20000, *UNDER))
    report = fit_interference([(trace, running_together(trace), None)], "on")
    fields = report["fields"]
    assert fields["write_under_grad"] == pytest.approx(1.7, rel=0.1)
    for phase, row in SLOWED.items():
        for q, value in zip(("read", "grad", "write"), row, strict=True):
            if (phase, q) != ("write", "grad"):
                assert fields[f"{phase}_under_{q}"] == pytest.approx(value, abs=0.1), (phase, q)
            if value:  # a slowdown simulated is never taken for noise
                assert q not in report["phases"][phase]["within_noise"], (phase, q)
    assert "read" in report["phases"]["grad"]["within_noise"]  # simulated: none
    assert re.search(r"grad under read 0 \(\d+ rows, within noise\)",
                     _describe_interference(report))


def test_no_interference_fits_none():
    """Threads whose phases do not slow each other: every slowdown fitted is 0 (the groups'
    medians are within their noise of the idle group's, or the slowdown is left
    undetermined), and ``auto`` keeps none. Before the noise test and the pull toward none,
    the undetermined ones stayed at the search's start (gradient under read 0.48, idle
    under read 0.33) and ``auto`` kept them."""
    trace = simulate(_two(20000))
    rows = running_together(trace)
    assert max(fit_interference([(trace, rows, None)], "on")["fields"].values()) < 0.05
    auto = fit_interference([(trace, rows, None)], "auto")
    assert auto["fields"] is None and "no phase slowed" in auto["why"]


def test_a_group_is_slower_only_beyond_its_noise():
    rng = np.random.default_rng(0)
    duration = rng.lognormal(np.log(5000), 0.3, 4000)
    censored = np.zeros(duration.size, dtype=bool)
    group, quiet = np.arange(4000) < 2000, np.arange(4000) >= 2000
    assert not _slower(duration, censored, [(group, quiet)])
    shifted = np.where(group, duration * 1.05, duration)  # 5%: about 4 standard errors
    assert _slower(shifted, censored, [(group, quiet)])
    assert not _slower(np.where(group, duration / 1.05, duration), censored,
                       [(group, quiet)])
    few = np.arange(4000) < 40  # 40 rows: 5% is within the noise
    assert not _slower(np.where(few, duration * 1.05, duration), censored, [(few, quiet)])


def test_calibrate_fits_interference_or_says_why_not(tmp_path):
    run = tmp_path / "run"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=2",
                 *(arg for o in (*TIMING, "run.updates=4000", "metrics.exact=false",
                                 "timing.write_under_grad=1.7") for arg in ("--set", o))]) == 0
    calibrated, _ = calibrate(run, pool=True, interference="auto")
    timing = fitted(calibrated)
    assert timing.write_under_grad == pytest.approx(1.7, rel=0.15)
    # The write's draws are fitted as if the other thread were idle: the 3.5 µs drawn.
    assert timing.write.mean == pytest.approx(3500, rel=0.1)
    off, _ = calibrate(run, pool=True)  # off unless asked for
    assert fitted(off).interference is None
    check_fit_choice(run, tmp_path, "interference", "on",
                     "#   interference: slowdown per other worker")


def test_per_worker_calibration_keeps_the_measured_slowdowns(tmp_path):
    """Without ``--pool`` each worker gets a device of its own, where interference does not
    act: none is fitted (the report says why) and the durations keep it, so the calibrated
    scenario's writes take as long as the run's (with it taken out they came to 3,448 ns
    against the run's 5,322 ns)."""
    run = tmp_path / "run"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=2",
                 *(arg for o in (*TIMING, "run.updates=4000", "metrics.exact=false",
                                 "run.split=even", "timing.write_under_grad=1.7")
                   for arg in ("--set", o))]) == 0
    calibrated, report = calibrate(run, interference="auto")
    assert [d.name for d in calibrated.devices] == ["worker0", "worker1"]
    assert report["interference"]["fields"] is None
    assert "per-worker devices" in report["interference"]["why"]
    assert all(fitted(calibrated, d).interference is None for d in (0, 1))
    again = simulate(calibrated)
    took = again["write_end"] - again["write_start"]
    recorded = load_run(run).trace
    assert took.mean() == pytest.approx(
        (recorded["write_end"] - recorded["write_start"]).mean(), rel=0.05)


def test_calibration_with_core_speeds_keeps_the_measured_slowdowns(tmp_path):
    """With --speeds kept each core becomes a device of its own, where interference does
    not act either: the interference fitted first is not taken out of the durations, so
    the calibrated writes take as long as the run's (with it taken out they were short)."""
    run = tmp_path / "run"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=2",
                 *(arg for o in (*TIMING, "run.updates=4000", "metrics.exact=false",
                                 "devices=[{cores=2}]", "timing.write_under_grad=1.7")
                   for arg in ("--set", o))]) == 0
    pooled, report = calibrate(run, pool=True, cores=2, interference="auto")
    assert report["interference"]["fields"]  # fitted where the threads share a device
    calibrated, report = calibrate(run, pool=True, cores=2, interference="auto", speeds="on")
    assert [d.name for d in calibrated.devices] == ["core0", "core1"]
    assert report["speeds"]["kept"] and report["interference"]["fields"] is None
    assert "a device per core" in report["interference"]["why"]
    recorded = load_run(run).trace
    wrote = (recorded["write_end"] - recorded["write_start"]).mean()
    for fit in (pooled, calibrated):
        again = simulate(fit)
        assert (again["write_end"] - again["write_start"]).mean() == pytest.approx(wrote,
                                                                                  rel=0.05)


@pytest.mark.parametrize(("override", "field"), [
    (("timing.write_under_grad=-1",), "timing.write_under_grad"),
    (("timing.idle_under_read=nan",), "timing.idle_under_read"),
])
def test_bad_interference_is_refused(override, field):
    with pytest.raises(ScenarioError) as err:
        scenario(*override)
    assert field in str(err.value)


def test_convoys_with_interference_need_one_block():
    with pytest.raises(ScenarioError) as err:
        simulate(_two(100, "timing.write_under_grad=1", "timing.convoy_join=1",
                      "run.blocks=2", "problem.dim=1000"))
    assert "run.blocks" in str(err.value)


def test_bad_interference_is_one_line_and_exit_2(capsys):
    assert main(["simulate", "--out", "/nonexistent/x", "--set",
                 "timing.read_under_write=-0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.read_under_write" in err[0] and "-0.5" in err[0]


def test_worker_counts_without_interference_fit_none(tmp_path):
    """Runs at k = 1 and 2 whose phases do not slow each other, calibrated together with
    ``interference="auto"``: no slowdown is kept, and the gradient's draws stay those of the
    one-worker run (on the real MLP runs of docs/fidelity.md undetermined slowdowns took the
    two-worker gradients below the one-worker ones, and the calibration then simulated them
    1.5x as long)."""
    runs = []
    for k in (1, 2):
        runs.append(tmp_path / f"k{k}")
        assert main(["simulate", "--out", str(runs[-1]), "--quiet",
                     *(arg for o in (*TIMING, "run.updates=6000", "metrics.exact=false",
                                     f"run.threads={k}", "run.split=even")
                       for arg in ("--set", o))]) == 0
    calibrated, report = calibrate_counts(runs, interference="auto")
    timing = fitted(calibrated)
    assert timing.interference is None and report["interference"]["fields"] is None
    assert timing.grad.mean == pytest.approx(16000, rel=0.05)
    assert timing.grad_per_thread < 0.05
