"""Injected delays and gradient errors: exact on small serial cases, recorded in the trace."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.metrics import relative_error
from simulator.problems import make_problem
from simulator.rules import round_significand, staleness_scale
from tests.conftest import CONSTANT, scenario

SERIAL = ("problem.name=quadratic", "problem.dim=6", "problem.n_samples=40", "run.lr=0.05",
          "run.protocol=serial", "run.updates=60", "metrics.curve_points=0", *CONSTANT)


def run(*overrides: str):
    s = scenario(*SERIAL, *overrides)
    problem = make_problem(s.problem)
    return s, problem, simulate(s, problem)


@pytest.mark.parametrize("tau", [1, 4])
def test_fixed_delay_gives_exactly_that_staleness(tau):
    s, problem, trace = run(f"inject.delay={tau}")
    expected = [min(t, tau) for t in range(60)]
    assert trace["staleness"].tolist() == expected
    assert trace["delay"].tolist() == expected
    ws = [problem.initial()]
    for t, sample in enumerate(trace["sample"].tolist(), start=1):
        step = problem.grad(ws[max(t - 1 - tau, 0)].copy(), sample)[0]
        step *= s.run.lr
        ws.append(ws[-1] - step)
    assert np.array_equal(ws[-1], trace["w_final"])


def test_fixed_delay_adds_to_concurrency_staleness():
    base = scenario("run.updates=400", "problem.dim=10")
    delayed = scenario("run.updates=400", "problem.dim=10", "inject.delay=5")
    a, b = simulate(base), simulate(delayed)
    # The same timings and samples; every read after the fifth completion is 5 older.
    assert np.array_equal(a["write_end"], b["write_end"])
    late = b["delay"] == 5
    assert late.sum() > 380
    order = np.argsort(b["uid"])
    assert np.array_equal(b["staleness"][order] - b["delay"][order],
                          a["staleness"][np.argsort(a["uid"])])


def test_random_delay_within_bounds_and_seeded():
    _, _, trace = run("inject.delay=2", "inject.delay_dist=uniform", "inject.delay_max=6")
    later = trace["delay"][6:]
    assert later.min() >= 2 and later.max() <= 6 and len(set(later.tolist())) == 5
    assert trace["staleness"].tolist() == trace["delay"].tolist()
    _, _, again = run("inject.delay=2", "inject.delay_dist=uniform", "inject.delay_max=6")
    assert np.array_equal(trace["delay"], again["delay"])


def test_noise_is_exactly_the_bound_and_is_the_gradient_error():
    _, _, absolute = run("inject.error=noise", "inject.error_bound=0.3")
    assert np.allclose(absolute["error_norm"], 0.3, rtol=0, atol=0)
    # Serial: δ_t is exactly the injected error.
    assert np.allclose(absolute["delta_norm"], 0.3, rtol=1e-9)
    _, _, relative = run("inject.error=noise", "inject.error_bound=0.5",
                         "inject.error_relative=true")
    assert np.allclose(relative["error_norm"], 0.5 * relative["g_norm"], rtol=1e-12)
    assert np.allclose(relative["delta_norm"], relative["error_norm"], rtol=1e-9)


def test_adversarial_error_is_within_bound_and_does_more_harm_than_noise():
    """⟨δ, w − w*⟩ = −bound·‖w − w*‖ (the most harmful direction), so ⟨w − w*, s⟩ is
    smaller than under random noise of the same norm, and the run ends further away."""
    _, _, adv = run("inject.error=adversarial", "inject.error_bound=0.2", "run.updates=300")
    _, _, noise = run("inject.error=noise", "inject.error_bound=0.2", "run.updates=300")
    assert np.allclose(adv["delta_norm"], 0.2, rtol=1e-9)
    assert adv["delta_dot"].mean() < noise["delta_dot"].mean() < 0.05
    # Along its own path the adversary's ⟨δ, w − w*⟩ is −bound·‖w − w*‖ at every step.
    _, problem, _ = run()
    w_star = problem.optimum()[0]
    assert adv["delta_dot"][0] == pytest.approx(-0.2 * np.linalg.norm(adv["w0"] - w_star))
    gap_adv = np.linalg.norm(adv["w_final"] - w_star)
    gap_noise = np.linalg.norm(noise["w_final"] - w_star)
    assert gap_adv > gap_noise


def test_dropped_writes_apply_nothing():
    _, _, trace = run("inject.drop=0.3", "run.updates=400")
    dropped = trace["dropped"]
    assert 0.2 < dropped.mean() < 0.4
    assert (trace["s_norm"][dropped] == 0).all()
    assert np.allclose(trace["delta_norm"][dropped], trace["g_norm"][dropped])
    assert (trace["s_norm"][~dropped] > 0).all()
    assert (trace["write_end"] - trace["write_start"] == 2000).all()  # the time still passes


def test_low_precision_writes_round_every_stored_value():
    values = np.array([1 + 2.0 ** -10, 3.0, -0.1, 0.0])
    round_significand(values, 8)
    assert values.tolist() == [1.0, 3.0, -0.10009765625, 0.0]
    for bits in (8, 11):
        _, _, trace = run(f"inject.write_bits={bits}", "run.protocol=lockfree",
                          "run.threads=3")
        w = trace["w_final"].copy()
        round_significand(w, bits)
        assert np.array_equal(w, trace["w_final"])
    _, _, full = run()
    _, _, coarse = run("inject.write_bits=8")
    assert not np.array_equal(full["w_final"], coarse["w_final"])


def test_stragglers_pauses_and_deaths():
    _, _, trace = run("run.protocol=lockfree", "run.threads=3",
                      "inject.stragglers=[{thread=1, factor=4}]")
    assert set(trace["grad_ns"][trace["thread"] == 1].tolist()) == {24000}
    assert set(trace["grad_ns"][trace["thread"] != 1].tolist()) == {6000}

    _, _, paused = run("run.protocol=lockfree", "run.threads=2",
                       "inject.pauses=[{thread=0, start=5000, end=60000}]")
    mine = paused["thread"] == 0
    for column in ("read_start", "grad_start", "write_start"):
        starts = paused[column][mine]
        assert not ((starts >= 5000) & (starts < 60000)).any()
    assert (paused["thread"][paused["write_end"] < 60000] == 1).sum() >= 5

    _, _, dead = run("run.protocol=lockfree", "run.threads=3",
                     "inject.deaths=[{thread=2, at=25000}]")
    assert dead["extra_dead_threads"].tolist() == [2]
    assert dead["write_end"][dead["thread"] == 2].max() <= 25000
    assert len(dead) == 59  # the update thread 2 had in flight was abandoned

    _, _, device = run("run.protocol=lockfree", "run.threads=4",
                       "devices=[{name='a'}, {name='b'}]",
                       "inject.deaths=[{device=1, at=1}]")
    assert device["extra_dead_threads"].tolist() == [1, 3]
    assert set(device["thread"].tolist()) == {0, 2}


def test_injection_is_validated():
    with pytest.raises(ScenarioError, match=r"inject\.stragglers.0.thread = 9"):
        scenario("inject.stragglers=[{thread=9, factor=2}]")
    with pytest.raises(ScenarioError, match=r"inject\.error = 'gauss'"):
        scenario("inject.error=gauss")
    with pytest.raises(ScenarioError, match=r"inject\.delay_max = 1"):
        scenario("inject.delay=3", "inject.delay_dist=uniform", "inject.delay_max=1")
    with pytest.raises(ScenarioError, match=r"inject\.pauses.0.end = 5"):
        scenario("inject.pauses=[{thread=0, start=10, end=5}]")


def test_injected_runs_are_deterministic(tmp_path):
    overrides = ("inject.delay=1", "inject.delay_dist=uniform", "inject.delay_max=3",
                 "inject.error=noise", "inject.error_bound=0.1", "inject.drop=0.1",
                 "inject.write_bits=20", "inject.stragglers=[{thread=1, factor=3}]",
                 "inject.pauses=[{thread=2, start=1000, end=9000}]",
                 "inject.deaths=[{thread=3, at=200000}]", "run.updates=500")
    a, b = simulate(scenario(*overrides)), simulate(scenario(*overrides))
    a.save(tmp_path / "a.npz")
    b.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_injection_streams_leave_samples_and_timings_alone():
    """Errors, drops and delays draw from their own streams: each thread draws the same
    samples with the same durations as in the plain run."""
    plain = simulate(scenario("run.updates=300"))
    injected = simulate(scenario("run.updates=300", "inject.delay=2", "inject.error=noise",
                                 "inject.error_bound=0.1", "inject.drop=0.2"))

    def by_thread(trace):
        order = np.lexsort((trace["thread_seq"], trace["thread"]))
        return trace["sample"][order], trace["grad_ns"][order], trace["op_read_ns"]

    for a, b in zip(by_thread(plain), by_thread(injected), strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(plain["write_end"], injected["write_end"])
    assert not np.array_equal(plain["w_final"], injected["w_final"])


def test_a_paused_thread_applies_its_rule_when_its_write_begins():
    """staleness_lr with thread 0 paused from within its first gradient (ends at 8,000 ns)
    until 59,000 ns, while thread 1 completes an update every 10,000 ns: thread 0's write
    begins after the pause and is scaled for the 5 completions made by then (not for the
    none made when its gradient ended)."""
    _, _, trace = run("run.protocol=staleness_lr", "run.threads=2",
                      "inject.pauses=[{thread=0, start=5000, end=59000}]")
    first = int(np.flatnonzero(trace["thread"] == 0)[0])
    assert trace["grad_end"][first] == 8000 and trace["write_start"][first] == 59000
    before = int((trace["write_end"][trace["step"] > 0] <= 59000).sum())
    assert before == 5 and trace["lr_scale"][first] == staleness_scale(before)


@pytest.mark.parametrize("seed", range(6))
def test_a_paused_read_belongs_to_the_round_open_when_it_begins(seed):
    """Parameter-server rounds (2 of 4 workers) after a warm start, two workers paused: a
    worker let through the round gate during its pause reads when the pause ends and belongs
    to the round open then, so no read begins inside a round's write and every applied
    gradient was computed on its round's vector (seeds 1 and 2 read inside a write when the
    round was the one of the gate's first answer)."""
    s = scenario("problem.dim=20", "run.threads=4", "run.updates=300", f"run.seed={seed}",
                 "run.blocks=2", "run.protocol=paramserver", "paramserver.fraction=0.5",
                 "paramserver.warm_start=3", "inject.pauses=[{thread=1, start=3000, "
                 "end=40000}, {thread=2, start=20000, end=90000}]")
    t = simulate(s)
    applied = t["step"] > 0
    assert (t["staleness"][applied] == 0).all()
    writes = [(t["write_start"][i], t["write_end"][i]) for i in np.flatnonzero(applied)]
    assert not any(a < r < b for r in t["read_start"] for a, b in writes)


@pytest.mark.parametrize("seed", range(3))
def test_minibatch_rounds_wait_for_paused_workers(seed):
    """Synchronous minibatch with two of four workers paused: the barrier waits for them, so
    every round averages all four gradients, read on the round's own vector (staleness 0,
    ‖δ‖/‖g‖ at rounding level); no read begins inside a round's write, and a paused worker
    starts no read, gradient or write of its own inside its pause."""
    pauses = {1: (3000, 40000), 2: (20000, 90000)}
    s = scenario("problem.dim=20", "run.threads=4", "run.updates=200", f"run.seed={seed}",
                 "run.blocks=2", "run.protocol=minibatch", "inject.pauses=[" + ", ".join(
                     f"{{thread={k}, start={a}, end={b}}}" for k, (a, b) in pauses.items())
                 + "]")
    t = simulate(s)
    assert (t["step"] > 0).all() and (t["staleness"] == 0).all()
    assert set(np.unique(t["step"], return_counts=True)[1].tolist()) == {4}
    assert np.nanmax(relative_error(t)) < 1e-12
    own = t["write_end"] > t["write_start"]  # the round's writer (the others join its write)
    assert own.sum() == 50
    assert not any(a < r < b for r in t["read_start"]
                   for a, b in zip(t["write_start"][own], t["write_end"][own], strict=True))
    for thread, (start, end) in pauses.items():
        mine = t["thread"] == thread
        for column, rows in (("read_start", mine), ("grad_start", mine),
                             ("write_start", mine & own)):
            began = t[column][rows]
            assert not ((began >= start) & (began < end)).any(), column
