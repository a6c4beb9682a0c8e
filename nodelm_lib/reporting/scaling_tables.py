"""Notebook 07's tables for the page: the size sweep's cells, fitted trends, slope tests and iso
read-offs as strings (estimate [CI]), and every interval's numbers at full precision.

They format the tables ``nodelm_lib.experiments.scaling`` computes (``cells_table``, ``analyse``,
``slope_tests``), which they take as arguments.
"""

from __future__ import annotations

import pandas as pd

from nodelm_lib.reporting.tables import format_mean_ci


def _interval_text(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """``"1.234 [1.200, 1.268]"``; "–" where the estimate is NaN."""
    if pd.isna(estimate):
        return "–"
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def display_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``scaling.cells_table`` as strings for the paper: mean ± CI half width, counts with separators."""
    return pd.DataFrame({
        "arm": table["arm"], "width": table["width"], "seeds": table["seeds"], "lr": table["lr"].map("{:g}".format),
        "non-emb params": table["params_non_embedding"].map("{:,}".format),
        "training FLOPs": table["train_flops"].map("{:.3g}".format),
        "val loss": [format_mean_ci(m, h) for m, h in zip(table["val_loss_mean"], table["val_loss_ci"])],
        "test loss": [format_mean_ci(m, h) for m, h in zip(table["test_loss_mean"], table["test_loss_ci"])],
        "ms/step": [format_mean_ci(m, h, 1) for m, h in zip(table["ms_per_step_mean"], table["ms_per_step_ci"])],
    })


def display_fits(fits: pd.DataFrame) -> pd.DataFrame:
    """``scaling.Analysis.fits`` as strings: estimate [95% CI, t over seeds] of E and alpha (power
    laws) and of the loss change per doubling of x at the middle of the arm's range (both forms)."""
    return pd.DataFrame({
        "x": fits["axis"], "arm": fits["arm"], "form": fits["form"], "sizes": fits["sizes"],
        "E": [_interval_text(*r) for r in fits[["E", "E_ci_low", "E_ci_high"]].to_numpy()],
        "alpha": [_interval_text(*r) for r in fits[["alpha", "alpha_ci_low", "alpha_ci_high"]].to_numpy()],
        "per doubling": [_interval_text(*r) for r in fits[["slope_per_doubling", "slope_per_doubling_ci_low",
                                                           "slope_per_doubling_ci_high"]].to_numpy()],
        "why this form": fits["why"],
    })


def display_iso(iso: pd.DataFrame, reference: str = "gpt") -> pd.DataFrame:
    """``scaling.Analysis.iso`` as strings, the reference's own rows left out (its loss is in every other
    row's difference)."""
    rows = iso[iso["arm"] != reference]
    ref = iso[iso["arm"] == reference].set_index(["axis", "width"])
    return pd.DataFrame({
        "at": rows["axis"].map(lambda a: f"{reference}'s {a}"), f"{reference} width": rows["width"],
        "x": rows["x"].map("{:.3g}".format), "arm": rows["arm"],
        f"{reference} loss": [_interval_text(*ref.loc[(a, w), ["loss", "loss_ci_low", "loss_ci_high"]])
                              for a, w in zip(rows["axis"], rows["width"])],
        "arm loss": [_interval_text(*r) for r in rows[["loss", "loss_ci_low", "loss_ci_high"]].to_numpy()],
        f"minus {reference}'s": [_interval_text(*r) for r in rows[["diff", "diff_ci_low", "diff_ci_high"]].to_numpy()],
        "extrapolated": rows["extrapolated"].map({True: "yes", False: "no"}),
        "p (t, Holm)": rows["p_t_holm"].map(lambda p: "–" if pd.isna(p) else f"{p:.3g}"),
        "p (TOST, Holm)": rows["p_tost_holm"].map(lambda p: "–" if pd.isna(p) else f"{p:.3g}"),
        "verdict": rows["verdict"],
    }).reset_index(drop=True)


def interval_table(intervals: pd.DataFrame) -> pd.DataFrame:
    """Every number of ``scaling.Analysis.intervals`` with its t-interval over seeds at full
    precision: axis, arm, what, width (0: not per width), estimate, sd_boot (the SD over the seed
    resamples), ci_low, ci_high, n_seeds, n_boot (resamples), exact (all of them)."""
    out = intervals.copy()
    out.index = out.index.set_names(["axis", "arm", "what", "width"])
    return out.reset_index()


def _slope_verdict(row, reference: str) -> str:
    """The slope test's verdict in words: the arm's loss falls faster or slower with x than the
    reference's (Holm), or not resolved."""
    if row["verdict"] == "better":
        return f"falls faster than {reference}'s"
    if row["verdict"] == "worse":
        return f"falls slower than {reference}'s"
    return f"not resolved at {int(row['n'])} seeds"


def display_slopes(slopes: pd.DataFrame, axis_labels: dict, reference: str = "gpt") -> pd.DataFrame:
    """``scaling.slope_tests_with_and_without`` as strings: per analysis (all runs, diverged runs
    left out), x axis and arm, the arm's and the reference's loss change per doubling (mean of the
    per-seed fits [95% CI, t over seeds]), their paired difference with its CI, the Holm-adjusted
    paired t and Wilcoxon p and the verdict. ``axis_labels`` maps an axis key to its label
    (``scaling.AXES``' second items)."""
    def p_text(p):
        return "–" if pd.isna(p) else f"{p:.3g}"

    return pd.DataFrame({
        "runs": [r if n == 0 else f"{r} ({n})" for r, n in zip(slopes["runs"], slopes["n_left_out"])],
        "x": slopes["axis"].map(axis_labels), "arm": slopes["arm"], "seeds": slopes["n"],
        "arm per doubling": [_interval_text(*r) for r in slopes[["slope", "slope_ci_low", "slope_ci_high"]].to_numpy()],
        f"{reference} per doubling": [_interval_text(*r) for r in slopes[["reference_slope", "reference_slope_ci_low",
                                                                           "reference_slope_ci_high"]].to_numpy()],
        f"minus {reference}'s": [_interval_text(*r) for r in slopes[["mean_diff", "ci_low", "ci_high"]].to_numpy()],
        "p (t, Holm)": slopes["p_t_holm"].map(p_text),
        "p (Wilcoxon, Holm)": slopes["p_wilcoxon_holm"].map(p_text),
        "verdict": [_slope_verdict(row, reference) for _, row in slopes.iterrows()],
    }).reset_index(drop=True)
