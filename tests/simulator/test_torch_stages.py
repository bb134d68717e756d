"""A user's ``nn.Sequential`` split into stages (``problem.split_at``) for the model-parallel
protocols: the torch twin of the numpy mlp runs ``amp``, ``local`` and ``block_admm`` as the
numpy one does, a three-stage convolutional network's stages compose its gradient, one sample
in flight is serial SGD, and every split that cannot be made is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simulator.cli import main as asyngrad  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.problems import make_problem  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from tests.simulator.problems import torch_models  # noqa: E402

MODELS = Path(torch_models.__file__)


def _problem(factory: str, split_at: list[str], **extra):
    return {"name": "torch", "model": f"{MODELS}:{factory}", "split_at": split_at, **extra}


def _scenario(protocol: str, problem: dict, updates: int, **options):
    threads = len(problem.get("split_at", [])) + 1
    return scenario_from_dict({
        "problem": problem,
        "run": {"protocol": protocol, "threads": threads, "blocks": threads,
                "updates": updates, "lr": 0.05, "seed": 4},
        **({protocol: options} if options else {})})


def _twin():
    """The numpy mlp and its torch twin (``nn.Sequential(Linear, Tanh, Linear)``, same w_0
    and parameter order) cut before its output layer: the numpy mlp's two stages."""
    ours = make_problem(scenario_from_dict({"problem": _problem("mlp", ["2"], l2=0.01)})
                        .problem)
    return torch_models.mlp_numpy(), ours


def test_the_torch_twin_of_the_mlp_has_its_stages_and_their_passes():
    """Same slices and widths; each stage's forward and backward agree with the numpy
    stage's to 1e-13, also where the backward's parameters are not the forward's (both
    recompute the forward from its input at the parameters they are given)."""
    ref, ours = _twin()
    assert ours.stages() == ref.stages()
    assert ours.stage_width(0) == ref.stage_width(0) == 5
    parts, rng = ref.stages(), np.random.default_rng(1)
    for idx in (0, 9, ref.n_samples - 1):
        w = ref.initial() + 0.2 * rng.standard_normal(ref.dim)
        later = w + 0.2 * rng.standard_normal(ref.dim)
        h, mine = ours.forward(0, w[parts[0]], None, idx)
        h_ref, theirs = ref.forward(0, w[parts[0]], None, idx)
        np.testing.assert_allclose(h.ravel(), h_ref, rtol=1e-13, atol=1e-15)
        up = rng.standard_normal(5)
        g, _ = ours.backward(0, later[parts[0]], mine, up[None, :], idx)
        g_ref, _ = ref.backward(0, later[parts[0]], theirs, up, idx)
        np.testing.assert_allclose(g, g_ref, rtol=1e-13, atol=1e-15)
        _, mine = ours.forward(1, w[parts[1]], h, idx)
        _, theirs = ref.forward(1, w[parts[1]], h_ref, idx)
        g, back = ours.backward(1, later[parts[1]], mine, None, idx)
        g_ref, back_ref = ref.backward(1, later[parts[1]], theirs, None, idx)
        np.testing.assert_allclose(g, g_ref, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(back.ravel(), back_ref, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("protocol, options", [
    ("amp", {"max_active": 4}), ("local", {"max_active": 3, "update_every": 2}),
    ("block_admm", {})])
def test_the_torch_twin_trains_as_the_numpy_mlp(protocol, options):
    """Simulated under each model-parallel protocol, the torch twin and the numpy mlp draw
    the same samples in the same interleaving (every integer column equal) and every value
    agrees to 1e-12, but those measured against w* (⟨δ, w − w*⟩, ‖w − w*‖²), which each
    problem's own L-BFGS estimates, to 1e-9 (``local``'s head is each problem's own: the
    numpy mlp is given the torch head)."""
    ref, ours = _twin()
    if protocol == "local":
        ref.local_head = ours.local_head  # the numpy mlp's head starts at zero
    s = _scenario(protocol, _problem("mlp", ["2"], l2=0.01), 600, **options)
    theirs, mine = simulate(s, problem=ref), simulate(s, problem=ours)
    assert theirs.arrays.keys() == mine.arrays.keys()
    for key, array in theirs.arrays.items():
        if array.dtype.kind == "f":
            tolerance = 1e-9 if key in ("delta_dot", "curve_dist2") else 1e-12
            np.testing.assert_allclose(mine[key], array, rtol=tolerance, atol=tolerance,
                                       err_msg=key)
        else:
            assert np.array_equal(mine[key], array), key


@pytest.fixture(scope="module")
def convnet():
    """The three-stage convolutional network (conv and pool; flatten, linear and ReLU; the
    output layer), minibatches of 8 rows (15 of them)."""
    spec = scenario_from_dict({"problem": _problem("convnet_sequential", ["3", "6"],
                                                   batch=8, l2=0.001)}).problem
    return make_problem(spec)


def test_a_three_stage_convnets_stages_compose_its_gradient(convnet):
    """Forward through the three stages and backward from the loss give, stage by stage, the
    whole model's gradient (to 1e-12); the widths are one minibatch's activations."""
    parts = convnet.stages()
    assert [p.stop - p.start for p in parts] == [40, 64 * 12 + 12, 12 * 10 + 10]
    assert [convnet.stage_width(s) for s in range(3)] == [8 * 64, 8 * 12, 0]  # (the loss's)
    w = convnet.initial() + 0.05 * np.random.default_rng(2).standard_normal(convnet.dim)
    for idx in (0, 14):
        a, caches = None, []
        for s, part in enumerate(parts):
            a, cache = convnet.forward(s, w[part], a, idx)
            caches.append(cache)
        up, grads = None, []
        for s in reversed(range(3)):
            g, up = convnet.backward(s, w[parts[s]], caches[s], up, idx)
            grads.insert(0, g)
        assert up is None
        np.testing.assert_allclose(np.concatenate(grads), convnet.grad(w, idx)[0],
                                   rtol=1e-12, atol=1e-14)


def test_amp_on_three_stages_with_one_sample_in_flight_is_serial_sgd(convnet):
    """``max_active = 1`` through three stages: serial SGD on the minibatches in the order
    they entered (to 1e-12)."""
    s = _scenario("amp", _problem("convnet_sequential", ["3", "6"], batch=8, l2=0.001),
                  90, max_active=1)
    trace = simulate(s, problem=convnet)
    first = trace["thread"] == 0
    w = convnet.initial()
    for sample in trace["sample"][first][np.argsort(trace["thread_seq"][first])].tolist():
        w -= s.run.lr * convnet.grad(w, sample)[0]
    np.testing.assert_allclose(trace["w_final"], w, rtol=0, atol=1e-12)
    assert sorted(set(trace["thread"].tolist())) == [0, 1, 2]


def test_amp_staleness_grows_with_samples_in_flight_and_runs_are_deterministic(convnet):
    """Every stage trains on staler gradients with four minibatches in flight than with
    one (with one, stage s's write of a sample lands after the next sample entered exactly
    when a later stage's write does: 2, 3 and 1 completions); the same scenario gives the
    same trace, bit for bit."""
    problem = _problem("convnet_sequential", ["3", "6"], batch=8, l2=0.001)
    one = simulate(_scenario("amp", problem, 300, max_active=1), problem=convnet)
    s = _scenario("amp", problem, 300, max_active=4)
    four = simulate(s, problem=convnet)
    for k in range(3):
        assert four["staleness"][four["thread"] == k].mean() > 2 * one["staleness"][
            one["thread"] == k].mean()
    again = simulate(s, problem=convnet)
    for key, array in four.arrays.items():
        assert np.array_equal(again[key], array, equal_nan=True), key


def test_local_heads_are_the_last_stages_modules_initialised_afresh():
    """``local``'s head: the last stage's shape, from its modules' own initialisation under
    a seeded generator (the same every time, and per seed), neither zero nor w_0's last
    stage."""
    _, ours = _twin()
    head, last = ours.local_head(0), ours.initial()[ours.stages()[1]]
    assert head.shape == last.shape and np.all(head != 0) and not np.allclose(head, last)
    assert np.array_equal(head, ours.local_head(0))
    other = make_problem(scenario_from_dict({"problem": _problem("mlp", ["2"], seed=1)})
                         .problem)
    assert not np.array_equal(other.local_head(0), head)


@pytest.mark.parametrize("factory, split_at, words", [
    ("logistic", ["x"], "cuts an nn.Sequential"),
    ("mlp", ["out"], "'out', not a child of the model (its children: 0, 1, 2)"),
    ("mlp", ["0"], "the model's first child"),
    ("mlp", ["2", "1"], "in their order in the model"),
    ("mlp", ["1", "2"], "leaves stage 1 (1) with no parameter to train"),
    ("tied", ["2"], "two stages share (2.weight, tied weights"),
    ("reused_linear", ["3"], "two stages share (3.weight, tied weights or a module used in"),
    ("recurrent_middle", ["1", "2"], "stage 1 (1) returns a tuple"),
    ("residual_sequential", ["2"], "Residual has a forward of its own"),
    ("scaled_sequential", ["2"], "the model's own parameter 'scale'"),
])
def test_splits_that_cannot_be_made_are_one_line_naming_problem_split_at(factory, split_at,
                                                                          words):
    with pytest.raises(ScenarioError) as err:
        make_problem(scenario_from_dict({"problem": _problem(factory, split_at)}).problem)
    assert str(err.value).startswith("problem.split_at")
    assert words in str(err.value)


def test_split_at_from_python_is_a_list_of_names():
    """``TorchProblem(..., split_at="2")`` is refused: a string is not a list of names."""
    from simulator.problems.torchmodel import SplitError, TorchProblem

    model, loss, X, y = torch_models.mlp()
    with pytest.raises(SplitError, match="is the string '2': a list of child names"):
        TorchProblem(model, loss, X, y, split_at="2")


@pytest.mark.parametrize("factory, split_at", [
    ("reused_activation", ["2"]), ("reused_activation", ["4"]), ("inplace_sequential", ["1"]),
    ("inplace_sequential", ["2"]), ("recurrent_sequential", ["1"])])
def test_stages_compose_the_gradient_of_odd_sequentials(factory, split_at):
    """A module used twice (one Tanh after two layers), an in-place ReLU starting a stage
    (it writes into a copy: neither the message nor the data changes) and a last stage that
    returns a tuple to the loss (an ``nn.LSTM``): the stages' passes compose the whole
    model's gradient (to 1e-12), and the forward leaves its input as it was."""
    problem = make_problem(scenario_from_dict({"problem": _problem(factory, split_at)})
                           .problem)
    parts, n = problem.stages(), len(split_at) + 1
    w = problem.initial() + 0.1 * np.random.default_rng(3).standard_normal(problem.dim)
    for idx in (0, 5):
        a, caches = None, []
        for s, part in enumerate(parts):
            given = None if a is None else a.copy()
            a, cache = problem.forward(s, w[part], a, idx)
            if given is not None:
                assert np.array_equal(caches[-1][1], given)
            caches.append((cache, a))
        up, grads = None, []
        for s in reversed(range(n)):
            g, up = problem.backward(s, w[parts[s]], caches[s][0], up, idx)
            grads.insert(0, g)
        np.testing.assert_allclose(np.concatenate(grads), problem.grad(w, idx)[0],
                                   rtol=1e-12, atol=1e-14)


def test_split_at_serves_torch_problems_and_the_cli_runs_one(tmp_path, capsys):
    """A built-in problem refuses ``split_at``; ``asyngrad simulate`` runs ``amp`` on a split
    torch model and writes its stages; a torch model without ``split_at`` is refused by
    ``amp`` in one line, exit 2, nothing written."""
    with pytest.raises(ScenarioError, match=r"split_at.*problem\.name = torch"):
        scenario_from_dict({"problem": {"name": "mlp", "split_at": ["1"]}})
    out = tmp_path / "run"
    common = ["--quiet", "--set", "problem.name=torch", "--set", f"problem.model={MODELS}:mlp",
              "--set", "run.protocol=amp", "--set", "run.threads=2", "--set", "run.blocks=2",
              "--set", "run.updates=200"]
    assert asyngrad(["simulate", "--out", str(out), *common,
                     "--set", "problem.split_at=['2']"]) == 0
    assert "split_at = [\"2\"]" in (out / "scenario.toml").read_text()
    assert (out / "pipeline.png").is_file()
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert asyngrad(["simulate", "--out", str(bad), *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: problem.split_at = []: amp trains" in err[0]
    assert not bad.exists()

