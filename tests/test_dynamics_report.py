"""Notebook 04's conclusions (analysis.dynamics_report): the prose says what the tables say, and
says something else when the numbers change (fast, no training)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nodelm_lib.analysis import dynamics_report as dr
from nodelm_lib.analysis.lyapunov import TokenSensitivity, TokenSpectrum

REPO = Path(__file__).resolve().parents[1]
TIMES = [0.0, 0.25, 0.5, 0.75]


def weight_rows(model, kind, head, growth):
    """Per t: mean |lambda| and spectral radius multiplied by ``growth`` every step."""
    return [dict(model=model, step=i, t=t, kind=kind, head=head, n_eigs=4, mean_abs=0.5 * growth**i,
                 spectral_radius=1.0 * growth**i) for i, t in enumerate(TIMES)]


def jacobian_rows(model, radius, max_real, rms=(0.1, 1.0, 1.0, 1.0)):
    return [dict(model=model, step=i, t=t, kind="jacobian", head=-1, n_eigs=8, mean_abs=r / 2, spectral_radius=r,
                 max_real=m, state_rms=s) for i, (t, r, m, s) in enumerate(zip(TIMES, radius, max_real, rms))]


def spectral_table(qk=1.2, ov=(1.2, 1.2), ff=1.1, radius=(50.0, 6.0, 7.0, 8.0), max_real=(1.0, 0.5, 0.2, 0.1)):
    """Two models, two heads each; QK heads grow by ``qk`` per step, OV head h by ``ov[h]``."""
    rows = []
    for model in ("node", "ti_mlp"):
        for head in range(2):
            rows += weight_rows(model, "qk", head, qk) + weight_rows(model, "ov", head, ov[head])
        rows += weight_rows(model, "ff", 0, ff) + jacobian_rows(model, radius, max_real)
    return pd.DataFrame(rows)


def sensitivity(T=4, seed=0):
    exponent = np.random.default_rng(seed).normal(0.5, 1.0, size=(T, T))
    exponent[np.triu_indices(T, 1)] = np.nan
    return TokenSensitivity(exponent=exponent, sigma_max=np.exp(np.nan_to_num(exponent, nan=-np.inf)),
                            tokens=list(range(T)), time=1.0)


def spectrum(svd=(2.0, 0.5, -1.0, -3.0)):
    svd = np.asarray(svd)
    return TokenSpectrum(position=3, token=3, qr=svd[::-1].copy(), svd=svd, time=1.0, history=np.zeros((4, 4)))


def lyapunov_table():
    return pd.concat([sensitivity(seed=s).frame().assign(model=m, analysis="sensitivity")
                      for s, m in enumerate(("node", "ti_mlp"))]
                     + [spectrum().frame().assign(model=m, analysis="token_spectrum") for m in ("node", "ti_mlp")],
                     ignore_index=True)


def findings(**spectral):
    return dr.findings(spectral_table(**spectral), lyapunov_table(), profile="test", train_steps=7)


def test_the_verdict_follows_the_share_of_growing_heads():
    text = findings(qk=1.2, ov=(1.2, 1.2))
    assert "(profile `test`, 7 training steps, both models together)" in text
    assert "QK: 4 of 4 heads end with a larger mean |λ| than they start, which **agrees** with that observation;" in text
    assert "OV: 4 of 4 heads end with a larger mean |λ| than they start, which **agrees** with that observation." in text
    # one OV head per model shrinks: half the heads grow
    assert "OV: 2 of 4 heads end with a larger mean |λ| than they start, which **only partly reproduces**" in findings(
        ov=(1.2, 0.8))
    # every attention head shrinks: the observation is not reproduced, and no "agrees" is left anywhere
    flipped = findings(qk=0.8, ov=(0.8, 0.8))
    assert "QK: 0 of 4 heads" in flipped and "OV: 0 of 4 heads" in flipped
    assert flipped.count("**does not reproduce**") == 2 and "**agrees**" not in flipped


def test_the_pooled_ratios_and_per_model_lines_are_the_tables_numbers():
    text = findings(qk=1.2, ov=(1.2, 0.8), ff=0.9)
    # 3 steps of growth 1.2: ratio last / first 1.728
    assert "mean |λ| last / first: node QK 1.73, node OV 1.12, ti_mlp QK 1.73, ti_mlp OV 1.12." in text
    assert "- **node · QK**: 2/2 heads have a larger mean |λ| at the last t than at the first (ratio last/first 1.73 to 1.73" in text
    assert "- **ti_mlp · OV**: 1/2 heads have a larger mean |λ|" in text
    assert "- **node · FF**: mean |λ| shrinks from the first to the last t (ratio 0.729" in text
    assert "- **node · FF**: mean |λ| grows from the first to the last t (ratio 1.33, Spearman ρ with t 1.00, at every step)" \
        in findings(ff=1.1)


def test_the_jacobian_line_says_growing_or_shrinking_from_the_table():
    text = findings(radius=(50.0, 6.0, 7.0, 8.0), max_real=(1.0, 0.5, 0.2, 0.1))
    assert ("- **node · Jacobian ∂f/∂x**: spectral radius 50 at t = 0 and 8 at t = 0.75 (shrinking) while the state's "
            "RMS goes from 0.1 to 1; ρ × RMS goes from 5 to 8.") in text
    assert "Largest real part between 0.1 and 1 (some directions expand locally at every t)." in text
    text = findings(radius=(5.0, 6.0, 7.0, 8.0), max_real=(-0.1, 0.5, 0.2, 0.1))
    assert "spectral radius 5 at t = 0 and 8 at t = 0.75 (growing)" in text
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


def test_the_sensitivity_line_counts_positive_exponents():
    stats = dr.spectrum_stats(spectrum().frame())
    assert stats == {"largest (svd)": 2.0, "largest (QR)": -3.0, "smallest (svd)": -3.0, "positive (svd)": 2,
                     "sum = log|det|": -1.5}
    text = findings()
    assert "Last token: largest exponent 2 (singular values) / -3 (QR from the identity basis), 2 of 4 positive, " \
           "log|det| = -1.5." in text
    assert text.count("· sensitivity**") == 2


def test_findings_on_the_committed_cpu_tables_say_what_the_readme_says():
    spectral = pd.read_csv(REPO / "results" / "spectral_cpu.csv")
    lyapunov = pd.read_csv(REPO / "results" / "lyapunov_cpu.csv")
    text = dr.findings(spectral, lyapunov, profile="cpu", train_steps=1200)
    # README: QK grows in node (4 of 4 heads) and ti_mlp (3 of 4); OV grows in one head of 8
    assert "QK: 7 of 8 heads end with a larger mean |λ| than they start, which **agrees** with" in text
    assert "OV: 1 of 8 heads end with a larger mean |λ| than they start, which **does not reproduce**" in text
    assert "node QK 2.57, node OV 0.625, ti_mlp QK 1.54, ti_mlp OV 0.698." in text
    assert "- **ti_mlp · FF**: mean |λ| shrinks" in text and "- **node · FF**: mean |λ| grows" in text
    assert "33 of 64 positive" in text and "29 of 64 positive" in text


def test_findings_name_missing_columns():
    with pytest.raises(ValueError, match=r"lacks columns \['kind'\]"):
        dr.findings(spectral_table().drop(columns="kind"), lyapunov_table(), profile="test", train_steps=1)
