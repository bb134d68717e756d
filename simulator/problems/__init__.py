"""Optimisation problems shared by the simulator and the real backends.

``base`` holds the interface (:class:`Problem`), ``builtin`` the built-in problems, and
``PROBLEMS`` maps each ``problem.name`` to the function that builds it from a ``ProblemSpec``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from simulator.budget import check_problem
from simulator.errors import ScenarioError
from simulator.problems.base import (
    CACHE_ENV,
    HELD_OUT,
    Gradient,
    LocalOptimumProblem,
    Problem,
    cache_dir,
    holdout_split,
    spec_hash,
)
from simulator.problems.builtin import (
    LogisticProblem,
    MLPProblem,
    QuadraticProblem,
    SparseLogisticProblem,
)
from simulator.problems.files import (
    binary_labels,
    class_labels,
    digest,
    training_split,
)
from simulator.problems.torchmodel import TorchProblem, from_spec
from simulator.scenario.base import is_file

__all__ = ["CACHE_ENV", "HELD_OUT", "PROBLEMS", "Gradient", "LocalOptimumProblem",
           "LogisticProblem", "MLPProblem", "Problem", "QuadraticProblem",
           "SparseLogisticProblem", "TorchProblem", "cache_dir", "holdout_split", "make_problem",
           "recorded_text"]


def _make_quadratic(spec: Any) -> Problem:
    if is_file(spec.data):
        X, y, _ = training_split(spec)
        return QuadraticProblem.from_arrays(X, y.astype(np.float64), spec.l2)
    return QuadraticProblem(spec.dim, spec.n_samples, spec.l2, spec.seed)


def _make_logistic(spec: Any) -> Problem:
    if is_file(spec.data):
        X, y, held = training_split(spec)
        labels, held = binary_labels(y, held, spec)
        return LogisticProblem(X, labels, spec.l2, held)
    if spec.data == "breast_cancer":
        return LogisticProblem.breast_cancer(spec.l2, spec.holdout, spec.seed)
    return LogisticProblem.synthetic(spec.dim, spec.n_samples, spec.l2, spec.seed)


def _make_sparse_logistic(spec: Any) -> Problem:
    if is_file(spec.data):
        X, y, held = training_split(spec, dense=False)
        labels, held = binary_labels(y, held, spec)
        return SparseLogisticProblem(X, labels, spec.l2, held)
    return SparseLogisticProblem.synthetic(spec.dim, spec.n_samples, spec.l2, spec.density,
                                           spec.seed)


def _make_mlp(spec: Any) -> Problem:
    if is_file(spec.data):
        X, y, held = training_split(spec)
        classes, index, held = class_labels(y, held, spec)
        return MLPProblem(X, index, classes, spec.hidden, spec.l2, spec.seed, held)
    if spec.data == "digits":
        return MLPProblem.digits(spec.hidden, spec.l2, spec.seed, spec.holdout)
    return MLPProblem.synthetic(spec.dim, spec.n_samples, spec.classes, spec.hidden, spec.l2,
                                spec.seed)


def _make_tagger(spec: Any) -> Problem:
    from simulator.dense_crf import DenseCRFProblem
    from simulator.lstm_tagger import LSTMTaggerProblem

    cls = LSTMTaggerProblem if spec.name == "lstm_tagger" else DenseCRFProblem
    return cls.synthetic(spec.dim, spec.n_samples, spec.length, spec.classes, spec.hidden,
                         spec.l2, spec.seed)


def _make_torch(spec: Any) -> Problem:
    return from_spec(spec)


PROBLEMS = {"quadratic": _make_quadratic, "logistic": _make_logistic,
            "sparse_logistic": _make_sparse_logistic, "mlp": _make_mlp,
            "lstm_tagger": _make_tagger, "dense_crf": _make_tagger,
            "torch": _make_torch}


def make_problem(spec: Any) -> Problem:
    """Build the problem a ``ProblemSpec`` describes.

    Raises:
        ScenarioError: an unknown problem name, or data that cannot fit in this machine's
            memory (``simulator.budget.check_problem``).
    """
    if spec.name not in PROBLEMS:
        raise ScenarioError("problem.name", spec.name, f"must be one of {', '.join(PROBLEMS)}")
    check_problem(spec)
    problem = PROBLEMS[spec.name](spec)
    if problem.spec_key is None:  # a torch problem hashes its own data and module
        problem.spec_key = spec_hash(spec, digest(spec.data) if is_file(spec.data) else "")
    return problem


def recorded_text(scenario: Any, problem: Problem | None) -> str | None:
    """The scenario a run on a problem built outside the scenario records (TOML), where it is
    not the scenario's own (a ``TorchProblem`` made in Python: ``TorchProblem.recorded``);
    None where the scenario describes the run."""
    if not isinstance(problem, TorchProblem):
        return None
    spec = problem.recorded(scenario.problem)
    if spec is scenario.problem:
        return None
    from simulator.scenario import scenario_to_toml

    return scenario_to_toml(dataclasses.replace(scenario, problem=spec))
