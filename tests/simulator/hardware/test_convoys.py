"""Write convoys (``timing.convoy_*``): simulated timing and lost coordinates worked by hand,
their calibration from a trace, and the real backend's coordinate-by-coordinate
classification of what two writes that met lost."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from realrun.rebuild import convoy_losses
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.compare import LAG_EDGES, OFFSET_EDGES, meeting_lags, offsets
from simulator.fidelity.convoys import end_gap_hinge
from simulator.fidelity.durations import Survival
from simulator.fidelity.report import cell
from simulator.fidelity.runs import alone_writes, load_run, running_together, write_survival
from simulator.metrics import write_pairs
from simulator.problems import make_problem
from simulator.replay import replay
from simulator.trace import convoy_pairs
from tests.conftest import (
    check_meeting_losses,
    convoy_run,
    detail_cells,
    fitted,
    same_every_way,
    scenario,
    two_writers,
)

CONVOY = ("timing.convoy_join=1.5", "timing.convoy_rest=2.0")


def test_a_write_that_joins_another_ends_with_it():
    """The joiner starts 1000 ns into the leader's 4000: both end at 8000 + 1.5·4000 +
    2.0·(11000 − 8000) = 20000, and the trace records the stretched durations."""
    trace = simulate(two_writers())
    rows = {int(t): i for i, t in enumerate(trace["thread"])}
    assert [int(trace["write_start"][rows[t]]) for t in (0, 1)] == [7000, 8000]
    assert [int(trace["write_end"][rows[t]]) for t in (0, 1)] == [20000, 20000]
    assert sorted(trace["op_write_ns"].tolist()) == [12000, 13000]
    assert trace["extra_write_drawn_ns"].tolist() == [4000, 4000]
    assert convoy_pairs(trace).tolist() == [[0, 1, 1000, 0, 0]]
    # Nothing lost: both steps computed at w0 land whole.
    problem = make_problem(two_writers().problem)
    w0 = problem.initial()
    steps = [0.02 * problem.grad(w0, int(trace["sample"][rows[t]]))[0] for t in (0, 1)]
    assert np.allclose(trace["w_final"], w0 - steps[0] - steps[1], rtol=0, atol=1e-15)
    assert trace["lost_blocks"].tolist() == [0, 0]


def test_a_joiner_trails_the_convoys_end_by_the_end_gap():
    """With convoy_end_gap = 0.25 the joiner, 1000 ns after the leader, ends 250 ns after the
    convoy's end (20000); the leader ends with the convoy; both steps land whole."""
    trace = simulate(two_writers("convoy_end_gap=0.25"))
    rows = {int(t): i for i, t in enumerate(trace["thread"])}
    assert [int(trace["write_end"][rows[t]]) for t in (0, 1)] == [20000, 20250]
    assert convoy_pairs(trace).tolist() == [[0, 1, 1000, 0, 0]]
    problem = make_problem(two_writers().problem)
    w0 = problem.initial()
    steps = [0.02 * problem.grad(w0, int(trace["sample"][rows[t]]))[0] for t in (0, 1)]
    assert np.allclose(trace["w_final"], w0 - steps[0] - steps[1], rtol=0, atol=1e-15)


def test_convoys_with_an_end_gap_are_deterministic_and_replay_bit_for_bit():
    trace = same_every_way(_random_convoys("run.threads=2", "timing.convoy_end_gap=0.05"))
    ws, we = trace["write_start"], trace["write_end"]
    lead, join, _, _ = write_pairs(ws, we, trace["thread"])
    assert lead.size > 50
    # A pair's joiner ends gap·lag after its leader (rounded to the ns).
    gap = (we[join] - we[lead]).astype(np.float64)
    assert np.allclose(gap, np.round(0.05 * (ws[join] - ws[lead])), atol=1)


def test_a_negative_end_gap_is_refused(capsys):
    assert main(["simulate", "--out", "unused", "--set", "timing.convoy_end_gap=-0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_end_gap" in err[0] and "-0.1" in err[0]


@pytest.mark.parametrize(("leader", "joiner"), [(1.0, 0.0), (0.0, 1.0)])
def test_the_shared_part_loses_the_stores_it_is_told_to(leader, joiner):
    """The leader had swept a quarter of the block when the joiner came: in the other three
    quarters every coordinate loses the leader's store (or the joiner's)."""
    trace = simulate(two_writers(f"convoy_lost_leader={leader}",
                                  f"convoy_lost_joiner={joiner}"))
    rows = {int(t): i for i, t in enumerate(trace["thread"])}
    problem = make_problem(two_writers().problem)
    w0 = problem.initial()
    lead, join = (0.02 * problem.grad(w0, int(trace["sample"][rows[t]]))[0] for t in (0, 1))
    shared = np.arange(40) >= 10
    expected = w0 - np.where(shared & (leader == 1), 0, lead) - np.where(shared & (joiner == 1),
                                                                          0, join)
    assert np.array_equal(trace["w_final"], expected)
    assert convoy_pairs(trace)[0, 3:].tolist() == [0.75 * leader, 0.75 * joiner]
    victim, winner = (rows[0], rows[1]) if leader else (rows[1], rows[0])
    assert trace["lost_blocks"][victim] == 1 and trace["overwrote"][winner] == 1


def _random_convoys(*extra):
    return scenario("run.threads=3", "run.updates=600", "problem.dim=2000",
                    "timing.write.mean=4000", "timing.grad.mean=8000", *CONVOY,
                    "timing.convoy_lost_leader=0.3", "timing.convoy_lost_joiner=0.2", *extra)


def test_lost_shares_match_the_scenario_over_the_shared_part():
    """Over many random pairs the lost share of each write is its probability times the
    shared part (1 − the leader's swept share at the join)."""
    trace = simulate(_random_convoys("run.threads=2", "timing.write.dist=constant",
                                     "run.updates=2000"))
    pairs = convoy_pairs(trace)
    assert len(pairs) > 100
    shared = np.clip(1 - pairs[:, 2] / 4000, 0, 1)
    assert pairs[:, 3].sum() / shared.sum() == pytest.approx(0.3, rel=0.03)
    assert pairs[:, 4].sum() / shared.sum() == pytest.approx(0.2, rel=0.03)


def test_a_join_loses_anything_only_as_often_as_told():
    """convoy_lost_pairs = 0.4: four joins in ten lose coordinates, and those lose their
    shares of the shared part as before; the rest lose nothing."""
    trace = simulate(_random_convoys("run.threads=2", "timing.write.dist=constant",
                                     "run.updates=4000", "timing.convoy_lost_pairs=0.4"))
    check_meeting_losses(trace, 4000, lossy=0.4, leader=0.3)
    assert same_every_way(_random_convoys("timing.convoy_lost_pairs=0.4")) is not None


def test_convoys_are_deterministic_and_replay_bit_for_bit():
    first = same_every_way(_random_convoys())
    # Convoys happened, with three writers at times, and they lost stores.
    assert (first["write_end"] - first["write_start"]).max() > 4000 * 3
    assert first["lost_blocks"].sum() > 0


def test_convoys_in_time_slices_join_only_writes_that_began():
    """Three threads on two cores in per-core time slices, two blocks: every convoy pair's
    joiner started inside its leader's write, and the run is deterministic, the same
    without lookahead and replayed bit for bit."""
    sc = _random_convoys("run.blocks=2", "devices=[{name='cpu', cores=2, quantum=50000, "
                         "slicing='per_core'}]")
    first, slow = simulate(sc), simulate(sc, lookahead=False)
    _, _, replayed = replay(first)
    for other in (slow, replayed):
        for name, values in first.arrays.items():
            assert np.array_equal(values, other.arrays[name]), name
    pairs = convoy_pairs(first)
    assert len(pairs) > 20 and np.all(pairs[:, 2] >= 0)
    assert np.all(pairs[:, 3:] >= 0) and np.all(pairs[:, 3:] <= 1)


@pytest.mark.parametrize(("override", "message"), [
    ("run.write_mode=atomic_add", "load_store"),
    ("run.store_grain=8", "store_grain"),
    ("devices=[{name='cpu', bus=1}]", "no bus"),
    ("problem.name=sparse_logistic", "dense writes"),
])
def test_writes_that_cannot_form_convoys_are_refused(override, message):
    with pytest.raises(ScenarioError, match=message) as err:
        simulate(_random_convoys(override))
    assert "hardware.convoys" in str(err.value)


def test_a_share_of_lossy_joins_outside_zero_to_one_is_refused(capsys):
    assert main(["simulate", "--out", "/nonexistent/x", "--set", "timing.convoy_join=1",
                 "--set", "timing.convoy_lost_pairs=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_lost_pairs" in err[0]


def test_lost_shares_above_one_are_refused(capsys):
    assert main(["simulate", "--out", "/nonexistent/x", "--set", "timing.convoy_join=1",
                 "--set", "timing.convoy_lost_leader=0.7", "--set",
                 "timing.convoy_lost_joiner=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_lost_joiner" in err[0] and "0.5" in err[0]


def test_calibration_recovers_convoys_from_a_simulated_trace(tmp_path):
    """Known convoy values within 10% (timing) and 5% (lost shares); the write distribution
    is fitted on writes that met no other, so it is the drawn one, not the stretched."""
    run = convoy_run(tmp_path, "convoys", "timing.convoy_join=1.5",
                      "timing.convoy_rest=2.5", "timing.convoy_lost_leader=0.08",
                      "timing.convoy_lost_joiner=0.04")
    calibrated, report = calibrate(run, pool=True)
    convoys = calibrated.hardware_of(0).convoys
    assert report["convoys"]["pairs"] >= 200
    assert convoys is not None
    assert convoys.join == pytest.approx(1.5, rel=0.1)
    assert convoys.rest == pytest.approx(2.5, rel=0.1)
    assert convoys.lost_leader == pytest.approx(0.08, rel=0.05)
    assert convoys.lost_joiner == pytest.approx(0.04, rel=0.05)
    assert calibrated.timing_of(0).write.mean == pytest.approx(4000, rel=0.05)
    assert convoys.end_gap == 0.0  # simulated convoys end together
    gapped = convoy_run(tmp_path, "gapped", "timing.convoy_join=1.5",
                        "timing.convoy_rest=2.5", "timing.convoy_lost_leader=0.08",
                        "timing.convoy_lost_joiner=0.04", "timing.convoy_end_gap=0.1")
    convoys = calibrate(gapped, pool=True)[0].hardware_of(0).convoys
    assert convoys is not None
    assert convoys.end_gap == pytest.approx(0.1, rel=0.1)
    assert convoys.end_catch_up == 0.0  # a gap in proportion to the lag keeps none
    assert convoys.join == pytest.approx(1.5, rel=0.1)
    assert convoys.rest == pytest.approx(2.5, rel=0.1)
    off, report_off = calibrate(run, pool=True, convoys="off")
    assert off.hardware_of(0).convoys is None and report_off["convoys"]["fields"] is None


def test_writes_met_are_censored_so_long_writes_count(tmp_path):
    """Writes drawn lognormal (mean 4 µs, cv 0.5): a long write is likelier to be met, so the
    writes that met no other average well under 4 µs; counted as censored at the meeting,
    the met ones bring the fit back to the drawn distribution, and with it the convoy rule."""
    run = convoy_run(tmp_path, "wide", "timing.write={dist='lognormal', mean=4000, cv=0.5}",
                     "timing.convoy_join=1.5", "timing.convoy_rest=2.5")
    trace = load_run(run).trace
    rows = running_together(trace)
    alone = alone_writes(trace, rows)
    assert np.mean(trace["write_end"][alone] - trace["write_start"][alone]) < 0.88 * 4000
    calibrated, report = calibrate(run, pool=True)
    timing, convoys = calibrated.timing_of(0), calibrated.hardware_of(0).convoys
    assert convoys is not None
    assert timing.write.mean == pytest.approx(4000, rel=0.05)
    assert timing.write.cv == pytest.approx(0.5, rel=0.1)
    assert convoys.join == pytest.approx(1.5, rel=0.1)
    assert convoys.rest == pytest.approx(2.5, rel=0.1)
    assert "censored" in report["fits"]["all workers"]["write"]


def test_write_survival_worked_by_hand():
    """Four writes: 0 alone; 1 met by 2 after a quarter of it (censored there); 2 joined 1
    (left out); 3 alone. Kaplan–Meier of alone {2, 4} and censored {1}: S = 1, then ½ at
    2 (two at risk), 0 at 4: quantiles 2 and 4, mean 3."""
    trace = {"write_start": np.array([0, 10, 11, 30]), "write_end": np.array([2, 14, 15, 34])}
    kept, share = write_survival(trace, np.arange(4))  # type: ignore[arg-type]
    assert kept.tolist() == [0, 1, 3] and share.tolist() == [1.0, 0.25, 1.0]
    alone, censored = np.array([2.0, 4.0]), np.array([1.0])
    estimate = Survival.of(alone, censored)
    assert estimate.quantiles(2).tolist() == [2.0, 4.0]
    assert estimate.mean() == pytest.approx(3.0)
    # S(t) = 1 on [0, 2), ½ on [2, 4), 0 after. At lag 1, S(1) = 1: ∫₀³ S(1 + t)·S(t) dt =
    # [0, 1): 1·1 + [1, 2): ½·1 + [2, 3): ½·½ = 1.75; at lag 3: S(3) = ½, ∫₀¹ ½·1 dt / ½ = 1.
    assert estimate.expected_rest(np.array([1.0, 3.0])) == pytest.approx([1.75, 1.0])


def test_calibration_recovers_how_often_a_meeting_loses_anything(tmp_path):
    run = convoy_run(tmp_path, "some", "timing.convoy_join=1.5", "timing.convoy_rest=2.5",
                      "timing.convoy_lost_leader=0.08", "timing.convoy_lost_joiner=0.04",
                      "timing.convoy_lost_pairs=0.4")
    convoys = calibrate(run, pool=True)[0].hardware_of(0).convoys
    assert convoys is not None
    assert convoys.lost_pairs == pytest.approx(0.4, abs=0.08)
    assert convoys.lost_leader == pytest.approx(0.08, rel=0.1)
    every = convoy_run(tmp_path, "every", "timing.convoy_join=1.5", "timing.convoy_rest=2.5",
                        "timing.convoy_lost_leader=0.08", "timing.convoy_lost_joiner=0.04")
    fitted = calibrate(every, pool=True)[0].hardware_of(0).convoys
    assert fitted is not None and fitted.lost_pairs == 1.0


def test_writes_that_end_apart_are_not_convoys(tmp_path):
    _, report = calibrate(convoy_run(tmp_path, "plain"), pool=True)
    assert report["convoys"]["pairs"] >= 30
    assert report["convoys"]["fields"] is None
    assert report["convoys"]["end_gap_over_start_gap"] > 0.5


def test_convoys_need_time_slices_when_cores_are_shared(tmp_path):
    run = convoy_run(tmp_path, "convoys", "timing.convoy_join=1.5", "timing.convoy_rest=2.5")
    calibrated, report = calibrate(run, pool=True, cores=1)
    assert calibrated.hardware_of(0).convoys is None
    assert "quantum" in report["convoys"]["why"]
    sliced, _ = calibrate(run, pool=True, cores=1, quantum=4_000_000)
    assert sliced.hardware_of(0).convoys is not None
    simulate(sliced)  # runs: threads beyond the core take turns in time slices


def test_write_pairs_are_two_writes_that_met_and_no_third():
    start = np.array([0, 5, 20, 22, 23, 40, 50, 60])
    end = np.array([10, 12, 30, 26, 24, 45, 55, 70])
    owner = np.array([0, 1, 0, 1, 2, 0, 0, 1])
    lead, join, _, _ = write_pairs(start, end, owner)
    # (0, 1) met alone; 2, 3, 4 met as three; 5 and 6 belong to one owner; 7 is alone.
    assert lead.tolist() == [0] and join.tolist() == [1]


def _classified(lost_leader, lost_joiner, extra=None):
    """Rows: 0 reads, 1 and 2 write together, 3 reads after (times in ns)."""
    rng = np.random.default_rng(0)
    d = 64
    w0 = rng.normal(size=d)
    sa, sb = rng.normal(size=d) * 0.01, rng.normal(size=d) * 0.01
    after = (w0 - sa) - sb
    after[lost_leader] = (w0 - sb)[lost_leader]
    after[lost_joiner] = (w0 - sa)[lost_joiner]
    if extra is not None:
        after[extra] += 1.0
    times = np.array([[0, 10, 12, 15], [20, 30, 100, 200], [25, 35, 110, 201],
                      [300, 310, 400, 410]])
    thread = np.array([0, 0, 1, 1])
    seq = np.array([0, 1, 0, 1])
    steps = [np.stack([np.zeros(d), sa]), np.stack([sb, np.zeros(d)])]
    reads = [np.stack([w0, w0]), np.stack([w0, after])]
    return convoy_losses(times, thread, seq, np.arange(4), steps, reads, "float64")


def test_real_pairs_are_classified_coordinate_by_coordinate():
    flat = _classified(np.arange(8), np.arange(40, 44))
    # Row 1's read (after row 0's write) shows the state before, row 3's the state after.
    assert flat.tolist() == [1, 2, 10, 8 / 64, 4 / 64]


def test_a_pair_the_sums_cannot_explain_is_left_out():
    assert _classified(np.arange(8), np.arange(40, 44), extra=[63]).size == 0


def test_a_chain_of_joiners_lengthens_a_convoy_linearly():
    """Sixteen writers with convoy_rest > 1: each joiner sweeps along at most one write's
    worth of the convoy's rest, so a convoy ends at most (join + rest)·W after its last
    joiner and a write waits at most for the fifteen others (rest·(E − t) alone grows the
    convoy geometrically with each joiner: writes of 475 ms here, against 4 µs drawn)."""
    trace = simulate(scenario(*CONVOY, "run.threads=16", "run.updates=1600", "problem.dim=40",
                              "timing.read={dist='lognormal', mean=1000, cv=0.3}",
                              "timing.write={dist='lognormal', mean=4000, cv=0.3}",
                              "timing.grad={dist='lognormal', mean=6000, cv=0.3}"))
    drawn = trace["extra_write_drawn_ns"]
    assert trace["op_write_ns"].max() <= 16 * 3.5 * drawn.max()
    assert np.mean(trace["op_write_ns"] > drawn) > 0.5  # the writes do meet
    assert trace["write_end"].max() < 1600 / 16 * (1000 + 6000 + 3.5 * 4000) * 1.5


def test_meeting_lags_show_how_the_loss_falls_with_the_lag(tmp_path, capsys):
    """Constant 4 µs writes whose meetings lose anything with probability 0.9·exp(−f / 0.2),
    f the second write's start lag over the write: in each bin of the lag, the share of
    lossy pairs is that probability averaged over the bin's pairs; the shares of the bins sum
    to 1, and two copies of a trace pool to the same profile."""
    run = convoy_run(tmp_path, "falling", "timing.write={dist='constant', mean=4000}",
                     "timing.convoy_join=1.5", "timing.convoy_rest=2.5",
                     "timing.convoy_lost_leader=0.08", "timing.convoy_lost_joiner=0.04",
                     "timing.convoy_lost_pairs=0.9", "timing.convoy_lost_within=0.2")
    trace = load_run(run).trace
    lags = meeting_lags([trace])
    pairs = convoy_pairs(trace)
    assert lags is not None and pairs is not None and len(pairs) > 300
    assert lags["pairs_per_update"] == len(pairs) / len(trace)
    assert sum(lags["shares"]) == pytest.approx(1.0)
    f = pairs[:, 2] / 4000
    assert lags["median_lag"] == pytest.approx(np.median(f))
    for low, high, share, lossy in zip(LAG_EDGES[:-1], LAG_EDGES[1:], lags["shares"],
                                       lags["lossy_by_lag"], strict=True):
        inside = (f >= low) & (f < high)
        assert share == pytest.approx(inside.mean())
        if inside.sum() >= 40 and high <= 0.7:
            expected = np.mean(0.9 * np.exp(-f[inside] / 0.2))
            noise = np.sqrt(expected * (1 - expected) / inside.sum())
            assert abs(lossy - expected) < 4 * noise + 0.02, (low, lossy, expected)
    twice = meeting_lags([trace, trace])
    assert twice is not None
    assert twice["shares"] == lags["shares"] and twice["lossy_by_lag"] == lags["lossy_by_lag"]
    assert twice["pairs_per_update"] == lags["pairs_per_update"]
    assert meeting_lags([simulate(scenario("run.updates=200"))]) is None  # no pairs recorded
    assert main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
    shares = cell(lags["shares"])
    assert detail_cells(capsys.readouterr().out, "pairs that met per start-lag bin (share)") == [
        shares, shares, "—", "bins from 0, 0.05, 0.1, 0.2, 0.4, 0.7, 1 W"]


def test_a_joiner_makes_up_the_catch_up_before_its_end_gap():
    """convoy_end_gap = 0.25 with convoy_end_catch_up = 600: the joiner, 1000 ns after the
    leader, ends 0.25·(1000 − 600) = 100 ns after the convoy's end (20000); with a catch-up
    over its lag it ends with the convoy."""
    for catch_up, ends in ((600, [20000, 20100]), (1500, [20000, 20000])):
        trace = simulate(two_writers("convoy_end_gap=0.25", f"convoy_end_catch_up={catch_up}"))
        rows = {int(t): i for i, t in enumerate(trace["thread"])}
        assert [int(trace["write_end"][rows[t]]) for t in (0, 1)] == ends


def test_convoys_with_a_catch_up_are_deterministic_and_replay_bit_for_bit():
    trace = same_every_way(_random_convoys("run.threads=2", "timing.convoy_end_gap=0.5",
                                           "timing.convoy_end_catch_up=700"))
    ws, we = trace["write_start"], trace["write_end"]
    lead, join, _, _ = write_pairs(ws, we, trace["thread"])
    lag = (ws[join] - ws[lead]).astype(np.float64)
    assert lead.size > 50 and (lag < 700).any() and (lag > 700).any()
    gap = (we[join] - we[lead]).astype(np.float64)
    assert np.allclose(gap, np.round(0.5 * np.maximum(lag - 700, 0)), atol=1)


def test_a_negative_catch_up_is_refused(capsys):
    assert main(["simulate", "--out", "unused", "--set",
                 "timing.convoy_end_catch_up=-5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.convoy_end_catch_up" in err[0] and "-5" in err[0]


def test_the_end_gap_hinge_gives_back_a_known_rule():
    """Gaps made as 0.7·max(0, lag − 500) (+ noise in a tenth of the pairs) give back 0.7
    and 500 and are kept; gaps made as 0.3·lag give a = 0 back, and the hinge is not kept."""
    rng = np.random.default_rng(3)
    lag = rng.uniform(0, 3000, 2000)
    gap = 0.7 * np.maximum(lag - 500, 0)
    noisy = rng.random(lag.size) < 0.1
    gap[noisy] += rng.exponential(300, noisy.sum())
    hinge = end_gap_hinge(lag, gap)
    assert hinge["kept"] and hinge["slope"] == pytest.approx(0.7, rel=0.02)
    assert hinge["catch_up_ns"] == pytest.approx(500, rel=0.05)
    assert hinge["error"] < 0.5 * hinge["proportional_error"]
    plain = end_gap_hinge(lag, 0.3 * lag)
    assert not plain["kept"] and plain["catch_up_ns"] == 0
    assert plain["slope"] == pytest.approx(0.3)
    assert plain["error"] == pytest.approx(0, abs=1e-6)


def test_calibration_recovers_a_catch_up_from_a_simulated_trace(tmp_path):
    """Convoys whose joiner ends 0.8·max(0, lag − 1000 ns) after the leader: the calibration
    gives both back within 10%, and its report says how much better they fit the end gaps
    than a gap in proportion to the lag."""
    run = convoy_run(tmp_path, "catch_up", "timing.convoy_join=1.5", "timing.convoy_rest=2.5",
                     "timing.convoy_lost_leader=0.08", "timing.convoy_lost_joiner=0.04",
                     "timing.convoy_end_gap=0.8", "timing.convoy_end_catch_up=1000")
    calibrated, report = calibrate(run, pool=True)
    timing = fitted(calibrated)
    assert report["convoys"]["end_gap_hinge"]["kept"]
    assert timing.convoy_end_gap == pytest.approx(0.8, rel=0.1)
    assert timing.convoy_end_catch_up == pytest.approx(1000, rel=0.1)
    assert timing.convoy_join == pytest.approx(1.5, rel=0.1)
    assert timing.convoy_rest == pytest.approx(2.5, rel=0.1)


def test_offsets_follow_the_writes_and_the_catch_up(tmp_path, capsys):
    """Constant 4 µs writes whose convoys end 0.8·max(0, lag − 1000 ns) apart: the end gap
    of met writes is 0 below a lag of 0.25 W and that rule's median above it; the offsets'
    shares and next-over-now ratios agree with a brute-force nearest other start; one
    worker has none."""
    run = convoy_run(tmp_path, "offsets", "timing.write={dist='constant', mean=4000}",
                     "timing.convoy_join=1.5", "timing.convoy_rest=2.5",
                     "timing.convoy_end_gap=0.8", "timing.convoy_end_catch_up=1000")
    trace = load_run(run).trace
    found = offsets([trace])
    assert found is not None
    ws, we, thread = trace["write_start"], trace["write_end"], trace["thread"]
    lead, join, _, _ = write_pairs(ws, we, thread)
    lag = (ws[join] - ws[lead]) / 4000
    for low, high, gap in zip(OFFSET_EDGES[:6], OFFSET_EDGES[1:7], found["end_gap"], strict=True):
        inside = (lag >= low) & (lag < high)
        if inside.sum() >= 5:
            assert gap == pytest.approx(np.median(0.8 * np.maximum(lag[inside] - 0.25, 0)),
                                        abs=1e-3), low
            if high <= 0.25:
                assert gap == 0
    assert found["end_gap"][4] > 0.1  # lags of 0.4–0.7 W end apart
    brute = np.array([np.abs(ws[thread != thread[i]] - ws[i]).min() for i in range(len(ws))])
    brute = brute / 4000
    counts = np.histogram(brute, bins=np.array((*OFFSET_EDGES[:-1], 1e18)))[0]
    assert found["shares"] == pytest.approx((counts / len(ws)).tolist())
    ratios: list[list[float]] = [[] for _ in OFFSET_EDGES[:-3]]
    for worker in (0, 1):
        rows = np.flatnonzero(thread == worker)
        mine = brute[rows[np.argsort(ws[rows], kind="stable")]]
        for now, later in itertools.pairwise(mine):
            i = int(np.searchsorted(OFFSET_EDGES, now, side="right")) - 1
            if i < len(ratios):
                ratios[i].append(later / max(now, 1e-3))
    assert found["next_over_now"] == pytest.approx(
        [float(np.median(r)) if len(r) >= 5 else None for r in ratios])
    assert offsets([simulate(scenario("run.threads=1", "run.updates=50"))]) is None
    assert main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
    shares = cell(found["shares"])
    assert detail_cells(capsys.readouterr().out, "write starts' offset to another's (share)") == [
        shares, shares, "—", "bins from 0, 0.05, 0.1, 0.2, 0.4, 0.7, 1, 2, 4 W (over a lone write)"]
