"""Scenario files, overrides and validation."""

import tomllib

import pytest

from simulator.distributions import Duration
from simulator.errors import ScenarioError
from simulator.scenario import (
    Scenario,
    load_scenario,
    scenario_from_dict,
    scenario_to_dict,
    scenario_to_toml,
)


def test_default_scenario_is_the_documented_one():
    """The embedded default: dense logistic, 8 lock-free threads, load_store writes."""
    s = Scenario()
    assert (s.problem.name, s.run.protocol, s.run.threads, s.run.write_mode) == (
        "logistic", "lockfree", 8, "load_store")


def test_toml_round_trip_is_exact():
    """Writing a scenario as TOML and reading it back gives an equal scenario."""
    s = load_scenario(None, ["run.threads=3", "timing.read={dist='uniform', low=1, high=9}",
                             "devices=[{name='a', cores=2}, {name='b', speed=0.5, bus=1, "
                             "timing={grad={dist='exponential', mean=50}}}]"])
    text = scenario_to_toml(s)
    assert scenario_from_dict(tomllib.loads(text)) == s
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_file_values_merge_over_defaults(tmp_path):
    """A file that sets one field keeps every other default; overrides apply on top."""
    path = tmp_path / "s.toml"
    path.write_text('name = "mine"\n[run]\nthreads = 2\n[timing.read]\nmean = 500.0\n')
    s = load_scenario(path, ["run.lr=0.5"])
    assert (s.name, s.run.threads, s.run.lr, s.run.updates) == ("mine", 2, 0.5, 5000)
    assert s.timing.read == Duration("lognormal", 500.0, 0.3)


def test_override_values_parse_as_toml_or_bare_strings():
    """--set values are TOML values; bare words are strings."""
    s = load_scenario(None, ["run.protocol=locked", "metrics.exact=false", "run.lr=1e-3"])
    assert (s.run.protocol, s.metrics.exact, s.run.lr) == ("locked", False, 1e-3)


def test_device_overrides_by_index():
    """devices.N.field addresses one device of the list."""
    s = load_scenario(None, ["devices.0.cores=2"])
    assert s.devices[0].cores == 2


@pytest.mark.parametrize(("override", "field"), [
    ("run.threads=-1", "run.threads"),
    ("run.threads=0", "run.threads"),
    ("run.blocks=0", "run.blocks"),
    ("run.lr=0", "run.lr"),
    ("run.lr=-0.1", "run.lr"),
    ("run.protocol=magic", "run.protocol"),
    ("run.write_mode=cas", "run.write_mode"),
    ("run.typo=1", "run.typo"),
    ("run.threads=2.5", "run.threads"),
    ("run.threads=true", "run.threads"),
    ("problem.name=svm", "problem.name"),
    ("problem.density=0", "problem.density"),
    ("problem.data=mnist", "problem.data"),
    ("timing.read.dist=weibull", "timing.read.dist"),
    ("timing.grad.mean=-5", "timing.grad.mean"),
    ("devices.0.speed=0", "devices.0.speed"),
    ("devices.0.cores=-1", "devices.0.cores"),
    ("devices.4.cores=1", "devices.4"),
    ("metrics.every=0", "metrics.every"),
    ("run=3", "run"),
])
def test_bad_values_name_field_and_value(override, field):
    """Each bad value raises one error whose message starts with its dotted field."""
    with pytest.raises(ScenarioError) as err:
        s = load_scenario(None, [override])
        from simulator.problems import make_problem
        make_problem(s.problem)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field} = ")


def test_unreadable_files_are_scenario_errors(tmp_path):
    """A missing file or invalid TOML is reported as a ScenarioError, not a traceback."""
    with pytest.raises(ScenarioError, match="scenario"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nthreads=")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(bad)
    binary = tmp_path / "trace.npz"  # (replay --schedule takes a scenario: a trace given)
    binary.write_bytes(b"PK\x03\x04\xb7\xff\xfe")
    with pytest.raises(ScenarioError, match="is not UTF-8 text"):
        load_scenario(binary)


def test_scenarios_are_frozen():
    """Scenarios cannot be changed after creation."""
    s = Scenario()
    with pytest.raises(AttributeError):
        s.run.threads = 3  # type: ignore[misc]
