"""The project's figure style, and what every figure goes through: one palette (each arm's colour
``arm_color`` / ``arm_line``, each corpus' ``corpus_color``, ``series_colors`` for anything else,
greys for references; ``is_palette_color`` tells them), matplotlib settings (``STYLE``, ``use_style``), saving as PNG and PDF with a
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

# One colour per arm, the same in every figure of every notebook: each registered model family
# (``nodelm_lib.families``) and the controls of ``experiments.protocol`` (``gpt_parallel``,
# ``gpt_matched``: gpt's variants, in blues beside gpt's). Okabe-Ito's colour-blind-safe colours
# first, then Tol's indigo and olive and a brown; no two arms of a figure share a hue family
# (``ti_mlp`` and ``ssm`` were two pinks once).
ARM_COLORS = {"gpt": "#0072b2", "gpt_parallel": "#56b4e9", "gpt_matched": "#332288", "hybrid": "#d55e00",
              "node": "#009e73", "ti_mlp": "#cc79a7", "ti_ssm": "#e69f00", "ssm": "#8c564b", "looped": "#999933"}

# A variant of an arm ("<arm> <variant>", notebook 09's "node random", "ti_mlp reg") keeps its arm's
# colour and takes a line style and marker of its own.
VARIANT_LINES = {"": {"linestyle": "-", "marker": "o"}, "random": {"linestyle": "--", "marker": "s"},
                 "reg": {"linestyle": ":", "marker": "D"}}

# Corpora (``data.sources.CORPORA``) in colours no arm has: a corpus figure's arms sit on its x axis.
CORPUS_COLORS = {"tinyshakespeare": "#882255", "wikitext2": "#44aa99", "wikitext103": "#117733"}
CORPUS_MARKERS = {"tinyshakespeare": "o", "wikitext2": "s", "wikitext103": "^"}

# What is neither an arm nor a corpus (solvers, seeds, heads, depths, the variants of an ablation):
# ``series_colors`` takes n colours from this colour map, dark to light, so that no such series
# takes an arm's colour; heat maps use it too.
SEQUENTIAL_CMAP = "viridis"
# series_colors stops short of viridis' pale yellow end, which vanishes on white
_SERIES_END = 0.85

# Reference lines (n-gram models, zero), intervals of a summary drawn over coloured points, notes:
# greys and black, never a palette colour.
NEUTRAL = "black"
REFERENCE = "grey"
NOTE = "dimgrey"

# How every interval of every figure is named (legends, axis labels or titles say it).
CI_LABEL = "95% CI"

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
    # anything drawn without a colour of its own: the series colours, never an arm's
    "axes.prop_cycle": mpl.cycler(color=[mpl.colors.to_hex(c) for c in
                                         mpl.colormaps[SEQUENTIAL_CMAP](np.linspace(0.0, _SERIES_END, 6))]),
    "image.cmap": SEQUENTIAL_CMAP,
}


# matplotlib's warning when placing a loc="best" legend took over a second (see save_figure)
_SLOW_LEGEND_WARNING = 'Creating legend with loc="best" can be slow'


def split_arm(name: str) -> tuple[str, str]:
    """``"node random"`` -> ``("node", "random")``; ``"gpt"`` -> ``("gpt", "")``."""
    if not isinstance(name, str):
        raise TypeError(f"an arm is named by a string (e.g. 'gpt', 'node random'), got {name!r}")
    arm, _, variant = name.strip().partition(" ")
    return arm, variant.strip()


def arm_color(name: str) -> str:
    """The colour of arm ``name`` in every figure (``ARM_COLORS``); a variant ``"<arm> <variant>"``
    has its arm's colour. A family registered without a colour here, or a name that is no arm,
    is a ValueError naming the valid arms."""
    arm, _ = split_arm(name)
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    from nodelm_lib import families

    if arm in families.names():
        raise ValueError(f"model family {arm!r} has no colour: add it to nodelm_lib.reporting.style.ARM_COLORS "
                         f"(colours taken: {', '.join(ARM_COLORS.values())})")
    raise ValueError(f"{name!r} is not an arm with a colour; choose one of {', '.join(ARM_COLORS)} "
                     f"(optionally followed by a variant: {', '.join(v for v in VARIANT_LINES if v)})")


def arm_line(name: str) -> dict:
    """Line properties of arm ``name``: its colour, and its variant's line style and marker
    (``VARIANT_LINES``; an unknown variant is a ValueError)."""
    _, variant = split_arm(name)
    if variant not in VARIANT_LINES:
        raise ValueError(f"arm {name!r}: variant {variant!r} has no line style; choose one of "
                         f"{', '.join(repr(v) for v in VARIANT_LINES if v)} (style.VARIANT_LINES)")
    return {"color": arm_color(name), **VARIANT_LINES[variant]}


def corpus_color(corpus: str) -> str:
    """The colour of ``corpus`` (``CORPUS_COLORS``); an unknown corpus is a ValueError."""
    if corpus not in CORPUS_COLORS:
        raise ValueError(f"corpus {corpus!r} has no colour; choose one of {', '.join(CORPUS_COLORS)}")
    return CORPUS_COLORS[corpus]


def series_colors(n: int) -> list[str]:
    """``n`` colours for series that are neither arms nor corpora (solvers, seeds, heads, the
    variants of an ablation), dark to light along ``SEQUENTIAL_CMAP``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    values = np.linspace(0.0, _SERIES_END, n) if n > 1 else [0.0]
    return [mpl.colors.to_hex(c) for c in mpl.colormaps[SEQUENTIAL_CMAP](values)]


def is_neutral(color) -> bool:
    """A grey, black or white (equal red, green and blue, to within a step of 8 bits)."""
    r, g, b = mpl.colors.to_rgb(color)
    return max(r, g, b) - min(r, g, b) <= 1.5 / 255


def is_palette_color(color, max_series: int = 12) -> bool:
    """Whether ``color`` is one the style hands out: an arm's, a corpus', one of ``series_colors(n)``
    for n up to ``max_series``, or a neutral (``is_neutral``). Alpha is ignored."""
    if is_neutral(color):
        return True
    hexed = mpl.colors.to_hex(color, keep_alpha=False).lower()
    allowed = {c.lower() for c in (*ARM_COLORS.values(), *CORPUS_COLORS.values())}
    allowed |= {c.lower() for n in range(1, max_series + 1) for c in series_colors(n)}
    return hexed in allowed


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


# A pixel channel may move this many of 255 levels between two renderings of the same figure:
# anti-aliased edges round differently where a coordinate differs in its last bits (numpy's
# vectorised log, behind log-scaled axes, has CPU-specific kernels).
# A change of the figure itself (a point moved, a label changed) moves edges by whole levels.
SAME_PICTURE_LEVELS = 2


def save_figure(fig: plt.Figure, path_stem: str | Path) -> list[Path]:
    """Save ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` at the project's resolution (``STYLE``'s
    ``savefig.dpi``, whatever the style in force); PDF dates are left out so that a rerun writes
    the same bytes. The PNG carries ``axes_description`` as JSON in its "Description" text.

    Where both files exist and hold the same picture (``same_picture``: the same axes description
    and size, no pixel more than ``SAME_PICTURE_LEVELS`` levels apart) they are kept as they are,
    so that a rerun on another kind of CPU leaves committed figures unchanged."""
    import io
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
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight", dpi=dpi,
                    metadata={"Software": None, "Description": description})
        if all(p.exists() for p in paths) and same_picture(paths[0], png.getvalue()):
            return paths
        paths[0].write_bytes(png.getvalue())
        fig.savefig(paths[1], bbox_inches="tight", dpi=dpi,
                    metadata={"CreationDate": None, "Producer": None, "Creator": None})
    return paths


def same_picture(saved: str | Path, png: bytes, levels: int = SAME_PICTURE_LEVELS) -> bool:
    """Whether the PNG file ``saved`` and the PNG bytes ``png`` show the same figure: the same
    "Description" (``axes_description``), the same size, and no pixel channel more than ``levels``
    of 255 apart. Identical bytes are the same picture at once."""
    import io

    from PIL import Image

    saved = Path(saved)
    old = saved.read_bytes()
    if old == png:
        return True
    try:
        a, b = Image.open(io.BytesIO(old)), Image.open(io.BytesIO(png))
    except OSError:  # not a PNG any more (a truncated or replaced file): write the new one
        return False
    if a.info.get("Description") != b.info.get("Description") or a.size != b.size or a.mode != b.mode:
        return False
    diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16))
    return int(diff.max(initial=0)) <= levels


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
