"""What every scenario spec shares: the allowed values of its keys, and the checks."""

from __future__ import annotations

import dataclasses
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["DATA_SOURCES", "EVEN_SPLIT_PROTOCOLS", "FILE_PROBLEMS", "FILE_SUFFIXES",
           "LR_SCHEDULES", "MAX_THREADS", "PHASES", "PLACEMENTS", "PROTOCOLS", "REAL_DATA",
           "REAL_SHAPES", "SERVER_RULES", "SLICINGS", "SPLITS", "WRITE_MODES", "check",
           "check_ints", "is_file"]

PROTOCOLS = ("serial", "locked", "lockfree", "roundrobin", "minibatch", "paramserver",
             "staleness_lr", "dcasgd", "admm", "sandblaster", "amp", "local",
             "block_admm")
WRITE_MODES = ("load_store", "atomic_add")
LR_SCHEDULES = ("constant", "inv_sqrt", "inverse")
SPLITS = ("shared", "even")
# Update rules a parameter server applies to each push on arrival (``paramserver.rule``).
SERVER_RULES = ("none", "staleness_lr", "dcasgd")
PLACEMENTS = ("round_robin", "shuffled")
# Protocols whose threads may stop at a fixed quota each (as real workers do).
EVEN_SPLIT_PROTOCOLS = ("serial", "locked", "lockfree", "minibatch", "roundrobin",
                        "staleness_lr", "dcasgd", "admm")
SLICINGS = ("global", "per_core")
PHASES = ("read", "grad", "write", "idle")  # in the order of simulator.timing.READ ... IDLE
# Real data that a package ships, and the problem each serves.
REAL_DATA = {"breast_cancer": "logistic", "digits": "mlp"}
DATA_SOURCES = ("synthetic", *REAL_DATA)
# A data file's suffixes (``simulator.problems.files``), and the problems that train on one.
FILE_SUFFIXES = (".csv", ".npz", ".svm", ".libsvm")
FILE_PROBLEMS = ("quadratic", "logistic", "sparse_logistic", "mlp", "torch")


def is_file(data: str) -> bool:
    """Whether ``problem.data`` names a data file (by its suffix), not a data source."""
    return data.lower().endswith(FILE_SUFFIXES)

# The shape of each real data set, which its resolved ProblemSpec shows: (field, value, what).
REAL_SHAPES = {
    "breast_cancer": (("dim", 30, "features"), ("n_samples", 569, "samples")),
    "digits": (("dim", 64, "pixels"), ("n_samples", 1797, "samples"), ("classes", 10, "classes")),
}
INT64_MAX = 2 ** 63 - 1
# The most virtual threads a run may have: setting a run up takes time and
# memory that grow with the square of the threads (each thread knows its device's others),
# about 4 s and 0.7 GB at this cap.
MAX_THREADS = 4096


def check(ok: bool, name: str, value: Any, reason: str) -> None:
    if not ok:
        raise ScenarioError(name, value, reason)


def check_ints(spec: Any) -> None:
    """Every integer field fits the int64 the engine and the trace store it in."""
    for item in dataclasses.fields(spec):
        value = getattr(spec, item.name)
        if isinstance(value, int) and not isinstance(value, bool):
            check(-INT64_MAX - 1 <= value <= INT64_MAX, item.name, value,
                  "must fit in a 64-bit integer (|value| < 2^63)")


