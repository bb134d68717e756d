"""Real processes and real shared memory on tiny problems (seconds each)."""

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from realrun.host.probe import built, probe_cpus
from realrun.host.timeslice import measure_migration, measure_time_slice
from realrun.runner import run_real
from realrun.worker import die_with_parent, wait_for_release, wait_for_start
from simulator.engine import simulate
from simulator.fidelity.runs import load_run
from simulator.problems import make_problem
from simulator.replay import replay
from simulator.scenario import scenario_from_dict
from simulator.timing import sample_stream
from simulator.trace import read_sweeps
from tests.conftest import check_hardware_loss, fitted, scenario

pytestmark = pytest.mark.alone  # real processes, or the CPUs probed: see conftest

TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=3000")
# Far more work than any of the fault tests waits for (about 25 µs per update, 500,000 per
# worker: over ten seconds), so the run is still going when it is stopped.
LONG = ("problem.dim=5000", "problem.n_samples=200", "run.updates=1000000")


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if Path("/dev/shm").is_dir() else set()


def test_serial_real_run_equals_the_simulator_to_the_bit():
    """Serial, float64: the same samples and the same arithmetic as the simulator's serial
    run, so the final vectors are identical (not just the same optimum)."""
    s = scenario(*TINY, "run.blocks=2")
    real = run_real(s, 1, "serial", dtype="float64")
    simulated = simulate(scenario(*TINY, "run.blocks=2", "run.protocol=serial"))
    assert real.failure is None and len(real.trace) == 3000
    assert np.array_equal(real.trace["sample"], simulated["sample"])
    assert np.array_equal(real.trace["w_final"], simulated["w_final"])
    assert real.trace["staleness"].max() == 0
    assert real.cpu_latency is None  # one worker: no pair of CPUs to probe
    # The loss curve's points are copies taken as the run went: the first is w_0's loss and
    # the last the final vector's (a float64 vector is not snapshotted by reference).
    problem = make_problem(s.problem)
    loss = real.trace["curve_loss"]
    assert loss[0] == problem.full_loss(problem.initial()) > loss[-1]
    assert loss[-1] == problem.full_loss(real.trace["w_final"])


def test_lock_free_workers_converge_and_merge_cleanly():
    """Two lock-free workers: every update has R <= G <= W, samples follow each worker's
    documented stream, and the loss falls most of the way to the optimum."""
    s = scenario(*TINY, "run.updates=6000")
    run = run_real(s, 2, "lockfree", probe=True)
    trace = run.trace
    assert run.failure is None and len(trace) == 6000
    for a, b in (("read_start", "read_end"), ("read_end", "grad_end"),
                 ("grad_end", "write_end")):
        assert np.all(trace[a] <= trace[b])
    assert np.all(np.diff(trace["write_end"]) >= 0)
    # Each worker makes a fixed share, and the run's scenario says so for the simulator, as
    # it says that a copy of the dense vector sweeps it (reads part of a write in flight).
    assert np.bincount(trace["thread"]).tolist() == [3000, 3000]
    recorded = scenario_from_dict(tomllib.loads(trace.scenario_toml))
    assert recorded.run.split == "even" and recorded.hardware.sweeping_reads is not None
    for rank in (0, 1):
        rows = np.flatnonzero(trace["thread"] == rank)
        mine = trace["sample"][rows[np.argsort(trace["thread_seq"][rows])]]
        stream = sample_stream(s.run.seed, 2, rank, run.problem.n_samples)
        assert mine.tolist() == [int(stream.take()) for _ in range(mine.size)]
    f_star = run.problem.optimum()[1]
    start, end = trace["curve_loss"][0] - f_star, trace["curve_loss"][-1] - f_star
    assert end < 0.2 * start
    assert run.start_seconds > 0 and run.finish_seconds > 0
    if built() and probe_cpus() is not None:  # asked for: just before the start and after
        latency = run.cpu_latency
        assert latency["cpus"] == probe_cpus()
        assert all(0 < latency[key] < 1e6 for key in ("before_ns", "after_ns"))


def test_locked_workers_never_overlap():
    """Under the lock no update completes during another: staleness and overwrites are 0."""
    run = run_real(scenario(*TINY, "run.updates=1000", "run.blocks=3"), 2, "locked")
    assert run.failure is None
    assert run.trace["staleness"].max() == 0 and run.trace["read_overwrites"].sum() == 0
    order = np.argsort(run.trace["read_start"])
    starts, ends = run.trace["read_start"][order], run.trace["write_end"][order]
    assert np.all(starts[1:] >= ends[:-1])


def test_a_killed_worker_stops_the_run_cleanly():
    """SIGKILL one worker: the monitor names it, the others are stopped, the partial trace
    (both workers' completed updates) kept, no orphan process and no leaked shared memory."""
    before = _shm()
    pids: list[int] = []
    killed: list[float] = []
    done = [0]

    def kill_once_working(count: int) -> None:
        # Once the workers have made updates (set-up takes seconds on a loaded machine).
        done[0] += count
        if done[0] >= 1000 and not killed:
            os.kill(pids[1], signal.SIGKILL)
            killed.append(time.monotonic())

    run = run_real(scenario(*LONG), 2, "lockfree", on_start=pids.extend,
                   progress=kill_once_working)
    assert killed and time.monotonic() - killed[0] < 120  # only a guard against a hang
    assert run.failure == {"worker": 1, "reason": "killed by signal 9"}
    assert 1000 <= len(run.trace) < 1_000_000
    assert np.bincount(run.trace["thread"], minlength=2).min() > 0
    assert np.all(np.diff(run.trace["write_end"]) >= 0)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _shm() <= before


def test_a_worker_killed_before_its_first_update_in_measure_mode():
    """Measure mode with nothing to rebuild: the failure is reported with an empty trace."""
    run = run_real(scenario(*TINY), 2, "lockfree", dtype="float64", measure_every=1,
                   on_start=lambda pids: os.kill(pids[0], signal.SIGKILL))
    assert run.failure == {"worker": 0, "reason": "killed by signal 9"}
    assert len(run.trace) == 0 and run.hardware_loss["rebuilt_vs_real_norm"] == 0.0


def test_the_curve_keeps_no_copy_during_which_an_update_was_counted(monkeypatch):
    """Without measure mode the parent copies the live vector for the curve: a copy during
    which the workers counted an update may hold part of it, so it is not kept as the count's
    vector; the next poll's copy, which nothing moved, is kept at its own count."""
    import types

    import torch

    from realrun import runner
    from realrun.worker import STATUS_DONE

    buffers = types.SimpleNamespace(
        w=None, progress=torch.tensor([40, 10]), status=torch.zeros(2, dtype=torch.int64),
        message=torch.zeros(2, 8, dtype=torch.uint8), control=torch.zeros(2, dtype=torch.int64))
    copies: list[int] = []

    def copy(w):
        copies.append(int(buffers.progress.sum()))
        if len(copies) == 1:
            buffers.progress[0] += 5  # an update counted while the vector was copied
        buffers.status[:] = STATUS_DONE
        return np.zeros(2)

    class Worker:  # exits after a few polls
        looks = 0

        @property
        def exitcode(self) -> int | None:
            self.looks += 1
            return 0 if self.looks > 8 else None

    monkeypatch.setattr(runner, "_host", copy)
    snapshots = [(0, 0, np.zeros(2))]
    workers = [Worker(), Worker()]
    assert runner._watch(buffers, workers, 100, None, time.monotonic(), None, snapshots,
                         10) is None
    assert copies == [50, 55] and [t for t, _, _ in snapshots] == [0, 55]


def test_touching_the_records_before_the_start_changes_no_value():
    """Workers write every page of their rows before the start (page faults stay out of the
    loop); the rows keep their values, −1 markers included, and other workers' rows are
    not touched."""
    import torch

    from realrun.worker import Buffers, touch_records

    def rows(fill: float, dtype) -> torch.Tensor:
        return torch.full((2, 5, 3), fill, dtype=dtype)

    buffers = Buffers(w=torch.zeros(3), times=rows(7, torch.int64),
                      copy_end=rows(-1, torch.int64), store_end=rows(-1, torch.int64),
                      samples=rows(4, torch.int64), progress=torch.zeros(2, dtype=torch.int64),
                      status=torch.zeros(2), message=torch.zeros(2, 8),
                      steps=rows(0.25, torch.float64), reads=rows(-0.5, torch.float64))
    before = {name: getattr(buffers, name).clone() for name in
              ("times", "copy_end", "store_end", "samples", "steps", "reads")}
    touch_records(buffers, 1)
    for name, old in before.items():
        assert torch.equal(getattr(buffers, name), old), name


def test_timeout_keeps_partial_results():
    """--timeout stops the run and says so; what completed is kept. The bound covers the
    workers' start-up too (3-6 s on a slow day): a run stopped while starting says so and
    has nothing to keep, and the bound is then doubled until the workers get to run."""
    for timeout in (3.0, 6.0, 12.0, 24.0):
        run = run_real(scenario(*LONG), 2, "lockfree", timeout=timeout)
        assert run.failure is not None and "timeout" in run.failure["reason"]
        if "starting" not in run.failure["reason"]:
            break
        assert len(run.trace) == 0
    assert len(run.trace) > 0


@pytest.mark.skipif(not built() or probe_cpus() is None,
                    reason="needs realrun.host._cpuprobe and two usable CPUs")
def test_a_one_worker_run_probes_its_shared_writes_and_calibrates_from_them(tmp_path):
    """One worker never writes on lines another read; a run asked to probe (``--probe``)
    probes what such a write of its vector costs (``real.shared_write``), and ``calibrate``
    takes ``write_shared`` from it: (m + extra) / m, m the run's median write. It also makes
    two writes meet (``real.write_meetings``). Sparse problems write a few coordinates: no
    probe. Without ``--probe`` nothing is probed, and calibrate says so."""
    from simulator.fidelity.calibrate import calibrate

    out, plain = tmp_path / "one", tmp_path / "plain"
    args = [sys.executable, "-m", "simulator.cli", "real", "--workers", "1", "--quiet",
            "--dtype", "float32", *[x for o in TINY for x in ("--set", o)]]
    assert subprocess.run([*args, "--out", str(out), "--probe"], timeout=300).returncode == 0
    assert subprocess.run([*args, "--out", str(plain)], timeout=300).returncode == 0
    unprobed = json.loads((plain / "summary.json").read_text())["real"]
    assert unprobed["shared_write"] is unprobed["write_meetings"] is None
    _, report = calibrate(plain, pool=True, cores=2, shared="on")
    assert "asyngrad real --probe" in report["shared"]["why"]
    assert "asyngrad real --probe" in report["convoys"]["why"]
    probed = json.loads((out / "summary.json").read_text())["real"]["shared_write"]
    assert probed["count"] == probed["probed"] == 20 and probed["itemsize"] == 4
    assert probed["cpus"] == probe_cpus()
    assert probed["extra_ns"] == probed["shared_ns"] - probed["own_ns"]
    meetings = json.loads((out / "summary.json").read_text())["real"]["write_meetings"]
    assert meetings["probed"] == 20 and meetings["itemsize"] == 4
    assert len(meetings["rows"]) == 128 and all(len(row) == 6 for row in meetings["rows"])
    calibrated, report = calibrate(out, pool=True, cores=2, shared="on")
    trace = load_run(out).trace
    median = float(np.median(trace["write_end"] - trace["write_start"]))
    assert report["shared"]["probes"] == 1 and report["shared"]["median_write_ns"] == median
    assert fitted(calibrated).write_shared == pytest.approx(
        (median + probed["extra_ns"]) / median)
    sparse = run_real(scenario("problem.name=sparse_logistic", "run.updates=200"), 1,
                      "lockfree", probe=True)
    assert sparse.failure is None and sparse.shared_write is sparse.write_meetings is None


def test_cli_real_run_and_its_replay(tmp_path):
    """`asyngrad real` writes the simulator's run directory; `asyngrad replay` re-runs the
    real trace's recorded samples and durations in the simulator."""
    out = tmp_path / "real"
    args = [sys.executable, "-m", "simulator.cli", "real", "--out", str(out), "--workers",
            "2", "--quiet", *[x for o in TINY for x in ("--set", o)]]
    assert subprocess.run(args, timeout=300).returncode == 0
    assert (out / "trace.npz").is_file() and (out / "timeline.png").is_file()
    from simulator.replay import load_trace
    recorded = load_trace(out)
    assert recorded.source == "real" and len(recorded) == 3000
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["real"]) >= {"cpu_latency", "recorder"}
    assert summary["real"]["host"] == platform.node()  # calibrate's balancer applies here
    _, _, again = replay(recorded)
    # Trace-driven simulation puts every event at its recorded time: per worker, the same
    # timestamps; hence the same interleaving (up to the order of equal timestamps).
    real, sim = (np.lexsort((t["thread_seq"], t["thread"])) for t in (recorded, again))
    for column in ("sample", "read_start", "read_end", "grad_end", "write_end"):
        assert np.array_equal(recorded[column][real], again[column][sim]), column
    # Staleness counts completions before a read, so it can differ only where the clock
    # cannot order two events: two writes that end at the same reading (the merge orders
    # them by worker, the simulator by event), or a read that starts at the very reading
    # another write ends.
    differs = recorded["staleness"][real] != again["staleness"][sim]
    ends, counts = np.unique(recorded["write_end"], return_counts=True)
    tied = (np.isin(recorded["write_end"][real], ends[counts > 1])
            | np.isin(recorded["read_start"][real], recorded["write_end"]))
    assert tied[differs].all()
    bad = subprocess.run([*args[:4], "--out", str(tmp_path / "bad"), "--workers", "0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--workers = 0" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_measure_mode_rebuild_is_exact_on_a_serial_run(dtype):
    """Replaying the recorded steps in store order reproduces the real vector bit for bit
    (hardware loss exactly 0); in float64 the exact metrics equal the simulator's."""
    s = scenario(*TINY, "run.blocks=3")
    real = run_real(s, 1, "serial", dtype=dtype, measure_every=1)
    assert real.failure is None and real.trace["measured"].all()
    assert real.hardware_loss is not None
    assert {key: real.hardware_loss[key] for key in ("rebuilt_vs_real_norm",
            "rebuilt_vs_real_max", "relative_to_distance_moved")} == dict.fromkeys(
        ("rebuilt_vs_real_norm", "rebuilt_vs_real_max", "relative_to_distance_moved"), 0.0)
    # One worker: no write ever overlaps a read, so every read shows the real vector.
    assert real.hardware_loss["view"] == "real memory"
    assert real.hardware_loss["quiet_reads"] == 3000
    if dtype == "float64":
        simulated = simulate(scenario(*TINY, "run.blocks=3", "run.protocol=serial"))
        for name in ("s_norm", "g_norm", "delta_norm", "delta_dot", "curve_loss",
                     "curve_dist2"):
            assert np.array_equal(real.trace[name], simulated[name]), name


@pytest.mark.parametrize("points", [10, 0])
def test_measure_mode_takes_the_curve_at_the_scenarios_checkpoints(points):
    """Measure mode's curve is taken where the simulator takes it for
    ``metrics.curve_points`` (10: 11 points; 0: w_0 and w_T only), with the same values on a
    serial float64 run."""
    options = (*TINY, "run.updates=500", f"metrics.curve_points={points}")
    real = run_real(scenario(*options), 1, "serial", dtype="float64", measure_every=1)
    simulated = simulate(scenario(*options, "run.protocol=serial"))
    assert real.failure is None and len(real.trace["curve_t"]) == (points + 1 if points else 2)
    for name in ("curve_t", "curve_n", "curve_loss", "curve_dist2"):
        assert np.array_equal(real.trace[name], simulated[name]), name


def test_measure_mode_on_lock_free_workers():
    """Two lock-free workers in measure mode: sampled exact metrics, and the distance between
    the rebuilt and the real vector reported."""
    run = run_real(scenario(*TINY, "run.blocks=4"), 2, "lockfree", dtype="float64",
                   measure_every=3)
    trace = run.trace
    assert run.failure is None
    assert np.flatnonzero(trace["measured"]).tolist() == list(range(2, 3000, 3))
    assert np.isfinite(trace["delta_norm"][trace["measured"]]).all()
    check_hardware_loss(run)


def test_measure_mode_records_what_copies_held_of_writes_in_flight():
    """One block, read copies kept: each read under another worker's lone write gives a row of
    how long before the read's end the write began, its duration, the coordinates its step
    changed and how many of them the copy held (realrun.rebuild.read_sweeps)."""
    run = run_real(scenario(*TINY, "run.updates=6000"), 2, "lockfree", dtype="float64",
                   measure_every=1)
    rows = read_sweeps(run.trace)
    assert run.failure is None and rows is not None and rows.shape[0] > 0
    begun, span, size, held = rows.T
    assert np.all(begun > 0) and np.all(span > 0)
    assert np.all((size > 0) & (size <= run.problem.dim)) and np.all((held >= 0) & (held <= size))
    assert np.array_equal(held, np.rint(held))


def test_block_locks_keep_every_store():
    """blocklock: each block's read-modify-write is exclusive, so the rebuilt vector (every
    step applied) equals the real one — the hardware loses nothing — while reads stay free."""
    run = run_real(scenario(*TINY, "run.blocks=2", "run.updates=4000"), 2, "blocklock",
                   dtype="float64", measure_every=10)
    assert run.failure is None
    assert run.hardware_loss is not None
    assert run.hardware_loss["rebuilt_vs_real_max"] < 1e-12
    assert run.scenario.run.write_mode == "atomic_add"


def test_ctrl_c_stops_cleanly_and_keeps_partial_results(tmp_path):
    """SIGINT to the process group (what Ctrl-C does) once the terminal's progress bar shows
    updates: exit 1, partial trace and a summary that says interrupted, and no worker left
    behind."""
    import json
    import pty
    import re

    out = tmp_path / "real"
    # The progress bar is drawn on a terminal only; this one reports no width (nobody sized
    # it), where the bar falls back to 80 columns.
    main_fd, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "real", "--out", str(out), "--workers", "2",
         *[x for o in LONG for x in ("--set", o)]],
        start_new_session=True, stderr=terminal, text=True)
    os.close(terminal)
    shown: list[str] = []  # read on: a full terminal buffer would block the bar's writes

    def read() -> None:
        while True:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # the terminal closed: every process that held it exited
                return
            if not chunk:
                return
            shown.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not re.search(r"[1-9]\d*/1000000", "".join(shown)[-4000:]):
        assert process.poll() is None and time.monotonic() < deadline, "".join(shown)
        time.sleep(0.05)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=60)
    reader.join(timeout=10)
    os.close(main_fd)
    assert process.returncode == 1 and "interrupted" in "".join(shown)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["failure"]["reason"].startswith("interrupted")
    assert 0 < summary["updates"] < 1_000_000
    # How the real writes met, from the partial trace as from any other.
    from simulator.metrics import write_meetings
    from simulator.trace import Trace
    assert summary["writes"] == write_meetings(Trace.load(out / "trace.npz"))
    # The workers, and multiprocessing's resource tracker (which exits once it sees its
    # parent's pipe close, within about a second), must all be gone: nothing orphaned.
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_the_time_slice_of_this_machine_is_measured():
    """Two processes pinned to one core take turns: each turn is one time slice (Linux:
    milliseconds), far longer than an interrupt and far shorter than a second."""
    quantum, turns = measure_time_slice(0.3)
    assert turns >= 4
    assert 100_000 < quantum < 100_000_000


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_the_load_balancer_of_this_machine_is_measured():
    """Three processes spin on two CPUs (or two on one): two of them share a core and take
    turns; the balancer's moves are changes between windows of two slices, so there are
    fewer than the windows watched, and the mean interval between them is at least a window
    and at most the time watched (all of it when none was seen)."""
    cores = min(2, len(os.sched_getaffinity(0)))
    window = 2 * 4_000_000
    migrate, moves = measure_migration(cores, window // 2, seconds=1.0)
    assert moves < 1_000_000_000 // window
    assert window <= migrate <= 1_000_000_000


def _seen_in_workers(pids: list[int], look, polls: int = 1) -> dict[int, object]:
    """``look(pid)`` for each worker, polled every 10 ms until it gave the same answer (not
    None) ``polls`` times in a row, or 20 s passed: workers are still starting while the
    parent's ``on_start`` runs."""
    seen: dict[int, object] = {}
    streak: dict[int, tuple[object, int]] = {}
    deadline = time.monotonic() + 20
    while len(seen) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid in seen:
                continue
            answer = look(pid)
            last, count = streak.get(pid, (None, 0))
            count = count + 1 if answer is not None and answer == last else 1
            streak[pid] = (answer, count)
            if answer is not None and count >= polls:
                seen[pid] = answer
        time.sleep(0.01)
    return seen


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_pinned_workers_run_on_a_cpu_each_in_turn():
    """--pin: worker r on the r-th usable CPU modulo their count (the simulator's per-core
    placement), seen in the kernel's own affinity of each worker process: one CPU, held for
    10 polls in a row (libraries probing the machine at start-up pin a process to each CPU
    for a moment and put its mask back, which is why workers pin once set up)."""
    cpus = sorted(os.sched_getaffinity(0))
    want = [cpus[r % len(cpus)] for r in range(3)]
    seen: dict[int, object] = {}

    def affinity(pid: int) -> object:
        try:
            mask = os.sched_getaffinity(pid)
        except OSError:
            return None
        return min(mask) if len(mask) == 1 else None

    run = run_real(scenario(*TINY, "run.updates=300000"), 3, "lockfree", pin=True,
                   on_start=lambda pids: seen.update(
                       {pids.index(p): v
                        for p, v in _seen_in_workers(pids, affinity, polls=10).items()}))
    assert run.failure is None and run.cpus == want
    assert [seen.get(r) for r in range(3)] == want
    assert run_real(scenario(*TINY), 2, "lockfree").cpus is None


def _exited(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not Path("/proc").is_dir(),
                    reason="needs CPU affinity and /proc")
def test_a_finished_worker_exits_only_when_every_worker_is_done():
    """A worker that made its updates waits, asleep, until every worker has made theirs:
    a process that imported torch spends tens to hundreds of ms of CPU on its way out, which
    would take time slices from the workers still training. Three pinned workers on this
    machine's CPUs (on 2 CPUs, worker 1 runs alone and is done in half the time): no worker
    process ends before the parent has seen all 300,000 updates."""
    exits: dict[int, int] = {}
    seen_all: list[int] = []
    done = [0]

    def watch(pids: list[int]) -> None:
        def poll() -> None:
            deadline = time.monotonic() + 120
            while len(exits) < len(pids) and time.monotonic() < deadline:
                for pid in pids:
                    if pid not in exits and _exited(pid):
                        exits[pid] = time.monotonic_ns()
                time.sleep(0.0005)
        threading.Thread(target=poll, daemon=True).start()

    def progress(n: int) -> None:
        done[0] += n
        if done[0] >= 300_000 and not seen_all:
            seen_all.append(time.monotonic_ns())

    run = run_real(scenario(*TINY, "run.updates=300000"), 3, "lockfree", pin=True,
                   on_start=watch, progress=progress)
    assert run.failure is None and seen_all
    deadline = time.monotonic() + 10
    while len(exits) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(exits) == 3
    assert min(exits.values()) > seen_all[0]


def _waits_for_release(control) -> None:
    from types import SimpleNamespace

    wait_for_release(SimpleNamespace(control=control), die_with_parent())


def _starts_a_waiter_and_dies(sender, control) -> None:
    import multiprocessing as mp

    context = mp.get_context("fork")
    waiter = context.Process(target=_waits_for_release, args=(control,))
    waiter.start()
    sender.send(waiter.pid)  # a pipe writes at once (a queue's thread would not, below)
    time.sleep(0.5)  # the waiter waits
    os._exit(0)  # gone outright: nobody will release it


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_a_waiting_worker_exits_when_its_parent_is_gone():
    """A finished worker waits for the parent's release; if the parent dies without giving
    it, the worker exits instead of sleeping forever."""
    import multiprocessing as mp

    import torch

    context = mp.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    control = torch.zeros(2, dtype=torch.int64).share_memory_()
    parent = context.Process(target=_starts_a_waiter_and_dies, args=(sender, control))
    parent.start()
    assert receiver.poll(30)
    waiter = receiver.recv()
    parent.join(30)
    deadline = time.monotonic() + 10
    while not _exited(waiter) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _exited(waiter)


def test_the_start_is_a_flag_no_dead_worker_can_block():
    """Workers say ready and sleep until the parent posts a start time, then spin to it; a
    waiter whose parent is gone (or a stopped thread) leaves without starting. Nothing
    locks: a waiter killed at any point leaves nothing held."""
    from types import SimpleNamespace

    import torch

    buffers = SimpleNamespace(ready=torch.zeros(2, dtype=torch.int64),
                              control=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(SystemExit, match="waiting for the start"):
        wait_for_start(buffers, 1, lambda: True)
    assert buffers.ready.tolist() == [0, 1]
    buffers.control[0] = time.monotonic_ns() + 20_000_000
    wait_for_start(buffers, 0, lambda: True)  # posted: the parent's state no longer matters
    assert time.monotonic_ns() >= int(buffers.control[0])
    buffers.control[1] = 1
    wait_for_release(buffers, lambda: False)  # released: returns at once


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_workers_start_with_one_thread_blas_pools():
    """Workers are spawned with the BLAS/OpenMP thread counts at 1 (a pool started at numpy's
    import spins into the run otherwise), and the parent's environment is left as it was."""
    from realrun.worker import ONE_THREAD_ENV

    before = {name: os.environ.get(name) for name in ONE_THREAD_ENV}
    seen: dict[int, object] = {}

    def environment(pid: int) -> object:
        try:  # empty while the process is being created
            text = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        return {k.decode(): v.decode() for k, _, v in (e.partition(b"=") for e in text)
                if k.decode() in ONE_THREAD_ENV} if len(text) > 1 else None

    run = run_real(scenario(*TINY), 2, "lockfree",
                   on_start=lambda pids: seen.update(_seen_in_workers(pids, environment, 3)))
    assert run.failure is None and len(seen) == 2
    assert all(env == ONE_THREAD_ENV for env in seen.values())
    assert {name: os.environ.get(name) for name in ONE_THREAD_ENV} == before
