"""Real runs against their simulation, statistically: the lock-free parameter server's lost
updates, and pauses and deaths on real CPU workers. Each tolerance is stated and justified
in its test's docstring; each was measured over repeats on the loaded 2-core machine."""

import threading
import time

import numpy as np
import pytest

from realrun import ps
from realrun.ps import run_ps
from realrun.runner import run_real
from simulator.engine import simulate
from simulator.problems import make_problem
from simulator.replay import replay_scenario
from simulator.timing import ReplaySource
from simulator.trace import Trace
from tests.conftest import scenario

pytestmark = pytest.mark.alone  # real processes: see conftest

LOCK_FREE = ("problem.dim=20", "problem.n_samples=200", "run.updates=300", "run.lr=0.05",
             "run.protocol=paramserver", "paramserver.lock_free=true",
             "run.write_mode=load_store")


class _Observed:
    """The lock-free server's in-place update (``realrun.ps._subtract``) as the simulator
    models it, made long and observable: it loads the vector, holds it ``hold`` seconds with
    no lock on the vector, and stores loaded − step, so every store of another update thread
    in between is overwritten. Each load and store is stamped (``time.monotonic_ns``, the
    server's clock) under a lock of its own, so their order is the real one; ``log`` holds
    per store (trainer, stores before its load, stores up to its own, load ns, store ns)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.log: list[tuple[int, int, int, int, int]] = []
        self.steps: list[np.ndarray] = []

    def __call__(self, w: np.ndarray, step: np.ndarray) -> None:
        trainer = int(threading.current_thread().name.rsplit("-", 1)[1])
        with self.lock:
            loaded, seen, loaded_at = w.copy(), len(self.log), time.monotonic_ns()
        time.sleep(self.hold)
        with self.lock:
            w[:] = loaded - step
            self.log.append((trainer, seen, len(self.log) + 1, loaded_at, time.monotonic_ns()))
            self.steps.append(step.copy())

    def overwrote(self) -> np.ndarray:
        """Per store, in store order: the other stores it overwrote (those between its load
        and its store)."""
        log = np.array(self.log)
        return log[:, 2] - log[:, 1] - 1

    def kept(self) -> np.ndarray:
        """Per store, in store order: whether the final vector holds its step (it is on the
        chain of loads back from the last store)."""
        seen = np.array(self.log)[:, 1]
        kept = np.zeros(seen.size, dtype=bool)
        at = seen.size
        while at > 0:
            kept[at - 1] = True
            at = int(seen[at - 1])
        return kept

    def by_row(self, trace: Trace) -> np.ndarray:
        """The order of the stores that puts them in the trace's rows' order (each update
        thread applies its trainer's pushes in order)."""
        trainer = np.array(self.log)[:, 0]
        mine = np.lexsort((np.arange(trainer.size), trainer))
        rows = np.lexsort((trace["thread_seq"], trace["thread"]))
        order = np.empty_like(mine)
        order[rows] = mine
        return order


def _observed_run(monkeypatch: pytest.MonkeyPatch, hold: float, trainers: int = 3,
                  ) -> tuple[ps.PSRun, _Observed]:
    observed = _Observed(hold)
    monkeypatch.setattr(ps, "_subtract", observed)
    run = run_ps(scenario(*LOCK_FREE), trainers, "float64", timeout=60, measure=True)
    assert run.failure is None and len(run.trace) == 300 and len(observed.log) == 300
    return run, observed


def _replayed_at_loads(trace: Trace, observed: _Observed) -> Trace:
    """The simulator's lock-free server on the real run's recorded durations, each push's
    write moved to its real [load, store]: its gradient phase runs on to the real load (a
    free link: the simulated server loads as the write begins) and its write ends at the real
    store. A pull can arrive before its trainer's previous push is applied (it is answered
    after): its read starts at that store."""
    log = np.array(observed.log)[observed.by_row(trace)]
    # The server's clock less the trace's origin: any shift that keeps each load after its
    # row's write start and each store before its write end keeps every row's phases in
    # order, and the loads' and stores' order does not depend on which.
    shift = int((log[:, 4] - trace["write_end"]).max())
    assert shift <= int((log[:, 3] - trace["write_start"]).min())
    load, store = log[:, 3] - shift, log[:, 4] - shift
    per_thread: list[list[tuple[int, list[int], int, list[int], int]]] = []
    for thread in range(int(trace["thread"].max()) + 1):
        rows = np.flatnonzero(trace["thread"] == thread)
        rows = rows[np.argsort(trace["thread_seq"][rows])]
        before = np.concatenate([[0], store[rows][:-1]])  # its previous write's end
        start = np.maximum(trace["read_start"][rows], before)
        start[0] = trace["read_start"][rows[0]]
        per_thread.append([
            (int(trace["sample"][r]), [int(trace["read_end"][r] - s)],
             int(load[r] - trace["read_end"][r]), [int(store[r] - load[r])], int(s - b))
            for r, s, b in zip(rows, start, before, strict=True)])
    replayed = replay_scenario(trace)
    return simulate(replayed, make_problem(replayed.problem), ReplaySource(per_thread))


@pytest.mark.parametrize("hold", [0.001, 0.002])
def test_the_simulated_lock_free_server_loses_the_real_servers_stores(monkeypatch, hold):
    """Three trainers on a lock-free server whose update holds its load ``hold`` s before
    storing (the simulator's model of a shard's update: load, then store loaded − step), so
    many pushes overwrite another's (measured, idle and with a core kept busy: 1 ms 0.42–0.71
    of the pushes, 2 ms 0.22–0.38; at least 10 asked, so the test is never vacuous). Given
    each push's real load and store times, the simulator's lock-free server overwrites the
    same stores, row for row: no tolerance is needed, as the stamps are taken under one
    lock, so their order is the real one, and the simulated events are placed at them to
    the ns. The real vector is every push the chain of loads
    kept: the summary's ``hardware_loss`` is ‖Σ of the dropped steps‖ (to rounding)."""
    run, observed = _observed_run(monkeypatch, hold)
    trace = run.trace
    simulated = _replayed_at_loads(trace, observed)
    real = observed.overwrote()[observed.by_row(trace)]
    real = real[np.lexsort((trace["thread_seq"], trace["thread"]))]
    again = simulated["overwrote"][np.lexsort((simulated["thread_seq"],
                                               simulated["thread"]))]
    assert (real > 0).sum() >= 10  # lost updates are frequent, not a rare event
    assert np.array_equal(real, again)
    assert simulated["lost_blocks"].sum() == real.sum()
    lost = np.sum(np.array(observed.steps)[~observed.kept()], axis=0)
    assert run.hardware_loss["rebuilt_vs_real_norm"] == pytest.approx(
        float(np.linalg.norm(lost)), rel=1e-9)


WORKERS = ("problem.dim=100", "run.updates=100000")


def _calibrated(trace: Trace, until: int, *overrides: str, pauses: tuple[str, ...] = ()
                ) -> Trace:
    """The simulation of a two-worker lock-free run on its own measured durations: each
    thread on a device of its own whose read, gradient (read end to write start), write and
    idle take the means of its worker's recorded ones over the updates it ended before
    ``until`` ns (one in flight then can be descheduled for milliseconds), and paused from 0
    until its worker's first read (a worker spawned later starts later), besides
    ``pauses``. Means, not the recorded values drawn afresh: on a
    loaded machine a few descheduled updates (a time slice, ms each) carry much of the
    time, and drawing them anew moved the simulated count by a factor up to 2."""
    phases = {"read": trace["read_end"] - trace["read_start"],
              "grad": trace["write_start"] - trace["read_end"],
              "write": trace["write_end"] - trace["write_start"], "idle": trace["idle_ns"]}
    devices, late = [], list(pauses)
    for thread in range(2):
        mine = (trace["thread"] == thread) & (trace["write_end"] < until)
        first = int(trace["read_start"][mine].min())
        # (the first update's idle is the wait for the first read: the pause below)
        idle = trace["idle_ns"][mine][np.argsort(trace["read_start"][mine])][1:]
        means = {name: v[mine].mean() for name, v in phases.items()} | {"idle": idle.mean()}
        timing = ", ".join(f"{name}={{dist='constant', mean={max(1, round(mean))}}}"
                           for name, mean in means.items())
        devices.append(f"{{name='w{thread}', timing={{{timing}}}}}")
        if first > 0:
            late.append(f"{{thread={thread}, start=0, end={first}}}")
    return simulate(scenario(*WORKERS, *overrides, "run.threads=2", "run.split=even",
                             f"devices=[{', '.join(devices)}]",
                             f"inject.pauses=[{', '.join(late)}]"))


def test_a_dead_workers_updates_are_the_calibrated_simulations():
    """``[[inject.deaths]]``: worker 1 dies 150 ms into a run it would need longer for.
    Simulated on the run's own mean durations until then (``_calibrated``), thread 1 makes
    as many updates before its death as the real worker did, within 25 %. The calibration
    is on the same window, so what is checked is the death's clock and units against the
    simulator's (a death counted from the worker's own start, or in other units, misses by
    far more); the tolerance covers the workers' clock starting before the trace's (ms on a
    loaded machine: the simulated count ran 0.1 % to 4 % high, real 8138–30397 updates),
    and the update in flight at the death (counted in the real run, abandoned by the
    simulated thread)."""
    real = run_real(scenario(*WORKERS, "inject.deaths=[{thread=1, at=150000000}]"), 2,
                    "lockfree", dtype="float64", timeout=120)
    assert real.failure is None
    made = int((real.trace["thread"] == 1).sum())
    simulated = _calibrated(real.trace, 150_000_000, "inject.deaths=[{thread=1, at=150000000}]")
    assert simulated["extra_dead_threads"].tolist() == [1]
    predicted = int((simulated["thread"] == 1).sum())
    assert 0 < made < 50000 and abs(predicted - made) <= 0.25 * made, (made, predicted)


def test_a_paused_worker_is_the_calibrated_simulations():
    """``[[inject.pauses]]``: worker 0 paused 150–190 ms. In the real run and in its
    simulation on its own durations (``_calibrated``, the same pause): worker 0 starts no
    read in the window (the real one at most one: a worker descheduled between its pause
    check and its read's stamp reads late, and then pauses), and worker 1's updates in it
    are never stale (≥ 99 % staleness 0: only worker 0's update in flight as the window
    opens can complete in it); and worker 0 makes as many updates before the pause as
    simulated, within 25 % (as a death's count: measured +0.5 % to +6 %). The real window
    is taken 5 ms narrower on each side: the workers' clock starts before the trace's, by
    a fraction of a millisecond on an idle machine, more on a loaded one."""
    pause = "{thread=0, start=150000000, end=190000000}"
    real = run_real(scenario(*WORKERS, f"inject.pauses=[{pause}]"), 2, "lockfree",
                    dtype="float64", timeout=120)
    assert real.failure is None and len(real.trace) == 100000
    simulated = _calibrated(real.trace, 150_000_000, pauses=(pause,))
    before = []
    for trace, margin in ((real.trace, 5_000_000), (simulated, 0)):
        began, thread = trace["read_start"], trace["thread"]
        inside = (began >= 150_000_000 + margin) & (began < 190_000_000 - margin)
        assert (inside & (thread == 0)).sum() <= (1 if trace is real.trace else 0)
        stale = trace["staleness"][inside & (thread == 1)]
        assert stale.size > 100 and (stale == 0).mean() >= 0.99
        before.append(int(((began < 150_000_000) & (thread == 0)).sum()))
    assert abs(before[1] - before[0]) <= 0.25 * before[0], before
