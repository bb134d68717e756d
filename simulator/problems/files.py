"""A user's data from a file: ``problem.data = "path.csv" | "path.npz" | "path.svm"``.

- **CSV**: numbers separated by commas, one row per sample, an optional header row (a first row
  that is not all numbers). ``problem.target`` names the target column (its header name, or
  its 0-based index; default: the last column); the other columns are the features.
- **npz** (``numpy.savez``): the features in array ``X`` (2-d) and the target in the array
  ``problem.target`` names (default ``y``, 1-d).
- **libsvm / svmlight** (``.svm``, ``.libsvm``): read by scikit-learn's loader; the features
  stay a sparse CSR matrix, the Hogwild! regime (``sparse_logistic``).

A header row is a first row with a name in it, or exactly 0, 1, ... (pandas' default names).
Targets whose values are all integers are read as int64 (class labels), others as float64.
Every mistake is one ``ScenarioError`` naming ``problem.data`` (or ``problem.target``): a
missing or unreadable file, a target that is not there, ragged or empty rows, NaN or inf.
"""

from __future__ import annotations

import csv
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse

from simulator.errors import ScenarioError
from simulator.problems.base import holdout_split
from simulator.scenario.base import FILE_SUFFIXES, is_file

__all__ = ["FILE_SUFFIXES", "binary_labels", "class_labels", "digest", "is_file", "read_data",
           "training_split"]


def _fail(path: str, reason: str) -> ScenarioError:
    return ScenarioError("problem.data", path, reason)


def _labels(y: np.ndarray) -> np.ndarray:
    """float64 targets, or int64 where every value is an integer."""
    y = np.asarray(y, dtype=np.float64)
    return y.astype(np.int64) if y.size and np.all(y == np.round(y)) and np.abs(y).max() < 2**53 \
        else y


def _csv(path: Path, text: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="", encoding="utf-8-sig") as handle:  # (an editor's BOM)
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if not rows:
        raise _fail(text, "the file has no rows")

    def numeric(cell: str) -> bool:
        try:
            float(cell)
        except ValueError:
            return False
        return True

    first = [cell.strip() for cell in rows[0]]
    # A header: a first row with a name in it (an empty cell is a missing number, not a
    # name), or exactly 0, 1, ..., the column names pandas writes by default.
    named = any(cell and not numeric(cell) for cell in first)
    header = first if named or first == [str(i) for i in range(len(first))] else None
    body = rows[1:] if header is not None else rows
    width = len(rows[0])
    for number, row in enumerate(body, start=2 if header is not None else 1):
        if len(row) != width:
            raise _fail(text, f"line {number} has {len(row)} columns, the first has {width}")
        bad = next((cell for cell in row if not numeric(cell)), None)
        if bad is not None:
            raise _fail(text, f"line {number} has {bad!r}, not a number")
    if not body:
        raise _fail(text, "the file has a header and no data rows")
    if width < 2:
        raise _fail(text, "one column: a target and at least one feature are needed")
    if not target:
        column = width - 1
    elif header is not None and target in header:
        column = header.index(target)
    elif target.lstrip("-").isdigit() and -width <= int(target) < width:
        column = int(target) % width
    else:
        names = f"columns {', '.join(header)}" if header else f"{width} columns, no header"
        raise ScenarioError("problem.target", target, f"is not a column of {text} ({names})")
    values = np.array(body, dtype=np.float64)
    return np.delete(values, column, axis=1), values[:, column]


def _npz(path: Path, text: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    name = target or "y"
    if not zipfile.is_zipfile(path):
        raise _fail(text, "is not an npz archive (numpy.savez writes one; numpy.save "
                    "writes .npy)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "X" not in archive.files or name not in archive.files:
                raise _fail(text, f"has arrays {', '.join(archive.files) or 'none'}; X and "
                            f"{name} are needed" + ("" if target else " (problem.target "
                                                    "names another target array)"))
            X, y = np.asarray(archive["X"]), np.asarray(archive[name])
    except ValueError as err:  # an object array (needs pickle) or a corrupt member
        raise _fail(text, f"cannot be read as plain arrays: {err}") from None
    if X.ndim != 2 or y.ndim != 1:
        raise _fail(text, f"X has shape {X.shape} and {name} {y.shape}; a 2-d X and a 1-d "
                    f"{name} are needed")
    if X.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise _fail(text, f"X is {X.dtype} and {name} {y.dtype}; numbers are needed")
    return X.astype(np.float64), y


def _svm(path: Path, text: str, target: str) -> tuple[Any, np.ndarray]:
    from sklearn.datasets import load_svmlight_file

    if target:
        raise ScenarioError("problem.target", target, "a libsvm file has one target, its "
                            "first field (leave problem.target unset)")
    try:
        X, y = load_svmlight_file(str(path), dtype=np.float64)
    except ValueError as err:
        raise _fail(text, f"is not a libsvm file: {err}") from None
    X = scipy.sparse.csr_matrix(X)
    X.sort_indices()
    return X, y


def read_data(text: str, target: str = "") -> tuple[Any, np.ndarray]:
    """(X, y) from the file ``problem.data`` names: X a float64 array (a CSR matrix for
    libsvm), y float64 or int64 (``_labels``).

    Raises:
        ScenarioError: naming problem.data or problem.target (module docstring).
    """
    path = Path(text).expanduser()
    if not path.is_file():
        raise _fail(text, f"no file {path}")
    if not is_file(text):
        raise _fail(text, f"is not a {', '.join(FILE_SUFFIXES)} file")
    suffix = path.suffix.lower()
    try:
        X, y = (_csv if suffix == ".csv" else _npz if suffix == ".npz" else _svm)(
            path, text, target)
    except OSError as err:
        raise _fail(text, f"cannot be read: {err.strerror or err}") from None
    if len(y) != X.shape[0]:
        raise _fail(text, f"X has {X.shape[0]} rows and the target {len(y)}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise _fail(text, f"X has shape {X.shape}; at least one row and one feature are "
                    "needed")
    values = X.data if scipy.sparse.issparse(X) else X
    for name, array in (("X", values), ("the target", y)):
        finite = np.isfinite(np.asarray(array, dtype=np.float64))
        if not finite.all():
            where = np.argwhere(~finite)[0]
            at = f" (row {where[0]}, from 0)" if name == "the target" or values is X else ""
            raise _fail(text, f"{name} has NaN or inf values{at}")
    return X, _labels(y)


def training_split(spec: Any, dense: bool = True) -> tuple[Any, np.ndarray, Any]:
    """(X, y, held) of the file ``spec.data`` names: ``spec.holdout`` of its rows held out
    (``holdout_split``, seeded by ``spec.seed``; held is None where none are), X dense unless
    ``dense`` is False (then CSR)."""
    X, y = read_data(spec.data, spec.target)
    if dense and scipy.sparse.issparse(X):
        X = X.toarray()
    elif not dense and not scipy.sparse.issparse(X):
        X = scipy.sparse.csr_matrix(X)
    train, held = holdout_split(X.shape[0], spec.holdout, spec.seed)
    if train.size == 0:
        raise ScenarioError("problem.holdout", spec.holdout,
                            f"leaves no training rows of the {X.shape[0]} in {spec.data}")
    return X[train], y[train], (X[held], y[held]) if held.size else None


def binary_labels(y: np.ndarray, held: Any, spec: Any) -> tuple[np.ndarray, Any]:
    """±1 labels from a training target of two classes (the larger value +1), and the held-out
    rows' by the same classes (a value training never had is 0, never predicted)."""
    classes = np.unique(y)
    if classes.size != 2:
        raise ScenarioError("problem.data", spec.data, f"{spec.name} needs a target of two "
                            f"classes in its training rows; they have {classes.size} "
                            "distinct values")

    def signs(values: np.ndarray) -> np.ndarray:
        return np.select([values == classes[1], values == classes[0]], [1.0, -1.0], 0.0)

    return signs(y), None if held is None else (held[0], signs(held[1]))


def class_labels(y: np.ndarray, held: Any, spec: Any) -> tuple[int, np.ndarray, Any]:
    """The number of classes (the training target's integer values), each training row's
    index among them (sorted), and the held-out rows' (a value training never had is −1,
    never predicted)."""
    if y.dtype.kind == "f":
        raise ScenarioError("problem.data", spec.data, f"{spec.name} needs class labels "
                            "(integers) as its target")
    classes, index = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ScenarioError("problem.data", spec.data, f"{spec.name} needs at least two "
                            "classes in its training rows")
    if held is not None:
        at = np.minimum(np.searchsorted(classes, held[1]), classes.size - 1)
        held = (held[0], np.where(classes[at] == held[1], at, -1).astype(np.int64))
    return int(classes.size), index.astype(np.int64), held


def digest(text: str) -> str:
    """A hash of the file's bytes (the optimum cache's key holds it)."""
    return hashlib.sha256(Path(text).expanduser().read_bytes()).hexdigest()[:24]
