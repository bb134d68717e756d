"""Faults end cleanly, whenever they strike (issue 46): a worker killed, or the parent sent
SIGINT, SIGTERM or SIGKILL, at each stage of a real run (spawned, ready, probing, running,
writing). Each run is the ``asyngrad real`` command, paused at the stage by the fault tests'
hold (``ASYNGRAD_HOLD``, simulator/rundir.py ``hold``); every case must end within seconds,
leave no process of the run and nothing it made in /dev/shm, and leave a run directory that
loads, or none (and no staging directory). Plus the staging directories a killed ``simulate``
left, which the next run removes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator.rundir import HOLD, publish
from simulator.trace import Trace

needs_proc = pytest.mark.skipif(not Path("/proc").is_dir() or not Path("/dev/shm").is_dir(),
                                reason="needs /proc and /dev/shm")
# Enough work that the run is still going when the fault strikes (about 10 µs per update).
RUN = ("--set", "problem.dim=200", "--set", "problem.n_samples=200", "--set",
       "run.updates=200000")
HANG_GUARD_S = 30.0


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _mapped(pids: set[int]) -> set[str]:
    """The /dev/shm entries the processes have mapped (named semaphores, shared memory):
    what the run made there, told apart from what neighbouring tests make."""
    names = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        names.update(line.split("/dev/shm/", 1)[1].removesuffix(" (deleted)")
                     for line in maps.splitlines() if "/dev/shm/" in line)
    return names


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (workers, probe sides, resource
    tracker)."""
    try:
        return [int(p) for p in
                Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _within(seconds: float, ok) -> bool:
    """Whether ``ok()`` came true within ``seconds`` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _strike(tmp_path: Path, command: list[str], stage: str, fault: str
            ) -> tuple[int, float, Path, str]:
    """Run ``asyngrad COMMAND --out OUT``, held at ``stage``; there strike with ``fault``
    (``worker``: SIGKILL worker 0; SIGINT, SIGTERM, SIGKILL: that signal to the parent) and
    let it go on. Asserts no process of the run and nothing it mapped from /dev/shm
    survive; returns the exit status, the seconds from the fault to the exit, the run
    directory and stderr."""
    out, held, log = tmp_path / "run", tmp_path / "held", tmp_path / "stderr"
    with _asyngrad([*command, "--out", str(out)], log,
                   {**os.environ, HOLD: f"{stage}:{held}"}) as process:
        assert _within(120, lambda: held.exists() or process.poll() is not None)
        assert process.poll() is None, log.read_text()
        pids = [int(p) for p in held.read_text().split()]
        family = set(_children(process.pid)) | set(pids)
        made = _mapped(family | {process.pid})
        struck = time.monotonic()
        if fault == "worker":
            os.kill(pids[0], signal.SIGKILL)
            assert _within(5, lambda: _gone(pids[0]))
        else:
            os.kill(process.pid, getattr(signal, fault))
        held.unlink()
        process.wait(HANG_GUARD_S)
        took = time.monotonic() - struck
    _left_nothing(family, made)
    return process.returncode, took, out, log.read_text()


@contextlib.contextmanager
def _asyngrad(args: list[str], log: Path, env: dict[str, str] | None = None,
              ) -> Iterator[subprocess.Popen]:
    """``asyngrad ARGS`` in a session of its own, stderr to ``log``; killed with everything
    it started if it is still running when the block ends."""
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "simulator.cli", *args], env=env,
                                   stderr=stderr, stdout=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _left_nothing(family: set[int], made: set[str]) -> None:
    """No process of the run survives, nor anything it mapped from /dev/shm."""
    assert _within(5, lambda: all(_gone(pid) for pid in family)), (
        [pid for pid in family if not _gone(pid)])
    assert _within(5, lambda: not (made & _shm())), made & _shm()


def _consistent(out: Path) -> dict:
    """The partial run directory loads: its trace, scenario and summary; the summary."""
    Trace.load(out / "trace.npz")
    tomllib.loads((out / "scenario.toml").read_text())
    return json.loads((out / "summary.json").read_text())


def _no_staging(out: Path) -> None:
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


REAL = ["real", "--workers", "2", *RUN]
PROBED = [*REAL, "--probe"]
LOCKED = [*REAL, "--mode", "locked"]  # a semaphore in /dev/shm that must not leak
SHORT = ["real", "--workers", "2", "--set", "problem.dim=20", "--set", "run.updates=2000"]


@needs_proc
@pytest.mark.alone
@pytest.mark.parametrize("stage, command", [("spawned", REAL), ("ready", LOCKED),
                                            ("probing", PROBED), ("running", LOCKED)])
def test_a_worker_killed_at_any_stage_ends_the_run_with_its_partial_trace(tmp_path, stage,
                                                                           command):
    """SIGKILL worker 0 at the stage: exit 1 within seconds, the worker named, a run directory
    that loads, nothing left behind."""
    code, took, out, said = _strike(tmp_path, command, stage, "worker")
    assert code == 1 and took < HANG_GUARD_S, said
    failure = _consistent(out)["real"]["failure"]
    assert failure == {"worker": 0, "reason": "killed by signal 9"}, said
    _no_staging(out)


@needs_proc
@pytest.mark.alone
@pytest.mark.parametrize("fault, stage, command", [
    ("SIGTERM", "spawned", REAL), ("SIGTERM", "ready", LOCKED), ("SIGTERM", "probing", PROBED),
    ("SIGTERM", "running", LOCKED), ("SIGINT", "running", REAL)])
def test_a_signalled_parent_stops_its_workers_and_keeps_the_partial_trace(tmp_path, fault,
                                                                          stage, command):
    """SIGTERM is Ctrl-C: the workers stopped, exit 1, the partial run directory written and
    saying why, the user told what is happening, nothing left behind."""
    code, took, out, said = _strike(tmp_path, command, stage, fault)
    assert code == 1 and took < HANG_GUARD_S, said
    reason = _consistent(out)["real"]["failure"]["reason"]
    assert reason == ("interrupted (SIGTERM)" if fault == "SIGTERM"
                      else "interrupted (Ctrl-C)"), said
    assert "stopping the workers" in said and "writing the partial run" in said
    _no_staging(out)


@needs_proc
@pytest.mark.alone
@pytest.mark.parametrize("fault", ["SIGTERM", "SIGINT"])
def test_a_signalled_parameter_server_keeps_its_partial_trace(tmp_path, fault):
    """``real --backend ps`` signalled while it serves: the trainers stopped, exit 1, the
    partial run directory saying why (or, signalled before it served, exit 130/143 and no
    directory), nothing left behind."""
    out, log = tmp_path / "run", tmp_path / "stderr"
    with _asyngrad(["real", "--backend", "ps", "--workers", "2", "--set",
                    "run.updates=5000000", "--out", str(out)], log) as process:
        assert _within(120, lambda: len(_children(process.pid)) >= 2)
        family = set(_children(process.pid))
        time.sleep(8)  # spawned trainers import torch and join the group: then it serves
        made = _mapped(family | {process.pid})
        struck = time.monotonic()
        os.kill(process.pid, getattr(signal, fault))
        process.wait(HANG_GUARD_S)
        took = time.monotonic() - struck
    said = log.read_text()
    assert took < HANG_GUARD_S, said
    _left_nothing(family, made)
    if out.exists():
        assert process.returncode == 1, said
        reason = _consistent(out)["real"]["failure"]["reason"]
        assert reason == ("interrupted (SIGTERM)" if fault == "SIGTERM"
                          else "interrupted (Ctrl-C)"), said
    else:
        assert process.returncode == (143 if fault == "SIGTERM" else 130), said
    _no_staging(out)


@needs_proc
@pytest.mark.alone
@pytest.mark.parametrize("fault", ["SIGTERM", "SIGINT"])
def test_a_parent_signalled_while_it_writes_leaves_no_run_directory(tmp_path, fault):
    """A signal while the run directory is written: nothing published, no staging left, the
    exit status of the signal (143, 130)."""
    code, took, out, said = _strike(tmp_path, SHORT, "writing", fault)
    assert code == {"SIGTERM": 143, "SIGINT": 130}[fault] and took < HANG_GUARD_S, said
    assert not out.exists()
    _no_staging(out)


@needs_proc
@pytest.mark.alone
def test_workers_die_with_a_parent_killed_outright(tmp_path):
    """SIGKILL to the parent while its workers wait for the start: they die with it (the
    resource tracker too, unlinking the lock's semaphore); no run directory."""
    code, _, out, _ = _strike(tmp_path, LOCKED, "ready", "SIGKILL")
    assert code == -signal.SIGKILL and not out.exists()


@needs_proc
@pytest.mark.alone
def test_a_killed_simulate_leaves_staging_the_next_run_removes(tmp_path):
    """``simulate`` killed while it writes leaves its staging directory; the next run into
    the same place removes it (its process is gone), and the run directory is whole."""
    command = ["simulate", "--set", "run.updates=200", "--quiet"]
    code, _, out, _ = _strike(tmp_path, command, "writing", "SIGKILL")
    assert code == -signal.SIGKILL and not out.exists()
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".run.partial-")]
    assert len(left) == 1
    done = subprocess.run([sys.executable, "-m", "simulator.cli", *command, "--out", str(out)],
                          timeout=120)
    assert done.returncode == 0 and not left[0].exists()
    assert len(Trace.load(out / "trace.npz")) == 200


def test_staging_of_live_processes_and_other_names_is_kept(tmp_path):
    """Only ``.NAME.partial-PID`` and ``.NAME.old-PID`` of dead processes go: a live
    process's staging (it may be writing), another run's and other files stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getppid()
    names = [f".run.partial-{dead.pid}", f".run.old-{dead.pid}", f".run.partial-{live}",
             f".other.partial-{dead.pid}", f"run.partial-{dead.pid}", ".run.partial-x"]
    for name in names:
        (tmp_path / name).mkdir()
    publish(tmp_path / "run", ("a",), lambda where: (where / "a").write_text("a"))
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(["run", *names[2:]])
