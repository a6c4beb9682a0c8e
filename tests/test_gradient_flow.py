"""Notebook 01's analysis: summaries, vanishing/exploding counts and the verdict."""

import math

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.analysis import gradient_flow as gf


def record(arch, grad, ode=None, val=2.0):
    metrics = []
    for i, g in enumerate(grad):
        row = {"step": i + 1, "loss": 3.0, "lr": 1e-3, "grad_norm": g}
        if ode is not None:
            row["grad_norm/ode_block"] = ode[i]
        metrics.append(row)
    return nl.RunRecord(config={"model": {"arch": arch}}, config_hash="x", seed=0, metrics=metrics,
                        final={"train_loss": 3.0, "val_loss": val, "test_loss": val},
                        params={"total": 10, "non_embedding": 8})


def test_summary_counts_vanishing_and_exploding_steps():
    table = gf.summary_table({
        "baseline": record("gpt", [1.0, 2.0, 3.0]),
        "hybrid": record("hybrid", [1.0, 200.0, 1e-7], ode=[1e-7, 0.5, 150.0], val=2.1),
    })
    base, hyb = table.set_index("model").loc["baseline"], table.set_index("model").loc["hybrid"]
    assert base["grad_norm_mean"] == pytest.approx(2.0) and base["grad_norm_std"] == pytest.approx(1.0)
    assert math.isnan(base["ode_grad_norm_mean"])
    assert (hyb["vanishing_steps"], hyb["exploding_steps"]) == (1, 1)
    assert (hyb["ode_vanishing_steps"], hyb["ode_exploding_steps"]) == (1, 1)
    checks = gf.verdict(table, "baseline", "hybrid", control=0.0).set_index("criterion")["passed"]
    assert not checks["no vanishing ODE-block gradient steps"]
    assert not checks["no exploding ODE-block gradient steps"]
    assert checks["final val loss ratio hybrid / baseline"]  # 2.1 / 2.0 = 1.05 <= 1.10
    assert not checks["control vector changes the logits"]


def test_healthy_run_passes_every_criterion():
    table = gf.summary_table({"baseline": record("gpt", [1.0, 1.0]),
                              "hybrid": record("hybrid", [1.0, 1.0], ode=[0.1, 0.1], val=2.0)})
    assert gf.verdict(table, "baseline", "hybrid", control=0.01)["passed"].all()


def test_paired_configs_differ_only_in_arch():
    pair = gf.paired_configs(nl.TrainConfig(model=nl.ModelConfig(arch="hybrid", n_layers=6), seed=7))
    assert pair["baseline"].model.arch == "gpt" and pair["hybrid"].model.arch == "hybrid"
    a, b = nl.config.to_dict(pair["baseline"]), nl.config.to_dict(pair["hybrid"])
    a["model"].pop("arch"), b["model"].pop("arch")
    assert a == b


def test_control_effect_is_zero_only_without_a_control_path():
    torch.manual_seed(0)
    model = nl.build_model(nl.ModelConfig(arch="hybrid", vocab_size=32, d_model=16, n_heads=2, n_layers=4))
    idx = torch.randint(0, 32, (2, 8))
    assert gf.control_effect(model, idx) > 0
    with torch.no_grad():
        model.ode_block.field.control_proj.weight.zero_()
    assert gf.control_effect(model, idx) == 0.0


@pytest.mark.slow
def test_the_control_effect_is_kept_so_a_clone_without_weights_trains_nothing(tmp_path, monkeypatch):
    """The hybrid's control effect is computed from its final weights once and kept beside its
    record: with the weights gone (a fresh clone) the runs are read back, nothing is trained, and
    the effect read back is the one computed from the weights."""
    from nodelm_lib.data import fixed_batches
    import nodelm_lib.runs.store as store_module
    from nodelm_lib.runs.store import checkpoint_path, evaluations_path
    from nodelm_lib.training.evaluation import split_tokens

    model = nl.ModelConfig(arch="hybrid", d_model=16, n_heads=2, n_layers=4, max_seq_len=16, ode_start=1, ode_end=3,
                           control_dim=4)
    configs = gf.paired_configs(nl.TrainConfig(model=model, dataset="tinyshakespeare", tokenizer="char",
                                               batch_size=2, seq_len=16, max_steps=3, eval_interval=3, eval_batches=1,
                                               eval_on="batches", progress=False))
    store, checkpoints = tmp_path / "runs", tmp_path / "ckpt"
    records = gf.with_control_weights(configs, store, checkpoints)
    effect = gf.stored_control_effect(records["hybrid"], store, checkpoints)
    # the same number as the effect computed directly from the weights on 4 fixed validation windows
    weights = nl.load_model(checkpoint_path(records["hybrid"].config_hash, checkpoints))
    val = torch.from_numpy(split_tokens(configs["hybrid"], "validation").astype("int64"))
    (x, _), = fixed_batches(val, 1, gf.CONTROL_WINDOWS, 16, seed=0)
    assert effect == gf.control_effect(weights, x) > 0
    assert evaluations_path(store, records["hybrid"].config_hash).exists()

    for path in checkpoints.rglob("*"):  # a clone: records and evaluations, no weights
        if path.is_file():
            path.unlink()
    trained = []
    monkeypatch.setattr(store_module, "train_into_store", lambda tc, *a, **k: trained.append(tc))
    again = gf.with_control_weights(configs, store, checkpoints)
    assert not trained and not any(p.is_file() for p in checkpoints.rglob("*"))
    assert gf.stored_control_effect(again["hybrid"], store, checkpoints) == effect
