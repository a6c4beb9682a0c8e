"""Multi-seed statistics for comparing model arms trained with the same seeds.

Every arm of an experiment is trained once per seed, and seed ``s`` gives every arm the
same data order and evaluation batches, so arms are compared *paired by seed*: the
unit of analysis is the per-seed difference ``d_s = metric(arm, s) - metric(ref, s)``.

* :func:`mean_ci` -- mean, sample SD and t-based confidence interval of one arm.
* :func:`paired_test` -- paired t-test (primary), exact Wilcoxon signed-rank test
  (robustness check) and paired effect sizes.
* :func:`tost` -- paired two one-sided tests: equivalence within a margin fixed beforehand.
* :func:`holm` -- Holm--Bonferroni step-down adjusted p-values; :func:`holm_family` re-adjusts
  the comparisons of several tables as one family (every comparison a notebook reports).
* :func:`compare_arms` / :func:`summary_table` -- the two tables of a results section,
  built from a long data frame with one row per run.

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
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as _dist

#: Wilcoxon signed-rank p-values are exact (all 2**n sign assignments) up to this many
#: non-zero differences, and use the tie-corrected normal approximation above it.
WILCOXON_EXACT_MAX_N = 20

COMPARE_COLUMNS = [
    "arm", "reference", "n", "mean_diff", "ci_low", "ci_high", "t", "p_t", "p_t_holm",
    "p_wilcoxon", "p_wilcoxon_holm", "d_z", "hedges_gz", "verdict",
]


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
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
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


def require_columns(df: pd.DataFrame, columns: Iterable[str]) -> None:
    """ValueError naming the ``columns`` missing from ``df`` and the ones it has."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the data frame (it has {list(df.columns)})")


def check_one_run_per_seed(df: pd.DataFrame, arm: str = "arm", seed: str = "seed") -> None:
    """ValueError naming every arm with more than one row for a seed (and those rows' config
    hashes where ``df`` has them): each arm is trained once per seed, and a second row (a record
    copied under another run's name, a run listed twice) would count one seed twice and break
    the pairing by seed."""
    twice = df[df.duplicated([arm, seed], keep=False)]
    if twice.empty:
        return
    found = []
    for name, rows in twice.groupby(arm, sort=False):
        runs = f" (runs {', '.join(map(str, rows['config_hash']))})" if "config_hash" in rows else ""
        found.append(f"arm {name!r} has more than one run for seeds {sorted(rows[seed].unique().tolist())}{runs}")
    raise ValueError(f"{'; '.join(found)}. Each arm has one run per seed: drop the duplicate rows, or look for "
                     "copied records in the store (python -m nodelm_lib store check <store>)")


def _arms_in_order(df: pd.DataFrame, arm: str) -> list:
    return list(pd.unique(df[arm]))


def _per_seed(df: pd.DataFrame, name, metric: str, arm: str, seed: str) -> pd.Series:
    """``metric`` of arm ``name`` indexed by seed (NaN runs left out)."""
    runs = df[df[arm] == name]
    dup = runs[seed][runs[seed].duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"arm {name!r} has more than one run for seeds {dup}")
    values = runs.set_index(seed)[metric].astype(float)
    return values.dropna()


def compare_arms(
    df: pd.DataFrame,
    metric: str,
    reference,
    arm: str = "arm",
    seed: str = "seed",
    higher_is_better: bool = False,
    allow_missing: bool = False,
    alpha: float = 0.05,
    confidence: float = 0.95,
    equivalence_margin: float | None = None,
) -> pd.DataFrame:
    """Compare every arm of ``df`` with ``reference``, paired by seed.

    ``df`` is long format, one row per run (columns ``arm``, ``seed``, ``metric``, ...).
    For every other arm (in order of first appearance) the runs are paired by seed with
    the reference's and :func:`paired_test` (arm - reference) is applied; so
    ``mean_diff > 0`` means the arm's metric is higher. ``p_t_holm`` and
    ``p_wilcoxon_holm`` are :func:`holm`-adjusted over the comparisons of this table.

    ``verdict`` is ``"better"`` / ``"worse"`` when the Holm-adjusted paired t p is below
    ``alpha`` (direction from ``higher_is_better``: ``False`` for losses), otherwise
    ``"no significant difference"``. With ``equivalence_margin`` (fixed before looking, in the
    metric's units) a paired TOST (:func:`tost`) adds ``margin``, ``p_tost`` and ``p_tost_holm``,
    and a difference that is not significant is "equivalent (±margin)" where TOST says so and
    "not resolved at n seeds" where it does not.

    Seeds: a run whose metric is NaN counts as missing. An arm and the reference must
    have the same seeds; a mismatch (either way) is a ValueError naming the seeds,
    unless ``allow_missing=True``, when only the seeds present in both are used.
    """
    require_columns(df, [arm, seed, metric])
    check_one_run_per_seed(df, arm, seed)
    arms = _arms_in_order(df, arm)
    if reference not in arms:
        raise ValueError(f"unknown reference arm {reference!r}; valid arms are {arms}")
    others = [a for a in arms if a != reference]
    if not others:
        raise ValueError(f"nothing to compare: {reference!r} is the only arm")
    ref = _per_seed(df, reference, metric, arm, seed)
    rows = []
    for name in others:
        values = _per_seed(df, name, metric, arm, seed)
        only_ref = sorted(set(ref.index) - set(values.index))
        only_arm = sorted(set(values.index) - set(ref.index))
        if (only_ref or only_arm) and not allow_missing:
            raise ValueError(
                f"arm {name!r} and reference {reference!r} have different seeds for {metric!r}: "
                f"missing from {name!r}: {only_ref}, missing from {reference!r}: {only_arm} "
                "(pass allow_missing=True to use only the seeds they share)"
            )
        common = sorted(set(ref.index) & set(values.index))
        if len(common) < 2:
            raise ValueError(f"arm {name!r} shares {len(common)} seed(s) with {reference!r}; need at least 2")
        a, b = values.loc[common].to_numpy(), ref.loc[common].to_numpy()
        res = paired_test(a, b, confidence)
        if equivalence_margin is not None:
            res.update(margin=float(equivalence_margin), p_tost=tost(a, b, equivalence_margin, 1.0 - alpha)["p_tost"])
        rows.append({"arm": name, "reference": reference, **res})
    columns = list(COMPARE_COLUMNS)
    if equivalence_margin is not None:
        columns[-1:-1] = ["margin", "p_tost", "p_tost_holm"]
    return with_verdicts(pd.DataFrame(rows), higher_is_better, alpha)[columns]


def with_verdicts(tests: pd.DataFrame, higher_is_better: bool = False, alpha: float = 0.05) -> pd.DataFrame:
    """``tests`` (``compare_arms``' rows, or several tables' rows concatenated: one family) with
    ``p_t_holm`` / ``p_wilcoxon_holm`` (and ``p_tost_holm`` where there is a ``p_tost``) adjusted
    over all of its rows, and ``verdict``: "better" / "worse" where the Holm-adjusted paired t p
    is below ``alpha``; otherwise, with an equivalence margin, "equivalent (+-margin)" where the
    Holm-adjusted TOST p is below ``alpha`` and "not resolved at n seeds" where neither test
    decides; without one, "no significant difference"."""
    out = tests.copy()
    out["p_t_holm"] = holm(out["p_t"])
    out["p_wilcoxon_holm"] = holm(out["p_wilcoxon"])
    has_tost = "p_tost" in out.columns
    if has_tost:
        out["p_tost_holm"] = holm(out["p_tost"])
    out["verdict"] = [
        _verdict(row["mean_diff"], row["p_t_holm"], higher_is_better, alpha,
                 row["p_tost_holm"] if has_tost else None, row.get("margin"), int(row["n"]))
        for _, row in out.iterrows()
    ]
    return out


def holm_family(tables: dict[str, pd.DataFrame], higher_is_better: bool = False, alpha: float = 0.05) -> pd.DataFrame:
    """Every comparison of several ``compare_arms`` tables as one family (e.g. all that a notebook
    reports): concatenated with a ``family`` column naming each table, Holm-adjusted over all rows
    together, verdicts recomputed (``with_verdicts``)."""
    if not tables:
        raise ValueError("tables is empty: give {name: compare_arms table}")
    both = pd.concat([t.assign(family=name) for name, t in tables.items()], ignore_index=True)
    out = with_verdicts(both, higher_is_better, alpha)
    return out[["family", *[c for c in out.columns if c != "family"]]]


def _verdict(mean_diff: float, p_holm: float, higher_is_better: bool, alpha: float,
             p_tost_holm: float | None = None, margin: float | None = None, n: int = 0) -> str:
    if p_holm < alpha and mean_diff != 0:  # NaN p compares False
        return "better" if (mean_diff > 0) == higher_is_better else "worse"
    if p_tost_holm is None:
        return "no significant difference"
    if p_tost_holm < alpha:
        return f"equivalent (±{margin:g})"
    return f"not resolved at {n} seeds"


def summary_table(
    df: pd.DataFrame,
    metrics: Sequence[str],
    arm: str = "arm",
    order: Sequence | None = None,
    confidence: float = 0.95,
    seed: str = "seed",
) -> pd.DataFrame:
    """One row per arm: ``n`` (runs) and ``<metric>_mean``, ``<metric>_ci``, ``<metric>_sd``.

    Where ``df`` has a ``seed`` column, two rows of one (arm, seed) are an error
    (``check_one_run_per_seed``).

    ``<metric>_ci`` is the :func:`mean_ci` half width ``t_{(1+c)/2, n-1} sd / sqrt(n)``.
    Rows follow ``order`` if given (a subset of the arms is allowed), else first
    appearance. NaN values are dropped per metric; if that leaves some arm with fewer
    values than runs, a ``<metric>_n`` column is added for that metric.
    """
    if isinstance(metrics, str):
        metrics = [metrics]
    require_columns(df, [arm, *metrics])
    if seed in df.columns:
        check_one_run_per_seed(df, arm, seed)
    arms = _arms_in_order(df, arm)
    if order is not None:
        unknown = [a for a in order if a not in arms]
        if unknown:
            raise ValueError(f"unknown arms {unknown} in order; valid arms are {arms}")
        arms = list(order)
    rows = []
    for name in arms:
        runs = df[df[arm] == name]
        row = {arm: name, "n": len(runs)}
        for metric in metrics:
            stats = mean_ci(runs[metric].astype(float), confidence) if runs[metric].notna().any() else None
            row[f"{metric}_mean"] = stats["mean"] if stats else math.nan
            row[f"{metric}_ci"] = stats["ci_half"] if stats else math.nan
            row[f"{metric}_sd"] = stats["sd"] if stats else math.nan
            row[f"{metric}_n"] = stats["n"] if stats else 0
        rows.append(row)
    out = pd.DataFrame(rows)
    for metric in metrics:
        if (out[f"{metric}_n"] == out["n"]).all():
            out = out.drop(columns=f"{metric}_n")
    return out
