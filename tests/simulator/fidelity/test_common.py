"""Common factors (``timing.*_common``, ``common_ns``): durations drawn at each phase's start
keep their distribution, draws that start together go together as the scenario says, runs
stay deterministic and replay bit for bit, and calibration recovers the factors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats

from simulator.cli import main
from simulator.distributions import Duration
from simulator.engine import simulate
from simulator.errors import ScenarioError
from simulator.fidelity.calibrate import calibrate
from simulator.fidelity.common import fit_common
from simulator.fidelity.report import calibrated_toml
from simulator.metrics import interference, trace_rhythm
from simulator.scenario import load_scenario
from simulator.timing import CommonFactor
from simulator.trace import Trace
from tests.conftest import (
    check_fit_choice,
    fitted,
    one_worker_run,
    same_every_way,
    scenario,
)

COMMON = ("timing.read_common=0.8", "timing.grad_common=0.6", "timing.write_common=0.4",
          "timing.idle_common=0.7")


def _timed(*extra: str):
    return scenario("run.threads=2", "run.updates=4000", "problem.dim=1000",
                    "metrics.exact=false",
                    "timing.read={dist='lognormal', mean=2000, cv=0.3}",
                    "timing.write={dist='lognormal', mean=3000, cv=0.3}",
                    "timing.grad={dist='gamma', mean=9000, cv=0.3}",
                    "timing.idle={dist='lognormal', mean=3000, cv=0.5}", *extra)


@pytest.mark.parametrize("duration", [
    Duration("lognormal", 1000.0, 0.5), Duration("gamma", 1000.0, 0.7),
    Duration("exponential", 500.0), Duration("uniform", low=10.0, high=20.0),
    Duration("empirical", values=(1.0, 2.0, 3.0, 10.0)), Duration("constant", 5.0)])
def test_a_standard_normal_score_gives_the_distribution(duration):
    rng = np.random.default_rng(3)
    scores = [duration.at_score(float(x)) for x in rng.standard_normal(50_000)]
    drawn = duration.sample(rng, 50_000)
    assert scipy.stats.ks_2samp(scores, drawn).statistic < 0.015
    assert np.mean(scores) == pytest.approx(duration.mean, rel=0.02)


def test_gamma_quantiles_match_scipy():
    shape, duration = 1 / 0.49, Duration("gamma", 1000.0, 0.7)
    for x in (-5.0, -2.0, 0.0, 1.3, 3.0, 6.0):
        exact = (scipy.special.gammainccinv(shape, scipy.special.ndtr(-x)) / shape) * 1000
        assert duration.at_score(x) == pytest.approx(exact, rel=1e-6)


def test_the_common_factor_decays_and_does_not_depend_on_the_order_asked():
    tau = 8000.0
    factor = CommonFactor(7, 0, tau)
    times = np.arange(0, 40_000_000, 500)
    z = np.array([factor.at(int(t)) for t in times])
    assert abs(z.mean()) < 0.05 and z.std() == pytest.approx(1, abs=0.05)
    for lag in (1_000, 8_000, 24_000):
        step = lag // 500
        assert np.corrcoef(z[:-step], z[step:])[0, 1] == pytest.approx(np.exp(-lag / tau),
                                                                       abs=0.03)
    shuffled = CommonFactor(7, 0, tau)
    order = np.random.default_rng(0).permutation(times.size)[:2000]
    assert [shuffled.at(int(times[i])) for i in order] == z[order].tolist()
    factor.forget(20_000_000)
    with pytest.raises(RuntimeError, match="forgotten"):
        factor.at(0)
    assert factor.at(30_000_000) == z[60_000]


def test_draws_keep_their_distribution_and_go_together_as_told():
    """Each phase's recorded durations have the scenario's distribution; fitted back from
    the trace, the weights and the correlation time are those of the scenario."""
    trace = simulate(_timed(*COMMON, "timing.common_ns=20000"))
    grad = trace["grad_ns"].astype(float)
    idle = trace["idle_ns"].astype(float)
    assert grad.mean() == pytest.approx(9000, rel=0.03)
    assert idle.mean() == pytest.approx(3000, rel=0.05)
    shape = 1 / 0.09
    assert scipy.stats.kstest(grad, "gamma", args=(shape, 0, 9000 / shape)).statistic < 0.05
    fields = fit_common([(trace, np.arange(len(trace)), None)], "on")["fields"]
    assert fields["common_ns"] == pytest.approx(20000, rel=0.3)
    for name, expected in (("read", 0.8), ("grad", 0.6), ("write", 0.4), ("idle", 0.7)):
        assert fields[f"{name}_common"] == pytest.approx(expected, abs=0.1), name


def test_common_factors_are_deterministic_and_replay_bit_for_bit():
    sc = _timed(*COMMON, "timing.common_ns=5000", "run.updates=600", "run.threads=3",
                "metrics.exact=true")
    first = same_every_way(sc)
    plain = simulate(_timed("run.updates=600", "run.threads=3"))
    assert not np.array_equal(plain["grad_ns"], first["grad_ns"])


def test_threads_whose_phases_go_together_stay_in_phase():
    """Durations alike between threads keep two threads' writes meeting: more writes overlap
    than with independent draws (same seed, same distributions)."""
    together = interference(simulate(_timed(
        "timing.read_common=0.98", "timing.grad_common=0.98", "timing.write_common=0.98",
        "timing.idle_common=0.98", "timing.common_ns=50000")))
    apart = interference(simulate(_timed()))
    assert together["write_overlap_rate"] > 1.5 * apart["write_overlap_rate"]


@pytest.mark.parametrize(("override", "field"), [
    (("timing.read_common=1.5", "timing.common_ns=1000"), "timing.read_common"),
    (("timing.grad_common=0.5",), "timing.common_ns"),
    (("timing.idle_common=-0.1", "timing.common_ns=1000"), "timing.idle_common"),
])
def test_bad_common_factors_are_refused(override, field):
    with pytest.raises(ScenarioError) as err:
        scenario(*override)
    assert field in str(err.value)


def test_a_bad_common_factor_is_one_line_and_exit_2(capsys):
    assert main(["simulate", "--out", "/nonexistent/x", "--set", "timing.write_common=2",
                 "--set", "timing.common_ns=1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timing.write_common" in err[0] and "2" in err[0]


def test_calibrate_fits_common_factors_or_says_why_not(tmp_path):
    run = tmp_path / "run"
    assert main(["simulate", "--out", str(run), "--quiet", "--set", "run.threads=2",
                 "--set", "run.updates=3000", "--set", "problem.dim=1000",
                 "--set", "metrics.exact=false", "--set", "timing.common_ns=20000",
                 "--set", "timing.grad={dist='gamma', mean=9000, cv=0.3}",
                 *(arg for o in COMMON for arg in ("--set", o))]) == 0
    calibrated, report = calibrate(run, pool=True, common="auto")
    timing = fitted(calibrated)
    assert timing.coupled and timing.grad_common == pytest.approx(0.6, abs=0.1)
    off, _ = calibrate(run, pool=True)  # off unless asked for
    assert not fitted(off).coupled
    check_fit_choice(run, tmp_path, "common", "auto", "#   common factors: c·exp(−Δt/τ)")
    assert report["common"]["bins"]["grad"]["pairs"][0] > 0


def test_with_convoys_the_write_takes_the_other_phases_common_factor(tmp_path):
    """Writes that met no other are the short ones, so two of them are less alike than two
    writes: long writes (8 µs) in convoys with c = 0.6 give pairs of them below the true
    0.6·exp(−Δt/τ) at every offset. The write's factor is then the pair-weighted mean of the
    other phases' (0.6–0.8 here)."""
    run = tmp_path / "run"
    overrides = ["run.threads=2", "run.updates=4000", "problem.dim=1000", "metrics.exact=false",
                 "timing.common_ns=50000", "timing.write={dist='lognormal', mean=8000, cv=0.6}",
                 "timing.read={dist='lognormal', mean=2000, cv=0.3}",
                 "timing.grad={dist='gamma', mean=9000, cv=0.3}",
                 "timing.idle={dist='lognormal', mean=3000, cv=0.5}", "timing.convoy_join=1.0",
                 "timing.convoy_rest=1.5", "timing.write_common=0.6", *COMMON[:2], COMMON[3]]
    assert main(["simulate", "--out", str(run), "--quiet",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    calibrated, report = calibrate(run, pool=True, common="on")
    fit = report["common"]
    assert report["convoys"]["fields"] is not None and fit["write_from_others"]
    bins = fit["bins"]["write"]
    seen = [(c, m) for n, c, m in zip(bins["pairs"], bins["correlation"], bins["offset_ns"],
                                      strict=True) if n >= 30]
    assert len(seen) >= 4 and all(c < 0.6 * np.exp(-m / 50_000) for c, m in seen)
    weights, timing = fit["weights"], fitted(calibrated)
    others = [weights[p] for p in ("read", "grad", "idle")]
    assert min(others) <= timing.write_common == weights["write"] <= max(others)
    assert timing.write_common == pytest.approx(0.6, abs=0.15)
    assert (f"write {timing.write_common:.3g} (the others' mean"
            in calibrated_toml(calibrated, report))


def _rhythm_run(tmp_path, name, strength):
    run = tmp_path / name
    factors = (f"timing.{phase}_common={strength}" for phase in ("read", "grad", "write", "idle"))
    overrides = ["run.threads=2", "run.updates=3000", "problem.dim=1000", "metrics.exact=false",
                 "timing.grad={dist='gamma', mean=9000, cv=0.3}",
                 "timing.idle={dist='lognormal', mean=3000, cv=0.3}",
                 f"timing.common_ns={50000 if strength else 0}", *factors]
    assert main(["simulate", "--out", str(run), "--quiet",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return run


def test_common_factors_fitted_to_the_rhythm_give_it_back(tmp_path):
    """Workers held in step by strong common factors (staleness ≈ 0.85 × the independent-phase
    value) are calibrated back to factors that hold them so, and independent ones to none."""
    run = _rhythm_run(tmp_path, "together", 0.99)
    goal = trace_rhythm(Trace.load(run / "trace.npz"))["coupling"]
    assert goal < 0.9
    calibrated, report = calibrate(run, pool=True, common="rhythm")
    timing = fitted(calibrated)
    assert timing.coupled and timing.common_ns > 0
    assert 0.9 < timing.grad_common == timing.read_common == timing.idle_common <= 0.999
    again = simulate(calibrated)
    assert trace_rhythm(again)["coupling"] == pytest.approx(goal, abs=0.03)
    assert report["common"]["goal"] == goal and len(report["common"]["steps"]) <= 12
    assert calibrate(run, pool=True, common="rhythm")[0] == calibrated  # the same fit again
    apart = _rhythm_run(tmp_path, "apart", 0)
    plain, said = calibrate(apart, pool=True, common="rhythm")
    assert not fitted(plain).coupled and "independent" in said["common"]["why"]
    check_fit_choice(run, tmp_path, "common", "rhythm", "#   common factors: fitted to the rhythm")
    _, alone = calibrate(tmp_path / "alone", common="rhythm")  # made by check_fit_choice
    assert alone["common"]["fields"] is None and "two workers" in alone["common"]["why"]


def test_calibrate_fits_the_rhythm_by_default_only_where_the_workers_kept_one(tmp_path):
    """``asyngrad calibrate`` without ``--common`` fits common factors to a run whose workers
    kept a rhythm, and writes none for independent workers or one worker; ``--common off``
    writes none at all."""
    def common(run, *options):
        out = tmp_path / f"{run.name}{len(options)}.toml"
        assert main(["calibrate", str(run), "--pool", "--out", str(out), "--quiet",
                     *options]) == 0
        return load_scenario(out).hardware_of(0).common, out.read_text()

    together = _rhythm_run(tmp_path, "together", 0.99)
    spec, text = common(together)
    assert spec is not None and "#   common factors: fitted to the rhythm" in text
    assert "modelled by the common factors above" in text
    spec, text = common(together, "--common", "off")
    assert spec is None and "calibrate --common rhythm models it" in text
    spec, text = common(_rhythm_run(tmp_path, "apart", 0))
    assert spec is None and "the run's workers are independent" in text
    spec, text = common(one_worker_run(tmp_path / "alone"))
    assert spec is None and "fewer than two workers ran together" in text
