"""Duration distributions fitted to recorded durations (calibrate's core).

Families by maximum likelihood: lognormal (closed form) and gamma (scipy, location 0); the
larger log-likelihood wins unless neither passes a Kolmogorov–Smirnov test at the 1% level
on at least 50 samples, in which case the empirical distribution (up to 512 quantiles) is
used. Every candidate's log-likelihood and KS statistic is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.stats

from simulator.distributions import Duration

_KS_LEVEL = 0.01


_MIN_FOR_TEST = 50


_QUANTILES = 512


MIN_PAIRS = 30


@dataclass(frozen=True)
class Fit:
    """The chosen distribution of one operation and how every candidate fitted."""

    duration: Duration
    n: int
    candidates: dict[str, dict[str, float]]
    censored: int = 0

    def describe(self) -> str:
        d = self.duration
        shape = (f"mean {d.mean:.4g} ns, cv {d.cv:.3g}" if d.dist != "empirical"
                 else f"{len(d.values)} quantiles, mean {d.mean:.4g} ns")
        scores = ", ".join(f"{name} loglik {c['loglik']:.6g} KS {c['ks']:.3f}"
                           for name, c in self.candidates.items())
        count = (f"n = {self.n}" if not self.censored else
                 f"n = {self.n}, {self.censored} of them met by another write first: "
                 "censored there, Kaplan–Meier")
        return f"{d.dist} ({shape}; {count}; {scores})"


def fit_durations(values: np.ndarray, censored: np.ndarray | None = None) -> Fit:
    """Fit lognormal and gamma by maximum likelihood and choose (see the module docstring);
    fewer than two distinct positive durations give a constant (0 when there are none).
    ``censored``: durations known only to exceed these values (writes met by another
    before they ended, :func:`write_survival`), fitted with ``values`` as right-censored
    data; the empirical candidate is then the Kaplan–Meier estimate's quantiles."""
    x = np.asarray(values, dtype=np.float64)
    x = x[x > 0]
    right = (np.zeros(0) if censored is None else np.asarray(censored, dtype=np.float64))
    right = right[right > 0]
    if right.size and x.size >= 2 and not np.all(x == x[0]):
        return _censored_fit(x, right)
    if x.size < 2 or np.all(x == x[0]):  # nothing to fit: no time, or a constant one
        return Fit(Duration("constant", float(x[0]) if x.size else 0.0), int(x.size), {})
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    lognormal = scipy.stats.lognorm(s=sigma, scale=math.exp(mu))
    shape, _, scale = scipy.stats.gamma.fit(x, floc=0)
    gamma = scipy.stats.gamma(shape, scale=scale)
    candidates: dict[str, dict[str, float]] = {}
    for name, dist in (("lognormal", lognormal), ("gamma", gamma)):
        test = scipy.stats.kstest(x, dist.cdf)
        candidates[name] = {"loglik": float(dist.logpdf(x).sum()), "ks": float(test.statistic),
                            "p": float(test.pvalue)}
    best = max(candidates, key=lambda name: candidates[name]["loglik"])
    if x.size >= _MIN_FOR_TEST and all(c["p"] < _KS_LEVEL for c in candidates.values()):
        points = min(_QUANTILES, x.size)
        quantiles = np.quantile(x, (np.arange(points) + 0.5) / points)
        return Fit(Duration("empirical", values=tuple(float(q) for q in quantiles)),
                   int(x.size), candidates)
    return Fit(_family(best, (mu, sigma) if best == "lognormal" else (shape, scale)),
               int(x.size), candidates)


def _family(name: str, params: tuple[float, float]) -> Duration:
    """The scenario's form of a fitted lognormal (μ, σ of the log) or gamma (shape, scale)."""
    if name == "lognormal":
        mu, sigma = params
        return Duration("lognormal", math.exp(mu + sigma**2 / 2),
                        math.sqrt(math.expm1(sigma**2)))
    shape, scale = params
    return Duration("gamma", float(shape * scale), float(1 / math.sqrt(shape)))


def _censored_fit(x: np.ndarray, right: np.ndarray) -> Fit:
    """:func:`fit_durations` with right-censored values: each family by maximum likelihood
    (density at the values seen whole, survival function at the censored ones); KS is the
    largest gap between the family's distribution function and the Kaplan–Meier estimate at
    its times, its p-value taken for as many values as were seen whole."""
    data = scipy.stats.CensoredData(uncensored=x, right=right)
    estimate = Survival.of(x, right)
    times, cdf = estimate.times, estimate.cdf
    before = np.concatenate([[0.0], cdf[:-1]])
    candidates: dict[str, dict[str, float]] = {}
    params: dict[str, tuple[float, float]] = {}
    for name, family in (("lognormal", scipy.stats.lognorm), ("gamma", scipy.stats.gamma)):
        shape, _, scale = family.fit(data, floc=0)
        params[name] = ((math.log(scale), float(shape)) if name == "lognormal"
                        else (float(shape), float(scale)))
        dist = family(shape, scale=scale)
        model = dist.cdf(times)
        gap = float(max(np.abs(model - cdf).max(), np.abs(model - before).max()))
        candidates[name] = {"loglik": float(dist.logpdf(x).sum() + dist.logsf(right).sum()),
                            "ks": gap, "p": float(scipy.stats.kstwo(x.size).sf(gap))}
    best = max(candidates, key=lambda name: candidates[name]["loglik"])
    n = int(x.size + right.size)
    if x.size >= _MIN_FOR_TEST and all(c["p"] < _KS_LEVEL for c in candidates.values()):
        quantiles = estimate.quantiles(min(_QUANTILES, n))
        return Fit(Duration("empirical", values=tuple(float(q) for q in quantiles)), n,
                   candidates, int(right.size))
    return Fit(_family(best, params[best]), n, candidates, int(right.size))


@dataclass(frozen=True)
class Survival:
    """The Kaplan–Meier estimate of a duration from values seen whole and values known only
    to exceed what was seen (right-censored), values ≤ 0 left out: the times, the
    distribution function just after each, and the longest value seen, where the mass the
    estimate leaves undetermined (when the longest value is a censored one) is put."""

    times: np.ndarray
    cdf: np.ndarray
    longest: float

    @classmethod
    def of(cls, alone: np.ndarray, censored: np.ndarray) -> Survival:
        exact, right = alone[alone > 0], censored[censored > 0]
        result = scipy.stats.ecdf(scipy.stats.CensoredData(uncensored=exact, right=right))
        return cls(result.cdf.quantiles, result.cdf.probabilities,
                   float(max(exact.max(initial=0.0), right.max(initial=0.0))))

    def survival(self, t: np.ndarray) -> np.ndarray:
        """P(duration > t), right-continuous."""
        at = np.searchsorted(self.times, t, side="right") - 1
        inside = np.where(at < 0, 1.0, 1 - self.cdf[np.maximum(at, 0)])
        return np.where(t >= self.longest, 0.0, inside)

    def mean(self) -> float:
        mass = np.diff(np.concatenate([[0.0], self.cdf]))
        return float(self.times @ mass + (1 - self.cdf[-1]) * self.longest)

    def quantiles(self, points: int) -> np.ndarray:
        """``points`` quantiles, at (i + ½)/points."""
        levels = (np.arange(points) + 0.5) / points
        at = np.searchsorted(self.cdf, levels, side="left")  # the first time a level is reached
        return np.where(at < self.times.size,
                        self.times[np.minimum(at, self.times.size - 1)], self.longest)

    def expected_rest(self, lags: np.ndarray, lead: np.ndarray | None = None,
                      join: np.ndarray | None = None) -> np.ndarray:
        """For a write met ``lags`` ns after it began, E[min(R, D)]: R the rest of its time
        alone given that it had not ended by the lag (a met write is the likelier the longer
        it is), D an independent draw of the time alone (the joiner's). The convoy rule's
        min(E − t, W) term (``convoy_rest``), in expectation; exact for the estimate's step
        function: ∫ S(lag + t)·S(t) dt / S(lag). With ``lead`` and ``join`` (one each per
        lag), the leader's time alone is ``lead`` times a draw and the joiner's ``join``
        times one (``[hardware.shared_lines]``): ∫ S((lag + t)/a)·S(t/b) dt / S(lag/a)."""
        knots = np.concatenate([[0.0], self.times, [self.longest]])
        a = np.ones(lags.size) if lead is None else lead
        b = np.ones(lags.size) if join is None else join
        left = self.survival(lags / a)
        out = np.zeros(lags.size)
        for i, lag in enumerate(lags.tolist()):
            if left[i] <= 0:
                continue
            edges = np.unique(np.concatenate([a[i] * knots - lag, b[i] * knots]))
            edges = edges[(edges >= 0) & (edges <= min(a[i] * self.longest - lag,
                                                       b[i] * self.longest))]
            starts = edges[:-1]
            out[i] = float(np.sum(self.survival(starts / b[i])
                                  * self.survival((lag + starts) / a[i])
                                  * np.diff(edges))) / left[i]
        return out


def log_median(values: np.ndarray, censored: np.ndarray) -> float:
    """The log of the median of positive ``values``; with right-censored values among them
    (``censored``), of the Kaplan–Meier estimate's median (all censored: of the values',
    a lower bound)."""
    if not censored.any() or censored.all():
        return float(np.median(np.log(values)))
    return math.log(float(Survival.of(values[~censored], values[censored]).quantiles(1)[0]))


def fit_phase(ops: dict[str, np.ndarray], op: str) -> Fit:
    """An operation's fit, the censored writes with the write (:func:`fit_durations`)."""
    return fit_durations(ops[op], ops.get("write_censored") if op == "write" else None)


def mean_duration(samples: dict[str, np.ndarray], op: str) -> float:
    """An operation's mean duration in one run's samples (writes: with the censored)."""
    censored = samples.get("write_censored") if op == "write" else None
    if censored is not None and censored.size and samples[op].size:
        return Survival.of(samples[op], censored).mean()
    return float(samples[op].mean()) if samples[op].size else 0.0


def scaled(duration: Duration, factor: float) -> Duration:
    """``duration`` with every draw divided by ``factor``."""
    factor = float(factor)
    if duration.dist == "empirical":
        return replace(duration, values=tuple(float(v) / factor for v in duration.values),
                       mean=float(duration.mean) / factor)
    return replace(duration, mean=float(duration.mean) / factor,
                   low=float(duration.low) / factor, high=float(duration.high) / factor)
