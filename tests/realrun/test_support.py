"""What each real backend honours (realrun/support.py): refusals before anything starts, the
resolved scenario of what ran, and the update rules the real server shares with the
simulator's protocols."""

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import realrun.pool as pool
import realrun.ps as ps
import realrun.runner as runner
import simulator.protocols.paramserver as sim_paramserver
import simulator.protocols.rounds as sim_rounds
from realrun import support
from simulator import rules
from simulator.cli import main
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from tests.conftest import scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ("problem.dim=20", "problem.n_samples=200", "run.updates=200")
TINY_SETS = [a for o in TINY for a in ("--set", o)]

# (flags, override, the field and value the one line names, the backend it names)
REFUSED = [
    (("--mode", "minibatch", "--measure"), ("run.protocol=minibatch",
                                            "problem.name=sparse_logistic",
                                            "inject.write_bits=8"), "inject.write_bits = 8",
     "shm"),
    (("--mode", "allreduce"), ("run.protocol=minibatch",
                               "inject.stragglers=[{thread=1, factor=0.5}]"),
     "inject.stragglers.0.factor = 0.5", "shm"),
    (("--backend", "ps"), ("inject.deaths=[{thread=1, at=5}]", "paramserver.rebalance=2"),
     "inject.deaths = [{'thread': 1", "ps"),
    (("--backend", "ps"), ("inject.deaths=[{thread=1, at=5}]", "paramserver.warm_start=3"),
     "inject.deaths = [{'thread': 1", "ps"),
    (("--backend", "ps"), "inject.stragglers=[{thread=0, factor=0.5}]",
     "inject.stragglers.0.factor = 0.5", "ps"),
    (("--mode", "lockfree"), "run.protocol=roundrobin", "run.protocol = 'roundrobin'", "shm"),
    (("--mode", "lockfree"), "run.protocol=minibatch", "run.protocol = 'minibatch'", "shm"),
    (("--mode", "lockfree"), "run.protocol=staleness_lr", "run.protocol = 'staleness_lr'",
     "shm"),
    (("--mode", "locked"), "run.protocol=dcasgd", "run.protocol = 'dcasgd'", "shm"),
    (("--mode", "lockfree"), "run.protocol=admm", "run.protocol = 'admm'", "shm"),
    ((), ("run.protocol=admm", "inject.error=noise"), "inject.error = 'noise'", "shm"),
    ((), "run.protocol=paramserver", "run.protocol = 'paramserver'", "shm"),
    (("--mode", "locked"), "run.protocol=serial", "run.protocol = 'serial'", "shm"),
    (("--backend", "ps"), "run.protocol=minibatch", "run.protocol = 'minibatch'", "ps"),
    (("--mode", "lockfree"), "run.write_mode=atomic_add", "run.write_mode = 'atomic_add'",
     "shm"),
    ((), "run.store_grain=8", "run.store_grain = 8", "shm"),
    ((), "run.placement=shuffled", "run.placement = 'shuffled'", "shm"),
    ((), "timing.read_per_thread=0.5", "timing.read_per_thread = 0.5", "shm"),
    ((), "timing.grad.mean=9000", "timing.grad = {'dist': 'lognormal', 'mean': 9000.0", "shm"),
    ((), "devices.0.speed=2", "devices.0.speed = 2.0", "shm"),
    (("--backend", "ps"), "run.blocks=2", "run.blocks = 2", "ps"),
    (("--backend", "ps"), ("paramserver.lock_free=true", "paramserver.warm_start=5"),
     "paramserver.warm_start = 5", "ps"),
    (("--backend", "ps"), ("run.split=even",), "run.split = 'even'", "ps"),
    ((), "hardware.sweeping_reads.lead=500", "hardware.sweeping_reads.lead = 500.0", "shm"),
    (("--backend", "ps"), "hardware.sweeping_reads.tail=300",
     "hardware.sweeping_reads.tail = 300.0", "ps"),
]


@pytest.mark.parametrize(("flags", "override", "named", "backend"), REFUSED)
def test_a_field_the_backend_does_not_honour_is_refused(tmp_path, capsys, flags, override,
                                                        named, backend):
    """Exit 2 before anything starts: one line naming the field, the value and the backend,
    and no output directory."""
    out = tmp_path / "run"
    overrides = (override,) if isinstance(override, str) else override
    sets = [a for o in overrides for a in ("--set", o)]
    assert main(["real", *flags, "--out", str(out), "--quiet", *TINY_SETS, *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert named in err[0] and f"refused by the {backend} backend" in err[0], err[0]
    assert not out.exists()



@pytest.mark.alone  # a real process (the command line)
def test_the_command_line_refuses_rounded_rounds_it_cannot_measure(tmp_path):
    """`python -m simulator.cli real --measure --set run.protocol=minibatch --set
    problem.name=sparse_logistic --set inject.write_bits=8`: exit 2, one line, nothing
    written."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "real", "--out", str(out),
                           "--measure", "--set", "run.protocol=minibatch", "--set",
                           "problem.name=sparse_logistic", "--set", "inject.write_bits=8"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "asyngrad: error: inject.write_bits = 8: measure mode's rebuild rounds a store over "
        "its sample's coordinates, where a round's (dense) write rounds every one (run "
        "without --measure, or simulate it); refused by the shm backend"]
    assert not out.exists()


def test_torchrun_nodes_refuse_before_joining(tmp_path, capsys, monkeypatch):
    """`python -m realrun.ps` refuses on every rank before it joins the group."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    out = tmp_path / "ps"
    assert ps._node_main(["--out", str(out), "--set", "inject.deaths=[{thread=0, at=5}]",
                          "--set", "paramserver.warm_start=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inject.deaths = " in err[0] and "ps backend" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("flags", [("--mode", "locked"), ("--device", "cuda"),
                                   ("--launch", "threads"), ("--pattern", "host"),
                                   ("--probe",)])
def test_ps_refuses_the_shared_memory_flags(tmp_path, capsys, flags):
    """Flags of the shared-memory workers (--probe ran nothing and said nothing)."""
    out = tmp_path / "ps"
    assert main(["real", "--backend", "ps", *flags, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asyngrad: error: {flags[0]} = ")
    assert not out.exists()


@pytest.mark.parametrize(("flags", "named"), [
    (("--device", "cuda", "--probe"), "--probe = 'on': probes the CPUs of CPU workers; not "
     "with --device cuda"),
    (("--mode", "serial", "--workers", "3"), "--workers = 3: --mode serial runs one worker")])
def test_shared_memory_flags_that_cannot_act_are_refused(tmp_path, capsys, flags, named):
    """--probe on CUDA workers probed nothing, and --workers 3 with --mode serial ran one
    worker, each without a word."""
    out = tmp_path / "run"
    assert main(["real", *flags, "--out", str(out), "--quiet", *TINY_SETS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"asyngrad: error: {named}"], err
    assert not out.exists()


def test_the_memory_check_sizes_the_run_that_will_run(monkeypatch):
    """The preflight sees the workers and measurement the run records (it sized
    run.threads = 4096 of the scenario, which --workers 2 replaces, and refused it)."""
    seen = []

    def preflight(s):
        seen.append((s.run.threads, s.metrics.exact))
        raise ScenarioError("x", 0, "stop here")

    monkeypatch.setattr(runner, "preflight", preflight)
    with pytest.raises(ScenarioError, match="stop here"):
        runner.run_real(scenario(*TINY, "run.threads=4096"), 2, "lockfree", measure_every=5)
    assert seen == [(2, True)]


def test_the_cuda_backend_refuses_as_the_others():
    """The same table for CUDA workers (checked after the device, so without a GPU the
    command line says that first)."""
    with pytest.raises(ScenarioError, match=r"^inject\.drop = 0\.1: .*refused by the cuda "
                       r"backend$"):
        support.refuse_unsupported(scenario("inject.drop=0.1"), "cuda", "lockfree")


def test_what_a_backend_runs_is_accepted_and_recorded():
    """A field that states what the mode runs is accepted; the resolved scenario records the
    mode's protocol, write mode and measurement."""
    support.refuse_unsupported(scenario("run.protocol=locked"), "shm", "locked")
    support.refuse_unsupported(scenario("run.write_mode=atomic_add"), "shm", "blocklock")
    support.refuse_unsupported(scenario("run.protocol=paramserver", "paramserver.rebalance=2",
                                        "paramserver.warm_start=5"), "ps", "paramserver")
    support.refuse_unsupported(scenario("paramserver.accumulate=4", "dcasgd.lam=0.1",
                                        "metrics.curve_points=7"), "shm", "lockfree")
    # Values that change nothing a real run does: a device's label, the parameters of an
    # injection that is off, atomic adds where one update writes at a time.
    inert = ("devices.0.name=gpu0", "inject.error_bound=0.5", "inject.error_relative=true",
             "inject.delay_dist=uniform")
    for backend, mode in (("shm", "lockfree"), ("cuda", "lockfree"), ("ps", "paramserver")):
        support.refuse_unsupported(scenario(*inert), backend, mode)
    for mode in ("locked", "serial"):
        support.refuse_unsupported(scenario("run.write_mode=atomic_add"), "shm", mode)
        assert support.recorded(scenario("run.write_mode=atomic_add"), mode, 2, False,
                                None).run.write_mode == "load_store"
    # With something injected, the field that injects is named, not an inert one before it.
    with pytest.raises(ScenarioError, match=r"^inject\.drop = "):
        support.refuse_unsupported(scenario("inject.error_bound=0.5", "inject.drop=0.1",
                                            "inject.pauses=[{thread=0, start=1, end=9}]"),
                                   "cuda", "lockfree")
    support.refuse_unsupported(scenario("inject.pauses=[{thread=0, start=1, end=9}]",
                                        "inject.deaths=[{thread=1, at=5}]",
                                        "inject.stragglers=[{thread=1, factor=2.0}]"),
                               "ps", "paramserver")
    support.refuse_unsupported(scenario("inject.error_bound=0.5", "inject.drop=0.1",
                                        "inject.delay=2"), "ps", "paramserver")
    # The server's backup-worker rounds run every injection (deaths too).
    support.refuse_unsupported(scenario("inject.delay=2", "inject.error=noise",
                                        "inject.drop=0.1", "inject.write_bits=8",
                                        "inject.pauses=[{thread=0, start=1, end=9}]",
                                        "inject.deaths=[{thread=1, at=5}]",
                                        "paramserver.fraction=0.5"), "ps", "paramserver")
    # CPU workers run delays, errors, drops and rounded stores, rounds and turns too (deaths
    # included); ADMM all but errors, on CPU workers as on the server.
    support.refuse_unsupported(scenario("inject.error=noise", "inject.error_bound=0.5",
                                        "inject.drop=0.1", "inject.write_bits=8",
                                        "inject.delay=3"), "shm", "lockfree")
    support.refuse_unsupported(scenario("run.protocol=roundrobin", "inject.drop=0.1",
                                        "inject.deaths=[{thread=0, at=5}]"), "shm",
                               "roundrobin")
    admm = ("inject.pauses=[{thread=0, start=1, end=9}]", "inject.delay=3",
            "inject.drop=0.1", "inject.write_bits=8", "inject.deaths=[{thread=1, at=5}]")
    for backend in ("shm", "ps"):
        support.refuse_unsupported(scenario("run.protocol=admm", *admm), backend, "admm")
    with pytest.raises(ScenarioError, match=r"^inject\.error = 'noise': real ADMM workers "
                       r".*no errors .*refused by the shm backend$"):
        support.refuse_unsupported(scenario("inject.drop=0.1", "inject.error=noise",
                                            "inject.error_bound=0.1"), "shm", "admm")
    for mode in ("minibatch", "allreduce"):
        support.refuse_unsupported(scenario("inject.drop=0.1", "inject.delay=2",
                                            "inject.error=noise", "inject.error_bound=0.5",
                                            "inject.write_bits=8",
                                            "inject.deaths=[{thread=1, at=5}]"), "shm", mode)
    with pytest.raises(ScenarioError, match=r"^devices\.0\.speed = 2\.0: "):
        support.refuse_unsupported(scenario("devices.0.name=gpu0", "devices.0.speed=2"),
                                   "shm", "lockfree")
    shm = support.recorded(scenario(), "blocklock", 2, False, None)
    assert (shm.run.threads, shm.run.protocol, shm.run.split, shm.run.write_mode,
            shm.metrics.exact) == (2, "lockfree", "even", "atomic_add", False)
    assert shm.hardware.sweeping_reads is not None  # a copy sees part of a write in flight
    sparse = support.recorded(scenario(), "lockfree", 2, True, None)
    assert sparse.hardware.sweeping_reads is None
    ps = support.recorded(scenario(), "paramserver", 3, False, 4)
    assert (ps.run.threads, ps.run.protocol, ps.metrics.exact, ps.metrics.every) == (
        3, "paramserver", True, 4)
    assert ps.hardware.sweeping_reads is None  # a pull is a consistent copy


def test_the_docs_show_the_support_table():
    """docs/semantics.md shows the one table as realrun/support.py renders it."""
    assert support.support_markdown() in (ROOT / "docs" / "semantics.md").read_text()


def test_the_real_server_and_the_simulator_share_their_rules():
    """The same function objects, not copies: the real server's round quota, staleness
    limit, warm start, rebalancing and mean step are the simulator's."""
    for name in ("mean_step", "round_quota", "too_stale", "warmed_up", "retirements"):
        assert getattr(ps, name) is getattr(rules, name), name
    assert sim_rounds.round_quota is rules.round_quota
    for name in ("too_stale", "warmed_up", "retirements"):
        assert getattr(sim_paramserver, name) is getattr(rules, name), name
    assert pool.dc_step is rules.dc_step  # (a pool's shard servers compensate their parts)


def test_a_pool_takes_every_server_option_and_a_shard_per_server():
    """A pool's coordinating server decides the staleness limit and either rule at shard 0,
    holds pulls back for a warm start, rebalances, grants accumulated pushes and closes
    rounds; another number of blocks than servers is refused, named."""
    base = ("run.protocol=paramserver", "run.blocks=2", "paramserver.servers=2")
    for rule in ("staleness_lr", "dcasgd"):
        support.refuse_unsupported(scenario(*base, "paramserver.staleness_limit=3",
                                            f"paramserver.rule={rule}"), "ps", "paramserver")
    support.refuse_unsupported(scenario(*base, "paramserver.warm_start=5",
                                        "paramserver.rebalance=1.5",
                                        "paramserver.accumulate=2"), "ps", "paramserver")
    support.refuse_unsupported(scenario(*base, "paramserver.fraction=0.5",
                                        "paramserver.warm_start=5"), "ps", "paramserver")
    with pytest.raises(ScenarioError, match=re.escape("run.blocks = 4")):
        support.refuse_unsupported(scenario(*base[:1], "run.blocks=4",
                                            "paramserver.servers=2"), "ps", "paramserver")


def test_a_round_of_25_trainers_at_fraction_056_closes_at_14_on_both_paths(monkeypatch):
    """ceil(0.56·25) is 14 (0.56·25 = 14.000000000000002 in floating point): the simulator's
    rounds hold 14 gradients, and the real server closes a round at its 14th push, not 15."""
    assert rules.round_quota(0.56, 25, 25) == 14
    simulated = simulate(load_scenario(None, [*TINY, "run.updates=280", "run.threads=25",
                                              "run.protocol=paramserver",
                                              "paramserver.fraction=0.56"]))
    sizes = np.bincount(simulated["step"][simulated["step"] > 0])[1:]
    assert sizes.max() == 14 and (sizes == 14).sum() >= len(sizes) - 1
    closed = []
    monkeypatch.setattr(ps, "_complete", lambda state, group: closed.append(len(group)))
    state = SimpleNamespace(scenario=scenario("paramserver.fraction=0.56"), trainers=25,
                            done=set(), round_pushes=[], w=np.zeros(3), version=0,
                            stalled=False, dead=[], shards=None)
    for _ in range(13):
        state.round_pushes.append(SimpleNamespace(step=np.ones(3), lost=[]))
        ps._close_round(state, 0)
    assert closed == []
    state.round_pushes.append(SimpleNamespace(step=np.ones(3), lost=[]))
    ps._close_round(state, 0)
    assert closed == [14] and np.array_equal(state.w, -np.ones(3))


def test_the_warm_start_defers_the_other_trainers_pulls(monkeypatch):
    """During a warm start of W only trainer 0 (rank 1) is answered; the others' pulls wait
    until W pushes were applied or trainer 0 finished."""
    answered = []
    monkeypatch.setattr(ps, "_answer", lambda state, source, arrived: answered.append(source))
    state = SimpleNamespace(scenario=scenario("paramserver.warm_start=3"), done=set(),
                            version=0, waiting=[], pushed_round={}, stalls=None,
                            stalled=False, dead=[], writing=0, blaster=None)
    for rank in (2, 1, 3):
        ps._pull(state, rank, 0)
    assert answered == [1] and [r for r, _ in state.waiting] == [2, 3]
    state.version = 2
    ps._release(state)
    assert answered == [1]
    state.version = 3
    ps._release(state)
    assert answered == [1, 2, 3] and state.waiting == []
    state.version, answered[:] = 0, []
    state.done = {1}
    ps._pull(state, 2, 0)
    assert answered == [2]


def test_rebalancing_retires_by_the_simulators_rule():
    """retirements: none before every working worker made `after` updates; then those whose
    mean time exceeds r times the median, keeping at least one working worker, whoever was
    retired before (the working ones are those left)."""
    busy, count = [300, 100, 110], [3, 10, 10]
    assert rules.retirements(busy, count, [0, 1, 2], 2.0, 5) == []
    count[0] = 5
    assert rules.retirements(busy, count, [0, 1, 2], 2.0, 5) == [0]
    assert rules.retirements(busy, count, [0, 1, 2], 0.0, 5) == []
    assert rules.retirements([900, 100], [5, 5], [0, 1], 2.0, 5) == []
    assert rules.retirements([100, 500], [5, 5], [0, 1], 1.2, 5) == [1]
    assert rules.retirements([100, 500, 900], [5, 5, 5], [0, 1, 2], 1.2, 5) == [2]


@pytest.mark.alone  # real worker processes
def test_a_blocklock_run_records_its_backend_mode_and_curve(tmp_path, capsys):
    """summary.json names the backend and the mode; the header prints the mode that ran (not
    "lockfree … atomic_add"); metrics.curve_points is honoured and metrics.exact says
    whether the run measured."""
    out = tmp_path / "run"
    assert main(["real", "--mode", "blocklock", "--workers", "2", "--out", str(out),
                 *TINY_SETS, "--set", "run.blocks=2", "--set", "metrics.curve_points=4"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("shm blocklock k=2 T=200 B=2 on logistic"), header
    summary = json.loads((out / "summary.json").read_text())
    assert summary["real"]["backend"] == "shm" and summary["real"]["mode"] == "blocklock"
    assert summary["exact_metrics"]["enabled"] is False
    resolved = load_scenario(out / "scenario.toml")
    assert resolved.run.write_mode == "atomic_add" and resolved.run.protocol == "lockfree"
    assert resolved.metrics.exact is False
    curve = np.load(out / "trace.npz")["curve_t"]
    assert 2 <= len(curve) <= 6


@pytest.mark.parametrize(("protocol", "says"), [
    ("paramserver", "--backend ps"), ("sandblaster", "--backend ps")])
def test_a_protocol_no_worker_mode_runs_is_refused_with_where_it_runs(protocol, says):
    s = scenario(f"run.protocol={protocol}", "run.updates=320")
    with pytest.raises(ScenarioError, match=rf"run\.protocol.*{re.escape(says)}"):
        support.refuse_unsupported(s, "shm", "lockfree")
