"""Notebook 07's figures: test loss against size and compute with each arm's fitted trend
(``loss_figure``), and the iso-parameter / iso-FLOP differences to the reference arm (``iso_figure``).

They draw the tables ``nodelm_lib.experiments.scaling`` computes (``cells_table``, ``analyse``) and
its axes (``scaling.AXES``), all taken as arguments: reporting sits below experiments.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd


def _colors(n: int) -> list:
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(n)]


def _reference_lines(ax, references: Mapping[str, float]) -> list[str]:
    """Dashed grey lines for the references inside the axes' y-range (labelled at the right end);
    returns the labels of those outside it (to name in a note)."""
    lo, hi = ax.get_ylim()
    outside = []
    for label, value in sorted(references.items(), key=lambda kv: kv[1]):
        if lo <= value <= hi:
            ax.axhline(value, color="grey", linestyle="--", linewidth=0.8, zorder=1)
            ax.annotate(f"{label} {value:.2f}", (0.99, value), xycoords=ax.get_yaxis_transform(), ha="right",
                        va="bottom", fontsize=7, color="dimgrey")
        else:
            outside.append(f"{label} {value:.2f}")
    return outside


def loss_figure(cells: pd.DataFrame, fitted: dict, order: Iterable[str], x_axes: Mapping[str, tuple[str, str]],
                references: Mapping[str, float] = (), loss_unit: str = "nats/token", confidence: float = 0.95,
                title: str | None = None):
    """Test loss against non-embedding parameters and against training FLOPs (log x): per arm and
    width the mean over seeds with its t-based CI (``cells``: ``scaling.cells_table`` at
    ``confidence``), and the arm's fitted trend over its range (``fitted``: (axis, arm) -> Trend).
    ``x_axes``: axis -> (column of ``cells``, label), ``scaling.AXES``. ``references`` (label ->
    loss: n-gram models, nanoGPT) are dashed lines where they fall inside the axes, and named in a
    note where they do not."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, axis in zip(axes, x_axes):
        col, label = x_axes[axis]
        for arm, color in zip(order, _colors(len(order))):
            own = cells[cells["arm"] == arm]
            ax.errorbar(own[col], own["test_loss_mean"], yerr=own["test_loss_ci"].fillna(0), fmt="o",
                        color=color, capsize=3, markersize=4)
            trend = fitted[(axis, arm)]
            xs = np.geomspace(trend.x_min, trend.x_max, 100)
            ax.plot(xs, trend(xs), color=color, linewidth=1.2, label=f"{arm} ({trend.form})")
        ax.set_xscale("log")
        # 200k, 500k, 1M: matplotlib's default labels every minor tick of a short log range, overlapping
        ax.xaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
        ax.set_xlabel(f"{label} (log scale)" + (" [FLOP]" if axis == "flops" else " [count]"))
    axes[0].set_ylabel(f"test loss ({loss_unit})")
    outside = []
    for ax in axes:
        ax.autoscale_view()
        outside = _reference_lines(ax, dict(references))
    n = int(cells["seeds"].min())
    fig.suptitle(title or f"test loss against size and compute: mean ± {confidence:.0%} CI over {n} seeds (t); "
                          "lines: fitted trends")
    rows = 1 + (len(order) > 4)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=min(len(order), 4), frameon=False,
               bbox_to_anchor=(0.5, 0.03))
    if outside:  # below the legend
        fig.text(0.5, 0.005, "off the axes: " + ", ".join(outside), fontsize=7, color="dimgrey", ha="center")
    fig.tight_layout(rect=(0, 0.06 + 0.05 * rows, 1, 1))
    return fig


def iso_figure(iso: pd.DataFrame, order: Iterable[str], margin: float, x_axes: Mapping[str, tuple[str, str]],
               reference: str = "gpt", loss_unit: str = "nats/token", confidence: float = 0.95,
               title: str | None = None):
    """Iso-parameter (left) and iso-FLOP (right) differences to ``reference`` across its widths:
    each arm's fitted loss at the reference's x minus the reference's, with the bootstrap CI
    (``iso``: ``scaling.Analysis.iso``); hollow markers are extrapolations. The shaded band is the
    equivalence margin. ``x_axes``: axis -> (column, label), ``scaling.AXES``."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    colors = dict(zip(order, _colors(len(order))))  # each arm the colour it has in loss_figure
    arms = [a for a in order if a != reference]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, axis in zip(axes, x_axes):
        label = x_axes[axis][1]
        rows = iso[(iso["axis"] == label) & (iso["arm"] != reference)]
        widths = sorted(rows["width"].unique())
        for i, arm in enumerate(arms):
            color = colors[arm]
            g = rows[rows["arm"] == arm].set_index("width").reindex(widths)
            pos = np.arange(len(widths)) + (i - (len(arms) - 1) / 2) * 0.1
            err = np.vstack([g["diff"] - g["diff_ci_low"], g["diff_ci_high"] - g["diff"]])
            for inside in (True, False):
                m = (~g["extrapolated"].astype(bool)).to_numpy() == inside
                ax.errorbar(pos[m], g["diff"][m], yerr=err[:, m], fmt="o", color=color, capsize=3, markersize=4,
                            markerfacecolor=color if inside else "none", label=arm if inside else None)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.axhspan(-margin, margin, color="grey", alpha=0.15, linewidth=0, label=f"equivalence margin ±{margin:g}")
        x_of, eng = rows.groupby("width")["x"].first(), mpl.ticker.EngFormatter(places=2, sep="")
        ax.set_xticks(range(len(widths)), [f"d={w}\n{eng(x_of[w])}" for w in widths])
        ax.set_xlabel(f"{reference}'s width and its {label}" + (" [FLOP]" if axis == "flops" else " [count]"))
        ax.set_title(f"at equal {label}", fontsize=10)
    axes[0].set_ylabel(f"loss − {reference}'s ({loss_unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    fig.legend(keep.values(), keep.keys(), loc="lower center", ncol=min(len(keep), 7), frameon=False)
    fig.suptitle(title or f"fitted test loss minus {reference}'s at {reference}'s size and compute: estimate and "
                          f"{confidence:.0%} CI (bootstrap over seeds); hollow: extrapolated")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
