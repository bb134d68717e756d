"""Errors a user sees as one line, also after crossing a process or simpy's event loop."""

from __future__ import annotations

import copy
import pickle

from simulator.errors import ScenarioError


def test_a_scenario_error_survives_copies_and_pickling_with_its_field():
    error = ScenarioError("run.threads", 0, "must be >= 1")
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error),
                  type(error)(*error.args)):  # the last: what simpy does in a callback
        assert str(again) == "run.threads = 0: must be >= 1"
        assert (again.field, again.value, again.reason) == ("run.threads", 0, "must be >= 1")
    assert str(error.under("scenario")) == "scenario.run.threads = 0: must be >= 1"
