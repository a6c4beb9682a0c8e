"""One figure style for the project; every figure is saved as PNG and PDF."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "axes.prop_cycle": mpl.cycler(color=["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]),
}


# matplotlib's warning when placing a loc="best" legend took over a second (see save_figure)
_SLOW_LEGEND_WARNING = 'Creating legend with loc="best" can be slow'


def use_style() -> None:
    """Apply the project style to matplotlib's global settings."""
    mpl.rcParams.update(STYLE)


def smooth(values, window: int) -> np.ndarray:
    """Trailing moving average (shorter at the start, so the curve keeps its length)."""
    values = np.asarray(values, dtype=float)
    if window <= 1 or len(values) == 0:
        return values
    csum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def save_figure(fig: plt.Figure, path_stem: str | Path) -> list[Path]:
    """Save ``fig`` as ``<stem>.png`` and ``<stem>.pdf``; PDF dates are left out so that
    a rerun writes the same bytes."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    with warnings.catch_warnings():
        # matplotlib warns when placing a loc="best" legend took over a second of wall time.
        # The placement it finds does not depend on the time, so on a busy machine the warning
        # says nothing about the figure; it used to fail nbval's output comparison by turns.
        warnings.filterwarnings("ignore", message=_SLOW_LEGEND_WARNING, category=UserWarning)
        fig.savefig(paths[0], bbox_inches="tight", metadata={"Software": None})
        fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None, "Producer": None, "Creator": None})
    return paths


# --------------------------------------------------------------------------- multi-seed figures


def _arm_stats(runs, metric: str, order):
    from .stats import mean_ci

    arms = list(order) if order is not None else list(dict.fromkeys(runs["arm"]))
    stats = [mean_ci(runs.loc[runs["arm"] == a, metric].astype(float)) for a in arms]
    return arms, stats


def plot_arm_metric(ax: plt.Axes, runs, metric: str, order=None, label: str | None = None) -> None:
    """Mean of ``metric`` per arm with its t-based 95% CI as an error bar, and every seed as
    a dot (same x jitter for every arm, so a seed's runs can be followed across arms)."""
    arms, stats = _arm_stats(runs, metric, order)
    x = np.arange(len(arms))
    means = [s["mean"] for s in stats]
    halves = [0.0 if np.isnan(s["ci_half"]) else s["ci_half"] for s in stats]
    ax.errorbar(x, means, yerr=halves, fmt="o", color="black", capsize=4, zorder=3, label="mean ± 95% CI")
    seeds = sorted(runs["seed"].unique())
    jitter = dict(zip(seeds, np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [0.0]))
    for i, arm in enumerate(arms):
        rows = runs[runs["arm"] == arm]
        ax.scatter(i + rows["seed"].map(jitter), rows[metric], s=12, alpha=0.5, color="C0", zorder=2)
    ax.set_xticks(x, arms, rotation=30, ha="right")
    ax.set_ylabel(label or metric)


def plot_efficiency(ax: plt.Axes, runs, x_metric: str, y_metric: str, order=None, x_label: str | None = None,
                    y_label: str | None = None) -> None:
    """Each arm at (mean ``x_metric``, mean ``y_metric`` ± 95% CI), labelled: e.g. parameters
    against loss, to see whether an arm is better or only smaller."""
    arms, y_stats = _arm_stats(runs, y_metric, order)
    _, x_stats = _arm_stats(runs, x_metric, order)
    for i, (xs, ys) in enumerate(zip(x_stats, y_stats)):
        half = 0.0 if np.isnan(ys["ci_half"]) else ys["ci_half"]
        ax.errorbar(xs["mean"], ys["mean"], yerr=half, fmt="o", capsize=4, color=f"C{i % 6}")
    ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter())  # 250k, not 250000 (labels overlap)
    ax.set_xlabel(x_label or x_metric)
    ax.set_ylabel(y_label or y_metric)
    label_points(ax, [s["mean"] for s in x_stats], [s["mean"] for s in y_stats], arms)


# a label's place around its point, in order of preference: (offset in points, alignment)
LABEL_PLACES = [((6, 4), "left", "bottom"), ((6, -4), "left", "top"),
                ((-6, 4), "right", "bottom"), ((-6, -4), "right", "top")]


def label_points(ax: plt.Axes, xs, ys, labels) -> list:
    """Write each label next to its point, on the first side of it (upper right, lower right,
    upper left, lower left) where it does not overlap a label already written: arms with
    nearly the same coordinates stay readable. Places are judged at the axes' current size,
    after autoscaling; returns the text artists."""
    ax.autoscale_view()
    renderer = ax.figure.canvas.get_renderer()
    placed, texts = [], []
    for x, y, label in zip(xs, ys, labels):
        for place in LABEL_PLACES:
            text, box = _annotate(ax, label, (x, y), place, renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            text.remove()
        else:  # crowded on every side: keep the first place
            text, box = _annotate(ax, label, (x, y), LABEL_PLACES[0], renderer)
        placed.append(box)
        texts.append(text)
    return texts


def _annotate(ax: plt.Axes, label: str, xy, place, renderer):
    """``label`` at ``place`` (offset in points, alignment) from ``xy``; the text and its box."""
    offset, ha, va = place
    text = ax.annotate(label, xy, textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=8)
    return text, text.get_window_extent(renderer)


def plot_curves(ax: plt.Axes, curves, x: str = "step", y: str = "val_loss", order=None, band: str = "ci") -> None:
    """Mean curve per arm over seeds with a band: the t-based 95% CI of the mean
    (``band="ci"``) or the range over seeds (``"range"``). ``curves`` is long format
    (arm, seed, ``x``, ``y``; ``experiment.curves``)."""
    from .stats import mean_ci

    arms = list(order) if order is not None else list(dict.fromkeys(curves["arm"]))
    for i, arm in enumerate(arms):
        rows = curves[curves["arm"] == arm]
        grid = sorted(rows[x].unique())
        values = [rows.loc[rows[x] == g, y].astype(float).to_numpy() for g in grid]
        mean = np.array([v.mean() for v in values])
        if band == "range":
            lo, hi = np.array([v.min() for v in values]), np.array([v.max() for v in values])
        else:
            half = np.array([mean_ci(v)["ci_half"] if len(v) > 1 else 0.0 for v in values])
            lo, hi = mean - half, mean + half
        ax.plot(grid, mean, color=f"C{i % 6}", label=arm)
        ax.fill_between(grid, lo, hi, color=f"C{i % 6}", alpha=0.2, linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend()
