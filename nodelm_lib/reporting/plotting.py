"""One figure style for the project; every figure is saved as PNG and PDF."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

# Okabe-Ito's colour-blind-safe colours (yellow left out: it vanishes on white; sky blue left out:
# beside the blue of the first arm the two read as one), then darker tones: eight arms get eight
# colours that differ in hue and in lightness
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#882255", "#000000", "#8C564B"]

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
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
}


# matplotlib's warning when placing a loc="best" legend took over a second (see save_figure)
_SLOW_LEGEND_WARNING = 'Creating legend with loc="best" can be slow'


def arm_color(i: int) -> str:
    """The colour of the i-th arm of a figure (the same arm order gives the same colours in
    every panel)."""
    return PALETTE[i % len(PALETTE)]


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


def axes_description(fig: plt.Figure) -> list[dict]:
    """What a reader needs from each axes of ``fig``: its title and axis labels, whether its ticks
    are categories (arm names need no axis label), and whether it shares its y axis with a panel
    that labels it. Colour bars are left out. Saved in
    the PNG's metadata by ``save_figure``, so a test can check committed figures cheaply."""
    out = []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>" or not ax.get_visible() or not ax.axison:
            continue
        shared = [other for other in ax.get_shared_y_axes().get_siblings(ax) if other is not ax]
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                    "x_categorical": _categorical(ax.get_xticklabels()),
                    "y_categorical": _categorical(ax.get_yticklabels()),
                    "y_label_shared": any(other.get_ylabel() for other in shared)})
    return out


def _categorical(ticklabels) -> bool:
    """Tick labels that name things (arms, comparisons) rather than numbers: such an axis needs no label."""
    texts = [t.get_text() for t in ticklabels if t.get_text()]
    return bool(texts) and not all(_looks_numeric(t) for t in texts)


def _looks_numeric(text: str) -> bool:
    """A tick label that is a number, possibly in mathtext or with an SI prefix ("1.5k", "$10^{3}$")."""
    bare = re.sub(r"\\mathdefault|[${}^,\s×\u2212+-]", "", text)
    return bool(re.fullmatch(r"[0-9.]*[0-9][0-9.]*(e[0-9]+)?[kMGTmµ]?", bare))


def save_figure(fig: plt.Figure, path_stem: str | Path) -> list[Path]:
    """Save ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` at the project's resolution (``STYLE``'s
    ``savefig.dpi``, whatever the style in force); PDF dates are left out so that a rerun writes
    the same bytes. The PNG carries ``axes_description`` as JSON in its "Description" text."""
    import json

    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    description = json.dumps(axes_description(fig), ensure_ascii=False)
    with warnings.catch_warnings():
        # matplotlib warns when placing a loc="best" legend took over a second of wall time.
        # The placement it finds does not depend on the time, so on a busy machine the warning
        # says nothing about the figure, and in a cell's output it would fail nbval's comparison.
        warnings.filterwarnings("ignore", message=_SLOW_LEGEND_WARNING, category=UserWarning)
        dpi = STYLE["savefig.dpi"]
        fig.savefig(paths[0], bbox_inches="tight", dpi=dpi, metadata={"Software": None, "Description": description})
        fig.savefig(paths[1], bbox_inches="tight", dpi=dpi,
                    metadata={"CreationDate": None, "Producer": None, "Creator": None})
    return paths


# --------------------------------------------------------------------------- multi-seed figures


def _arm_stats(runs, metric: str, order):
    from .stats import mean_ci

    arms = list(order) if order is not None else list(dict.fromkeys(runs["arm"]))
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
    ax.errorbar(x, means, yerr=halves, fmt="o", color="black", capsize=4, zorder=3, label="mean ± 95% CI")
    seeds = sorted(runs["seed"].unique())
    jitter = dict(zip(seeds, np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [0.0]))
    for i, arm in enumerate(arms):
        rows = runs[runs["arm"] == arm]
        ax.scatter(i + rows["seed"].map(jitter), rows[metric], s=12, alpha=0.5, color="C0", zorder=2)
    ax.set_xticks(x, arms, rotation=30, ha="right")
    ax.set_ylabel(label or metric)
    if references:
        plot_reference_lines(ax, references)


def plot_efficiency(ax: plt.Axes, runs, x_metric: str, y_metric: str, order=None, x_label: str | None = None,
                    y_label: str | None = None, references: dict | None = None, log_x: bool = False) -> None:
    """Each arm at (mean ``x_metric``, mean ``y_metric`` ± t-based 95% CI), labelled: e.g.
    parameters against loss, to see whether an arm is better or only smaller. ``references``
    (label -> value) are drawn as in ``plot_arm_metric``; arm labels keep clear of theirs.
    ``log_x``: a log x axis (arms whose sizes differ 40-fold stay apart)."""
    arms, y_stats = _arm_stats(runs, y_metric, order)
    _, x_stats = _arm_stats(runs, x_metric, order)
    for i, (xs, ys) in enumerate(zip(x_stats, y_stats)):
        half = 0.0 if np.isnan(ys["ci_half"]) else ys["ci_half"]
        ax.errorbar(xs["mean"], ys["mean"], yerr=half, fmt="o", capsize=4, color=arm_color(i))
    if log_x:
        ax.set_xscale("log")
        lo, hi = min(s["mean"] for s in x_stats), max(s["mean"] for s in x_stats)
        ax.set_xlim(lo / 1.6, hi * 2.5)  # room for the labels right of the points
    ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter())  # 250k, not 250000 (labels overlap)
    ax.set_xlabel(x_label or x_metric)
    ax.set_ylabel(y_label or y_metric)
    renderer = ax.figure.canvas.get_renderer()
    avoid = [t.get_window_extent(renderer) for t in plot_reference_lines(ax, references)] if references else []
    label_points(ax, [s["mean"] for s in x_stats], [s["mean"] for s in y_stats], arms, avoid=avoid)


# a label's place around its point, in order of preference: (offset in points, alignment)
LABEL_PLACES = [((6, 4), "left", "bottom"), ((6, -4), "left", "top"),
                ((-6, 4), "right", "bottom"), ((-6, -4), "right", "top")]


def label_points(ax: plt.Axes, xs, ys, labels, avoid=()) -> list:
    """Write each label next to its point, on the first side of it (upper right, lower right,
    upper left, lower left) where it does not overlap a label already written nor a box in
    ``avoid`` (display coordinates): arms with nearly the same coordinates stay readable.
    Places are judged at the axes' current size, after autoscaling; returns the text artists."""
    ax.autoscale_view()
    renderer = ax.figure.canvas.get_renderer()
    placed, texts = list(avoid), []
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


BAND_TITLES = {"ci": "mean ± 95% CI", "range": "mean, range over seeds"}


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


def _arms(curves, order) -> list:
    return list(order) if order is not None else list(dict.fromkeys(curves["arm"]))


def plot_curves(ax: plt.Axes, curves, x: str = "step", y: str = "val_loss", order=None, band: str = "ci",
                at: str = "step", legend_title: str | None = None) -> None:
    """Mean curve per arm over seeds with a band: the t-based 95% CI of the mean
    (``band="ci"``) or the range over seeds (``"range"``); a point seen by one seed only gets
    no band. ``curves`` is long format (arm, seed, ``at``, ``x``, ``y``; ``experiment.curves``).
    An evaluation point is identified across seeds by ``at`` (default the step); it is drawn
    at the mean of ``x`` over seeds, so ``x`` may differ between seeds (``train_time_s``).
    The legend title names the band ("mean ± 95% CI" unless ``legend_title`` is given)."""
    arms = _arms(curves, order)
    summary = _curve_summary(curves, arms, x, y, at, band)
    for i, arm in enumerate(arms):
        s = summary[summary["arm"] == arm]
        ax.plot(s["x"], s["mean"], color=arm_color(i), label=arm)
        ax.fill_between(s["x"], s["lo"], s["hi"], color=arm_color(i), alpha=0.2, linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend(title=legend_title or BAND_TITLES[band])


def zoom_to_late(ax: plt.Axes, curves, y: str = "val_loss", x_from_fraction: float = 0.25, margin: float = 0.05,
                 x: str = "step", at: str = "step", band: str = "ci", order=None, references: dict | None = None):
    """Set the y-range to what ``plot_curves`` (same ``x``, ``at``, ``band``, ``order``) draws
    after the first ``x_from_fraction`` of each arm's x-span: mean curves and their bands,
    plus the ``references`` values (label -> value), padded by ``margin`` of the span on each
    side. The early loss then does not flatten the part where arms differ. Call
    ``plot_reference_lines`` afterwards. Returns the new (low, high)."""
    summary = _curve_summary(curves, _arms(curves, order), x, y, at, band)
    start = summary.groupby("arm")["x"].transform(lambda v: v.min() + x_from_fraction * (v.max() - v.min()))
    late = summary[summary["x"] >= start]
    values = np.concatenate([late[["mean", "lo", "hi"]].to_numpy(float).ravel(),
                             np.asarray(list((references or {}).values()), dtype=float)])
    lo, hi = np.nanmin(values), np.nanmax(values)
    pad = margin * (hi - lo) if hi > lo else max(abs(lo), 1.0) * margin
    ax.set_ylim(lo - pad, hi + pad)
    return lo - pad, hi + pad


def plot_paired_differences(ax: plt.Axes, curves, reference: str = "gpt", x: str = "step", y: str = "val_loss",
                            order=None, at: str = "step"):
    """For every arm but ``reference``: per seed, ``y(arm) - y(reference)`` at the same
    evaluation point ``at`` (seeds missing in either arm are left out), drawn as the mean over
    seeds at the arm's mean ``x`` with the t-based 95% CI of that mean as a band (no band
    where one seed remains), and a line at 0. Pairing by seed removes the seed-to-seed
    variation both arms share, so this CI is narrower than one from two unpaired curves.
    Returns the differences: columns arm, seed, ``at``, ``x`` (once if x == at), diff."""
    arms = _arms(curves, order)
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
    for i, arm in enumerate(arms):
        s = summary[summary["arm"] == arm]
        if arm == reference or s.empty:
            continue
        ax.plot(s["x"], s["mean"], color=arm_color(i), label=arm)
        ax.fill_between(s["x"], s["lo"], s["hi"], color=arm_color(i), alpha=0.2, linewidth=0)
    ax.axhline(0.0, color="black", linewidth=0.8, label="_nolegend_")
    ax.set_xlabel(x)
    ax.set_ylabel(f"Δ {y} (arm − {reference})")
    ax.legend(title=f"Δ vs {reference}, mean ± 95% CI (paired by seed)")
    return diffs


def plot_reference_lines(ax: plt.Axes, references: dict, **kwargs) -> list:
    """A dashed grey horizontal line per reference value (``references``: label -> value,
    e.g. n-gram losses) inside the current y-limits, labelled in small text just above it at
    the right end, inside the axes; labels closer than a text height are nudged apart
    vertically. Values outside the limits are neither drawn nor labelled, and the limits are
    then fixed, so set them (``zoom_to_late``) first; labels are placed for the axes' current
    size, so call ``fig.tight_layout()`` before too. ``kwargs`` go to ``ax.axhline``.
    Returns the text artists (annotations), lowest first."""
    ax.autoscale_view()
    lo, hi = sorted(ax.get_ylim())
    ax.set_ylim(ax.get_ylim())  # a new line must not move the limits its labels were placed for
    shown = sorted((v, k) for k, v in references.items() if lo <= v <= hi)
    style = {"color": "grey", "linestyle": "--", "linewidth": 0.8, "zorder": 1, **kwargs}
    for value, _ in shown:
        ax.axhline(value, label="_nolegend_", **style)
    if not shown:
        return []
    renderer = ax.figure.canvas.get_renderer()
    texts = [ax.annotate(label, (0.99, value), xycoords=ax.get_yaxis_transform(), textcoords="offset points",
                         xytext=(0, 0), ha="right", va="bottom", fontsize=7, color="dimgrey", zorder=1.5,
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
    for text, bottom, line in zip(texts, bottoms, lines):  # offsets in points: kept if the axes resize
        text.xyann = (0.0, (bottom - line) / px_per_pt)
    return texts


# --------------------------------------------------------------------------- ablations (notebook 03)

INTERVAL = "mean ± 95% CI over seeds (t)"


def steps_solver_arm(arm: str) -> tuple[str, int]:
    """``"rk4 8"`` -> ``("rk4", 8)``: the solver and number of steps of a ``steps_solver``
    ablation arm (``ablations.ablation_arms`` names them ``"<solver> <n>"``)."""
    solver, _, steps = arm.partition(" ")
    if not steps.isdigit():
        raise ValueError(f"a steps_solver arm is named '<solver> <steps>', e.g. 'euler 4'; got {arm!r}")
    return solver, int(steps)


def nfe_per_forward(solver: str, n_steps: int) -> int:
    """Field evaluations of one forward pass: steps x the solver's stages."""
    from nodelm_lib.ode.tableaus import TABLEAUS

    if solver not in TABLEAUS:
        raise ValueError(f"solver {solver!r} is not a fixed-step method; choose one of {', '.join(TABLEAUS)}")
    return n_steps * TABLEAUS[solver].n_stages


def _errorbar_by(ax: plt.Axes, x, stats, **kwargs):
    """Error bars from ``mean_ci`` results (a single seed: no bar)."""
    means = [s["mean"] for s in stats]
    halves = [0.0 if np.isnan(s["ci_half"]) else s["ci_half"] for s in stats]
    return ax.errorbar(x, means, yerr=halves, marker="o", capsize=3, **kwargs)


def steps_solver_figure(runs, solvers, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """The ``steps_solver`` ablation over depth, a line per solver, every point the mean ± 95%
    CI over seeds: test loss against solver steps, test loss against field evaluations per
    forward pass (NFE: steps x stages, the cost axis), and milliseconds per training step
    against NFE. ``runs``: one row per run (arm, seed, test_loss, ms_per_step)."""
    from .stats import mean_ci

    parsed = runs["arm"].map(steps_solver_arm)
    fig, (steps_ax, nfe_ax, time_ax) = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, solver in enumerate(solvers):
        rows = runs[parsed.str[0] == solver]
        arms = list(dict.fromkeys(rows["arm"]))
        n = [steps_solver_arm(a)[1] for a in arms]
        nfe = [nfe_per_forward(solver, k) for k in n]
        loss = [mean_ci(rows.loc[rows["arm"] == a, "test_loss"].astype(float)) for a in arms]
        time = [mean_ci(rows.loc[rows["arm"] == a, "ms_per_step"].astype(float)) for a in arms]
        _errorbar_by(steps_ax, n, loss, color=arm_color(i), label=solver)
        _errorbar_by(nfe_ax, nfe, loss, color=arm_color(i), label=solver)
        _errorbar_by(time_ax, nfe, time, color=arm_color(i), label=solver)
    steps_ax.set_xlabel("solver steps (depth)")
    for ax in (nfe_ax, time_ax):
        ax.set_xlabel("field evaluations per forward (NFE)")
    steps_ax.set_ylabel(f"test loss ({unit})")
    nfe_ax.set_ylabel(f"test loss ({unit})")
    time_ax.set_ylabel("ms per training step")
    for ax in (steps_ax, nfe_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.legend(title=INTERVAL, fontsize=7, title_fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def ablation_differences_figure(tests: dict, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """The two- and three-arm ablations in one panel: for every arm, its test loss minus its
    ablation's reference, paired by seed (``tests``: ablation -> ``stats.compare_arms`` table),
    as the mean difference with its 95% t-interval; left of zero the arm is better. Each row
    names the arm, the reference and the Holm-adjusted paired-t p of its ablation."""
    labels, rows = [], []
    for name, table in tests.items():
        for _, row in table.iterrows():
            labels.append(f"{name}: {row['arm']} − {row['reference']}\n(n={int(row['n'])}, p_Holm={row['p_t_holm']:.2g})")
            rows.append((name, row))
    fig, ax = plt.subplots(figsize=(6.5, 0.55 * len(rows) + 1.4))
    names = list(tests)
    y = np.arange(len(rows))[::-1]
    for yi, (name, row) in zip(y, rows):
        ax.errorbar(row["mean_diff"], yi, xerr=[[row["mean_diff"] - row["ci_low"]], [row["ci_high"] - row["mean_diff"]]],
                    fmt="o", capsize=4, color=arm_color(names.index(name)))
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(f"Δ test loss vs the reference ({unit})\npaired mean difference and its 95% CI (t)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def depth_curve_means(depth):
    """Validation loss per (trained arm, evaluation method, steps, NFE), mean over seeds, from
    ``ablations.depth_curve`` rows with an ``arm`` column; rows in order of first appearance."""
    keys = ["arm", "method", "n_steps", "nfe"]
    return depth.groupby(keys, sort=False)["val_loss"].mean().reset_index()


def depth_curve_figure(depth, solvers, arms, unit: str = "nats/token", focus: float = 0.5) -> plt.Figure:
    """The adaptive-depth curve: one panel per evaluation solver, validation loss (mean ± 95% CI
    over seeds) against field evaluations per forward pass (log2 axis), a line per trained arm
    (in the order of ``arms``), and a ring where the arm's own solver and steps are (from the
    rows' ``trained_method`` / ``trained_steps``). A flat curve past the trained steps means
    the model learned a flow. The y axis shows ``focus`` nats above the lowest mean, where the
    arms differ; a point above that (a model solved with far too few steps) is drawn as an arrow
    at the top edge, labelled with its value."""
    from .stats import mean_ci

    fig, axes = plt.subplots(1, len(solvers), figsize=(4.8 * len(solvers), 3.8), sharey=True, squeeze=False)
    means = depth.groupby(["arm", "method", "n_steps"])["val_loss"].mean()
    bottom = float(means.min())
    top = bottom + focus
    for ax, method in zip(axes[0], solvers):
        for i, arm in enumerate(arms):
            rows = depth[(depth["arm"] == arm) & (depth["method"] == method)]
            points = list(dict.fromkeys(rows["n_steps"]))
            stats = [mean_ci(rows.loc[rows["n_steps"] == n, "val_loss"].astype(float)) for n in points]
            nfe = [int(rows.loc[rows["n_steps"] == n, "nfe"].iloc[0]) for n in points]
            _errorbar_by(ax, nfe, stats, color=arm_color(i), label=f"trained {arm}", markersize=4)
            for x, st in zip(nfe, stats):
                if st["mean"] > top:  # off the scale: an arrow at the edge, with the value
                    ax.annotate(f"{st['mean']:.1f}", (x, top), xytext=(0, -14), textcoords="offset points",
                                ha="center", fontsize=6, color=arm_color(i),
                                arrowprops={"arrowstyle": "->", "color": arm_color(i)})
            trained = rows[(rows["trained_method"] == method) & (rows["n_steps"] == rows["trained_steps"])]
            if len(trained):
                ax.plot(int(trained["nfe"].iloc[0]), float(trained["val_loss"].mean()), marker="o", markersize=11,
                        markerfacecolor="none", markeredgecolor=arm_color(i), linestyle="none")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"NFE per forward ({method} at evaluation)")
        ax.set_title(f"evaluated with {method}")
    axes[0][0].set_ylim(bottom - 0.05 * focus, top)
    axes[0][0].set_ylabel(f"validation loss ({unit})\n{INTERVAL}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, frameon=False,
               title="ring: the solver and steps each was trained with; arrows: above the axis", title_fontsize=7)
    fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(labels) - 1) // 4), 1, 1))
    return fig


# ablations.depth_transfer's variants (its VARIANTS), as the figure's legend says them
TRANSFER_LABELS = {"trained": "trained at n (n steps)", "evaluated": "evaluated at m, no training",
                  "finetuned": "fine-tuned at m (short budget)", "continued": "control: trained on at n (short budget)",
                  "scratch_short": "from scratch at m (short budget)", "scratch_full": "from scratch at m (full budget)"}


def depth_transfer_figure(summary, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """Fine-tuning at another depth (``ablations.transfer_summary``'s table): a panel per
    trained arch on one y scale, test loss (mean ± 95% CI over seeds) against the target depth m
    (log2 axis) for each variant (``TRANSFER_LABELS``; the rows are ``ablations.depth_transfer``'s variants), and the trained model at its own
    depth as a star. A variant a profile did not train at some m (the full budget, to fit its
    time) is named in the panel instead of leaving a silent gap."""
    archs = list(dict.fromkeys(summary["arm"]))
    fig, axes = plt.subplots(1, len(archs), figsize=(5.2 * len(archs), 4.0), squeeze=False, sharey=True)
    variants = [v for v in TRANSFER_LABELS if v != "trained"]
    for ax, arch in zip(axes[0], archs):
        rows = summary[summary["arm"] == arch]
        steps = sorted(set(rows.loc[rows["variant"] != "trained", "to_steps"]))
        missing = []
        for i, variant in enumerate(variants):
            part = rows[rows["variant"] == variant]
            if part.empty:
                continue
            missing += [f"{TRANSFER_LABELS[variant]} at m={m}" for m in steps if m not in set(part["to_steps"])]
            shift = 2 ** (0.06 * (i - (len(variants) - 1) / 2))  # side by side on the log axis
            ax.errorbar(part["to_steps"] * shift, part["mean"],
                        yerr=[part["mean"] - part["ci_low"], part["ci_high"] - part["mean"]],
                        marker="o", capsize=3, linestyle="none", color=arm_color(i), label=TRANSFER_LABELS[variant])
        trained = rows[rows["variant"] == "trained"]
        ax.errorbar(trained["to_steps"], trained["mean"],
                    yerr=[trained["mean"] - trained["ci_low"], trained["ci_high"] - trained["mean"]],
                    marker="*", markersize=12, capsize=3, linestyle="none", color="black",
                    label=TRANSFER_LABELS["trained"])
        ax.set_xscale("log", base=2)
        ticks = sorted(set(rows["to_steps"]))
        ax.set_xticks(ticks, [str(s) for s in ticks])
        ax.set_xlabel("solver steps m")
        ax.set_title(arch)
        if missing:
            ax.text(0.02, 0.02, "not trained (time budget): " + "; ".join(missing), transform=ax.transAxes,
                    fontsize=6, color="dimgrey", va="bottom")
    axes[0][0].set_ylabel(f"test loss ({unit})\n{INTERVAL}")
    handles, labels = {}, {}
    for ax in axes[0]:  # one legend for every panel: the union of what they draw
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=7, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


# --------------------------------------------------------------------------- generation (notebook 06)


def decode_speed_figure(speed, title: str | None = None) -> plt.Figure:
    """Decoding speed per arch with and without the KV cache: paired bars of tokens per second
    on a log axis (``speed``: one row per arch, columns arch, uncached_tokens_per_s and
    cached_tokens_per_s, as notebook 06 measures them)."""
    use_style()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    x = np.arange(len(speed))
    ax.bar(x - 0.2, speed["uncached_tokens_per_s"], width=0.4, label="recompute the window")
    ax.bar(x + 0.2, speed["cached_tokens_per_s"], width=0.4, label="KV cache")
    ax.set_xticks(x, speed["arch"])
    ax.set_ylabel("decoded tokens / s (log scale)")
    ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # beside the bars, never over them
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- corpora side by side


def corpora_figure(corpora: dict, reference: str, order, unit: str = "nats/char") -> plt.Figure:
    """One comparison on several corpora: ``corpora`` maps a corpus (profile) name to its
    ``(runs, tests)`` (a sweep's ``record_row`` table and its ``compare_arms`` /
    ``stats.holm_family`` table). Left: each arm's paired test-loss difference to ``reference``
    (mean and 95% CI), one marker per corpus; right: each arm's test loss in bits per character
    (mean ± 95% CI), so corpora of different difficulty share an axis only where it means the same."""
    from .stats import mean_ci

    fig, (diff_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 3.8))
    arms = [a for a in order if a != reference]
    width = 0.6 / max(1, len(corpora) - 1) if len(corpora) > 1 else 0.0
    for k, (name, (runs, tests)) in enumerate(corpora.items()):
        shift = (k - (len(corpora) - 1) / 2) * width
        rows = tests[tests["family"] == f"vs {reference}"] if "family" in tests.columns else tests
        rows = rows[rows["reference"] == reference].set_index("arm")
        xs = [i + shift for i, a in enumerate(arms) if a in rows.index]
        found = [a for a in arms if a in rows.index]
        mean = rows.loc[found, "mean_diff"].to_numpy(float)
        err = np.vstack([mean - rows.loc[found, "ci_low"].to_numpy(float), rows.loc[found, "ci_high"].to_numpy(float) - mean])
        diff_ax.errorbar(xs, mean, yerr=err, fmt="o", capsize=3, color=arm_color(k), label=name)
        stats = [mean_ci(runs.loc[runs["arm"] == a, "test_loss"].astype(float) / np.log(2)) for a in order]
        loss_ax.errorbar(np.arange(len(order)) + shift, [s["mean"] for s in stats], yerr=[s["ci_half"] for s in stats],
                         fmt="o", capsize=3, color=arm_color(k), label=name)
    diff_ax.axhline(0.0, color="black", linewidth=0.8)
    diff_ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    diff_ax.set_ylabel(f"test loss − {reference}'s ({unit})")
    diff_ax.set_title(f"paired difference to {reference}, mean and 95% CI", fontsize=10)
    loss_ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    loss_ax.set_ylabel("test loss (bits/char)")
    loss_ax.set_title("test loss, mean ± 95% CI over seeds", fontsize=10)
    diff_ax.legend(title="corpus (profile)")
    fig.tight_layout()
    return fig


def position_bins(length: int, per_octave: int = 4) -> list[tuple[int, int]]:
    """Log-spaced bins [lo, hi) covering positions 0 .. length - 1, ``per_octave`` per doubling
    (position 0 alone first): a loss-by-position curve averaged in them is readable on a log
    axis, where single positions past a few hundred are noise."""
    edges = sorted({0, 1, *(int(round(2 ** (k / per_octave))) for k in range(int(per_octave * np.log2(max(length, 2))) + 1)),
                    length})
    edges = [e for e in edges if e <= length]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def long_context_figure(curves, train_context: int, order=None, unit: str = "nats/char") -> plt.Figure:
    """Loss by position past the training context: per arm, the mean over seeds (band: 95% CI)
    of ``long_context.position_curves``' longest window, in log-spaced position bins, with the
    training context marked. ``curves`` has columns arm, seed, window, position, loss."""
    from .stats import mean_ci

    longest = int(curves["window"].max())
    curves = curves[curves["window"] == longest]
    bins = position_bins(longest)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, arm in enumerate(_arms(curves, order)):
        by_seed = curves[curves["arm"] == arm].pivot_table(index="position", columns="seed", values="loss")
        centres, stats = [], []
        for lo, hi in bins:
            centres.append(np.sqrt(max(lo, 0.5) * hi))  # the bin's geometric middle on the log axis
            stats.append(mean_ci(by_seed.iloc[lo:hi].mean(axis=0).to_numpy()))
        mean = np.array([s["mean"] for s in stats])
        half = np.nan_to_num(np.array([s["ci_half"] for s in stats]))
        ax.plot(centres, mean, color=arm_color(i), label=arm)
        ax.fill_between(centres, mean - half, mean + half, color=arm_color(i), alpha=0.2, linewidth=0)
    ax.axvline(train_context, color="black", linestyle="--", linewidth=0.8)
    ax.annotate("training context", (train_context, 1.0), xycoords=("data", "axes fraction"),
                xytext=(4, -4), textcoords="offset points", ha="left", va="top", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("position in the window (tokens of context)")
    ax.set_ylabel(f"loss ({unit})")
    ax.set_title(f"loss by position, windows of {longest}; mean ± 95% CI over seeds", fontsize=10)
    ax.legend(title="arm")
    fig.tight_layout()
    return fig
