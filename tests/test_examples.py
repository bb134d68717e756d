"""Every example scenario shipped in scenarios/ loads and runs."""

import re
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.scenario import load_scenario

EXAMPLES = sorted((Path(__file__).parent.parent / "scenarios").glob("*.toml"))


def test_the_readme_names_every_example():
    """The README's tour names each example scenario, and each it names exists."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    tour = readme.split("Example scenarios in `scenarios/`:", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`(\w+\.toml)`", tour)) == {path.name for path in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path, tmp_path):
    """Each example is valid and runs end to end (shortened to 300 updates)."""
    scenario = load_scenario(path)
    assert scenario.name == path.stem.replace("_", "-")
    assert main(["simulate", str(path), "--out", str(tmp_path / "run"), "--quiet",
                 "--set", "run.updates=300"]) == 0
