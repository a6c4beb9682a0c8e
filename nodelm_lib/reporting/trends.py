"""Fitted trends of loss against size or compute, and intervals over seeds.

One arm of a size sweep gives points (x, loss): x is the non-embedding parameter count or the
training FLOPs of a run, one point per (width, seed). Two curve forms are fitted to them by least
squares over every point:

- power law    ``L(x) = E + A x**-alpha``  (E: the loss the family approaches as x grows, on this
  data and budget; alpha: how fast it approaches it)
- log-linear   ``L(x) = a + b ln x``        (a straight line against log x; the loss changes by
  ``b ln 2`` per doubling of x)

The power law has three parameters, and four widths give four means: one degree of freedom beyond
the curve. ``fit_trend`` keeps the power law only where the data carry it:

1. at least four distinct x (with three the curve passes through every mean, whatever it is);
2. an interior optimum (E > 0, A > 0, alpha inside ``ALPHA_BOUNDS``). Points that show no
   saturation pull the optimum to a bound: E -> 0 with alpha -> 0 is the log-linear limit;
3. a significantly better fit than the log-linear line: an F-test of the residual sums of squares
   over every point (1 and n - 3 degrees of freedom), p below ``curvature_p``.

Otherwise it falls back to the log-linear fit and says why (``Trend.reason``).

**Intervals over seeds: t-intervals.** Seed s gives every arm and width the same data order, so
seeds are the independent units. ``seed_t_intervals`` gives each statistic a t-interval over
seeds,

    estimate +- t_{(1+c)/2, n-1} sqrt(n / (n-1)) sd_boot

whose standard error comes from resampling seeds (every arm and width with the same draw, which
keeps the pairing), the statistic recomputed on each resample with the curve form kept as fitted
on the data. With n seeds there are n**n equally likely draws; up to ``n_boot`` of them are
enumerated, beyond that ``n_boot`` are drawn at random. For a statistic linear in the seeds' values
(a mean, a least-squares line over the same sizes for every seed, a read-off of it) the resampling
variance is exactly (n-1)/n s^2/n, so the interval *is* the t-interval of the per-seed values: for
a log-linear trend, the t-interval of the n per-seed fits. The resampling only matters for a
refitted power law, which is not linear in the seeds; there the interval stays close to its nominal
coverage (tests/test_scaling.py measures it at 3 seeds). It is not a bootstrap percentile interval:
those, from 3 seeds, cover far less than 95% (the quantiles of at most 27 values, ignoring that the
spread itself is estimated from 3).

**Tests over seeds.** ``jackknife`` gives each seed a pseudo-value of a statistic (Tukey's:
n theta - (n-1) theta_without_that_seed, every fit redone), so that paired tests over seeds
(``comparisons.compare_arms``, ``stats.tost``) can be run on fitted quantities. For a statistic linear
in the seeds' values (a mean, a least-squares line) a seed's pseudo-value is its own value and the
t interval of the pseudo-values is the one above; for a refitted power law they carry the refit's
variability, which a test holding the fitted shape fixed would leave out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as _dist

POWER_LAW = "power law"
LOG_LINEAR = "log-linear"
FORMS = (POWER_LAW, LOG_LINEAR)
# the exponents searched: below 1e-3 a power law is a log-linear line over any range measured here,
# above 4 it is a step
ALPHA_BOUNDS = (1e-3, 4.0)


# Every fit below uses only arithmetic that rounds the same on every CPU: elementwise + - * /,
# exactly rounded sums (math.fsum), and the C library's exp, log and pow one number at a time.
# numpy's own exp/log/power take other vector code on an AVX-512 CPU than on an AVX2 one, and a
# least-squares solve through the BLAS picks its kernels by CPU; either moved 07's committed tables
# in the 15th digit on another machine, so that a rebuild from the same records did not write the
# same bytes.
def _log(a) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    return np.fromiter(map(math.log, a.ravel().tolist()), float, a.size).reshape(a.shape)


def _pow(a, p: float) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    return np.fromiter((math.pow(v, p) for v in a.ravel().tolist()), float, a.size).reshape(a.shape)


def _sum(a) -> float:
    return math.fsum(np.asarray(a, dtype=float).ravel().tolist())


_ALPHA_GRID = np.array([math.exp(la) for la in np.linspace(*map(math.log, ALPHA_BOUNDS), 121).tolist()])


@dataclass(frozen=True)
class Trend:
    """A curve fitted to the points (x, loss) of one arm. ``params``: E, A, alpha (power law) or
    a, b (log-linear), in the units of x as given; ``reason`` says why this form was used."""

    form: str
    params: dict
    x_min: float
    x_max: float
    n_points: int
    n_x: int
    reason: str = ""
    p_curvature: float = math.nan

    def __call__(self, x) -> np.ndarray:
        """The fitted loss at ``x``."""
        x = _positive(x, "x")
        if self.form == POWER_LAW:
            return self.params["E"] + self.params["A"] * _pow(x, -self.params["alpha"])
        return self.params["a"] + self.params["b"] * _log(x)

    def slope_per_doubling(self, x) -> np.ndarray:
        """dL / d log2(x) at ``x``: the change of the fitted loss per doubling of x there
        (comparable between the two forms; negative where loss falls with x)."""
        x = _positive(x, "x")
        if self.form == POWER_LAW:
            p = self.params
            return -p["alpha"] * p["A"] * _pow(x, -p["alpha"]) * math.log(2)
        return np.full(x.shape, self.params["b"] * math.log(2))

    def extrapolates(self, x) -> np.ndarray:
        """True where ``x`` lies outside the range of x the curve was fitted on."""
        x = np.asarray(x, dtype=float)
        return (x < self.x_min * (1 - 1e-9)) | (x > self.x_max * (1 + 1e-9))


# --------------------------------------------------------------------------- fits


def _positive(x, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"{name} must be finite and > 0 (a count of parameters or FLOPs), "
                         f"got {x.ravel()[:8].tolist()}")
    return x


def _check_points(x, y) -> tuple[np.ndarray, np.ndarray]:
    """x, y as float arrays of one length, finite, x > 0, at least two distinct x."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.size != y.size:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    _positive(x, "x")
    if not np.all(np.isfinite(y)):
        raise ValueError("y has NaN or infinite values (a failed run?): drop those points first")
    if len(np.unique(x)) < 2:
        raise ValueError(f"a trend needs points at 2 or more distinct x, got {len(np.unique(x))}")
    return x, y


def _line_fit(v: list, y: list) -> tuple[float, float] | None:
    """``y = a + b v`` by least squares over plain floats, in closed form (centred, so as accurate
    as a QR solve); None when v is constant."""
    v_mean, y_mean = math.fsum(v) / len(v), math.fsum(y) / len(y)
    dv = [vi - v_mean for vi in v]
    svv = math.fsum([d * d for d in dv])
    if svv == 0:
        return None
    b = math.fsum([d * (yi - y_mean) for d, yi in zip(dv, y)]) / svv
    return y_mean - b * v_mean, b


def fit_log_linear(x, y) -> Trend:
    """``L = a + b ln x`` by least squares."""
    x, y = _check_points(x, y)
    a, b = _line_fit(_log(x).tolist(), y.tolist())
    return Trend(LOG_LINEAR, {"a": float(a), "b": float(b)}, float(x.min()), float(x.max()), len(x),
                 len(np.unique(x)))


def _power_profile(u: list, y: list, alpha: float) -> tuple[tuple[float, float], float]:
    """For a fixed exponent the power law is linear in (E, A'): L = E + A' exp(-alpha u), with
    u = ln(x / x0). Non-negative least squares for them (E >= 0: a cross-entropy; A' >= 0: a
    falling curve) and the residual sum of squares (variable projection).

    With two unknowns the constrained optimum is the unconstrained one when it is feasible, else
    the best of the faces: A' = 0 (E the mean), E = 0 (A' through the origin), or both 0. Plain
    floats: a fit calls this some 150 times on a few dozen points, where numpy's per-call cost
    would dominate."""
    v = [math.exp(-alpha * ui) for ui in u]

    def rss(E: float, A: float) -> float:
        residuals = [yi - (E + A * vi) for vi, yi in zip(v, y)]
        return math.fsum([r * r for r in residuals])

    line = _line_fit(v, y)
    if line is not None and line[0] >= 0 and line[1] >= 0:
        return line, rss(*line)
    through_origin = math.fsum([vi * yi for vi, yi in zip(v, y)]) / math.fsum([vi * vi for vi in v])
    faces = [(max(math.fsum(y) / len(y), 0.0), 0.0), (0.0, max(through_origin, 0.0))]
    E, A = min(faces, key=lambda c: rss(*c))
    return (E, A), rss(E, A)


def fit_power_law(x, y) -> tuple[Trend, str]:
    """``L = E + A x**-alpha`` by least squares with E >= 0, A >= 0 and alpha in
    ``ALPHA_BOUNDS``, and a note naming the bound the optimum sits on ("" if interior).

    The exponent is found on the profile of the residual sum of squares (the best E and A for each
    alpha): a grid, then Brent's method between the best point's neighbours. x is scaled by its
    geometric mean while fitting (A would otherwise span tens of orders of magnitude)."""
    x, y = _check_points(x, y)
    x0 = math.exp(_sum(_log(x)) / len(x))
    u, ys = _log(x / x0).tolist(), y.tolist()
    rss = np.array([_power_profile(u, ys, a)[1] for a in _ALPHA_GRID])
    i = int(np.argmin(rss))
    lo, hi = math.log(_ALPHA_GRID[max(i - 1, 0)]), math.log(_ALPHA_GRID[min(i + 1, len(_ALPHA_GRID) - 1)])
    best = optimize.minimize_scalar(lambda la: _power_profile(u, ys, math.exp(la))[1], bounds=(lo, hi),
                                    method="bounded", options={"xatol": 1e-10})
    alpha = math.exp(best.x) if best.fun <= rss[i] else float(_ALPHA_GRID[i])
    (E, A0), _ = _power_profile(u, ys, alpha)
    at_bound = ""
    if A0 <= 0:
        at_bound = "A at 0: the loss does not fall with x"
    elif E <= 0:
        at_bound = "E at 0: the points show no saturation (the log-linear limit)"
    elif not ALPHA_BOUNDS[0] * (1 + 1e-6) < alpha < ALPHA_BOUNDS[1] * (1 - 1e-6):
        at_bound = f"alpha at its bound {alpha:.3g}"
    params = {"E": float(E), "A": float(A0 * math.pow(x0, alpha)), "alpha": float(alpha)}
    return Trend(POWER_LAW, params, float(x.min()), float(x.max()), len(x), len(np.unique(x))), at_bound


def _rss(trend: Trend, x: np.ndarray, y: np.ndarray) -> float:
    r = y - trend(x)
    return _sum(r * r)


def curvature_test(x, y, power: Trend, line: Trend) -> float:
    """p of the F-test that the power law fits the points better than the log-linear line:
    F = (RSS_line - RSS_power) / (RSS_power / (n - 3)) on 1 and n - 3 degrees of freedom.
    (The line is the power law's alpha -> 0 limit; residuals are taken as independent, which the
    pairing of seeds across widths makes only approximately true.)"""
    x, y = _check_points(x, y)
    n = len(x)
    if n < 4:
        return math.nan
    rss_power, rss_line = _rss(power, x, y), _rss(line, x, y)
    if rss_power <= 1e-15 * max(rss_line, 1e-300):
        return 0.0 if rss_line > 1e-15 else 1.0
    f = max(rss_line - rss_power, 0.0) / (rss_power / (n - 3))
    return float(_dist.f.sf(f, 1, n - 3))


def fit_trend(x, y, curvature_p: float = 0.05, min_x_power: int = 4) -> Trend:
    """The power law where the data carry it (module docstring), else the log-linear line; its
    ``reason`` says which and why."""
    if not 0 < curvature_p < 1:
        raise ValueError(f"curvature_p={curvature_p!r} is not valid; it must be in (0, 1)")
    x, y = _check_points(x, y)
    line = fit_log_linear(x, y)
    n_x = len(np.unique(x))
    if n_x < min_x_power:
        return replace(line, reason=f"{n_x} sizes: a 3-parameter power law would pass through every mean")
    power, at_bound = fit_power_law(x, y)
    if at_bound:
        return replace(line, reason=f"power law not identified ({at_bound})")
    p = curvature_test(x, y, power, line)
    if not p < curvature_p:
        return replace(line, p_curvature=p,
                       reason=f"no curvature resolved in log x (F-test p = {p:.2g} >= {curvature_p:g})")
    return replace(power, p_curvature=p, reason=f"curvature resolved (F-test p = {p:.2g} < {curvature_p:g})")


def fit_form(x, y, form: str) -> Trend:
    """A fit of the given form (a resample of the seeds keeps the form chosen on the data); a power
    law at a bound is returned as it is."""
    if form == POWER_LAW:
        return fit_power_law(x, y)[0]
    if form == LOG_LINEAR:
        return fit_log_linear(x, y)
    raise ValueError(f"form={form!r} is not valid; choose one of {', '.join(map(repr, FORMS))}")


# --------------------------------------------------------------------------- t-intervals over seeds


def seed_draws(seeds: Iterable, n_boot: int = 2000, rng: int | np.random.Generator = 0) -> tuple[list[tuple], bool]:
    """The resamples of ``seeds`` (each a tuple of n seeds, with repeats) and whether they are all
    n**n of them (when there are at most ``n_boot``) rather than ``n_boot`` random ones."""
    seeds = list(dict.fromkeys(seeds))
    n = len(seeds)
    if n < 2:
        raise ValueError(f"resampling seeds needs at least 2 seeds, got {seeds}")
    if n_boot < 2:
        raise ValueError(f"n_boot={n_boot!r} is not valid; it must be >= 2")
    if n ** n <= n_boot:
        return list(itertools.product(seeds, repeat=n)), True
    rng = np.random.default_rng(rng)
    picks = rng.integers(0, n, size=(n_boot, n))
    return [tuple(seeds[i] for i in row) for row in picks], False


def resample(points: pd.DataFrame, draw: Iterable, seed_col: str = "seed") -> pd.DataFrame:
    """The rows of every seed of ``draw``, in order, relabelled 0..n-1 by their place in the draw
    (a seed drawn twice counts as two seeds)."""
    groups = points.groupby(seed_col, sort=False).indices
    missing = [s for s in draw if s not in groups]
    if missing:
        raise ValueError(f"seed(s) {missing} not in the points (seeds: {list(groups)})")
    rows = [groups[s] for s in draw]
    out = points.iloc[np.concatenate(rows)].reset_index(drop=True)
    out[seed_col] = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    return out


def t_interval(estimate, sd_boot, n_seeds: int, confidence: float = 0.95, exact: bool = True):
    """``estimate +- t_{(1+c)/2, n-1} sqrt(n/(n-1)) sd_boot`` (module docstring): (low, high)."""
    if n_seeds < 2:
        raise ValueError(f"an interval over seeds needs at least 2 seeds, got {n_seeds}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    half = _dist.t.ppf((1 + confidence) / 2, n_seeds - 1) * math.sqrt(n_seeds / (n_seeds - 1)) * np.asarray(sd_boot)
    return np.asarray(estimate) - half, np.asarray(estimate) + half


def seed_t_intervals(points: pd.DataFrame, statistic: Callable[[pd.DataFrame], pd.Series], seed_col: str = "seed",
                     n_boot: int = 2000, confidence: float = 0.95,
                     rng: int | np.random.Generator = 0) -> pd.DataFrame:
    """The t-interval over seeds (module docstring) of every number of ``statistic`` (points -> a
    Series of named numbers): one row per number with ``estimate`` (on all the points),
    ``sd_boot`` (its SD over the seed resamples whose value is finite), ``ci_low`` / ``ci_high``
    (``t_interval``), ``n_seeds``, ``n_boot`` (resamples) and ``exact`` (all n**n of them)."""
    if seed_col not in points.columns:
        raise ValueError(f"points have no {seed_col!r} column (columns: {list(points.columns)})")
    seeds = list(dict.fromkeys(points[seed_col]))
    estimate = statistic(points)
    draws, exact = seed_draws(seeds, n_boot, rng)
    reps = pd.DataFrame([statistic(resample(points, d, seed_col)).reindex(estimate.index) for d in draws])
    reps = reps.replace([np.inf, -np.inf], np.nan)  # finite replicates only (an infinite one would make the SD NaN)
    # all n**n draws, equally likely: their population SD is the resampling SD
    sd = reps.std(ddof=0 if exact else 1, skipna=True)
    low, high = t_interval(estimate.to_numpy(float), sd.to_numpy(float), len(seeds), confidence)
    return pd.DataFrame({"estimate": estimate, "sd_boot": sd, "ci_low": low, "ci_high": high,
                         "n_seeds": len(seeds), "n_boot": len(draws), "exact": exact}, index=estimate.index)


def jackknife(points: pd.DataFrame, statistic: Callable[[pd.DataFrame], pd.Series],
              seed_col: str = "seed") -> pd.DataFrame:
    """Tukey's jackknife pseudo-values over seeds: one row per seed (index), one column per number
    of ``statistic`` (points -> Series), ``n theta(all) - (n-1) theta(all but that seed)``."""
    if seed_col not in points.columns:
        raise ValueError(f"points have no {seed_col!r} column (columns: {list(points.columns)})")
    seeds = list(dict.fromkeys(points[seed_col]))
    n = len(seeds)
    if n < 2:
        raise ValueError(f"a jackknife over seeds needs at least 2 seeds, got {seeds}")
    full = statistic(points)
    without = pd.DataFrame({s: statistic(points[points[seed_col] != s]).reindex(full.index) for s in seeds}).T
    return n * full - (n - 1) * without
