"""Named duration distributions (nanoseconds) for reads, gradients and writes.

A :class:`Duration` is a frozen, validated description of one distribution; its ``sample``
draws from an explicit ``numpy.random.Generator`` (never a global RNG). Parameters are stated
the way people think about timings: a mean and a coefficient of variation ``cv``, except for
``uniform`` (``low``, ``high``) and ``empirical`` (``values``, resampled uniformly).
Fields a family does not use are normalised (``mean`` and ``cv`` always hold the family's real
mean and cv), so two equal distributions compare equal however they were written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from simulator.errors import ScenarioError
from simulator.keys import key

__all__ = ["KINDS", "Duration", "beta_shapes"]

KINDS = ("constant", "uniform", "exponential", "lognormal", "gamma", "empirical")

# The fields that define each family; the rest are derived. ``to_dict`` writes only these.
_DEFINING = {
    "constant": ("dist", "mean"),
    "uniform": ("dist", "low", "high"),
    "exponential": ("dist", "mean"),
    "lognormal": ("dist", "mean", "cv"),
    "gamma": ("dist", "mean", "cv"),
    "empirical": ("dist", "values"),
}

# The coefficients of variation a lognormal or gamma duration may have: its quantiles and
# draws need cv² and 1/cv² well inside the float range.
CV_RANGE = (1e-6, 1e6)


@dataclass(frozen=True)
class Duration:
    """A distribution of durations in nanoseconds.

    Raises:
        ScenarioError: unknown ``dist``, a negative or non-finite parameter, ``low > high``,
            ``cv`` outside ``CV_RANGE`` for lognormal/gamma, or an empty ``values`` for empirical.
    """

    dist: str = key("constant", "the family of the distribution", choices=KINDS)
    mean: float = key(1000.0, "mean (ns; constant, exponential, lognormal, gamma)",
                      bounds=">= 0")
    cv: float = key(0.0, "coefficient of variation (lognormal, gamma)", bounds=">= 0")
    low: float = key(0.0, "least value (ns; uniform)", bounds=">= 0")
    high: float = key(0.0, "greatest value (ns; uniform, >= low)", bounds=">= 0")
    values: tuple[float, ...] = key((), "values (ns) resampled uniformly (empirical)")

    def __post_init__(self) -> None:
        if self.dist not in KINDS:
            raise ScenarioError("dist", self.dist, f"must be one of {', '.join(KINDS)}")
        for name in ("mean", "cv", "low", "high"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ScenarioError(name, value, "must be a finite number >= 0")
        if any(not math.isfinite(v) or v < 0 for v in self.values):
            raise ScenarioError("values", list(self.values), "must all be finite and >= 0")
        getattr(self, f"_normalise_{self.dist}")()

    def _set(self, **kwargs: object) -> None:
        for name, value in kwargs.items():
            object.__setattr__(self, name, value)

    def _normalise_constant(self) -> None:
        self._set(cv=0.0, low=0.0, high=0.0, values=())

    def _normalise_exponential(self) -> None:
        self._set(cv=1.0, low=0.0, high=0.0, values=())

    def _normalise_lognormal(self) -> None:
        if self.mean <= 0:
            raise ScenarioError("mean", self.mean, f"must be > 0 for {self.dist}")
        if not CV_RANGE[0] <= self.cv <= CV_RANGE[1]:
            raise ScenarioError("cv", self.cv, f"must be in [{CV_RANGE[0]:g}, {CV_RANGE[1]:g}] "
                                f"for {self.dist} (below: use constant; above, every draw but "
                                "a vanishing few is near 0)")
        self._set(low=0.0, high=0.0, values=())

    _normalise_gamma = _normalise_lognormal

    def _normalise_uniform(self) -> None:
        if self.low > self.high:
            raise ScenarioError("low", self.low, f"must be <= high ({self.high})")
        mean = (self.low + self.high) / 2
        std = (self.high - self.low) / math.sqrt(12)
        self._set(mean=mean, cv=std / mean if mean > 0 else 0.0, values=())

    def _normalise_empirical(self) -> None:
        if not self.values:
            raise ScenarioError("values", [], "empirical needs at least one value")
        data = np.asarray(self.values, dtype=np.float64)
        mean = float(data.mean())
        self._set(values=tuple(float(v) for v in data), mean=mean,
                  cv=float(data.std()) / mean if mean > 0 else 0.0, low=0.0, high=0.0)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` durations (float ns, >= 0) from ``rng``."""
        if self.dist == "constant":
            return np.full(size, self.mean)
        if self.dist == "uniform":
            return rng.uniform(self.low, self.high, size)
        if self.dist == "exponential":
            return rng.exponential(self.mean, size)
        if self.dist == "lognormal":
            sigma2 = math.log1p(self.cv**2)
            return rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size)
        if self.dist == "gamma":
            shape = 1.0 / self.cv**2
            return rng.gamma(shape, self.mean / shape, size)
        return rng.choice(np.asarray(self.values), size)

    def at_score(self, x: float) -> float:
        """The duration whose normal score is ``x``: the quantile at Φ(x). A standard normal
        ``x`` gives exactly this distribution (what ``sample`` draws), so scores that are
        correlated give correlated durations with this distribution each. Gamma quantiles
        are interpolated in a table over |x| <= 8 (2,048 points per unit; relative error
        below 1e-6 in the body of the distribution)."""
        return self.quantile_of_score()(x)

    def quantile_of_score(self) -> Callable[[float], float]:
        """``at_score`` as a function with the family's constants worked out once."""
        return _quantile_of_score(self)

    def to_dict(self) -> dict[str, object]:
        """The defining fields only, as written in a scenario file."""
        return {name: (list(self.values) if name == "values" else getattr(self, name))
                for name in _DEFINING[self.dist]}


_SCORE_LIMIT = 8.0
_SCORE_STEPS = 2048  # table points per unit of normal score


def beta_shapes(mean: float, rho: float) -> tuple[float, float]:
    """The shapes (a, b) of the Beta distribution of mean ``mean`` whose beta-binomial
    counts correlate ``rho`` between two trials (ρ = 1 / (a + b + 1)); 0 < ρ < 1."""
    scale = (1 - rho) / rho
    return mean * scale, (1 - mean) * scale


def _upper(x: float) -> float:
    """P(Z > x) for a standard normal Z."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


@lru_cache(maxsize=64)
def _sorted(values: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted(values))


@lru_cache(maxsize=64)
def _gamma_table(shape: float) -> tuple[float, ...]:
    """Unit-mean gamma quantiles at normal scores −8 … 8 (lower tail from the regularized
    incomplete gamma, upper tail from its complement, each where it is accurate)."""
    from scipy.special import gammainccinv, gammaincinv, ndtr

    x = np.linspace(-_SCORE_LIMIT, _SCORE_LIMIT, int(2 * _SCORE_LIMIT * _SCORE_STEPS) + 1)
    lower = gammaincinv(shape, ndtr(x))
    upper = gammainccinv(shape, ndtr(-x))
    return tuple((np.where(x < 0, lower, upper) / shape).tolist())


@lru_cache(maxsize=256)
def _quantile_of_score(duration: Duration) -> Callable[[float], float]:
    if duration.dist == "constant":
        return partial(_constant, duration.mean)
    if duration.dist == "lognormal":
        sigma2 = math.log1p(duration.cv**2)
        return partial(_lognormal, math.log(duration.mean) - sigma2 / 2, math.sqrt(sigma2))
    if duration.dist == "gamma":
        shape = 1.0 / duration.cv**2
        return partial(_gamma, duration.mean, _gamma_table(shape))
    if duration.dist == "exponential":
        return partial(_exponential, duration.mean)
    if duration.dist == "uniform":
        return partial(_uniform, duration.low, duration.high - duration.low)
    return partial(_empirical, _sorted(duration.values))


def _constant(value: float, x: float) -> float:
    return value


def _lognormal(mu: float, sigma: float, x: float) -> float:
    return math.exp(mu + sigma * x)


def _exponential(mean: float, x: float) -> float:
    return -mean * math.log(_upper(x))  # the upper tail keeps x >> 0 exact


def _uniform(low: float, width: float, x: float) -> float:
    return low + width * (1.0 - _upper(x))


def _empirical(values: tuple[float, ...], x: float) -> float:
    return values[min(int((1.0 - _upper(x)) * len(values)), len(values) - 1)]


def _gamma(mean: float, table: tuple[float, ...], x: float) -> float:
    pos = (min(max(x, -_SCORE_LIMIT), _SCORE_LIMIT) + _SCORE_LIMIT) * _SCORE_STEPS
    i = min(int(pos), len(table) - 2)
    return mean * (table[i] + (table[i + 1] - table[i]) * (pos - i))
