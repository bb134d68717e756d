"""The run directory's writers."""

import json
import math

import numpy as np
import pytest

from simulator.rundir import write_json


def _refuse(constant: str) -> None:
    raise ValueError(constant)


def test_json_files_are_strict_where_a_run_diverged(tmp_path):
    """NaN and ±inf anywhere (a diverged validation's suboptimality) are written null, so a
    strict reader takes the file; finite values, numpy floats included, are kept."""
    value = {"final_mean": math.nan, "rows": [1.5, (math.inf, -math.inf)],
             "nested": {"x": np.float64("nan"), "y": np.float64(2.25)}, "n": 3, "s": "NaN"}
    write_json(tmp_path / "x.json", value)
    read = json.loads((tmp_path / "x.json").read_text(), parse_constant=_refuse)
    assert read == {"final_mean": None, "rows": [1.5, [None, None]],
                    "nested": {"x": None, "y": 2.25}, "n": 3, "s": "NaN"}


def test_json_refuses_what_it_cannot_write(tmp_path):
    """A value JSON has no form for is an error, not a file with something else in it."""
    with pytest.raises(TypeError):
        write_json(tmp_path / "x.json", {"a": object()})
