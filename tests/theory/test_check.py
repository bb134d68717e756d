"""Theorem 1 checked on simulated runs: conditions, Monte Carlo validation, honest refusals."""

import json
import subprocess
import sys

import pytest

from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.problems import QuadraticProblem, make_problem
from tests.conftest import scenario
from theory.asyngrad import Constants, updates
from theory.bounds import check_hogwild
from theory.check import check_theorem, completions, pilot_runs, remeasured_constants
from theory.estimators import initial_distance, serialized_constants

SMALL = ("problem.dim=10", "problem.n_samples=200", "run.updates=2000")
QUADRATIC = ("problem.name=quadratic", "problem.l2=0.5", *SMALL)


@pytest.fixture(scope="module")
def quadratic_atomic():
    return check_theorem(scenario(*QUADRATIC, "run.write_mode=atomic_add"), 0.05, 10)


def test_bound_holds_on_lock_free_quadratic(quadratic_atomic):
    """Lock-free k=8 (atomic_add): the assumptions hold in the validation runs and the mean
    suboptimality after t updates is below ε with its one-sided 95% bound."""
    r = quadratic_atomic
    assert r["guarantee"] and r["verdict"].startswith("holds")
    v = r["validation"]
    assert v["final_upper"] <= 0.05 and r["rounds"][-1]["ran_updates"] == r["rounds"][-1]["updates"]
    assert 0 < v["tightness"] <= 1


def test_recursion_bound_dominates_a_t_on_the_quadratic(quadratic_atomic):
    """With exact c and q, the mean of ‖w_t − w*‖² stays under the recursion's bound."""
    assert quadratic_atomic["conditions"]["4_strong_convexity"]["method"] == "closed form"
    assert quadratic_atomic["validation"]["a_t_within_bound"] is True


def test_bound_holds_on_lock_free_logistic():
    """The same on dense logistic regression (closed-form c = λ, q a bound)."""
    r = check_theorem(scenario("problem.l2=0.1", *SMALL, "run.write_mode=atomic_add"), 0.05, 10)
    assert r["guarantee"] and r["verdict"].startswith("holds")
    assert r["validation"]["final_upper"] <= 0.05


def test_lost_updates_push_tau_past_the_limit():
    """load_store loses stores; the measured τ exceeds cε/(2q) and no guarantee is claimed,
    while the empirical result is still reported."""
    r = check_theorem(scenario(*QUADRATIC), 0.05, 10)
    assert not r["guarantee"] and r["verdict"].startswith("no guarantee")
    last = r["rounds"][-1]
    assert "infeasible" in last and last["tau"] > last["tau_limit"]


def _few_updates_eps(s):
    """An ε just below q·a_0 on ``s``'s problem, where t (10) is a few updates."""
    problem = make_problem(s.problem)
    kappa2, _ = serialized_constants(pilot_runs(s, problem, 3, None))
    k = Constants(problem.strong_convexity, problem.smoothness, kappa2.upper, 0.0,
                  initial_distance(problem, problem.initial()))
    eps = 0.995 * k.q * k.a0
    assert 1 <= updates(k, eps) <= 9
    return eps


def test_few_updates_remeasure_the_constants_in_fewer_windows():
    """t (10) below 10 updates: κ² and τ are measured again in the validation runs, in as many
    windows as each run has measured updates, and the guarantee rests on them."""
    s = scenario(*QUADRATIC)
    r = check_theorem(s, _few_updates_eps(s), 3)
    last = r["rounds"][-1]
    assert last["ran_updates"] <= 9 and last["measured"]["windows"] == last["ran_updates"]
    assert last["assumptions_held"] == (last["measured"]["kappa2"] <= last["kappa2"]
                                        and last["measured"]["tau"] <= last["tau"] + 1e-9
                                        * last["tau_limit"])
    assert r["guarantee"] == last["assumptions_held"]


def test_constants_not_remeasured_claim_no_guarantee(monkeypatch):
    """Validation runs the constants cannot be estimated from (no measured update, e.g.
    metrics.exact off) are not taken to hold them: no guarantee, and the verdict says why."""
    runs = [simulate(scenario(*QUADRATIC, "run.updates=20", "metrics.exact=false",
                              f"run.seed={seed}")) for seed in range(2)]
    assert not any(r["measured"].any() for r in runs)
    assert remeasured_constants(runs) is None
    s = scenario(*QUADRATIC)
    eps = _few_updates_eps(s)
    monkeypatch.setattr("theory.check.remeasured_constants", lambda runs: None)
    r = check_theorem(s, eps, 3)
    last = r["rounds"][-1]
    assert last["measured"] is None and last["assumptions_held"] is None
    assert not r["guarantee"]
    assert r["verdict"].startswith("no guarantee: κ² and τ could not be measured again")


def test_minibatch_validation_makes_t_updates_of_w():
    """t (10) counts updates of w; a minibatch of k gradients is one. The validation runs
    compute as many gradients per update as the pilot runs did, so they reach t: before,
    they ran t gradients (t/4 updates of w) and the verdict said VIOLATED after t updates."""
    r = check_theorem(scenario(*QUADRATIC, "run.protocol=minibatch", "run.threads=4"),
                      0.05, 3)
    last, v = r["rounds"][-1], r["validation"]
    assert v["reached"] == last["ran_updates"] == v["checkpoints"][-1]
    assert r["verdict"].startswith("holds") and r["guarantee"]


def test_runs_that_stop_short_of_t_are_not_taken_as_validated():
    """A thread that dies leaves the other (split even, locked) to stop with its share: the
    runs end short of t, at different updates. The mean is taken where every run has a
    checkpoint (averaging curves of different lengths crashed) and the verdict says the
    bound was not validated at t instead of VIOLATED."""
    r = check_theorem(scenario(*QUADRATIC, "run.protocol=locked", "run.threads=2",
                               "run.split=even", "inject.deaths=[{thread=1, at=3000000}]"),
                      0.05, 3)
    v = r["validation"]
    assert v["reached"] < r["rounds"][-1]["ran_updates"]
    assert v["final_at"] == v["checkpoints"][-1] == v["reached"]  # the shortest run's end
    assert r["verdict"].startswith("not validated at t")


def test_runs_at_their_own_rates_are_read_where_they_all_are():
    """A server that discards stale pushes turns gradients into updates of w at a rate of
    its own in each run: the runs are planned with a margin, reach t, and are read on the
    grid of the run with the fewest updates, at the last checkpoint by t (the checkpoints
    that all runs shared were a handful of early ones, and the verdict read 310 of 484)."""
    r = check_theorem(scenario("problem.name=quadratic", "problem.dim=10", "run.updates=1000",
                               "run.threads=4", "run.protocol=paramserver",
                               "paramserver.staleness_limit=2"), 0.5, 3, pilot_seeds=2)
    last, v = r["rounds"][-1], r["validation"]
    assert v["reached"] >= last["ran_updates"] and len(v["checkpoints"]) > 50
    assert 0.97 * last["ran_updates"] <= v["final_at"] <= last["ran_updates"]
    assert r["verdict"].startswith(("holds", "VIOLATED")) and f"{v['final_at']:,}" in r["verdict"]


def test_validation_runs_fit_this_machine(monkeypatch):
    """A minibatch of 4 computes 4 gradients per update of w: where t's gradients would not
    fit one run here, fewer updates run and the verdict says so (the run was refused after
    the pilots, naming run.updates, a field the user never set)."""
    monkeypatch.setattr("theory.check.budget_max_updates", lambda: 400)
    r = check_theorem(scenario(*QUADRATIC, "run.protocol=minibatch", "run.threads=4",
                               "run.updates=400"), 0.05, 2, max_updates=400)
    last = r["rounds"][-1]
    assert last["ran_updates"] == 100 < last["updates"]
    assert "the gradients one run can hold here" in r["verdict"]


@pytest.mark.parametrize(("override", "field"), [
    ("run.lr_schedule=inverse", "run.lr_schedule"), ("run.protocol=staleness_lr", "run.protocol"),
    ("run.protocol=admm", "run.protocol"),
    (("run.protocol=paramserver", "paramserver.rule=staleness_lr"), "paramserver.rule"),
    (("run.protocol=amp", "problem.name=mlp", "run.threads=2", "run.blocks=2"),
     "run.protocol")])
def test_a_step_that_is_not_gamma_times_s_is_refused(override, field):
    """Theorem 1's iteration is w_t = w_{t−1} − γ s_t with one γ: a schedule or a
    staleness-scaled step ran the validation at another rate (VIOLATED with a guarantee);
    ADMM's local solves are not SGD steps (refused after the pilots as "0 measured updates",
    asking for metrics.exact, which was on), nor are amp's stage updates full ones.
    Hogwild!'s check refuses them too."""
    overrides = (override,) if isinstance(override, str) else override
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        check_theorem(scenario(*QUADRATIC, *overrides), 0.05, 2)
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        check_hogwild(scenario(*QUADRATIC, *overrides), 0.05, 2)


def test_a_diverging_pilot_claims_nothing():
    """At lr = 5 the pilot runs diverge: no guarantee, saying so (it was refused as bad input,
    κ² = nan)."""
    r = check_theorem(scenario(*QUADRATIC, "run.lr=5", "run.protocol=serial",
                               "run.threads=1"), 0.05, 2)
    assert not r["guarantee"] and "diverged at update" in r["verdict"]
    assert r["rounds"] == []


def test_a_start_within_eps_runs_nothing():
    """q·a_0 <= ε: (10) gives t = 0 whatever κ² and τ, so the bound holds at w_0 and nothing
    runs, not even the pilots (a pilot that diverged, at lr = 5, claimed no guarantee)."""
    for lr in ("0.05", "5"):
        r = check_theorem(scenario(*QUADRATIC, "run.protocol=serial", "run.threads=1",
                                   f"run.lr={lr}"), 50.0, 2)
        assert r["guarantee"] and r["rounds"] == [] and "validation" not in r
        assert r["verdict"].startswith("holds: (q/2)·a_0") and "nothing was run" in r["verdict"]


def test_a_short_pilot_is_measured_in_fewer_windows():
    """Five updates per pilot run: five windows (ten left windows empty and was refused as
    if metrics were off)."""
    s = scenario(*QUADRATIC, "run.protocol=serial", "run.threads=1", "run.updates=5")
    pilot = pilot_runs(s, make_problem(s.problem), 3, None)
    assert [completions(run) for run in pilot] == [5, 5, 5]
    r = check_theorem(s, 0.05, 2)
    assert r["rounds"][0]["tau_window"] < 5 and "validation" in r


def test_nonconvex_problem_gets_no_guarantee():
    """A quadratic with a negative-definite direction fails condition (4) and runs nothing."""
    s = scenario("problem.name=quadratic", "problem.dim=6", "problem.n_samples=100")
    r = check_theorem(s, 0.05, 5, problem=QuadraticProblem(6, 100, -5.0, seed=0))
    assert not r["guarantee"] and "condition (4) fails" in r["verdict"]
    assert r["rounds"] == [] and "validation" not in r


@pytest.mark.parametrize(("kwargs", "field"), [({"beta": 0.5}, "beta"), ({"eps": 0.0}, "eps"),
                                               ({"seeds": 1}, "--seeds")])
def test_invalid_check_arguments(kwargs, field):
    """β < 1, ε <= 0 and fewer than two seeds are refused with the field named."""
    args = {"eps": 0.05, "seeds": 5, **kwargs}
    eps, seeds = args.pop("eps"), args.pop("seeds")
    with pytest.raises(ScenarioError) as err:
        check_theorem(scenario(*QUADRATIC), eps, seeds, **args)
    assert err.value.field == field


def test_cli_check_writes_json_and_plot(tmp_path):
    """`asyngrad check` prints the conditions and writes check.json and check.png."""
    out = tmp_path / "check"
    result = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "check", "--eps", "0.05", "--seeds", "4",
         "--out", str(out), *[x for o in (*QUADRATIC, "run.write_mode=atomic_add")
                              for x in ("--set", o)]],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "(7) τ" in result.stdout and "round 0" in result.stdout
    data = json.loads((out / "check.json").read_text())
    assert data["eps"] == 0.05 and data["seeds"] == 4
    assert (out / "check.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "check", "--eps", "-1",
                          "--out", str(tmp_path / "bad")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "eps = -1.0" in bad.stderr and not (tmp_path / "bad").exists()


def test_the_mlp_gets_no_guarantee():
    """A nonconvex model: condition (4) is reported as failing; nothing is claimed."""
    r = check_theorem(scenario("problem.name=mlp", "problem.dim=5", "problem.n_samples=60",
                               "problem.hidden=4"), 0.05, 3)
    assert not r["guarantee"] and "condition (4) fails" in r["verdict"]
    assert r["conditions"]["4_strong_convexity"]["method"].startswith("nonconvex")


def _shown(rounds):
    """A check result whose last validated runs are tiny with a wide band (two seeds)."""
    x = list(range(0, 1000, 100))
    mean = [1.0, 0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 1e-3, 1e-3, 1e-3]
    half = [0.1, 0.1, 0.1, 0.05, 0.02, 0.01, 2e-3, 5e-3, 5e-4, 1e-3]  # lower edge <= 0
    validation = {"checkpoints": x, "mean": mean, "half_width": half,
                  "upper": [m + h for m, h in zip(mean, half, strict=True)],
                  "envelope": None, "reached_eps_at": 400}
    rounds[0]["validation"] = validation
    return {"scenario": "hand", "eps": 0.01, "seeds": 2, "rounds": rounds,
            "validation": validation, "verdict": ""}


def test_check_plot_clips_the_band_and_titles_the_gamma_the_runs_used():
    """The band's lower edge, zero or below with few seeds, stops a decade under the lowest
    curve instead of at 1e-308; the title gives the γ the runs used and says when (9) has no
    γ for the constants re-measured in them."""
    from theory.plots import check_figure

    ran = {"gamma": 0.0629, "updates": 900, "ran_updates": 900}
    fig = check_figure(_shown([dict(ran), {"infeasible": "2τq >= cε"}]))
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == pytest.approx(1e-4)  # the lowest curve, 1e-3, over 10
    title = ax.get_title()
    assert "runs at γ = 0.0629" in title and "no γ by (9)" in title
    held = check_figure(_shown([dict(ran, assumptions_held=True)])).axes[0].get_title()
    assert "runs at γ = 0.0629" in held and "no γ" not in held
