"""LoRA fine-tuning as a run (TrainConfig.lora_rank): only the adapters train, the record says how many
parameters that is, the run's model file loads as a plain model with the adapters folded in, and an
interrupted run resumes to the same numbers."""

from __future__ import annotations

import contextlib

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.experiments import ablations
from nodelm_lib.runs import store as run_store


def parent_config() -> nl.TrainConfig:
    cfg = nl.config.for_arch(nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=2, max_seq_len=16), "node")
    return nl.TrainConfig(model=cfg, batch_size=2, seq_len=16, max_steps=8, eval_interval=8, eval_batches=2,
                          progress=False, device="cpu", lr=3e-3)


@pytest.fixture
def trained(tmp_path):
    store, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    parent = run_store.run(parent_config(), store=store, checkpoints=checkpoints)
    return parent, store, checkpoints


def test_only_the_adapters_train_and_the_model_file_folds_them_in(trained):
    parent, store, checkpoints = trained
    tc = ablations.finetune_config(parent_config(), n_steps=4, fraction=0.5, lr_scale=1.0, lora_rank=2)
    record = run_store.run(tc, store=store, checkpoints=checkpoints)
    before, after = nl.load_model(parent.checkpoint), nl.load_model(record.checkpoint)
    assert before.state_dict().keys() == after.state_dict().keys()  # a plain model
    deltas = {name: after.state_dict()[name] - w for name, w in before.state_dict().items()
              if not torch.equal(after.state_dict()[name], w)}
    # W + B A - W: rank 2, up to the float32 rounding of the sum
    assert deltas and all(name.endswith("weight") and torch.linalg.matrix_rank(d, rtol=1e-3) <= 2
                          for name, d in deltas.items())
    adapted = [(d.shape[0] + d.shape[1]) * 2 for d in deltas.values()]
    assert record.params["trained"] == sum(adapted) < record.params["non_embedding"] / 5
    after.set_ode(n_steps=4)
    batches = nl.training.evaluation.eval_batches(record.train_config, "validation")
    loss = nl.training.evaluation.evaluate(after, batches, torch.device("cpu"), contextlib.nullcontext)
    assert loss == pytest.approx(record.final["val_loss"], abs=1e-6)  # the adapted model's own final loss


def test_without_a_rank_the_fine_tuning_run_is_the_one_it_was():
    full = ablations.finetune_config(parent_config(), 4, 0.5, 1.0)
    stored = {k: v for k, v in nl.config.to_dict(full).items() if k != "lora_rank"}  # a record from before the option
    assert full.lora_rank == 0 and nl.config.from_dict(nl.TrainConfig, stored).config_hash() == full.config_hash()
    assert ablations.finetune_config(parent_config(), 4, 0.5, 1.0, lora_rank=2).config_hash() != full.config_hash()


def test_an_interrupted_lora_run_resumes_to_the_same_numbers(trained, tmp_path):
    parent, store, checkpoints = trained
    tc = ablations.finetune_config(parent_config(), n_steps=3, fraction=1.0, lr_scale=1.0, lora_rank=2)
    whole = run_store.run(tc, store=store, checkpoints=checkpoints)
    out = checkpoints / "again"
    again = nl.config.with_values(tc, {"out_dir": str(out), "checkpoint_interval": 4})

    def stop(step, row, model):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        nl.train(again, callback=stop)
    resumed = nl.train(nl.config.with_values(again, {"resume": True}))
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]
    assert resumed.final["val_loss"] == whole.final["val_loss"]


def test_a_rank_without_a_run_to_adapt_is_refused():
    with pytest.raises(ValueError, match=r"lora_rank=4 adapts a trained model .* give the run to adapt as init_from"):
        nl.TrainConfig(lora_rank=4)
    with pytest.raises(ValueError, match=r"lora_rank=-1 is not valid; it must be >= 0"):
        nl.TrainConfig(lora_rank=-1)
