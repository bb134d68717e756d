"""Hogwild! Proposition 4.1 and the delayed-SGD bounds of Langford et al. 2009: formulas,
their measures from problems and traces, the checks, the learning-rate schedules they use."""

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.problems import make_problem
from simulator.scenario import load_scenario
from simulator.timing import sample_stream
from tests.conftest import scenario
from theory.asyngrad import InfeasibleError
from theory.bounds import (
    check_hogwild,
    check_langford,
    delay_and_gradient_bound,
    delay_mismatch,
    expected_regret,
    hypergraph,
    lost_writes,
    refuse_uncovered,
)
from theory.hogwild import HogwildConstants, lag_factor, step_size, updates
from theory.langford import (
    convex_regret,
    optimal_sigma,
    simple_convex_regret,
    strongly_convex_regret,
)

positive = st.floats(1e-3, 1e3)


@st.composite
def hogwild_constants(draw, tau=None):
    c = draw(st.floats(1e-3, 10.0))
    delta = draw(st.floats(1e-4, 1.0))
    k = HogwildConstants(c=c, L=c * draw(st.floats(1.0, 100.0)), M=draw(positive),
                         omega=draw(st.integers(1, 1000)), delta=delta,
                         rho=draw(st.floats(delta, 1.0)),
                         tau=draw(st.integers(0, 50)) if tau is None else tau,
                         d0=draw(positive))
    return k, draw(st.floats(1e-4, 1.0)), draw(st.floats(0.01, 0.99))


@settings(max_examples=200)
@given(hogwild_constants(tau=0))
def test_without_lag_hogwild_is_serial_sgd_with_k_log_over_c_gamma(args):
    """τ = 0: (4.2) is exactly log(L·D_0/ε)/(cγ) with γ from (4.1)."""
    k, eps, theta = args
    gamma = step_size(k, eps, theta)
    ratio = k.L * k.d0 / eps
    expected = math.log(ratio) / (k.c * gamma) if ratio > 1 else 0.0
    assert lag_factor(k) == 1.0
    try:
        count = updates(k, eps, theta)
    except InfeasibleError:  # beyond any run: refused, not overflowed
        assert expected >= 2 ** 63 * (1 - 1e-9)
        return
    assert abs(count - math.ceil(expected)) <= 1 + 1e-12 * expected


@settings(max_examples=200)
@given(hogwild_constants(), st.integers(1, 20))
def test_lag_shrinks_the_step_and_grows_the_count(args, more):
    """γ·(1 + 6ρτ + 4τ²Ω√Δ) does not depend on τ; a longer lag never helps."""
    k, eps, theta = args
    longer = HogwildConstants(**{**k.__dict__, "tau": k.tau + more})
    assert step_size(longer, eps, theta) < step_size(k, eps, theta)
    assert math.isclose(step_size(longer, eps, theta) * lag_factor(longer),
                        step_size(k, eps, theta) * lag_factor(k), rel_tol=1e-12)
    def count(constants):  # None: beyond a 64-bit count
        try:
            return updates(constants, eps, theta)
        except InfeasibleError:
            return None

    shorter_count, longer_count = count(k), count(longer)
    assert longer_count is None or (shorter_count is not None and longer_count >= shorter_count)


@pytest.mark.parametrize(("field", "changes"), [
    ("rho", {"delta": 0.5, "rho": 0.4}), ("omega", {"omega": 0.5}), ("L", {"L": 0.001}),
    ("M", {"M": 0.0}), ("tau", {"tau": -1}), ("c", {"c": math.nan})])
def test_invalid_hogwild_constants_are_named(field, changes):
    base = {"c": 0.1, "L": 1.0, "M": 1.0, "omega": 3, "delta": 0.2, "rho": 0.5, "tau": 2,
            "d0": 1.0}
    with pytest.raises(ScenarioError) as err:
        HogwildConstants(**{**base, **changes})
    assert err.value.field == field


def test_theta_and_eps_ranges():
    k = HogwildConstants(c=0.1, L=1, M=1, omega=3, delta=0.2, rho=0.5, tau=2, d0=1)
    for theta in (0.0, 1.0, math.nan):
        with pytest.raises(ScenarioError, match="theta"):
            step_size(k, 0.1, theta)
    with pytest.raises(ScenarioError, match="eps"):
        updates(k, 0.0, 0.5)


def _brute_force_sparsity(problem):
    supports = [set(problem.support(i).tolist()) for i in range(problem.n_samples)]
    n = len(supports)
    omega = max(len(s) for s in supports)
    delta = max(sum(v in s for s in supports) for v in range(problem.dim)) / n
    rho = max(sum(bool(e & other) for other in supports) for e in supports) / n
    return omega, delta, rho


@pytest.mark.parametrize("density", [0.05, 0.2])
def test_hypergraph_measures_match_a_brute_force_count(density):
    """Ω, Δ, ρ by sparse products equal a count over Python sets (chunked or not)."""
    p = make_problem(scenario("problem.name=sparse_logistic", "problem.dim=40",
                              "problem.n_samples=90", f"problem.density={density}").problem)
    omega, delta, rho = _brute_force_sparsity(p)
    for chunk in (7, 1024):
        h = hypergraph(p, chunk)
        assert (h.omega, h.samples) == (omega, 90)
        assert math.isclose(h.delta, delta) and math.isclose(h.rho, rho)
    dense = hypergraph(make_problem(scenario("problem.dim=12").problem))
    assert (dense.omega, dense.delta, dense.rho) == (12, 1.0, 1.0)


@settings(max_examples=200)
@given(positive, positive, st.integers(1, 100), st.floats(1.0, 100.0))
def test_theorem_1_at_its_sigma_is_within_the_corollary(L, F, tau, spare):
    """σ = F/(L√(2τ)) and T >= τ²: Theorem 1's four terms stay below 4FL√(τT)."""
    T = tau ** 2 * spare
    sigma = optimal_sigma(L, F, tau)
    assert convex_regret(L, F, tau, T, sigma) <= simple_convex_regret(L, F, tau, T) * (1 + 1e-12)


@settings(max_examples=100)
@given(positive, positive, st.integers(0, 50), st.floats(1.0, 1e6), positive)
def test_regret_bounds_grow_with_delay_and_horizon(L, F, tau, T, lam):
    sigma = optimal_sigma(L, F, max(tau, 1))
    for bound in (lambda t, d: convex_regret(L, F, d, t, sigma),
                  lambda t, d: strongly_convex_regret(L, F, d, t, lam)):
        assert bound(T, tau) <= bound(T * 2, tau) and bound(T, tau) < bound(T, tau + 1)


def test_langford_corollary_needs_a_delay_and_a_long_horizon():
    with pytest.raises(ScenarioError, match="tau"):
        simple_convex_regret(1, 1, 0, 100)
    with pytest.raises(ScenarioError, match="T"):
        simple_convex_regret(1, 1, 20, 100)
    with pytest.raises(ScenarioError, match="lambda"):
        strongly_convex_regret(1, 1, 1, 10, 0.0)


SERIAL = ("run.protocol=serial", "run.threads=1", "problem.dim=8", "problem.n_samples=100",
          "run.updates=400", "run.lr=0.5")


@pytest.mark.parametrize(("schedule", "factor"), [("inv_sqrt", lambda m: 1 / math.sqrt(m)),
                                                  ("inverse", lambda m: 1 / m)])
def test_lr_schedules_are_plain_sgd_with_a_decaying_rate(schedule, factor, tmp_path):
    """The engine's schedule equals a numpy SGD loop with lr·factor(m) at update m; the
    serialized view divides the factor out, so serial updates carry no gradient error."""
    s = scenario(*SERIAL, f"run.lr_schedule={schedule}")
    trace = simulate(s)
    p = make_problem(s.problem)
    stream = sample_stream(s.run.seed, 1, 0, p.n_samples)
    w = p.initial()
    for m in range(1, 401):
        w = w - s.run.lr * factor(m) * p.dense_grad(w, int(stream.take()))
    np.testing.assert_allclose(trace["w_final"], w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(trace["lr_scale"], [factor(m) for m in range(1, 401)])
    assert np.all(trace["delta_norm"][trace["measured"]] <= 1e-9 * trace["g_norm"].max())
    trace.save(tmp_path / "a.npz")
    simulate(s).save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_an_unknown_schedule_is_refused():
    """Every real backend runs the schedules (tests/realrun/test_rules.py,
    test_torch_worker.py, test_ps.py); an unknown one is one line."""
    with pytest.raises(ScenarioError, match="lr_schedule"):
        scenario("run.lr_schedule=cosine")


ROUND_ROBIN = ("problem.dim=10", "problem.n_samples=200", "run.threads=4", "run.updates=600",
               "run.lr=0.1")


def test_roundrobin_update_m_reads_the_iterate_tau_updates_back():
    """The premise of the regret computation: update m was computed at w_{max(m−1−τ, 0)},
    i.e. its staleness is min(m − 1, τ); the regret is the cumulative loss at those reads."""
    s = scenario(*ROUND_ROBIN, "run.protocol=roundrobin", "metrics.curve_points=600")
    trace = simulate(s)
    tau = 3
    np.testing.assert_array_equal(trace["staleness"], np.minimum(np.arange(600), tau))
    assert delay_and_gradient_bound([trace])[0] == tau
    f_star = make_problem(s.problem).optimum()[1]
    regret = expected_regret(trace, f_star, tau)
    loss = trace["curve_loss"]
    by_hand = [0.0]
    for m in range(1, 601):
        by_hand.append(by_hand[-1] + loss[max(m - 1 - tau, 0)] - f_star)
    np.testing.assert_allclose(regret, by_hand, rtol=1e-12)
    with pytest.raises(Exception, match="every completion"):
        expected_regret(simulate(scenario(*ROUND_ROBIN, "run.protocol=roundrobin")), f_star, 3)


def test_langford_bounds_hold_on_logistic():
    """Both theorems bound the measured expected regret at every horizon."""
    r = check_langford(scenario(*ROUND_ROBIN, "run.lr_schedule=inverse"), 4)
    assert r["tau"] == 3 and r["guarantee"]
    assert set(r["theorems"]) == {"1_convex", "2_strongly_convex"}
    for e in r["theorems"].values():
        upper, bound = np.array(e["upper"]), np.array(e["bound"])
        assert e["holds"] and np.all(upper[1:] <= bound[1:]) and e["final_mean"] > 0
    convex = r["theorems"]["1_convex"]
    assert convex["schedule"] == "inv_sqrt" and convex["lr"] == r["pilot"]["sigma"]
    assert convex["corollary"] >= convex["final_bound"]
    assert "Theorem 1 (σ/√(t−τ)) holds" in r["verdict"]


INJECTED_DELAY = ("run.updates=600", "inject.error=none")


def test_langford_refuses_the_injections_its_analysis_does_not_cover():
    """Gradient errors, lost or rounded writes, random delays and deaths: one line naming
    the inject field, before any run; the shipped injected-delay scenario carries noise."""
    shipped = load_scenario("scenarios/injected_delay.toml")
    with pytest.raises(ScenarioError, match=r"^inject\.error = 'noise': .*exact gradients"):
        check_langford(shipped, 2)
    for overrides, field in ((("inject.drop=0.1",), "inject.drop"),
                             (("inject.write_bits=8",), "inject.write_bits"),
                             (("inject.delay_dist=uniform", "inject.delay_max=3"),
                              "inject.delay_dist"),
                             (("inject.deaths=[{thread=0, at=100}]",), "inject.deaths")):
        with pytest.raises(ScenarioError, match=rf"^{field} = "):
            check_langford(scenario(*ROUND_ROBIN, *overrides), 2)
    cli = _cli("check", "--bound", "langford", "--seeds", "2", "scenarios/injected_delay.toml")
    assert cli.returncode == 2 and cli.stderr.strip().count("\n") == 0
    assert "inject.error = 'noise'" in cli.stderr


def test_langford_takes_a_fixed_injected_delay_into_tau():
    """8 threads and an injected delay of 16: the runs' staleness is min(m − 1, 23) and the
    check uses τ = 23; a plain round robin has τ = k − 1."""
    r = check_langford(load_scenario("scenarios/injected_delay.toml", INJECTED_DELAY), 2)
    assert (r["threads"], r["injected_delay"], r["tau"]) == (8, 16, 23)
    for e in r["theorems"].values():
        assert e["delay_as_assumed"] and e["delay_mismatch"] is None and e["holds"]
    assert r["guarantee"]
    plain = check_langford(scenario(*ROUND_ROBIN), 2)
    assert (plain["tau"], plain["injected_delay"]) == (3, 0)
    assert all(e["delay_as_assumed"] for e in plain["theorems"].values())


def test_langford_claims_nothing_when_the_runs_delay_is_not_tau(monkeypatch):
    """A τ that leaves out the injected delay (k − 1 = 7 where the runs have 23) is caught
    by the runs' staleness: no theorem holds or fails, and no guarantee."""
    monkeypatch.setattr("theory.bounds.langford_delay", lambda inject: 0)
    r = check_langford(load_scenario("scenarios/injected_delay.toml", INJECTED_DELAY), 2)
    assert r["tau"] == 7 and not r["guarantee"]
    for e in r["theorems"].values():
        assert e["holds"] is None and not e["delay_as_assumed"]
        assert e["delay_mismatch"] == {"run": 0, "update": 9, "staleness": 8, "expected": 7}
    assert "do not have the delay τ = 7" in r["verdict"] and "holds" not in r["verdict"]


def test_delay_mismatch_finds_the_first_update_off_the_delay():
    """A round robin of 4 threads has min(m − 1, 3) everywhere; against τ = 2 its update 4
    is the first off."""
    trace = simulate(scenario(*ROUND_ROBIN, "run.protocol=roundrobin"))
    assert delay_mismatch([trace], 3) is None
    assert delay_mismatch([trace], 2) == {"run": 0, "update": 4, "staleness": 3,
                                          "expected": 2}


def test_langford_claims_nothing_on_a_nonconvex_model():
    r = check_langford(scenario("problem.name=mlp", "problem.dim=5", "problem.n_samples=60",
                                "problem.hidden=4"), 3)
    assert not r["guarantee"] and r["verdict"].startswith("no guarantee: f is not convex")


QUADRATIC = ("problem.name=quadratic", "problem.dim=2", "problem.n_samples=50",
             "problem.l2=1.0", "run.updates=500", "run.lr=0.05")


def test_hogwild_validates_on_a_small_quadratic():
    """One thread (τ = 0): (4.2)'s k is small enough to run, and the bound holds."""
    r = check_hogwild(scenario(*QUADRATIC, "run.threads=1"), 0.05, 4)
    last = r["rounds"][-1]
    assert r["guarantee"] and r["verdict"].startswith("holds")
    assert last["tau"] == 0 and last["ran_updates"] == last["updates"] > 0
    assert r["validation"]["final_upper"] <= 0.05
    assert r["conditions"]["sparsity"] == {"omega": 2, "delta": 1.0, "rho": 1.0, "samples": 50}


def test_hogwild_start_within_eps_runs_nothing():
    """L·D_0 <= ε: (4.2) gives k = 0 whatever τ and M, so the bound holds at x_0 and nothing
    runs (it ran one update and judged it; then it ran the pilots, and pilots that lost
    writes claimed no guarantee)."""
    for threads in ("1", "8"):
        r = check_hogwild(scenario(*QUADRATIC, f"run.threads={threads}"), 50.0, 2)
        assert r["guarantee"] and r["rounds"] == [] and "validation" not in r
        assert r["verdict"].startswith("holds: L·D_0 = ") and "nothing was run" in r["verdict"]


def test_hogwild_with_lag_says_when_k_is_beyond_reach():
    """Four lock-free threads (atomic adds): the lag factor makes k too large for
    --max-updates; the check runs what it may and says it did not validate."""
    r = check_hogwild(scenario(*QUADRATIC, "run.threads=4", "run.write_mode=atomic_add"), 0.05,
                      2, max_updates=300)
    last = r["rounds"][-1]
    assert last["tau"] >= 1 and last["lag_factor"] > 1
    assert last["ran_updates"] == 300 < last["updates"]
    assert r["verdict"].startswith("not validated at k")
    nonconvex = check_hogwild(scenario("problem.name=mlp", "problem.dim=5",
                                       "problem.n_samples=60", "problem.hidden=4"), 0.05, 2)
    assert not nonconvex["guarantee"] and "not strongly convex" in nonconvex["verdict"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_theorem_for_each_bound():
    hog = _cli("theorem", "--bound", "hogwild", "--c", "0.01", "--L", "0.02", "--M", "2.2",
               "--omega", "2", "--delta", "0.024", "--rho", "0.04", "--tau", "8", "--d0", "9.9",
               "--eps", "0.05", "--json")
    assert hog.returncode == 0, hog.stderr
    data = json.loads(hog.stdout)
    k = HogwildConstants(c=0.01, L=0.02, M=2.2, omega=2, delta=0.024, rho=0.04, tau=8, d0=9.9)
    assert data["gamma"] == step_size(k, 0.05) and data["updates"] == updates(k, 0.05)
    lang = _cli("theorem", "--bound", "langford", "--L", "4", "--F", "3", "--tau", "3",
                "--T", "1000", "--lambda", "0.1")
    assert lang.returncode == 0 and "Theorem 2" in lang.stdout and "4FL√(τT)" in lang.stdout
    for args, needle in ((("--bound", "langford", "--L", "4", "--F", "3", "--tau", "3"),
                          "--T = None: is required by --bound langford"),
                         (("--bound", "hogwild", *itertools.chain.from_iterable(
                             (f"--{n}", "1") for n in ("c", "L", "M", "omega", "delta", "rho",
                                                       "tau", "d0", "eps"))), "theta")):
        bad = _cli("theorem", *args, *(["--theta", "1"] if needle == "theta" else []))
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
        assert needle in bad.stderr


def test_cli_check_langford_writes_json_and_plot(tmp_path):
    out = tmp_path / "lang"
    result = _cli("check", "--bound", "langford", "--seeds", "3", "--out", str(out),
                  *itertools.chain.from_iterable(("--set", o) for o in ROUND_ROBIN))
    assert result.returncode == 0, result.stderr
    assert "Theorem 1: lr" in result.stdout and "Theorem 2: lr" in result.stdout
    data = json.loads((out / "check.json").read_text())
    assert data["bound"] == "langford" and data["guarantee"]
    assert (out / "check.png").read_bytes()[:4] == b"\x89PNG"
    bad = _cli("check", "--bound", "hogwild", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--eps = None" in bad.stderr
    assert not (tmp_path / "bad").exists()


SERIAL_QUADRATIC = ("problem.name=quadratic", "problem.dim=10", "problem.n_samples=100",
                    "run.protocol=serial", "run.threads=1", "run.updates=300")


def test_hogwild_refuses_the_injections_its_analysis_does_not_cover():
    """Injected gradient errors, dropped and rounded writes: one line naming the inject
    field, before any run, by the rule the delayed-SGD check uses; a delay is measured."""
    for overrides, field in ((("inject.error=adversarial", "inject.error_bound=2"),
                              "inject.error"),
                             (("inject.drop=0.1",), "inject.drop"),
                             (("inject.write_bits=8",), "inject.write_bits")):
        with pytest.raises(ScenarioError, match=rf"^{field} = .*Hogwild!'s analysis"):
            check_hogwild(scenario(*SERIAL_QUADRATIC, *overrides), 1.0, 2)
    refuse_uncovered(scenario(*SERIAL_QUADRATIC, "inject.delay=3").inject, "hogwild")
    with pytest.raises(ScenarioError, match=r"^inject\.delay_dist = 'uniform'"):
        refuse_uncovered(scenario(*SERIAL_QUADRATIC, "inject.delay_dist=uniform",
                                  "inject.delay_max=3").inject, "langford")


def test_hogwild_claims_nothing_where_writes_were_lost():
    """Lock-free load_store writes of several threads overwrite each other, which
    Proposition 4.1 does not allow: the pilot runs' lost stores give no guarantee and no
    validation; a protocol that never lets writes overlap (locked) loses none whatever its
    write mode, and is judged."""
    lossy = scenario(*QUADRATIC, "run.threads=4", "run.write_mode=load_store")
    r = check_hogwild(lossy, 0.05, 2)
    assert not r["guarantee"] and r["rounds"] == [] and "validation" not in r
    assert r["verdict"].startswith("no guarantee: the 3 pilot runs lost ")
    locked = check_hogwild(scenario(*QUADRATIC, "run.threads=4", "run.protocol=locked",
                                    "run.write_mode=load_store"), 0.05, 2)
    assert locked["rounds"] and "lost" not in locked["verdict"]
    assert lost_writes([simulate(scenario(*QUADRATIC, "run.write_mode=atomic_add"))],
                       "runs") is None


def test_hogwild_and_langford_claim_nothing_when_a_pilot_diverges():
    """A pilot run that diverges at the scenario's lr: no guarantee, saying which run, not
    a constant refused as if it were bad input."""
    hog = check_hogwild(scenario(*SERIAL_QUADRATIC, "run.lr=5"), 0.1, 2, pilot_seeds=1)
    assert not hog["guarantee"] and hog["rounds"] == []
    assert hog["verdict"].startswith("no guarantee: τ and M cannot be measured, pilot run 1 "
                                     "of 1 diverged at update")
    lang = check_langford(scenario(*ROUND_ROBIN, "run.lr=1e3"), 2, pilot_seeds=1)
    assert not lang["guarantee"] and lang["theorems"] == {}
    assert lang["verdict"].startswith("no guarantee: L and F cannot be measured, pilot run 1")


def test_hogwild_counts_beyond_floating_point_are_refused():
    """A denominator c²ϑε of (4.2) that underflows to 0 is a count beyond any run, not a
    division by zero; squares that no float holds are refused with the constant named."""
    tiny_c = HogwildConstants(c=1e-150, L=1, M=1, omega=1, delta=1, rho=1, tau=0, d0=10)
    with pytest.raises(InfeasibleError, match=r"Proposition 4\.1 asks for inf updates"):
        updates(tiny_c, 1e-30)
    for field, value in (("M", 1e200), ("M", 1e-200), ("c", 1e-170)):
        fields = {"c": 1.0, "L": 1.0, "M": 1.0, "omega": 1, "delta": 1, "rho": 1, "tau": 0,
                  "d0": 10, field: value}
        with pytest.raises(ScenarioError, match=rf"^{field} = .*square"):
            HogwildConstants(**fields)
