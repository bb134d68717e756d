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
from dataclasses import dataclass, field

import numpy as np

from simulator.errors import ScenarioError

__all__ = ["KINDS", "Duration"]

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


@dataclass(frozen=True)
class Duration:
    """A distribution of durations in nanoseconds.

    Raises:
        ScenarioError: unknown ``dist``, a negative or non-finite parameter, ``low > high``,
            ``cv <= 0`` for lognormal/gamma, or an empty ``values`` for empirical.
    """

    dist: str = "constant"
    mean: float = 1000.0
    cv: float = 0.0
    low: float = 0.0
    high: float = 0.0
    values: tuple[float, ...] = field(default=())

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
        if self.cv <= 0:
            raise ScenarioError("cv", self.cv, f"must be > 0 for {self.dist}")
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

    def to_dict(self) -> dict[str, object]:
        """The defining fields only, as written in a scenario file."""
        return {name: (list(self.values) if name == "values" else getattr(self, name))
                for name in _DEFINING[self.dist]}
