"""A user's data from CSV, npz and libsvm files: the problems built from them against the
same problems built from the arrays, closed forms, and one-line refusals of bad files."""

import numpy as np
import pytest
import scipy.sparse
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from simulator import simulate
from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.problems import (
    LogisticProblem,
    MLPProblem,
    QuadraticProblem,
    SparseLogisticProblem,
    make_problem,
)
from simulator.problems.base import holdout_split
from simulator.scenario import load_scenario, scenario_from_dict
from tests.simulator.problems import torch_models


def _spec(**problem):
    return scenario_from_dict({"problem": problem}).problem


def _csv(path, X, y, header=None, target_at=None):
    """Write X and y as CSV, y as the last column or at ``target_at``, exactly (%.17g)."""
    columns = list(X.T)
    columns.insert(X.shape[1] if target_at is None else target_at, y)
    np.savetxt(path, np.column_stack(columns), delimiter=",", fmt="%.17g",
               header=",".join(header) if header else "", comments="")
    return str(path)


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 5))
    return X, np.where(X @ rng.standard_normal(5) > 0, 1, 0)


def test_a_csv_with_a_header_names_its_target(tmp_path, data):
    """logistic on a CSV whose target is the named second column (0/1): the same problem as
    LogisticProblem on the arrays with ±1 labels."""
    X, y = data
    path = _csv(tmp_path / "d.csv", X, y, header=["a", "label", "b", "c", "d", "e"],
                target_at=1)
    ours = make_problem(_spec(name="logistic", data=path, target="label"))
    ref = LogisticProblem(X, np.where(y == 1, 1.0, -1.0), 0.01)
    assert (ours.dim, ours.n_samples) == (5, 60)
    np.testing.assert_array_equal(ours.X, ref.X)
    np.testing.assert_array_equal(ours.y, ref.y)
    w = np.linspace(-1, 1, 5)
    assert ours.full_loss(w) == ref.full_loss(w)
    assert ours.held_out_accuracy(w) is None  # no holdout asked for


def test_a_csv_without_a_header_takes_the_last_column_or_an_index(tmp_path, data):
    X, y = data
    last = make_problem(_spec(name="logistic", data=_csv(tmp_path / "a.csv", X, y)))
    first = make_problem(_spec(name="logistic", data=_csv(tmp_path / "b.csv", X, y,
                                                          target_at=0), target="0"))
    np.testing.assert_array_equal(last.X, first.X)
    np.testing.assert_array_equal(last.y, first.y)
    # An index as a TOML integer (`target = 0`, `--set problem.target=0`) is that column too.
    spec = load_scenario(None, [f"problem.data={tmp_path / 'b.csv'}",
                                "problem.target=0"]).problem
    assert spec.target == "0"
    np.testing.assert_array_equal(make_problem(spec).y, first.y)


def test_an_npz_trains_ridge_regression_to_its_closed_form(tmp_path):
    """quadratic on an npz: w* solves the normal equations (AᵀA/n + λI) w = Aᵀb/n."""
    rng = np.random.default_rng(1)
    A, b = rng.standard_normal((40, 6)), rng.standard_normal(40)
    path = tmp_path / "d.npz"
    np.savez(path, X=A, target=b)
    problem = make_problem(_spec(name="quadratic", data=str(path), target="target", l2=0.1))
    assert isinstance(problem, QuadraticProblem) and problem.dim == 6
    expected = np.linalg.solve(A.T @ A / 40 + 0.1 * np.eye(6), A.T @ b / 40)
    np.testing.assert_allclose(problem.optimum()[0], expected, rtol=1e-10)


def test_a_libsvm_file_stays_sparse_and_runs_as_the_arrays_do(tmp_path):
    """sparse_logistic on a libsvm file written from the synthetic problem's data: its rows
    (to the file's 16 digits) and supports, and, against the problem built from what
    scikit-learn's loader reads, the same gradients and the same simulated trace, bit for
    bit."""
    ref = SparseLogisticProblem.synthetic(50, 80, 0.01, 0.1, seed=2)
    path = tmp_path / "d.svm"
    dump_svmlight_file(ref.X, ref.y, str(path))
    ours = make_problem(_spec(name="sparse_logistic", data=str(path)))
    assert ours.sparse and scipy.sparse.issparse(ours.X)
    X, y = load_svmlight_file(str(path))
    read = SparseLogisticProblem(X.tocsr(), y, 0.01)
    np.testing.assert_allclose(ours.X.toarray(), ref.X.toarray(), rtol=1e-15)
    w = np.random.default_rng(0).standard_normal(50)
    for idx in (0, 13, 79):
        np.testing.assert_array_equal(ours.support(idx), ref.support(idx))
        np.testing.assert_array_equal(ours.grad(w, idx)[0], read.grad(w, idx)[0])
    scenario = scenario_from_dict({"problem": {"name": "sparse_logistic", "data": str(path)},
                                   "run": {"updates": 300, "threads": 4, "blocks": 5}})
    a, b = simulate(scenario), simulate(scenario, problem=read)
    for key, array in a.arrays.items():
        assert np.array_equal(array, b[key], equal_nan=True), key


def test_an_mlp_takes_its_classes_from_the_labels_and_holds_rows_out(tmp_path, data):
    """Labels 3, 5, 9 are classes 0, 1, 2; holdout keeps the seeded rows holdout_split
    names out of training and scores them."""
    X, _ = data
    labels = np.array([3, 5, 9])[np.arange(60) % 3]
    path = _csv(tmp_path / "d.csv", X, labels)
    problem = make_problem(_spec(name="mlp", data=path, holdout=0.25, hidden=4, seed=7))
    train, held = holdout_split(60, 0.25, 7)
    assert isinstance(problem, MLPProblem) and problem.shape == (5, 4, 3)
    np.testing.assert_array_equal(problem.X, X[train])
    np.testing.assert_array_equal(problem.y, (np.arange(60) % 3)[train])
    np.testing.assert_array_equal(problem.held[1], (np.arange(60) % 3)[held])
    assert 0 <= problem.held_out_accuracy(problem.initial()) <= 1


def test_held_out_labels_keep_the_training_classes(tmp_path, data):
    """Held-out rows are labelled by the training rows' classes: a value training never had
    is never predicted right (mlp: −1; logistic: 0), and held-out rows of one class are no
    reason to refuse a two-class target."""
    X, _ = data
    labels = np.where(np.arange(60) % 2 == 0, 0, 2)
    labels[holdout_split(60, 0.25, 7)[1][0]] = 1  # a class held out only
    path = _csv(tmp_path / "d.csv", X, labels)
    mlp = make_problem(_spec(name="mlp", data=path, holdout=0.25, seed=7))
    assert mlp.shape[2] == 2 and -1 in mlp.held[1]
    expected = np.where(labels == 2, 1, np.where(labels == 0, 0, -1))
    np.testing.assert_array_equal(mlp.held[1], expected[holdout_split(60, 0.25, 7)[1]])
    logistic = make_problem(_spec(name="logistic", data=path, holdout=0.25, seed=7))
    assert set(np.unique(logistic.held[1])) == {-1.0, 0.0, 1.0}
    held = holdout_split(60, 0.25, 7)[1]
    one_class = np.arange(60) % 2
    one_class[held] = 1  # every held-out row of one class
    path = _csv(tmp_path / "e.csv", X, one_class)
    logistic = make_problem(_spec(name="logistic", data=path, holdout=0.25, seed=7))
    assert np.all(logistic.held[1] == 1.0)


def test_csv_headers_pandas_names_and_a_bom(tmp_path, data):
    """pandas' default header 0,1,... is a header; a first row with an empty cell is data with
    a missing number (refused), not a header; an editor's BOM does not end up in a name."""
    X, y = data
    body = "\n".join(",".join(f"{v:.17g}" for v in row) + f",{t}"
                     for row, t in zip(X, y, strict=True))
    (tmp_path / "pandas.csv").write_text("0,1,2,3,4,5\n" + body + "\n")
    problem = make_problem(_spec(name="logistic", data=str(tmp_path / "pandas.csv")))
    assert problem.n_samples == 60
    (tmp_path / "bom.csv").write_text("a,b,c,d,e,label\n" + body + "\n", encoding="utf-8-sig")
    assert make_problem(_spec(name="logistic", data=str(tmp_path / "bom.csv"),
                              target="label")).n_samples == 60
    (tmp_path / "gap.csv").write_text("1,,0\n3,4,1\n")
    with pytest.raises(ScenarioError, match="line 1 has '', not a number"):
        make_problem(_spec(name="logistic", data=str(tmp_path / "gap.csv")))


def test_a_torch_model_trains_on_a_file(tmp_path, data):
    """A factory that returns (model, loss_fn) takes X and y from problem.data."""
    pytest.importorskip("torch")
    X, y = data
    path = _csv(tmp_path / "d.csv", X, y)
    factory = tmp_path / "model.py"
    factory.write_text("import torch\n\ndef make():\n"
                       "    return torch.nn.Linear(5, 2), torch.nn.functional.cross_entropy\n")
    problem = make_problem(_spec(name="torch", model=f"{factory}:make", data=path))
    assert (problem.rows, problem.dim) == (60, 12)
    np.testing.assert_array_equal(problem.X.numpy(), X)
    assert problem.accuracy(problem.initial()) is not None  # integer labels: classes


def test_the_optimum_cache_key_follows_the_files_bytes(tmp_path, data):
    X, y = data
    path = _csv(tmp_path / "d.csv", X, y)
    before = make_problem(_spec(name="mlp", data=path)).spec_key
    _csv(tmp_path / "d.csv", X + 1, y)
    assert make_problem(_spec(name="mlp", data=path)).spec_key != before


BAD = [
    ("nothere.csv", "", {}, "problem.data", "no file"),
    ("d.txt", "", {}, "problem.data", "or a data file (.csv, .npz, .svm, .libsvm)"),
    ("nan.csv", "", {}, "problem.data", "X has NaN or inf values (row 1, from 0)"),
    ("ragged.csv", "", {}, "problem.data", "line 3 has 2 columns, the first has 3"),
    ("word.csv", "", {}, "problem.data", "line 2 has 'x', not a number"),
    ("head.csv", "z", {}, "problem.target", "is not a column of"),
    ("d.npz", "", {}, "problem.data", "X and y are needed"),
    ("flat.npz", "", {}, "problem.data", "a 2-d X and a 1-d y are needed"),
    ("saved.npz", "", {}, "problem.data", "is not an npz archive"),
    ("d.svm", "y", {"name": "sparse_logistic"}, "problem.target", "one target"),
    ("three.csv", "", {}, "problem.data", "logistic needs a target of two classes"),
    ("float.csv", "", {"name": "mlp"}, "problem.data", "mlp needs class labels"),
    ("good.csv", "", {"dim": 7}, "problem.dim", "set by the data file"),
    ("good.csv", "", {"name": "lstm_tagger"}, "problem.data", "data files serve"),
    (None, "y", {}, "problem.target", "names the target in a data file"),
]


def _bad_files(tmp):
    (tmp / "nan.csv").write_text("1,2,0\n3,nan,1\n")
    (tmp / "ragged.csv").write_text("1,2,0\n3,4,1\n5,6\n")
    (tmp / "word.csv").write_text("1,2,0\n3,x,1\n")
    (tmp / "head.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    (tmp / "d.txt").write_text("1,2,0\n")
    (tmp / "three.csv").write_text("1,2,0\n3,4,1\n5,6,2\n")
    (tmp / "float.csv").write_text("1,2,0.5\n3,4,1\n")
    (tmp / "good.csv").write_text("1,2,0\n3,4,1\n")
    np.savez(tmp / "d.npz", X=np.ones((3, 2)), z=np.ones(3))
    np.savez(tmp / "flat.npz", X=np.ones(3), y=np.ones(3))
    with open(tmp / "saved.npz", "wb") as handle:  # numpy.save's .npy under an npz name
        np.save(handle, np.ones((3, 2)))
    dump_svmlight_file(np.eye(3), np.array([0, 1, 1]), str(tmp / "d.svm"))


@pytest.mark.parametrize("name, target, extra, field, words", BAD,
                         ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_bad_files_are_one_line_naming_the_field(tmp_path, name, target, extra, field, words):
    _bad_files(tmp_path)
    problem = {"name": "logistic", "target": target, **extra}
    if name is not None:
        problem["data"] = str(tmp_path / name)
    with pytest.raises(ScenarioError) as err:
        make_problem(_spec(**problem))
    assert err.value.field == field and words in err.value.reason


def test_the_cli_refuses_a_missing_file_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--out", str(out), "--quiet", "--set",
                 f"problem.data={tmp_path}/none.csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "problem.data" in err[0] and "no file" in err[0]
    assert not out.exists()


def test_a_factory_with_data_and_a_file_is_refused(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "d.csv").write_text("1,2,0\n3,4,1\n")
    with pytest.raises(ScenarioError, match=r"returned data and problem\.data names"):
        make_problem(_spec(name="torch", model=f"{torch_models.__file__}:net",
                           data=str(tmp_path / "d.csv")))
