"""Runs of one worker have no writes that meet: the meetings a real run's probe makes (two
writes of its vector by two processes on two CPUs, the second a lag after the first, the
stores each lost: ``real.write_meetings``) give ``calibrate`` the write convoys. The probe is
checked for what it must report whatever the machine; the fit on meetings made to a known
rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from realrun.host.probe import probe_cpus, write_meetings
from simulator.cli import main
from simulator.engine import simulate
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.convoys import probed_meetings
from simulator.scenario import with_overrides
from simulator.trace import convoy_pairs
from tests.conftest import fitted

pytestmark = pytest.mark.alone  # real processes, or the CPUs probed: see conftest

needs_two = pytest.mark.skipif(probe_cpus() is None, reason="needs two usable CPUs")


@needs_two
@pytest.mark.parametrize("itemsize", [4, 8])
def test_each_meeting_reports_its_times_and_stores_lost(itemsize):
    """Every element ends with both steps, or one: the lost stores are at most the vector.
    A second write that starts after the first ended meets nothing and loses nothing; the
    lags run past the meeting (on one of two probes: the lags are set from the first three
    rounds, and a host that slows the CPUs after them can make every later write outlast
    them, as it once did in CI)."""
    apart_seen = False
    for _ in range(2):
        probed = write_meetings(probe_cpus(), 3000, itemsize)
        assert probed is not None and probed["probed"] == probed["count"] == 3000
        rows = np.asarray(probed["rows"])
        assert rows.shape == (128, 6)
        a0, a1, b0, b1, lost_a, lost_b = rows.T
        assert (a0 >= 0).all() and (a0 < a1).all() and (b0 >= 0).all() and (b0 < b1).all()
        assert (lost_a >= 0).all() and (lost_b >= 0).all() and (lost_a + lost_b <= 3000).all()
        apart = b0 >= a1
        assert (lost_a[apart] == 0).all() and (lost_b[apart] == 0).all()
        assert (~apart).any()
        assert np.unique(b0 - a0).size > 30  # the 64 lags, give or take the clock's reading
        if apart.any():
            apart_seen = True
            break
    assert apart_seen


def test_the_meeting_probe_refuses_bad_arguments():
    with pytest.raises(ValueError, match="cpus: 1 and 1 are one CPU"):
        write_meetings([1, 1], 10, 8)
    with pytest.raises(ValueError, match="itemsize 2"):
        write_meetings([0, 1], 10, 2)
    with pytest.raises(ValueError, match="count 0"):
        write_meetings([0, 1], 0, 8)


@needs_two
def test_a_cpu_the_probe_cannot_have_gives_no_meetings():
    assert write_meetings([probe_cpus()[0], 100_000], 1000, 8) is None


@needs_two
def test_vectors_over_the_meeting_budget_are_not_probed(monkeypatch):
    import realrun.host.probe as probe

    monkeypatch.setattr(probe, "MEETING_BYTES", 8 * 1000)
    assert probe.write_meetings(probe_cpus(), 1001, 8) is None
    assert probe.write_meetings(probe_cpus(), 1000, 8)["probed"] == 1000


def _meetings(join: float, rest: float, gap: float, leader: float, joiner: float,
              lossy_below: float = 1.0, catch_up: float = 0.0) -> dict:
    """Meetings made to a known rule: the first write alone takes 1000 ns, the second 800;
    a second write that starts ``lag`` < 1000 ns after the first ends ``gap``·lag after the
    first, which ends at lag + join·800 + rest·(1000 − lag); where the first had swept less
    than ``lossy_below`` at the lag, they lose ``leader`` and ``joiner`` of the shared part
    (1 − lag/1000 of the 10,000 elements). With ``catch_up`` the second ends
    gap·max(0, lag − catch_up) after the first."""
    rows = []
    for lag in range(0, 2000, 25):
        if lag >= 1000:
            rows.append([0, 1000, lag, lag + 800, 0, 0])
            continue
        end = lag + join * 800 + rest * (1000 - lag)
        part = (1 - lag / 1000) * 10_000
        lossy = lag / 1000 < lossy_below
        rows.append([0, round(end), lag, round(end + gap * max(0, lag - catch_up)),
                     round(leader * part) if lossy else 0, round(joiner * part) if lossy else 0])
    return {"cpus": [0, 1], "count": 10_000, "probed": 10_000, "itemsize": 8, "rows": rows}


def test_meetings_made_to_a_known_rule_give_it_back():
    report = probed_meetings([_meetings(0.5, 1.0, 0.1, 0.08, 0.02)], "auto")
    fields = report["fields"]
    assert report["probes"] == 1 and report["pairs"] == 40
    assert fields["convoy_join"] == pytest.approx(0.5, abs=0.01)
    assert fields["convoy_rest"] == pytest.approx(1.0, abs=0.01)
    assert fields["convoy_end_gap"] == pytest.approx(0.1, abs=0.01)
    assert fields["convoy_lost_pairs"] == pytest.approx(1.0)
    assert fields["convoy_lost_leader"] == pytest.approx(0.08, rel=0.05)
    assert fields["convoy_lost_joiner"] == pytest.approx(0.02, rel=0.05)


def test_meetings_that_end_together_up_to_a_lag_give_the_catch_up_back():
    report = probed_meetings([_meetings(0.5, 1.0, 0.9, 0.08, 0.02, catch_up=300)], "auto")
    fields = report["fields"]
    assert report["end_gap_hinge"]["kept"]
    assert fields["convoy_end_gap"] == pytest.approx(0.9, abs=0.02)
    assert fields["convoy_end_catch_up"] == pytest.approx(300, abs=10)
    assert fields["convoy_join"] == pytest.approx(0.5, abs=0.01)
    plain = probed_meetings([_meetings(0.5, 1.0, 0.1, 0.08, 0.02)], "auto")["fields"]
    assert plain["convoy_end_catch_up"] == 0.0


def test_a_meeting_loses_by_its_lag_in_ns_at_the_runs_write():
    """The run's writes take 4000 ns, the probe's 1000: a meeting at lag l sits at the front
    l/4000 of a simulated write, whose shared part 1 − l/4000 must lose what the probe's
    1 − l/1000 lost. Lags 0, 25, …, 975: the share is 0.08 · 20.5 / 35.125."""
    fields = probed_meetings([_meetings(0.5, 1.0, 0.1, 0.08, 0.02)], "on", 4000.0)["fields"]
    assert fields["convoy_lost_leader"] == pytest.approx(0.08 * 20.5 / 35.125)
    assert fields["convoy_lost_joiner"] == pytest.approx(0.02 * 20.5 / 35.125)
    assert fields["convoy_join"] == pytest.approx(0.5, abs=0.01)  # durations: the probe's


def test_meetings_that_end_apart_are_passing_writes():
    """A second write that ends long after the first (gap 2 × lag): they pass each other,
    keep their own times, and lose as measured."""
    report = probed_meetings([_meetings(0.5, 1.0, 2.0, 0.05, 0.05, lossy_below=0.5)], "auto")
    fields = report["fields"]
    assert fields["convoy_join"] == 0 and fields["convoy_rest"] == 0
    assert fields["convoy_lost_leader"] > 0 and fields["convoy_lost_joiner"] > 0
    # The late half of the lags lost nothing: losses fall with the share swept.
    assert fields["convoy_lost_pairs"] == 1 and 0 < fields["convoy_lost_within"] < 1


def test_no_probe_and_probes_without_a_write_alone_fit_nothing():
    assert "no probe" in probed_meetings([None], "auto")["why"]
    every = _meetings(0.5, 1.0, 0.1, 0.08, 0.02)
    every["rows"] = [row for row in every["rows"] if row[2] < 1000]
    assert "no time alone" in probed_meetings([every], "auto")["why"]


def test_one_worker_takes_its_convoys_from_the_probe(tmp_path):
    """A simulated run of one worker, given the probe record a real one writes: calibrate
    fits the convoys the meetings follow (the probe's own times: the
    run's writes take 4000 ns, the probe's 1000, and a meeting loses by its lag in ns, so
    the shares are the probe's), and the calibrated scenario at two threads forms them."""
    run = tmp_path / "one"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=1",
                 "--set", "run.updates=500", "--set", "metrics.exact=false",
                 "--set", "problem.dim=1000",
                 "--set", "timing.write={dist='constant', mean=4000}",
                 "--set", "timing.grad={dist='lognormal', mean=9000, cv=0.3}"]) == 0
    plain, report = calibrate(run, pool=True, convoys="on")
    assert fitted(plain).convoy_join == 0
    assert "no probe" in report["convoys"]["why"]
    summary = json.loads((run / "summary.json").read_text())
    summary["real"] = {"write_meetings": _meetings(0.5, 1.0, 0.1, 0.08, 0.02)}
    (run / "summary.json").write_text(json.dumps(summary))
    calibrated, report = calibrate(run, pool=True)  # auto: they end together, convoys
    assert calibrate(run, pool=True, convoys="on")[0] == calibrated
    timing = fitted(calibrated)
    assert report["convoys"]["probes"] == 1
    assert timing.convoy_join == pytest.approx(0.5, abs=0.01)
    assert timing.convoy_lost_leader == pytest.approx(0.08 * 20.5 / 35.125)
    two = simulate(with_overrides(calibrated, ["run.threads=2", "run.updates=2000"]))
    pairs = convoy_pairs(two)
    assert pairs.shape[0] > 50 and (pairs[:, 3] > 0).any()  # they meet and lose stores
    assert fitted(calibrate(run, pool=True, convoys="off")[0]).convoy_join == 0


def test_the_probe_sides_start_without_the_runner():
    """Each side of the meeting probe is a spawned process that imports realrun.host.probe: the
    package loads the runner (and the simulator behind it) only when its names are used."""
    import subprocess
    import sys

    code = ("import sys, realrun.host.probe; assert 'realrun.runner' not in sys.modules; "
            "import realrun; realrun.run_real; assert 'realrun.runner' in sys.modules; "
            "print(sorted(realrun.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['MODES', 'RealRun', 'run_real']"
    import realrun

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        realrun.nothing  # noqa: B018
