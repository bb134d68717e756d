"""`asyngrad compare`: fidelity of one run against another."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cli import main
from simulator.errors import AsyngradError
from simulator.fidelity.compare import TARGETS, compare_runs, error_gap_split, targets
from simulator.fidelity.report import targets_table
from simulator.fidelity.runs import load_run
from simulator.metrics import (
    PHASE_BINS,
    error_mask,
    overlaps,
    rhythm,
    trace_rhythm,
    write_meetings,
)
from tests.conftest import detail_cells


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, threads in (("a", 8), ("b", 8), ("c", 2)):
        assert main(["simulate", "--out", str(root / name), "--quiet", "--set",
                     "run.updates=600", "--set", f"run.threads={threads}"]) == 0
    assert main(["simulate", "--out", str(root / "other"), "--quiet", "--set",
                 "run.updates=100", "--set", "problem.dim=20"]) == 0
    return root


def test_identical_runs_have_zero_distances(runs):
    report = compare_runs(runs / "a", runs / "b")
    assert report["staleness"]["ks_distance"] == 0.0
    assert report["staleness"]["relative_mean_gap"] == 0.0
    assert report["gradient_error"]["rate_gap"] == 0.0
    assert report["loss"]["final_ratio"] == 1.0
    assert report["loss"]["max_abs_log10_ratio"] == 0.0
    assert report["throughput"]["ratio"] == 1.0


def test_different_runs_are_told_apart(runs):
    report = compare_runs(runs / "a", runs / "c")
    st = report["staleness"]
    assert st["mean_a"] > 5 and st["mean_b"] < 2 and st["ks_distance"] > 0.8
    assert report["overwrites"]["a"]["lost_blocks_per_update"] > (
        report["overwrites"]["b"]["lost_blocks_per_update"])


def test_cli_writes_report_and_figure(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "a"), str(runs / "c"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "KS distance" in text and "final suboptimality" in text
    assert "writes overlapping a write" in text and "error rate at staleness 0" in text
    assert "error-rate gap b − a" in text
    report = json.loads((out / "compare.json").read_text())
    assert report["a"]["updates"] == 600
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case", ["missing", "not_a_run", "mismatch"])
def test_bad_or_mismatched_runs_are_one_line(runs, tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    b = {"missing": tmp_path / "nope", "not_a_run": tmp_path / "empty",
         "mismatch": runs / "other"}[case]
    assert main(["compare", str(runs / "a"), str(b), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(b) in err[0]
    assert not (tmp_path / "o").exists()
    if case == "mismatch":
        assert "different problems" in err[0] and "dim: 100 vs 20" in err[0]
    with pytest.raises(AsyngradError):
        compare_runs(runs / "a", b)


def test_derived_constants_agree_to_the_last_bits_not_exactly(runs, tmp_path):
    """A real run made on another machine computes the problem's smoothness with another
    BLAS: equal to 1e-9 is the same problem, a visible difference is not."""
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(runs / "b", copy)
    summary = json.loads((copy / "summary.json").read_text())
    smoothness = summary["problem"]["smoothness"]
    for change, same in ((1 + 4e-16, True), (1 + 1e-6, False)):
        summary["problem"]["smoothness"] = smoothness * change
        (copy / "summary.json").write_text(json.dumps(summary))
        if same:
            assert compare_runs(runs / "a", copy)["staleness"]["ks_distance"] == 0.0
        else:
            with pytest.raises(AsyngradError, match="smoothness"):
                compare_runs(runs / "a", copy)


def test_overlap_counts_match_a_pairwise_count():
    rng = np.random.default_rng(3)
    start = rng.integers(0, 1000, 300)
    end = start + rng.integers(0, 40, 300)  # zero-length windows included
    other_start = rng.integers(0, 1000, 200)
    other_end = other_start + rng.integers(1, 40, 200)
    pairwise = ((other_start[None, :] < end[:, None])
                & (other_end[None, :] > start[:, None])).sum(axis=1)
    assert overlaps(start, end, other_start, other_end).tolist() == pairwise.tolist()


def test_interference_is_what_the_windows_and_errors_say(runs):
    for name in ("a", "c"):
        trace = load_run(runs / name).trace
        ws, we = trace["write_start"], trace["write_end"]
        rs, re = trace["read_start"], trace["read_end"]
        other_write = (ws[:, None] < we[None, :]) & (we[:, None] > ws[None, :])
        np.fill_diagonal(other_write, False)
        under = ((ws[None, :] < re[:, None]) & (we[None, :] > rs[:, None])).any(axis=1)
        errors, stale = error_mask(trace), trace["staleness"] > 0
        got = compare_runs(runs / name, runs / name)["interference"]["a"]
        assert got["write_overlap_rate"] == pytest.approx(other_write.any(axis=1).mean())
        assert got["read_under_write_rate"] == pytest.approx(under.mean())
        assert got["fresh_share"] == pytest.approx((~stale).mean())
        assert got["error_rate_fresh"] == pytest.approx(errors[~stale].mean())
        assert got["error_rate_stale"] == pytest.approx(errors[stale].mean())
        met = other_write.any(axis=1)
        assert got["met_write_median_ns"] == np.median((we - ws)[met])
        assert got["lone_write_median_ns"] == np.median((we - ws)[~met])
        # Simulated block writes lose whole steps and B = 1 cannot tear a read, so an update
        # no completion came between carries no error; with 8 threads many writes overlap.
        assert got["error_rate_fresh"] == 0.0 and got["error_rate_stale"] > 0.5
    assert compare_runs(runs / "a", runs / "c")["interference"]["a"]["write_overlap_rate"] > (
        compare_runs(runs / "c", runs / "a")["interference"]["a"]["write_overlap_rate"])


def test_the_error_rate_gap_splits_into_its_causes(runs):
    """The split of rate_b − rate_a sums to it, is zero between identical runs, and moves
    with the share of fresh updates alone where only that share differs."""
    assert compare_runs(runs / "a", runs / "b")["gradient_error"]["gap_split"] == {
        "fresh_share": 0.0, "fresh_errors": 0.0, "stale_errors": 0.0}
    report = compare_runs(runs / "a", runs / "c")
    ge, split = report["gradient_error"], report["gradient_error"]["gap_split"]
    assert sum(split.values()) == pytest.approx(ge["b"]["rate"] - ge["a"]["rate"], abs=1e-12)
    # 2 threads against 8: far more fresh updates, which carry no error (B = 1, block writes)
    assert split["fresh_share"] < -0.1 and split["fresh_errors"] == 0.0
    by_hand = {"fresh_share": 0.25, "error_rate_fresh": 0.1, "error_rate_stale": 0.9}
    other = {"fresh_share": 0.15, "error_rate_fresh": 0.2, "error_rate_stale": 0.95}
    assert error_gap_split(by_hand, other) == pytest.approx(
        {"fresh_share": -0.1 * -0.8, "fresh_errors": 0.15 * 0.1, "stale_errors": 0.85 * 0.05})
    only_share = {**by_hand, "fresh_share": 0.5}
    assert error_gap_split(by_hand, only_share) == pytest.approx(
        {"fresh_share": 0.25 * -0.8, "fresh_errors": 0.0, "stale_errors": 0.0})
    # A run with no stale update takes the other's stale rate (its weight is 0 there).
    fresh_only = {"fresh_share": 1.0, "error_rate_fresh": 0.1, "error_rate_stale": None}
    assert error_gap_split(fresh_only, by_hand) == pytest.approx(
        {"fresh_share": -0.75 * (0.1 - 0.9), "fresh_errors": 0.0, "stale_errors": 0.0})
    assert error_gap_split({**by_hand, "fresh_share": None}, by_hand) is None


def test_the_summary_says_how_writes_met(runs, tmp_path):
    """summary.json's ``writes`` is what the windows say, as compare's interference; a run
    whose writes convoy shows met writes far longer than lone ones."""
    for name in ("a", "c"):
        run = load_run(runs / name)
        got = json.loads((runs / name / "summary.json").read_text())["writes"]
        mine = compare_runs(runs / name, runs / name)["interference"]["a"]
        assert got == {"met_rate": mine["write_overlap_rate"],
                       "met_median_ns": mine["met_write_median_ns"],
                       "lone_median_ns": mine["lone_write_median_ns"]}
        assert got["met_rate"] == pytest.approx(write_meetings(run.trace)["met_rate"])
    out = tmp_path / "convoys"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=400", "--set", "timing.convoy_join=3",
                 "--set", "timing.convoy_rest=1"]) == 0
    got = json.loads((out / "summary.json").read_text())["writes"]
    assert got["met_rate"] > 0.2 and got["met_median_ns"] > 2 * got["lone_median_ns"]


def test_a_serial_run_shows_no_interference(tmp_path):
    assert main(["simulate", "--out", str(tmp_path / "s"), "--quiet", "--set",
                 "run.updates=200", "--set", "run.protocol=serial"]) == 0
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["writes"][
        "met_median_ns"] is None
    got = compare_runs(tmp_path / "s", tmp_path / "s")["interference"]["a"]
    trace = load_run(tmp_path / "s").trace
    assert got == {"write_overlap_rate": 0.0, "read_under_write_rate": 0.0,
                   "fresh_share": 1.0, "error_rate_fresh": 0.0, "error_rate_stale": None,
                   "met_write_median_ns": None,
                   "lone_write_median_ns": np.median(trace["write_end"] - trace["write_start"])}


def test_simulated_workers_have_independent_phases(tmp_path):
    # Durations are drawn independently per thread, so the staleness is what independent
    # phases give and the others' completions fall evenly over a worker's cycle.
    for threads in (2, 8):
        out = tmp_path / f"k{threads}"
        assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.updates=4000",
                     "--set", f"run.threads={threads}"]) == 0
        got = compare_runs(out, out)["rhythm"]["a"]
        assert got["updates"] > 3900
        assert got["coupling"] == pytest.approx(1.0, abs=0.03)
        assert got["phase_peak"] < 1.3 and len(got["phase_profile"]) == PHASE_BINS
        assert np.mean(got["phase_profile"]) == pytest.approx(1.0)


def test_workers_in_step_are_told_from_independent_ones():
    # Two workers with the same 10 µs cycle, worker 1 1.2 µs behind: worker 0's window
    # [10n, 10n + 8] holds no completion of worker 1 (they end at 10n − 0.8 and 10n + 9.2),
    # worker 1's holds worker 0's at 10n + 8; independent phases would give 8/10 per update.
    n = 1000
    starts = np.arange(n) * 10_000
    thread = np.repeat(np.array([0, 1], dtype=np.int32), n)
    read_start = np.concatenate([starts, starts + 1_200])
    write_end = read_start + 8_000
    staleness = np.repeat(np.array([0, 1]), n)
    got = rhythm(thread, read_start, write_end, staleness)
    assert got["staleness"] == pytest.approx(0.5, abs=1e-3)
    assert got["independent_staleness"] == pytest.approx(0.8, rel=2e-3)
    assert got["coupling"] == pytest.approx(0.625, rel=3e-3)
    # Worker 1's completions at 0.92 of worker 0's cycle, worker 0's at 0.68 of worker 1's.
    profile = np.array(got["phase_profile"])
    assert set(np.flatnonzero(profile)) == {13, 18}
    assert got["phase_peak"] == pytest.approx(PHASE_BINS / 2, rel=2e-3)


def test_rhythm_under_a_lock_and_for_one_worker(tmp_path):
    for protocol, threads in (("locked", 4), ("serial", 1)):
        assert main(["simulate", "--out", str(tmp_path / protocol), "--quiet", "--set",
                     "run.updates=300", "--set", f"run.protocol={protocol}", "--set",
                     f"run.threads={threads}"]) == 0
    locked = trace_rhythm(load_run(tmp_path / "locked").trace)
    assert locked["staleness"] == 0.0 and locked["independent_staleness"] > 0.5
    assert locked["coupling"] == 0.0
    alone = trace_rhythm(load_run(tmp_path / "serial").trace)
    assert alone == {"updates": 0, "staleness": None, "independent_staleness": None,
                     "coupling": None, "phase_profile": None, "phase_peak": None}


@pytest.mark.alone  # a real run
def test_a_real_run_has_no_lost_blocks_but_its_classified_pairs(tmp_path, capsys):
    """Hardware does not say which update lost a store: a real run's lost blocks are
    unknown (None, printed n/a), while what its classified pairs of writes lost is compared
    with the simulation's (passing writes record theirs)."""
    from simulator.fidelity.compare import pair_losses
    from simulator.replay import load_trace
    from simulator.trace import convoy_pairs

    real, sim = tmp_path / "real", tmp_path / "sim"
    tiny = ("run.updates=2000", "problem.dim=400", "metrics.exact=false")
    assert main(["real", "--out", str(real), "--workers", "2", "--measure", "--dtype",
                 "float64", "--quiet", *(a for o in tiny for a in ("--set", o))]) == 0
    assert main(["simulate", "--out", str(sim), "--quiet", "--set", "run.threads=2",
                 "--set", "timing.convoy_lost_leader=0.2", "--set",
                 "timing.write.mean=8000", *(a for o in tiny for a in ("--set", o))]) == 0
    capsys.readouterr()
    assert main(["compare", str(real), str(sim), "--out", str(tmp_path / "cmp")]) == 0
    assert detail_cells(capsys.readouterr().out, "lost blocks per update")[0::3] == [
        "—", "unknown for a real run"]
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())["overwrites"]
    assert report["a"]["lost_blocks_per_update"] is None
    assert report["b"]["lost_blocks_per_update"] > 0
    for side, run in (("a", real), ("b", sim)):
        pairs = convoy_pairs(load_trace(run))
        assert report[side]["pairs_classified"] == len(pairs)
        assert report[side] == {**report[side], **pair_losses(load_trace(run))}
    lost = convoy_pairs(load_trace(sim))[:, 3:].sum(axis=1)
    assert report["b"]["pairs_losing"] == np.mean(lost > 0) > 0


def test_pair_losses_give_the_lossy_shares_and_the_lags_quartiles():
    """Worked by hand: four pairs, lags 1000–4000 ns against constant lone writes of
    8000 ns, two of them lossy (shares 0.1 + 0.1 and 0.4)."""
    from simulator.engine import simulate
    from simulator.fidelity.compare import pair_losses
    from simulator.scenario import scenario_from_dict

    trace = simulate(scenario_from_dict({
        "run": {"threads": 1, "updates": 20},
        "timing": {"write": {"dist": "constant", "mean": 8000}}}))
    rows = [[0, 1, 1000, 0.1, 0.1], [2, 3, 2000, 0, 0], [4, 5, 3000, 0.4, 0],
            [6, 7, 4000, 0, 0]]
    trace.arrays["extra_convoy_pairs"] = np.asarray(rows, dtype=np.float64).ravel()
    report = pair_losses(trace)
    assert report["pairs_classified"] == 4 and report["pairs_losing"] == 0.5
    assert report["lost_per_pair"] == pytest.approx(0.15)
    assert report["lost_per_lossy_pair"] == pytest.approx([0.25, 0.3, 0.35])
    assert report["pair_lag_over_lone_write"] == pytest.approx([0.21875, 0.3125, 0.40625])


def test_compare_shows_how_far_apart_a_real_runs_cpus_were(runs, tmp_path, capsys):
    """A real run's ``real.cpu_latency`` goes into the report beside the other run's (None for
    a simulated one), and the printed report shows both."""
    import shutil

    real = tmp_path / "real"
    shutil.copytree(runs / "a", real)
    summary = json.loads((real / "summary.json").read_text())
    summary["real"] = {"cpu_latency": {"cpus": [0, 1], "before_ns": 371.6, "after_ns": 44.2}}
    (real / "summary.json").write_text(json.dumps(summary))
    report = compare_runs(real, runs / "b")
    assert report["cpu_latency"] == {"a": summary["real"]["cpu_latency"], "b": None}
    assert compare_runs(runs / "a", runs / "b")["cpu_latency"] == {"a": None, "b": None}
    capsys.readouterr()
    assert main(["compare", str(real), str(runs / "b"), "--out", str(tmp_path / "cmp")]) == 0
    assert report["placement"] == {"a": "changing", "b": None}
    text = capsys.readouterr().out
    assert detail_cells(text, "CPU-to-CPU cache line before/after, ns")[:2] == ["372/44.2", "—"]
    assert detail_cells(text, "CPU placement")[:2] == ["changing", "—"]
    other = tmp_path / "other"
    shutil.copytree(real, other)
    for run, before, after in ((real, 182.0, 176.0), (other, 40.0, 149.9)):
        summary["real"]["cpu_latency"].update(before_ns=before, after_ns=after)
        (run / "summary.json").write_text(json.dumps(summary))
    assert compare_runs(real, other)["placement"] == {"a": "far", "b": "near"}
    assert main(["compare", str(real), str(other), "--out", str(tmp_path / "cmp3")]) == 0
    cells = detail_cells(capsys.readouterr().out, "CPU placement")
    assert cells[:2] == ["far", "near"] and cells[3].startswith("placed differently")
    assert main(["compare", str(runs / "a"), str(runs / "b"), "--out",
                 str(tmp_path / "cmp2")]) == 0
    assert "CPU-to-CPU" not in capsys.readouterr().out


def test_targets_are_records_and_a_table(runs, tmp_path, capsys):
    """compare.json's targets: the four fidelity targets with both runs' values, the gap,
    the limit and the verdict, as the printed table shows them; a run against itself meets
    all four with zero gaps."""
    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "a"), str(runs / "a"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads((out / "compare.json").read_text())["targets"]
    assert [r["metric"] for r in rows] == [t[0] for t in TARGETS]
    assert all(r["met"] for r in rows)
    assert [r["gap"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    lines = text.splitlines()
    assert lines[2].split()[:6] == ["metric", "run", "A", "run", "B", "gap"]
    assert all(line.rstrip().endswith("yes") for line in lines[3:7])


def test_details_are_records_and_a_table(runs, tmp_path, capsys):
    """compare.json's details: records of metric, both runs' values, the measure and gap
    (b − a where both are numbers and no other is named) and a note, the same as
    ``details`` gives; the printed details table shows every record's metric, values, gap
    and note in its row."""
    from simulator.fidelity.compare import details
    from simulator.fidelity.report import cell

    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "a"), str(runs / "c"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "compare.json").read_text())
    rows = report["details"]
    assert rows == json.loads(json.dumps(details(report)))
    assert len(rows) >= 15
    for row in rows:
        assert list(row) == ["metric", "a", "b", "measure", "gap", "note"]
        if row["measure"] == "b − a":
            assert row["gap"] == pytest.approx(row["b"] - row["a"])
        gap = cell(row["gap"]) + (f" ({row['measure']})" if row["measure"] else "")
        assert detail_cells(text, row["metric"]) == [cell(row["a"]), cell(row["b"]), gap,
                                                     row["note"]]
    by = {row["metric"]: row for row in rows}
    assert by["staleness p95"]["a"] == report["staleness"]["p95_a"]
    assert by["updates/s"]["gap"] == report["throughput"]["ratio"]
    split = report["gradient_error"]["gap_split"]
    assert by["error rate at staleness 0"]["gap"] == split["fresh_errors"]


def test_a_target_is_missed_or_unknown_by_its_gap():
    """A gap beyond its limit is missed (a ratio beyond the factor either way); a missing
    value gives no verdict."""
    report = {"staleness": {"mean_a": 2.0, "mean_b": 2.5, "relative_mean_gap": 0.25,
                            "ks_distance": 0.1},
              "gradient_error": {"a": {"rate": 0.5}, "b": {"rate": None}, "rate_gap": None},
              "loss": {"final_a": 1.0, "final_b": 0.4, "final_ratio": 0.4}}
    assert [r["met"] for r in targets(report)] == [False, True, None, False]
    assert "—" in targets_table(targets(report))


def test_a_diverged_run_is_drawn_without_its_values_beyond_the_plot_limit(tmp_path):
    """A diverged run's infinite errors and losses are left out of the figure and counted."""
    div = tmp_path / "div"
    assert main(["simulate", "--out", str(div), "--quiet", "--set", "run.updates=2000",
                 "--set", "problem.dim=10", "--set", "run.threads=2",
                 "--set", "run.lr=1e3"]) == 0
    assert not np.isfinite(load_run(div).curve[:, 1]).all()
    assert main(["compare", str(div), str(div), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert (tmp_path / "o" / "compare.png").is_file()
    from simulator.fidelity.figure import compare_figure
    from simulator.plots import LOG_LIMIT

    legends = [t.get_text() for ax in compare_figure(div, div).axes
               if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any(f"beyond {LOG_LIMIT:g} left out" in text for text in legends)


def test_a_diverged_run_is_compared_in_strict_json_and_named(tmp_path, capsys):
    """Against a diverged run, compare.json holds null where a value is not finite (no NaN
    or Infinity, which strict JSON readers refuse), the loss ratios are null, not the
    ratio of the shared first point, and the report says which run diverged and when."""
    common = ["--quiet", "--set", "run.updates=2000", "--set", "problem.dim=10",
              "--set", "run.threads=2"]
    assert main(["simulate", "--out", str(tmp_path / "ok"), *common]) == 0
    assert main(["simulate", "--out", str(tmp_path / "div"), *common,
                 "--set", "run.lr=1e3"]) == 0
    at = json.loads((tmp_path / "div" / "summary.json").read_text())["diverged_at"]
    assert at is not None
    assert main(["compare", str(tmp_path / "ok"), str(tmp_path / "div"),
                 "--out", str(tmp_path / "o")]) == 0
    assert f"B diverged at update {at}" in capsys.readouterr().out

    def refuse(constant):
        raise ValueError(constant)

    report = json.loads((tmp_path / "o" / "compare.json").read_text(),
                        parse_constant=refuse)
    assert report["b"]["diverged_at"] == at and report["a"]["diverged_at"] is None
    loss = report["loss"]
    assert loss["final_a"] > 0
    assert loss["final_b"] is loss["final_ratio"] is loss["max_abs_log10_ratio"] is None
    assert [t["met"] for t in report["targets"]][3] is None
    errors = report["gradient_error"]["b"]
    assert errors["p50"] is None or np.isfinite(errors["p50"])


def _broken_summary(summary):
    """A summary.json lacking ``time`` and ``problem``, or with a null throughput."""
    return {"list": [1, 2], "no_time": {k: v for k, v in summary.items() if k != "time"},
            "no_problem": {k: v for k, v in summary.items() if k != "problem"},
            "null_rate": {**summary, "time": {**summary["time"], "updates_per_second": None}}}


@pytest.mark.parametrize("case, says", [
    ("header_only", "curve.csv: no rows"),
    ("list", "summary.json: not a JSON object (list)"),
    ("no_time", "summary.json: no 'time'"),
    ("no_problem", "summary.json: no 'problem'"),
    ("null_rate", "summary.json: time.updates_per_second = null: not a number")])
def test_broken_run_files_are_one_line_naming_the_file(runs, tmp_path, capsys, case, says):
    """A header-only curve or a summary without what compare reads is one line, exit 2."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(runs / "b", bad)
    if case == "header_only":
        header = (bad / "curve.csv").read_text().splitlines()[0]
        (bad / "curve.csv").write_text(header + "\n")
    else:
        summary = json.loads((bad / "summary.json").read_text())
        (bad / "summary.json").write_text(json.dumps(_broken_summary(summary)[case]))
    assert main(["compare", str(runs / "a"), str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}/{says}" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("a, b, means, gap", [
    ([], [1, 2], (None, 1.5), None), ([1, 2], [], (1.5, None), None),
    ([0, 0], [1, 1], (0.0, 1.0), None), ([0, 0], [0, 0], (0.0, 0.0), 0.0),
    ([2, 2], [1, 1], (2.0, 1.0), 0.5)])
def test_a_missing_or_zero_mean_staleness_gives_no_gap_and_no_verdict(a, b, means, gap):
    """No updates: no mean; a relative gap over a zero mean is null, and so is met, in JSON."""
    from simulator.fidelity.compare import _staleness

    st = _staleness(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))
    assert (st["mean_a"], st["mean_b"]) == means and st["relative_mean_gap"] == gap
    report = {"staleness": st, "gradient_error": {"a": {"rate": None}, "b": {"rate": None},
                                                  "rate_gap": None},
              "loss": {"final_a": 1.0, "final_b": 1.0, "final_ratio": 1.0}}
    row = targets(report)[0]
    assert row["met"] is (None if gap is None else gap <= 0.15)
    json.dumps(report, allow_nan=False)
