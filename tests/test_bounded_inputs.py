"""Bounded inputs (issue 46 §3): extreme or odd values of any scenario field end in a clean
refusal (one line, exit 2, nothing written) or a valid run, never a traceback, a warning or
a run without end; the run's memory, clock and work are judged before anything is built."""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.budget import (
    CLOCK_LIMIT_NS,
    GRADIENT_LIMIT,
    available_memory,
    max_updates,
    memory_estimate,
    preflight,
    size_text,
)
from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.metrics import diverged_at
from simulator.rundir import FILES
from simulator.scenario import (
    MAX_THREADS,
    REAL_SHAPES,
    Scenario,
    load_scenario,
    scenario_to_dict,
    scenario_to_toml,
)
from simulator.trace import Trace

# Small runs: every mutation not on these fields runs in well under a second.
SMALL = ("run.updates=40", "run.threads=3", "problem.dim=6", "problem.n_samples=40",
         "metrics.curve_points=8")
ODD_VALUES = ("1000000000000", "9223372036854775807", "9223372036854775808", "-1", "-5", "0",
              "1", "3", "0.5", "1e300", "1e-300", "-1e300", "nan", "inf", '"nan"', '"text"',
              "true", "[1, 2]", "{ a = 1 }")


def _fields(value: Any, prefix: str = "") -> list[str]:
    """Every dotted field of the resolved default scenario (a duration both as a whole and
    by its parameters)."""
    if isinstance(value, dict):
        own = [prefix] if prefix and "dist" in value else []
        return own + [f for key, item in value.items()
                      for f in _fields(item, f"{prefix}.{key}" if prefix else key)]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [f for i, item in enumerate(value) for f in _fields(item, f"{prefix}.{i}")]
    return [prefix]


FIELDS = sorted(_fields(scenario_to_dict(Scenario())))


def _cli(*args: str) -> tuple[int, str]:
    """``asyngrad ARGS`` in this process: its exit status and stderr; any warning fails."""
    err = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(args))
    return code, err.getvalue()


def _clean_refusal(code: int, err: str, out: Path) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyngrad: error: "), err
    assert not out.exists()


def _valid_run(out: Path) -> dict[str, Any]:
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    scenario = load_scenario(out / "scenario.toml")  # the resolved scenario loads again
    assert scenario_to_toml(scenario) == (out / "scenario.toml").read_text()
    return dict(json.loads((out / "summary.json").read_text()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=st.sampled_from(ODD_VALUES),
       protocol=st.sampled_from(("lockfree", "serial", "paramserver", "admm", "minibatch")))
def test_any_mutation_is_a_refusal_or_a_valid_run(field, value, protocol):
    """A field of the resolved default set to an extreme or odd value: exit 2 with one line
    and nothing written, or exit 0 with a run directory whose scenario loads again."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        sets = [x for pair in (("--set", s) for s in (*SMALL, f"run.protocol={protocol}",
                                                      f"{field}={value}")) for x in pair]
        code, err = _cli("simulate", "--out", str(out), "--quiet", *sets)
        event("ran" if code == 0 else "refused")  # (pytest --hypothesis-show-statistics)
        if code == 0:
            _valid_run(out)
        else:
            _clean_refusal(code, err, out)


@pytest.mark.parametrize(("setting", "needle"), [
    ("run.updates=1000000000000", "run.updates = 1000000000000: the run needs about"),
    ("problem.dim=1000000000000", "problem.dim = 1000000000000: the run needs about"),
    ("problem.n_samples=9223372036854775807", "problem.n_samples = 9223372036854775807: the "
                                              "run needs about"),
    ("metrics.curve_points=1000000000000", "metrics.curve_points = 1000000000000: the run "
                                           "needs about"),
    ("run.seed=9223372036854775808", "must fit in a 64-bit integer"),
    ("timing.grad.mean=1e300", "timing.grad.mean = 1e+300: one update can take about"),
    ("devices.0.speed=1e-300", "devices.0.speed = 1e-300: one update can take about"),
    ("timing.read_per_thread=1e300", "timing.read_per_thread = 1e+300"),
    ("run.threads=1000000000", "run.threads = 1000000000: must be in [1, 4096]"),
    ("problem.dim=50", "problem.dim = 50: the breast_cancer data has 30 features"),
])
def test_each_reported_input_is_one_line(tmp_path, setting, needle):
    """The fuzz's findings in the issue: one line naming the field and value, exit 2,
    nothing written (the memory ones with the estimate and this machine's memory)."""
    out = tmp_path / "run"
    extra = ["--set", "problem.data=breast_cancer"] if "breast" in needle else []
    code, err = _cli("simulate", "--out", str(out), "--quiet", *extra, "--set", setting)
    _clean_refusal(code, err, out)
    assert needle in err
    if "needs about" in needle:
        assert "this machine has" in err and "available" in err


def test_the_estimate_names_the_field_that_weighs_most():
    """The memory estimate is split by field; a run of the default fits with room to spare."""
    parts = memory_estimate(Scenario())
    assert set(parts) >= {"run.updates", "problem.dim", "run.threads", "metrics.curve_points"}
    assert 0 < sum(parts.values()) < min(available_memory(), 10 ** 9)
    preflight(Scenario())  # the default runs
    big = load_scenario(None, ["run.updates=100000000000"])
    assert max(memory_estimate(big), key=memory_estimate(big).get) == "run.updates"
    assert size_text(1.8e14) == "180 TB" and size_text(512) == "512 B"


def test_the_clock_and_the_work_are_bounded():
    """Simulated time beyond the int64 ns clock, or more than 2^40 gradients: refused."""
    with pytest.raises(ScenarioError, match=r"admm\.local_steps"):
        preflight(load_scenario(None, ["run.protocol=admm", "admm.local_steps=1000000000000"]))
    with pytest.raises(ScenarioError, match=r"devices\.0\.latency"):
        preflight(load_scenario(None, ["run.protocol=paramserver",
                                       f"devices.0.latency={CLOCK_LIMIT_NS}"]))
    long = load_scenario(None, ["timing.grad.mean=1e13", "run.updates=1000000"])
    with pytest.raises(ScenarioError, match=r"run\.updates = 1000000: at up to"):
        preflight(long)
    assert GRADIENT_LIMIT == 2 ** 40 and MAX_THREADS == 4096


@pytest.mark.parametrize("data", sorted(REAL_SHAPES))
def test_real_data_shows_its_own_shape(data):
    """problem.data fixes dim and n_samples (and the digits' classes): the resolved scenario
    shows the data's values, which match the data loaded, and loads again."""
    name = "logistic" if data == "breast_cancer" else "mlp"
    scenario = load_scenario(None, [f"problem.name={name}", f"problem.data={data}",
                                    "problem.hidden=4"])
    for field, value, _ in REAL_SHAPES[data]:
        assert getattr(scenario.problem, field) == value
    from simulator.problems import make_problem
    problem = make_problem(scenario.problem)
    assert problem.n_samples == scenario.problem.n_samples
    if data == "breast_cancer":
        assert problem.dim == scenario.problem.dim
    else:
        assert problem.shape == (scenario.problem.dim, 4, scenario.problem.classes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.toml"
        path.write_text(scenario_to_toml(scenario))
        assert load_scenario(path) == scenario
    with pytest.raises(ScenarioError, match="n_samples = 100: the"):
        load_scenario(None, [f"problem.name={name}", f"problem.data={data}",
                             "problem.n_samples=100"])


def test_a_diverging_run_says_where(tmp_path, capsys):
    """run.lr = 1e300: a run directory whose summary and printed line say where it
    diverged, no floating-point warning; a run that stays finite has diverged_at None."""
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["simulate", "--out", str(out), *(x for s in SMALL for x in ("--set", s)),
                     "--set", "run.lr=1e300"]) == 0
    summary = _valid_run(out)
    t = summary["diverged_at"]
    assert isinstance(t, int) and 1 <= t <= 40
    assert f"diverged at update {t}" in capsys.readouterr().out
    trace = Trace.load(out / "trace.npz")
    finite = np.isfinite(trace["s_norm"]) | ~trace["measured"]
    assert finite[trace["step"] < t].all() and not finite[trace["step"] == t].all()
    calm = tmp_path / "calm"
    assert main(["simulate", "--out", str(calm), "--quiet",
                 *(x for s in SMALL for x in ("--set", s))]) == 0
    assert _valid_run(calm)["diverged_at"] is None
    assert diverged_at(Trace.load(calm / "trace.npz")) is None


@pytest.mark.parametrize("args", [["--seeds", "-5"], ["--seeds", "0"],
                                  ["--seeds", "2", "--jobs", "0"],
                                  ["--seeds", "2", "--jobs", "-1"],
                                  ["--seeds", "1000000000"],
                                  ["--seeds", "2", "--set", "run.updates=1000000000000"]])
def test_sweep_bad_counts_write_nothing(tmp_path, args):
    """--seeds and --jobs below 1, too many cells or a cell that cannot run: one line,
    exit 2, no DIR."""
    out = tmp_path / "sweep"
    code, err = _cli("sweep", "--out", str(out), "--quiet", *args)
    _clean_refusal(code, err, out)


@pytest.mark.parametrize("command", ["check", "tausweep"])
def test_max_updates_beyond_this_machine_is_named(tmp_path, command):
    """check and tausweep refuse a --max-updates no run here can hold, naming the flag."""
    out = tmp_path / command
    code, err = _cli(command, "--eps", "0.05", "--seeds", "2", "--max-updates",
                     str(10 ** 12), "--out", str(out))
    _clean_refusal(code, err, out)
    assert "--max-updates = 1000000000000" in err


def _theorem(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["theorem", *args])
    return code, out.getvalue(), err.getvalue()


def test_theorem_refuses_counts_no_run_can_make():
    """t (10) of 10^21: one line naming γ (9) and t, exit 2; --json carries the verdict;
    a count a run can make says so."""
    base = ["--c", "0.1", "--q", "2", "--tau", "1e-4", "--eps", "1e-2", "--a0", "4"]
    code, out, err = _theorem(*base, "--kappa", "3e8")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "t (10) = " in err and "γ (9) = " in err and "more than any run" in err
    code, out, err = _theorem(*base, "--kappa", "3e8", "--json")
    data = json.loads(out)
    assert code == 2 and not data["runnable"] and data["verdict"] in err
    assert data["updates"] > GRADIENT_LIMIT
    code, out, err = _theorem(*base, "--kappa", "3")
    assert code == 0 and "t (10) = 2,005,384 updates: a run can make them" in out
    assert max_updates() <= GRADIENT_LIMIT


def test_hogwild_labels_each_factor_with_its_equation():
    """The step size's lag factor has 4τ² (4.1), the count's 6τ² (4.2): each printed with
    its equation; an unreachable k names γ (4.1)."""
    from theory.hogwild import HogwildConstants, lag_factor

    args = ["--bound", "hogwild", "--c", "0.01", "--L", "0.02", "--M", "2.2", "--omega", "2",
            "--delta", "0.024", "--rho", "0.04", "--d0", "9.9", "--eps", "0.05"]
    code, out, _ = _theorem(*args, "--tau", "2")
    k = HogwildConstants(c=0.01, L=0.02, M=2.2, omega=2, delta=0.024, rho=0.04, tau=2, d0=9.9)
    step, count = lag_factor(k, 4.0), lag_factor(k, 6.0)
    assert code == 0 and step < count
    assert f"lag factor of γ (4.1), 1 + 6ρτ + 4τ²Ω√Δ   {step:.6g}" in out
    assert f"lag factor of k (4.2), 1 + 6τρ + 6τ²Ω√Δ   {count:.6g}" in out
    code, out, err = _theorem(*args, "--tau", "1e9")
    assert code == 2 and "k (4.2) = " in err and "γ (4.1) = " in err
    assert math.isfinite(step)


def test_a_threads_seed_is_its_spawned_child():
    """thread_seed(seed, t) is SeedSequence(seed).spawn(k)[t] (same streams, set up in time
    linear in the threads)."""
    from simulator.timing import thread_seed, thread_seeds

    for seed in (0, 7, 2 ** 63 - 1):
        spawned = np.random.SeedSequence(seed).spawn(5)
        for t, (child, own) in enumerate(zip(spawned, thread_seeds(seed, 5), strict=True)):
            assert (child.generate_state(8) == own.generate_state(8)).all()
            assert (thread_seed(seed, t).generate_state(8) == child.generate_state(8)).all()
