"""Estimators of Theorem 1's constants from a problem and from simulated or real traces.

* c and q (conditions 4, 5): closed form where the problem knows them; otherwise the extreme
  eigenvalues of the Hessian at a point, by scipy's Lanczos solver (``eigsh``) on Hessian-vector
  products. A negative smallest eigenvalue means f is not convex there: condition (4) fails.
* a_0 = ‖w_0 − w*‖² from the problem's optimum.
* κ² (6) and τ (7) from the serialized view of runs (DESIGN §4): κ² estimates E‖s_t‖² and τ
  estimates −E⟨δ_t, w_{t−1} − w*⟩, each with a one-sided 95% upper confidence bound over the
  measured updates (the theorem needs upper bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg
import scipy.stats

from simulator.errors import AsyngradError
from simulator.problems import Problem
from simulator.trace import Trace

__all__ = ["Curvature", "Estimate", "curvature", "hessian_extremes", "initial_distance",
           "serialized_constants"]


@dataclass(frozen=True)
class Curvature:
    """c and q with how they were obtained; ``convex`` is False when an eigenvalue is < 0
    (closed form: c < 0; Hessian eigenvalues: unless the smallest is > 0)."""

    c: float
    q: float
    method: str
    convex: bool


@dataclass(frozen=True)
class Estimate:
    """A mean over n measured updates and its one-sided 95% upper confidence bound; for
    windowed estimates, the window (of ``windows``) with the largest upper bound."""

    mean: float
    upper: float
    n: int
    window: int = 0
    windows: int = 1


def hessian_extremes(problem: Problem, w: np.ndarray) -> tuple[float, float]:
    """(λ_min, λ_max) of ∇²f(w), from Hessian-vector products only.

    Lanczos (``scipy.sparse.linalg.eigsh``) for d > 2; the explicit Hessian for d <= 2.
    """
    dim = problem.dim
    if dim <= 2:
        hessian = np.column_stack([problem.hessp(w, e) for e in np.eye(dim)])
        eig = np.linalg.eigvalsh((hessian + hessian.T) / 2)
        return float(eig[0]), float(eig[-1])
    operator = scipy.sparse.linalg.LinearOperator(
        (dim, dim), matvec=lambda v: problem.hessp(w, np.asarray(v).ravel()), dtype=np.float64)
    start = np.ones(dim) / math.sqrt(dim)
    top = scipy.sparse.linalg.eigsh(operator, k=1, which="LA", v0=start, tol=1e-12,
                                    return_eigenvectors=False)
    bottom = scipy.sparse.linalg.eigsh(operator, k=1, which="SA", v0=start, tol=1e-12,
                                       return_eigenvectors=False)
    return float(bottom[0]), float(top[0])


def curvature(problem: Problem, at: np.ndarray | None = None) -> Curvature:
    """c and q: the problem's closed form where it has one, else Hessian eigenvalues at ``at``
    (default: w*). A problem that is not convex is reported as such (``convex`` False), with
    the Hessian's extreme eigenvalues at ``at`` (default: w_0) as evidence."""
    if not problem.convex:
        low, high = hessian_extremes(problem, problem.initial() if at is None else at)
        return Curvature(low, high, "nonconvex problem; Hessian eigenvalues at "
                         + ("w_0" if at is None else "the given point"), False)
    if problem.strong_convexity is not None and problem.smoothness is not None:
        c = problem.strong_convexity
        return Curvature(c, problem.smoothness, "closed form", c >= 0)
    point = problem.optimum()[0] if at is None else at
    low, high = hessian_extremes(problem, point)
    return Curvature(low, high, "Hessian eigenvalues (Lanczos) at "
                     + ("w*" if at is None else "the given point"), low > 0)


def initial_distance(problem: Problem, w0: np.ndarray) -> float:
    """a_0 = ‖w_0 − w*‖²."""
    diff = np.asarray(w0, dtype=np.float64) - problem.optimum()[0]
    return float(diff @ diff)


def _estimate(values: np.ndarray) -> Estimate:
    n = int(values.size)
    if n < 2:
        raise AsyngradError(f"theory: {n} measured updates in a window; at least 2 are needed "
                            "(more updates, each measured: run.updates, metrics.exact)")
    mean = float(values.mean())
    spread = float(values.std(ddof=1)) / math.sqrt(n)
    return Estimate(mean, mean + float(scipy.stats.t.ppf(0.95, n - 1)) * spread, n)


def _worst_window(per_trace: list[np.ndarray], windows: int) -> Estimate:
    """Split each trace's values into ``windows`` consecutive parts, pool part i across traces,
    and keep the part with the largest upper bound: the conditions must hold at every t."""
    parts = [np.concatenate([np.array_split(v, windows)[i] for v in per_trace])
             for i in range(windows)]
    estimates = [_estimate(part) for part in parts]
    worst = max(range(windows), key=lambda i: estimates[i].upper)
    return Estimate(estimates[worst].mean, estimates[worst].upper, estimates[worst].n, worst,
                    windows)


def serialized_constants(traces: Sequence[Trace], windows: int = 10,
                         ) -> tuple[Estimate, Estimate]:
    """(κ², τ) from the measured updates of ``traces``.

    κ² estimates E‖s_t‖² (6) and τ estimates −E⟨δ_t, w_{t−1} − w*⟩ (7). Both must hold at every
    t, so each run is cut into ``windows`` consecutive windows, windows are pooled across runs,
    and the window with the largest upper bound is reported. τ is floored at 0 (a negative value
    means the errors pointed towards w* on average, which the condition allows).

    Raises:
        AsyngradError: fewer than two measured updates in a window.
    """
    measured = [t["measured"] for t in traces]
    squares = [t["s_norm"][m] ** 2 for t, m in zip(traces, measured, strict=True)]
    harm = [-t["delta_dot"][m] for t, m in zip(traces, measured, strict=True)]
    kappa2, tau = _worst_window(squares, windows), _worst_window(harm, windows)
    return kappa2, Estimate(max(tau.mean, 0.0), max(tau.upper, 0.0), tau.n, tau.window,
                            tau.windows)
