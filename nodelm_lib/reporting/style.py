"""The project's figure style, and what every figure goes through: colours (``PALETTE``,
``arm_color``), matplotlib settings (``STYLE``, ``use_style``), saving as PNG and PDF with a
description of the axes in the PNG (``save_figure``, ``axes_description``), a trailing moving
average for noisy curves (``smooth``) and labels placed beside points without overlapping
(``label_points``). The plots over runs and curves are in ``plotting``, the notebooks' composite
figures in ``figures``."""

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


# --------------------------------------------------------------------------- labels beside points

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
