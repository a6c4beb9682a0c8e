"""The conclusions of notebook 04 ("What the results show"), written from its two tables.

Notebook 04 writes ``results/spectral_<profile>.csv`` (weight and Jacobian spectra per t) and
``results/lyapunov_<profile>.csv`` (token sensitivity and token spectra). :func:`findings`
turns those two tables into Markdown, so every number and every word that depends on one
(grows / shrinks, agrees with / does not reproduce Tong et al.) comes from the tables and
changes when they do; nothing is typed in by hand. It works on the tables read back from disk
as well as on the frames the notebook holds.

The rows it reads:

* spectral: ``WeightSpectra.summary()`` and ``JacobianSpectra.summary()`` rows with a ``model``
  column (``kind`` is ``qk``, ``ov``, ``ff`` or ``jacobian``);
* lyapunov: ``TokenSensitivity.frame()`` rows (``analysis == "sensitivity"``: ``i``, ``j``,
  ``exponent``) and ``TokenSpectrum.frame()`` rows (``"token_spectrum"``: ``index``, ``qr``,
  ``svd``), each with ``model``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .spectral import depth_trend, dynamics_summary

#: Tong et al. (ICLR 2025) report that eigenvalue magnitudes of the attention weight products grow
#: with depth. A share of heads that grow above the first threshold agrees with that, one below
#: the second does not reproduce it, in between only partly.
AGREES_ABOVE, DISAGREES_BELOW = 0.75, 0.5

ATTENTION_KINDS = ("qk", "ov")
WEIGHT_KINDS = ("qk", "ov", "ff")


def agreement(share_growing: float) -> str:
    """How a share of growing heads relates to the reported growth (bold verb phrase)."""
    if share_growing > AGREES_ABOVE:
        return "**agrees** with"
    if share_growing < DISAGREES_BELOW:
        return "**does not reproduce**"
    return "**only partly reproduces**"


# --------------------------------------------------------------------------- numbers behind the words


def sensitivity_stats(frame: pd.DataFrame) -> dict:
    """Summary of one model's sensitivity map S_ij (``TokenSensitivity.frame()`` rows): the mean
    over a token's own perturbation (i = j) and over earlier tokens (j < i), the correlation of
    S_ij (j < i) with the distance i - j, and the largest S_ij with j < i."""
    own = frame[frame.i == frame.j]
    earlier = frame[frame.j < frame.i]
    off = earlier.exponent.to_numpy(float)
    distance = (earlier.i - earlier.j).to_numpy(float)
    return {"mean S_ii (own token)": own.exponent.to_numpy(float).mean(), "mean S_ij, j < i": off.mean(),
            "corr(S_ij, i - j)": np.corrcoef(distance, off)[0, 1] if len(own) > 2 else np.nan,
            "max S_ij, j < i": off.max()}


def spectrum_stats(frame: pd.DataFrame) -> dict:
    """Summary of one token's finite-time Lyapunov spectrum (``TokenSpectrum.frame()`` rows): the
    largest exponent by singular values and by QR, the smallest, how many are positive, and their
    sum (log|det|, the same for both methods)."""
    spectrum = frame.sort_values("index")
    svd, qr = spectrum.svd.to_numpy(float), spectrum.qr.to_numpy(float)
    return {"largest (svd)": svd[0], "largest (QR)": qr[0], "smallest (svd)": svd[-1],
            "positive (svd)": int((svd > 0).sum()), "sum = log|det|": svd.sum()}


# --------------------------------------------------------------------------- sentences


def growth_paragraph(trend: pd.DataFrame, summary: pd.DataFrame, profile: str, train_steps: int) -> str:
    """Do attention eigenvalue magnitudes grow with depth, as Tong et al. report? Per kind (QK,
    OV) over every head of every model (``trend``: ``depth_trend`` of mean |lambda|), and pooled
    per model (``summary``: ``dynamics_summary``)."""
    models = "both models" if trend.model.nunique() == 2 else f"all {trend.model.nunique()} models"
    kinds = [k for k in ATTENTION_KINDS if (trend.kind == k).any()]
    text = [f"**Growth with depth.** Tong et al. report eigenvalue magnitudes of the attention weight products "
            f"that grow with depth. Here (profile `{profile}`, {train_steps} training steps, {models} together):"]
    for n, kind in enumerate(kinds, 1):
        growing = trend[trend.kind == kind].ratio > 1
        text.append(f"{kind.upper()}: {int(growing.sum())} of {len(growing)} heads end with a larger mean |λ| than "
                    f"they start, which {agreement(float(growing.mean()))} that observation{'.' if n == len(kinds) else ';'}")
    pooled = summary[summary.analysis.isin(ATTENTION_KINDS)]
    text.append("Pooling every head's eigenvalues at each t, mean |λ| last / first: " + ", ".join(
        f"{r.model} {r.analysis.upper()} {r.mean_abs_ratio:.3g}" for r in pooled.itertuples()) + ".")
    return " ".join(text)


def weight_growth_line(trend: pd.DataFrame, radius_trend: pd.DataFrame, model: str, kind: str) -> str:
    """One model's weight product ``kind`` along depth: the MLP (one 'head') by its ratio and rank
    correlation with t, attention by how many heads grow; with the spectral radius's ratio."""
    g = trend[(trend.model == model) & (trend.kind == kind)]
    r = radius_trend[(radius_trend.model == model) & (radius_trend.kind == kind)]
    if kind == "ff":
        row, rr = g.iloc[0], r.iloc[0]
        return (f"mean |λ| {'grows' if row.ratio > 1 else 'shrinks'} from the first to the last t (ratio {row.ratio:.3g}, "
                f"Spearman ρ with t {row.spearman:.2f}{', at every step' if row.monotone_up else ''}); "
                f"spectral radius ratio {rr.ratio:.3g}")
    n, up, mono = len(g), int((g.ratio > 1).sum()), int(g.monotone_up.sum())
    return (f"{up}/{n} heads have a larger mean |λ| at the last t than at the first "
            f"(ratio last/first {g.ratio.min():.3g} to {g.ratio.max():.3g}, median Spearman ρ with t "
            f"{g.spearman.median():.2f}; {mono}/{n} grow at every step; spectral radius larger at the end for "
            f"{int((r.ratio > 1).sum())}/{n})")


def jacobian_line(rows: pd.DataFrame, model: str) -> str:
    """The field Jacobian's spectral radius from the first to the last solver time next to the
    state's RMS (the layer norms scale the Jacobian by its inverse), and its largest real part."""
    rows = rows.sort_values("t")
    t, rad, rms = rows.t.to_numpy(float), rows.spectral_radius.to_numpy(float), rows.state_rms.to_numpy(float)
    real = rows.max_real.to_numpy(float)
    return (f"- **{model} · Jacobian ∂f/∂x**: spectral radius {rad[0]:.3g} at t = {t[0]:.3g} and {rad[-1]:.3g} at "
            f"t = {t[-1]:.3g} ({'growing' if rad[-1] > rad[0] else 'shrinking'}) while the state's RMS goes from "
            f"{rms[0]:.3g} to {rms[-1]:.3g}; ρ × RMS goes from {rad[0] * rms[0]:.3g} to "
            f"{rad[-1] * rms[-1]:.3g}. Largest real part between {real.min():.3g} and {real.max():.3g} "
            f"({'some directions expand locally at every t' if real.min() > 0 else 'not expanding at every t'}).")


def sensitivity_line(model: str, sensitivity: pd.DataFrame, spectrum: pd.DataFrame) -> str:
    """How much a perturbation of a token's own state grows against one of earlier tokens, and
    the last token's finite-time Lyapunov spectrum."""
    st, ts = sensitivity_stats(sensitivity), spectrum_stats(spectrum)
    own, earlier = st["mean S_ii (own token)"], st["mean S_ij, j < i"]
    return (f"- **{model} · sensitivity**: a token's own perturbation grows at rate {own:.3g} on average "
            f"(S_ii), perturbations of earlier tokens at {earlier:.3g} (S_ij, j < i), i.e. "
            f"{np.exp(own - earlier):.3g}x less; correlation with the distance i - j: "
            f"{st['corr(S_ij, i - j)']:.2f}. Last token: largest exponent {ts['largest (svd)']:.3g} (singular values) / "
            f"{ts['largest (QR)']:.3g} (QR from the identity basis), {ts['positive (svd)']} of {len(spectrum)} positive, "
            f"log|det| = {ts['sum = log|det|']:.3g}.")


# --------------------------------------------------------------------------- the section


def findings(spectral: pd.DataFrame, lyapunov: pd.DataFrame, profile: str, train_steps: int) -> str:
    """Notebook 04's conclusions as Markdown, from its spectral and Lyapunov tables (see the
    module docstring for their rows). ``profile`` and ``train_steps`` only say where the numbers
    come from. Models appear in the order of the spectral table."""
    missing = {"model", "kind", "t", "mean_abs", "spectral_radius"} - set(spectral.columns)
    if missing:
        raise ValueError(f"spectral table lacks columns {sorted(missing)}; it has {list(spectral.columns)}")
    models = list(dict.fromkeys(spectral.model))
    weights = spectral[spectral.kind.isin(WEIGHT_KINDS)]
    trend, radius_trend = depth_trend(weights, "mean_abs"), depth_trend(weights, "spectral_radius")
    text = [growth_paragraph(trend, dynamics_summary(spectral, lyapunov), profile, train_steps), ""]
    text += [f"- **{model} · {kind.upper()}**: {weight_growth_line(trend, radius_trend, model, kind)}."
             for model in models for kind in WEIGHT_KINDS
             if ((trend.model == model) & (trend.kind == kind)).any()]
    text += [jacobian_line(spectral[(spectral.model == model) & (spectral.kind == "jacobian")], model)
             for model in models if ((spectral.model == model) & (spectral.kind == "jacobian")).any()]
    text.append("")
    for model in models:
        rows = lyapunov[lyapunov.model == model]
        text.append(sensitivity_line(model, rows[rows.analysis == "sensitivity"], rows[rows.analysis == "token_spectrum"]))
    return "\n".join(text)
