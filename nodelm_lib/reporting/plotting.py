"""Plots over a sweep's runs and curves, each drawn into an axes the caller made: an arm's metric
over seeds with its CI (``plot_arm_metric``), cost against loss (``plot_efficiency``), mean curves
with a band (``plot_curves``, ``zoom_to_late``), differences to a reference arm paired by seed
(``plot_paired_differences``), labelled reference losses (``plot_reference_lines``) and a note
where data lies beyond a set y-range (``note_clipped``). Every arm is drawn in its colour
(``style.arm_color``), every interval named "95% CI"; saving is ``style``'s."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

from .style import CI_LABEL, NEUTRAL, NOTE, REFERENCE, arm_color


# --------------------------------------------------------------------------- multi-seed figures


def arm_order(table, order=None) -> list:
    """The arms to draw, in this order: ``order`` if given, else as they first appear in ``table``."""
    return list(order) if order is not None else list(dict.fromkeys(table["arm"]))


def _arm_stats(runs, metric: str, order):
    from .stats import mean_ci

    arms = arm_order(runs, order)
    stats = [mean_ci(runs.loc[runs["arm"] == a, metric].astype(float)) for a in arms]
    return arms, stats


def plot_arm_metric(ax: plt.Axes, runs, metric: str, order=None, label: str | None = None,
                    references: dict | None = None) -> None:
    """Mean of ``metric`` per arm with its t-based 95% CI as an error bar, and every seed as
    a dot (same x jitter for every arm, so a seed's runs can be followed across arms).
    ``references`` (label -> value, e.g. n-gram losses) are drawn by ``plot_reference_lines``
    where they fall inside the autoscaled y-range."""
    arms, stats = _arm_stats(runs, metric, order)
    x = np.arange(len(arms))
    means = [s["mean"] for s in stats]
    halves = [0.0 if np.isnan(s["ci_half"]) else s["ci_half"] for s in stats]
    ax.errorbar(x, means, yerr=halves, fmt="o", color=NEUTRAL, capsize=4, zorder=3, label=f"mean ± {CI_LABEL}")
    seeds = sorted(runs["seed"].unique())
    jitter = dict(zip(seeds, np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [0.0]))
    for i, arm in enumerate(arms):
        rows = runs[runs["arm"] == arm]
        ax.scatter(i + rows["seed"].map(jitter), rows[metric], s=12, alpha=0.6, color=arm_color(arm), zorder=2)
    ax.set_xticks(x, arms, rotation=30, ha="right")
    ax.set_ylabel(label or metric)
    if references:
        plot_reference_lines(ax, references)


def plot_efficiency(ax: plt.Axes, runs, x_metric: str, y_metric: str, order=None, x_label: str | None = None,
                    y_label: str | None = None, references: dict | None = None, log_x: bool = False,
                    legend: bool = True) -> None:
    """Each arm at (mean ``x_metric``, mean ``y_metric`` ± t-based 95% CI) in its colour, named in a
    legend right of the axes (``legend=False``: none, for a panel beside one that has it) rather
    than beside its point: arms of nearly equal cost sit on one another, where such labels
    collide. E.g. parameters against loss, to see whether an arm is better or only smaller.
    ``references`` (label -> value) are drawn as in ``plot_arm_metric``. ``log_x``: a log x axis
    (arms whose sizes differ 40-fold stay apart), ticks at 1, 2 and 5 of each decade."""
    arms, y_stats = _arm_stats(runs, y_metric, order)
    _, x_stats = _arm_stats(runs, x_metric, order)
    for arm, xs, ys in zip(arms, x_stats, y_stats):
        half = 0.0 if np.isnan(ys["ci_half"]) else ys["ci_half"]
        ax.errorbar(xs["mean"], ys["mean"], yerr=half, fmt="o", capsize=4, color=arm_color(arm), label=arm)
    if log_x:
        ax.set_xscale("log")
        lo, hi = min(s["mean"] for s in x_stats), max(s["mean"] for s in x_stats)
        ax.set_xlim(lo / 1.4, hi * 1.4)
        # 1, 2 and 5 of each decade, written 200k / 2M: matplotlib's default labels every minor
        # tick of a short log range ("3×10^6 4×10^6"), and those labels run into one another
        ax.xaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter(sep=""))
    ax.set_xlabel(x_label or x_metric)
    ax.set_ylabel(y_label or y_metric)
    if legend:
        ax.legend(title=f"arm: mean ± {CI_LABEL}", fontsize=8, title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.0, 1.0))
    if references:
        plot_reference_lines(ax, references)


BAND_TITLES = {"ci": f"mean ± {CI_LABEL}", "range": "mean, range over seeds"}


def _curve_summary(curves, arms, x: str, y: str, at: str, band: str):
    """Per arm and evaluation point ``at``: x (mean of ``x`` over seeds; ``at`` itself when
    x == at), mean of ``y`` over seeds and the band's low and high ends."""
    import pandas as pd

    from .stats import mean_ci

    if band not in BAND_TITLES:
        raise ValueError(f"band must be one of {sorted(BAND_TITLES)}, got {band!r}")
    rows = []
    for arm in arms:
        for point, group in curves[curves["arm"] == arm].groupby(at, sort=True):
            v = group[y].astype(float).to_numpy()
            mean = v.mean()
            if band == "range":
                lo, hi = v.min(), v.max()
            else:
                half = mean_ci(v)["ci_half"] if len(v) > 1 else 0.0
                lo, hi = mean - half, mean + half
            px = point if x == at else group[x].astype(float).mean()
            rows.append({"arm": arm, "at": point, "x": px, "mean": mean, "lo": lo, "hi": hi})
    return pd.DataFrame(rows, columns=["arm", "at", "x", "mean", "lo", "hi"])


def plot_curves(ax: plt.Axes, curves, x: str = "step", y: str = "val_loss", order=None, band: str = "ci",
                at: str = "step", legend_title: str | None = None) -> None:
    """Mean curve per arm over seeds with a band: the t-based 95% CI of the mean
    (``band="ci"``) or the range over seeds (``"range"``); a point seen by one seed only gets
    no band. ``curves`` is long format (arm, seed, ``at``, ``x``, ``y``; ``sweeps.curves``).
    An evaluation point is identified across seeds by ``at`` (default the step); it is drawn
    at the mean of ``x`` over seeds, so ``x`` may differ between seeds (``train_time_s``).
    The legend title names the band ("mean ± 95% CI" unless ``legend_title`` is given)."""
    arms = arm_order(curves, order)
    summary = _curve_summary(curves, arms, x, y, at, band)
    for arm in arms:
        s = summary[summary["arm"] == arm]
        ax.plot(s["x"], s["mean"], color=arm_color(arm), label=arm)
        ax.fill_between(s["x"], s["lo"], s["hi"], color=arm_color(arm), alpha=0.2, linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend(title=legend_title or BAND_TITLES[band])


def zoom_to_late(ax: plt.Axes, curves, y: str = "val_loss", x_from_fraction: float = 0.25, margin: float = 0.05,
                 x: str = "step", at: str = "step", band: str = "ci", order=None, references: dict | None = None):
    """Set the y-range to what ``plot_curves`` (same ``x``, ``at``, ``band``, ``order``) draws
    after the first ``x_from_fraction`` of each arm's x-span: mean curves and their bands,
    plus the ``references`` values (label -> value), padded by ``margin`` of the span on each
    side. The early loss then does not flatten the part where arms differ; the curves it cuts off
    are named in a note at the top of the axes (``note_clipped``), never clipped silently. Call
    ``plot_reference_lines`` afterwards. Returns the new (low, high)."""
    summary = _curve_summary(curves, arm_order(curves, order), x, y, at, band)
    start = summary.groupby("arm")["x"].transform(lambda v: v.min() + x_from_fraction * (v.max() - v.min()))
    late = summary[summary["x"] >= start]
    values = np.concatenate([late[["mean", "lo", "hi"]].to_numpy(float).ravel(),
                             np.asarray(list((references or {}).values()), dtype=float)])
    lo, hi = np.nanmin(values), np.nanmax(values)
    pad = margin * (hi - lo) if hi > lo else max(abs(lo), 1.0) * margin
    ax.set_ylim(lo - pad, hi + pad)
    above = summary[summary["mean"] > hi + pad]
    if len(above):
        cut = list(dict.fromkeys(above["arm"]))
        who = "every arm's" if len(cut) == summary["arm"].nunique() else ", ".join(cut) + ":"
        note_clipped(ax, f"▲ {who} early {y} above the axis (up to {above['mean'].max():.2f})")
    return lo - pad, hi + pad


def note_clipped(ax: plt.Axes, text: str, where: str = "top") -> plt.Text:
    """A small grey note inside ``ax``, at its top or bottom (``where``) left corner, saying what
    the y-range cuts off (no data is clipped unsaid); it takes no room in the layout."""
    if where not in ("top", "bottom"):
        raise ValueError(f"where must be 'top' or 'bottom', got {where!r}")
    y, va = (0.98, "top") if where == "top" else (0.02, "bottom")
    note = ax.text(0.01, y, text, transform=ax.transAxes, ha="left", va=va, fontsize=7, color=NOTE,
                   zorder=5, clip_on=True, bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                                                 "edgecolor": "none", "alpha": 0.8})
    note.set_in_layout(False)  # a long note must not shrink the axes it sits in (tight_layout)
    return note


def plot_paired_differences(ax: plt.Axes, curves, reference: str = "gpt", x: str = "step", y: str = "val_loss",
                            order=None, at: str = "step"):
    """For every arm but ``reference``: per seed, ``y(arm) - y(reference)`` at the same
    evaluation point ``at`` (seeds missing in either arm are left out), drawn as the mean over
    seeds at the arm's mean ``x`` with the t-based 95% CI of that mean as a band (no band
    where one seed remains), and a line at 0. Pairing by seed removes the seed-to-seed
    variation both arms share, so this CI is narrower than one from two unpaired curves.
    Returns the differences: columns arm, seed, ``at``, ``x`` (once if x == at), diff."""
    arms = arm_order(curves, order)
    keys = ["arm", "seed", at]
    if curves.duplicated(keys).any():
        raise ValueError(f"curves has more than one row per (arm, seed, {at})")
    ref = curves.loc[curves["arm"] == reference, ["seed", at, y]].rename(columns={y: "_ref"})
    if ref.empty:
        raise ValueError(f"no rows for the reference arm {reference!r}")
    columns = list(dict.fromkeys(keys + [x]))
    others = curves[curves["arm"].isin([a for a in arms if a != reference])]
    diffs = others[columns + [y]].merge(ref, on=["seed", at], how="inner")
    diffs["diff"] = diffs[y].astype(float) - diffs["_ref"].astype(float)
    diffs = diffs[columns + ["diff"]].reset_index(drop=True)
    summary = _curve_summary(diffs, arms, x, "diff", at, "ci")
    for arm in arms:
        s = summary[summary["arm"] == arm]
        if arm == reference or s.empty:
            continue
        ax.plot(s["x"], s["mean"], color=arm_color(arm), label=arm)
        ax.fill_between(s["x"], s["lo"], s["hi"], color=arm_color(arm), alpha=0.2, linewidth=0)
    ax.axhline(0.0, color=NEUTRAL, linewidth=0.8, label="_nolegend_")
    ax.set_xlabel(x)
    ax.set_ylabel(f"Δ {y} (arm − {reference})")
    ax.legend(title=f"Δ vs {reference}, mean ± {CI_LABEL} (paired by seed)")
    return diffs


def plot_reference_lines(ax: plt.Axes, references: dict, **kwargs) -> list:
    """A dashed grey horizontal line per reference value (``references``: label -> value,
    e.g. n-gram losses) inside the current y-limits, labelled in small text just above it at
    the right end, inside the axes; labels closer than a text height are nudged apart
    vertically, and a label moves to the left end where it would hide fewer data points there.
    Values outside the limits are neither drawn nor labelled, and the limits are
    then fixed, so set them (``zoom_to_late``) first; labels are placed for the axes' current
    size, so call ``fig.tight_layout()`` before too. ``kwargs`` go to ``ax.axhline``.
    Returns the text artists (annotations), lowest first."""
    ax.autoscale_view()
    lo, hi = sorted(ax.get_ylim())
    ax.set_ylim(ax.get_ylim())  # a new line must not move the limits its labels were placed for
    shown = sorted((v, k) for k, v in references.items() if lo <= v <= hi)
    style = {"color": REFERENCE, "linestyle": "--", "linewidth": 0.8, "zorder": 1, **kwargs}
    references_drawn = [ax.axhline(value, label="_nolegend_", **style) for value, _ in shown]
    if not shown:
        return []
    renderer = ax.figure.canvas.get_renderer()
    texts = [ax.annotate(label, (0.99, value), xycoords=ax.get_yaxis_transform(), textcoords="offset points",
                         xytext=(0, 0), ha="right", va="bottom", fontsize=7, color=NOTE, zorder=1.5,
                         bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.7})
             for value, label in shown]  # above the grid and the lines, below the data
    px_per_pt, gap = ax.figure.dpi / 72, 1.5  # gap: points between a line and its label, and between labels
    height = max(t.get_window_extent(renderer).height for t in texts) + gap * px_per_pt
    # bottom edge of each label in display coordinates: just above its line, pushed up until it
    # clears the label below it, then down again where that would leave the axes at the top
    lines = ax.transData.transform([(0.0, v) for v, _ in shown])[:, 1]
    bottoms = lines + gap * px_per_pt
    for i in range(1, len(bottoms)):
        bottoms[i] = max(bottoms[i], bottoms[i - 1] + height)
    ceiling = ax.get_window_extent(renderer).y1 - height
    for i in reversed(range(len(bottoms))):
        bottoms[i] = min(bottoms[i], ceiling)
        ceiling = bottoms[i] - height
    data = _data_boxes(ax, exclude=references_drawn)
    for text, bottom, line in zip(texts, bottoms, lines):  # offsets in points: kept if the axes resize
        text.xyann = (0.0, (bottom - line) / px_per_pt)
        _clear_side(text, data, renderer)
    return texts


def _data_boxes(ax: plt.Axes, exclude=()) -> list:
    """Display-space boxes of what ``ax`` draws as data: each marker or line segment of its
    lines (but ``exclude``) and each point or segment of its collections (scatter, error bars)."""
    from matplotlib.collections import LineCollection

    found = []
    for line in ax.get_lines():
        if line in exclude or not line.get_visible():
            continue
        xy = ax.transData.transform(line.get_xydata())
        found += _marker_boxes(xy) if line.get_linestyle() in ("None", "", " ") else _segment_boxes(xy)
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            for segment in collection.get_segments():
                found += _segment_boxes(ax.transData.transform(segment))
        elif len(collection.get_offsets()):
            found += _marker_boxes(collection.get_offset_transform().transform(collection.get_offsets()))
    return found


def _finite_points(points) -> np.ndarray:
    points = np.asarray(points, float).reshape(-1, 2)
    return points[np.isfinite(points).all(axis=1)]


def _marker_boxes(points) -> list:
    """A box a few pixels wide around each of ``points`` (display coordinates)."""
    from matplotlib.transforms import Bbox

    return [Bbox.from_extents(*(p - 3), *(p + 3)) for p in _finite_points(points)]


def _segment_boxes(points) -> list:
    """A box around each segment between consecutive ``points`` (display coordinates), a pixel
    wider on each side; a single point is a marker."""
    from matplotlib.transforms import Bbox

    points = _finite_points(points)
    if len(points) == 1:
        return _marker_boxes(points)
    return [Bbox([np.minimum(a, b) - 1, np.maximum(a, b) + 1]) for a, b in zip(points[:-1], points[1:])]


def _clear_side(text, data: list, renderer) -> None:
    """Move a reference label from the right end of its line to the left end where it covers less
    data there (a wide label in a narrow panel would hide the rightmost arm's points)."""
    def covered() -> int:
        box = text.get_window_extent(renderer)
        return sum(box.overlaps(b) for b in data)

    right = covered()
    if right == 0:
        return
    text.xy = (0.01, text.xy[1])
    text.set_horizontalalignment("left")
    if covered() >= right:  # no better on the left: keep it where readers look for it
        text.xy = (0.99, text.xy[1])
        text.set_horizontalalignment("right")
