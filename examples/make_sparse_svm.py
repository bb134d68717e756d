"""Write ``examples/sparse.svm``: a sparse text-like classification set in libsvm format.

2,000 documents over a vocabulary of 2,000 words; each document has 5–20 distinct words drawn
with Zipf-like frequencies (a few words are common, most are rare, as in text), each present
word's value its count; the label (+1/−1) comes from a logistic model on a sparse teacher. It
is the Hogwild! regime: each gradient touches about 1% of the coordinates.

    python examples/make_sparse_svm.py          # rewrites examples/sparse.svm (seeded)
    asyngrad simulate examples/sparse_svm.toml --out runs/sparse-svm
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse
from sklearn.datasets import dump_svmlight_file

DOCUMENTS, VOCABULARY, SEED = 2000, 2000, 0
HERE = Path(__file__).parent


def make() -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
    rng = np.random.default_rng(SEED)
    frequency = 1.0 / np.arange(1, VOCABULARY + 1) ** 1.1
    frequency /= frequency.sum()
    teacher = 2.0 * rng.standard_normal(VOCABULARY) * (rng.random(VOCABULARY) < 0.3)
    rows, cols, vals = [], [], []
    for doc in range(DOCUMENTS):
        words = rng.choice(VOCABULARY, size=int(rng.integers(5, 21)), p=frequency)
        present, counts = np.unique(words, return_counts=True)
        rows += [doc] * present.size
        cols += present.tolist()
        vals += counts.astype(float).tolist()
    X = scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(DOCUMENTS, VOCABULARY))
    margin = X @ teacher
    y = np.where(rng.random(DOCUMENTS) < 1 / (1 + np.exp(-margin)), 1, -1)
    return X, y


def write(path: Path) -> None:
    X, y = make()
    dump_svmlight_file(X, y, str(path), zero_based=True,
                       comment="examples/make_sparse_svm.py (seed 0)")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "sparse.svm")
