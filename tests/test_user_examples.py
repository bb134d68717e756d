"""The user-model examples in examples/: each scenario runs from the command line; the torch
LSTM tagger is the built-in numpy ``lstm_tagger`` problem's function; the digits convnet
differentiates right and learns.

Torch runs on one intra-op thread here (restored after): these models' operations are far too
small to gain from two, and on a busy two-core machine two threads make the runs several times
slower. Nothing asserts on wall-clock time.

The convnet's runs are slow for one reason: before any simulation the problem's local optimum
w* is estimated (L-BFGS, 300 full-data iterations; about a minute on a two-core machine). The
session's optimum cache shares that estimate between the tests that simulate the convnet, so
it is paid once per session (per xdist worker).
"""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simulator.cli import main  # noqa: E402
from simulator.problems import make_problem  # noqa: E402
from simulator.problems.torchmodel import load_factory  # noqa: E402
from simulator.scenario import load_scenario, scenario_from_dict  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
# The user-model examples and their scenario names (examples/ holds others too).
NAMES = {"digits_convnet": "digits-convnet", "lstm_tagger": "lstm-tagger-torch",
         "digits_pipeline": "digits-pipeline"}
SCENARIOS = [EXAMPLES / f"{stem}.toml" for stem in NAMES]
L2 = 0.01


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _torch_problem(factory: str, **problem):
    """The torch problem of ``examples/<factory>`` (an absolute path: no chdir needed)."""
    spec = {"name": "torch", "model": f"{EXAMPLES / factory}", **problem}
    return make_problem(scenario_from_dict({"problem": spec}).problem)


def _simulate(path: Path, out: Path, *overrides: str) -> dict:
    """``asyngrad simulate`` of an example scenario, from the repository root; its summary."""
    args = [arg for override in overrides for arg in ("--set", override)]
    assert main(["simulate", str(path.relative_to(REPO_ROOT)), "--out", str(out), "--quiet",
                 *args]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if p.stem.startswith("digits") else p for p in SCENARIOS],
                         ids=lambda p: p.stem)
def test_example_scenario_runs(path, tmp_path, monkeypatch):
    """Each example scenario loads (named after its file) and ``asyngrad simulate`` runs it
    from the repository root, where its relative ``problem.model`` path resolves (shortened to
    300 updates)."""
    monkeypatch.chdir(REPO_ROOT)
    scenario = load_scenario(path)
    assert scenario.problem.name == "torch"
    assert scenario.name == NAMES[path.stem]
    summary = _simulate(path, tmp_path / "run", "run.updates=300")
    assert summary["loss"]["final"] < summary["loss"]["initial"]


def test_the_libsvm_example_is_its_script_s_output_and_trains_sparse(tmp_path, monkeypatch):
    """examples/sparse.svm holds what examples/make_sparse_svm.py writes (the same matrix and
    labels, read back), and examples/sparse_svm.toml trains sparse_logistic on it from the
    repository root: sparse supports, a fifth of the rows held out, the loss falls."""
    from sklearn.datasets import load_svmlight_file

    monkeypatch.chdir(REPO_ROOT)
    made = load_factory(f"{EXAMPLES / 'make_sparse_svm.py'}:write")
    made(tmp_path / "again.svm")
    shipped, again = (load_svmlight_file(str(p), zero_based=True)
                      for p in (EXAMPLES / "sparse.svm", tmp_path / "again.svm"))
    assert (shipped[0] != again[0]).nnz == 0 and np.array_equal(shipped[1], again[1])
    scenario = load_scenario(EXAMPLES / "sparse_svm.toml")
    problem = make_problem(scenario.problem)
    assert problem.sparse and problem.n_samples == 1600 and len(problem.held[1]) == 400
    summary = _simulate(EXAMPLES / "sparse_svm.toml", tmp_path / "run", "run.updates=2000")
    assert summary["loss"]["final"] < summary["loss"]["initial"]


# -- the LSTM tagger: the numpy lstm_tagger's function, in nn.LSTM --------------------------

def _tagger():
    """(numpy problem, torch problem, slice of ``lstm.bias_hh_l0`` in the torch vector), both
    problems with l2 = L2. The slice is found from the module's own parameters, not the
    example's mapping helpers."""
    ref = load_factory(f"{EXAMPLES / 'lstm_tagger.py'}:numpy_problem")(L2)
    ours = _torch_problem("lstm_tagger.py:make", l2=L2)
    model = load_factory(f"{EXAMPLES / 'lstm_tagger.py'}:make")()["model"]
    start = 0
    for name, p in model.named_parameters():
        if name == "lstm.bias_hh_l0":
            return ref, ours, slice(start, start + p.numel())
        start += p.numel()
    raise AssertionError("the tagger has no lstm.bias_hh_l0")


def test_the_torch_tagger_has_the_numpy_tagger_data_and_w0():
    """Same sequences (one per sample, in order), and w_0 is the numpy w_0 with the redundant
    bias ``bias_hh_l0`` inserted as zeros: a vector 4H longer."""
    ref, ours, extra = _tagger()
    assert ours.n_samples == ref.n_samples and ours.batch == 1
    assert np.array_equal(ours.X.numpy(), ref.tokens)
    assert np.array_equal(ours.y.numpy(), ref.tags)
    w0 = ours.initial()
    assert ours.dim == ref.dim + 4 * ref.hidden == ref.dim + (extra.stop - extra.start)
    assert not w0[extra].any()
    assert np.array_equal(np.delete(w0, np.r_[extra]), ref.initial())


def test_the_torch_tagger_gradient_is_the_numpy_gradient():
    """At several random points with ``bias_hh_l0 = 0`` and several samples (float64): the
    per-sample loss equals the numpy f_i, l2 term included, to 1e-10; the gradient on the
    shared coordinates equals the numpy gradient to 1e-10; ``bias_hh_l0``'s gradient is the
    data part of ``bias_ih_l0``'s (its own l2 term is λ·0). The full loss and gradient too,
    and the per-token accuracy on training and held-out sequences."""
    ref, ours, extra = _tagger()
    rng = np.random.default_rng(7)
    h4 = extra.stop - extra.start
    ih = slice(extra.start - h4, extra.start)  # bias_ih_l0, just before bias_hh_l0
    for _ in range(4):
        w = ref.initial() + 0.5 * rng.standard_normal(ref.dim)
        v = np.insert(w, extra.start, np.zeros(h4))
        for idx in (0, 1, 57, ref.n_samples - 1):
            assert ours.loss(v, idx) == pytest.approx(ref.loss(w, idx), rel=1e-10, abs=1e-12)
            g, expected = ours.grad(v, idx)[0], ref.grad(w, idx)[0]
            np.testing.assert_allclose(np.delete(g, np.r_[extra]), expected,
                                       rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(g[extra], g[ih] - L2 * v[ih], rtol=1e-10, atol=1e-12)
        assert ours.full_loss(v) == pytest.approx(ref.full_loss(w), rel=1e-10)
        np.testing.assert_allclose(np.delete(ours.full_grad(v), np.r_[extra]),
                                   ref.full_grad(w), rtol=1e-10, atol=1e-12)
        # a tag per token: the same per-token accuracy, on training and held-out sequences
        assert ours.accuracy(v) == pytest.approx(ref.accuracy(w), abs=1e-12)
        assert ours.held_out_accuracy(v) == pytest.approx(ref.held_out_accuracy(w), abs=1e-12)


def test_only_the_sum_of_the_two_lstm_biases_matters():
    """``bias_hh_l0`` is redundant: with it nonzero the torch data loss is the numpy loss at
    gate biases ``bias_ih_l0 + bias_hh_l0`` (l2 = 0 here, since the two l2 terms differ there),
    and the two biases' gradients are equal, the numpy gradient of the gate biases."""
    ref = load_factory(f"{EXAMPLES / 'lstm_tagger.py'}:numpy_problem")(0.0)
    ours = _torch_problem("lstm_tagger.py:make", l2=0.0)
    _, _, extra = _tagger()
    h4 = extra.stop - extra.start
    ih = slice(extra.start - h4, extra.start)
    rng = np.random.default_rng(3)
    v = ours.initial() + 0.5 * rng.standard_normal(ours.dim)
    w = np.delete(v, np.r_[extra])
    w[ih] += v[extra]
    for idx in (2, 99):
        assert ours.loss(v, idx) == pytest.approx(ref.loss(w, idx), rel=1e-10)
        g, expected = ours.grad(v, idx)[0], ref.grad(w, idx)[0]
        np.testing.assert_allclose(np.delete(g, np.r_[extra]), expected, rtol=1e-10,
                                   atol=1e-12)
        np.testing.assert_allclose(g[extra], g[ih], rtol=1e-12, atol=1e-15)


# -- the digits convnet ------------------------------------------------------------------

def test_the_convnet_gradient_against_finite_differences():
    """On minibatches of 16 at a random point: the gradient along a random unit direction
    agrees with a central difference of the loss (rel 1e-6)."""
    problem = _torch_problem("digits_convnet.py:make", batch=16, holdout=0.2, l2=1e-4)
    assert problem.dim == 3658
    rng = np.random.default_rng(11)
    w = problem.initial() + 0.05 * rng.standard_normal(problem.dim)
    v = rng.standard_normal(problem.dim)
    v /= np.linalg.norm(v)
    h = 1e-5
    for idx in (0, 17, problem.n_samples - 1):
        slope = (problem.loss(w + h * v, idx) - problem.loss(w - h * v, idx)) / (2 * h)
        assert problem.grad(w, idx)[0] @ v == pytest.approx(slope, rel=1e-6)


def test_the_convnet_as_stages_is_the_same_network_cut_before_its_classifier():
    """``make_stages`` is ``make``'s network as an ``nn.Sequential``: from the same seed the
    same w_0 and per-sample gradients (bit for bit); the pipeline example cuts it into the
    convolutions (1,248 parameters) and the classifier (2,410), passing a minibatch's 64
    features a row."""
    spec = {"batch": 16, "holdout": 0.2, "l2": 1e-4}
    whole = _torch_problem("digits_convnet.py:make", **spec)
    staged = _torch_problem("digits_convnet.py:make_stages", split_at=["fc1"], **spec)
    assert np.array_equal(staged.initial(), whole.initial())
    w = whole.initial()
    for idx in (0, 40):
        assert np.array_equal(staged.grad(w, idx)[0], whole.grad(w, idx)[0])
    assert staged.stages() == [slice(0, 1248), slice(1248, 3658)]
    assert staged.stage_width(0) == 16 * 64
    assert load_scenario(EXAMPLES / "digits_pipeline.toml").problem.split_at == ("fc1",)


@pytest.mark.slow
def test_the_convnet_example_learns_the_digits(tmp_path, monkeypatch):
    """The example scenario run in full (3,000 updates of 4 lock-free threads) classifies more
    than 80% of the held-out fifth of the digits right (chance: 10%), and its training loss
    falls by an order of magnitude. The exact metrics are switched off: they measure the run
    and do not steer it, so this is the example's own trajectory, at half the gradients."""
    monkeypatch.chdir(REPO_ROOT)
    path = EXAMPLES / "digits_convnet.toml"
    assert load_scenario(path).run.updates == 3000
    summary = _simulate(path, tmp_path / "run", "metrics.exact=false")
    assert summary["task"]["held_out_accuracy"] > 0.8
    assert summary["task"]["accuracy"] > 0.8
    assert summary["loss"]["final"] < 0.1 * summary["loss"]["initial"]
