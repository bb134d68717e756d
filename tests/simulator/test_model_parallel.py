"""Model-parallel training: asynchronous model parallelism (``run.protocol = "amp"``),
layer-wise local parallelism (``"local"``) and stochastic block ADMM (``"block_admm"``). The
stages' passes against the whole model's gradient, a two-stage pipeline's timeline worked by
hand, one sample in flight against serial SGD and against greedy layer-wise SGD written out
here, what the pipeline does to each stage's gradients, and block ADMM reaching a convex
problem's optimum."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cli import main as asyngrad
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate
from simulator.problems import make_problem
from simulator.problems.builtin import QuadraticProblem
from simulator.replay import replay
from simulator.rules import mean_step
from simulator.schedule import explore
from tests.conftest import CONSTANT, scenario

STAGED = ("problem.name=mlp", "run.threads=2", "run.blocks=2", "problem.n_samples=200",
          "problem.dim=6", "problem.hidden=5", "problem.classes=3")
MLP = ("run.protocol=amp", *STAGED)
LOCAL = ("run.protocol=local", *STAGED)
# Stage 0 holds 3·2 + 3 = 9 parameters, stage 1 3·3 + 3 = 12: a 2100 ns gradient is 900 ns
# of stage 0's work (a 300 ns forward, a 600 ns backward) and 1200 of stage 1's (400, 800).
SMALL = ("problem.dim=2", "problem.hidden=3", "problem.classes=3", "problem.n_samples=20")
TIMED = (*CONSTANT, "timing.read.mean=0", "timing.write.mean=0", "timing.grad.mean=2100")


TAGGER = ("problem.name=lstm_tagger", "problem.dim=20", "problem.hidden=6",
          "problem.n_samples=40")


@pytest.mark.parametrize("problem_name", ["mlp", "lstm_tagger", "logistic", "quadratic"])
def test_the_stages_passes_compose_the_models_gradient(problem_name):
    """Forward through both stages and backward from the loss give, stage by stage, the
    gradient ``grad`` computes for the whole model (to rounding: the l2 term is added stage
    by stage), for the mlp's layers, the LSTM tagger's (embeddings and LSTM, then the output
    layer) and a linear model's feature halves."""
    extra = TAGGER if problem_name == "lstm_tagger" else (f"problem.name={problem_name}",)
    problem = make_problem(scenario(*MLP, *extra, "problem.l2=0.01").problem)
    parts = problem.stages()
    w = problem.initial() + 0.1 * np.random.default_rng(0).standard_normal(problem.dim)
    for idx in range(10):
        h, first = problem.forward(0, w[parts[0]], None, idx)
        _, second = problem.forward(1, w[parts[1]], h, idx)
        g1, up = problem.backward(1, w[parts[1]], second, None, idx)
        g0, back = problem.backward(0, w[parts[0]], first, up, idx)
        assert back is None
        np.testing.assert_allclose(np.concatenate([g0, g1]), problem.grad(w, idx)[0],
                                   rtol=1e-13, atol=1e-16)


def test_a_two_stage_pipeline_follows_the_hand_worked_timeline():
    """Two samples in flight, constant durations, messages that arrive at once. Stage 0
    forwards samples 0 and 1 (0–300, 300–600); stage 1 runs sample 0 (forward 300–700,
    backward 700–1500) and then 1 (1500–1900, 1900–2700); stage 0's backward of sample 0
    runs when its gradient arrives (1500–2100), which frees a place: sample 2 enters and is
    forwarded (2100–2400) ... Staleness counts the completions since the sample entered."""
    trace = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=8", "amp.max_active=2"))
    assert trace["thread"].tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert trace["read_start"].tolist() == [300, 0, 1500, 300, 2700, 2100, 3900, 3300]
    assert trace["read_end"].tolist() == [700, 300, 1900, 600, 3100, 2400, 4300, 3600]
    assert trace["grad_start"].tolist() == [700, 1500, 1900, 2700, 3100, 3900, 4300, 5100]
    assert trace["write_end"].tolist() == [1500, 2100, 2700, 3300, 3900, 4500, 5100, 5700]
    assert trace["staleness"].tolist() == [0, 1, 2, 3, 2, 3, 2, 3]
    samples = trace["sample"]
    assert samples[0] == samples[1] and samples[2] == samples[3]  # each sample's two rows


def test_a_message_flies_for_the_links_latency_and_bandwidth():
    """One sample in flight, a 1000 ns latency: stage 1's forward starts 1000 ns after stage
    0's ends (300), and stage 0's backward 1000 ns after stage 1's ends (2700). At 0.08
    bytes/ns each of the 3 hidden coordinates takes 100 ns more, both ways."""
    trace = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=2", "amp.max_active=1",
                              "devices=[{name='d', latency=1000}]"))
    assert trace["read_start"].tolist() == [1300, 0]
    assert trace["grad_start"].tolist() == [1700, 3500]
    assert trace["write_end"].tolist() == [2500, 4100]
    slow = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=2", "amp.max_active=1",
                             "devices=[{name='d', latency=1000, bandwidth=0.08}]"))
    assert slow["read_start"].tolist() == [1600, 0]
    assert slow["grad_start"].tolist() == [2000, 4100]


def _entered(trace):
    """The samples in the order they entered the pipeline (stage 0's rows)."""
    first = trace["thread"] == 0
    return trace["sample"][first][np.argsort(trace["thread_seq"][first])].tolist()


def _serial_sgd(problem, trace, lr):
    """Serial SGD from w_0 on the samples in the order they entered the pipeline."""
    w = problem.initial()
    for sample in _entered(trace):
        w -= lr * problem.grad(w, sample)[0]
    return w


def test_one_sample_in_flight_is_serial_sgd():
    """With ``max_active = 1`` every stage's gradient is taken at the vector before the
    sample's first write: the run is serial SGD on the same samples (to rounding), stage 1's
    gradient has no error and stage 0's is one update stale (stage 1 wrote meanwhile)."""
    s = scenario(*MLP, "run.updates=400", "amp.max_active=1", "metrics.exact=true",
                 "problem.l2=0.001", "run.lr=0.05")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    np.testing.assert_allclose(trace["w_final"], _serial_sgd(problem, trace, s.run.lr),
                               rtol=0, atol=1e-13)
    first, last = trace["thread"] == 0, trace["thread"] == 1
    relative = trace["delta_norm"] / trace["g_norm"]
    assert relative[last].max() < 1e-9 and relative[first].min() > 1e-6
    assert set(trace["staleness"][last].tolist()) == {0}
    assert set(trace["staleness"][first].tolist()) == {1}


def test_averaged_updates_are_minibatch_sgd_with_one_sample_in_flight():
    """``update_every = 2`` with one sample in flight: each stage writes the mean of two
    gradients taken at the same vector, which is minibatch SGD of two samples."""
    s = scenario(*MLP, "run.updates=200", "amp.max_active=1", "amp.update_every=2",
                 "run.lr=0.05")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    assert trace["step"].max() == 100 and len(trace) == 200
    samples = _entered(trace)
    w = problem.initial()
    for a, b in zip(samples[::2], samples[1::2], strict=True):
        w -= mean_step([s.run.lr * problem.grad(w, a)[0], s.run.lr * problem.grad(w, b)[0]])
    np.testing.assert_allclose(trace["w_final"], w, rtol=0, atol=1e-13)


def test_stages_nearer_the_input_train_on_staler_gradients(tmp_path):
    """Four samples in flight: the first stage's gradients are staler and further from the
    exact ones than the last stage's; the summary's stages say so, with the time each
    worked (its phases' durations) and the pipeline plot beside them."""
    out = tmp_path / "run"
    assert asyngrad(["simulate", *(a for o in (*MLP, "run.updates=2000", "metrics.exact=true")
                                   for a in ("--set", o)), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    first, last = summary["stages"]
    assert first["staleness_mean"] > last["staleness_mean"]
    assert first["relative_error"]["p50"] > 1e3 * last["relative_error"]["p50"]
    assert (out / "pipeline.png").is_file()
    trace = np.load(out / "trace.npz")
    for stage in (first, last):
        rows = trace["thread"] == stage["stage"]
        work = sum(int((trace[f"{p}_end"][rows] - trace[f"{p}_start"][rows]).sum())
                   for p in ("read", "grad", "write"))
        assert stage["busy_ns"] == work and stage["updates"] == 1000
        assert 0 < stage["utilisation"] <= 1
        assert stage["busy_ns"] + stage["idle_ns"] == summary["time"]["span_ns"]


def test_a_slow_last_stage_idles_the_first():
    """The first stage idles more when the last one runs 8 times slower (it waits for the
    gradients), and the run takes longer."""
    base = (*MLP, *TIMED, "run.updates=200", "metrics.exact=false")
    plain = simulate(scenario(*base))
    slow = simulate(scenario(*base, "inject.stragglers=[{thread=1, factor=8.0}]"))

    def first_busy(trace):
        rows = trace["thread"] == 0
        return sum(int((trace[f"{p}_end"][rows] - trace[f"{p}_start"][rows]).sum())
                   for p in ("read", "grad", "write")) / int(trace["write_end"].max())

    assert first_busy(slow) < 0.5 * first_busy(plain)
    assert slow["write_end"].max() > 2 * plain["write_end"].max()


@pytest.mark.parametrize("extra", [(), ("inject.pauses=[{thread=1, start=2000, end=9000}]",
                                        "inject.stragglers=[{thread=0, factor=1.5}]"),
                                   ("amp.update_every=2", "amp.max_active=3"),
                                   ("run.protocol=local", "local.update_every=2",
                                    "inject.stragglers=[{thread=1, factor=3.0}]"),
                                   ("run.protocol=block_admm",
                                    "inject.pauses=[{thread=0, start=2000, end=9000}]")])
def test_the_pipelines_are_deterministic_with_and_without_lookahead(extra):
    s = scenario(*MLP, "run.updates=240", "metrics.exact=true", *extra)
    first, second, slow = simulate(s), simulate(s), simulate(s, lookahead=False)
    for name, values in first.arrays.items():
        for other in (second, slow):
            assert np.array_equal(values, other.arrays[name],
                                  equal_nan=values.dtype.kind == "f"), name


def test_a_dead_stage_stalls_the_pipeline():
    """Stage 1 dies: no gradient comes back, so stage 0 writes only what was already on its
    way, and the run ends early."""
    trace = simulate(scenario(*MLP, *TIMED, "run.updates=200",
                              "inject.deaths=[{thread=1, at=20000}]"))
    assert len(trace) < 200
    assert trace["write_end"].max() < 25_000
    assert trace["extra_dead_threads"].tolist() == [1]


@pytest.mark.parametrize(("override", "field"), [
    ("problem.name=sparse_logistic", "problem.name"),
    ("run.threads=3", "run.threads"),
    ("run.blocks=1", "run.blocks"),
    ("run.updates=201", "run.updates"),
    ("run.split=even", "run.split"),
    ("inject.error=bounded", "inject.error"),
    ("inject.drop=0.1", "inject.drop"),
    ("hardware.sweeping_reads={}", "hardware.sweeping_reads"),
])
@pytest.mark.parametrize("protocol", ["amp", "local"])
def test_the_pipelines_refuse_what_their_stages_cannot_run(override, field, protocol):
    with pytest.raises(ScenarioError) as err:
        simulate(scenario(*MLP, "run.updates=200", f"run.protocol={protocol}", override))
    assert err.value.field == field


@pytest.mark.parametrize("protocol", ["amp", "local", "block_admm"])
def test_the_stages_are_neither_replayed_scheduled_nor_calibrated(tmp_path, protocol):
    s = scenario(*MLP, "run.updates=20", f"run.protocol={protocol}")
    with pytest.raises(ScenarioError, match="simulate its scenario again"):
        replay(simulate(s))
    with pytest.raises(ScenarioError, match="not scheduled"):
        explore(s, "random", runs=1, objective="grad_error")
    out = tmp_path / "run"
    assert asyngrad(["simulate", *(a for o in (*MLP, "run.updates=20",
                                               f"run.protocol={protocol}")
                                   for a in ("--set", o)), "--out", str(out), "--quiet"]) == 0
    with pytest.raises(ScenarioError, match="calibrate does not fit"):
        calibrate(out)


def test_pauses_and_idle_work_come_before_a_stages_phases():
    """A stage paused for the run's first millisecond starts its first read after it (its
    row says so, and its staleness counts from there); local work before each update
    (``timing.idle``) takes its time."""
    for protocol in ("amp", "block_admm"):
        trace = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=8",
                                  f"run.protocol={protocol}",
                                  "inject.pauses=[{thread=1, start=0, end=1000000}]"))
        assert trace["read_start"][trace["thread"] == 1].min() >= 1_000_000
    plain = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=8", "amp.max_active=1"))
    idle = simulate(scenario(*MLP, *SMALL, *TIMED, "run.updates=8", "amp.max_active=1",
                             "timing.idle.mean=5000"))
    assert idle["write_end"].max() == plain["write_end"].max() + 4 * 2 * 5000


def test_a_dead_last_stage_still_writes_its_run_directory(tmp_path):
    out = tmp_path / "run"
    assert asyngrad(["simulate", *(a for o in (*LOCAL, "run.updates=40",
                                               "inject.deaths=[{thread=1, at=0}]")
                                   for a in ("--set", o)), "--out", str(out), "--quiet"]) == 0
    assert (out / "timeline.png").is_file() and (out / "pipeline.png").is_file()


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_local_with_one_sample_in_flight_is_greedy_layerwise_sgd():
    """``local`` with one sample in flight, written out here: for each sample, the hidden
    layer steps on the loss of its auxiliary head (shaped as the output layer, starting at
    zero, with its own l2 term) with backpropagation stopped there, the head steps with it,
    and the output layer steps on the loss from the same hidden activation: not serial
    SGD."""
    s = scenario(*LOCAL, "run.updates=400", "local.max_active=1", "problem.l2=0.001",
                 "run.lr=0.05")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    d_in, hidden, classes = problem.shape
    lr, l2 = s.run.lr, s.problem.l2
    w = problem.initial()
    cut = hidden * (d_in + 1)
    head = np.zeros(classes * (hidden + 1))
    for z in _entered(trace):
        x, label = problem.X[z], problem.y[z]
        W1, b1 = w[:hidden * d_in].reshape(hidden, d_in), w[hidden * d_in:cut]
        W2, b2 = w[cut:cut + classes * hidden].reshape(classes, hidden), w[cut + classes * hidden:]
        A, c = head[:classes * hidden].reshape(classes, hidden), head[classes * hidden:]
        h = np.tanh(W1 @ x + b1)
        p = _softmax(A @ h + c)
        p[label] -= 1
        da = (A.T @ p) * (1 - h * h)
        q = _softmax(W2 @ h + b2)
        q[label] -= 1
        step = np.concatenate([(np.outer(da, x) + l2 * W1).ravel(), da + l2 * b1,
                               (np.outer(q, h) + l2 * W2).ravel(), q + l2 * b2])
        head -= lr * (np.concatenate([np.outer(p, h).ravel(), p]) + l2 * head)
        w -= lr * step
    np.testing.assert_allclose(trace["w_final"], w, rtol=0, atol=1e-12)
    serial = _serial_sgd(problem, trace, lr)  # (another training: the head is its own)
    assert np.abs(trace["w_final"][:cut] - serial[:cut]).max() > 1e-3


def test_local_trains_the_network_with_biased_first_stage_gradients(tmp_path):
    """Four samples in flight: the network's loss falls, the output layer's gradients are
    near the exact ones (only its input is stale) while the hidden layer's, from its own
    head's loss, are far from them; no gradient travels back."""
    s = scenario(*LOCAL, "run.updates=4000", "metrics.exact=true", "run.lr=0.1")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    assert trace["curve_loss"][-1] < 0.8 * trace["curve_loss"][0]
    relative = trace["delta_norm"] / trace["g_norm"]
    first, last = trace["thread"] == 0, trace["thread"] == 1
    assert np.median(relative[first]) > 0.01 > 1e6 * np.median(relative[last])


def test_the_stages_of_a_linear_model_are_its_feature_halves():
    """Logistic and least squares split their weights in two: amp with one sample in flight
    is serial SGD on them too."""
    for name in ("quadratic", "logistic"):
        s = scenario(*MLP, f"problem.name={name}", "problem.dim=10", "run.updates=400",
                     "amp.max_active=1")
        problem = make_problem(s.problem)
        trace = simulate(s, problem)
        np.testing.assert_allclose(trace["w_final"], _serial_sgd(problem, trace, s.run.lr),
                                   rtol=0, atol=1e-14)


BLOCK = ("run.protocol=block_admm", "problem.name=quadratic", "problem.dim=10",
         "problem.n_samples=200", "problem.l2=0", "run.threads=2", "run.blocks=2",
         "metrics.exact=false")


@pytest.mark.parametrize(("extra", "tolerance"), [
    ((), 1e-6), (("inject.stragglers=[{thread=1, factor=3.0}]",), 1e-3)])
def test_block_admm_reaches_a_convex_problems_optimum(extra, tolerance):
    """Least squares that fit exactly (no noise, no l2: every sample's gradient vanishes at
    w*): the two blocks, each stepping on its own samples with no message between them,
    reach w* and the auxiliary variables meet stage 0's outputs; a block three times slower
    gets there more slowly."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((200, 10))
    w_true = rng.standard_normal(10)
    problem = QuadraticProblem.from_arrays(A, A @ w_true, 0.0)
    trace = simulate(scenario(*BLOCK, "run.updates=30000", *extra), problem)
    assert np.linalg.norm(trace["w_final"] - w_true) < tolerance * np.linalg.norm(w_true)
    assert trace["extra_aux_residual"][0] < tolerance


def test_block_admm_refuses_more_than_two_stages_and_a_pipeline_key():
    with pytest.raises(ScenarioError) as err:
        simulate(scenario(*BLOCK, "run.threads=3", "run.blocks=3", "run.updates=20"))
    assert err.value.field == "run.threads"
    with pytest.raises(ScenarioError) as err:
        simulate(scenario(*BLOCK, "run.updates=20", "inject.error=bounded"))
    assert err.value.field == "inject.error"


def test_the_lstm_tagger_runs_as_a_pipeline():
    """The LSTM tagger's two stages: one sequence in flight is serial SGD; with four, local
    and amp both lower the loss."""
    s = scenario(*MLP, *TAGGER, "run.updates=200", "amp.max_active=1", "run.lr=0.1")
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    np.testing.assert_allclose(trace["w_final"], _serial_sgd(problem, trace, s.run.lr),
                               rtol=0, atol=1e-13)
    for protocol in ("amp", "local"):
        run = simulate(scenario(*MLP, *TAGGER, f"run.protocol={protocol}", "run.updates=800",
                                "run.lr=0.5"), problem)
        assert run["curve_loss"][-1] < 0.9 * run["curve_loss"][0]
