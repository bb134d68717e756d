"""Duration distributions: moments against their definitions, validation, normalisation."""

import numpy as np
import pytest
from scipy import stats

from simulator.distributions import Duration
from simulator.errors import ScenarioError


@pytest.mark.parametrize("dist", ["lognormal", "gamma"])
def test_mean_and_cv_match(dist):
    """lognormal and gamma draws have the stated mean and coefficient of variation."""
    draws = Duration(dist, 2000.0, 0.4).sample(np.random.default_rng(1), 400_000)
    assert draws.mean() == pytest.approx(2000.0, rel=0.01)
    assert draws.std() / draws.mean() == pytest.approx(0.4, rel=0.02)


def test_gamma_matches_scipy_distribution():
    """gamma draws follow scipy's gamma with shape 1/cv² and scale mean·cv² (KS test)."""
    draws = Duration("gamma", 500.0, 0.5).sample(np.random.default_rng(2), 20_000)
    assert stats.kstest(draws, stats.gamma(a=4.0, scale=125.0).cdf).pvalue > 0.01


def test_uniform_and_empirical_derive_mean():
    """uniform and empirical report their real mean and cv."""
    uniform = Duration("uniform", low=100.0, high=300.0)
    assert uniform.mean == 200.0
    assert uniform.cv == pytest.approx((200 / np.sqrt(12)) / 200)
    empirical = Duration("empirical", values=(1.0, 2.0, 3.0))
    assert empirical.mean == 2.0
    draws = empirical.sample(np.random.default_rng(0), 1000)
    assert set(np.unique(draws)) == {1.0, 2.0, 3.0}


def test_constant_ignores_cv():
    """Fields a family does not use are normalised, so equal distributions compare equal."""
    assert Duration("constant", 5.0, cv=0.3) == Duration("constant", 5.0)
    assert Duration("constant", 5.0).to_dict() == {"dist": "constant", "mean": 5.0}


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"dist": "weibull"}, "dist"),
    ({"dist": "constant", "mean": -1.0}, "mean"),
    ({"dist": "lognormal", "mean": 10.0, "cv": 0.0}, "cv"),
    ({"dist": "gamma", "mean": 0.0, "cv": 1.0}, "mean"),
    ({"dist": "uniform", "low": 5.0, "high": 1.0}, "low"),
    ({"dist": "empirical"}, "values"),
    ({"dist": "constant", "mean": float("nan")}, "mean"),
])
def test_invalid_parameters_name_the_field(kwargs, field):
    """Every invalid parameter raises a ScenarioError naming that field."""
    with pytest.raises(ScenarioError) as err:
        Duration(**kwargs)
    assert err.value.field == field
