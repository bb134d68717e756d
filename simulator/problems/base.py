"""The problem interface every backend trains: a finite sum f(w) = (1/n) Σ_i f_i(w).

Every problem owns its data (generated from ``spec.seed``, shipped by a package, or the user's),
exposes per-sample losses and gradients, the full objective, its optimum (w*, f*) and, where
known, its strong-convexity constant c and smoothness q. Each problem also writes the same math
in torch (``torch_loss``); the test suite checks that the two agree.

Gradients are ``(values, support)``: ``support`` is ``None`` for a dense gradient (``values`` is
the whole vector) or the sorted coordinates it touches (``values`` aligned with them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from abc import ABC, abstractmethod
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg.blas
import scipy.optimize
import scipy.sparse
import scipy.sparse.linalg

__all__ = ["CACHE_ENV", "HELD_OUT", "Gradient", "LocalOptimumProblem", "Problem", "cache_dir",
           "holdout_split", "spec_hash"]

Gradient = tuple[np.ndarray, np.ndarray | None]

HELD_OUT = 0x4E1D  # the held-out samples' random stream, apart from the training ones

CACHE_ENV = "ASYNGRAD_CACHE_DIR"  # where estimated optima are kept (tests point it elsewhere)
# Part of every cached optimum's key: bump it when a solver or an objective changes, so
# optima estimated by older code are recomputed.
OPTIMUM_VERSION = 1


def cache_dir() -> Path:
    """``$ASYNGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyngrad-lab``, else
    ``~/.cache/asyngrad-lab``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "asyngrad-lab"


def spec_hash(spec: Any, data: str = "") -> str:
    """A hash of the problem spec, the solver code's version and the numeric libraries' (and
    ``data``: a digest of a data file's bytes, which its path alone does not fix)."""
    text = json.dumps({"spec": dataclasses.asdict(spec), "version": OPTIMUM_VERSION,
                       "numpy": np.__version__, "scipy": scipy.__version__, "data": data},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class Problem(ABC):
    """A finite-sum objective f(w) = (1/n) Σ_i f_i(w) over w ∈ R^dim."""

    name: str = ""
    convex: bool = True
    caches_optimum = False  # slow estimates are kept on disk (``cache_dir``) by spec
    # Set by ``make_problem``: a hash of the spec the problem was built from (None: built
    # otherwise, never cached).
    spec_key: str | None = None

    def __init__(self, dim: int, n_samples: int) -> None:
        self.dim, self.n_samples = dim, n_samples

    @property
    def sparse(self) -> bool:
        """Whether per-sample gradients touch only a few coordinates."""
        return False

    def initial(self) -> np.ndarray:
        """w_0, where every run starts: zeros, unless the problem needs symmetry broken."""
        return np.zeros(self.dim)

    def support(self, idx: int) -> np.ndarray | None:
        """Coordinates that sample ``idx`` reads and writes; ``None`` for all of them."""
        return None

    @abstractmethod
    def loss(self, w: np.ndarray, idx: int) -> float:
        """f_idx(w)."""

    @abstractmethod
    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        """∇f_idx(w) as ``(values, support)``; ``values`` is a new array."""

    @abstractmethod
    def full_loss(self, w: np.ndarray) -> float:
        """f(w) = (1/n) Σ_i f_i(w)."""

    @abstractmethod
    def full_grad(self, w: np.ndarray) -> np.ndarray:
        """∇f(w)."""

    def fingerprint(self) -> str:
        """A hash of what the problem trains on (data, w_0) where another process could build
        it differently from the same spec ("": built from the spec alone, deterministically).
        Real workers compare theirs with the parent's before they start."""
        return ""

    def full_loss_and_grad(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        """(f(w), ∇f(w)); a problem that gets both from one pass over its data overrides it."""
        return self.full_loss(w), self.full_grad(w)

    @abstractmethod
    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²f(w) v."""

    @abstractmethod
    def torch_loss(self, w: Any, idx: int) -> Any:
        """f_idx(w) written in torch, for autograd (``w`` a torch tensor, on any device)."""

    def on_device(self, name: str, w: Any, floating: bool = True) -> Any:
        """The data array ``self.<name>`` as a tensor on ``w``'s device (in ``w``'s dtype when
        ``floating``), copied there once and cached: the torch losses index these rows, so
        a GPU worker never copies data from the host inside its loop."""
        import torch

        cache: dict[tuple[str, str, Any], Any] = self.__dict__.setdefault("_device_data", {})
        key = (name, str(w.device), w.dtype if floating else None)
        if key not in cache:
            cache[key] = torch.as_tensor(np.ascontiguousarray(getattr(self, name)),
                                         device=w.device, dtype=w.dtype if floating else None)
        return cache[key]

    @property
    def strong_convexity(self) -> float | None:
        """c with f c-strongly convex, or ``None`` where unknown or nonconvex."""
        return None

    @property
    def smoothness(self) -> float | None:
        """q with ∇f q-Lipschitz, or ``None`` where unknown."""
        return None

    @property
    def sample_strong_convexity(self) -> float | None:
        """λ with every per-sample loss f_i λ-strongly convex (an l2 term in each), or
        ``None`` where some f_i is not (the delayed-SGD bound of Langford et al. 2009, Theorem
        2, needs it)."""
        return None

    def stages(self) -> list[slice] | None:
        """A layered network's stages, in forward order, each as the slice of w holding its
        parameters (model-parallel protocols: ``amp``); ``None`` where the problem is not one.
        A problem that has stages also has ``stage_width``, ``forward`` and ``backward``."""
        return None

    def stage_width(self, stage: int) -> int:
        """Coordinates of the activation ``stage`` passes forward (and of the gradient with
        respect to it passed back)."""
        raise NotImplementedError

    def forward(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
                idx: int) -> tuple[np.ndarray, Any]:
        """Stage ``stage``'s forward pass of sample ``idx`` with its parameters ``theta`` from
        the previous stage's activation ``a`` (None for the first stage, which reads the
        sample): its activation, and its cache, what its backward pass recomputes the
        forward from (the stage's input)."""
        raise NotImplementedError

    def backward(self, stage: int, theta: np.ndarray, cache: Any, up: np.ndarray | None,
                 idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Stage ``stage``'s backward pass of sample ``idx``: its forward recomputed from the
        ``cache`` at ``theta``, its parameters now, and differentiated, from the gradient
        ``up`` of the loss with respect to its activation (None for the last stage, which
        takes it from the loss): the gradient of f_idx with respect to ``theta`` (its l2
        term included) and with respect to the stage's input activation (None for the first
        stage). A stage whose parameters changed since its forward differentiates them as
        they are now, activations included: no weight stashing, one rule for every problem
        (autograd recomputes a torch module's stage the same way). With ``theta`` the
        forward's and every stage's ``up`` its backward's, the stages' gradients together
        are ``grad``."""
        raise NotImplementedError

    def local_head(self, stage: int) -> np.ndarray:
        """The initial parameters of the auxiliary head that gives a stage before the last
        its own local loss (``local``: layer-wise local parallelism): the last stage's shape
        (the stage's activation goes through the head as it would through the last stage;
        two stages), at zero: a head of its own, not the last stage (a copy of it would get
        the last stage's own updates, and the local loss would be the loss)."""
        stages = self.stages()
        assert stages is not None and stage == len(stages) - 2
        return np.zeros(stages[-1].stop - stages[-1].start)

    def local_backward(self, stage: int, theta: np.ndarray, head: np.ndarray, cache: Any,
                       out: np.ndarray, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """The gradients of stage ``stage``'s local loss of sample ``idx``, f_idx with its
        ``head`` in place of the last stage on its forward's activation ``out`` (and its
        ``cache``), with respect to its parameters ``theta`` and to the head's (each with
        its l2 term): backpropagation truncated at the stage."""
        _, top = self.forward(stage + 1, head, out, idx)
        g_head, back = self.backward(stage + 1, head, top, None, idx)
        g, _ = self.backward(stage, theta, cache, back, idx)
        return g, g_head

    def dense_grad(self, w: np.ndarray, idx: int) -> np.ndarray:
        """∇f_idx(w) as a full vector, whatever the support."""
        values, support = self.grad(w, idx)
        if support is None:
            return values
        out = np.zeros(self.dim)
        out[support] = values
        return out

    @cached_property
    def _optimum(self) -> tuple[np.ndarray, float]:
        cached = self.caches_optimum and self.spec_key is not None
        w = self._cached_solve() if cached else self._solve()
        w.setflags(write=False)
        return w, self.full_loss(w)

    def optimum(self) -> tuple[np.ndarray, float]:
        """(w*, f*), computed once (closed form, or trust-region Newton-CG to ‖∇f‖ ~1e-12;
        problems that estimate it slowly keep w* in ``cache_dir()``, keyed by their spec)."""
        return self._optimum

    def _cached_solve(self) -> np.ndarray:
        """w* from the cache file of this problem's spec, or solved and written there
        atomically (a missing, unreadable or malformed file is solved again; an unwritable
        cache directory only costs the next run the same wait)."""
        path = cache_dir() / f"optimum-{self.name}-{self.spec_key}.npy"
        try:
            w = np.load(path, allow_pickle=False)
            if w.shape == (self.dim,) and w.dtype == np.float64 and np.isfinite(w).all():
                return w
        except (OSError, ValueError, EOFError):
            pass
        w = self._solve()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp",
                                             delete=False) as handle:
                np.save(handle, w, allow_pickle=False)
            os.replace(handle.name, path)
        except OSError:
            pass
        return w

    def _solve(self) -> np.ndarray:
        result = scipy.optimize.minimize(
            self.full_loss, np.zeros(self.dim), jac=self.full_grad, hessp=self.hessp,
            method="trust-ncg", options={"gtol": 1e-13, "maxiter": 200})
        w = np.asarray(result.x, dtype=np.float64)
        # Trust regions judge steps by f, which cannot resolve changes below ~1e-16·f; finish
        # with Newton steps that look only at the gradient (quadratic convergence near w*).
        for _ in range(4):
            g = self.full_grad(w)
            if np.linalg.norm(g) < 1e-13:
                break
            hessian = scipy.sparse.linalg.LinearOperator(
                (self.dim, self.dim), matvec=lambda v, w=w: self.hessp(w, v), dtype=np.float64)
            step, _ = scipy.sparse.linalg.cg(hessian, -g, rtol=1e-14, atol=0.0,
                                             maxiter=10 * self.dim)
            w = w + step
        return w

    def accuracy(self, w: np.ndarray) -> float | None:
        """Training accuracy at ``w`` for classification problems (None otherwise)."""
        return None

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        """Accuracy on held-out data from the same distribution, where the problem has some."""
        return None

    def describe(self) -> dict[str, Any]:
        """Plain facts for summaries."""
        return {"name": self.name, "dim": self.dim, "n_samples": self.n_samples,
                "sparse": self.sparse, "convex": self.convex,
                "strong_convexity": self.strong_convexity, "smoothness": self.smoothness}



def holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) row indices, both sorted: ``round(fraction·n)`` rows held out by a
    permutation from the held-out stream of ``seed`` (none for fraction 0)."""
    count = round(fraction * n)
    if count == 0:
        return np.arange(n), np.empty(0, dtype=np.int64)
    chosen = np.random.default_rng([seed, HELD_OUT]).permutation(n)[:count]
    mask = np.zeros(n, dtype=bool)
    mask[chosen] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)




class LocalOptimumProblem(Problem):
    """A nonconvex problem: no strong-convexity constant; ∇²f(w)v by a central difference of
    ∇f; ``optimum()`` a *local* minimum estimate, L-BFGS from the seeded w_0 for at most
    ``SOLVER_ITERATIONS`` steps (suboptimality is measured against it and can be negative)."""

    convex = False
    SOLVER_ITERATIONS = 300

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²f(w)v by a central difference of ∇f (step scaled to w and v)."""
        norm = float(np.linalg.norm(v))
        if norm == 0:
            return np.zeros(self.dim)
        h = 1e-5 * (1.0 + float(np.linalg.norm(w))) / norm
        return (self.full_grad(w + h * v) - self.full_grad(w - h * v)) / (2 * h)

    caches_optimum = True

    def _solve(self) -> np.ndarray:
        """L-BFGS from w_0, with a progress bar on a terminal's stderr (full-batch gradients
        of a large model take minutes)."""
        from tqdm import tqdm

        with tqdm(total=self.SOLVER_ITERATIONS, disable=not sys.stderr.isatty(), leave=False,
                  desc=f"estimating the optimum of {self.name} (L-BFGS)",
                  unit="it") as bar:
            result = scipy.optimize.minimize(self.full_loss_and_grad, self.initial(),
                                             jac=True, method="L-BFGS-B",
                                             callback=lambda _: bar.update(1),
                                             options={"gtol": 1e-10, "ftol": 1e-15,
                                                      "maxiter": self.SOLVER_ITERATIONS})
        return np.asarray(result.x, dtype=np.float64)


