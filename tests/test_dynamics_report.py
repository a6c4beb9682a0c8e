"""Notebook 04's conclusions (analysis.dynamics_report): the prose says what the tables say, and
says something else when the numbers change (fast, no training)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nodelm_lib.analysis import dynamics_report as dr
from nodelm_lib.analysis import depth_trends as tr
from nodelm_lib.analysis.lyapunov import TokenSensitivity, TokenSpectrum

REPO = Path(__file__).resolve().parents[1]
TIMES = [0.0, 0.25, 0.5, 0.75]
SEEDS = (0, 1, 2)
MODELS = ("node", "ti_mlp")


def weight_rows(model, kind, head, growth, seed):
    """Per t: mean |lambda| and spectral radius multiplied by ``growth`` every step, a little larger
    for each seed, plus a small fixed noise (so that seeds differ and a flat series is noise)."""
    noise = np.random.default_rng([seed, head + 1, sum(map(ord, kind)), len(model)]).normal(0.0, 0.02, len(TIMES))
    return [dict(model=model, seed=seed, step=i, t=t, kind=kind, head=head, n_eigs=4,
                 mean_abs=0.5 * growth**i * (1 + 0.05 * seed) + e, spectral_radius=1.0 * growth**i)
            for i, (t, e) in enumerate(zip(TIMES, noise))]


def jacobian_rows(model, radius, max_real, seed, rms=(0.1, 1.0, 1.0, 1.0)):
    return [dict(model=model, seed=seed, step=i, t=t, kind="jacobian", head=-1, n_eigs=8, mean_abs=r / 2,
                 spectral_radius=r, max_real=m, state_rms=s)
            for i, (t, r, m, s) in enumerate(zip(TIMES, radius, max_real, rms))]


def per_model(growth):
    return growth if isinstance(growth, dict) else dict.fromkeys(MODELS, growth)


def spectral_table(qk=1.2, ov=1.2, ff=1.1, radius=(50.0, 6.0, 7.0, 8.0), max_real=(1.0, 0.5, 0.2, 0.1), seeds=SEEDS):
    """Two models, two heads each, ``seeds``; QK grows by ``qk`` per step (or {model: growth}), OV by ``ov``."""
    qk, ov, ff = per_model(qk), per_model(ov), per_model(ff)
    rows = []
    for model in MODELS:
        for seed in seeds:
            for head in range(2):
                rows += weight_rows(model, "qk", head, qk[model], seed) + weight_rows(model, "ov", head, ov[model], seed)
            rows += weight_rows(model, "ff", -1, ff[model], seed) + jacobian_rows(model, radius, max_real, seed)
    return pd.DataFrame(rows)


def sensitivity(T=4, seed=0):
    exponent = np.random.default_rng(seed).normal(0.5, 1.0, size=(T, T))
    exponent[np.triu_indices(T, 1)] = np.nan
    return TokenSensitivity(exponent=exponent, sigma_max=np.exp(np.nan_to_num(exponent, nan=-np.inf)),
                            tokens=list(range(T)), time=1.0)


def spectrum(svd=(2.0, 0.5, -1.0, -3.0)):
    svd = np.asarray(svd)
    return TokenSpectrum(position=3, token=3, qr=svd[::-1].copy(), svd=svd, time=1.0, history=np.zeros((4, 4)))


def lyapunov_table(seeds=SEEDS):
    return pd.concat([sensitivity(seed=10 * m + s).frame().assign(model=name, seed=s, analysis="sensitivity")
                      for m, name in enumerate(MODELS) for s in seeds]
                     + [spectrum(svd=(2.0 + s, 0.5, -1.0, -3.0)).frame().assign(model=name, seed=s, analysis="token_spectrum")
                        for name in MODELS for s in seeds],
                     ignore_index=True)


def findings(**spectral):
    return dr.findings(spectral_table(**spectral), lyapunov_table(), profile="test", train_steps=7)


def test_the_verdict_is_the_trend_tests_over_every_t_and_seed():
    text = findings(qk=1.2, ov=1.2)
    assert "(profile `test`, 7 training steps, both models, 3 seeds each) over all 4 solver times" in text
    assert "Holm-corrected over the 6 (model, product) pairs" in text
    assert ("QK: node grows with depth, ti_mlp grows with depth, which **agrees** with that observation. "
            "OV: node grows with depth, ti_mlp grows with depth, which **agrees** with that observation.") in text
    shrinking = findings(ov=0.8)
    assert "OV: node shrinks with depth, ti_mlp shrinks with depth, which **does not reproduce** that observation." \
        in shrinking
    # a flat series with noise: no direction is claimed, and no "agrees" is left anywhere for OV
    flat = findings(ov=1.0)
    assert ("OV: node not resolved at n = 3, ti_mlp not resolved at n = 3, which **neither confirms nor refutes** "
            "that observation.") in flat
    assert "QK: node grows with depth, ti_mlp not resolved at n = 3, which **only partly reproduces**" in findings(
        qk={"node": 1.2, "ti_mlp": 1.0})


def test_the_lines_are_the_trend_tables_numbers():
    table = spectral_table(qk=1.2, ov=1.0, ff=0.9)
    text = dr.findings(table, lyapunov_table(), profile="test", train_steps=7)
    trend = tr.depth_trend_test(table[table.kind != "jacobian"])
    for row in trend.itertuples():
        line = f"- **{row.model} · {row.kind.upper()}**: {dr.trend_line(row)}"
        assert line in text
        assert f"mean slope {row.slope_mean:+.3g} per unit t, 95% CI [{row.ci_low:+.3g}, {row.ci_high:+.3g}]" in line
        assert f"Holm p = {row.p_holm:.2g}): **{row.verdict}**" in line
    assert "3/3 seeds rise" in dr.trend_line(trend.iloc[0]) and trend.verdict.iloc[0] == "grows with depth"
    assert "0/3 seeds rise" in dr.trend_line(trend[trend.kind == "ff"].iloc[0])
    # the heads: 2 heads x 3 seeds of node's QK, every one rising
    assert "- **node · QK**" in text and "; 6 of 6 (head, seed) curves have a positive slope." in text


def test_the_jacobian_line_describes_the_mean_over_seeds():
    text = findings(radius=(50.0, 6.0, 7.0, 8.0), max_real=(1.0, 0.5, 0.2, 0.1))
    assert ("- **node · Jacobian ∂f/∂x** (mean over 3 seeds): spectral radius 50 at t = 0 and 8 at t = 0.75, largest "
            "at t = 0, while the state's RMS goes from 0.1 to 1; ρ × RMS goes from 5 to 8.") in text
    assert "Largest real part between 0.1 and 1 (some directions expand locally at every t)." in text
    text = findings(radius=(5.0, 6.0, 9.0, 8.0), max_real=(-0.1, 0.5, 0.2, 0.1))
    assert "spectral radius 5 at t = 0 and 8 at t = 0.75, largest at t = 0.5" in text
    assert "(not expanding at every t)" in text


def test_sensitivity_stats_match_the_matrix_they_come_from():
    s = sensitivity(T=6, seed=3)
    i, j = np.tril_indices(6, -1)
    off = s.exponent[i, j]
    stats = dr.sensitivity_stats(s.frame())
    assert stats["mean S_ii (own token)"] == pytest.approx(np.diag(s.exponent).mean())
    assert stats["mean S_ij, j < i"] == pytest.approx(off.mean())
    assert stats["corr(S_ij, i - j)"] == pytest.approx(np.corrcoef(i - j, off)[0, 1])
    assert stats["max S_ij, j < i"] == off.max()
    assert np.isnan(dr.sensitivity_stats(sensitivity(T=2).frame())["corr(S_ij, i - j)"])  # one pair: no correlation


def test_the_sensitivity_line_averages_each_seeds_numbers():
    stats = dr.spectrum_stats(spectrum().frame())
    assert stats == {"largest (svd)": 2.0, "largest (QR)": -3.0, "smallest (svd)": -3.0, "positive (svd)": 2,
                     "sum = log|det|": -1.5}
    text = findings()
    # seeds 0, 1, 2 have largest exponents 2, 3, 4 and sums -1.5, -0.5, 0.5
    assert "Last token: largest exponent 3 (singular values) / -3 (QR from the identity basis), 2 of 4 positive, " \
           "log|det| = -0.5." in text
    own = np.mean([np.diag(sensitivity(seed=s).exponent).mean() for s in SEEDS])  # node's seeds
    assert f"- **node · sensitivity** (mean over 3 seeds): a token's own perturbation grows at rate {own:.3g}" in text
    assert text.count("· sensitivity**") == 2


def test_findings_on_the_committed_one_seed_cpu_tables_test_nothing():
    # the committed tables predate 04's seeds (one run each, no seed column): described, not tested
    spectral = pd.read_csv(REPO / "results" / "spectral_cpu.csv")
    lyapunov = pd.read_csv(REPO / "results" / "lyapunov_cpu.csv")
    if "seed" in spectral.columns:
        pytest.skip("the committed cpu tables are 04's multi-seed tables")
    text = dr.findings(spectral, lyapunov, profile="cpu", train_steps=1200)
    assert "both models, 1 seed each) over all 6 solver times" in text
    assert "QK: node not resolved at n = 1, ti_mlp not resolved at n = 1, which **neither confirms nor refutes**" in text
    assert "With one seed nothing is tested" in text and "**grows with depth**" not in text
    assert "33 of 64 positive" in text and "29 of 64 positive" in text


def test_findings_name_missing_columns():
    with pytest.raises(ValueError, match=r"lacks columns \['kind'\]"):
        dr.findings(spectral_table().drop(columns="kind"), lyapunov_table(), profile="test", train_steps=1)
