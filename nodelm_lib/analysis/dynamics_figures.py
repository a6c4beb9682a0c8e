"""Notebook 04's figures, drawn from its analyses' results and tables.

Weight spectra against depth, per head (``plot_depth``) and with the trend test's fitted lines
(``plot_depth_trend``), in the complex plane (``plot_complex``); the field's Jacobian along t
(``plot_jacobian``); the Lyapunov analyses' token spectra (``plot_token_spectra``) and sensitivity
maps (``plot_sensitivity``). Each sets the project's style (``use_style``) and takes its colours
from its palette: a model in its arm's colour (``arm_color``), heads, seeds and solver times in
``series_colors``, maps in its colour map. Saving is the caller's.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from nodelm_lib.reporting.style import REFERENCE, SEQUENTIAL_CMAP, arm_color, series_colors, split_arm, use_style

from .depth_trends import pooled_over_heads
from .jacobian import JacobianSpectra
from .lyapunov import TokenSensitivity, TokenSpectrum
from .spectral import KINDS, WeightSpectra


# --------------------------------------------------------------------------- spectra (spectral.py, jacobian.py)


# mathtext, so that a title reads as the matrices it names (head h's blocks; see the module docstring)
KIND_TITLES = {"qk": r"QK: $W_K^{h}\,(W_Q^{h})^{\top}$", "ov": r"OV: $W_V^{h}\,W_O^{[:,h]}$",
               "ff": r"FF: $W_2 W_1$ (linear part)"}


def plot_depth(summary: pd.DataFrame, value: str = "mean_abs", ylabel: str = "mean |λ|") -> plt.Figure:
    """``value`` against t: one row per model, one column per kind, one line per head."""
    use_style()
    models = list(dict.fromkeys(summary.model))
    kinds = [k for k in KINDS if k in set(summary.kind)]
    fig, axes = plt.subplots(len(models), len(kinds), figsize=(3.6 * len(kinds), 2.9 * len(models)),
                             squeeze=False)
    for r, name in enumerate(models):
        for c, kind in enumerate(kinds):
            ax = axes[r, c]
            df = summary[(summary.model == name) & (summary.kind == kind)]
            heads = df.groupby("head")
            for (h, g), color in zip(heads, series_colors(max(1, heads.ngroups))):
                ax.plot(g.t, g[value], marker="o", ms=3, color=color, label="all units" if h < 0 else f"head {h}")
            ax.set(title=f"{name} · {KIND_TITLES[kind]}", xlabel="depth t", ylabel=ylabel)
            ax.title.set_fontsize(9)
            if r == 0 and c < 2:
                ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_depth_trend(summary: pd.DataFrame, trend: pd.DataFrame, value: str = "mean_abs",
                     ylabel: str = "mean |λ|, heads pooled", confidence: float = 0.95) -> plt.Figure:
    """What ``depth_trend_test`` tests: per model (rows) and kind (columns) each seed's head-pooled
    ``value`` against t with its least-squares line, titled with the mean slope, its ``confidence``
    CI over seeds (the level ``trend`` was computed at) and Holm's p."""
    use_style()
    pooled = pooled_over_heads(summary, value)
    models = list(dict.fromkeys(pooled.model))
    kinds = [k for k in KINDS if k in set(pooled.kind)]
    fig, axes = plt.subplots(len(models), len(kinds), figsize=(3.6 * len(kinds), 2.9 * len(models)), squeeze=False)
    result = trend.set_index(["model", "kind"])
    for r, name in enumerate(models):
        for c, kind in enumerate(kinds):
            ax = axes[r, c]
            seeds = pooled[(pooled.model == name) & (pooled.kind == kind)].groupby("seed")
            for (seed, g), color in zip(seeds, series_colors(max(1, seeds.ngroups))):
                t, v = g.t.to_numpy(), g[value].to_numpy()
                ax.plot(t, v, "o", ms=3, color=color, label=f"seed {seed}")
                if len(t) > 1:
                    ax.plot(t, np.polyval(np.polyfit(t, v, 1), t), "-", lw=0.8, color=color)
            row = result.loc[(name, kind)]
            ax.set(title=f"{name} · {KIND_TITLES[kind]}\nslope {row.slope_mean:+.3g}, {confidence:.0%} CI "
                         f"[{row.ci_low:+.3g}, {row.ci_high:+.3g}], Holm p {row.p_holm:.2g}", xlabel="depth t",
                   ylabel=ylabel)
            ax.title.set_fontsize(8)
            if r == 0 and c == 0:
                ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_complex(spectra: dict[str, WeightSpectra], steps: list[int] | None = None) -> plt.Figure:
    """QK and OV eigenvalues in the complex plane at a few solver steps (all heads pooled), one row per model."""
    use_style()
    fig, axes = plt.subplots(len(spectra), 2, figsize=(9, 3.9 * len(spectra)), squeeze=False)
    for r, (name, s) in enumerate(spectra.items()):
        n = len(s.times)
        chosen = steps if steps is not None else sorted({0, n // 2, n - 1})
        for c, kind in enumerate(("qk", "ov")):
            ax = axes[r, c]
            for i, color in zip(chosen, series_colors(len(chosen))):
                e = getattr(s, kind)[i].reshape(-1)
                ax.scatter(e.real, e.imag, s=9, alpha=0.75, color=color, label=f"t = {s.times[i]:.3g}")
            ax.axvline(0.0, color=REFERENCE, lw=0.7)
            ax.axhline(0.0, color=REFERENCE, lw=0.7)
            ax.set(title=f"{name} · {KIND_TITLES[kind]}", xlabel="Re λ", ylabel="Im λ")
            ax.title.set_fontsize(9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_jacobian(spectra: dict[str, JacobianSpectra]) -> plt.Figure:
    """Spectral radius, largest real part and spectral norm of d f / d x against t, and the state's
    RMS (the layer norms scale J by its inverse), per model (``"<arm> seed <s>"``: the arm's colour,
    a line style per seed)."""
    use_style()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    seen: dict[str, int] = {}
    for name, s in spectra.items():
        arm = split_arm(name)[0]
        k = seen[arm] = seen.get(arm, -1) + 1
        line = {"color": arm_color(arm), "linestyle": _SEED_LINES[k % len(_SEED_LINES)]}
        for ax, values in zip(axes, (s.spectral_radius, s.max_real, s.spectral_norm, s.state_rms)):
            ax.plot(s.times, values, marker="o", ms=3, label=name, **line)
    titles = ("spectral radius ρ(∂f/∂x)", "largest Re λ(∂f/∂x)", "spectral norm ‖∂f/∂x‖₂",
              "RMS of the state x(t)")
    ylabels = ("ρ (log scale)", "max Re λ (symmetric log: negative values kept)", "‖∂f/∂x‖₂ (log scale)",
               "RMS (log scale)")
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set(title=title, xlabel="depth t", ylabel=ylabel)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    for ax in (axes[0], axes[2], axes[3]):  # positive by definition
        ax.set_yscale("log")
    # a real part can be negative (a contracting direction): a log axis would drop it
    axes[1].set_yscale("symlog", linthresh=1e-2)
    axes[1].axhline(0.0, color=REFERENCE, lw=0.8)
    fig.tight_layout()
    return fig


# the second, third, ... model of one arm in a figure (another seed): its line style
_SEED_LINES = ["-", "--", ":", "-."]


# --------------------------------------------------------------------------- Lyapunov exponents (lyapunov.py)


def plot_token_spectra(spectra: dict[str, TokenSpectrum]) -> plt.Figure:
    """Each model's token spectrum, QR and singular-value exponents, against their index."""
    use_style()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in spectra.items():
        color = arm_color(name)
        k = np.arange(1, len(s.svd) + 1)
        ax.plot(k, s.svd, "-", color=color, label=f"{name}: log singular values")
        ax.plot(k, s.qr, "o", ms=2.5, mfc="none", color=color, label=f"{name}: QR (Benettin)")
    ax.axhline(0.0, color=REFERENCE, lw=0.8)
    ax.set(title="Finite-time Lyapunov spectrum of one token over t in [0, 1]", xlabel="index k",
           ylabel="exponent (1/τ) log growth")
    ax.legend(fontsize=7)
    # why the two estimators disagree most at the top: over one finite time the log singular values
    # of the whole flow map bound the growth from above, while QR accumulates the growth of an
    # orthonormal frame step by step; they agree only as the time grows
    fig.text(0.01, 0.01, "finite time: the singular values of the flow map (lines) bound the step-wise QR "
             "estimate (rings) from above;\nthe two need not agree, least of all for the leading exponents",
             fontsize=6, color="dimgrey", va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_sensitivity(maps: dict[str, TokenSensitivity], labels: list[str] | None = None) -> plt.Figure:
    """Heat-maps of S_ij (output position i, input position j), one panel per model, one colour scale,
    each with its labelled colour bar (S_ij = log σmax(∂x_i(1)/∂x_j(0)), the finite-time exponent)."""
    use_style()
    n = len(maps)
    values = np.concatenate([s.exponent[np.isfinite(s.exponent)] for s in maps.values()])
    vmin, vmax = float(values.min()), float(values.max())
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.6), squeeze=False)
    for ax, (name, s) in zip(axes[0], maps.items()):
        im = ax.imshow(np.ma.masked_invalid(s.exponent), cmap=SEQUENTIAL_CMAP, vmin=vmin, vmax=vmax, origin="upper")
        ax.grid(False)
        T = len(s.tokens)
        if labels is not None:
            ax.set_xticks(range(T), labels=labels, fontsize=6, rotation=90)
            ax.set_yticks(range(T), labels=labels, fontsize=6)
        ax.set(title=f"{name}: sensitivity of output i to input j", xlabel="input token j", ylabel="output token i")
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        bar.set_label("S_ij = log σmax(∂x_i(1)/∂x_j(0))\n(blank: j after i, no influence)", fontsize=8)
    fig.tight_layout()
    return fig
