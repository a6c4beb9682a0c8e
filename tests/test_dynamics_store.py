"""Notebook 04's analyses kept beside each run's record (analysis/dynamics_store.py,
runs/final_weights.py): a result read back from its JSON gives the same tables digit for digit, a
clone without the weights rebuilds them training nothing, and analyses of weights retrained
elsewhere never land in the run's own store."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

import nodelm_lib as nl
from conftest import as_if_trained_elsewhere
import nodelm_lib.runs.store as store_module
from nodelm_lib.analysis import dynamics_store as dyn
from nodelm_lib.analysis import jacobian as jc
from nodelm_lib.analysis import lyapunov as ly
from nodelm_lib.analysis import spectral as sp
from nodelm_lib.experiments import sweeps
from nodelm_lib.runs.final_weights import FinalWeights, weights_store
from nodelm_lib.runs.store import evaluations_path, record_path

TOKENS = [3, 1, 4, 1, 5]


def small_model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = nl.ModelConfig(arch=arch, vocab_size=32, d_model=16, n_heads=2, n_layers=3, max_seq_len=16,
                         time_features=4, time_hidden=8, hyper_dim=2, ode=nl.ODEConfig(method="euler", n_steps=3))
    model = nl.build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def read_back(result):
    """``result`` through its JSON, as the store keeps it."""
    return type(result).from_dict(json.loads(json.dumps(result.to_dict())))


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("arch", ["node", "ti_mlp"])
def test_every_analysis_read_back_gives_the_same_tables_and_figure_data(arch):
    model, idx = small_model(arch), torch.tensor(TOKENS)
    spectra = sp.weight_spectra(model, ff_units=8, seed=1)
    again = read_back(spectra)
    pd.testing.assert_frame_equal(again.summary(), spectra.summary(), check_exact=True)
    pd.testing.assert_frame_equal(again.eigenvalues(), spectra.eigenvalues(), check_exact=True)
    assert all(same_bytes(getattr(again, f), getattr(spectra, f)) for f in ("times", "field_times", "qk", "ov", "ff"))
    assert same_bytes(again.ff_units, spectra.ff_units) and again.field_scale == spectra.field_scale

    jacobian = jc.jacobian_spectra(model, idx)
    again = read_back(jacobian)
    pd.testing.assert_frame_equal(again.summary(), jacobian.summary(), check_exact=True)
    for name in ("spectral_radius", "max_real", "spectral_norm", "state_rms", "times"):  # what the figure plots
        assert same_bytes(getattr(again, name), getattr(jacobian, name)), name
    assert again.eigenvalues is None and again.tokens == TOKENS

    sensitivity = ly.token_sensitivity(model, idx)
    again = read_back(sensitivity)
    pd.testing.assert_frame_equal(again.frame(), sensitivity.frame(), check_exact=True)
    assert np.array_equal(again.exponent, sensitivity.exponent, equal_nan=True)
    assert np.isnan(again.exponent[0, 1]) and same_bytes(again.sigma_max, sensitivity.sigma_max)

    spectrum = ly.token_lyapunov_spectrum(model, idx)
    again = read_back(spectrum)
    pd.testing.assert_frame_equal(again.frame(), spectrum.frame(), check_exact=True)
    assert same_bytes(again.history, spectrum.history)


def test_complex_values_keep_signed_zeros_and_non_finite_parts():
    values = np.array([[-0.0 + 1j, 2.5 - 0.0j], [complex(np.inf, -1.0), complex(1e-300, np.nan)]])
    again = sp.complex_from_json(json.loads(json.dumps(sp.complex_to_json(values))))
    assert same_bytes(again, values)


def test_jacobian_spectra_need_eigenvalues_or_their_stats():
    with pytest.raises(ValueError, match="eigenvalues or their stats"):
        jc.JacobianSpectra("blocks", np.zeros(1), None, np.ones(1), np.ones(1), [1])


def tiny_node(max_steps: int = 4) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="node", vocab_size=256, d_model=16, n_heads=2, n_layers=3, max_seq_len=16,
                           time_features=4, time_hidden=8, hyper_dim=2, ode=nl.ODEConfig(method="euler", n_steps=3))
    return nl.TrainConfig(model=model, batch_size=2, seq_len=16, max_steps=max_steps, lr=3e-3, warmup_steps=1,
                          eval_interval=max_steps, eval_batches=1, eval_on="batches", progress=False, device="cpu")


ANALYSES = dyn.Analyses(tokens=TOKENS, ff_units=None)
ARMS = {"a": {"model.arch": "node"}}


def analysis_tables(weights: dict) -> dict[str, pd.DataFrame]:
    """What notebook 04 writes from each run's analyses."""
    return {"spectra": pd.concat([ANALYSES.weight_spectra(w, seed).summary() for (_, seed), w in weights.items()]),
            "eigenvalues": pd.concat([ANALYSES.weight_spectra(w, seed).eigenvalues() for (_, seed), w in weights.items()]),
            "jacobian": pd.concat([ANALYSES.jacobian_spectra(w).summary() for w in weights.values()]),
            "sensitivity": pd.concat([ANALYSES.token_sensitivity(w).frame() for w in weights.values()]),
            "token spectrum": pd.concat([ANALYSES.token_spectrum(w).frame() for w in weights.values()])}


def final_weights(tmp_path, seeds=(0,)):
    return sweeps.final_weights(tiny_node(), ARMS, list(seeds), store=tmp_path / "runs",
                                checkpoints=tmp_path / "ckpt", isolate=False, progress=False,
                                needs=lambda arm, seed: ANALYSES.keys(seed, flow=True))


def forbid_training(monkeypatch):
    def must_not_train(*args, **kwargs):
        raise AssertionError("a run was trained although its store keeps every analysis it needs")

    monkeypatch.setattr(store_module, "train", must_not_train)
    monkeypatch.setattr(FinalWeights, "model", lambda self: pytest.fail("weights loaded for a stored analysis"))


def test_a_clone_without_weights_rebuilds_the_analyses_from_the_store_training_nothing(tmp_path, monkeypatch):
    runs, weights = final_weights(tmp_path, seeds=(0, 1))
    assert {w.store for w in weights.values()} == {tmp_path / "runs"}
    tables = analysis_tables(weights)
    config_hash = runs["config_hash"].iloc[0]
    kept = json.loads(evaluations_path(tmp_path / "runs", config_hash).read_text())
    assert sorted(kept["evaluations"]) == sorted(ANALYSES.keys(0, flow=True))
    assert kept["final_val_loss"] == runs["val_loss"].iloc[0]

    shutil.rmtree(tmp_path / "ckpt")  # a clone: records and evaluations, no weights
    forbid_training(monkeypatch)
    again_runs, again = final_weights(tmp_path, seeds=(0, 1))
    pd.testing.assert_frame_equal(again_runs, runs)
    for name, table in analysis_tables(again).items():
        pd.testing.assert_frame_equal(table, tables[name], check_exact=True, obj=name)


def test_a_new_analysis_trains_the_weights_again(tmp_path):
    """A key the store does not keep (other settings) needs the weights: a clone trains them."""
    final_weights(tmp_path)
    shutil.rmtree(tmp_path / "ckpt")
    other = dyn.Analyses(tokens=TOKENS[:3])
    _, weights = sweeps.final_weights(tiny_node(), ARMS, [0], store=tmp_path / "runs", checkpoints=tmp_path / "ckpt",
                                      isolate=False, progress=False,
                                      needs=lambda arm, seed: other.keys(seed, flow=True))
    assert other.sensitivity_key() != ANALYSES.sensitivity_key()
    assert other.token_sensitivity(weights[("a", 0)]).exponent.shape == (3, 3)


def test_analyses_of_weights_retrained_elsewhere_go_to_the_side_store(tmp_path, monkeypatch, caplog):
    """On another kind of CPU the retraining for weights ends elsewhere: its analyses are kept with
    its record in the side store, the run's own store (committed) gets nothing, and a second clone
    of that machine reads them back from the side store."""
    runs, _ = final_weights(tmp_path)
    config_hash = runs["config_hash"].iloc[0]
    path = record_path(tmp_path / "runs", config_hash)
    as_if_trained_elsewhere(path)
    shutil.rmtree(tmp_path / "ckpt")
    with caplog.at_level("WARNING"):
        _, weights = final_weights(tmp_path)
    assert "ended elsewhere than their stored records" in caplog.text
    side = weights_store(tmp_path / "ckpt")
    assert weights[("a", 0)].store == side and weights[("a", 0)].record.final["val_loss"] == runs["val_loss"].iloc[0]
    tables = analysis_tables(weights)
    assert not evaluations_path(tmp_path / "runs", config_hash).exists()
    assert json.loads(evaluations_path(side, config_hash).read_text())["final_val_loss"] == runs["val_loss"].iloc[0]

    for checkpoint in (tmp_path / "ckpt").glob(f"{config_hash}/*"):  # weights gone, side store kept
        checkpoint.unlink()
    forbid_training(monkeypatch)
    _, again = final_weights(tmp_path)
    assert again[("a", 0)].store == side
    for name, table in analysis_tables(again).items():
        pd.testing.assert_frame_equal(table, tables[name], check_exact=True, obj=name)


def test_an_analysis_the_store_lacks_without_weights_says_what_to_do(tmp_path):
    runs, weights = final_weights(tmp_path)
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="list it in the `needs` of sweeps.final_weights"):
        dyn.Analyses(tokens=[7, 7]).token_sensitivity(weights[("a", 0)])


def test_analyses_need_tokens():
    with pytest.raises(ValueError, match="at least one token"):
        dyn.Analyses(tokens=[])
