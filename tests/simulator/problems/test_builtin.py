"""Problems against independent implementations: torch autograd, scipy, scikit-learn."""

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from simulator.problems import LogisticProblem, QuadraticProblem, SparseLogisticProblem

torch = pytest.importorskip("torch")

PROBLEMS = {
    "quadratic": lambda: QuadraticProblem(20, 200, 0.01, seed=3),
    "logistic": lambda: LogisticProblem.synthetic(20, 300, 0.01, seed=3),
    "breast_cancer": lambda: LogisticProblem.breast_cancer(0.01),
    "sparse_logistic": lambda: SparseLogisticProblem.synthetic(200, 300, 0.01, 0.05, seed=3),
}


@pytest.fixture(params=list(PROBLEMS), scope="module")
def problem(request):
    return PROBLEMS[request.param]()


def _points(problem, count=5):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(problem.dim) for _ in range(count)]


def test_numpy_gradient_matches_torch_autograd(problem):
    """Per-sample numpy gradients equal torch autograd of the torch twin to 1e-10 (float64)."""
    for i, w in enumerate(_points(problem)):
        idx = (37 * i) % problem.n_samples
        wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        problem.torch_loss(wt, idx).backward()
        ours = problem.dense_grad(w, idx)
        assert np.allclose(ours, wt.grad.numpy(), rtol=1e-10, atol=1e-12)
        assert problem.loss(w, idx) == pytest.approx(
            float(problem.torch_loss(torch.tensor(w), idx)), rel=1e-12)


def test_full_objective_is_mean_of_samples(problem):
    """f and ∇f equal the average of the per-sample losses and gradients."""
    w = _points(problem, 1)[0]
    losses = [problem.loss(w, i) for i in range(problem.n_samples)]
    grads = np.mean([problem.dense_grad(w, i) for i in range(problem.n_samples)], axis=0)
    assert problem.full_loss(w) == pytest.approx(np.mean(losses), rel=1e-12)
    assert np.allclose(problem.full_grad(w), grads, rtol=1e-10, atol=1e-12)


def test_hessian_vector_product_matches_finite_differences(problem):
    """hessp agrees with central differences of the full gradient."""
    w, v = _points(problem, 2)
    h = 1e-5
    numeric = (problem.full_grad(w + h * v) - problem.full_grad(w - h * v)) / (2 * h)
    assert np.allclose(problem.hessp(w, v), numeric, rtol=1e-5, atol=1e-7)


def test_optimum_has_zero_gradient_and_is_minimal(problem):
    """At w* the full gradient vanishes (~1e-12) and nearby points are no better."""
    w_star, f_star = problem.optimum()
    assert np.linalg.norm(problem.full_grad(w_star)) < 1e-10
    for w in _points(problem):
        assert problem.full_loss(w_star + 1e-3 * w) >= f_star


def test_optimum_matches_scipy_bfgs(problem):
    """An independent scipy L-BFGS solve reaches the same f* and w*."""
    w_star, f_star = problem.optimum()
    result = scipy.optimize.minimize(problem.full_loss, np.zeros(problem.dim),
                                     jac=problem.full_grad, method="L-BFGS-B",
                                     options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 5000})
    assert result.fun == pytest.approx(f_star, abs=1e-10)
    assert np.allclose(result.x, w_star, atol=1e-5)


def test_quadratic_optimum_matches_least_squares():
    """Ridge w* equals scipy's least-squares solution of the augmented system."""
    p = QuadraticProblem(15, 60, 0.05, seed=1)
    n = p.n_samples
    A = np.vstack([p.A / np.sqrt(n), np.sqrt(p.l2) * np.eye(p.dim)])
    b = np.concatenate([p.b / np.sqrt(n), np.zeros(p.dim)])
    reference = scipy.linalg.lstsq(A, b)[0]
    assert np.allclose(p.optimum()[0], reference, rtol=1e-10, atol=1e-12)


def test_quadratic_constants_are_hessian_eigenvalues():
    """c and q of the quadratic are the extreme eigenvalues of its (constant) Hessian."""
    for dim, n in ((15, 60), (80, 40)):
        p = QuadraticProblem(dim, n, 0.05, seed=1)
        eig = np.linalg.eigvalsh(p.A.T @ p.A / n + p.l2 * np.eye(dim))
        assert p.strong_convexity == pytest.approx(eig[0], rel=1e-9, abs=1e-12)
        assert p.smoothness == pytest.approx(eig[-1], rel=1e-9)


@pytest.mark.parametrize("name", ["logistic", "sparse_logistic"])
def test_logistic_constants_bound_the_hessian(name):
    """c ≤ λ_min(∇²f(w)) and λ_max(∇²f(w)) ≤ q at random points."""
    p = PROBLEMS[name]()
    for w in _points(p, 3):
        H = np.column_stack([p.hessp(w, e) for e in np.eye(p.dim)])
        eig = np.linalg.eigvalsh((H + H.T) / 2)
        assert eig[0] >= p.strong_convexity - 1e-10
        assert eig[-1] <= p.smoothness + 1e-10


def test_logistic_matches_scikit_learn():
    """Our logistic optimum equals scikit-learn's LogisticRegression with C = 1/(nλ)."""
    from sklearn.linear_model import LogisticRegression
    p = LogisticProblem.breast_cancer(0.01)
    model = LogisticRegression(C=1.0 / (p.n_samples * p.l2), fit_intercept=False, tol=1e-12,
                               max_iter=10_000).fit(p.X, p.y)
    assert np.allclose(model.coef_.ravel(), p.optimum()[0], atol=1e-6)


def test_sparse_gradients_stay_on_their_support():
    """A sparse sample's gradient is zero outside its support, and its support is sorted."""
    p = PROBLEMS["sparse_logistic"]()
    w = _points(p, 1)[0]
    values, support = p.grad(w, 5)
    assert support is not None and np.all(np.diff(support) > 0)
    dense = p.dense_grad(w, 5)
    assert np.count_nonzero(dense) <= support.size
    assert np.array_equal(dense[support], values)


def test_breast_cancer_is_shipped_data():
    """The real-data problem loads offline from scikit-learn: 569 samples, 30 features."""
    p = PROBLEMS["breast_cancer"]()
    assert (p.n_samples, p.dim) == (569, 30)
    assert set(np.unique(p.y)) == {-1.0, 1.0}


def test_mlp_matches_torch_and_its_own_full_objective():
    """MLP: per-sample gradients equal autograd of the torch twin; f and ∇f are the means."""
    from simulator.problems import MLPProblem
    p = MLPProblem.synthetic(6, 60, 3, 5, 0.01, seed=2)
    rng = np.random.default_rng(3)
    for idx in (0, 17, 59):
        w = p.initial() + 0.3 * rng.standard_normal(p.dim)
        wt = torch.tensor(w, requires_grad=True)
        p.torch_loss(wt, idx).backward()
        assert np.allclose(p.dense_grad(w, idx), wt.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert p.full_loss(w) == pytest.approx(np.mean([p.loss(w, i) for i in range(60)]),
                                           rel=1e-12)
    mean = np.mean([p.dense_grad(w, i) for i in range(60)], axis=0)
    assert np.allclose(p.full_grad(w), mean, rtol=1e-10, atol=1e-12)


def test_mlp_starts_off_the_symmetric_saddle_and_finds_a_local_minimum():
    """w_0 is seeded and nonzero; optimum() is a local minimum below f(w_0)."""
    from simulator.problems import MLPProblem
    p = MLPProblem.synthetic(6, 80, 3, 5, 0.01, seed=4)
    assert np.array_equal(p.initial(), p.initial()) and np.count_nonzero(p.initial()) > 0
    assert not p.convex and p.strong_convexity is None
    w_star, f_star = p.optimum()
    assert np.linalg.norm(p.full_grad(w_star)) < 1e-6 and f_star < p.full_loss(p.initial())


def test_digits_are_shipped_data():
    """The MLP's real data loads offline from scikit-learn: 1,797 images of 64 pixels."""
    from simulator.problems import MLPProblem
    p = MLPProblem.digits(8, 0.01, seed=0)
    assert (p.n_samples, p.shape) == (1797, (64, 8, 10))


def test_lstm_tagger_matches_torch_and_its_own_full_objective():
    """LSTM tagger: BPTT in numpy equals autograd of the torch twin; f and ∇f are the means
    of the per-sequence ones."""
    from simulator.lstm_tagger import LSTMTaggerProblem
    _matches_torch_and_full_objective(LSTMTaggerProblem.synthetic(12, 40, 6, 3, 5, 0.01, 2))


def _matches_torch_and_full_objective(p):
    """Per-sequence loss and gradient equal the torch twin's (autograd) at random points;
    f and ∇f are the means of the per-sequence ones. Returns the last point."""
    rng = np.random.default_rng(3)
    for idx in (0, 17, 39):
        w = p.initial() + 0.3 * rng.standard_normal(p.dim)
        wt = torch.tensor(w, requires_grad=True)
        loss = p.torch_loss(wt, idx)
        loss.backward()
        assert loss.detach().item() == pytest.approx(p.loss(w, idx), rel=1e-12)
        assert np.allclose(p.dense_grad(w, idx), wt.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert p.full_loss(w) == pytest.approx(np.mean([p.loss(w, i) for i in range(40)]),
                                           rel=1e-12)
    mean = np.mean([p.dense_grad(w, i) for i in range(40)], axis=0)
    assert np.allclose(p.full_grad(w), mean, rtol=1e-10, atol=1e-12)
    return w


def test_lstm_tagger_learns_the_tags_from_context():
    """The local optimum estimate (200 L-BFGS steps) is nearly stationary and tags far better
    than chance and than w_0."""
    from simulator.lstm_tagger import LSTMTaggerProblem
    p = LSTMTaggerProblem.synthetic(12, 60, 6, 3, 5, 0.01, seed=4)
    assert not p.convex and np.count_nonzero(p.initial()) > 0
    w_star, f_star = p.optimum()
    g0 = np.linalg.norm(p.full_grad(p.initial()))
    assert np.linalg.norm(p.full_grad(w_star)) < 1e-3 * g0 and f_star < p.full_loss(p.initial())
    assert p.accuracy(w_star) > 0.7 > p.accuracy(p.initial())
    # Held-out sequences from the same HMM (their own stream): the model generalises.
    assert p.held_out.n_samples == 15 and not np.array_equal(p.held_out.tokens, p.tokens[:15])
    assert p.held_out_accuracy(w_star) > 0.6 > p.held_out_accuracy(p.initial())


def test_dense_crf_matches_torch_brute_force_and_learns():
    """Dense CRF: forward-backward gradients equal autograd of the torch twin (exact forward
    algorithm); Viterbi equals brute force over all tag sequences; the local optimum is
    stationary and tags far better than w_0."""
    import itertools

    from simulator.dense_crf import DenseCRFProblem
    p = DenseCRFProblem.synthetic(12, 40, 5, 3, 4, 0.01, seed=2)
    w = _matches_torch_and_full_objective(p)
    _, _, _, trans, start = p._unpack(w)
    decoded = p.decode(w)
    for row in (0, 7):
        s = p._scores(w, slice(row, row + 1))[0]

        def score(y, s=s):
            return (start[y[0]] + sum(s[t, y[t]] for t in range(5))
                    + sum(trans[y[t - 1], y[t]] for t in range(1, 5)))

        best = max(itertools.product(range(3), repeat=5), key=score)
        assert list(best) == decoded[row].tolist()
    w_star, f_star = p.optimum()
    assert np.linalg.norm(p.full_grad(w_star)) < 1e-6 and f_star < p.full_loss(p.initial())
    assert p.accuracy(w_star) > 0.8 > p.accuracy(p.initial())


@pytest.mark.parametrize("name", ["lstm_tagger", "dense_crf"])
def test_lock_free_taggers_reach_the_serial_accuracy(name):
    """Lock-free training of the paper's dense models ends near the serial run's accuracy,
    although nearly every update carries a gradient error."""
    from simulator.engine import Engine
    from simulator.metrics import error_mask
    from simulator.scenario import load_scenario

    base = [f"problem.name={name}", "problem.dim=30", "problem.hidden=8",
            "problem.classes=3", "problem.n_samples=150", "problem.length=6",
            "run.updates=4000", "run.lr=0.1", "metrics.every=4", "metrics.curve_points=5"]
    accuracy, held = {}, {}
    for protocol in ("serial", "lockfree"):
        engine = Engine(load_scenario(None, [*base, f"run.protocol={protocol}"]))
        trace = engine.run()
        accuracy[protocol] = engine.problem.accuracy(trace["w_final"])
        held[protocol] = engine.problem.held_out_accuracy(trace["w_final"])
        if protocol == "lockfree":
            assert error_mask(trace).mean() > 0.9
    assert accuracy["serial"] > 0.6 and held["serial"] > 0.6
    assert abs(accuracy["lockfree"] - accuracy["serial"]) < 0.05
    assert abs(held["lockfree"] - held["serial"]) < 0.08  # 37 held-out sequences


def test_synthetic_held_out_sets_come_from_the_training_model_without_changing_it():
    """The held-out samples use their own stream: the training data are what they were, the
    held-out ones differ, and the classifier at w* does about as well on them (sklearn's
    fit on the training data agrees)."""
    from sklearn.linear_model import LogisticRegression

    from simulator.problems import MLPProblem

    p = LogisticProblem.synthetic(20, 400, 0.01, seed=5)
    rng = np.random.default_rng(5)
    assert np.array_equal(p.X, rng.standard_normal((400, 20)))
    Xh, yh = p.held
    assert Xh.shape == (100, 20) and not np.isin(Xh[0], p.X).any()
    w_star = p.optimum()[0]
    assert abs(p.held_out_accuracy(w_star) - p.accuracy(w_star)) < 0.12
    sk = LogisticRegression(C=1 / (0.01 * 400), fit_intercept=False, tol=1e-10).fit(p.X, p.y)
    assert p.held_out_accuracy(w_star) == pytest.approx(sk.score(Xh, yh), abs=0.02)
    sparse = SparseLogisticProblem.synthetic(200, 400, 0.01, 0.05, seed=3)
    assert sparse.held[0].shape == (100, 200) and 0.5 < sparse.held_out_accuracy(
        sparse.optimum()[0]) <= 1
    mlp = MLPProblem.synthetic(6, 200, 3, 5, 0.01, seed=2)
    Xh, yh = mlp.held
    assert Xh.shape == (50, 6) and not np.isin(Xh[0], mlp.X).any()
    # The held-out accuracy, recomputed row by row from the flat parameters (W1, b1, W2, b2).
    w = np.random.default_rng(0).standard_normal(mlp.dim)
    W1, b1 = w[:30].reshape(5, 6), w[30:35]
    W2, b2 = w[35:50].reshape(3, 5), w[50:53]
    right = [int(np.argmax(W2 @ np.tanh(W1 @ x + b1) + b2) == label)
             for x, label in zip(Xh, yh, strict=True)]
    assert 0 < sum(right) < len(right)
    assert mlp.held_out_accuracy(w) == sum(right) / len(right)
    assert QuadraticProblem(5, 50, 0.01, seed=1).held_out_accuracy(np.zeros(5)) is None


def test_real_data_holdout_is_a_seeded_disjoint_split():
    from simulator.problems import MLPProblem, holdout_split

    train, held = holdout_split(569, 0.2, seed=0)
    assert (train.size, held.size) == (455, 114) and not np.intersect1d(train, held).size
    assert np.array_equal(held, holdout_split(569, 0.2, seed=0)[1])
    assert not np.array_equal(held, holdout_split(569, 0.2, seed=1)[1])
    p = LogisticProblem.breast_cancer(0.01, holdout=0.2, seed=0)
    assert (p.n_samples, p.held[0].shape) == (455, (114, 30))
    assert p.held_out_accuracy(p.optimum()[0]) > 0.9
    assert LogisticProblem.breast_cancer(0.01).held is None
    digits = MLPProblem.digits(8, 0.01, seed=0, holdout=0.25)
    assert digits.n_samples + digits.held[0].shape[0] == 1797


def test_holdout_is_refused_for_synthetic_data():
    from simulator.errors import ScenarioError
    from simulator.scenario import load_scenario

    with pytest.raises(ScenarioError, match="holdout"):
        load_scenario(None, ["problem.holdout=0.2"])
    with pytest.raises(ScenarioError, match="holdout"):
        load_scenario(None, ["problem.data=breast_cancer", "problem.holdout=1.0"])
    assert load_scenario(None, ["problem.data=breast_cancer",
                                "problem.holdout=0.2"]).problem.holdout == 0.2


def test_an_estimated_optimum_is_cached_by_spec(tmp_path, monkeypatch):
    """A nonconvex problem's L-BFGS estimate is written once per spec: the next construction
    loads the same bytes without solving; a damaged file is solved again; another spec has
    its own file; a problem not built from a spec is never cached."""
    from simulator.lstm_tagger import LSTMTaggerProblem
    from simulator.problems import CACHE_ENV, make_problem
    from simulator.scenario import load_scenario

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(LSTMTaggerProblem, "SOLVER_ITERATIONS", 5)  # the cache is tested
    spec = load_scenario(None, ["problem.name=lstm_tagger", "problem.dim=12",
                                "problem.hidden=4", "problem.n_samples=20"]).problem
    first = make_problem(spec).optimum()
    files = list(tmp_path.glob("optimum-lstm_tagger-*.npy"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    saved = files[0].read_bytes()

    def no_solve(self):
        raise AssertionError("solved again")

    with monkeypatch.context() as patch:
        patch.setattr(LSTMTaggerProblem, "_solve", no_solve)
        again = make_problem(spec).optimum()
    assert again[0].tobytes() == first[0].tobytes() and again[1] == first[1]
    assert files[0].read_bytes() == saved
    files[0].write_bytes(saved[:40])  # a truncated file: solved and written again
    assert make_problem(spec).optimum()[0].tobytes() == first[0].tobytes()
    assert files[0].read_bytes() == saved
    other = load_scenario(None, ["problem.name=lstm_tagger", "problem.dim=12",
                                 "problem.hidden=4", "problem.n_samples=20",
                                 "problem.seed=1"]).problem
    make_problem(other).optimum()
    assert len(list(tmp_path.glob("optimum-lstm_tagger-*.npy"))) == 2
    LSTMTaggerProblem.synthetic(12, 20, 8, 4, 4, 0.01, 0).optimum()
    assert len(list(tmp_path.glob("*.npy"))) == 2
