"""Notebook 09's figure: loss against inference compute, in NFE per token and in milliseconds per
token, for every arm solved at every setting (``experiments.inference_compute.curve_table``) with the
fixed-depth models as single points at their own compute. Tables come in as arguments: reporting
sits below experiments."""

from __future__ import annotations

from typing import Iterable

import matplotlib.pyplot as plt
import pandas as pd

from .style import CI_LABEL, arm_line


def compute_figure(table: pd.DataFrame, points: pd.DataFrame, order: Iterable[str], loss_unit: str = "nats/token",
                   split: str = "test", title: str | None = None) -> plt.Figure:
    """Two panels: loss against NFE per token (log2 axis) and against ms per token. Each arm of
    ``table`` is a line over its fixed grids with its 95% CI band, and a hollow marker per adaptive
    tolerance; each model of ``points`` (per-seed rows: ``arm``, ``loss``, ``nfe``, ``ms_per_token``)
    is a filled star at its mean with its 95% CI (``mean_ci`` over seeds). An arm's colour is its
    arm's in every figure (``style.arm_line``: a variant "<arm> random" / "<arm> reg" has its arm's
    colour); solid lines are fixed-grid training, dashed random grids, dotted the regularised arm."""
    from nodelm_lib.reporting.stats import mean_ci

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    names = [a for a in order if a in set(table["arm"]) | set(points["arm"])]
    for arm in names:
        line = arm_line(arm)  # the arm's colour; the variant's line style
        color = line["color"]
        rows = table[table["arm"] == arm]
        fixed, adaptive = rows[~rows["adaptive"]].sort_values("nfe"), rows[rows["adaptive"]]
        for ax, x in zip(axes, ("nfe", "ms_per_token")):
            if len(fixed):
                ax.plot(fixed[x], fixed["loss"], linestyle=line["linestyle"], marker=line["marker"], color=color,
                        markersize=3, label=arm)
                if x == "nfe":  # the band on the NFE axis only: wall times are not monotone in the grid
                    ax.fill_between(fixed[x], fixed["ci_low"], fixed["ci_high"], color=color, alpha=0.12, linewidth=0)
            if len(adaptive):
                ax.plot(adaptive[x], adaptive["loss"], "o", mfc="none", color=color, markersize=6,
                        label=f"{arm} (adaptive)" if not len(fixed) else None)
        point = points[points["arm"] == arm]
        if len(point):
            ci = mean_ci(point["loss"].to_numpy())
            half = ci["ci_half"] if ci["n"] > 1 else 0.0
            for ax, x in zip(axes, ("nfe", "ms_per_token")):
                ax.errorbar(point[x].mean(), ci["mean"], yerr=half, fmt="*", color=color, markersize=11,
                            capsize=3, label=f"{arm} (as trained)" if ax is axes[0] else None)
    axes[0].set_xscale("log", base=2)
    axes[1].set_xscale("log")
    axes[0].set_xlabel("function evaluations (NFE) per token, log2")
    axes[1].set_xlabel("ms per token, log (this machine; adaptive: each prefix solved alone)")
    axes[0].set_ylabel(f"{split} loss ({loss_unit})")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2, loc="upper right")
    fig.suptitle(title or f"Loss against inference compute: lines are fixed grids (band: {CI_LABEL} over seeds; "
                          "dashed: trained on random grids), hollow circles adaptive tolerances, stars stacks of "
                          f"layers at their depth (± {CI_LABEL})",
                 fontsize=9)
    fig.tight_layout()
    return fig
