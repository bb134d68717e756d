"""A user's torch model as a problem: against the numpy problems it re-expresses, finite
differences and its own definitions; bad models and data refused in one line."""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simulator import simulate  # noqa: E402
from simulator.cli import main  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.problems import make_problem  # noqa: E402
from simulator.problems.torchmodel import TorchProblem  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from tests.simulator.problems import torch_models  # noqa: E402
from theory.estimators import hessian_extremes  # noqa: E402

MODELS = Path(torch_models.__file__)


def _spec(factory, **problem):
    return scenario_from_dict({"problem": {"name": "torch", "model": f"{MODELS}:{factory}",
                                           **problem}}).problem


def _points(problem, count=4):
    rng = np.random.default_rng(5)
    return [problem.initial() + 0.3 * rng.standard_normal(problem.dim) for _ in range(count)]


@pytest.mark.parametrize("name", ["logistic", "mlp"])
def test_a_numpy_problem_re_expressed_in_torch_has_its_math(name):
    """The torch twins of the numpy logistic regression and tanh MLP give the same w_0,
    per-sample losses and gradients, full loss, full gradient and Hessian-vector products
    (float64, to 1e-12 relative)."""
    ref = getattr(torch_models, f"{name}_numpy")()
    ours = make_problem(_spec(name, l2=ref.l2))
    assert (ours.dim, ours.n_samples) == (ref.dim, ref.n_samples)
    assert np.array_equal(ours.initial(), ref.initial())
    rng = np.random.default_rng(0)
    for w in _points(ref):
        v = rng.standard_normal(ref.dim)
        for idx in (0, 7, ref.n_samples - 1):
            assert ours.loss(w, idx) == pytest.approx(ref.loss(w, idx), rel=1e-12)
            np.testing.assert_allclose(ours.grad(w, idx)[0], ref.dense_grad(w, idx),
                                       rtol=1e-12, atol=1e-14)
        assert ours.full_loss(w) == pytest.approx(ref.full_loss(w), rel=1e-12)
        np.testing.assert_allclose(ours.full_grad(w), ref.full_grad(w), rtol=1e-12, atol=1e-14)
        if name == "logistic":  # the numpy MLP's is a finite difference
            np.testing.assert_allclose(ours.hessp(w, v), ref.hessp(w, v), rtol=1e-12,
                                       atol=1e-14)
        assert ours.accuracy(w) == ref.accuracy(w)


def test_a_convex_torch_problem_has_the_numpy_optimum_and_curvature():
    """Declared convex, the torch logistic regression is solved by the same Newton-CG (w*
    within 1e-9) and Lanczos on its Hessian-vector products finds the numpy problem's
    extreme eigenvalues."""
    ref = torch_models.logistic_numpy()
    ours = make_problem(_spec("logistic", l2=ref.l2))
    assert ours.convex
    np.testing.assert_allclose(ours.optimum()[0], ref.optimum()[0], atol=1e-9)
    w = _points(ref, 1)[0]
    np.testing.assert_allclose(hessian_extremes(ours, w), hessian_extremes(ref, w), rtol=1e-9)


def test_the_same_trace_as_the_numpy_problem():
    """Simulated on the same scenario, the torch twin of the logistic problem draws the same
    samples in the same interleaving (every integer array equal) and every value agrees to
    1e-12: w_final, the loss curve, gradient errors."""
    scenario = scenario_from_dict({
        "problem": {"name": "logistic", "dim": 12, "n_samples": 90, "seed": 3},
        "run": {"updates": 300, "threads": 4, "lr": 0.05, "seed": 2},
        "metrics": {"exact": True}})
    ref = simulate(scenario, problem=torch_models.logistic_numpy())
    ours = simulate(scenario, problem=make_problem(_spec("logistic", l2=0.01)))
    assert ref.arrays.keys() == ours.arrays.keys()
    for key, array in ref.arrays.items():
        if array.dtype.kind == "f":
            np.testing.assert_allclose(ours[key], array, rtol=1e-12, atol=1e-12, err_msg=key)
        else:
            assert np.array_equal(ours[key], array), key


def test_minibatches_average_their_rows_and_f_averages_the_batches():
    """With batch B, sample j is B rows of a seeded shuffle; f_j's gradient is the mean of its
    rows' (from batch-1 problems on each row), and f is the mean of the f_j even when the last
    batch is short, so (1/m) Σ_j ∇f_j = ∇f exactly as Theorem 1 needs."""
    one = make_problem(_spec("net", l2=0.0))
    four = make_problem(_spec("net", l2=0.0, batch=6, seed=0))
    assert (one.n_samples, four.n_samples, four.rows) == (40, 7, 40)  # 6 batches of 6, 1 of 4
    w = _points(one, 1)[0]
    rows = [np.flatnonzero((one.X.numpy() == four.X[a].numpy()).all(axis=1))[0]
            for a in range(40)]
    assert sorted(rows) == list(range(40))  # a permutation of the rows
    for j in (0, 6):
        members = rows[6 * j:6 * j + 6]
        mean = np.mean([one.grad(w, r)[0] for r in members], axis=0)
        np.testing.assert_allclose(four.grad(w, j)[0], mean, rtol=1e-12, atol=1e-15)
    batches = np.mean([four.grad(w, j)[0] for j in range(7)], axis=0)
    np.testing.assert_allclose(four.full_grad(w), batches, rtol=1e-12, atol=1e-15)
    assert four.full_loss(w) == pytest.approx(np.mean([four.loss(w, j) for j in range(7)]),
                                              rel=1e-12)


@pytest.mark.parametrize("factory", ["net", "tied"])
def test_derivatives_against_finite_differences(factory):
    """A ReLU network with minibatches, and a network whose two layers share one weight: the
    gradient and Hessian-vector product agree with central differences of the loss and the
    gradient."""
    problem = make_problem(_spec(factory, batch=5))
    assert problem.dim == (16 if factory == "tied" else 44)
    w = _points(problem, 1)[0]
    v = np.random.default_rng(1).standard_normal(problem.dim)
    # Hessian-vector products first and twice: nothing the first keeps breaks the next
    assert np.array_equal(problem.hessp(w, v), problem.hessp(w, v))
    h = 1e-6
    slope = (problem.loss(w + h * v, 2) - problem.loss(w - h * v, 2)) / (2 * h)
    assert problem.grad(w, 2)[0] @ v == pytest.approx(slope, rel=1e-6)
    difference = (problem.full_grad(w + h * v) - problem.full_grad(w - h * v)) / (2 * h)
    np.testing.assert_allclose(problem.hessp(w, v), difference, rtol=1e-5, atol=1e-8)


def test_the_torch_loss_of_the_workers_is_the_same_function():
    """``torch_loss`` (the CUDA/torch workers' autograd, here in float64 on the CPU) gives
    the problem's gradient; in float32 it agrees to float32 precision."""
    problem = make_problem(_spec("net", batch=3, l2=0.05))
    w = _points(problem, 1)[0]
    for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 1e-5)):
        leaf = torch.tensor(w, dtype=dtype, requires_grad=True)
        problem.torch_loss(leaf, 4).backward()
        np.testing.assert_allclose(leaf.grad.double().numpy(), problem.grad(w, 4)[0],
                                   rtol=tol, atol=tol)


def test_the_seed_fixes_w0_and_runs_are_bit_identical():
    """The factory runs under torch's generator seeded by problem.seed (and restores it):
    the same seed gives the same w_0 and a bit-identical run, another seed another w_0."""
    state = torch.random.get_rng_state()
    a, b = make_problem(_spec("net", seed=4)), make_problem(_spec("net", seed=4))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert np.array_equal(a.initial(), b.initial())
    assert not np.array_equal(a.initial(), make_problem(_spec("net", seed=5)).initial())
    scenario = scenario_from_dict({"problem": {"name": "torch", "model": f"{MODELS}:net",
                                               "seed": 4, "batch": 4},
                                   "run": {"updates": 200, "threads": 3},
                                   "metrics": {"exact": True}})
    first, second = simulate(scenario), simulate(scenario)
    for key, array in first.arrays.items():
        assert np.array_equal(array, second[key], equal_nan=True), key


def test_a_factory_drawing_from_numpy_and_random_is_seeded_too():
    """numpy's and random's global generators are seeded by problem.seed around the factory
    (and restored): two builds give the same data, another seed other data."""
    import random

    state = np.random.get_state()[1].copy(), random.getstate()
    a, b = make_problem(_spec("numpy_drawn")), make_problem(_spec("numpy_drawn"))
    assert np.array_equal(np.random.get_state()[1], state[0]) and random.getstate() == state[1]
    assert a.spec_key == b.spec_key and torch.equal(a.X, b.X) and torch.equal(a.y, b.y)
    assert not torch.equal(a.X, make_problem(_spec("numpy_drawn", seed=1)).X)


def test_the_optimum_cache_key_follows_what_w_star_depends_on():
    """The key is stable across builds (a partial's loss included), and changes with the
    loss's arguments, the data and λ; nothing is cached where a source cannot be read."""
    one, again = make_problem(_spec("smooth_1")), make_problem(_spec("smooth_1"))
    assert one.spec_key == again.spec_key and one.caches_optimum
    assert make_problem(_spec("smooth_3")).spec_key != one.spec_key
    assert make_problem(_spec("smooth_1", l2=0.5)).spec_key != one.spec_key
    assert make_problem(_spec("smooth_1", seed=3)).spec_key != one.spec_key
    made = TorchProblem(torch.nn.Linear(3, 2), eval("lambda out, y: (out - y).pow(2).mean()"),
                        np.ones((4, 3)), np.zeros((4, 2)))
    assert made.spec_key is None and not made.caches_optimum  # source unknown: not cached


def test_a_model_file_can_use_dataclasses_and_postponed_annotations(tmp_path):
    """The factory's file is registered as a module while it runs, as an import does."""
    factory = tmp_path / "mine.py"
    factory.write_text(
        "from __future__ import annotations\n"
        "import dataclasses\nimport torch\n\n"
        "@dataclasses.dataclass\nclass Sizes:\n    hidden: int = 3\n\n"
        "def make():\n"
        "    model = torch.nn.Linear(2, Sizes().hidden)\n"
        "    return model, torch.nn.functional.cross_entropy, torch.ones(4, 2), "
        "torch.zeros(4, dtype=torch.long)\n")
    assert make_problem(_spec("make", model=f"{factory}:make")).dim == 9


def test_a_problem_made_in_python_is_recorded_as_such_and_not_replayed_as_another():
    """simulate(scenario, problem=TorchProblem(...)) records [problem] as that problem (name
    torch, its batch, a model string naming it as built in Python): replaying the trace is one
    line naming problem.model, not a run of the scenario's logistic problem."""
    from simulator.replay import replay

    X = torch.randn(30, 3)
    made = TorchProblem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, X,
                        (X[:, 0] > 0).long(), batch=3)
    scenario = scenario_from_dict({"run": {"updates": 60}})
    trace = simulate(scenario, problem=made)
    assert 'name = "torch"' in trace.scenario_toml and "batch = 3" in trace.scenario_toml
    with pytest.raises(ScenarioError) as err:
        replay(trace)
    assert err.value.field == "problem.model" and "made in Python" in err.value.reason


def test_accuracy_on_classes_and_a_held_out_split():
    """Integer targets and one output per class: accuracy is the argmax's; holdout keeps a
    seeded share of the rows out of training and scores them."""
    problem = make_problem(_spec("net", holdout=0.25))
    assert (problem.rows, len(problem.held[0])) == (30, 10)
    w = problem.initial()
    out = problem.module(problem.X).argmax(dim=1)
    assert problem.accuracy(w) == pytest.approx(float((out == problem.y).double().mean()))
    assert 0 <= problem.held_out_accuracy(w) <= 1
    assert make_problem(_spec("logistic")).held_out_accuracy(w) is None  # no held-out rows
    direct = TorchProblem(torch.nn.Linear(3, 1), torch.nn.functional.mse_loss,
                          np.ones((4, 3)), np.zeros((4, 1)))
    assert direct.accuracy(direct.initial()) is None  # regression targets: no accuracy


@pytest.mark.parametrize("problem, field, words", [
    ({"model": ""}, "problem.model", "names the factory"),
    ({"name": "logistic"}, "problem.model", "only of it"),
    ({"dim": 30}, "problem.dim", "set by the torch model"),
    ({"model": "nomodule_xyz:make"}, "problem.model", "no module named 'nomodule_xyz'"),
    ({"model": "nothere.py:make"}, "problem.model", "no file nothere.py"),
    ({"model": "tests.simulator.problems.torch_models"}, "problem.model",
     "'package.module:function'"),
    ({"model": "tests.simulator.problems.torch_models:absent"}, "problem.model",
     "has no function 'absent'"),
    ({"model": "tests.simulator.problems.torch_models:not_callable"}, "problem.model",
     "has no function 'not_callable'"),
    ({"model": "tests.simulator.problems.torch_models:fails"}, "problem.model",
     "raised RuntimeError: no data here"),
    ({"model": "tests.simulator.problems.torch_models:summed"}, "problem.model",
     "reduction='mean'"),
    ({"model": "tests.simulator.problems.torch_models:with_nan"}, "problem.model",
     "X has NaN or inf values (first in row 3)"),
    ({"model": "tests.simulator.problems.torch_models:short_labels"}, "problem.model",
     "X has 5 rows and y has 2"),
    ({"model": "tests.simulator.problems.torch_models:not_a_model"}, "problem.model",
     "not a torch.nn.Module"),
    ({"model": "tests.simulator.problems.torch_models:exits"}, "problem.model",
     "raised SystemExit: 3"),
    ({"model": "tests.simulator.problems.torch_models:with_held", "holdout": 0.2},
     "problem.model", "returned held-out data and problem.holdout"),
])
def test_bad_models_and_data_are_one_line_naming_problem_model(problem, field, words):
    """Each mistake is a ScenarioError naming the field, so the CLI prints one line and
    exits 2."""
    spec = {"name": "torch", "model": f"{MODELS}:net", **problem}
    with pytest.raises(ScenarioError) as err:
        make_problem(scenario_from_dict({"problem": spec}).problem)
    assert err.value.field == field.split(".", 1)[1] or str(err.value).startswith(field)
    assert words in str(err.value)


def test_batch_serves_torch_problems_only():
    with pytest.raises(ScenarioError, match=r"minibatches serve problem\.name = torch"):
        scenario_from_dict({"problem": {"batch": 2}})


def test_the_cli_runs_a_torch_model_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    """``asyngrad simulate --set problem.name=torch --set problem.model=...`` writes a run
    whose summary names the model; a missing module is one line and exit 2, nothing
    written."""
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "problem.name=torch",
                 "--set", f"problem.model={MODELS}:net", "--set", "problem.batch=4",
                 "--set", "run.updates=100"]) == 0
    assert f'model = "{MODELS}:net"' in (out / "scenario.toml").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problem"]["model"] == f"{MODELS}:net"
    assert summary["problem"]["batch"] == 4
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(["simulate", "--out", str(bad), "--quiet", "--set", "problem.name=torch",
                 "--set", "problem.model=nomodule_xyz:make"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "problem.model" in err[0] and "nomodule_xyz" in err[0]
    assert not bad.exists()
