r"""Spectra of a continuous-depth language model along depth t (Tong et al., ICLR 2025, section 5).

Two analyses of ``node`` and ``ti_mlp`` models (``ti_ssm``: attention only), both on the grid the
model's own solver uses: by default its **step starts** t_i (``solver_grid``, from
``ODEBlock.step_times``; t_i = i / n for n steps). A multi-stage method also evaluates the field at t_i + c_j dt (rk4: t_i + dt/2 twice and
t_i + dt, so the weights at t = 1 enter the last step); ``field_times(model)`` lists every time the
field receives in one forward pass, and ``weight_spectra(model, times=field_times(model))`` reads
the weights at all of them.

**Weight products per head** (``weight_spectra``). At each solver time t_i the layers' weights
are read with the layers' own ``weight_at`` (``HyperLinear.weight_at(code)`` for node,
``ModulatedLinear.weight_at(h)`` for ti_mlp: the code path of the forward pass), at the time the
field itself receives (``modulation="constant"`` shows it t = 0). Shapes follow ``nn.Linear``:
a weight is (out, in) and y = x W^T. With the fused c_attn weight W (3D, D), W_Q = W[:D],
W_K = W[D:2D], W_V = W[2D:], head h the rows h d_h:(h+1) d_h (d_h = D / H) of each, W_Q^h etc.
(d_h, D); W_O = c_proj's weight (D, D) and W_O[:, h] its columns of head h. The products:

- **QK** = W_K^h W_Q^h^T (d_h x d_h). The attention score is q_i . k_j = x_i^T (W_Q^h^T W_K^h) x_j
  (before the 1/sqrt(d_h) of softmax, which is left out); that bilinear form's D x D matrix
  W_Q^h^T W_K^h has rank d_h and the same nonzero eigenvalues as its d_h x d_h twin (AB and BA).
  In Tong's row-vector notation (Q = X W_Q, W_Q of shape D x d_h) it is W_Q W_K^T. With
  ``position="rope"`` the score is x_i^T W_Q^h^T R_{j-i} W_K^h x_j (R a rotation by the distance):
  QK is then the form at distance 0.
- **OV** = W_V^h W_O[:, h] (d_h x d_h), the twin of the head's D x D value-to-output map
  W_O[:, h] W_V^h (x_j -> its contribution to the output, rank d_h); Tong's W_V W_O.
- **FF** = the MLP's linear part W_2 W_1 (D x D, W_1 = c_fc's (M, D), W_2 = c_proj's (D, M)), the
  GELU left out; optionally on a subset S of hidden units, W_2[:, S] W_1[S]. It shares its
  nonzero eigenvalues with W_1[S] W_2[:, S] (|S| x |S|); the smaller of the two is computed, so
  there are min(D, |S|) eigenvalues.

With ``fold_layernorm=True`` the layer norms' scales are folded in: W_Q, W_K, W_V (and W_1) are
multiplied on the right by diag(gamma_1(t)) (diag(gamma_2(t))), the maps seen by the normalised
input. Eigenvalues are complex128, computed in float64 from the weights.

These are the eigenvalues of the layers' weights. With ``integration="residual"`` the solver
integrates ``n_steps`` times the field (``ODEBlock.vector_field``: x + f = x + dt (n f)), so the OV
and FF maps of dx/dt are ``WeightSpectra.field_scale`` (= n_steps; 1 otherwise) times these; the
Jacobian spectra below are of dx/dt itself and include the factor.

**The vector field's Jacobian** (``jacobian_spectra``): along the trajectory of one input through
the model's own solve (``nodelm_lib.ode.Solver.trajectory``), the Jacobian
J_i = d f / d x of ``model.ode_block.vector_field`` (ablation switches applied) at each step start
(t_i, x(t_i)), with respect to the whole state (T positions x D). Causal attention makes J block
lower-triangular over positions, so its eigenvalues are the union of those of the diagonal blocks
d f_p / d x_p (``mode="blocks"``, exact; ``"full"`` diagonalises the whole N x N matrix, N = T D).
``"arnoldi"`` is matrix-free for large d: Ritz values of a Krylov space of JVPs estimate the
outer eigenvalues, and Golub-Kahan-Lanczos bidiagonalisation (JVPs and VJPs; power iteration on
J^T J accelerated) the spectral norm. (For ``reversible_heun`` the trajectory holds the solver's
y states; the solver itself evaluates the field at its auxiliary z states.)

**Growth with depth** (``depth_trend_test``): whether a weight spectrum's mean |lambda| grows with
t is read from every solver time and every seed: per seed the least-squares slope of the heads'
pooled value against t, then the mean slope across seeds with a t-based CI and a one-sample
t-test, Holm-corrected over the (model, kind) rows. ``dynamics_summary`` condenses both analyses
and the Lyapunov tables (``lyapunov.py``) into one row per (model, seed, analysis): the
descriptive numbers of notebook 04 and its docs table.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from torch.func import jvp, vjp

from nodelm_lib.reporting import stats
from nodelm_lib.models.common import continuous_block
from nodelm_lib.nn.time_layers import time_code
from nodelm_lib.ode import FIXED_STEP_METHODS
from nodelm_lib.reporting.style import use_style
from .lyapunov import _math_attention, analysis_model, jacobian_rows

KINDS = ("qk", "ov", "ff")


# --------------------------------------------------------------------------- the solver's grid


def _block(model):
    block = continuous_block(model, "spectral analysis")
    if block.ode.method not in FIXED_STEP_METHODS:
        raise ValueError(f"ode.method={block.ode.method!r} is adaptive: its grid depends on the input; "
                         f"use a fixed-step method ({', '.join(FIXED_STEP_METHODS)})")
    return block


def _param(model) -> torch.Tensor:
    return next(model.parameters())


def solver_grid(model) -> torch.Tensor:
    """The step start times t_i (n_steps,) of the model's fixed-step solve, in the parameters' dtype:
    ``ODEBlock.step_times``, the numbers the solver steps on (t_i = i / n up to rounding)."""
    p = _param(model)
    return torch.stack([s for s, _ in _block(model).step_times(p.dtype, p.device)])


def field_time(model, t: torch.Tensor) -> torch.Tensor:
    """The time the field receives when the solver evaluates ``vector_field`` at ``t``
    (``t`` itself, or 0 with ``modulation="constant"``): read from the field's own input."""
    block = _block(model)
    seen: list = []
    hook = block.field.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    p = _param(model)
    try:
        with torch.no_grad():
            block.vector_field(t, torch.zeros(1, 1, model.cfg.d_model, dtype=p.dtype, device=p.device))
    finally:
        hook.remove()
    return seen[0]


def field_times(model) -> torch.Tensor:
    """Every time at which the field is evaluated in one forward pass of the model, in order
    (n_steps x stages for RK methods), recorded from the field's input during ``model(idx)``."""
    block = _block(model)
    seen: list = []
    hook = block.field.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device=_param(model).device))
    finally:
        hook.remove()
        model.train(was_training)
    return torch.stack([s.reshape(()) for s in seen])


# --------------------------------------------------------------------------- weights at t


@dataclass
class LayerWeights:
    """The field's weights at one time, as the forward pass uses them ((out, in) like ``nn.Linear``).

    ``w_q``, ``w_k``, ``w_v`` (D, D): rows of c_attn; ``w_o`` (D, D): c_proj; ``w_1`` (M, D) and
    ``w_2`` (D, M): the MLP (None for ti_ssm); ``b_*`` the matching biases (None without);
    ``ln_1``, ``ln_2``: (scale, shift) of the layer norms. ``t`` is the solver's time, ``field_t``
    the time the field sees.
    """

    t: float
    field_t: float
    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    w_1: torch.Tensor | None
    w_2: torch.Tensor | None
    b_qkv: torch.Tensor | None
    b_o: torch.Tensor | None
    b_1: torch.Tensor | None
    b_2: torch.Tensor | None
    ln_1: tuple[torch.Tensor, torch.Tensor | None]
    ln_2: tuple[torch.Tensor, torch.Tensor | None]


@torch.no_grad()
def layer_weights(model, t: torch.Tensor) -> LayerWeights:
    """The field's weights at solver time ``t`` (a 0-d tensor), from the layers' own ``weight_at``."""
    block = _block(model)
    field = block.field
    arch = model.cfg.arch
    D = model.cfg.d_model
    tf = field_time(model, t)
    device = _param(model).device
    if arch == "node":
        code = time_code(tf, field.time_features).to(device)  # as NodeField.forward forms it
        (w_qkv, b_qkv), (w_o, b_o) = field.attn.c_attn.weight_at(code), field.attn.c_proj.weight_at(code)
        (w_1, b_1), (w_2, b_2) = field.mlp.c_fc.weight_at(code), field.mlp.c_proj.weight_at(code)
        ln_1, ln_2 = field.ln_1.weight_at(code), field.ln_2.weight_at(code)
    else:  # ti_mlp, ti_ssm: ModulatedLinear gated by the trunk h(t); static biases and layer norms
        h = field.modulation(tf.to(device))  # as TimeIndexedField.forward forms it
        w_qkv, b_qkv = field.attn.c_attn.weight_at(h), field.attn.c_attn.bias
        w_o, b_o = field.attn.c_proj.weight_at(h), field.attn.c_proj.bias
        if arch == "ti_mlp":
            w_1, b_1 = field.mixer.c_fc.weight_at(h), field.mixer.c_fc.bias
            w_2, b_2 = field.mixer.c_proj.weight_at(h), field.mixer.c_proj.bias
        else:
            w_1 = b_1 = w_2 = b_2 = None
        ln_1, ln_2 = (field.ln_1.weight, field.ln_1.bias), (field.ln_2.weight, field.ln_2.bias)
    return LayerWeights(float(t), float(tf), w_qkv[:D], w_qkv[D:2 * D], w_qkv[2 * D:], w_o, w_1, w_2,
                        b_qkv, b_o, b_1, b_2, ln_1, ln_2)


# --------------------------------------------------------------------------- products and eigenvalues


def _sorted_eigvals(M: torch.Tensor) -> np.ndarray:
    """Eigenvalues (complex128) of the last two dims of M, by decreasing |lambda| (then imaginary part)."""
    ev = torch.linalg.eigvals(M.detach().to(device="cpu", dtype=torch.float64)).numpy()
    out = np.empty_like(ev)
    for idx in np.ndindex(ev.shape[:-1]):
        e = ev[idx]
        out[idx] = e[np.lexsort((-e.imag, -np.abs(e)))]
    return out


def _heads(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(D, D) -> (H, d_h, D): the rows of each head."""
    D = w.shape[0]
    return w.reshape(n_heads, D // n_heads, -1)


def qk_eigvals(w_q: torch.Tensor, w_k: torch.Tensor, n_heads: int) -> np.ndarray:
    """(H, d_h) eigenvalues of W_K^h W_Q^h^T: the nonzero eigenvalues of the score form W_Q^h^T W_K^h."""
    q, k = _heads(w_q.double(), n_heads), _heads(w_k.double(), n_heads)
    return _sorted_eigvals(k @ q.transpose(1, 2))


def ov_eigvals(w_v: torch.Tensor, w_o: torch.Tensor, n_heads: int) -> np.ndarray:
    """(H, d_h) eigenvalues of W_V^h W_O[:, h]: the nonzero eigenvalues of the head's map W_O[:, h] W_V^h."""
    v = _heads(w_v.double(), n_heads)  # (H, d_h, D)
    o = _heads(w_o.double().T, n_heads)  # (H, d_h, D): o[h] = W_O[:, h]^T
    return _sorted_eigvals(v @ o.transpose(1, 2))


def ff_eigvals(w_1: torch.Tensor, w_2: torch.Tensor, units: np.ndarray | None = None) -> np.ndarray:
    """min(D, |S|) eigenvalues of the MLP's linear part W_2[:, S] W_1[S] (S = ``units``, default all):
    the |S| x |S| twin W_1[S] W_2[:, S] when |S| <= D, else the D x D product."""
    w_1, w_2 = w_1.double(), w_2.double()
    if units is not None:
        sel = torch.as_tensor(units, device=w_1.device)
        w_1, w_2 = w_1[sel], w_2[:, sel]
    if w_1.shape[0] <= w_1.shape[1]:
        return _sorted_eigvals(w_1 @ w_2)
    return _sorted_eigvals(w_2 @ w_1)


ZERO_TOL = 1e-9


def summarize(eigs: np.ndarray) -> dict:
    """Spectral radius, mean |lambda|, fraction with positive real part and the largest real part.

    A real part within ``ZERO_TOL`` times the spectral radius of zero counts as not positive: its
    sign is rounding. (The field Jacobian has T exactly zero eigenvalues, one per token, as both
    layer norms ignore a constant shift of a token's state; computed, they are +-1e-16 x rho.)
    """
    mag = np.abs(eigs)
    rho = float(mag.max())
    return dict(n_eigs=int(eigs.size), spectral_radius=rho, mean_abs=float(mag.mean()),
                frac_pos_real=float((eigs.real > ZERO_TOL * rho).mean()), max_real=float(eigs.real.max()))


@dataclass
class WeightSpectra:
    """Eigenvalues of the weight products at each solver time (module docstring).

    ``qk``, ``ov`` (n_t, H, d_h) and ``ff`` (n_t, r) complex128, each row by decreasing |lambda|;
    ``ff`` is None for ti_ssm. ``times`` the solver's times, ``field_times`` what the field saw;
    ``field_scale`` the factor between these layer-weight maps and those of dx/dt (n_steps with
    ``integration="residual"``, else 1; module docstring).
    """

    arch: str
    times: np.ndarray
    field_times: np.ndarray
    qk: np.ndarray
    ov: np.ndarray
    ff: np.ndarray | None
    ff_units: np.ndarray | None
    fold_layernorm: bool
    field_scale: float = 1.0

    def _groups(self):
        for i, t in enumerate(self.times):
            for kind in ("qk", "ov"):
                for h, eigs in enumerate(getattr(self, kind)[i]):
                    yield i, t, kind, h, eigs
            if self.ff is not None:
                yield i, t, "ff", -1, self.ff[i]

    def summary(self) -> pd.DataFrame:
        """One row per (step, kind, head) with ``summarize``'s columns; FF has head = -1."""
        return pd.DataFrame([dict(step=i, t=float(t), kind=kind, head=h, **summarize(e))
                             for i, t, kind, h, e in self._groups()])

    def eigenvalues(self) -> pd.DataFrame:
        """Every eigenvalue: step, t, kind, head, index, real, imag, abs."""
        rows = [pd.DataFrame(dict(step=i, t=float(t), kind=kind, head=h, index=np.arange(len(e)),
                                  real=e.real, imag=e.imag, abs=np.abs(e)))
                for i, t, kind, h, e in self._groups()]
        return pd.concat(rows, ignore_index=True)


@torch.no_grad()
def weight_spectra(model, times: torch.Tensor | None = None, ff_units: int | None = None, seed: int = 0,
                   fold_layernorm: bool = False) -> WeightSpectra:
    """QK and OV eigenvalues per head and FF eigenvalues at each time of ``times`` (default: the
    solver's step starts, ``solver_grid``; ``field_times(model)`` for every stage). ``ff_units``: use
    a random subset of that many hidden units (the same at every t, drawn with ``seed``); None uses all."""
    block = _block(model)  # a continuous-depth model with a fixed-step method
    times = solver_grid(model) if times is None else times
    H = model.cfg.n_heads
    units = None
    qk, ov, ff, ftimes = [], [], [], []
    for t in times:
        w = layer_weights(model, t)
        w_q, w_k, w_v, w_1 = w.w_q, w.w_k, w.w_v, w.w_1
        if fold_layernorm:
            g1 = w.ln_1[0]
            w_q, w_k, w_v = w_q * g1, w_k * g1, w_v * g1  # W diag(gamma): scales the input columns
            if w_1 is not None:
                w_1 = w_1 * w.ln_2[0]
        qk.append(qk_eigvals(w_q, w_k, H))
        ov.append(ov_eigvals(w_v, w.w_o, H))
        if w_1 is not None:
            if ff_units is not None and units is None:
                units = np.sort(np.random.default_rng(seed).choice(w_1.shape[0], size=ff_units, replace=False))
            ff.append(ff_eigvals(w_1, w.w_2, units))
        ftimes.append(w.field_t)
    return WeightSpectra(model.cfg.arch, times.detach().double().cpu().numpy(), np.array(ftimes), np.stack(qk),
                         np.stack(ov), np.stack(ff) if ff else None, units, fold_layernorm,
                         float(block.ode.n_steps) if block.integration == "residual" else 1.0)


def _slope(t: np.ndarray, v: np.ndarray) -> float:
    """Least-squares slope of v against t (NaN with fewer than two times)."""
    return float(np.polyfit(t, v, 1)[0]) if len(t) > 1 else float("nan")


def _spearman(t: np.ndarray, v: np.ndarray) -> float:
    """Spearman's rank correlation of v with t (average ranks for ties; NaN if v is constant)."""
    rt, rv = pd.Series(t).rank().to_numpy(), pd.Series(v).rank().to_numpy()
    return float(np.corrcoef(rt, rv)[0, 1]) if len(t) > 1 and rv.std() > 0 else float("nan")


def depth_trend(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "kind", "head")) -> pd.DataFrame:
    """Does ``value`` grow with t? Per group: the first and last values, their ratio, the
    least-squares slope in t, Spearman's rank correlation with t, and whether every step increases.
    One curve per group, no test: ``depth_trend_test`` tests the slope across seeds."""
    by = [c for c in by if c in summary.columns]
    rows = []
    for key, g in summary.groupby(by, sort=False):
        g = g.sort_values("t")
        t, v = g.t.to_numpy(), g[value].to_numpy()
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), first=v[0], last=v[-1],
                         ratio=v[-1] / v[0], slope=_slope(t, v), spearman=_spearman(t, v),
                         monotone_up=bool(np.all(np.diff(v) > 0))))
    return pd.DataFrame(rows)


def with_seed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``seed`` column: tables written before notebook 04 trained several seeds
    hold one run, of seed 0, and have none."""
    return table if "seed" in table.columns else table.assign(seed=0)


def pooled_over_heads(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "seed", "kind")) -> pd.DataFrame:
    """``value`` of all heads together at each t: per (``by``, t) the heads' values averaged with
    their numbers of eigenvalues (``n_eigs``) as weights, so that a head-pooled ``mean_abs`` is the
    mean |lambda| over every head's eigenvalues (as ``dynamics_summary`` pools them). Columns:
    ``by``, ``t``, ``value``. A table without ``seed`` counts as one run of seed 0 (``with_seed``)."""
    summary = with_seed(summary)
    missing = {value, "t", "n_eigs", *by} - set(summary.columns)
    if missing:
        raise ValueError(f"the spectra table lacks column(s) {sorted(missing)}; it has {list(summary.columns)}")
    weighted = summary.assign(_w=summary[value] * summary.n_eigs)
    pooled = weighted.groupby([*by, "t"], sort=False).agg(_w=("_w", "sum"), _n=("n_eigs", "sum")).reset_index()
    # groups in the order they first appear (models and kinds as the table lists them), t ascending in each
    return (pooled.assign(**{value: pooled._w / pooled._n}).drop(columns=["_w", "_n"])
            .sort_values("t", kind="stable").reset_index(drop=True))


TREND_COLUMNS = ("model", "kind", "n_seeds", "n_times", "level", "slope_mean", "slope_sd", "ci_low", "ci_high",
                 "rel_slope", "t_stat", "p", "p_holm", "n_up", "spearman_mean", "verdict")


def depth_trend_test(summary: pd.DataFrame, value: str = "mean_abs", by=("model", "kind"), alpha: float = 0.05,
                     confidence: float = 0.95) -> pd.DataFrame:
    """Does ``value`` grow with depth? A test over every solver time and every seed.

    For each group of ``by`` (one row per (model, kind) by default) and each seed: the heads'
    ``value`` pooled at each t (``pooled_over_heads``), its least-squares slope against t over all
    the solver's times, and Spearman's rank correlation with t. Across seeds (independent
    trainings, so the slopes are independent): ``slope_mean``, ``slope_sd``, the t-based
    ``confidence`` interval (``ci_low``, ``ci_high``), the one-sample t-test of a zero mean slope
    (``t_stat``, ``p``: ``stats.paired_test`` of the slopes against zero slopes) and ``n_up``, the
    seeds whose slope is positive. ``p_holm``: Holm's correction over every row (the family is the
    table's groups). ``verdict``: "grows with depth" or "shrinks with depth" where ``p_holm < alpha``,
    else "not resolved at n = <seeds>". ``level`` is the mean of ``value`` over times and seeds and
    ``rel_slope`` = slope_mean / level (growth per unit of t relative to the size of the values).

    Why not the ratio of the last to the first t: two endpoints of one curve do not say whether it
    rises across depth, and one seed does not say whether another training would agree. With one
    seed (or a table without ``seed``) there is no test: the row has its slope, NaN p, and is not
    resolved at n = 1.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    by = list(by)
    pooled = pooled_over_heads(summary, value, by=[*by, "seed"])
    rows = []
    for key, g in pooled.groupby(by, sort=False):
        per_seed = [(_slope(s.t.to_numpy(), s[value].to_numpy()), _spearman(s.t.to_numpy(), s[value].to_numpy()))
                    for _, s in g.groupby("seed", sort=True)]  # each seed's times ascending (pooled_over_heads)
        slopes, rhos = np.array([s for s, _ in per_seed]), np.array([r for _, r in per_seed])
        n = len(slopes)
        test = (stats.paired_test(slopes, np.zeros(n), confidence) if n > 1 else
                dict(mean_diff=float(slopes[0]), sd_diff=np.nan, ci_low=np.nan, ci_high=np.nan, t=np.nan, p_t=np.nan))
        level = float(g[value].mean())
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), n_seeds=n, n_times=g.t.nunique(),
                         level=level, slope_mean=test["mean_diff"], slope_sd=test["sd_diff"], ci_low=test["ci_low"],
                         ci_high=test["ci_high"], rel_slope=test["mean_diff"] / level, t_stat=test["t"],
                         p=test["p_t"], n_up=int((slopes > 0).sum()),
                         spearman_mean=float(np.nanmean(rhos)) if np.isfinite(rhos).any() else np.nan))
    table = pd.DataFrame(rows)
    if table.empty:
        raise ValueError(f"no rows to test: the spectra table has no {value!r} values")
    table["p_holm"] = stats.holm(table.p.to_numpy(float))
    table["verdict"] = [trend_verdict(r.slope_mean, r.p_holm, r.n_seeds, alpha) for r in table.itertuples()]
    return table[[*by, *[c for c in TREND_COLUMNS if c not in ("model", "kind")]]]


def trend_verdict(slope_mean: float, p_holm: float, n_seeds: int, alpha: float = 0.05) -> str:
    """The words for one row of ``depth_trend_test``: a direction only where Holm's p resolves it."""
    if np.isfinite(p_holm) and p_holm < alpha:
        return "grows with depth" if slope_mean > 0 else "shrinks with depth"
    return f"not resolved at n = {n_seeds}"


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


# --------------------------------------------------------------------------- the field's Jacobian


def trajectory(model, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's own solve of one input: (step times (n+1,), states x(t_i) for i = 0..n), the
    last being x(1), from ``Solver.trajectory`` on ``model.ode_block.vector_field`` with the block's
    own solver and interval (as ``ODEBlock.forward`` solves it). ``idx`` (B, T); eval mode is the
    caller's business."""
    block = _block(model)
    x0 = model.embed(idx)
    _, points = block.solver().trajectory(block.vector_field, x0, block.times(x0.dtype, x0.device))
    return torch.stack([s for s, _, _ in points]), [x for _, x, _ in points]


def field_jacobian(model, t: torch.Tensor, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """d f / d x of ``model.ode_block.vector_field`` at (t, x) for one sequence x (1, T, D), as an
    (N, N) matrix over the flattened state (N = T D; row/column index p D + d), by reverse mode
    (``lyapunov.jacobian_rows``: one graph, one backward pass per row or per ``chunk_size`` rows)."""
    return jacobian_rows(lambda y: model.ode_block.vector_field(t, y), x, chunk_size=chunk_size)


def _lanczos_norm(matvec, rmatvec, n: int, k: int, seed: int, dtype, device) -> float:
    """Largest singular value of A (n x n, given by A v and A^T u) from k steps of Golub-Kahan-Lanczos
    bidiagonalisation with full re-orthogonalisation: sigma_max of the k x k bidiagonal matrix
    (exact when k = n; the largest singular value converges first)."""
    k = min(k, n)
    g = torch.Generator().manual_seed(seed)
    V = torch.zeros(k + 1, n, dtype=dtype, device=device)
    U = torch.zeros(k, n, dtype=dtype, device=device)
    alpha, beta = [], []
    v = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    V[0] = v / v.norm()
    for j in range(k):
        u = matvec(V[j])
        for _ in range(2):
            u = u - (U[:j] @ u) @ U[:j]
        alpha.append(float(u.norm()))
        if alpha[-1] == 0.0:
            break
        U[j] = u / alpha[-1]
        w = rmatvec(U[j])
        for _ in range(2):
            w = w - (V[: j + 1] @ w) @ V[: j + 1]
        beta.append(float(w.norm()))
        if beta[-1] < 1e-12 * max(alpha):
            break
        V[j + 1] = w / beta[-1]
    m = len(alpha)
    B = torch.diag(torch.tensor(alpha, dtype=torch.float64))
    if m > 1:
        B += torch.diag(torch.tensor(beta[: m - 1], dtype=torch.float64), 1)
    return float(torch.linalg.matrix_norm(B, ord=2))


def _arnoldi(matvec, n: int, m: int, seed: int, dtype, device) -> np.ndarray:
    """Ritz values of an m-step Arnoldi process (full re-orthogonalisation)."""
    m = min(m, n)
    g = torch.Generator().manual_seed(seed)
    V = torch.zeros(m + 1, n, dtype=dtype, device=device)
    Hm = torch.zeros(m + 1, m, dtype=torch.float64)
    v = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    V[0] = v / v.norm()
    for j in range(m):
        w = matvec(V[j])
        for _ in range(2):  # twice is enough (Kahan)
            c = V[: j + 1] @ w
            w = w - c @ V[: j + 1]
            Hm[: j + 1, j] += c.double().cpu()
        Hm[j + 1, j] = float(w.norm())
        if Hm[j + 1, j] < 1e-12 * max(1.0, float(Hm[: j + 1, j].abs().max())):  # invariant subspace found
            m = j + 1
            break
        V[j + 1] = w / Hm[j + 1, j]
    return _sorted_eigvals(Hm[:m, :m])


@dataclass
class JacobianSpectra:
    """Spectra of d f / d x along one trajectory: per step start time, the eigenvalues (all N, or
    the Ritz values with ``mode="arnoldi"``), the spectral radius, the largest real part, the
    spectral norm (largest singular value) and the root mean square of the state x(t_i) (the
    layer norms divide by each token's standard deviation, so a small state means a large J)."""

    mode: str
    times: np.ndarray
    eigenvalues: list[np.ndarray]
    spectral_norm: np.ndarray
    state_rms: np.ndarray
    tokens: list[int]

    @property
    def spectral_radius(self) -> np.ndarray:
        return np.array([np.abs(e).max() for e in self.eigenvalues])

    @property
    def max_real(self) -> np.ndarray:
        return np.array([e.real.max() for e in self.eigenvalues])

    def summary(self) -> pd.DataFrame:
        return pd.DataFrame([dict(step=i, t=float(t), kind="jacobian", head=-1, **summarize(e),
                                  spectral_norm=float(s), state_rms=float(r), mode=self.mode)
                             for i, (t, e, s, r) in enumerate(zip(self.times, self.eigenvalues, self.spectral_norm,
                                                                  self.state_rms))])


def jacobian_spectra(model, idx: torch.Tensor, mode: str = "blocks", n_krylov: int = 64,
                     dtype: torch.dtype | None = torch.float64, chunk_size: int | None = None,
                     seed: int = 0) -> JacobianSpectra:
    """Eigenvalues and spectral norm of the field's Jacobian at each step start of the model's own
    solve of ``idx`` (T,) or (1, T) (module docstring). ``mode``: ``"blocks"`` (exact: the union of
    the D x D diagonal blocks' eigenvalues), ``"full"`` (exact: the whole N x N matrix), or
    ``"arnoldi"`` (matrix-free estimates: ``n_krylov`` JVPs per time for the Ritz values, and
    ``n_krylov`` JVP + VJP pairs of Golub-Kahan-Lanczos for the norm). In the explicit modes the
    spectral norm comes from ``n_krylov`` Lanczos steps on J (exact when n_krylov >= N; an SVD of
    a few thousand rows cost seconds per t here). Computed on an eval copy in ``dtype``."""
    if mode not in ("blocks", "full", "arnoldi"):
        raise ValueError(f"mode={mode!r} is not valid; choose 'blocks', 'full' or 'arnoldi'")
    continuous_block(model, "jacobian_spectra")
    if mode == "arnoldi" and model.cfg.arch == "ti_ssm":
        # models/scans.py's scan is an autograd.Function without setup_context: torch.func.jvp refuses it
        raise ValueError("mode='arnoldi' needs forward-mode AD (torch.func.jvp), which ti_ssm's selective scan "
                         "(a custom autograd.Function without setup_context) does not support; use 'blocks' or 'full'")
    m = analysis_model(model, dtype)
    idx = idx.reshape(1, -1).to(_param(m).device)
    with torch.no_grad():
        times, states = trajectory(m, idx)
    times, states = times[:-1], states[:-1]  # the Jacobian where each step starts
    eigs, norms = [], []
    for t, x in zip(times, states):
        _, T, D = x.shape
        N = T * D
        if mode == "arnoldi":
            f = lambda y: m.ode_block.vector_field(t, y.reshape(x.shape)).reshape(-1)  # noqa: E731
            xf = x.reshape(-1)
            with _math_attention():
                matvec = lambda v: jvp(f, (xf,), (v,))[1]  # noqa: E731
                _, pullback = vjp(f, xf)
                rmatvec = lambda u: pullback(u)[0]  # noqa: E731
                eigs.append(_arnoldi(matvec, N, n_krylov, seed, x.dtype, x.device))
                norms.append(_lanczos_norm(matvec, rmatvec, N, n_krylov, seed, x.dtype, x.device))
            continue
        J = field_jacobian(m, t, x, chunk_size)
        if mode == "full":
            eigs.append(_sorted_eigvals(J))
        else:
            blocks = torch.stack([J[p * D:(p + 1) * D, p * D:(p + 1) * D] for p in range(T)])
            e = _sorted_eigvals(blocks).reshape(-1)
            eigs.append(e[np.lexsort((-e.imag, -np.abs(e)))])
        norms.append(_lanczos_norm(lambda v: J @ v, lambda u: J.T @ u, N, n_krylov, seed, J.dtype, J.device))
    rms = np.array([float(x.double().pow(2).mean().sqrt()) for x in states])
    return JacobianSpectra(mode, times.double().cpu().numpy(), eigs, np.array(norms), rms, idx[0].tolist())


# --------------------------------------------------------------------------- figures


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
            for h, g in df.groupby("head"):
                ax.plot(g.t, g[value], marker="o", ms=3, label="all units" if h < 0 else f"head {h}")
            ax.set(title=f"{name} · {KIND_TITLES[kind]}", xlabel="depth t", ylabel=ylabel)
            ax.title.set_fontsize(9)
            if r == 0 and c < 2:
                ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_depth_trend(summary: pd.DataFrame, trend: pd.DataFrame, value: str = "mean_abs",
                     ylabel: str = "mean |λ|, heads pooled") -> plt.Figure:
    """What ``depth_trend_test`` tests: per model (rows) and kind (columns) each seed's head-pooled
    ``value`` against t with its least-squares line, titled with the mean slope, its CI and Holm's p."""
    use_style()
    pooled = pooled_over_heads(summary, value)
    models = list(dict.fromkeys(pooled.model))
    kinds = [k for k in KINDS if k in set(pooled.kind)]
    fig, axes = plt.subplots(len(models), len(kinds), figsize=(3.6 * len(kinds), 2.9 * len(models)), squeeze=False)
    result = trend.set_index(["model", "kind"])
    for r, name in enumerate(models):
        for c, kind in enumerate(kinds):
            ax = axes[r, c]
            for i, (seed, g) in enumerate(pooled[(pooled.model == name) & (pooled.kind == kind)].groupby("seed")):
                t, v = g.t.to_numpy(), g[value].to_numpy()
                ax.plot(t, v, "o", ms=3, color=f"C{i}", label=f"seed {seed}")
                if len(t) > 1:
                    ax.plot(t, np.polyval(np.polyfit(t, v, 1), t), "-", lw=0.8, color=f"C{i}")
            row = result.loc[(name, kind)]
            ax.set(title=f"{name} · {KIND_TITLES[kind]}\nslope {row.slope_mean:+.3g} [{row.ci_low:+.3g}, "
                         f"{row.ci_high:+.3g}], Holm p {row.p_holm:.2g}", xlabel="depth t", ylabel=ylabel)
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
            for i in chosen:
                e = getattr(s, kind)[i].reshape(-1)
                ax.scatter(e.real, e.imag, s=9, alpha=0.75, label=f"t = {s.times[i]:.3g}")
            ax.axvline(0.0, color="0.5", lw=0.7)
            ax.axhline(0.0, color="0.5", lw=0.7)
            ax.set(title=f"{name} · {KIND_TITLES[kind]}", xlabel="Re λ", ylabel="Im λ")
            ax.title.set_fontsize(9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_jacobian(spectra: dict[str, JacobianSpectra]) -> plt.Figure:
    """Spectral radius, largest real part and spectral norm of d f / d x against t, and the state's
    RMS (the layer norms scale J by its inverse), per model."""
    use_style()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    for name, s in spectra.items():
        for ax, values in zip(axes, (s.spectral_radius, s.max_real, s.spectral_norm, s.state_rms)):
            ax.plot(s.times, values, marker="o", ms=3, label=name)
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
    axes[1].axhline(0.0, color="0.5", lw=0.8)
    fig.tight_layout()
    return fig
