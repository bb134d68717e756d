"""Model-parallel real runs (realrun/pipeline.py): one process per stage of a layered model,
against the simulation of the scenario they record. What the stages compute is
deterministic where the simulator says so (``amp`` with one sample in flight, ``local``
always: each stage's writes are its own, in its own order), and checked to the bit; what
depends on the machine's timing (staleness, the loss reached with several samples in
flight) is checked for its order and within stated factors."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from realrun import support
from realrun.pipeline import run_pipeline
from realrun.runner import summary_extra
from simulator.cli import main as asyngrad
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.problems import make_problem
from simulator.rundir import write_run
from simulator.scenario import with_overrides
from tests.conftest import scenario
from tests.realrun.test_faults import _gone, _mapped

pytestmark = pytest.mark.alone

STAGED = ("problem.name=mlp", "run.threads=2", "run.blocks=2", "problem.n_samples=200",
          "problem.dim=6", "problem.hidden=5", "problem.classes=3", "problem.l2=0.001",
          "run.lr=0.05")
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def problem():
    """The stages' problem, its optimum estimated once for the module's runs."""
    made = make_problem(scenario(*STAGED).problem)
    made.optimum()
    return made


def _run(problem, protocol, *overrides, **kwargs):
    run = run_pipeline(scenario(f"run.protocol={protocol}", *STAGED, *overrides), "float64",
                       TIMEOUT, problem=problem, **kwargs)
    assert run.failure is None, run.failure
    return run


@pytest.fixture(scope="module")
def amp4(problem):
    """amp with four samples in flight: 1,000 samples."""
    return _run(problem, "amp", "run.updates=2000", "amp.max_active=4")


@pytest.fixture(scope="module")
def local4(problem):
    """local with four samples in flight, two gradients a write, and its last stage 3 times
    as slow."""
    return _run(problem, "local", "run.updates=2000", "local.max_active=4",
                "local.update_every=2", "inject.stragglers=[{thread=1, factor=3.0}]")


def _rows(trace):
    """The trace's rows by stage, then by the stage's order."""
    return np.lexsort((trace["thread_seq"], trace["thread"]))


def _same_rows_and_vector(real, sim):
    """Each (stage, row) has the same sample, and the final vectors are equal."""
    assert np.array_equal(real["thread"][_rows(real)], sim["thread"][_rows(sim)])
    assert np.array_equal(real["sample"][_rows(real)], sim["sample"][_rows(sim)])
    np.testing.assert_allclose(real["w_final"], sim["w_final"], rtol=0, atol=1e-12)


def _complete(trace, samples, every=1):
    """S rows per sample: each stage made ``samples`` rows, its i-th row the i-th sample to
    enter (the first stage's i-th); each stage's ``every`` rows share a completion, in its
    order, and the rows are in completion order."""
    assert len(trace) == 2 * samples and trace.source == "real"
    rows = _rows(trace)
    first, last = (trace["sample"][rows][trace["thread"][rows] == s] for s in (0, 1))
    assert first.size == last.size == samples and np.array_equal(first, last)
    for s in (0, 1):
        steps = trace["step"][rows][trace["thread"][rows] == s].reshape(-1, every)
        assert np.all(steps == steps[:, :1]) and np.all(np.diff(steps[:, 0]) > 0)
    assert np.all(np.diff(trace["step"]) >= 0) and trace["step"].min() == 1
    assert trace["step"].max() == 2 * samples // every


def test_amp_with_one_sample_in_flight_is_serial_sgd(problem):
    """max_active = 1: the stages' writes are serial SGD on the samples stage 0 drew (to
    1e-12), the simulation of the recorded scenario draws the same samples in every row and
    ends at the same vector, and the first 20 samples are the simulator's thread 0's."""
    run = _run(problem, "amp", "run.updates=400", "amp.max_active=1")
    trace, lr = run.trace, run.scenario.run.lr
    _complete(trace, 200)
    w = problem.initial()
    first = trace["thread"] == 0
    for sample in trace["sample"][first][np.argsort(trace["thread_seq"][first])].tolist():
        w -= lr * problem.grad(w, sample)[0]
    np.testing.assert_allclose(trace["w_final"], w, rtol=0, atol=1e-12)
    _same_rows_and_vector(trace, simulate(run.scenario, problem))
    assert run.scenario.run.protocol == "amp" and run.scenario.metrics.exact is False


def test_local_is_greedy_layerwise_sgd_whatever_is_in_flight(problem, local4):
    """local with four samples in flight (two gradients a write, a slow last stage) trains
    each stage on its own rows in its own order: every row's sample and the final vector
    are the simulation's with one sample in flight, greedy layer-wise SGD (averaged two at
    a time; the simulator's test writes it out); the run is complete and the straggler's
    backwards take longer than stage 0's."""
    trace = local4.trace
    _complete(trace, 1000, every=2)
    serial = with_overrides(local4.scenario, ["local.max_active=1"])
    _same_rows_and_vector(trace, simulate(serial, problem))
    grad = [np.median(trace["grad_ns"][trace["thread"] == s]) for s in (0, 1)]
    # (Unslowed, stage 0's local backward takes about 1.5 times stage 1's.)
    assert grad[1] > 1.2 * grad[0]
    assert trace["staleness"].max() <= 2 * 4  # at most the samples in flight, both stages


def test_amp_with_four_samples_in_flight_is_staler_near_the_input(problem, amp4):
    """Four samples in flight: the trace is complete, stage 0's gradients are staler than
    stage 1's, as in the simulation of the scenario, and the run's final suboptimality is
    within 2x of the simulation's."""
    trace = amp4.trace
    _complete(trace, 1000)
    sim = simulate(amp4.scenario, problem)
    for t in (trace, sim):
        stale = [t["staleness"][t["thread"] == s].mean() for s in (0, 1)]
        assert stale[0] > stale[1]
    f_star = problem.optimum()[1]
    real, simulated = (problem.full_loss(t["w_final"]) - f_star for t in (trace, sim))
    assert 0 < real < 2 * simulated
    assert real < 0.5 * (problem.full_loss(problem.initial()) - f_star)


def test_a_real_pipeline_writes_a_run_directory_compare_reads(tmp_path, problem, amp4):
    """The run directory holds the stages' summary and the pipeline plot, as a simulated
    one; ``asyngrad compare`` reads it against the simulation of its scenario."""
    real, sim = tmp_path / "real", tmp_path / "sim"
    summary = write_run(real, amp4.scenario, amp4.trace, problem, extra=summary_extra(amp4))
    assert [s["updates"] for s in summary["stages"]] == [1000, 1000]
    assert summary["real"]["mode"] == "amp" and summary["real"]["workers"] == 2
    assert (real / "pipeline.png").is_file()
    assert asyngrad(["simulate", str(real / "scenario.toml"), "--out", str(sim),
                     "--quiet"]) == 0
    out = tmp_path / "compare"
    assert asyngrad(["compare", str(real), str(sim), "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "compare.json").read_text())
    assert report["a"]["updates"] == report["b"]["updates"] == 2000


def test_a_killed_stage_ends_the_run_cleanly(problem):
    """Stage 1 killed mid-run: the run stops with the failure named, keeps the rows
    completed before it (a trace that loads), and leaves no stage process nor anything
    they mapped in /dev/shm."""
    pids: list[int] = []
    mapped: set[str] = set()
    seen = [0]

    def kill(rows: int) -> None:
        seen[0] += rows
        if seen[0] > 200 and not mapped:
            mapped.update(_mapped(set(pids)))
            os.kill(pids[1], signal.SIGKILL)

    run = run_pipeline(scenario("run.protocol=amp", *STAGED, "run.updates=2000000"),
                       "float64", TIMEOUT, kill, pids.extend, problem)
    assert run.failure == {"worker": 1, "reason": "killed by signal 9"}
    assert 200 < len(run.trace) < 2_000_000
    assert np.all(np.diff(run.trace["step"]) >= 0)
    assert all(_gone(pid) for pid in pids)
    assert mapped and not mapped & set(os.listdir("/dev/shm"))


@pytest.mark.parametrize(("override", "field"), [
    ("inject.delay=2", "inject.delay"),
    ("inject.drop=0.1", "inject.drop"),
    ("inject.stragglers=[{thread=1, factor=0.5}]", "inject.stragglers.0.factor"),
    ("run.threads=3", "run.threads"),
    ("run.updates=201", "run.updates"),
    ("amp.max_active=5000", "amp.max_active"),
])
def test_what_the_stages_do_not_run_is_refused_before_they_start(override, field):
    pids: list[int] = []
    with pytest.raises(ScenarioError) as err:
        run_pipeline(scenario("run.protocol=amp", *STAGED, "run.updates=200", override),
                     on_start=pids.extend)
    assert err.value.field == field and not pids


@pytest.mark.parametrize("protocol", ["amp", "local"])
def test_a_dead_stage_stalls_the_pipeline_and_the_run_ends_early(problem, protocol):
    """``[[inject.deaths]]``: stage 1 stops 20 ms after the start, before its next phase. The
    run is no failure and ends early, long before its timeout: stage 0 stops once no
    message can come (under ``amp`` it writes no sample stage 1 did not pass back, one of
    which stage 1 may not have written: it sends a gradient back before its write; under
    ``local`` at most the samples that were in flight more), the trace names stage 1 dead
    (``extra_dead_threads``), and its rows are whole. The simulation of the scenario stalls
    the same way. (At 5 ms a loaded machine's stage 1 had made no row yet; a read may start
    up to 10 ms after the death: the stage can lose its core after it looked at the
    clock.)"""
    quota = 200_000
    run = _run(problem, protocol, f"run.updates={2 * quota}", f"{protocol}.max_active=4",
               "inject.deaths=[{thread=1, at=20000000}]")
    trace = run.trace
    assert trace["extra_dead_threads"].tolist() == [1]
    made = np.bincount(trace["thread"], minlength=2)
    assert 0 < made[1] < quota
    if protocol == "amp":
        assert made[0] <= made[1] + 1
    else:
        assert made[1] <= made[0] <= made[1] + 4
    assert trace["read_start"][trace["thread"] == 1].max() < 20_000_000 + 10_000_000
    assert np.all(np.diff(trace["step"]) >= 0)
    simulated = simulate(run.scenario, problem)
    assert simulated["extra_dead_threads"].tolist() == [1] and len(simulated) < 2 * quota


def test_a_paused_stage_starts_no_phase_in_its_window(problem):
    """``[[inject.pauses]]``: stage 0 starts no forward, backward or write 20-30 ms after the
    start (the trace's clock starts at the first forward, a little later), while the last
    stage goes on with the samples that were in flight; the run completes."""
    run = _run(problem, "amp", "run.updates=8000", "amp.max_active=4",
               "inject.pauses=[{thread=0, start=20000000, end=30000000}]")
    trace = run.trace
    assert len(trace) == 8000
    mine = trace["thread"] == 0
    began = np.sort(np.concatenate([trace[c][mine] for c in ("read_start", "grad_start",
                                                               "write_start")]))
    gap = int(np.argmax(np.diff(began)))
    assert began[gap + 1] - began[gap] >= 9_000_000  # the window, less the clock's offset
    assert began[gap] < 21_000_000 and began[gap + 1] >= 29_000_000


@pytest.mark.skipif("amp" not in support.PROTOCOL_OF,
                    reason="realrun/support.py does not know the pipelines yet")
def test_asyngrad_real_runs_the_pipeline(tmp_path):
    """``asyngrad real`` with run.protocol = amp runs one process per stage (the default
    workers: run.threads) and writes the run directory; with ``--measure`` every stage's
    gradient errors are in its summary."""
    out = tmp_path / "run"
    sets = [a for o in ("run.protocol=amp", *STAGED, "run.updates=200")
            for a in ("--set", o)]
    assert asyngrad(["real", *sets, "--out", str(out), "--quiet", "--measure"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["mode"] == "amp" and len(summary["stages"]) == 2
    assert summary["real"]["measure_every"] == 1
    assert summary["real"]["hardware_loss"]["rebuilt_vs_real_norm"] == 0
    assert all(np.isfinite(stage["relative_error"]["p50"]) for stage in summary["stages"])
    assert (out / "pipeline.png").is_file()


@pytest.mark.parametrize("every", [1, 3])
def test_measure_mode_rebuilds_each_stages_gradient_errors(problem, every):
    """``--measure``: the stages keep each write's step, and the parent rebuilds the
    serialized view from w_0 in completion order (the real vector exactly: each stage alone
    writes its block) and measures every ``every``-th completion's δ on its stage, on the
    group's writer row (``amp.update_every`` 2: its member unmeasured), and the exact loss
    curve. Four samples in flight: the first stage's gradients are further from the exact
    ones than the last stage's, and its median ‖δ‖/‖g‖ is within 2× of the simulation's
    (five runs: 0.032-0.038 real, 0.041 simulated; the last stage's is 0.007-0.017 real,
    0.0015 simulated: a real message takes longer than the simulated one, so stage 0 writes
    more often while stage 1 works from its activation)."""
    run = _run(problem, "amp", "run.updates=4000", "amp.max_active=4", "amp.update_every=2",
               measure_every=every)
    trace = run.trace
    _complete(trace, 2000, every=2)
    assert run.hardware_loss["rebuilt_vs_real_norm"] == 0
    writer = trace["write_end"] > trace["write_start"]
    measured = trace["measured"]
    assert not measured[~writer].any()
    assert measured.sum() == (trace["step"].max() // every)
    assert np.isfinite(trace["delta_norm"][measured]).all()
    assert trace["curve_loss"][-1] == problem.full_loss(trace["w_final"])
    assert trace["curve_t"][-1] == trace["step"].max()
    rel = trace["delta_norm"] / trace["g_norm"]
    sim = simulate(run.scenario, problem)
    simulated = sim["delta_norm"] / sim["g_norm"]
    ours, theirs = ([np.median(r[(t["thread"] == s) & t["measured"]]) for s in (0, 1)]
                    for r, t in ((rel, trace), (simulated, sim)))
    assert ours[0] > ours[1]
    assert 0.5 < ours[0] / theirs[0] < 2


def test_the_lstm_taggers_stages_run_as_simulated():
    """Another layered model: the lstm_tagger's embeddings and LSTM, then its output layer,
    passing a sequence's hidden states forward and their gradients back; with one sample in
    flight every row and the final vector are the simulation's."""
    run = run_pipeline(scenario("run.protocol=amp", "problem.name=lstm_tagger",
                                "problem.n_samples=50", "problem.dim=30", "problem.hidden=8",
                                "problem.classes=4", "run.threads=2", "run.blocks=2",
                                "run.updates=200", "amp.max_active=1"), "float64", TIMEOUT)
    assert run.failure is None, run.failure
    _complete(run.trace, 100)
    _same_rows_and_vector(run.trace, simulate(run.scenario, run.problem))


def test_a_torch_sequential_split_into_three_stages_runs_as_simulated():
    """A user's ``nn.Sequential`` cut into three stages (``problem.split_at``: a small
    convolutional network on minibatches of 8 digits): three stage processes, each its own
    children, pass a minibatch's activations forward and their gradients back; with one
    minibatch in flight every row and the final vector are the simulation's (to 1e-12), and
    under ``local`` (its mlp twin, two stages, three minibatches in flight) to the bit."""
    from tests.simulator.problems import torch_models

    models = torch_models.__file__
    run = run_pipeline(scenario("run.protocol=amp", "problem.name=torch",
                                f"problem.model={models}:convnet_sequential",
                                "problem.split_at=['3', '6']", "problem.batch=8",
                                "run.threads=3", "run.blocks=3", "run.updates=90",
                                "amp.max_active=1", "run.lr=0.05"), "float64", TIMEOUT)
    assert run.failure is None, run.failure
    trace = run.trace
    assert len(trace) == 90 and sorted(set(trace["thread"].tolist())) == [0, 1, 2]
    _same_rows_and_vector(trace, simulate(run.scenario, run.problem))
    local = run_pipeline(scenario("run.protocol=local", "problem.name=torch",
                                  f"problem.model={models}:mlp", "problem.split_at=['2']",
                                  "run.threads=2", "run.blocks=2", "run.updates=400",
                                  "local.max_active=3", "run.lr=0.05"), "float64", TIMEOUT)
    assert local.failure is None, local.failure
    _complete(local.trace, 200)
    simulated = simulate(with_overrides(local.scenario, ["local.max_active=1"]), local.problem)
    assert np.array_equal(local.trace["w_final"], simulated["w_final"])
