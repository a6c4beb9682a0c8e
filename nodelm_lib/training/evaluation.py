"""Scoring a model: mean loss over fixed batches, the whole-split loss in windows, the evaluation
batches of a config and the tokens a run of it scores, and the bytes one training step keeps for
backward."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import numpy as np
import torch

from nodelm_lib.config import TrainConfig
from nodelm_lib.data import fixed_batches, get_tokenizer, load_tokens, split_windows, window_count
from nodelm_lib.models import CausalLM

from . import distributed
from .distributed import SINGLE, Context
from .profiling import saved_tensor_bytes


@torch.no_grad()
def evaluate(model: CausalLM, batches, device: torch.device, autocast, ctx: Context = SINGLE) -> float:
    """Mean loss per token over fixed batches, in eval mode (no dropout). Batches of one size
    (random windows) are averaged as they come; a smaller last batch (a whole split) is
    weighted by its tokens. In a data-parallel run (``ctx``) each rank scores every
    ``world_size``-th batch and the per-batch losses are gathered, so every rank returns the
    single-process number."""
    batches = list(batches)
    was_training = model.training
    model.eval()
    mine = {}
    for i in distributed.my_batches(ctx, batches):
        x, y = batches[i]
        with autocast():
            _, loss = model(x.to(device), y.to(device), return_logits=False)
        mine[i] = float(loss)
    model.train(was_training)
    losses = distributed.gather_values(ctx, len(batches), mine, device)
    sizes = [y.numel() for _, y in batches]
    if len(set(sizes)) == 1:
        return float(np.mean(losses))
    return float(np.dot(losses, sizes) / sum(sizes))


def batch_tokens(batches) -> int:
    """Tokens scored by an evaluation over ``batches``."""
    return sum(y.numel() for _, y in batches)


@torch.no_grad()
def evaluate_split(model: CausalLM, tokens, seq_len: int, batch_size: int = 8, max_windows: int | None = None,
                   device: torch.device | str = "cpu") -> dict:
    """Mean loss over a whole split cut into consecutive, non-overlapping windows of
    ``seq_len`` (``data.split_windows``: each position scored once, with as much context as
    its window gives), or over the first ``max_windows`` of them. Returns loss, perplexity,
    bits per token and the number of tokens scored. With learned positions ``seq_len`` may not
    exceed the model's ``max_seq_len``; a rope model takes any (``CausalLM.context_limit``)."""
    if model.context_limit is not None and seq_len > model.context_limit:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={model.cfg.max_seq_len} "
                         "(its position embeddings end there)")
    batches = split_windows(tokens, batch_size, seq_len, max_windows)
    loss = evaluate(model, batches, torch.device(device), contextlib.nullcontext)
    return {"loss": loss, "perplexity": math.exp(loss), "bits_per_token": loss / math.log(2),
            "tokens": batch_tokens(batches), "seq_len": seq_len}


def with_tokenizer_vocab(tc: TrainConfig) -> TrainConfig:
    """``tc`` finished: ``model.vocab_size`` filled from the tokenizer, or checked to be large
    enough; idempotent. A config is finished in two places: ``train`` (the config that trains)
    and ``runs.store.run_config`` (the config a run is stored and named under, for ``run``,
    ``run_hash`` and a launcher's job). Code below them takes the config finished; code that only
    needs the model's vocabulary reads it from ``flops.model_with_vocab``."""
    vocab = get_tokenizer(tc.tokenizer).vocab_size
    if tc.model.vocab_size is None:
        return dataclasses.replace(tc, model=dataclasses.replace(tc.model, vocab_size=vocab))
    if tc.model.vocab_size < vocab:
        raise ValueError(
            f"model.vocab_size={tc.model.vocab_size} is smaller than the {tc.tokenizer!r} tokenizer's "
            f"vocabulary ({vocab}); set model.vocab_size={vocab} or leave it unset"
        )
    return tc


def split_tokens(tc: TrainConfig, split: str) -> np.ndarray:
    """One split of ``tc``'s corpus as a 1-D array of token ids, as ``load_tokens`` gives it: a
    memmap of the token cache for a large corpus (WikiText-103), which ``sample_batch`` and
    ``split_windows`` read window by window rather than widening it whole to int64."""
    return load_tokens(tc.dataset, split, tc.tokenizer, data_dir=tc.data_dir)


def eval_batches(tc: TrainConfig, split: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed evaluation batches of ``split``, the same for every seed and architecture of
    a comparison: ``eval_batches`` random windows drawn with ``eval_seed``, or with
    ``eval_on="whole_split"`` the whole split in consecutive windows (``data.split_windows``)."""
    tokens = split_tokens(tc, split)
    if tc.eval_on == "whole_split":
        return split_windows(tokens, tc.batch_size, tc.seq_len)
    return fixed_batches(tokens, tc.eval_batches, tc.batch_size, tc.seq_len, tc.eval_seed)


def final_eval_batches(tc: TrainConfig, split: str, during_training=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of the final validation / test loss: the whole split for
    ``eval_on="whole_split_at_end"``, else those of ``eval_batches`` (``during_training``, the
    validation batches already drawn, is returned as is when given)."""
    if tc.eval_on == "whole_split_at_end":
        return split_windows(split_tokens(tc, split), tc.batch_size, tc.seq_len)
    return during_training if during_training is not None else eval_batches(tc, split)


def scored_tokens(tc: TrainConfig) -> int:
    """Tokens a run of ``tc`` scores besides training: every evaluation of its validation curve
    (at step 0, each ``eval_interval`` steps and at the end, as ``training.loop`` evaluates) and
    its final validation and test scores where they are not the curve's last point. A run's
    scoring time grows with this, not with its steps (``runs.timing``)."""
    per_batches = tc.eval_batches * tc.batch_size * tc.seq_len
    curve = _window_tokens(tc, "validation") if tc.eval_on == "whole_split" else per_batches
    evaluations = 1 + tc.max_steps // tc.eval_interval + (tc.max_steps % tc.eval_interval != 0)
    final = _window_tokens(tc, "validation") if tc.eval_on == "whole_split_at_end" else 0
    test = 0
    if tc.score_test:
        test = per_batches if tc.eval_on == "batches" else _window_tokens(tc, "test")
    return evaluations * curve + final + test


def _window_tokens(tc: TrainConfig, split: str) -> int:
    """Tokens scored over ``split`` in consecutive windows of ``tc.seq_len`` (``split_windows``)."""
    return _split_window_tokens(tc.dataset, split, tc.tokenizer, tc.data_dir, tc.seq_len)


@functools.lru_cache(maxsize=64)
def _split_window_tokens(dataset: str, split: str, tokenizer: str, data_dir, seq_len: int) -> int:
    return window_count(len(load_tokens(dataset, split, tokenizer, data_dir=data_dir)), seq_len) * seq_len


def activation_bytes(model: CausalLM, x: torch.Tensor, y: torch.Tensor, autocast) -> int:
    """Bytes of the tensors autograd saves for backward in one training forward pass on (x, y):
    the activation memory of a step, which (unlike the process's resident set) belongs to the
    model. Random state is restored after, so measuring changes no number of the run."""
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []), autocast():
        n, _ = saved_tensor_bytes(lambda: model(x, y, return_logits=False))
    return n
