"""Controlled schedules: hand-worked interleavings, exact replay, and PCT's guarantee."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import main
from simulator.engine import Engine
from simulator.errors import ScenarioError
from simulator.problems import SparseLogisticProblem
from simulator.rules import staleness_scale
from simulator.schedule import (
    MAX_STEPS,
    Property,
    Scheduler,
    enumerate_schedules,
    explore,
    format_schedule,
    parse_schedule,
    run_schedule,
    search_violation,
    shrink,
)
from simulator.trace import Trace
from tests.conftest import scenario

TINY = ("run.threads=2", "problem.dim=4", "run.blocks=2", "metrics.curve_points=0",
        "problem.n_samples=20")


@given(st.lists(st.integers(0, 5), max_size=60))
def test_schedule_strings_round_trip(choices):
    assert parse_schedule(format_schedule(choices)) == choices


def test_bad_schedule_strings_and_schedules_are_one_clear_error():
    for text in ("0x", "ax2", "1x0", "0..1", "²", "0x²", "٣", "1x٣"):  # ASCII digits only
        with pytest.raises(ScenarioError, match="--schedule"):
            parse_schedule(text)
    # A count is refused before the list is built (0x10**20 overflowed, 0x10**11 took 8 TB).
    for text in ("0x99999999999999999999", "1.0x10000000000", f"0x{MAX_STEPS}.1"):
        with pytest.raises(ScenarioError, match=f"more than {MAX_STEPS:,} steps"):
            parse_schedule(text)
    with pytest.raises(ScenarioError, match=r"--seed = -1: must be >= 0"):
        Scheduler("random", 2, seed=-1)
    s = scenario(*TINY, "run.updates=2")
    with pytest.raises(ScenarioError, match="ends after 3 steps"):
        run_schedule(s, Scheduler("fixed", 2, schedule=[0, 0, 1]))
    with pytest.raises(ScenarioError, match="picks thread 3 at step 0"):
        run_schedule(s, Scheduler("fixed", 2, schedule=[3]))
    whole = run_schedule(s, Scheduler("roundrobin", 2)).schedule  # 2 updates of 2 blocks
    with pytest.raises(ScenarioError, match=f"has {len(whole) + 2} steps; the run ended after "
                                            f"{len(whole)}"):
        run_schedule(s, Scheduler("fixed", 2, schedule=[*whole, 0, 1]))
    # What says when things happen in time is refused: the schedule decides.
    with pytest.raises(ScenarioError, match=r"hardware\.sweeping_reads = .*schedule is the"):
        run_schedule(scenario(*TINY, "hardware.sweeping_reads.lead=0"), Scheduler("random", 2))
    with pytest.raises(ScenarioError, match=r"inject\.stragglers = .*decides when"):
        run_schedule(scenario(*TINY, "inject.stragglers=[{thread = 0, factor = 2.0}]"),
                     Scheduler("random", 2))
    with pytest.raises(ScenarioError, match=r"inject\.pauses = .*decides when"):  # the engine too
        Engine(scenario(*TINY, "inject.pauses=[{thread = 0, start = 1, end = 5}]"),
               choose=lambda runnable: runnable[0])


def test_round_robin_interleaving_worked_by_hand():
    """k = 2, B = 2, load_store, one update each (7 actions: 2 block reads, the gradient,
    2 × (load, store)), threads alternating: both read both blocks (steps 0–3), compute
    (4–5), then load b0, load b0, store b0, store b0, … : thread 1's stores land last and
    overwrite both of thread 0's."""
    s = scenario(*TINY, "run.updates=2")
    result = run_schedule(s, Scheduler("roundrobin", 2))
    assert result.text == ".".join(["0.1"] * 7)
    t = result.trace
    assert t["thread"].tolist() == [0, 1]
    assert t["read_start"].tolist() == [0, 1] and t["read_end"].tolist() == [3, 4]
    assert t["grad_start"].tolist() == [4, 5] and t["write_end"].tolist() == [13, 14]
    assert t["lost_blocks"].tolist() == [2, 0] and t["overwrote"].tolist() == [0, 2]
    assert t["staleness"].tolist() == [0, 1]
    # Thread 0's update was lost entirely: w_T is w_0 minus thread 1's step alone.
    serial = run_schedule(s, Scheduler("fixed", 2, schedule=[1] * 7 + [0] * 7))
    assert serial.trace["lost_blocks"].sum() == 0


def test_replaying_a_schedule_is_bit_identical():
    s = scenario(*TINY, "run.updates=6")
    first = run_schedule(s, Scheduler("random", 2, seed=11))
    again = run_schedule(s, Scheduler("fixed", 2, schedule=parse_schedule(first.text)))
    assert again.text == first.text
    for name, values in first.trace.arrays.items():
        assert np.array_equal(values, again.trace[name], equal_nan=True), name


def test_pct_meets_its_guarantee_on_a_planted_depth_two_bug():
    """One update per thread, B = 1: an update is lost only if a thread is preempted between
    its load and its store (depth 2). PCT with d = 2 must find it with probability at least
    1/(n·k) per run (n = 8 steps: 4 actions per thread, k = 2); with d = 1 it never
    preempts, so it never can."""
    s = scenario(*TINY, "run.updates=2", "run.blocks=1")
    n, k, runs = 8, 2, 400
    found = [run_schedule(s, Scheduler("pct", k, seed, 2, n)).trace["lost_blocks"].sum() > 0
             for seed in range(runs)]
    assert np.mean(found) >= 1 / (n * k)
    never = [run_schedule(s, Scheduler("pct", k, seed, 1, n)).trace["lost_blocks"].sum()
             for seed in range(50)]
    assert sum(never) == 0


def test_explore_keeps_distinct_worst_schedules_that_replay(tmp_path):
    s = scenario(*TINY, "run.updates=4")
    report, worst = explore(s, "pct", 120, "lost_blocks", depth=2, keep=3)
    texts = [w["schedule"] for w in report["worst"]]
    assert len(set(texts)) == len(texts) == 3
    values = [w["value"] for w in report["worst"]]
    assert values == sorted(values, reverse=True) and values[0] == report["values"]["max"]
    assert report["replayed_identically"] and worst.text == texts[0]
    assert worst.trace["lost_blocks"].sum() == values[0]


@pytest.mark.parametrize("kind", ["random", "dfs", "adversarial"])
def test_a_diverged_worst_schedule_still_replays_identically(kind):
    """Runs that diverge (lr = 1e300: objectives inf or NaN) are explored without warnings
    and their worst reproduces: NaN counts as equal to NaN."""
    s = scenario(*TINY, "run.updates=2", "run.lr=1e300")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report, _ = explore(s, kind, 8, "suboptimality")
    assert not np.isfinite(report["worst"][0]["value"]) and report["replayed_identically"]


@pytest.mark.parametrize("protocol", ["lockfree", "paramserver"])
def test_cli_explore_and_replay_schedule(tmp_path, capsys, protocol):
    out = tmp_path / "ex"
    sets = [arg for o in (*TINY, "run.updates=4", f"run.protocol={protocol}")
            for arg in ("--set", o)]
    assert main(["explore", "--out", str(out), "--runs", "60", "--objective", "staleness",
                 "--quiet", *sets]) == 0
    report = json.loads((out / "explore.json").read_text())
    schedule = report["worst"][0]["schedule"]
    assert (out / "worst" / "timeline.png").is_file()
    assert (out / "worst.schedule").read_text().strip() == schedule
    assert main(["replay", str(out), "--schedule", str(out / "worst.schedule"), "--out",
                 str(tmp_path / "r"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["staleness"]["max"] == report["worst"][0]["value"]
    worst, replayed = (Trace.load(d / "trace.npz") for d in (out / "worst", tmp_path / "r"))
    for name, values in worst.arrays.items():
        assert np.array_equal(values, replayed[name], equal_nan=True), name
    assert main(["explore", "--out", str(tmp_path / "bad"), "--objective", "speed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--objective = 'speed'" in err[0]


@pytest.mark.parametrize(("threads", "blocks", "actions"), [(2, 1, 4), (2, 2, 7), (3, 1, 4)])
def test_dfs_enumerates_every_interleaving(threads, blocks, actions):
    """One update per thread of `actions` atomic actions: (k·n)!/(n!)^k interleavings."""
    from math import factorial

    s = scenario(*TINY, f"run.threads={threads}", f"run.updates={threads}",
                 f"run.blocks={blocks}")
    if threads == 3:  # 34,650 schedules: count them without the exact metrics
        s = scenario(*TINY, "run.threads=3", "run.updates=3", "run.blocks=1",
                     "metrics.exact=false")
    report = enumerate_schedules(s, "lost_blocks")
    expected = factorial(threads * actions) // factorial(actions) ** threads
    assert report["complete"] and report["schedules"] == expected
    none = enumerate_schedules(s, "lost_blocks", preemptions=0)
    assert none["schedules"] == factorial(threads)  # each thread runs to the end in turn
    assert none["values"]["max"] == 0  # no preemption, no lost update


@pytest.mark.parametrize("extra", [
    ("run.updates=4", "run.blocks=1", "run.write_mode=atomic_add"),  # 1,196 (was "924")
    ("run.updates=3", "run.blocks=1"),
    ("run.updates=2", "run.blocks=2"),
    ("run.updates=3", "run.blocks=1", "run.split=even"),  # exactly the multinomial
    ("run.threads=3", "run.updates=3", "run.blocks=1", "run.write_mode=atomic_add",
     "run.split=even"),
])
def test_the_interleavings_estimate_bounds_the_dfs_count_of_lockfree_runs(extra):
    """On lock-free dense runs (every schedule takes the same steps) explore's estimate is
    an upper bound on the schedules dfs enumerates, split shared (k^N) or even (the
    multinomial)."""
    s = scenario(*TINY, "metrics.exact=false", *extra)
    estimate = explore(s, "random", 1, "lost_blocks")[0]["log10_interleavings_estimate"]
    exact = enumerate_schedules(s, "lost_blocks")
    assert exact["complete"]
    assert exact["schedules"] <= round(10 ** estimate)
    if "run.split=even" in extra and "run.threads=3" not in extra:
        assert exact["schedules"] == round(10 ** estimate)


def test_dfs_finds_the_exact_worst_case_and_resumes_from_a_checkpoint(tmp_path):
    s = scenario(*TINY, "run.updates=2", "run.blocks=1")
    full = enumerate_schedules(s, "grad_error")
    sampled, _ = explore(s, "pct", 60, "grad_error", depth=2)
    assert full["values"]["max"] >= sampled["values"]["max"]
    state = tmp_path / "dfs.json"
    first = enumerate_schedules(s, "grad_error", limit=25, checkpoint=str(state))
    assert not first["complete"] and first["schedules"] == 25 and state.is_file()
    rest = enumerate_schedules(s, "grad_error", limit=1000, checkpoint=str(state))
    assert rest["complete"] and rest["schedules"] == 70 and not state.exists()
    assert rest["worst"] == full["worst"]


def test_a_dfs_checkpoint_resumes_only_the_search_it_was_made_for(tmp_path, capsys):
    """A checkpoint of another objective, preemption bound or scenario (or a file that is
    no checkpoint) is refused with one line naming --checkpoint, and is left as it was."""
    s = scenario(*TINY, "run.updates=2", "run.blocks=1")
    state = tmp_path / "dfs.json"
    enumerate_schedules(s, "lost_blocks", limit=20, checkpoint=str(state))
    saved = state.read_text()
    other = scenario(*TINY, "run.updates=2", "run.blocks=1", "run.threads=3",
                     "run.protocol=locked")
    for sc, objective, bound, reason in (
            (s, "staleness", None, "--objective lost_blocks, not staleness"),
            (s, "lost_blocks", 0, "--preemptions any, not 0"),
            (other, "lost_blocks", None, "another scenario")):
        with pytest.raises(ScenarioError, match=f"--checkpoint = .*: was made for {reason}"):
            enumerate_schedules(sc, objective, bound, checkpoint=str(state))
        assert state.read_text() == saved
    sets = [arg for o in (*TINY, "run.updates=2", "run.blocks=1") for arg in ("--set", o)]
    assert main(["explore", "--out", str(tmp_path / "x"), "--scheduler", "dfs", "--objective",
                 "lost_blocks", "--preemptions", "1", "--checkpoint", str(state), "--quiet",
                 *sets]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "x").exists()
    resumed = enumerate_schedules(s, "lost_blocks", limit=1000, checkpoint=str(state))
    assert resumed["complete"] and resumed["schedules"] == 70  # the search it was made for
    state.write_text("[]")
    with pytest.raises(ScenarioError, match=r"--checkpoint = .*: is not a checkpoint"):
        enumerate_schedules(s, "lost_blocks", checkpoint=str(state))


@pytest.mark.parametrize(("where", "said"), [("dir", "is a directory"),
                                            ("file/dfs.json", "lies under a file")])
def test_a_checkpoint_that_cannot_be_written_is_refused_before_the_search(tmp_path, capsys,
                                                                         where, said):
    """The checkpoint is written after the search: a directory, or a path under a file,
    failed there with a traceback; now one line before anything runs."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    sets = [arg for o in (*TINY, "run.updates=2", "run.blocks=1") for arg in ("--set", o)]
    assert main(["explore", "--out", str(tmp_path / "x"), "--scheduler", "dfs", "--checkpoint",
                 str(tmp_path / where), "--quiet", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--checkpoint" in err[0] and said in err[0], err
    assert not (tmp_path / "x").exists()


def test_a_long_schedule_written_inline_is_read_as_one(tmp_path, capsys):
    """A schedule too long to be a file name was tried as one (OSError: File name too long)."""
    sets = [arg for o in (*TINY, "run.updates=2", "run.blocks=1") for arg in ("--set", o)]
    assert main(["explore", "--out", str(tmp_path / "ex"), "--runs", "1", "--quiet",
                 *sets]) == 0
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "ex"), "--schedule", ".".join(["0"] * 400),
                 "--out", str(tmp_path / "again"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--schedule" in err[0] and "cannot act" in err[0], err


def test_a_dropped_write_records_the_one_step_it_takes():
    """Under a scheduler a dropped write is one action: its blocks' recorded write durations
    add up to its one step (the first block's), as every write's add up to its steps (one
    thread: nothing else acts while it writes)."""
    s = scenario("problem.dim=5", "problem.n_samples=20", "metrics.curve_points=0",
                 "run.threads=1", "run.updates=6", "run.blocks=2", "inject.drop=0.5")
    trace = run_schedule(s, Scheduler("dfs", 1)).trace
    offsets, dropped = trace["op_offsets"], trace["dropped"].astype(bool)
    assert dropped.any() and not dropped.all()
    for i in range(len(trace)):
        steps = trace["op_write_ns"][offsets[i]:offsets[i + 1]].tolist()
        assert sum(steps) == trace["write_end"][i] - trace["write_start"][i]
        assert steps == ([1, 0] if dropped[i] else [2, 2])


def test_properties_parse_and_reject_bad_text():
    prop = Property.parse("lost_fraction <= 0.5")
    assert (prop.metric, prop.op, prop.value) == ("lost_fraction", "<=", 0.5)
    assert str(Property.parse("staleness<3")) == "staleness < 3"
    for bad in ("speed <= 1", "lost_blocks == 0", "staleness <= x", "staleness"):
        with pytest.raises(ScenarioError, match="--property"):
            Property.parse(bad)


@pytest.mark.parametrize("text", ["lost_fraction <= 0.5", "lost_blocks <= 0",
                                  "staleness <= 2"])
def test_shrunk_counterexamples_violate_and_are_minimal(text):
    """The counterexample still violates the property, and no single removal — of one run of
    a thread, or of one step of a run — keeps it violating."""
    from simulator.problems import make_problem

    s = scenario(*TINY, "run.updates=6")
    prop = Property.parse(text)
    report = search_violation(s, prop, "random", 200)
    assert report["counterexample"] is not None
    minimal = parse_schedule(report["counterexample"])
    found = parse_schedule(report["found"])
    assert len(minimal) <= len(found)
    problem = make_problem(s.problem)
    f_star = problem.optimum()[1]

    def violates(prefix):
        try:
            run = run_schedule(s, Scheduler("dfs", 2, schedule=prefix), problem)
        except ScenarioError:
            return False
        return not prop.holds(run.trace, f_star)

    assert violates(minimal)
    runs = [(int(p.split("x")[0]), int(p.split("x")[1]) if "x" in p else 1)
            for p in report["counterexample"].split(".")]
    for i in range(len(runs)):
        fewer = [t for j, (t, n) in enumerate(runs) if j != i for _ in range(n)]
        assert not violates(fewer), (report["counterexample"], i)
        shorter = [t for j, (t, n) in enumerate(runs) for _ in range(n - (j == i))]
        assert not violates(shorter), (report["counterexample"], i)
    assert not violates(minimal[:-1])
    again = run_schedule(s, Scheduler("dfs", 2, schedule=minimal), problem)
    assert report["counterexample_preemptions"] == again.preemptions


def test_shrinking_shortens_every_run_not_only_the_last():
    """1x2.2 violates staleness <= 2 and so does 1.2 (its first run a step shorter): the
    shrinker finds it."""
    s = scenario(*TINY, "run.threads=3", "run.updates=6", "run.blocks=1")
    minimal, run = shrink(s, Property.parse("staleness <= 2"), parse_schedule("1x2.2"))
    assert format_schedule(minimal) == "1.2" and run.trace["staleness"].max() > 2


def test_preemptions_count_only_switches_away_from_a_thread_that_could_act():
    """0x11.2x8.1 switches thread twice, but thread 2 has finished when thread 1 takes over:
    one preemption, in the run and in a property search's report."""
    s = scenario(*TINY, "run.threads=3", "run.updates=6", "run.blocks=1")
    scheduler = Scheduler("dfs", 3, schedule=parse_schedule("0x11.2x8.1"))
    run = run_schedule(s, scheduler)
    assert 0 in scheduler.seen[11] and 2 not in scheduler.seen[19]
    assert run.preemptions == 1
    report = search_violation(s, Property.parse("staleness <= 2"), "pct", 300, 2, 0)
    scheduler = Scheduler("dfs", 3, schedule=parse_schedule(report["counterexample"]))
    path = run_schedule(s, scheduler).schedule
    switches = [i for i in range(1, len(path)) if path[i] != path[i - 1]]
    assert report["counterexample_preemptions"] == sum(
        path[i - 1] in scheduler.seen[i] for i in switches) < len(switches)


def test_cli_property_search_writes_the_counterexample(tmp_path):
    out = tmp_path / "prop"
    sets = [arg for o in (*TINY, "run.updates=6") for arg in ("--set", o)]
    code = main(["explore", "--out", str(out), "--scheduler", "random", "--runs", "200",
                 "--property", "lost_blocks <= 0", "--quiet", *sets])
    assert code == 1  # a violation was found
    report = json.loads((out / "explore.json").read_text())
    assert report["counterexample"] and (out / "worst" / "timeline.png").is_file()
    # The file holds the whole schedule the shrunk run executed: the shrunk prefix, then
    # the continuation; replaying it as written reproduces the violating run bit for bit.
    written = (out / "worst.schedule").read_text().strip()
    assert written == report["counterexample_schedule"]
    assert parse_schedule(written)[:len(parse_schedule(report["counterexample"]))] == \
        parse_schedule(report["counterexample"])
    assert main(["replay", str(out), "--schedule", str(out / "worst.schedule"), "--out",
                 str(tmp_path / "again"), "--quiet"]) == 0
    for name in ("trace.npz", "summary.json"):
        assert (tmp_path / "again" / name).read_bytes() == (out / "worst" / name).read_bytes()
    held = main(["explore", "--out", str(tmp_path / "ok"), "--scheduler", "random", "--runs",
                 "20", "--property", "lost_blocks >= 0", "--quiet", *sets])
    assert held == 0


@pytest.mark.parametrize("args, message", [
    (("--scheduler", "adversarial", "--property", "lost_blocks <= 0"),
     "--scheduler = 'adversarial': with --property must be one of random, roundrobin, pct"),
    (("--scheduler", "fixed", "--property", "lost_blocks <= 0"),
     "--scheduler = 'fixed': with --property must be one of"),
    (("--scheduler", "dfs", "--runs", "0", "--property", "lost_blocks <= 0"),
     "--scheduler = 'dfs': with --property must be one of"),
    (("--scheduler", "random", "--runs", "0", "--property", "lost_blocks <= 0"),
     "--runs = 0: must be >= 1"),
    (("--scheduler", "pct", "--runs", "-3", "--property", "lost_blocks <= 0"),
     "--runs = -3: must be >= 1"),
    (("--scheduler", "random", "--preemptions", "1"),
     "--preemptions = 1: applies to --scheduler dfs only (not random)"),
    (("--scheduler", "pct", "--checkpoint", "dfs.json"),
     "--checkpoint = 'dfs.json': applies to --scheduler dfs only (not pct)"),
    (("--scheduler", "pct", "--preemptions", "0", "--property", "lost_blocks <= 0"),
     "--preemptions = 0: applies to --scheduler dfs only (not pct)"),
    (("--scheduler", "random", "--depth", "3"),
     "--depth = 3: applies to --scheduler pct only (not random)"),
    (("--scheduler", "roundrobin", "--seed", "4", "--property", "lost_blocks <= 0"),
     "--seed = 4: applies to --scheduler random or pct only (not roundrobin)"),
    (("--scheduler", "dfs", "--depth", "2"),
     "--depth = 2: applies to --scheduler pct only (not dfs)"),
    (("--scheduler", "adversarial", "--runs", "10"),
     "--runs = 10: applies to --scheduler random or pct or dfs only (not adversarial)"),
    (("--scheduler", "roundrobin", "--runs", "4"),
     "--runs = 4: applies to --scheduler random or pct or dfs only (not roundrobin)"),
    (("--scheduler", "dfs", "--keep", "3"),
     "--keep = 3: applies to --scheduler random or pct only (not dfs)"),
    (("--scheduler", "roundrobin", "--keep", "5"),
     "--keep = 5: applies to --scheduler random or pct only (not roundrobin)"),
    (("--scheduler", "random", "--keep", "3", "--property", "lost_blocks <= 0"),
     "--keep = 3: does not apply with --property"),
    (("--scheduler", "random", "--objective", "staleness", "--property", "lost_blocks <= 0"),
     "--objective = 'staleness': does not apply with --property"),
    (("--scheduler", "bogus", "--runs", "3"),
     "--scheduler = 'bogus': must be one of random, roundrobin, pct, fixed, dfs"),
])
def test_explore_refuses_options_its_scheduler_would_not_honour(tmp_path, capsys, args,
                                                                 message):
    """A property search with no run or with a scheduler it cannot search with, and an
    option given to a scheduler that would ignore it (only pct has a depth, random and pct
    a seed, dfs preemptions and a checkpoint; adversarial's search decides its runs; a
    property search has no objective to keep the worst by): one line naming the option,
    exit 2, nothing written."""
    sets = [arg for o in (*TINY, "run.updates=2") for arg in ("--set", o)]
    out = tmp_path / "x"
    objective = () if "--property" in args else ("--objective", "lost_blocks")
    assert main(["explore", "--out", str(out), "--quiet", *objective, *args, *sets]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_roundrobin_explores_its_one_schedule_once(tmp_path):
    """roundrobin draws nothing: the command runs its schedule once and reports no seed or
    depth (--runs, --keep, --seed and --depth are refused for it)."""
    sets = [arg for o in (*TINY, "run.updates=3") for arg in ("--set", o)]
    out = tmp_path / "rr"
    assert main(["explore", "--out", str(out), "--quiet", "--scheduler", "roundrobin",
                 *sets]) == 0
    report = json.loads((out / "explore.json").read_text())
    assert (report["runs"], report["seed"], report["depth"]) == (1, None, None)
    assert [w["seed"] for w in report["worst"]] == [None]


@pytest.mark.parametrize("extra, reason", [
    (("run.protocol=admm",), "not measured under admm"),
    (("metrics.exact=false",), r"needs the exact metrics \(metrics.exact = true\)"),
])
def test_a_gradient_error_the_runs_do_not_measure_is_refused(tmp_path, capsys, extra, reason):
    """Where no run measures δ (admm's local solves, exact metrics off) every run would
    score 0 on grad_error: each way of asking for it is refused, naming the flag, and the
    command writes nothing."""
    sc = scenario(*TINY, "run.updates=2", *extra)
    for call in (lambda: explore(sc, "random", 5, "grad_error"),
                 lambda: explore(sc, "dfs", 5, "grad_error"),
                 lambda: explore(sc, "adversarial", 5, "grad_error")):
        with pytest.raises(ScenarioError, match=f"--objective = 'grad_error': .*{reason}"):
            call()
    with pytest.raises(ScenarioError, match=f"--property = 'grad_error': .*{reason}"):
        search_violation(sc, Property.parse("grad_error <= 0.5"), "random", 5)
    sets = [arg for o in (*TINY, "run.updates=2", *extra) for arg in ("--set", o)]
    assert main(["explore", "--out", str(tmp_path / "x"), "--objective", "grad_error",
                 "--runs", "5", *sets]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "x").exists()
    assert explore(sc, "random", 5, "staleness")[0]["runs"] == 5  # other objectives run


def test_adversarial_greedy_search_finds_the_exact_worst_case_of_a_small_run():
    s = scenario(*TINY, "run.updates=2", "run.blocks=1")
    exact = enumerate_schedules(s, "grad_error")["values"]["max"]
    report, _ = explore(s, "adversarial", 1, "grad_error")
    assert report["worst"][0]["value"] == exact and report["replayed_identically"]
    bigger = scenario(*TINY, "run.updates=4")
    greedy, _ = explore(bigger, "adversarial", 1, "grad_error")
    sampled, _ = explore(bigger, "random", 100, "grad_error")
    assert greedy["worst"][0]["value"] >= sampled["values"]["max"]


PROTOCOLS = ("lockfree", "serial", "locked", "roundrobin", "minibatch", "paramserver",
             "staleness_lr", "dcasgd", "admm")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_protocol_runs_under_a_scheduler_and_replays_bit_for_bit(protocol):
    """The scheduler is a time source for the engine's own loop, so every protocol runs under
    it: locks and barriers hold a thread out of the runnable set until they open."""
    s = scenario("run.threads=3", "problem.dim=6", "run.blocks=2", "run.updates=9",
                 "problem.n_samples=30", f"run.protocol={protocol}")
    first = run_schedule(s, Scheduler("random", 3, seed=5))
    again = run_schedule(s, Scheduler("fixed", 3, schedule=parse_schedule(first.text)))
    assert again.text == first.text and first.trace.source == "scheduled"
    for name, values in first.trace.arrays.items():
        assert np.array_equal(values, again.trace[name], equal_nan=True), name
    t = first.trace
    assert len(t["uid"]) == 9 and (t["step"] > 0).sum() == 9  # every update applied once
    if protocol in ("serial", "locked"):  # one update at a time: nothing stale, nothing lost
        assert t["staleness"].max() == 0 and t["lost_blocks"].sum() == 0
    if protocol in ("roundrobin", "minibatch", "paramserver", "admm"):  # writes in turn
        assert t["lost_blocks"].sum() == 0


def test_a_lock_free_server_under_a_schedule_is_the_lock_free_protocol_under_it():
    """Under a scheduler a lock-free server's load is an action of its own, as every
    load_store write's (its link plays no part): the server follows the schedule a
    lockfree run took and is that run, lost blocks included."""
    base = ("run.threads=3", "problem.dim=6", "run.blocks=2", "run.updates=9",
            "problem.n_samples=30")
    lockfree = run_schedule(scenario(*base), Scheduler("random", 3, seed=5))
    server = run_schedule(scenario(*base, "run.protocol=paramserver",
                                   "paramserver.lock_free=true", "devices.0.latency=500"),
                          Scheduler("fixed", 3, schedule=parse_schedule(lockfree.text)))
    assert server.text == lockfree.text and lockfree.trace["lost_blocks"].sum() > 0
    for name, values in lockfree.trace.arrays.items():
        assert np.array_equal(values, server.trace[name], equal_nan=True), name


@pytest.mark.parametrize("extra", [
    ("run.protocol=paramserver", "paramserver.fraction=0.5"),
    ("run.protocol=paramserver", "paramserver.fraction=0.5", "paramserver.warm_start=1"),
    ("run.protocol=minibatch",),
])
def test_a_read_belongs_to_the_round_open_when_it_begins(extra):
    """A read that waited for a round's write is let go when the write ends, but under a
    scheduler it begins only when its thread is chosen again, perhaps rounds later: it
    belongs to the round open then. So whatever the schedule, an applied gradient was
    computed on its round's vector (staleness 0), a discarded one read before a round
    closed without it (a round's write began after its read and before it arrived), and no
    read begins inside a round's write."""
    s = scenario("run.threads=3", "problem.dim=4", "run.blocks=2", "run.updates=8",
                 "problem.n_samples=20", "metrics.curve_points=0", *extra)
    # By hand (paramserver, 2 of 3 workers a round): thread 2 asks to read during round
    # 0's write and is chosen again only after round 1 closed without it.
    schedules = [Scheduler("fixed", 3, schedule=[0, 1, 0, 1, 0, 1, 0, 1, 2, 1])] * (
        extra == ("run.protocol=paramserver", "paramserver.fraction=0.5")) + [
        Scheduler(kind, 3, seed, 2, 40) for kind in ("random", "pct") for seed in range(40)]
    for scheduler in schedules:
        if scheduler.kind == "fixed":  # the hand-made prefix, then no preemption
            scheduler.kind = "dfs"
        t = run_schedule(s, scheduler).trace
        applied = t["step"] > 0
        assert (t["staleness"][applied] == 0).all(), scheduler.text
        writes = [(t["write_start"][i], t["write_end"][i]) for i in np.flatnonzero(applied)
                  if t["write_end"][i] > t["write_start"][i]]
        for i in np.flatnonzero(~applied):
            assert any(t["read_start"][i] < a <= t["write_start"][i] for a, _ in writes), (
                scheduler.text, i)
        assert not any(a < r < b for r in t["read_start"] for a, b in writes), scheduler.text


def test_a_thread_chosen_at_a_closed_gate_waits_and_is_chosen_again():
    """Under the lock only its holder acts. A thread is asked for the lock at the step it is
    chosen to begin its read: thread 1 tries at step 1 and waits (the step passes without an
    action), is not runnable while thread 0 finishes (gradient, load, store), and reads once
    chosen again (step 5); then thread 0 tries at step 6 and waits in turn."""
    s = scenario(*TINY, "run.blocks=1", "run.updates=3", "run.protocol=locked")
    run = run_schedule(s, Scheduler("roundrobin", 2))
    assert run.text == "0.1.0x3.1.0.1x3.0x4"
    t = run.trace
    assert t["read_start"].tolist() == [0, 5, 10] and t["write_end"].tolist() == [5, 10, 14]
    assert t["staleness"].tolist() == [0, 0, 0]


def test_a_rule_sees_the_completions_before_its_write_begins():
    """staleness_lr under a scheduler: thread 0 reads and computes, thread 1 then makes two
    whole updates, and thread 0's write, chosen after those completions, is scaled for a
    staleness of 2 (the rule is applied at the step the write begins)."""
    s = scenario(*TINY, "run.blocks=1", "run.updates=3", "run.protocol=staleness_lr")
    run = run_schedule(s, Scheduler("fixed", 2, schedule=[0, 0, *[1] * 8, 0, 0]))
    t = run.trace
    first = int(np.flatnonzero(t["uid"] == 0)[0])
    assert t["staleness"][first] == 2
    assert t["lr_scale"][first] == staleness_scale(2) == 0.5


class _SometimesEmpty(SparseLogisticProblem):
    """Every third sample has no coordinates: its read and write have no action at all."""

    def support(self, idx: int) -> np.ndarray:
        return super().support(idx)[:0] if idx % 3 == 0 else super().support(idx)

    def grad(self, w: np.ndarray, idx: int):
        g, cols = super().grad(w, idx)
        return (g[:0], cols[:0]) if idx % 3 == 0 else (g, cols)


def test_a_phase_without_actions_does_not_carry_its_choice_past_a_gate():
    """A read of no block uses no step; a thread that then waits at the lock must be chosen
    again, and the run still makes every update."""
    s = scenario("problem.name=sparse_logistic", "problem.dim=12", "run.threads=3",
                 "run.blocks=3", "run.updates=9", "run.protocol=locked", "metrics.exact=false",
                 "metrics.curve_points=0")
    spec = s.problem
    problem = _SometimesEmpty.synthetic(spec.dim, spec.n_samples, spec.l2, spec.density,
                                       spec.seed)
    for kind in ("random", "roundrobin", "pct"):
        run = run_schedule(s, Scheduler(kind, 3, seed=1, depth=2, steps=60), problem)
        assert len(run.trace) == 9 and (run.trace["step"] > 0).sum() == 9
        again = run_schedule(s, Scheduler("fixed", 3, schedule=run.schedule), problem)
        assert again.text == run.text


@pytest.mark.parametrize("extra", [("inject.drop=0.5",), ("inject.delay=2",),
                                   ("run.lr_schedule=inv_sqrt",), ("run.split=even",),
                                   ("inject.error=noise", "inject.error_bound=0.1")])
def test_injections_and_schedules_are_honoured_under_a_scheduler(extra):
    s = scenario("run.threads=3", "problem.dim=6", "run.blocks=2", "run.updates=12",
                 "problem.n_samples=30", *extra)
    first = run_schedule(s, Scheduler("random", 3, seed=2))
    again = run_schedule(s, Scheduler("fixed", 3, schedule=first.schedule))
    for name, values in first.trace.arrays.items():
        assert np.array_equal(values, again.trace[name], equal_nan=True), name
    t = first.trace
    if extra[0] == "inject.drop=0.5":
        assert 0 < t["dropped"].sum() < 12
    if extra[0] == "inject.delay=2":  # τ = 2 once two completions exist to lag behind
        assert t["delay"].max() == 2 and (t["staleness"] >= t["delay"]).all()
    if extra[0] == "run.lr_schedule=inv_sqrt":
        assert t["lr_scale"].min() < 1.0
    if extra[0] == "run.split=even":
        assert np.bincount(t["thread"]).tolist() == [4, 4, 4]
    if extra[0] == "inject.error=noise":
        assert (t["error_norm"] > 0).all()


def test_a_read_between_grain_stores_copies_half_a_write():
    """``run.store_grain = 1`` under a scheduler: thread 0 reads, computes, loads and stores
    coordinate 0 (4 steps); thread 1 then reads (1 step) a block holding half of thread 0's
    step, and the run ends each in turn. w_T, worked by hand from the problem's gradients:
    w0 − lr·g(w0) − lr·g(w_half), w_half = w0 with coordinate 0 stepped."""
    s = scenario("problem.name=quadratic", "problem.dim=2", "problem.n_samples=10",
                 "run.threads=2", "run.blocks=1", "run.store_grain=1", "run.updates=2",
                 "run.lr=0.05", "metrics.curve_points=0")
    run = run_schedule(s, Scheduler("dfs", 2, schedule=[0, 0, 0, 0, 1, 0, 0]))
    assert run.text == "0x4.1.0x2.1x5"  # thread 1: gradient, then two grains (load, store)
    t, problem = run.trace, run.problem
    w0, lr = problem.initial(), 0.05
    g0, _ = problem.grad(w0.copy(), int(t["sample"][0]))
    half = w0 - lr * g0 * np.array([1.0, 0.0])
    g1, _ = problem.grad(half, int(t["sample"][1]))
    np.testing.assert_array_equal(t["w_final"], w0 - lr * g0 - lr * g1)
    assert t["lost_blocks"].sum() == 0 and t["staleness"].tolist() == [0, 1]
    assert t["op_write_ns"].tolist() == [4, 4]  # the steps taken: two grains, load and store


PROBLEMS = {
    "quadratic": ("problem.name=quadratic", "problem.dim=6"),
    "logistic": ("problem.dim=6",),
    "sparse_logistic": ("problem.name=sparse_logistic", "problem.dim=40",
                        "problem.density=0.1"),
    "mlp": ("problem.name=mlp", "problem.dim=4", "problem.hidden=3", "problem.classes=3"),
    "lstm_tagger": ("problem.name=lstm_tagger", "problem.dim=5", "problem.hidden=2",
                    "problem.classes=2", "problem.length=3"),
    "dense_crf": ("problem.name=dense_crf", "problem.dim=5", "problem.hidden=2",
                  "problem.classes=2", "problem.length=3"),
}


@pytest.mark.parametrize("write_mode", ["load_store", "atomic_add"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_every_problem_runs_under_a_scheduler(name, write_mode):
    """Each built-in problem (sparse supports, networks, taggers) under schedules, k = 3,
    B = 3: a schedule that runs every update whole is serial SGD, bit for bit the same as a
    plain loop over the problem's own gradients in the trace's sample order; random
    interleavings replay bit for bit, and every store a ``load_store`` run lost is one that
    another update's store overwrote (``atomic_add`` loses none)."""
    s = scenario(*PROBLEMS[name], "problem.n_samples=30", "run.threads=3", "run.blocks=3",
                 "run.updates=6", "metrics.curve_points=3", f"run.write_mode={write_mode}")
    whole = run_schedule(s, Scheduler("dfs", 3))  # the running thread goes on while it can
    t, problem = whole.trace, whole.problem
    assert t["staleness"].max() == 0 and t["lost_blocks"].sum() == 0
    w = problem.initial().copy()
    for sample in t["sample"].tolist():
        values, support = problem.grad(w, sample)
        if support is None:
            w -= s.run.lr * values
        else:
            w[support] -= s.run.lr * values
    np.testing.assert_array_equal(t["w_final"], w)
    lost = 0
    for seed in range(8):
        run = run_schedule(s, Scheduler("random", 3, seed=seed), problem)
        again = run_schedule(s, Scheduler("fixed", 3, schedule=parse_schedule(run.text)),
                             problem)
        for column, values in run.trace.arrays.items():
            assert np.array_equal(values, again.trace[column], equal_nan=True), column
        assert run.trace["lost_blocks"].sum() == run.trace["overwrote"].sum()
        lost += int(run.trace["lost_blocks"].sum())
    assert (lost > 0) == (write_mode == "load_store")


def test_cli_adversarial_search_prints_its_summary(tmp_path, capsys):
    """`explore --scheduler adversarial` without --quiet prints its summary (it crashed on a
    missing depth after writing its files)."""
    assert main(["explore", "--scheduler", "adversarial", "--set", "run.threads=2",
                 "--set", "run.updates=4", "--set", "problem.dim=4",
                 "--set", "problem.n_samples=20", "--out", str(tmp_path / "x")]) == 0
    assert "adversarial schedules" in capsys.readouterr().out
