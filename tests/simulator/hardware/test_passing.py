"""Passing writes (``convoy_join`` = 0 with ``convoy_lost_*``): writes that meet keep their
own durations and lose only the coordinates drawn for the meeting, worked by hand against
the plain read-modify-write meeting; the pairs the engine records are the pairs the trace's
windows show; calibration gives the values back from a trace whose writes end apart."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.passing import lossy_spread
from simulator.fidelity.report import calibrated_toml
from simulator.metrics import write_pairs
from simulator.problems import make_problem
from simulator.trace import convoy_pairs
from tests.conftest import (
    check_meeting_losses,
    convoy_run,
    fitted,
    same_every_way,
    scenario,
    two_writers,
)

PASSING = ("convoy_join=0",)


def _steps(trace, sc):
    """w0 and the two threads' steps (both computed at w0: neither read saw a write)."""
    problem = make_problem(sc.problem)
    w0 = problem.initial()
    rows = {int(t): i for i, t in enumerate(trace["thread"])}
    return w0, [0.02 * problem.grad(w0, int(trace["sample"][rows[t]]))[0] for t in (0, 1)]


@pytest.mark.parametrize(("leader", "joiner"), [(1.0, 0.0), (0.0, 1.0)])
def test_passing_writes_keep_their_times_and_lose_the_shared_part_as_told(leader, joiner):
    """The joiner comes a quarter into the leader's write: both end when they would alone
    (11000 and 12000), and in the other three quarters the leader's (or the joiner's) store
    is lost."""
    sc = two_writers(f"convoy_lost_leader={leader}", f"convoy_lost_joiner={joiner}",
                     meet=PASSING)
    assert fitted(sc).passing and not fitted(sc).convoys
    trace = simulate(sc)
    rows = {int(t): i for i, t in enumerate(trace["thread"])}
    assert [int(trace["write_end"][rows[t]]) for t in (0, 1)] == [11000, 12000]
    assert trace["op_write_ns"].tolist() == [4000, 4000]
    assert "extra_write_drawn_ns" not in trace.arrays
    w0, (lead, join) = _steps(trace, sc)
    shared = np.arange(40) >= 10
    expected = (w0 - np.where(shared & (leader == 1), 0, lead)
                - np.where(shared & (joiner == 1), 0, join))
    assert np.array_equal(trace["w_final"], expected)
    assert convoy_pairs(trace).tolist() == [[0, 1, 1000, 0.75 * leader, 0.75 * joiner]]
    victim, winner = (rows[0], rows[1]) if leader else (rows[1], rows[0])
    assert trace["lost_blocks"][victim] == 1 and trace["overwrote"][winner] == 1


def test_without_the_losses_a_meeting_loses_the_first_step_whole():
    """The same meeting as two plain read-modify-writes: the joiner loaded before the
    leader stored, so its store overwrites every coordinate of the leader's step."""
    sc = two_writers(meet=())
    trace = simulate(sc)
    w0, (_, join) = _steps(trace, sc)
    assert np.array_equal(trace["w_final"], w0 - join)
    assert "extra_convoy_pairs" not in trace.arrays


def _passing(*extra):
    return scenario("run.threads=3", "run.updates=3000", "problem.dim=2000",
                    "timing.write.mean=4000", "timing.grad.mean=8000",
                    "timing.convoy_lost_leader=0.3", "timing.convoy_lost_joiner=0.2", *extra)


def test_lost_shares_and_lossy_meetings_match_the_scenario():
    """Two threads, constant writes: four meetings in ten lose anything, and those lose
    their shares of the shared part (1 − the leader's swept share); the write times are
    those of the same run without losses."""
    common = ("run.threads=2", "timing.write.dist=constant", "run.updates=4000")
    trace = simulate(_passing(*common, "timing.convoy_lost_pairs=0.4"))
    check_meeting_losses(trace, 4000, lossy=0.4, leader=0.3, joiner=0.2)
    plain = simulate(scenario("problem.dim=2000", "timing.write.mean=4000",
                              "timing.grad.mean=8000", *common))
    for name in ("write_start", "write_end", "read_start", "staleness"):
        assert np.array_equal(trace[name], plain[name]), name
    assert 0 < trace["lost_blocks"].sum() < plain["lost_blocks"].sum()


def test_recorded_pairs_are_the_pairs_the_windows_show():
    """Three threads: the engine's pairs are exactly the windows' (two writes that met and
    no third, :func:`write_pairs`), leader first, with the lag between their starts."""
    trace = same_every_way(_passing("metrics.exact=true"))
    pairs = convoy_pairs(trace)
    ws, we = trace["write_start"], trace["write_end"]
    lead, join, _, _ = write_pairs(ws, we, trace["thread"])
    uid = trace["uid"]
    assert len(pairs) > 50
    assert sorted(map(tuple, pairs[:, :2].astype(int).tolist())) == sorted(
        zip(uid[lead].tolist(), uid[join].tolist(), strict=True))
    by_uid = {int(u): i for i, u in enumerate(uid)}
    lags = [ws[by_uid[int(b)]] - ws[by_uid[int(a)]] for a, b in pairs[:, :2]]
    assert pairs[:, 2].tolist() == lags


def test_passing_writes_run_on_shared_cores_and_with_interference():
    """Unlike convoys, passing writes need no core of their own: a core pool and
    interference between phases change when writes meet, not how a meeting loses."""
    pooled = simulate(_passing("devices=[{name='cpu', cores=2}]", "run.updates=600"))
    assert convoy_pairs(pooled).size
    slowed = simulate(_passing("timing.write_under_write=0.5", "run.updates=600"))
    assert convoy_pairs(slowed).size and slowed["lost_blocks"].sum() > 0


@pytest.mark.parametrize(("override", "message"), [
    ("run.write_mode=atomic_add", "load_store"),
    ("run.store_grain=8", "store_grain"),
    ("problem.name=sparse_logistic", "dense writes"),
])
def test_writes_that_cannot_pass_are_refused(override, message):
    with pytest.raises(ScenarioError, match=message) as err:
        simulate(_passing(override))
    assert "hardware.passing" in str(err.value)


def test_calibration_recovers_passing_writes_from_a_simulated_trace(tmp_path):
    """Writes that end apart and lose coordinates: no convoy timing, the loss values back
    (how often a meeting loses within 0.08, the shares within 10%), and the write
    distribution fitted on every write (none is stretched)."""
    run = convoy_run(tmp_path, "passing", "timing.convoy_lost_leader=0.08",
                     "timing.convoy_lost_joiner=0.04", "timing.convoy_lost_pairs=0.4")
    calibrated, report = calibrate(run, pool=True)
    timing = fitted(calibrated)
    assert report["convoys"]["end_gap_over_start_gap"] > 0.5
    assert timing.passing and timing.convoy_join == 0 and timing.convoy_rest == 0
    assert timing.convoy_lost_pairs == pytest.approx(0.4, abs=0.08)
    assert timing.convoy_lost_leader == pytest.approx(0.08, rel=0.1)
    assert timing.convoy_lost_joiner == pytest.approx(0.04, rel=0.1)
    assert timing.write.mean == pytest.approx(4000, rel=0.05)
    simulate(calibrated)  # the calibrated scenario runs


def test_lossy_meetings_fall_with_the_lag_as_told():
    """convoy_lost_within = 0.2: a meeting where the leader had swept f of the block loses
    anything with probability 0.8·exp(−f/0.2) (binned: observed within 0.08)."""
    trace = simulate(_passing("run.threads=2", "timing.write.dist=constant",
                              "run.updates=6000", "timing.convoy_lost_pairs=0.8",
                              "timing.convoy_lost_within=0.2"))
    pairs = convoy_pairs(trace)
    front = pairs[:, 2] / 4000
    lossy = (pairs[:, 3] > 0) | (pairs[:, 4] > 0)
    for low, high in ((0.0, 0.1), (0.1, 0.3), (0.3, 0.6)):
        rows = (front >= low) & (front < high)
        assert rows.sum() > 80
        expected = np.mean(0.8 * np.exp(-front[rows] / 0.2))
        assert lossy[rows].mean() == pytest.approx(expected, abs=0.08)


def test_calibration_recovers_how_lossy_meetings_fall(tmp_path):
    """Given q·exp(−f/λ) the fit gives q and λ back; given one share for every lag it keeps
    one share (no fall-off fitted)."""
    run = convoy_run(tmp_path, "falling", "timing.convoy_lost_leader=0.08",
                     "timing.convoy_lost_joiner=0.04", "timing.convoy_lost_pairs=0.8",
                     "timing.convoy_lost_within=0.2", "run.updates=8000")
    timing = fitted(calibrate(run, pool=True)[0])
    assert timing.convoy_lost_pairs == pytest.approx(0.8, abs=0.12)
    assert timing.convoy_lost_within == pytest.approx(0.2, rel=0.3)
    flat = convoy_run(tmp_path, "flat", "timing.convoy_lost_leader=0.08",
                      "timing.convoy_lost_joiner=0.04", "timing.convoy_lost_pairs=0.4")
    flat_timing = fitted(calibrate(flat, pool=True)[0])
    assert flat_timing.convoy_lost_within == 0 and flat_timing.convoy_lost_spread == 0


def test_a_negative_fall_off_is_refused(capsys):
    from simulator.cli import main

    assert main(["simulate", "--out", "/nonexistent/x", "--set",
                 "timing.convoy_lost_leader=0.1", "--set", "timing.convoy_lost_within=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_lost_within" in err[0] and "-1" in err[0]


def _meeting_rates(trace, write_ns, size):
    """Each pair's lost coordinates over its shared part, for pairs that share at least
    half the block, and the coordinates it shared."""
    pairs = convoy_pairs(trace)
    shared = np.rint(np.clip(1 - pairs[:, 2] / write_ns, 0, 1) * size)
    lost = np.rint((pairs[:, 3] + pairs[:, 4]) * size)
    half = shared >= size / 2
    return lost[half] / shared[half], lost[half], shared[half], pairs[half]


def test_each_lossy_meeting_loses_at_its_own_beta_rate():
    """convoy_lost_spread = 0.4: the meetings' rates are Beta draws of mean 0.5 (0.3 + 0.2)
    whose variance is μ(1 − μ)ρ (the rates against scipy's Beta: KS distance under 0.08),
    split 3 : 2 between leader and joiner; without the spread every meeting loses close to
    0.5 of its shared part."""
    common = ("run.threads=2", "timing.write.dist=constant", "run.updates=4000")
    rates, _, _, pairs = _meeting_rates(
        simulate(_passing(*common, "timing.convoy_lost_spread=0.4")), 4000, 2000)
    assert rates.size > 300
    assert rates.mean() == pytest.approx(0.5, abs=0.03)
    assert rates.var() == pytest.approx(0.25 * 0.4, rel=0.15)
    rho = 0.4
    law = scipy.stats.beta(0.5 * (1 - rho) / rho, 0.5 * (1 - rho) / rho)
    assert scipy.stats.kstest(rates, law.cdf).statistic < 0.08
    assert pairs[:, 3].sum() / (pairs[:, 3] + pairs[:, 4]).sum() == pytest.approx(0.6, abs=0.03)
    alike, _, _, _ = _meeting_rates(simulate(_passing(*common)), 4000, 2000)
    assert alike.std() < 0.02 and alike.mean() == pytest.approx(0.5, abs=0.01)


def test_meetings_with_a_spread_are_deterministic_and_replay_bit_for_bit():
    first = same_every_way(_passing("timing.convoy_lost_spread=0.6",
                                    "timing.convoy_lost_pairs=0.5"))
    assert first["lost_blocks"].sum() > 0


def test_the_spread_fit_gives_back_beta_binomial_draws():
    """Meetings drawn with numpy (lossy with probability 0.6; then rate ~ Beta of mean 0.1,
    ρ = 0.3, lost ~ Binomial, which loses nothing for a fifth of them): q, μ and ρ back
    within 0.06, 10% and 15%; binomial draws (one rate) give no spread."""
    rng = np.random.default_rng(3)
    shared = rng.integers(500, 1000, size=1500).astype(np.float64)
    rho, mean = 0.3, 0.1
    rates = rng.beta(mean * (1 - rho) / rho, (1 - mean) * (1 - rho) / rho, size=shared.size)
    drawn = rng.random(shared.size) < 0.6
    lost = np.where(drawn, rng.binomial(shared.astype(np.int64), rates), 0)
    assert 0.15 < np.mean(lost[drawn] == 0) < 0.3
    fitted = lossy_spread(lost.astype(np.float64), shared)
    assert fitted is not None
    assert fitted[0] == pytest.approx(0.6, abs=0.06)
    assert fitted[1] == pytest.approx(mean, rel=0.1)
    assert fitted[2] == pytest.approx(rho, rel=0.15)
    alike = np.where(drawn, rng.binomial(shared.astype(np.int64), mean), 0).astype(np.float64)
    assert lossy_spread(alike, shared) is None
    assert lossy_spread(alike[:40], shared[:40]) is None  # too few lossy meetings


def test_calibration_recovers_the_spread_of_lossy_meetings(tmp_path):
    """Passing writes losing 0.08 / 0.04 at a spread of 0.3 in six meetings of ten: the
    spread, the shares and how often a meeting is drawn lossy come back, although a fifth
    of the lossy draws lose nothing (the fit counts them back)."""
    run = convoy_run(tmp_path, "spread", "timing.convoy_lost_leader=0.08",
                     "timing.convoy_lost_joiner=0.04", "timing.convoy_lost_pairs=0.6",
                     "timing.convoy_lost_spread=0.3", "run.updates=8000")
    calibrated, report = calibrate(run, pool=True)
    timing = fitted(calibrated)
    assert timing.convoy_lost_spread == pytest.approx(0.3, rel=0.25)
    assert timing.convoy_lost_leader == pytest.approx(0.08, rel=0.2)
    assert timing.convoy_lost_joiner == pytest.approx(0.04, rel=0.2)
    assert timing.convoy_lost_pairs == pytest.approx(0.6, abs=0.1)
    assert 0.1 < report["convoys"]["lossy_meetings_losing_nothing"] < 0.35
    assert "spread ρ" in calibrated_toml(calibrated, report)


def test_a_spread_of_one_is_refused(capsys):
    from simulator.cli import main

    assert main(["simulate", "--out", "/nonexistent/x", "--set",
                 "timing.convoy_lost_leader=0.1", "--set", "timing.convoy_lost_spread=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_lost_spread" in err[0] and "1" in err[0]
