"""Does a spectrum grow with depth t? Per-curve trends and a test across seeds (notebook 04).

**Growth with depth** (``depth_trend_test``): whether a weight spectrum's mean |lambda| grows with
t is read from every solver time and every seed: per seed the least-squares slope of the heads'
pooled value against t, then the mean slope across seeds with a t-based CI and a one-sample
t-test, Holm-corrected over the (model, kind) rows.

``depth_trend`` describes single curves (one per head, no test); ``pooled_over_heads`` pools the
heads at each t. The tables are ``WeightSpectra.summary()`` rows (``spectral.py``) with ``model``
and ``seed`` columns; ``with_seed`` reads those written before notebook 04 trained several seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nodelm_lib.reporting import stats


def _slope(t: np.ndarray, v: np.ndarray) -> float:
    """Least-squares slope of v against t (NaN with fewer than two times)."""
    return float(np.polyfit(t, v, 1)[0]) if len(t) > 1 else float("nan")


def _spearman(t: np.ndarray, v: np.ndarray) -> float:
    """Spearman's rank correlation of v with t (average ranks for ties; NaN if v is constant)."""
    rt, rv = pd.Series(t).rank().to_numpy(), pd.Series(v).rank().to_numpy()
    return float(np.corrcoef(rt, rv)[0, 1]) if len(t) > 1 and rv.std() > 0 else float("nan")


def depth_trend(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "kind", "head")) -> pd.DataFrame:
    """Does ``value`` grow with t? Per group: the first and last values, their ratio, the
    least-squares slope in t, Spearman's rank correlation with t, and whether every step increases.
    One curve per group, no test: ``depth_trend_test`` tests the slope across seeds."""
    by = [c for c in by if c in summary.columns]
    rows = []
    for key, g in summary.groupby(by, sort=False):
        g = g.sort_values("t")
        t, v = g.t.to_numpy(), g[value].to_numpy()
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), first=v[0], last=v[-1],
                         ratio=v[-1] / v[0], slope=_slope(t, v), spearman=_spearman(t, v),
                         monotone_up=bool(np.all(np.diff(v) > 0))))
    return pd.DataFrame(rows)


def with_seed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``seed`` column: tables written before notebook 04 trained several seeds
    hold one run, of seed 0, and have none."""
    return table if "seed" in table.columns else table.assign(seed=0)


def pooled_over_heads(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "seed", "kind")) -> pd.DataFrame:
    """``value`` of all heads together at each t: per (``by``, t) the heads' values averaged with
    their numbers of eigenvalues (``n_eigs``) as weights, so that a head-pooled ``mean_abs`` is the
    mean |lambda| over every head's eigenvalues (as ``dynamics_summary`` pools them). Columns:
    ``by``, ``t``, ``value``. A table without ``seed`` counts as one run of seed 0 (``with_seed``)."""
    summary = with_seed(summary)
    missing = {value, "t", "n_eigs", *by} - set(summary.columns)
    if missing:
        raise ValueError(f"the spectra table lacks column(s) {sorted(missing)}; it has {list(summary.columns)}")
    weighted = summary.assign(_w=summary[value] * summary.n_eigs)
    pooled = weighted.groupby([*by, "t"], sort=False).agg(_w=("_w", "sum"), _n=("n_eigs", "sum")).reset_index()
    # groups in the order they first appear (models and kinds as the table lists them), t ascending in each
    return (pooled.assign(**{value: pooled._w / pooled._n}).drop(columns=["_w", "_n"])
            .sort_values("t", kind="stable").reset_index(drop=True))


TREND_COLUMNS = ("model", "kind", "n_seeds", "n_times", "level", "slope_mean", "slope_sd", "ci_low", "ci_high",
                 "rel_slope", "t_stat", "p", "p_holm", "n_up", "spearman_mean", "verdict")


def depth_trend_test(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "kind"), alpha: float = 0.05,
                     confidence: float = 0.95) -> pd.DataFrame:
    """Does ``value`` grow with depth? A test over every solver time and every seed.

    For each group of ``by`` (one row per (model, kind) by default) and each seed: the heads'
    ``value`` pooled at each t (``pooled_over_heads``), its least-squares slope against t over all
    the solver's times, and Spearman's rank correlation with t. Across seeds (independent
    trainings, so the slopes are independent): ``slope_mean``, ``slope_sd``, the t-based
    ``confidence`` interval (``ci_low``, ``ci_high``), the one-sample t-test of a zero mean slope
    (``t_stat``, ``p``: ``stats.paired_test`` of the slopes against zero slopes) and ``n_up``, the
    seeds whose slope is positive. ``p_holm``: Holm's correction over every row (the family is the
    table's groups). ``verdict``: "grows with depth" or "shrinks with depth" where ``p_holm < alpha``,
    else "not resolved at n = <seeds>". ``level`` is the mean of ``value`` over times and seeds and
    ``rel_slope`` = slope_mean / level (growth per unit of t relative to the size of the values).

    Why not the ratio of the last to the first t: two endpoints of one curve do not say whether it
    rises across depth, and one seed does not say whether another training would agree. With one
    seed (or a table without ``seed``) there is no test: the row has its slope, NaN p, and is not
    resolved at n = 1.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    by = list(by)
    pooled = pooled_over_heads(summary, value, by=[*by, "seed"])
    rows = []
    for key, g in pooled.groupby(by, sort=False):
        per_seed = [(_slope(s.t.to_numpy(), s[value].to_numpy()), _spearman(s.t.to_numpy(), s[value].to_numpy()))
                    for _, s in g.groupby("seed", sort=True)]  # each seed's times ascending (pooled_over_heads)
        slopes, rhos = np.array([s for s, _ in per_seed]), np.array([r for _, r in per_seed])
        n = len(slopes)
        test = (stats.paired_test(slopes, np.zeros(n), confidence) if n > 1 else
                dict(mean_diff=float(slopes[0]), sd_diff=np.nan, ci_low=np.nan, ci_high=np.nan, t=np.nan, p_t=np.nan))
        level = float(g[value].mean())
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), n_seeds=n, n_times=g.t.nunique(),
                         level=level, slope_mean=test["mean_diff"], slope_sd=test["sd_diff"], ci_low=test["ci_low"],
                         ci_high=test["ci_high"], rel_slope=test["mean_diff"] / level, t_stat=test["t"],
                         p=test["p_t"], n_up=int((slopes > 0).sum()),
                         spearman_mean=float(np.nanmean(rhos)) if np.isfinite(rhos).any() else np.nan))
    table = pd.DataFrame(rows)
    if table.empty:
        raise ValueError(f"no rows to test: the spectra table has no {value!r} values")
    table["p_holm"] = stats.holm(table.p.to_numpy(float))
    table["verdict"] = [trend_verdict(r.slope_mean, r.p_holm, r.n_seeds, alpha) for r in table.itertuples()]
    return table[[*by, *[c for c in TREND_COLUMNS if c not in ("model", "kind")]]]


def trend_verdict(slope_mean: float, p_holm: float, n_seeds: int, alpha: float = 0.05) -> str:
    """The words for one row of ``depth_trend_test``: a direction only where Holm's p resolves it."""
    if np.isfinite(p_holm) and p_holm < alpha:
        return "grows with depth" if slope_mean > 0 else "shrinks with depth"
    return f"not resolved at n = {n_seeds}"
