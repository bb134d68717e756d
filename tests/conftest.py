"""Shared helpers for the test suite, and the machine's share between parallel test workers.

Under pytest-xdist (``pytest -n 2``) the workers run side by side, except a test marked
``alone``: it starts when the other workers' current tests end, and they start nothing until it
ends. The marked tests are those that run real worker processes or probe the CPUs, whose
timings, pinning and losses a neighbour's busy core would change. Two file locks between the
workers do it (``fcntl.flock``): every test holds the machine lock shared, a test marked
``alone`` holds it exclusive; a turnstile taken on the way in keeps a waiting ``alone`` test
from being passed by the others' next tests. Without xdist nothing is locked.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.replay import replay
from simulator.scenario import Scenario, load_scenario
from simulator.trace import Trace

_LOCKS = "ASYNGRAD_TEST_LOCKS"  # the folder of the two lock files, set by the controller
# Golden traces: with ASYNGRAD_GOLDEN=FILE every simulated trace a test builds is hashed,
# array by array, into FILE (JSON lines, appended under a file lock by each xdist worker).
# Two such files, one recorded before a change and one after, are compared by
# tests/goldens.py: a refactor must leave every trace of every test bit-identical.
_GOLDEN = "ASYNGRAD_GOLDEN"


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller makes the lock folder before its workers start (they inherit the
    environment)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ[_LOCKS] = tempfile.mkdtemp(prefix="asyngrad-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and _LOCKS in os.environ:
        shutil.rmtree(os.environ.pop(_LOCKS), ignore_errors=True)


@pytest.fixture(autouse=True)
def _golden_traces(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``ASYNGRAD_GOLDEN`` set, record a hash of every simulated trace the test builds."""
    path = os.environ.get(_GOLDEN)
    if not path:
        yield
        return
    built: list[Trace] = []
    original = Trace.__post_init__

    def record(self: Trace) -> None:
        original(self)
        if self.source == "simulated":
            built.append(self)

    Trace.__post_init__ = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trace.__post_init__ = original  # type: ignore[method-assign]
    lines = [json.dumps({"test": request.node.nodeid, "index": i,
                         "scenario": _digest(t.scenario_toml.encode()),
                         "arrays": {name: _digest(_array_bytes(a))
                                    for name, a in sorted(t.arrays.items())}}) + "\n"
             for i, t in enumerate(built)]
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.writelines(lines)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


def _array_bytes(array: np.ndarray) -> bytes:
    return f"{array.dtype.str}{array.shape}".encode() + np.ascontiguousarray(array).tobytes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of ``item`` under the machine lock: shared, or exclusive for
    a test marked ``alone``."""
    folder = os.environ.get(_LOCKS) if hasattr(item.config, "workerinput") else None
    if folder is None:
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with open(Path(folder) / "turnstile", "a") as turnstile, \
            open(Path(folder) / "machine", "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="session")
def _optimum_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Estimated optima go to a folder of this session, not the user's cache."""
    from simulator.problems import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("optimum-cache"))
    yield
    if before is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = before


def fitted(scenario_: Scenario, device: int = 0) -> SimpleNamespace:
    """A device's timing and hardware models in the flat names calibrate's fit reports use
    (``convoy_join``, ``write_shared``, ...; a model that is off gives its neutral values),
    with ``convoys`` and ``passing`` saying which writes that meet do, ``coupled`` whether
    durations share a common factor and ``interference`` the slowdowns (None: none)."""
    timing, hardware = scenario_.timing_of(device), scenario_.hardware_of(device)
    values = {f.name: getattr(timing, f.name) for f in dataclasses.fields(timing)}
    meeting = hardware.convoys or hardware.passing
    values.update({f"convoy_{name}": getattr(meeting, name, default) for name, default in
                   (("join", 0.0), ("rest", 0.0), ("lost_leader", 0.0), ("lost_joiner", 0.0),
                    ("lost_pairs", 1.0), ("lost_within", 0.0), ("lost_spread", 0.0),
                    ("end_gap", 0.0), ("end_catch_up", 0.0))})
    common, lines, sweep = hardware.common, hardware.shared_lines, hardware.sweeping_reads
    for phase, weight in zip(("read", "grad", "write", "idle"),
                             common.weights if common else (0.0,) * 4, strict=True):
        values[f"{phase}_common"] = weight
    episodes = hardware.episodes
    values.update(common_ns=common.ns if common else 0.0,
                  write_shared=lines.factor if lines else 1.0,
                  write_sweep_lead=sweep.lead if sweep else 0.0,
                  write_sweep_tail=sweep.tail if sweep else 0.0,
                  slow_factor=episodes.factor if episodes else 1.0,
                  convoys=hardware.convoys is not None, passing=hardware.passing is not None,
                  coupled=common is not None and any(common.weights),
                  interference=None if hardware.interference is None
                  else hardware.interference.slowdowns)
    under = hardware.interference
    if under is not None:
        values.update({f.name: getattr(under, f.name) for f in dataclasses.fields(under)})
    return SimpleNamespace(**values)


def scenario(*overrides: str) -> Scenario:
    """The default scenario with ``key=value`` overrides applied."""
    return load_scenario(None, list(overrides))


def two_writers(*extra: str, meet: tuple[str, ...] = ("convoy_join=1.5", "convoy_rest=2.0")
                ) -> Scenario:
    """Thread 0 writes [7000, 11000) alone; thread 1 (slower gradient) starts at 8000. Both
    devices' timings get the ``meet`` and ``extra`` fields."""
    fields = "".join(f", {e}" for e in (*meet, *extra))
    return scenario(*CONSTANT, "run.threads=2", "run.updates=2", "problem.dim=40",
                    "timing.read.mean=1000", "timing.write.mean=4000",
                    "devices=[{name='a', timing={read={dist='constant', mean=1000}, "
                    "grad={dist='constant', mean=6000}, write={dist='constant', mean=4000}"
                    + fields + "}}, {name='b', timing={read={dist='constant', mean=1000}, "
                    "grad={dist='constant', mean=7000}, write={dist='constant', mean=4000}"
                    + fields + "}}]")


def convoy_run(tmp_path: Path, name: str, *overrides: str) -> Path:
    """A simulated two-thread run whose writes meet often (lognormal write 4 µs, gradient
    9 µs), with ``overrides``."""
    from simulator.cli import main

    out = tmp_path / name
    assert main(["simulate", "--out", str(out), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=4000", "--set", "problem.dim=1000",
                 "--set", "timing.write={dist='lognormal', mean=4000, cv=0.1}",
                 "--set", "timing.grad={dist='lognormal', mean=9000, cv=0.3}",
                 "--set", "metrics.exact=false",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return out


def check_meeting_losses(trace: Trace, write_ns: int, lossy: float, leader: float,
                         joiner: float | None = None) -> None:
    """Over a trace's pairs of writes that met (constant writes of ``write_ns``): the share
    of meetings that lose anything is ``lossy`` (±0.07, among pairs that share enough of the
    block that a lossy meeting surely loses a coordinate), and lossy ones lose ``leader``
    (and ``joiner``) of the shared part (±5%)."""
    import pytest

    from simulator.trace import convoy_pairs

    pairs = convoy_pairs(trace)
    assert pairs is not None
    shared = np.clip(1 - pairs[:, 2] / write_ns, 0, 1)
    lost = (pairs[:, 3] > 0) | (pairs[:, 4] > 0)
    some = shared > 0.1
    assert some.sum() > 300
    assert lost[some].mean() == pytest.approx(lossy, abs=0.07)
    assert pairs[lost, 3].sum() / shared[lost].sum() == pytest.approx(leader, rel=0.05)
    if joiner is not None:
        assert pairs[lost, 4].sum() / shared[lost].sum() == pytest.approx(joiner, rel=0.05)


def detail_cells(text: str, metric: str) -> list[str]:
    """The cells (run A, run B, gap, note) of ``metric``'s row in the details table that
    ``compare`` printed in ``text``, cut at the header's column starts."""
    lines = text.splitlines()
    header = lines[lines.index("details:") + 1]
    starts = [header.index(name) for name in ("run A", "run B", "gap", "note")]
    line = next(x for x in lines[lines.index("details:"):] if x.startswith(metric + "  "))
    return [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]


def one_worker_run(where: Path) -> Path:
    """A small simulated run of one thread in ``where`` (nothing between workers to fit)."""
    from simulator.cli import main

    assert main(["simulate", "--out", str(where), "--quiet", "--set", "run.threads=1",
                 "--set", "run.updates=500", "--set", "metrics.exact=false"]) == 0
    return where


def check_fit_choice(run: Path, tmp_path: Path, choice: str, value: str, comment: str) -> None:
    """A calibrate fit chosen by ``--{choice}``: off unless asked for, written as a comment
    of the calibrated scenario when asked on the command line, and refused (with the reason)
    for a one-worker run."""
    from simulator.cli import main
    from simulator.fidelity.calibrate import calibrate

    _, report_off = calibrate(run, pool=True)
    assert report_off[choice]["why"] == f"--{choice} off"
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(run), "--pool", f"--{choice}", value, "--out", str(out),
                 "--quiet"]) == 0
    assert comment in out.read_text()
    _, report_alone = calibrate(one_worker_run(tmp_path / "alone"), **{choice: "on"})
    assert report_alone[choice]["fields"] is None
    assert "two workers" in report_alone[choice]["why"]


CONSTANT = ("timing.read.dist=constant", "timing.grad.dist=constant",
            "timing.write.dist=constant")


def same_every_way(sc: Scenario) -> Trace:
    """Simulate ``sc`` twice, without lookahead and replayed: all four traces bit for bit the
    same (the determinism promise). Returns the first."""
    first, second = simulate(sc), simulate(sc)
    slow = simulate(sc, lookahead=False)
    _, _, replayed = replay(first)
    for other in (second, slow, replayed):
        for name, values in first.arrays.items():  # (NaN: not measured, the same in each)
            assert np.array_equal(values, other.arrays[name],
                                  equal_nan=values.dtype.kind == "f"), name
    return first


def check_hardware_loss(run: Any) -> None:
    """A measure-mode real run's ``hardware_loss`` is consistent with its trace: the distance
    between the rebuilt and the real final vector is the norm of a vector whose largest
    coordinate is the reported max, and its ratio to how far the real vector moved (the
    trace's w_0 to w_T) is the reported relative value."""
    loss, trace = run.hardware_loss, run.trace
    assert loss is not None
    norm, top = loss["rebuilt_vs_real_norm"], loss["rebuilt_vs_real_max"]
    assert top <= norm <= np.sqrt(run.problem.dim) * top * (1 + 1e-12)
    moved = np.linalg.norm(trace["w_final"] - trace["w0"])
    assert moved > 0
    assert loss["relative_to_distance_moved"] == pytest.approx(norm / moved, rel=1e-12)
