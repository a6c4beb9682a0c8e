"""Whole-split evaluation, token counts and the activation-memory measurement of a run."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.data import split_windows
from nodelm_lib.training.evaluation import activation_bytes, eval_batches, evaluate_split


def small_model(arch: str = "gpt") -> nl.models.CausalLM:
    torch.manual_seed(0)
    cfg = nl.ModelConfig(arch=arch, vocab_size=50, d_model=16, n_heads=2, n_layers=2, max_seq_len=16,
                         ode=nl.ODEConfig(n_steps=2))
    return nl.build_model(cfg).eval()


@torch.no_grad()
def token_by_token_loss(model, tokens: np.ndarray, seq_len: int) -> tuple[float, int]:
    """The reference: every target scored on its own, from a forward pass over exactly the
    context its window gives it (positions since the window's start)."""
    total, n = 0.0, 0
    for start in range(0, (len(tokens) - 1) // seq_len * seq_len, seq_len):
        for i in range(seq_len):
            context = torch.as_tensor(tokens[start:start + i + 1], dtype=torch.int64)[None]
            logits, _ = model(context)
            total += F.cross_entropy(logits[0, -1:], torch.as_tensor([int(tokens[start + i + 1])])).item()
            n += 1
    return total / n, n


@pytest.mark.parametrize("arch", ["gpt", "ti_ssm"])
def test_whole_split_loss_equals_a_token_by_token_reference(arch):
    tokens = np.random.default_rng(0).integers(0, 50, size=8 * 7 + 5)  # 7 windows of 8, a ragged tail
    model = small_model(arch)
    fast = evaluate_split(model, tokens, seq_len=8, batch_size=3)  # batches of 3, 3, 1 windows
    slow, n = token_by_token_loss(model, tokens, 8)
    assert fast["tokens"] == n == 7 * 8
    assert fast["loss"] == pytest.approx(slow, rel=1e-5)


def test_split_windows_score_every_target_once():
    tokens = np.arange(30)
    batches = split_windows(tokens, batch_size=2, seq_len=4)  # (30 - 1) // 4 = 7 windows
    xs = torch.cat([x for x, _ in batches]).flatten().tolist()
    ys = torch.cat([y for _, y in batches]).flatten().tolist()
    assert [len(x) for x, _ in batches] == [2, 2, 2, 1]
    assert xs == list(range(28)) and ys == list(range(1, 29))
    with pytest.raises(ValueError, match="fewer than seq_len"):
        split_windows(np.arange(4), 2, 4)


def test_whole_split_run_records_its_token_counts():
    model = nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=64)
    tc = nl.TrainConfig(model=model, batch_size=64, seq_len=64, max_steps=2, warmup_steps=1, eval_interval=2,
                        eval_on="whole_split", progress=False)
    val = eval_batches(tc, "validation")
    n_val = sum(y.numel() for _, y in val)
    assert n_val == (55770 - 1) // 64 * 64  # tiny-shakespeare's validation split, every window
    rec = nl.train(tc)
    assert rec.final["val_tokens"] == n_val and rec.final["test_tokens"] == n_val  # the splits are equal in size
    assert rec.activation_mb > 0


def test_whole_split_at_end_scores_the_curve_on_batches_and_the_final_losses_on_whole_splits():
    from nodelm_lib.training.evaluation import evaluate, final_eval_batches

    model = nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=64)
    tc = nl.TrainConfig(model=model, batch_size=64, seq_len=64, max_steps=2, warmup_steps=1, eval_interval=2,
                        eval_batches=2, eval_on="whole_split_at_end", progress=False)
    rec = nl.train(tc)
    whole = final_eval_batches(tc, "validation")
    assert rec.final["val_tokens"] == (55770 - 1) // 64 * 64 == rec.final["test_tokens"]
    # the curve's last point is the 2 fixed batches; the final validation loss is the whole split's
    batches = eval_batches(tc, "validation")
    assert len(batches) == 2 and rec.evals[-1]["val_loss"] == pytest.approx(
        evaluate(rec.model, batches, torch.device("cpu"), contextlib.nullcontext), abs=1e-6)
    assert rec.final["val_loss"] == pytest.approx(
        evaluate(rec.model, whole, torch.device("cpu"), contextlib.nullcontext), abs=1e-6)
    assert rec.final["val_loss"] != rec.evals[-1]["val_loss"]
    plain = dataclasses.replace(tc, eval_on="batches")
    assert final_eval_batches(plain, "validation", batches) is batches


def test_eval_on_changes_the_hash_only_when_set():
    plain = nl.TrainConfig()
    assert nl.TrainConfig(eval_on="batches").config_hash() == plain.config_hash()  # stored records keep their names
    assert nl.TrainConfig(eval_on="whole_split").config_hash() != plain.config_hash()
    with pytest.raises(ValueError, match="eval_on='all' is not valid; choose one of 'batches', 'whole_split'"):
        nl.TrainConfig(eval_on="all")


def test_activation_bytes_counts_saved_tensors_and_leaves_the_random_state_alone():
    cfg = nl.ModelConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=2, max_seq_len=16, dropout=0.1)
    model = nl.build_model(cfg).train()
    x = torch.randint(0, 50, (2, 16))
    deeper = nl.build_model(nl.ModelConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=4, max_seq_len=16,
                                           dropout=0.1)).train()
    state = torch.get_rng_state()
    n = activation_bytes(model, x, x, lambda: torch.autocast("cpu", enabled=False))
    assert torch.equal(torch.get_rng_state(), state)  # dropout masks drawn in the measurement are not consumed
    assert 0 < n < activation_bytes(deeper, x, x, lambda: torch.autocast("cpu", enabled=False))
    assert math.isfinite(n)
