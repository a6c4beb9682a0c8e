"""Notebook 07's figures: test loss against size and compute with each arm's fitted trend
(``loss_figure``), and the iso-parameter / iso-FLOP differences to the reference arm (``iso_figure``).

They draw the tables ``nodelm_lib.experiments.scaling`` computes (``cells_table``, ``analyse``) and
its axes (``scaling.AXES``), all taken as arguments: reporting sits below experiments.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd


from .style import NEUTRAL, NOTE, REFERENCE, arm_color

# an interval more than this many times the median interval's half width (a diverged seed's) is
# clipped at the axis rather than setting its range
CLIP_FACTOR = 4.0


def loss_range(cells: pd.DataFrame, references: Mapping[str, float] = (),
               clip_factor: float = CLIP_FACTOR) -> tuple[float, float, pd.DataFrame]:
    """The y-range of ``loss_figure``: every mean, and every interval but those wider than
    ``clip_factor`` times the median half width (one diverged seed widens its cell's interval
    tenfold, and would squeeze every other point into a band), then the ``references`` (label ->
    loss) within half that span of it; padded by 5%. Returns (low, high) and the cells whose
    intervals reach past it."""
    mean, half = cells["test_loss_mean"].astype(float), cells["test_loss_ci"].astype(float).fillna(0.0)
    typical = float(np.median(half[half > 0])) if (half > 0).any() else 0.0
    kept = half <= clip_factor * typical if typical > 0 else half == half
    lo = float(min(mean.min(), (mean - half)[kept].min()))
    hi = float(max(mean.max(), (mean + half)[kept].max()))
    reach = 0.5 * (hi - lo)
    near = [v for v in dict(references).values() if lo - reach <= v <= hi + reach]
    lo, hi = min([lo, *near]), max([hi, *near])
    pad = 0.05 * (hi - lo) if hi > lo else 0.05
    lo, hi = lo - pad, hi + pad
    return lo, hi, cells[(mean - half < lo) | (mean + half > hi)]


def _reference_lines(ax, references: Mapping[str, float]) -> list[str]:
    """Dashed grey lines for the references inside the axes' y-range (labelled at the right end);
    returns the labels of those outside it (to name in a note)."""
    lo, hi = ax.get_ylim()
    outside = []
    for label, value in sorted(references.items(), key=lambda kv: kv[1]):
        if lo <= value <= hi:
            ax.axhline(value, color=REFERENCE, linestyle="--", linewidth=0.8, zorder=1)
            ax.annotate(f"{label} {value:.2f}", (0.99, value), xycoords=ax.get_yaxis_transform(), ha="right",
                        va="bottom", fontsize=7, color=NOTE)
        else:
            outside.append(f"{label} {value:.2f}")
    return outside


def loss_figure(cells: pd.DataFrame, fitted: dict, order: Iterable[str], x_axes: Mapping[str, tuple[str, str]],
                references: Mapping[str, float] = (), loss_unit: str = "nats/token", confidence: float = 0.95,
                title: str | None = None) -> "plt.Figure":
    """Test loss against non-embedding parameters and against training FLOPs (log x): per arm and
    width the mean over seeds with its t-based CI (``cells``: ``scaling.cells_table`` at
    ``confidence``), and the arm's fitted trend over its range (``fitted``: (axis, arm) -> Trend).
    ``x_axes``: axis -> (column of ``cells``, label), ``scaling.AXES``. ``references`` (label ->
    loss: n-gram models; a validation loss must say so in its label) are dashed lines where they
    fall inside the axes, and named in a note where they do not. The y-range is ``loss_range``'s:
    an interval it cuts (a diverged seed's) ends in a triangle at the edge and is named in a note."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    lo, hi, clipped = loss_range(cells, references)
    for ax, axis in zip(axes, x_axes):
        col, label = x_axes[axis]
        for arm in order:
            color = arm_color(arm)
            own = cells[cells["arm"] == arm]
            ax.errorbar(own[col], own["test_loss_mean"], yerr=own["test_loss_ci"].fillna(0), fmt="o",
                        color=color, capsize=3, markersize=4)
            trend = fitted[(axis, arm)]
            xs = np.geomspace(trend.x_min, trend.x_max, 100)
            ax.plot(xs, trend(xs), color=color, linewidth=1.2, label=f"{arm} ({trend.form})")
        for _, cell in clipped.iterrows():  # where a clipped interval leaves the axes
            for edge, past, marker in ((hi, cell["test_loss_mean"] + cell["test_loss_ci"] > hi, "^"),
                                       (lo, cell["test_loss_mean"] - cell["test_loss_ci"] < lo, "v")):
                if past:
                    ax.plot(cell[col], edge, marker, color=arm_color(cell["arm"]), markersize=6, clip_on=False,
                            zorder=4)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        # 200k, 500k, 1M: matplotlib's default labels every minor tick of a short log range, overlapping
        ax.xaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
        ax.set_xlabel(f"{label} (log scale)" + (" [FLOP]" if axis == "flops" else " [count]"))
    axes[0].set_ylabel(f"test loss ({loss_unit})")
    outside = []
    for ax in axes:
        outside = _reference_lines(ax, dict(references))
    notes = ["off the axes: " + ", ".join(outside)] if outside else []
    if len(clipped):
        notes.append("▲▼ interval cut at the axis: " + ", ".join(
            f"{r.arm} d={int(r.width)} ({r.test_loss_mean - r.test_loss_ci:.2f} to "
            f"{r.test_loss_mean + r.test_loss_ci:.2f})" for r in clipped.itertuples()))
    n = int(cells["seeds"].min())
    fig.suptitle(title or f"test loss against size and compute: mean ± {confidence:.0%} CI over {n} seeds (t); "
                          "lines: fitted trends")
    rows = 1 + (len(order) > 4)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=min(len(order), 4), frameon=False,
               bbox_to_anchor=(0.5, 0.03))
    if notes:  # below the legend
        fig.text(0.5, 0.005, "; ".join(notes), fontsize=8, color=NOTE, ha="center")
    fig.tight_layout(rect=(0, 0.06 + 0.05 * rows, 1, 1))
    return fig


def iso_figure(iso: pd.DataFrame, order: Iterable[str], margin: float, x_axes: Mapping[str, tuple[str, str]],
               reference: str = "gpt", loss_unit: str = "nats/token", confidence: float = 0.95,
               title: str | None = None) -> "plt.Figure":
    """Iso-parameter (left) and iso-FLOP (right) differences to ``reference`` across its widths:
    each arm's fitted loss at the reference's x minus the reference's, with its CI: a t-interval
    over seeds whose standard error is the bootstrap's (``trends.t_interval``; ``iso``:
    ``scaling.Analysis.iso``); hollow markers are extrapolations. The shaded band is the
    equivalence margin. ``x_axes``: axis -> (column, label), ``scaling.AXES``."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    arms = [a for a in order if a != reference]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, axis in zip(axes, x_axes):
        label = x_axes[axis][1]
        rows = iso[(iso["axis"] == label) & (iso["arm"] != reference)]
        widths = sorted(rows["width"].unique())
        for i, arm in enumerate(arms):
            color = arm_color(arm)
            g = rows[rows["arm"] == arm].set_index("width").reindex(widths)
            pos = np.arange(len(widths)) + (i - (len(arms) - 1) / 2) * 0.1
            err = np.vstack([g["diff"] - g["diff_ci_low"], g["diff_ci_high"] - g["diff"]])
            for inside in (True, False):
                m = (~g["extrapolated"].astype(bool)).to_numpy() == inside
                ax.errorbar(pos[m], g["diff"][m], yerr=err[:, m], fmt="o", color=color, capsize=3, markersize=4,
                            markerfacecolor=color if inside else "none", label=arm if inside else None)
        ax.axhline(0.0, color=NEUTRAL, linewidth=0.8)
        ax.axhspan(-margin, margin, color=REFERENCE, alpha=0.15, linewidth=0, label=f"equivalence margin ±{margin:g}")
        x_of, eng = rows.groupby("width")["x"].first(), mpl.ticker.EngFormatter(places=2, sep="")
        ax.set_xticks(range(len(widths)), [f"d={w}\n{eng(x_of[w])}" for w in widths])
        ax.set_xlabel(f"{reference}'s width and its {label}" + (" [FLOP]" if axis == "flops" else " [count]"))
        ax.set_title(f"at equal {label}", fontsize=10)
    axes[0].set_ylabel(f"loss − {reference}'s ({loss_unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    fig.legend(keep.values(), keep.keys(), loc="lower center", ncol=min(len(keep), 7), frameon=False)
    fig.suptitle(title or f"fitted test loss minus {reference}'s at {reference}'s size and compute: estimate and "
                          f"{confidence:.0%} CI (t over seeds, bootstrap standard error); hollow: extrapolated")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
