"""Simulation against hardware: calibrate (one fitter module per hardware model) and compare.

Both read any run directory (simulated, replayed or real). ``calibrate`` fits the timing
model at the core (:mod:`~simulator.fidelity.durations`, :mod:`~simulator.fidelity.contention`,
read from the runs by :mod:`~simulator.fidelity.runs`) and then each opt-in hardware model
in its own module (convoys, passing, common, rhythm, interference, shared, stores, speeds,
episodes); ``compare`` reports one run against another as records, which
:mod:`~simulator.fidelity.report` prints as tables.
"""

from __future__ import annotations

from simulator.fidelity.calibrate import calibrate, calibrate_counts
from simulator.fidelity.compare import TARGETS, compare_runs, details, targets
from simulator.fidelity.figure import compare_figure
from simulator.fidelity.report import MARKER, calibrated_toml, records_table, targets_table
from simulator.fidelity.runs import load_run, run_workers

__all__ = ["MARKER", "TARGETS", "calibrate", "calibrate_counts", "calibrated_toml",
           "compare_figure", "compare_runs", "details", "load_run", "records_table",
           "run_workers", "targets", "targets_table"]
