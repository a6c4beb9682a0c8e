"""Multi-seed statistics for comparing model arms trained with the same seeds.

Every arm of an experiment is trained once per seed, and seed ``s`` gives every arm the
same data order and evaluation batches, so arms are compared *paired by seed*: the
unit of analysis is the per-seed difference ``d_s = metric(arm, s) - metric(ref, s)``.

* :func:`mean_ci` -- mean, sample SD and t-based confidence interval of one arm.
* :func:`paired_test` -- paired t-test (primary), exact Wilcoxon signed-rank test
  (robustness check) and paired effect sizes.
* :func:`tost` -- paired two one-sided tests: equivalence within a margin fixed beforehand.
* :func:`holm` -- Holm--Bonferroni step-down adjusted p-values.

The two tables of a results section (``compare_arms``, ``summary_table``) and ``holm_family``
(the comparisons of several tables adjusted as one family) are :mod:`nodelm_lib.reporting.comparisons`.
Display strings and ``.csv`` / ``.md`` / ``.tex`` files of these tables are
:mod:`nodelm_lib.reporting.tables`.

Means, intervals, the paired t-test and Holm's correction are computed here from their
formulas (the tests compare them with scipy's). The Wilcoxon test is scipy's
(``scipy.stats.wilcoxon``) wherever scipy's p is right; for tied ``|d|`` its exact p is not,
and the count over all sign assignments is done here (see :func:`wilcoxon_signed_rank`).

(The solver's counters of field evaluations and steps are ``nodelm_lib.ode.SolveStats``;
nothing here is about solvers.)
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy import stats as _dist

#: Wilcoxon signed-rank p-values are exact (all 2**n sign assignments) up to this many
#: non-zero differences, and use the tie-corrected normal approximation above it.
WILCOXON_EXACT_MAX_N = 20


# --------------------------------------------------------------------------- helpers


def _as_1d(values, name: str) -> np.ndarray:
    """``values`` as a 1-D float array (ValueError naming ``name`` otherwise)."""
    try:
        x = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric, got {values!r}") from exc
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
    return x


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def _t_quantile(confidence: float, df: int) -> float:
    """Two-sided critical value ``t_{(1+c)/2, df}``."""
    return float(_dist.t.ppf((1.0 + confidence) / 2.0, df))


# --------------------------------------------------------------------------- one arm


def mean_ci(values, confidence: float = 0.95) -> dict:
    """Mean, sample SD and t-based confidence interval of ``values``.

    NaNs are dropped first (a missing or diverged run) and ``n`` counts the remaining
    values. With ``x_1..x_n``::

        mean    = sum(x) / n
        sd      = sqrt(sum((x - mean)^2) / (n - 1))        (sample SD, ddof = 1)
        sem     = sd / sqrt(n)
        ci_half = t_{(1+c)/2, n-1} * sem
        ci      = [mean - ci_half, mean + ci_half]

    ``n == 1`` gives the mean with ``sd``, ``sem`` and the interval NaN; no values at
    all (or only NaNs) is a ValueError.
    """
    confidence = _check_confidence(confidence)
    x = _as_1d(values, "values")
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        raise ValueError("mean_ci needs at least 1 non-NaN value, got none")
    mean = float(x.mean())
    if n < 2:
        sd = sem = half = math.nan
    else:
        sd = float(x.std(ddof=1))
        sem = sd / math.sqrt(n)
        half = _t_quantile(confidence, n - 1) * sem
    return {
        "n": n, "mean": mean, "sd": sd, "sem": sem,
        "ci_low": mean - half, "ci_high": mean + half, "ci_half": half,
    }


# --------------------------------------------------------------------------- paired tests


def _signed_rank_null_counts(doubled_ranks: np.ndarray) -> np.ndarray:
    """``counts[w]`` = number of the 2**n sign assignments whose ``2 W+`` equals ``w``.

    Each rank r_i is independently + or - under H0, so the generating function of
    ``2 W+`` is ``prod_i (1 + z^{2 r_i})``; multiplying it out one factor at a time
    counts every one of the 2**n assignments exactly (ties included, since the doubled
    average ranks are integers) without listing them one by one.
    """
    total = int(doubled_ranks.sum())
    counts = np.zeros(total + 1, dtype=np.int64)
    counts[0] = 1
    for r in doubled_ranks.astype(np.int64):
        counts[r:] = counts[r:] + counts[: total + 1 - r].copy()
    return counts


def _has_ties(x: np.ndarray) -> bool:
    return np.unique(x).size < x.size


def wilcoxon_signed_rank(differences) -> dict:
    """Two-sided Wilcoxon signed-rank test of ``differences`` (H0: symmetric about 0).

    Zero differences are dropped (Wilcoxon's method, scipy's ``zero_method="wilcox"``);
    the remaining ``m`` values are ranked by ``|d|`` with average ranks for ties, and
    ``W+ = sum of the ranks of the positive differences``.

    * ``m <= WILCOXON_EXACT_MAX_N``: exact null distribution over all ``2**m`` sign
      assignments of those ranks, ``p = min(1, 2 * min(P(W >= W+), P(W <= W+)))``.
      Without ties this is ``scipy.stats.wilcoxon(d, method="exact")``. With tied ``|d|``
      scipy's exact p is *not* exact: it evaluates the average-rank statistic against the
      null distribution of untied ranks 1..m, which misses the true p either way (for
      ``d = [0.5, 0.5, -0.5, 1, 1, 2]`` it gives 0.094 where all 64 sign assignments give
      0.125; for ``[1, 1, 2, -2, 3, 3, 3, -0.5, 4]`` 0.055 against 0.043). There the count is
      done here (:func:`_signed_rank_null_counts`), on the tied ranks themselves.
    * larger ``m``: normal approximation without continuity correction,
      ``z = (W+ - sum(r)/2) / sqrt(sum(r^2)/4)`` (the usual tie-corrected variance
      ``m(m+1)(2m+1)/24 - sum(t^3 - t)/48``), ``p = 2 * (1 - Phi(|z|))``:
      ``scipy.stats.wilcoxon(d, method="asymptotic")``, which agrees with ties too.

    No non-zero differences at all gives ``p = 1``. Returns ``n_nonzero``, ``w_plus``,
    ``p`` and ``method`` (``"exact"``, ``"normal"`` or ``"all zero"``).

    With ``m`` non-zero differences the smallest two-sided exact p is ``2 / 2**m``:
    0.0625 for ``m = 5``, so with five seeds it can never reach 0.05.
    """
    d = _as_1d(differences, "differences")
    if np.isnan(d).any():
        raise ValueError("differences contain NaN")
    d = d[d != 0]
    m = int(d.size)
    if m == 0:
        return {"n_nonzero": 0, "w_plus": 0.0, "p": 1.0, "method": "all zero"}
    ranks = _dist.rankdata(np.abs(d))  # tied values share the average of their ranks
    w_plus = float(ranks[d > 0].sum())
    if m > WILCOXON_EXACT_MAX_N:
        p, method = _dist.wilcoxon(d, method="asymptotic").pvalue, "normal"
    elif _has_ties(np.abs(d)):
        p, method = _exact_p_with_ties(ranks, w_plus), "exact"
    else:
        p, method = _dist.wilcoxon(d, method="exact").pvalue, "exact"
    return {"n_nonzero": m, "w_plus": w_plus, "p": float(p), "method": method}


def _exact_p_with_ties(ranks: np.ndarray, w_plus: float) -> float:
    """Two-sided exact p of ``W+`` under H0 for (possibly tied) average ``ranks``."""
    counts = _signed_rank_null_counts(np.rint(2 * ranks).astype(np.int64))
    w2 = int(np.rint(2 * w_plus))
    lower = counts[: w2 + 1].sum()  # #{W <= W+}
    upper = counts[w2:].sum()  # #{W >= W+}
    return min(1.0, 2.0 * min(lower, upper) / 2.0 ** ranks.size)


def paired_test(a, b, confidence: float = 0.95) -> dict:
    """Paired comparison of ``a`` and ``b`` (``a[i]``, ``b[i]`` from the same seed).

    With ``d_i = a_i - b_i``, ``i = 1..n``::

        mean_diff = mean(d),   sd_diff = sqrt(sum((d - mean_diff)^2) / (n - 1))
        t         = mean_diff / (sd_diff / sqrt(n)),        df = n - 1
        p_t       = 2 * P(T_{n-1} >= |t|)                   (two-sided paired t-test)
        ci        = mean_diff -/+ t_{(1+c)/2, n-1} * sd_diff / sqrt(n)
        d_z       = mean_diff / sd_diff                     (paired Cohen's d)
        hedges_gz = d_z * (1 - 3 / (4 (n - 1) - 1))          (small-sample correction)

    ``p_wilcoxon`` is the two-sided Wilcoxon signed-rank p of ``d``
    (:func:`wilcoxon_signed_rank`: exact for up to 20 non-zero differences, zeros
    dropped, ties given average ranks); ``n_nonzero`` counts the differences it used.

    The paired t-test is the primary test. The Wilcoxon test is a robustness check
    only: with ``n = 5`` seeds its smallest possible exact two-sided p is
    ``2 / 2**5 = 0.0625``, so it can never reach 0.05 however large the effect.

    Degenerate cases: all differences zero gives ``p_t = p_wilcoxon = 1`` and ``t``,
    ``d_z``, ``hedges_gz`` NaN; identical non-zero differences (``sd_diff = 0``) give
    ``t = d_z = +-inf`` and ``p_t = 0``. NaNs are an error: drop the seed explicitly.
    """
    confidence = _check_confidence(confidence)
    a = _as_1d(a, "a")
    b = _as_1d(b, "b")
    if a.size != b.size:
        raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
    for name, x in (("a", a), ("b", b)):
        if np.isnan(x).any():
            bad = np.flatnonzero(np.isnan(x)).tolist()
            raise ValueError(f"{name} contains NaN at positions {bad}; drop those pairs first")
    n = int(a.size)
    if n < 2:
        raise ValueError(f"paired_test needs at least 2 pairs, got {n}")
    d = a - b
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    half = _t_quantile(confidence, n - 1) * se
    if sd > 0:
        t = mean / se
        p_t = float(2.0 * _dist.t.sf(abs(t), n - 1))
        d_z = mean / sd
    elif mean == 0:  # all differences zero: no evidence of any difference
        t, p_t, d_z = math.nan, 1.0, math.nan
    else:  # every seed moved by exactly the same non-zero amount
        t = d_z = math.copysign(math.inf, mean)
        p_t = 0.0
    hedges = d_z * (1.0 - 3.0 / (4.0 * (n - 1) - 1.0))
    wil = wilcoxon_signed_rank(d)
    return {
        "n": n, "mean_diff": mean, "sd_diff": sd,
        "ci_low": mean - half, "ci_high": mean + half,
        "t": t, "p_t": p_t,
        "p_wilcoxon": wil["p"], "n_nonzero": wil["n_nonzero"],
        "d_z": d_z, "hedges_gz": hedges,
    }


def tost(a, b, margin: float, confidence: float = 0.95) -> dict:
    """Paired equivalence test (two one-sided t-tests, TOST) of ``a`` and ``b`` within
    ``+-margin``, a margin fixed before looking at the data.

    With ``d_i = a_i - b_i``, ``se = sd(d) / sqrt(n)`` and ``df = n - 1``::

        p_lower = P(T_df >= (mean(d) + margin) / se)     H0: mean <= -margin
        p_upper = P(T_df <= (mean(d) - margin) / se)     H0: mean >= +margin
        p_tost  = max(p_lower, p_upper)

    ``p_tost < alpha`` is the same as the ``1 - 2 alpha`` confidence interval of the mean
    difference lying inside ``(-margin, margin)`` (returned as ``ci90_low``, ``ci90_high`` for
    alpha = 0.05: ``confidence`` is the level of that two-sided interval's parent, 1 - alpha).
    Identical differences (sd 0) are equivalent exactly when ``|mean| < margin``.
    """
    # numbers.Real: numpy scalars too (a margin read from a table is often np.float32)
    if not (isinstance(margin, numbers.Real) and not isinstance(margin, bool) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin={margin!r} is not valid; it must be a finite number > 0 (in the metric's units)")
    confidence = _check_confidence(confidence)
    a, b = _as_1d(a, "a"), _as_1d(b, "b")
    if a.size != b.size:
        raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("a or b contains NaN; drop those pairs first")
    n = int(a.size)
    if n < 2:
        raise ValueError(f"tost needs at least 2 pairs, got {n}")
    d = a - b
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    alpha = 1.0 - confidence
    half = float(_dist.t.ppf(1.0 - alpha, n - 1)) * se
    if se > 0:
        p_lower = float(_dist.t.sf((mean + margin) / se, n - 1))
        p_upper = float(_dist.t.cdf((mean - margin) / se, n - 1))
    else:
        p_lower = 0.0 if mean > -margin else 1.0
        p_upper = 0.0 if mean < margin else 1.0
    return {"n": n, "mean_diff": mean, "margin": float(margin), "p_lower": p_lower, "p_upper": p_upper,
            "p_tost": max(p_lower, p_upper), "ci90_low": mean - half, "ci90_high": mean + half}


def holm(pvalues) -> np.ndarray:
    """Holm--Bonferroni step-down adjusted p-values, in input order.

    With the ``m`` non-NaN p-values sorted ``p_(1) <= ... <= p_(m)``::

        p~_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))

    so adjusted values are monotone in the raw ones and capped at 1. Rejecting
    ``p~ < alpha`` controls the family-wise error rate at ``alpha``. NaNs are passed
    through and do not count towards ``m``.
    """
    p = _as_1d(pvalues, "pvalues")
    ok = ~np.isnan(p)
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p[ok][(p[ok] < 0) | (p[ok] > 1)].tolist()}")
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(ok)
    m = idx.size
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = (m - np.arange(m)) * p[order]
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out


# --------------------------------------------------------------------------- arms of a data frame


