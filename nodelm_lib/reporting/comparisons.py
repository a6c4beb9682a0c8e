"""The comparisons of a results section, built from a long table with one row per run (arm,
seed, metrics): ``compare_arms`` (each arm against a reference, paired by seed: mean difference,
its interval, paired t and Wilcoxon, Holm, and TOST where a margin is given), ``holm_family``
(several such tables adjusted as one family), verdicts, and ``summary_table`` (per arm mean and
interval). The tests themselves are ``stats.py``'s."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import pandas as pd

from .stats import holm, mean_ci, paired_test, tost


COMPARE_COLUMNS = [
    "arm", "reference", "n", "mean_diff", "ci_low", "ci_high", "t", "p_t", "p_t_holm",
    "p_wilcoxon", "p_wilcoxon_holm", "d_z", "hedges_gz", "verdict",
]



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
