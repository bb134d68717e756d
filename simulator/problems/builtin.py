"""The built-in problems: ridge least squares, dense and sparse logistic regression, a tanh MLP
(the taggers live in ``simulator.lstm_tagger`` and ``simulator.dense_crf``)."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np
import scipy.linalg.blas
import scipy.optimize
import scipy.sparse
import scipy.sparse.linalg

from simulator.problems.base import HELD_OUT, Gradient, LocalOptimumProblem, Problem, holdout_split

__all__ = ["LogisticProblem", "MLPProblem", "QuadraticProblem", "SparseLogisticProblem"]


class _FeatureStages:
    """Two stages of a linear model (model parallelism across features): stage 0 holds the
    first ⌊d/2⌋ weights and passes its partial score x_{i,0}ᵀθ_0 on, stage 1 adds its own
    and takes the loss's slope r with respect to the score, which it passes back: each
    stage's gradient is r·x_{i,s} + λθ_s (``Problem.stages``)."""

    dim: int
    l2: float

    def _row(self, idx: int) -> np.ndarray:
        raise NotImplementedError

    def _slope(self, score: float, idx: int) -> float:
        """d f_i / d score, without the l2 term."""
        raise NotImplementedError

    def stages(self) -> list[slice] | None:
        half = self.dim // 2
        return [slice(0, half), slice(half, self.dim)]

    def stage_width(self, stage: int) -> int:
        return 1  # the partial score

    def forward(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
                idx: int) -> tuple[np.ndarray, Any]:
        part = self._row(idx)[self.stages()[stage]]  # type: ignore[index]
        score = np.array([float(part @ theta) + (0.0 if a is None else float(a[0]))])
        return score, a

    def backward(self, stage: int, theta: np.ndarray, cache: Any, up: np.ndarray | None,
                 idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        if up is None:  # the last stage: the slope at its score, recomputed at θ now
            slope = self._slope(float(self.forward(stage, theta, cache, idx)[0][0]), idx)
        else:
            slope = float(up[0])
        g = slope * self._row(idx)[self.stages()[stage]]  # type: ignore[index]
        g += self.l2 * theta
        return g, (np.array([slope]) if stage > 0 else None)


class QuadraticProblem(_FeatureStages, Problem):
    """Ridge least squares: f_i(w) = ½(a_iᵀw − b_i)² + (λ/2)‖w‖².

    c and q are exact: λ plus the extreme eigenvalues of AᵀA/n; w* is closed form (thin SVD).
    """

    name = "quadratic"

    def __init__(self, dim: int, n_samples: int, l2: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((n_samples, dim))
        w_true = rng.standard_normal(dim) / math.sqrt(dim)
        self._data(A, A @ w_true + 0.5 * rng.standard_normal(n_samples), l2)

    @classmethod
    def from_arrays(cls, A: np.ndarray, b: np.ndarray, l2: float) -> QuadraticProblem:
        """Ridge least squares on given data: the rows of ``A``, the targets ``b``."""
        problem = cls.__new__(cls)
        problem._data(A, b, l2)
        return problem

    def _data(self, A: np.ndarray, b: np.ndarray, l2: float) -> None:
        Problem.__init__(self, A.shape[1], A.shape[0])
        self.A, self.b, self.l2 = A, b, l2
        self._b = self.b.tolist()

    @cached_property
    def _svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.linalg.svd(self.A, full_matrices=False)

    @property
    def strong_convexity(self) -> float:
        s = self._svd[1]
        return self.l2 + (float(s[-1]) ** 2 / self.n_samples if self.dim <= self.n_samples else 0.0)

    @property
    def sample_strong_convexity(self) -> float:
        return self.l2

    @property
    def smoothness(self) -> float:
        return self.l2 + float(self._svd[1][0]) ** 2 / self.n_samples

    def loss(self, w: np.ndarray, idx: int) -> float:
        r = float(self.A[idx] @ w) - self._b[idx]
        return 0.5 * r * r + 0.5 * self.l2 * float(w @ w)

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        a = self.A[idx]
        g = a * (float(a @ w) - self._b[idx])
        g += self.l2 * w
        return g, None

    def full_loss(self, w: np.ndarray) -> float:
        r = self.A @ w - self.b
        return 0.5 * float(r @ r) / self.n_samples + 0.5 * self.l2 * float(w @ w)

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self.A.T @ (self.A @ w - self.b) / self.n_samples + self.l2 * w

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self.A.T @ (self.A @ v) / self.n_samples + self.l2 * v

    def _solve(self) -> np.ndarray:
        u, s, vt = self._svd
        return vt.T @ ((s / (s**2 + self.n_samples * self.l2)) * (u.T @ self.b))

    def _row(self, idx: int) -> np.ndarray:
        return self.A[idx]

    def _slope(self, score: float, idx: int) -> float:
        return score - self._b[idx]

    def torch_loss(self, w: Any, idx: int) -> Any:
        r = self.on_device("A", w)[idx] @ w - float(self._b[idx])
        return 0.5 * r * r + 0.5 * self.l2 * (w @ w)


def _logistic_coef(y: float, margin: float) -> float:
    """d/dm log(1 + exp(−y m)) at m, computed without overflow."""
    z = y * margin
    if z > 0:
        e = math.exp(-z)
        return -y * e / (1.0 + e)
    return -y / (1.0 + math.exp(z))


class LogisticProblem(_FeatureStages, Problem):
    """Dense l2-regularised logistic regression: f_i(w) = log(1 + exp(−y_i x_iᵀw)) + (λ/2)‖w‖².

    c = λ (a global bound: the data term can be arbitrarily flat far from w*), and
    q = λ + λ_max(XᵀX)/(4n), an upper bound on the Lipschitz constant of ∇f.
    ``data="breast_cancer"`` uses the Wisconsin breast-cancer data that scikit-learn ships
    (569 samples, 30 standardised features), so no download is needed.
    """

    name = "logistic"

    def __init__(self, X: np.ndarray, y: np.ndarray, l2: float,
                 held: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(X.shape[1], X.shape[0])
        self.X, self.y, self.l2, self.held = X, y, l2, held
        self._y = y.tolist()

    def accuracy(self, w: np.ndarray) -> float | None:
        return _sign_accuracy(self.X, self.y, w)

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        return None if self.held is None else _sign_accuracy(*self.held, w)

    @classmethod
    def synthetic(cls, dim: int, n_samples: int, l2: float, seed: int) -> LogisticProblem:
        """Gaussian features; labels drawn from a logistic model with margin scale 3; a
        held-out set of n/4 samples from the same model (its own stream)."""
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n_samples, dim))
        w_true = rng.standard_normal(dim) * (3.0 / math.sqrt(dim))
        y = _logistic_labels(rng, X @ w_true)
        held = np.random.default_rng([seed, HELD_OUT])
        Xh = held.standard_normal((max(1, n_samples // 4), dim))
        yh = _logistic_labels(held, Xh @ w_true)
        return cls(X, y, l2, (Xh, yh))

    @classmethod
    def breast_cancer(cls, l2: float, holdout: float = 0.0, seed: int = 0) -> LogisticProblem:
        """The breast-cancer data shipped with scikit-learn, standardised; ``holdout`` of it
        kept out of training (a seeded split)."""
        from sklearn.datasets import load_breast_cancer
        data = load_breast_cancer()
        X = np.asarray(data.data, dtype=np.float64)
        X = (X - X.mean(axis=0)) / X.std(axis=0)
        y = np.where(data.target == 1, 1.0, -1.0)
        train, held = holdout_split(len(X), holdout, seed)
        return cls(X[train], y[train], l2, (X[held], y[held]) if held.size else None)

    @property
    def strong_convexity(self) -> float:
        return self.l2

    @property
    def sample_strong_convexity(self) -> float:
        return self.l2

    @cached_property
    def smoothness(self) -> float:
        top = float(np.linalg.norm(self.X, 2))
        return self.l2 + top * top / (4 * self.n_samples)

    def loss(self, w: np.ndarray, idx: int) -> float:
        return float(np.logaddexp(0.0, -self._y[idx] * float(self.X[idx] @ w))
                     + 0.5 * self.l2 * float(w @ w))

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        x = self.X[idx]
        g = x * _logistic_coef(self._y[idx], float(x @ w))
        g += self.l2 * w
        return g, None

    def _row(self, idx: int) -> np.ndarray:
        return self.X[idx]

    def _slope(self, score: float, idx: int) -> float:
        return _logistic_coef(self._y[idx], score)

    def _margins(self, w: np.ndarray) -> np.ndarray:
        return self.y * (self.X @ w)

    def full_loss(self, w: np.ndarray) -> float:
        return float(np.logaddexp(0.0, -self._margins(w)).mean() + 0.5 * self.l2 * float(w @ w))

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        coef = -self.y * _expit(-self._margins(w))
        return self.X.T @ coef / self.n_samples + self.l2 * w

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        p = _expit(self._margins(w))
        return self.X.T @ (p * (1 - p) * (self.X @ v)) / self.n_samples + self.l2 * v

    def torch_loss(self, w: Any, idx: int) -> Any:
        import torch
        margin = float(self._y[idx]) * (self.on_device("X", w)[idx] @ w)
        return torch.nn.functional.softplus(-margin) + 0.5 * self.l2 * (w @ w)


def _logistic_labels(rng: np.random.Generator, margins: np.ndarray) -> np.ndarray:
    """±1 labels drawn from a logistic model: P(y = 1) = 1/(1 + exp(−margin))."""
    p = 1.0 / (1.0 + np.exp(-margins))
    return np.where(rng.random(len(margins)) < p, 1.0, -1.0)


def _sign_accuracy(X: Any, y: np.ndarray, w: np.ndarray) -> float:
    return float(np.mean(np.where(X @ w >= 0, 1.0, -1.0) == y))


def _expit(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class SparseLogisticProblem(Problem):
    """Sparse logistic regression, the Hogwild! regime: each sample has a few features.

    The l2 term is split over supports so per-sample gradients stay sparse (Niu et al. 2011):
    f_i(w) = log(1 + exp(−y_i x_iᵀw)) + (λ/2) Σ_{j∈S_i} (n/n_j) w_j², with n_j the number of
    samples that contain feature j. Averaged over i this is exactly (λ/2)Σ_j w_j² over the
    features that occur, so f = mean logistic loss + (λ/2)‖w‖² (features that never occur stay
    at their initial 0, which is their optimum) and c, q are as for the dense problem.
    ``X`` is a CSR matrix with sorted indices (sample i's support is its row's), ``y`` ±1.
    """

    name = "sparse_logistic"

    def __init__(self, X: Any, y: np.ndarray, l2: float,
                 held: tuple[Any, np.ndarray] | None = None) -> None:
        super().__init__(X.shape[1], X.shape[0])
        self.X, self.y, self.l2, self.held = X, y, l2, held
        self.cols = np.ascontiguousarray(X.indices, dtype=np.int64)
        self.vals = np.ascontiguousarray(X.data, dtype=np.float64)
        self._ptr = X.indptr.tolist()
        ptr = self._ptr
        self._rows = [(self.cols[ptr[i]:ptr[i + 1]], self.vals[ptr[i]:ptr[i + 1]])
                      for i in range(self.n_samples)]
        self._y = y.tolist()
        counts = np.bincount(self.cols, minlength=self.dim)
        self.reg = np.where(counts > 0, self.n_samples / np.maximum(counts, 1), 0.0)

    @classmethod
    def synthetic(cls, dim: int, n_samples: int, l2: float, density: float,
                  seed: int) -> SparseLogisticProblem:
        """round(density·dim) Gaussian features per sample at random coordinates; labels from a
        logistic model; a held-out set of n/4 samples from the same model (its own stream)."""
        rng = np.random.default_rng(seed)
        nnz = max(1, round(density * dim))
        cols = np.sort([rng.choice(dim, nnz, replace=False) for _ in range(n_samples)],
                       axis=1).astype(np.int64)
        vals = rng.standard_normal((n_samples, nnz))
        X = scipy.sparse.csr_matrix(
            (vals.ravel(), cols.ravel(), np.arange(0, n_samples * nnz + 1, nnz)),
            shape=(n_samples, dim))
        w_true = rng.standard_normal(dim) * (3.0 / math.sqrt(nnz))
        y = _logistic_labels(rng, X @ w_true)
        held = np.random.default_rng([seed, HELD_OUT])
        m = max(1, n_samples // 4)
        held_cols = np.sort([held.choice(dim, nnz, replace=False) for _ in range(m)], axis=1)
        Xh = scipy.sparse.csr_matrix(
            (held.standard_normal(m * nnz), held_cols.ravel(), np.arange(0, m * nnz + 1, nnz)),
            shape=(m, dim))
        yh = _logistic_labels(held, Xh @ w_true)
        return cls(X, y, l2, (Xh, yh))

    @property
    def sparse(self) -> bool:
        return True

    def support(self, idx: int) -> np.ndarray:
        return self._rows[idx][0]

    @property
    def strong_convexity(self) -> float:
        return self.l2

    @cached_property
    def smoothness(self) -> float:
        top = float(scipy.sparse.linalg.svds(self.X, k=1, return_singular_vectors=False)[0])
        return self.l2 + top * top / (4 * self.n_samples)

    def loss(self, w: np.ndarray, idx: int) -> float:
        cols, x = self._rows[idx]
        wj = w[cols]
        return float(np.logaddexp(0.0, -self._y[idx] * float(x @ wj))
                     + 0.5 * self.l2 * float(self.reg[cols] @ (wj * wj)))

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        cols, x = self._rows[idx]
        wj = w[cols]
        g = x * _logistic_coef(self._y[idx], float(x @ wj))
        g += self.l2 * self.reg[cols] * wj
        return g, cols

    def full_loss(self, w: np.ndarray) -> float:
        margins = self.y * (self.X @ w)
        return float(np.logaddexp(0.0, -margins).mean() + 0.5 * self.l2 * float(w @ w))

    def accuracy(self, w: np.ndarray) -> float | None:
        return _sign_accuracy(self.X, self.y, w)

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        return None if self.held is None else _sign_accuracy(*self.held, w)

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        coef = -self.y * _expit(-self.y * (self.X @ w))
        return self.X.T @ coef / self.n_samples + self.l2 * w

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        p = _expit(self.y * (self.X @ w))
        return self.X.T @ (p * (1 - p) * (self.X @ v)) / self.n_samples + self.l2 * v

    def torch_loss(self, w: Any, idx: int) -> Any:
        import torch
        a, b = self._ptr[idx], self._ptr[idx + 1]
        cols = self.on_device("cols", w, floating=False)[a:b]
        x = self.on_device("vals", w)[a:b]
        reg = self.on_device("reg", w)[cols]
        wj = w[cols]
        margin = float(self._y[idx]) * (x @ wj)
        return torch.nn.functional.softplus(-margin) + 0.5 * self.l2 * (reg @ (wj * wj))


def _axpy(x: np.ndarray, y: np.ndarray, a: float) -> None:
    """y += a·x in place, one pass, no temporary (BLAS daxpy; float64, contiguous)."""
    scipy.linalg.blas.daxpy(x, y, a=a)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class MLPProblem(LocalOptimumProblem):
    """A one-hidden-layer tanh network with softmax cross-entropy and an l2 term:
    f_i(w) = −log softmax(W2 tanh(W1 x_i + b1) + b2)[y_i] + (λ/2)‖w‖².

    Nonconvex (:class:`LocalOptimumProblem`): ``optimum()`` is a local minimum estimate.
    w = (W1, b1, W2, b2) flattened; w_0 is random (seeded), since w = 0 is a symmetric saddle.
    ``data="digits"`` uses the 8×8 digit images scikit-learn ships (1,797 samples, 64 pixels,
    10 classes); synthetic labels come from a random teacher network.
    """

    name = "mlp"

    def __init__(self, X: np.ndarray, y: np.ndarray, classes: int, hidden: int, l2: float,
                 seed: int, held: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        n, d_in = X.shape
        self.X, self.y, self.l2, self.seed = X, y.astype(np.int64), l2, seed
        self.held = held
        self.shape = (d_in, hidden, classes)
        self._cuts = np.cumsum([0, hidden * d_in, hidden, classes * hidden, classes]).tolist()
        super().__init__(self._cuts[-1], n)
        self._y = self.y.tolist()

    @classmethod
    def synthetic(cls, dim: int, n_samples: int, classes: int, hidden: int, l2: float,
                  seed: int) -> MLPProblem:
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n_samples, dim))
        teacher_in = rng.standard_normal((16, dim)) / math.sqrt(dim)
        teacher_out = rng.standard_normal((classes, 16))
        y = np.argmax(np.tanh(X @ teacher_in.T) @ teacher_out.T, axis=1)
        Xh = np.random.default_rng([seed, HELD_OUT]).standard_normal(
            (max(1, n_samples // 4), dim))
        yh = np.argmax(np.tanh(Xh @ teacher_in.T) @ teacher_out.T, axis=1)
        return cls(X, y, classes, hidden, l2, seed, (Xh, yh))

    @classmethod
    def digits(cls, hidden: int, l2: float, seed: int, holdout: float = 0.0) -> MLPProblem:
        from sklearn.datasets import load_digits
        data = load_digits()
        X = np.asarray(data.data, dtype=np.float64)
        X = (X - X.mean(axis=0)) / np.maximum(X.std(axis=0), 1e-12)
        y = np.asarray(data.target)
        train, held = holdout_split(len(X), holdout, seed)
        return cls(X[train], y[train], 10, hidden, l2, seed,
                   (X[held], y[held]) if held.size else None)

    def _unpack(self, w: np.ndarray) -> tuple[np.ndarray, ...]:
        d_in, hidden, classes = self.shape
        c = self._cuts
        return (w[c[0]:c[1]].reshape(hidden, d_in), w[c[1]:c[2]],
                w[c[2]:c[3]].reshape(classes, hidden), w[c[3]:c[4]])

    def initial(self) -> np.ndarray:
        d_in, hidden, _ = self.shape
        rng = np.random.default_rng([self.seed, 1])
        w = np.zeros(self.dim)
        W1, _, W2, _ = self._unpack(w)
        W1[:] = rng.standard_normal(W1.shape) / math.sqrt(d_in)
        W2[:] = rng.standard_normal(W2.shape) / math.sqrt(hidden)
        return w

    def loss(self, w: np.ndarray, idx: int) -> float:
        W1, b1, W2, b2 = self._unpack(w)
        z = W2 @ np.tanh(W1 @ self.X[idx] + b1) + b2
        top = float(z.max())
        return (top + math.log(float(np.exp(z - top).sum())) - float(z[self._y[idx]])
                + 0.5 * self.l2 * float(w @ w))

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        W1, b1, W2, b2 = self._unpack(w)
        x = self.X[idx]
        h = np.tanh(W1 @ x + b1)
        dz = _softmax(W2 @ h + b2)
        dz[self._y[idx]] -= 1.0
        da = (W2.T @ dz) * (1.0 - h * h)
        # Written in place, the data part first and the l2 term added in one pass: two sweeps
        # over the (large) vector and no temporaries, where l2·w + outer(...) would take five.
        g = np.empty_like(w)
        G1, gb1, G2, gb2 = self._unpack(g)
        np.multiply.outer(da, x, out=G1)
        gb1[:] = da
        np.multiply.outer(dz, h, out=G2)
        gb2[:] = dz
        if self.l2:
            _axpy(w, g, a=self.l2)
        return g, None

    def stages(self) -> list[slice] | None:
        """Two stages: the hidden layer (W1, b1) and the output layer (W2, b2)."""
        c = self._cuts
        return [slice(c[0], c[2]), slice(c[2], c[4])]

    def stage_width(self, stage: int) -> int:
        return self.shape[1]  # the hidden activation (stage 0 → 1); the logits stay

    def forward(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
                idx: int) -> tuple[np.ndarray, Any]:
        d_in, hidden, classes = self.shape
        if stage == 0:
            x = self.X[idx]
            h = np.tanh(theta[:hidden * d_in].reshape(hidden, d_in) @ x
                        + theta[hidden * d_in:])
            return h, x
        assert a is not None
        z = theta[:classes * hidden].reshape(classes, hidden) @ a + theta[classes * hidden:]
        return z, a

    def backward(self, stage: int, theta: np.ndarray, cache: Any, up: np.ndarray | None,
                 idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        d_in, hidden, classes = self.shape
        g = np.empty_like(theta)
        out, _ = self.forward(stage, theta, cache if stage else None, idx)  # at θ now
        if stage == 0:  # (up: the gradient with respect to h)
            x, h = cache, out
            da = up * (1.0 - h * h)
            np.multiply.outer(da, x, out=g[:hidden * d_in].reshape(hidden, d_in))
            g[hidden * d_in:] = da
            back = None
        else:
            a, z = cache, out
            dz = _softmax(z)
            dz[self._y[idx]] -= 1.0
            np.multiply.outer(dz, a, out=g[:classes * hidden].reshape(classes, hidden))
            g[classes * hidden:] = dz
            back = theta[:classes * hidden].reshape(classes, hidden).T @ dz
        if self.l2:
            _axpy(theta, g, a=self.l2)
        return g, back

    def _batch(self, w: np.ndarray, X: np.ndarray | None = None,
               ) -> tuple[np.ndarray, np.ndarray]:
        """Hidden activations and logits of every row of ``X`` (default: the training data)."""
        W1, b1, W2, b2 = self._unpack(w)
        h = np.tanh((self.X if X is None else X) @ W1.T + b1)
        return h, h @ W2.T + b2

    def accuracy(self, w: np.ndarray) -> float | None:
        return float(np.mean(self._batch(w)[1].argmax(axis=1) == self.y))

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        if self.held is None:
            return None
        X, y = self.held
        return float(np.mean(self._batch(w, X)[1].argmax(axis=1) == y))

    def full_loss(self, w: np.ndarray) -> float:
        _, z = self._batch(w)
        top = z.max(axis=1)
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        return float((lse - z[np.arange(self.n_samples), self.y]).mean()
                     + 0.5 * self.l2 * float(w @ w))

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        W2 = self._unpack(w)[2]
        h, z = self._batch(w)
        dz = _softmax(z)
        dz[np.arange(self.n_samples), self.y] -= 1.0
        dz /= self.n_samples
        da = (dz @ W2) * (1.0 - h * h)
        g = self.l2 * w
        G1, gb1, G2, gb2 = self._unpack(g)
        G1 += da.T @ self.X
        gb1 += da.sum(axis=0)
        G2 += dz.T @ h
        gb2 += dz.sum(axis=0)
        return g

    def torch_loss(self, w: Any, idx: int) -> Any:
        import torch
        d_in, hidden, classes = self.shape
        c = self._cuts
        W1, b1 = w[c[0]:c[1]].reshape(hidden, d_in), w[c[1]:c[2]]
        W2, b2 = w[c[2]:c[3]].reshape(classes, hidden), w[c[3]:c[4]]
        z = W2 @ torch.tanh(W1 @ self.on_device("X", w)[idx] + b1) + b2
        return torch.logsumexp(z, 0) - z[int(self._y[idx])] + 0.5 * self.l2 * (w @ w)


