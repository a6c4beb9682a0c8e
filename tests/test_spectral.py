"""Spectral analysis (analysis/spectral.py, jacobian.py, depth_trends.py) against independent computations.

- the eigenvalues of the QK / OV / FF products equal numpy's, computed from the raw parameters
  with the time code, hypernetwork and gates re-implemented here in numpy, and with the full
  D x D matrices of the bilinear / linear maps (not the d_h x d_h twins the library uses);
- the weights read at the solver's grid reproduce the model's logits through a hand-written
  Euler forward pass (and node's ``evaluate_at`` blocks), and a shifted grid does not;
- the field's Jacobian (reverse mode) equals torch.func.jacfwd's; block, full and Arnoldi spectra agree.
"""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import nodelm_lib as nl
from nodelm_lib.analysis import depth_trends as tr
from nodelm_lib.analysis import dynamics_figures as figs
from nodelm_lib.analysis import dynamics_report as dr
from nodelm_lib.analysis import jacobian as jc
from nodelm_lib.analysis import spectral as sp
from nodelm_lib.nn.layers import causal_attention
from nodelm_lib.runs.store import run_hash

D, H, N_STEPS = 16, 2, 3


def small_model(arch="node", method="euler", n_steps=N_STEPS, modulation="time", seed=0, d_model=D):
    torch.manual_seed(seed)
    cfg = nl.ModelConfig(arch=arch, vocab_size=32, d_model=d_model, n_heads=H, n_layers=n_steps, max_seq_len=16,
                         time_features=4, time_hidden=8, hyper_dim=2, modulation=modulation,
                         ode=nl.ODEConfig(method=method, n_steps=n_steps))
    model = nl.build_model(cfg)
    with torch.no_grad():  # perturbed randomly: O(1) time dependence, nonzero biases and norm scales
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


# --------------------------------------------------------------------------- numpy reference


def np_(tensor):
    return tensor.detach().double().numpy()


def np_linear(layer, x):
    return x @ np_(layer.weight).T + (0 if layer.bias is None else np_(layer.bias))


def np_time_code(t, n_features):
    half = n_features // 2
    freqs = np.exp(np.linspace(0.0, math.log(8.0), half))
    return np.concatenate([np.sin(freqs * t), np.cos(freqs * t), [t]])


def np_weights(model, t):
    """(W_qkv, W_o, W_1, W_2) at time t from the raw parameters, in numpy float64."""
    f = model.field
    if model.cfg.arch == "node":
        code = np_time_code(t, f.time_features)

        def weight(layer):  # W(t) = B + sum_k e_k(t) A_k, e = Linear(SiLU(Linear(code)))
            hidden = np_linear(layer.coefficients[0], code)
            e = np_linear(layer.coefficients[2], hidden / (1 + np.exp(-hidden)))
            return np_(layer.weight) + np.einsum("k,koi->oi", e, np_(layer.weight_basis))

        layers = (f.attn.c_attn, f.attn.c_proj, f.mlp.c_fc, f.mlp.c_proj)
    else:
        pre = np_linear(f.modulation.net[0], np_time_code(t, f.modulation.n_features))
        h = pre / (1 + np.exp(-pre))

        def weight(layer):  # W_base * sigmoid(R h + r + (C h)^T)
            logits = np_linear(layer.row_gate, h)[:, None] + np_linear(layer.col_gate, h)[None, :]
            return np_(layer.weight) / (1 + np.exp(-logits))

        layers = (f.attn.c_attn, f.attn.c_proj, f.mixer.c_fc, f.mixer.c_proj)
    return [weight(layer) for layer in layers]


def nonzero_eigs(M, rank):
    """The ``rank`` eigenvalues of largest modulus (the rest are zero: M has that rank)."""
    e = np.linalg.eigvals(M)
    return e[np.argsort(-np.abs(e))][:rank]


def assert_same_multiset(a, b, tol):
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    assert a.shape == b.shape
    for x in a:  # every eigenvalue has a partner, and the partners are distinct
        j = np.argmin(np.abs(b - x))
        assert abs(b[j] - x) <= tol * max(1.0, abs(x)), (x, b)
        b = np.delete(b, j)


@pytest.mark.parametrize("arch", ["node", "ti_mlp"])
def test_weight_spectra_equal_numpy_eigenvalues_of_the_full_maps(arch):
    model = small_model(arch).double()  # float64 weights; the time code itself is float32 (nn.time_code), so 1e-6
    dh = D // H
    units = 5
    spec = sp.weight_spectra(model, ff_units=units, seed=3)
    full_ff = sp.weight_spectra(model)
    assert np.allclose(spec.times, np.arange(N_STEPS) / N_STEPS)
    for i, t in enumerate(spec.times):
        w_qkv, w_o, w_1, w_2 = np_weights(model, t)
        w_q, w_k, w_v = w_qkv[:D], w_qkv[D:2 * D], w_qkv[2 * D:]
        for h in range(H):
            rows = slice(h * dh, (h + 1) * dh)
            qk = w_q[rows].T @ w_k[rows]  # score x_i^T (W_Q^h^T W_K^h) x_j: D x D, rank d_h
            ov = w_o[:, rows] @ w_v[rows]  # head h's value-to-output map: D x D, rank d_h
            assert_same_multiset(spec.qk[i, h], nonzero_eigs(qk, dh), 1e-6)
            assert_same_multiset(spec.ov[i, h], nonzero_eigs(ov, dh), 1e-6)
        S = spec.ff_units
        assert len(S) == units and len(set(S)) == units
        assert_same_multiset(spec.ff[i], nonzero_eigs(w_2[:, S] @ w_1[S], units), 1e-6)
        assert_same_multiset(full_ff.ff[i], np.linalg.eigvals(w_2 @ w_1), 1e-6)  # M = 4D > D: the D x D product

    table = spec.summary()
    assert set(table.kind) == {"qk", "ov", "ff"} and len(table) == N_STEPS * (2 * H + 1)
    row = table[(table.kind == "qk") & (table["head"] == 1) & (table.step == 2)].iloc[0]
    e = spec.qk[2, 1]
    assert row.spectral_radius == pytest.approx(np.abs(e).max()) and row.mean_abs == pytest.approx(np.abs(e).mean())
    assert row.frac_pos_real == pytest.approx((e.real > 0).mean())
    assert len(spec.eigenvalues()) == N_STEPS * (2 * H * dh + units)


def test_fold_layernorm_scales_the_input_columns():
    model = small_model("node").double()
    w = sp.layer_weights(model, torch.tensor(0.5, dtype=torch.float64))
    g1 = w.ln_1[0].numpy()
    folded = sp.weight_spectra(model, times=torch.tensor([0.5], dtype=torch.float64), fold_layernorm=True)
    rows = slice(0, D // H)
    qk = (w.w_q.numpy()[rows] * g1).T @ (w.w_k.numpy()[rows] * g1)
    assert_same_multiset(folded.qk[0, 0], nonzero_eigs(qk, D // H), 1e-6)


def euler_forward_from_weights(model, idx, times):
    """The model's Euler solve written out by hand from ``layer_weights`` at ``times``."""
    x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
    dt = 1.0 / len(times)
    for t in times:
        w = sp.layer_weights(model, t)
        a = F.layer_norm(x, (D,), *w.ln_1)
        qkv = F.linear(a, torch.cat([w.w_q, w.w_k, w.w_v]), w.b_qkv)
        attn = F.linear(causal_attention(qkv, H), w.w_o, w.b_o)
        b = F.layer_norm(x, (D,), *w.ln_2)
        mlp = F.linear(F.gelu(F.linear(b, w.w_1, w.b_1)), w.w_2, w.b_2)
        x = x + dt * (attn + mlp)
    return model.lm_head(model.ln_f(x))


@pytest.mark.parametrize("arch", ["node", "ti_mlp"])
def test_weights_on_the_solver_grid_reproduce_the_logits(arch):
    model = small_model(arch)
    idx = torch.randint(0, 32, (2, 7))
    grid = sp.solver_grid(model)
    assert torch.equal(grid, sp.field_times(model))  # Euler: one field evaluation per step, at t_i
    logits, _ = model(idx)
    with torch.no_grad():
        mine = euler_forward_from_weights(model, idx, grid)
        shifted = euler_forward_from_weights(model, idx, grid + 1.0 / N_STEPS)  # the right endpoints
    assert torch.allclose(mine, logits, atol=1e-5), (mine - logits).abs().max()
    assert (shifted - logits).abs().max() > 1e-3  # the check can tell grids apart
    if arch == "node":  # evaluate_at(n) exports W(t_i) into block i (output projections times dt)
        gpt = model.evaluate_at()
        for t, block in zip(grid, gpt.blocks):
            w = sp.layer_weights(model, t)
            assert torch.equal(block.attn.c_attn.weight, torch.cat([w.w_q, w.w_k, w.w_v]))
            assert torch.equal(block.mlp.c_fc.weight, w.w_1)
            assert torch.allclose(block.attn.c_proj.weight, w.w_o / N_STEPS)


def test_grid_follows_the_solver_and_the_switches():
    rk4 = small_model("ti_mlp", method="rk4")
    grid = sp.solver_grid(rk4)
    evals = sp.field_times(rk4)
    assert len(evals) == 4 * N_STEPS and torch.equal(evals[::4], grid)  # stage 1 of every step is at t_i
    constant = small_model("node", modulation="constant")
    spec = sp.weight_spectra(constant)
    assert np.allclose(spec.times, np.arange(N_STEPS) / N_STEPS) and np.all(spec.field_times == 0)
    assert np.allclose(spec.qk[0], spec.qk[-1])  # every step reads W(0)
    with pytest.raises(ValueError, match="continuous-depth"):
        sp.weight_spectra(nl.build_model(nl.ModelConfig(arch="gpt", vocab_size=32, d_model=D, n_heads=H)))


def test_ti_ssm_weights_have_attention_spectra_only():
    model = small_model("ti_ssm")
    spec = sp.weight_spectra(model)
    assert spec.ff is None and spec.qk.shape == (N_STEPS, H, D // H)
    with pytest.raises(ValueError, match="ti_ssm"):
        jc.jacobian_spectra(model, torch.tensor([1, 2]), mode="arnoldi")


def test_field_jacobian_and_its_spectra():
    model = small_model("node", method="rk4", d_model=8)
    idx = torch.randint(0, 32, (5,), generator=torch.Generator().manual_seed(1))
    m = jc.analysis_model(model)
    times, states = jc.trajectory(m, idx.reshape(1, -1))
    assert len(times) == N_STEPS + 1 and torch.equal(times[:-1].float(), sp.solver_grid(model))
    logits, _ = model(idx.reshape(1, -1))
    assert torch.allclose(m.lm_head(m.ln_f(states[-1])).float(), logits, atol=1e-5)  # the same solve

    t, x = times[1], states[1]
    J = jc.field_jacobian(m, t, x)
    with sdpa_kernel(SDPBackend.MATH):  # forward mode as the independent reference (the library uses reverse)
        ref = torch.func.jacfwd(lambda y: m.ode_block.vector_field(t, y))(x).reshape(x.numel(), -1)
    assert torch.allclose(J, ref, atol=1e-12)
    T, Dm = x.shape[1:]
    upper = J.reshape(T, Dm, T, Dm).permute(0, 2, 1, 3)[torch.triu_indices(T, T, 1).unbind()]
    assert upper.abs().max() == 0  # causal: block lower-triangular

    blocks = jc.jacobian_spectra(model, idx, mode="blocks")
    full = jc.jacobian_spectra(model, idx, mode="full")
    for a, b in zip(blocks.eigenvalues, full.eigenvalues):
        assert_same_multiset(a, b, 1e-6)
    assert np.allclose(blocks.spectral_norm, full.spectral_norm)
    assert full.spectral_norm[1] == pytest.approx(float(torch.linalg.matrix_norm(ref, ord=2)), rel=1e-10)
    assert_same_multiset(full.eigenvalues[1], np.linalg.eigvals(ref.numpy()), 1e-6)

    summary = full.summary()
    assert list(summary.t) == pytest.approx(list(times[:-1].numpy())) and (summary.kind == "jacobian").all()


def test_matrix_free_spectra_are_exact_with_a_full_krylov_space():
    # one step and three tokens keep the JVPs few (forward-mode AD is slow per op on CPU)
    model = small_model("ti_mlp", n_steps=1, d_model=8)
    idx = torch.tensor([3, 1, 4])
    full = jc.jacobian_spectra(model, idx, mode="full")
    arnoldi = jc.jacobian_spectra(model, idx, mode="arnoldi", n_krylov=3 * 8)
    # the layer norms make f(x) invariant to adding a constant to any token's state (and, up to their
    # eps, to scaling it): J has a null space of dimension >= T, of which a Krylov space holds only
    # one direction (Arnoldi stops once its space is invariant)
    nonzero = lambda e: e[np.abs(e) > 1e-9]  # noqa: E731
    assert (np.abs(full.eigenvalues[0]) < 1e-9).sum() >= len(idx)
    assert_same_multiset(nonzero(arnoldi.eigenvalues[0]), nonzero(full.eigenvalues[0]), 1e-8)
    assert arnoldi.spectral_norm[0] == pytest.approx(full.spectral_norm[0], rel=1e-10)


def test_depth_trend():
    df = __import__("pandas").DataFrame(dict(model="m", kind="qk", head=0, t=[0.0, 0.5, 1.0], mean_abs=[1.0, 2.0, 3.0]))
    row = tr.depth_trend(df).iloc[0]
    assert row.spearman == pytest.approx(1.0) and row.slope == pytest.approx(2.0)
    assert row.ratio == 3.0 and row.monotone_up


# --------------------------------------------------------------------------- growth with depth across seeds


TIMES = (0.0, 0.25, 0.5, 0.75)


def trend_table(values, models=("node",), kinds=("qk",), seeds=(0, 1, 2), heads=(0, 1), times=TIMES):
    """Weight-spectra summary rows: ``values(model, kind, seed, head, t)`` -> mean |lambda|; head h
    has 4 + 4 h eigenvalues (unequal weights in the head pooling)."""
    return pd.DataFrame([dict(model=m, seed=s, kind=k, head=h, t=t, n_eigs=4 + 4 * h, mean_abs=values(m, k, s, h, t))
                         for m in models for k in kinds for s in seeds for h in heads for t in times])


def test_depth_trend_test_against_scipy():
    from scipy import stats as st

    rng = np.random.default_rng(1)
    table = trend_table(lambda m, k, s, h, t: 1.0 + 0.3 * t + rng.normal(0, 0.1), models=("node", "ti_mlp"),
                        kinds=("qk", "ff"))
    result = tr.depth_trend_test(table)
    assert list(zip(result.model, result.kind)) == [("node", "qk"), ("node", "ff"), ("ti_mlp", "qk"), ("ti_mlp", "ff")]
    for r in result.itertuples():
        slopes, rhos = [], []
        for _, g in table[(table.model == r.model) & (table.kind == r.kind)].groupby("seed"):
            pooled = g.groupby("t").apply(lambda x: np.average(x.mean_abs, weights=x.n_eigs))  # every eigenvalue pooled
            slopes.append(st.linregress(pooled.index, pooled.to_numpy()).slope)
            rhos.append(st.spearmanr(pooled.index, pooled.to_numpy()).statistic)
        ref = st.ttest_1samp(slopes, 0.0)
        ci = ref.confidence_interval(0.95)
        assert (r.n_seeds, r.n_times, r.n_up) == (3, 4, sum(v > 0 for v in slopes))
        assert r.slope_mean == pytest.approx(np.mean(slopes)) and r.slope_sd == pytest.approx(np.std(slopes, ddof=1))
        assert (r.t_stat, r.p) == pytest.approx((ref.statistic, ref.pvalue))
        assert (r.ci_low, r.ci_high) == pytest.approx((ci.low, ci.high))
        assert r.spearman_mean == pytest.approx(np.mean(rhos))
        assert r.rel_slope == pytest.approx(r.slope_mean / r.level)
    # Holm over the four (model, kind) rows: the k-th smallest p times (5 - k), running maximum, capped at 1
    p = result.p.to_numpy()
    order = np.argsort(p)
    assert result.p_holm.to_numpy()[order] == pytest.approx(np.minimum(1, np.maximum.accumulate(p[order] * [4, 3, 2, 1])))


def test_depth_trend_test_finds_growth_and_not_noise():
    rng = np.random.default_rng(0)
    rising = lambda m, k, s, h, t: 1.0 + 0.5 * t + rng.normal(0, 0.05)  # noqa: E731
    flat = lambda m, k, s, h, t: 1.0 + rng.normal(0, 0.05)  # noqa: E731
    # many independent data sets, 3 seeds each: the raw t-test's rejection rate is its power / its size
    models = [f"m{i}" for i in range(300)]
    power = (tr.depth_trend_test(trend_table(rising, models=models)).p < 0.05).mean()
    size = (tr.depth_trend_test(trend_table(flat, models=models)).p < 0.05).mean()
    assert power > 0.9 and size < 0.09
    # one rising and one flat pair in a family: the verdicts, with Holm's correction over both
    both = tr.depth_trend_test(pd.concat([trend_table(rising, models=("up",)), trend_table(flat, models=("flat",))]))
    verdicts = dict(zip(both.model, both.verdict))
    assert verdicts == {"up": "grows with depth", "flat": "not resolved at n = 3"}
    falling = trend_table(lambda m, k, s, h, t: 1.0 - 0.5 * t + rng.normal(0, 0.02))
    assert tr.depth_trend_test(falling).verdict.iloc[0] == "shrinks with depth"


def test_depth_trend_test_with_one_seed_describes_and_does_not_test():
    from scipy import stats as st

    table = trend_table(lambda m, k, s, h, t: 2.0 + t * t, seeds=(0,)).drop(columns="seed")  # an old one-run table
    row = tr.depth_trend_test(table).iloc[0]
    assert row.n_seeds == 1 and np.isnan(row.p) and np.isnan(row.ci_low)
    assert row.verdict == "not resolved at n = 1"
    assert row.slope_mean == pytest.approx(st.linregress(TIMES, [2.0 + t * t for t in TIMES]).slope)


def test_depth_trend_test_names_bad_input():
    table = trend_table(lambda m, k, s, h, t: 1.0)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\), got 1.5"):
        tr.depth_trend_test(table, alpha=1.5)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['n_eigs'\]"):
        tr.depth_trend_test(table.drop(columns="n_eigs"))


def test_the_trend_figure_has_a_panel_per_model_and_kind():
    table = trend_table(lambda m, k, s, h, t: 1.0 + s + t, models=("node", "ti_mlp"), kinds=("qk", "ov", "ff"))
    fig = figs.plot_depth_trend(table, tr.depth_trend_test(table))
    assert len(fig.axes) == 6 and "Holm p" in fig.axes[0].get_title()
    assert len(fig.axes[0].lines) == 6  # three seeds: points and a fitted line each


@pytest.mark.parametrize("arch", ["node", "ti_mlp"])
def test_head_slices_are_the_heads_attention_computes(arch):
    # independent of the slicing convention shared by the library and the numpy reference above:
    # the q, k that scaled_dot_product_attention receives per head and its per-head outputs, as the
    # field computes them, against the library's per-head W_Q^h, W_K^h and W_O[:, h]
    from unittest import mock

    model = small_model(arch).double()
    t = sp.solver_grid(model)[1]
    w = sp.layer_weights(model, t)
    x = torch.randn(1, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    seen, sdpa = {}, F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.update(q=q[0], k=k[0], out=sdpa(q, k, v, **kw)[0])  # (H, T, d_h)
        return sdpa(q, k, v, **kw)

    field = model.ode_block.field
    hook = field.attn.register_forward_hook(lambda module, args, out: seen.update(attn=out[0]))
    try:
        with torch.no_grad(), mock.patch.object(F, "scaled_dot_product_attention", spy):
            model.ode_block.vector_field(t, x)
    finally:
        hook.remove()
    a = F.layer_norm(x[0], (D,), *w.ln_1)  # what attention reads
    b_q, b_k = (w.b_qkv[i * D:(i + 1) * D].reshape(H, -1) for i in range(2))
    w_q, w_k, o = sp._heads(w.w_q, H), sp._heads(w.w_k, H), sp._heads(w.w_o.T, H)  # o[h] = W_O[:, h]^T
    for h in range(H):
        assert torch.allclose(seen["q"][h], a @ w_q[h].T + b_q[h], atol=1e-12)
        assert torch.allclose(seen["k"][h], a @ w_k[h].T + b_k[h], atol=1e-12)
    assert torch.allclose(sum(seen["out"][h] @ o[h] for h in range(H)) + w.b_o, seen["attn"], atol=1e-12)


def test_numerically_zero_eigenvalues_are_not_counted_positive():
    # the field Jacobian's layer-norm null directions come out as +-1e-16 x rho: their sign is rounding
    eigs = np.array([2.0, -1.0, 1e-17, -3e-17, 5e-17 + 1e-16j])
    row = sp.summarize(eigs)
    assert row["frac_pos_real"] == pytest.approx(1 / 5)
    assert row["spectral_radius"] == 2.0 and row["mean_abs"] == pytest.approx(3.0 / 5, rel=1e-12)
    model = small_model("ti_mlp", n_steps=1, d_model=8)
    e = jc.jacobian_spectra(model, torch.tensor([3, 1, 4]), mode="full").eigenvalues[0]
    assert (np.abs(e) < 1e-12 * np.abs(e).max()).sum() == 3  # one per token


def test_residual_integration_scales_the_field_not_the_weights():
    ode, residual = small_model("ti_mlp"), small_model("ti_mlp")
    residual.ode_block.integration = "residual"
    a, b = sp.weight_spectra(ode), sp.weight_spectra(residual)
    assert np.allclose(a.ov, b.ov) and np.allclose(a.ff, b.ff)  # the layers' weights
    assert a.field_scale == 1.0 and b.field_scale == N_STEPS
    t, x = torch.tensor(0.5), torch.randn(1, 4, D)
    with torch.no_grad():  # dx/dt = field_scale x the field whose weights these are
        assert torch.allclose(residual.ode_block.vector_field(t, x), b.field_scale * residual.field(t, x))


def test_dynamics_summary_against_the_spectra():
    from nodelm_lib.analysis import lyapunov as ly

    models = {arch: small_model(arch, n_steps=2, d_model=8) for arch in ("node", "ti_ssm")}
    idx = torch.tensor([3, 1, 4, 1])
    spec = {a: sp.weight_spectra(m) for a, m in models.items()}
    jac = {a: jc.jacobian_spectra(m, idx, n_krylov=8) for a, m in models.items()}
    sens = {a: ly.token_sensitivity(m, idx) for a, m in models.items()}
    tok = {a: ly.token_lyapunov_spectrum(m, idx, position=2) for a, m in models.items()}
    spectral = pd.concat([s.summary().assign(model=a) for a, s in spec.items()]
                         + [j.summary().assign(model=a) for a, j in jac.items()])
    lyapunov = pd.concat([s.frame().assign(model=a, analysis="sensitivity") for a, s in sens.items()]
                         + [s.frame().assign(model=a, analysis="token_spectrum") for a, s in tok.items()])
    table = dr.dynamics_summary(spectral, lyapunov)
    assert list(table.columns) == list(dr.SUMMARY_COLUMNS)
    assert list(zip(table.model, table.analysis)) == [
        ("node", k) for k in ("qk", "ov", "ff", "jacobian", "sensitivity", "token_spectrum")] + [
        ("ti_ssm", k) for k in ("qk", "ov", "jacobian", "sensitivity", "token_spectrum")]
    row = table.set_index(["model", "analysis"])
    s = spec["node"]
    for kind in ("qk", "ov", "ff"):
        first, last = np.abs(getattr(s, kind)[0]), np.abs(getattr(s, kind)[-1])  # every head's eigenvalues pooled
        r = row.loc[("node", kind)]
        assert (r.t_first, r.t_last) == (0.0, 0.5)
        assert r.mean_abs_first == pytest.approx(first.mean()) and r.mean_abs_last == pytest.approx(last.mean())
        assert r.radius_ratio == pytest.approx(last.max() / first.max())
        assert r.mean_abs_ratio == pytest.approx(last.mean() / first.mean())
    grows = np.abs(s.qk[-1]).mean(-1) > np.abs(s.qk[0]).mean(-1)
    assert row.loc[("node", "qk"), "heads_growing"] == f"{grows.sum()}/{H}"
    j = jac["ti_ssm"]
    r = row.loc[("ti_ssm", "jacobian")]
    assert (r.radius_min, r.radius_max) == pytest.approx((j.spectral_radius.min(), j.spectral_radius.max()))
    assert r.radius_first == pytest.approx(j.spectral_radius[0]) and np.isnan(r.max_exponent)
    r = row.loc[("node", "sensitivity")]
    lower = sens["node"].exponent[np.tril_indices(len(idx))]
    assert r.max_exponent == pytest.approx(lower.max()) and r.n_positive == f"{(lower > 0).sum()}/{lower.size}"
    r, svd = row.loc[("ti_ssm", "token_spectrum")], tok["ti_ssm"].svd
    assert r.max_exponent == pytest.approx(svd[0]) and r.exponent_sum == pytest.approx(svd.sum())
    assert np.isnan(r.mean_abs_first)


# --------------------------------------------------------------------------- notebook 04's runs are notebook 02's


def test_the_cpu_profile_analyses_02s_runs():
    """04's cpu profile builds its configs as notebook 02 does (protocol.base_config, 02's arms with
    Tong's preset for node, 02's selected rates), so that they hash to 02's committed records and
    04 reads them instead of training its own."""
    import yaml

    from nodelm_lib.experiments import protocol

    root = Path(__file__).resolve().parents[1]
    p = yaml.safe_load((root / "params" / "04_spectral_lyapunov" / "cpu.yaml").read_text())
    base = protocol.base_from_params(p)
    arms = protocol.architecture_arms(base.model, p["archs"], presets=p["presets"])
    rates = protocol.selected_lrs(root / "results" / p["lr_selection"])
    configs = protocol.sweep_configs(base, arms, p["seeds"], rates)
    assert p["seeds"] == [0, 1, 2] and p["archs"] == ["node", "ti_mlp"] and p["presets"] == {"node": "tong"}
    records = {r.config_hash: r for r in (nl.RunRecord.from_json(f) for f in (root / "results" / "runs" / "cpu").glob("*.json"))}
    for arm, seed, tc in configs:
        record = records.get(run_hash(tc))
        assert record is not None, f"{arm} seed {seed}: no record of 02 with its hash"
        assert (record.train_config.model.arch, record.seed, record.train_config.lr) == (arm, seed, rates[arm])
        assert record.status == "completed" and record.train_config.max_steps == 2000
    node = next(tc for arm, seed, tc in configs if arm == "node")
    assert (node.model.d_model, node.model.hyper_dim, node.model.ode.n_steps) == (128, 64, 4)  # Tong's hypernetwork


def test_the_committed_cpu_store_holds_every_analysis_04_needs():
    """A reproduce of 04's cpu profile from the committed store trains nothing on any CPU: each of
    its runs has, beside its record, every analysis the notebook asks for (the keys ``Analyses``
    builds from the profile's sentence and settings), tagged with that record's final loss. Without
    them 04 would retrain the run for its weights, and on another CPU type get other weights."""
    import yaml

    from nodelm_lib.analysis.dynamics_store import Analyses
    from nodelm_lib.data import get_tokenizer
    from nodelm_lib.experiments import protocol
    from nodelm_lib.runs.store import read_evaluations

    root = Path(__file__).resolve().parents[1]
    store = root / "results" / "runs" / "cpu"
    p = yaml.safe_load((root / "params" / "04_spectral_lyapunov" / "cpu.yaml").read_text())
    base = protocol.base_from_params(p)
    arms = protocol.architecture_arms(base.model, p["archs"], presets=p["presets"])
    configs = protocol.sweep_configs(base, arms, p["seeds"], protocol.selected_lrs(root / "results" / p["lr_selection"]))
    tokens = get_tokenizer(p["tokenizer"]).encode(p["sentence"])[:p["max_seq_len"]]
    analyses = Analyses(tokens=tokens, ff_units=p["ff_units"], jacobian_mode=p["jacobian_mode"],
                        n_krylov=p["n_krylov"])
    for arm, seed, tc in configs:
        record = nl.RunRecord.from_json(store / f"{run_hash(tc)}.json")
        stored = read_evaluations(record, store)
        missing = [k for k in analyses.keys(seed, flow=seed in p["flow_seeds"]) if k not in stored]
        assert not missing, f"{arm} seed {seed} ({record.config_hash}): no stored {missing}"
