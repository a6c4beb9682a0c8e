"""Notebook 04's summary table and conclusions ("What the results show"), written from its tables.

Notebook 04 writes ``results/spectral_<profile>.csv`` (weight and Jacobian spectra per t) and
``results/lyapunov_<profile>.csv`` (token sensitivity and token spectra). :func:`dynamics_summary`
condenses them into one row per (model, seed, analysis): the descriptive numbers of notebook 04
and its docs table. :func:`findings` turns the two tables into Markdown, so every number and
every word that depends on one (grows / shrinks / not resolved, agrees with / does not reproduce
Tong et al.) comes from the tables and changes when they do; nothing is typed in by hand. It works on the tables read back
from disk as well as on the frames the notebook holds.

"Grows with depth" is the verdict of ``depth_trends.depth_trend_test``: the slope of the heads'
pooled mean |lambda| against every solver time, per seed, tested across seeds with Holm's
correction; where Holm's p does not resolve a direction (always where the slope's CI spans zero)
the text says "not resolved at n = <seeds>". Numbers of the
Jacobian and Lyapunov analyses are means over the seeds the tables hold.

The rows it reads:

* spectral: ``WeightSpectra.summary()`` and ``JacobianSpectra.summary()`` rows with ``model`` and
  ``seed`` columns (``kind`` is ``qk``, ``ov``, ``ff`` or ``jacobian``);
* lyapunov: ``TokenSensitivity.frame()`` rows (``analysis == "sensitivity"``: ``i``, ``j``,
  ``exponent``) and ``TokenSpectrum.frame()`` rows (``"token_spectrum"``: ``index``, ``qr``,
  ``svd``), each with ``model`` and ``seed``.

A table without ``seed`` (written before notebook 04 trained several seeds) is one run of seed 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .depth_trends import depth_trend, depth_trend_test, with_seed
from .spectral import KINDS

ATTENTION_KINDS = ("qk", "ov")
WEIGHT_KINDS = ("qk", "ov", "ff")


def agreement(verdicts: list[str]) -> str:
    """How one weight product's verdicts (``depth_trend_test``, one per model) relate to Tong et
    al.'s growth with depth (a bold verb phrase): agrees where every model's value grows, does not
    reproduce it where none grows and one shrinks, partly where some grow; unresolved otherwise."""
    grows = [v == "grows with depth" for v in verdicts]
    if all(grows):
        return "**agrees** with"
    if any(grows):
        return "**only partly reproduces**"
    if any(v == "shrinks with depth" for v in verdicts):
        return "**does not reproduce**"
    return "**neither confirms nor refutes**"


# --------------------------------------------------------------------------- the summary table


SUMMARY_COLUMNS = ("model", "seed", "analysis", "t_first", "t_last", "mean_abs_first", "mean_abs_last",
                   "mean_abs_ratio", "radius_first", "radius_last", "radius_ratio", "radius_min", "radius_max",
                   "heads_growing", "max_exponent", "exponent_sum", "n_positive")


def dynamics_summary(spectral: pd.DataFrame, lyapunov: pd.DataFrame) -> pd.DataFrame:
    """The headline numbers of notebook 04, one row per (model, seed, analysis), from its two tables:
    ``spectral`` (``WeightSpectra.summary()`` and ``JacobianSpectra.summary()`` rows with ``model``
    and ``seed`` columns: ``results/spectral_<profile>.csv``) and ``lyapunov``
    (``TokenSensitivity.frame()`` and ``TokenSpectrum.frame()`` rows with ``model``, ``seed`` and
    ``analysis``: ``results/lyapunov_<profile>.csv``). A table without ``seed`` is one run of seed 0.

    - ``qk``, ``ov``, ``ff``, ``jacobian``: at each t the eigenvalues of all heads pooled, their mean
      |lambda| and spectral radius at the first and last solver time (``t_first``, ``t_last``), the
      ratios last / first, and the radius's range over t. ``heads_growing`` (weights only): heads
      whose own mean |lambda| is larger at the last t than at the first, of all heads. These
      describe one run's endpoints; whether a value grows with depth is ``depth_trend_test``'s
      question (every t, every seed).
    - ``sensitivity``: ``max_exponent`` the largest S_ij = log sigma_max(d x_i(1) / d x_j(0)) over
      j <= i, ``n_positive`` the pairs (i, j) with S_ij > 0 (a perturbation of token j that grows by
      the time it reaches token i), of all pairs.
    - ``token_spectrum``: the singular-value (finite-time Lyapunov) exponents of one token's block
      d x_p(1) / d x_p(0): the largest, the sum (log|det|) and how many are positive. One row per
      position if the table holds several (analysis ``token_spectrum@p``).
    Cells that do not apply are NaN.
    """
    spectral, lyapunov = with_seed(spectral), with_seed(lyapunov)
    runs = list(dict.fromkeys([*zip(spectral.model, spectral.seed), *zip(lyapunov.model, lyapunov.seed)]))
    models = list(dict.fromkeys(name for name, _ in runs))
    rows = []
    for name, seed in sorted(runs, key=lambda run: models.index(run[0])):  # model by model, seeds as listed
        s = spectral[(spectral.model == name) & (spectral.seed == seed)]
        rows += [dict(model=name, seed=seed, **row) for row in _spectra_rows(s)]
        ly_ = lyapunov[(lyapunov.model == name) & (lyapunov.seed == seed)]
        rows += [dict(model=name, seed=seed, **row) for row in _lyapunov_rows(ly_)]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _spectra_rows(s: pd.DataFrame) -> list[dict]:
    """``dynamics_summary``'s weight and Jacobian rows of one run."""
    rows = []
    for kind in (*KINDS, "jacobian"):
        g = s[s.kind == kind].sort_values(["t", "head"])
        if g.empty:
            continue
        per_t = g.assign(sum_abs=g.mean_abs * g.n_eigs).groupby("t").agg(
            sum_abs=("sum_abs", "sum"), n=("n_eigs", "sum"), radius=("spectral_radius", "max"))
        mean_abs, radius = (per_t.sum_abs / per_t.n).to_numpy(), per_t.radius.to_numpy()
        row = dict(analysis=kind, t_first=per_t.index[0], t_last=per_t.index[-1],
                   mean_abs_first=mean_abs[0], mean_abs_last=mean_abs[-1], mean_abs_ratio=mean_abs[-1] / mean_abs[0],
                   radius_first=radius[0], radius_last=radius[-1], radius_ratio=radius[-1] / radius[0],
                   radius_min=radius.min(), radius_max=radius.max())
        if kind != "jacobian":
            grows = g.groupby("head").mean_abs.agg(lambda v: v.iloc[-1] > v.iloc[0])
            row["heads_growing"] = f"{int(grows.sum())}/{len(grows)}"
        rows.append(row)
    return rows


def _lyapunov_rows(ly_: pd.DataFrame) -> list[dict]:
    """``dynamics_summary``'s sensitivity and token-spectrum rows of one run."""
    rows = []
    S = ly_[ly_.analysis == "sensitivity"].exponent.to_numpy(float)
    if S.size:
        rows.append(dict(analysis="sensitivity", max_exponent=np.nanmax(S), n_positive=f"{int((S > 0).sum())}/{S.size}"))
    spectra = ly_[ly_.analysis == "token_spectrum"]
    for position, g in spectra.groupby("position", sort=False):
        svd = g.sort_values("index").svd.to_numpy(float)
        label = "token_spectrum" if spectra.position.nunique() == 1 else f"token_spectrum@{int(position)}"
        rows.append(dict(analysis=label, max_exponent=svd.max(), exponent_sum=svd.sum(),
                         n_positive=f"{int((svd > 0).sum())}/{svd.size}"))
    return rows


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


def _over_seeds(n: int) -> str:
    return "" if n == 1 else f" (mean over {n} seeds)"


def _interval(row) -> str:
    """A trend row's mean slope with its CI (the CI only where there are seeds to make one)."""
    ci = f", 95% CI [{row.ci_low:+.3g}, {row.ci_high:+.3g}]" if np.isfinite(row.ci_low) else ""
    return f"mean slope {row.slope_mean:+.3g} per unit t{ci}"


def trend_line(row) -> str:
    """One (model, kind) row of ``depth_trend_test`` in words: the slope across seeds and the verdict."""
    p = f"Holm p = {row.p_holm:.2g}" if np.isfinite(row.p_holm) else "no test with one seed"
    return (f"{_interval(row)} ({row.rel_slope:+.0%} of its mean {row.level:.3g} per unit t; "
            f"{row.n_up}/{row.n_seeds} seeds rise; mean Spearman ρ with t "
            f"{row.spearman_mean:.2f}; {p}): **{row.verdict}**")


def growth_paragraph(test: pd.DataFrame, profile: str, train_steps: int) -> str:
    """Do attention eigenvalue magnitudes grow with depth, as Tong et al. report? The verdict of
    ``depth_trend_test`` per kind (QK, OV) over the models, from every solver time and seed."""
    n_seeds, n_times = int(test.n_seeds.max()), int(test.n_times.max())
    models = "both models" if test.model.nunique() == 2 else f"{test.model.nunique()} models"
    text = [f"**Growth with depth.** Tong et al. report eigenvalue magnitudes of the attention weight products "
            f"that grow with depth. Tested here (profile `{profile}`, {train_steps} training steps, {models}, "
            f"{n_seeds} seed{'s' if n_seeds > 1 else ''} each) over all {n_times} solver times: per seed the "
            f"least-squares slope of the heads' pooled mean |λ| against t, across seeds its mean with a t-based "
            f"95% CI and a one-sample t-test, Holm-corrected over the {len(test)} (model, product) pairs below."]
    for kind in [k for k in ATTENTION_KINDS if (test.kind == k).any()]:
        rows = test[test.kind == kind]
        verdicts = ", ".join(f"{r.model} {r.verdict}" for r in rows.itertuples())
        text.append(f"{kind.upper()}: {verdicts}, which {agreement(list(rows.verdict))} that observation.")
    if n_seeds < 2:
        text.append("With one seed nothing is tested: the slopes below describe one training.")
    return " ".join(text)


def heads_line(weights: pd.DataFrame, model: str, kind: str) -> str:
    """How many of one model's (head, seed) curves rise over all t (a per-head slope > 0)."""
    if kind == "ff":  # the MLP is one map, not heads
        return ""
    g = depth_trend(weights[(weights.model == model) & (weights.kind == kind)], "mean_abs", by=("seed", "head"))
    return f"; {int((g.slope > 0).sum())} of {len(g)} (head, seed) curves have a positive slope"


def jacobian_line(rows: pd.DataFrame, model: str) -> str:
    """The field Jacobian's spectral radius along t (mean over seeds) next to the state's RMS (the
    layer norms scale the Jacobian by its inverse), and its largest real part over every seed."""
    n = rows.seed.nunique()
    per_t = rows.groupby("t")[["spectral_radius", "state_rms"]].mean().sort_index()
    t, rad, rms = per_t.index.to_numpy(float), per_t.spectral_radius.to_numpy(), per_t.state_rms.to_numpy()
    real = rows.max_real.to_numpy(float)
    return (f"- **{model} · Jacobian ∂f/∂x**{_over_seeds(n)}: spectral radius {rad[0]:.3g} at t = {t[0]:.3g} and "
            f"{rad[-1]:.3g} at t = {t[-1]:.3g}, largest at t = {t[rad.argmax()]:.3g}, while the state's RMS goes from "
            f"{rms[0]:.3g} to {rms[-1]:.3g}; ρ × RMS goes from {rad[0] * rms[0]:.3g} to "
            f"{rad[-1] * rms[-1]:.3g}. Largest real part between {real.min():.3g} and {real.max():.3g} "
            f"({'some directions expand locally at every t' if real.min() > 0 else 'not expanding at every t'}).")


def sensitivity_line(model: str, sensitivity: pd.DataFrame, spectrum: pd.DataFrame) -> str:
    """How much a perturbation of a token's own state grows against one of earlier tokens, and
    the last token's finite-time Lyapunov spectrum: each seed's numbers, averaged over seeds."""
    st = pd.DataFrame([sensitivity_stats(g) for _, g in sensitivity.groupby("seed")]).mean()
    ts = pd.DataFrame([spectrum_stats(g) for _, g in spectrum.groupby("seed")]).mean()
    n, size = sensitivity.seed.nunique(), len(spectrum) // spectrum.seed.nunique()
    own, earlier = st["mean S_ii (own token)"], st["mean S_ij, j < i"]
    return (f"- **{model} · sensitivity**{_over_seeds(n)}: a token's own perturbation grows at rate {own:.3g} on "
            f"average (S_ii), perturbations of earlier tokens at {earlier:.3g} (S_ij, j < i), i.e. "
            f"{np.exp(own - earlier):.3g}x less; correlation with the distance i - j: "
            f"{st['corr(S_ij, i - j)']:.2f}. Last token: largest exponent {ts['largest (svd)']:.3g} (singular values) / "
            f"{ts['largest (QR)']:.3g} (QR from the identity basis), {ts['positive (svd)']:.3g} of {size} positive, "
            f"log|det| = {ts['sum = log|det|']:.3g}.")


# --------------------------------------------------------------------------- the section


def findings(spectral: pd.DataFrame, lyapunov: pd.DataFrame, profile: str, train_steps: int,
             alpha: float = 0.05) -> str:
    """Notebook 04's conclusions as Markdown, from its spectral and Lyapunov tables (see the
    module docstring for their rows). Whether a weight spectrum grows with depth is
    ``depth_trend_test``'s verdict at level ``alpha`` (every t, every seed, Holm over the
    (model, kind) pairs). ``profile`` and ``train_steps`` only say where the numbers come from.
    Models appear in the order of the spectral table."""
    missing = {"model", "kind", "t", "mean_abs", "spectral_radius", "n_eigs"} - set(spectral.columns)
    if missing:
        raise ValueError(f"spectral table lacks columns {sorted(missing)}; it has {list(spectral.columns)}")
    spectral, lyapunov = with_seed(spectral), with_seed(lyapunov)
    models = list(dict.fromkeys(spectral.model))
    weights = spectral[spectral.kind.isin(WEIGHT_KINDS)]
    test = depth_trend_test(weights, "mean_abs", alpha=alpha)
    text = [growth_paragraph(test, profile, train_steps), ""]
    text += [f"- **{r.model} · {r.kind.upper()}**: {trend_line(r)}{heads_line(weights, r.model, r.kind)}."
             for r in test.itertuples()]
    text += [jacobian_line(spectral[(spectral.model == model) & (spectral.kind == "jacobian")], model)
             for model in models if ((spectral.model == model) & (spectral.kind == "jacobian")).any()]
    text.append("")
    for model in models:
        rows = lyapunov[lyapunov.model == model]
        if rows.empty:
            continue
        text.append(sensitivity_line(model, rows[rows.analysis == "sensitivity"], rows[rows.analysis == "token_spectrum"]))
    return "\n".join(text)
