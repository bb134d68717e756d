"""Every example scenario shipped in scenarios/ loads and runs."""

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.scenario import load_scenario

EXAMPLES = sorted((Path(__file__).parent.parent / "scenarios").glob("*.toml"))


def test_examples_exist():
    """The README's tour points at these files."""
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path, tmp_path):
    """Each example is valid and runs end to end (shortened to 300 updates)."""
    scenario = load_scenario(path)
    assert scenario.name == path.stem.replace("_", "-")
    assert main(["simulate", str(path), "--out", str(tmp_path / "run"), "--quiet",
                 "--set", "run.updates=300"]) == 0
