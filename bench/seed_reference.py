"""A minimal re-implementation of the seed's models (the reference the benchmark record compares
against), written from the seed's description, not copied: token + position embeddings, pre-LN
blocks with hand-written masked attention (a (T, T) score matrix, ``masked_fill``, softmax) and
a GELU MLP, a final LayerNorm and an untied head over the whole vocabulary, trained with plain
``torch.optim.AdamW`` on the full (B, T, V) logits.

The hybrid replaces blocks ``ode_start`` .. ``ode_end`` by one ODE block integrated with
torchdiffeq's Euler method on ``linspace(0, 1, n_steps + 1)``: its field conditions the state
additively on an MLP embedding of t (Linear(1, D), SiLU, Linear(D, D)), applies attention + MLP in
parallel, and scales the result by a learned scalar initialised at 0.1.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MaskedAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, dropout: float):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(max_seq_len, max_seq_len)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        y = self.drop(F.softmax(scores, dim=-1)) @ v
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, T, D)))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


class PreLNBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MaskedAttention(d_model, n_heads, max_seq_len, dropout)
        self.mlp = FeedForward(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TimeConditionedField(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, dropout: float):
        super().__init__()
        self.time_embed = nn.Sequential(nn.Linear(1, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MaskedAttention(d_model, n_heads, max_seq_len, dropout)
        self.mlp = FeedForward(d_model, dropout)
        self.output_scale = nn.Parameter(torch.tensor(0.1))

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = x + self.time_embed(t.reshape(1, 1)).reshape(1, 1, -1)
        return self.output_scale * (self.attn(self.ln1(h)) + self.mlp(self.ln2(h)))


class SeedLM(nn.Module):
    """The seed's baseline (``ode_start=None``) or hybrid transformer."""

    def __init__(self, vocab_size: int, d_model: int = 256, n_heads: int = 4, n_layers: int = 6,
                 max_seq_len: int = 128, dropout: float = 0.1, ode_start: int | None = None, ode_end: int = 4,
                 n_steps: int = 4):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab_size, d_model), nn.Embedding(max_seq_len, d_model)
        block = lambda: PreLNBlock(d_model, n_heads, max_seq_len, dropout)  # noqa: E731
        if ode_start is None:
            self.early, self.field, self.late = nn.ModuleList(block() for _ in range(n_layers)), None, nn.ModuleList()
        else:
            self.early = nn.ModuleList(block() for _ in range(ode_start))
            self.field = TimeConditionedField(d_model, n_heads, max_seq_len, dropout)
            self.late = nn.ModuleList(block() for _ in range(n_layers - ode_end))
            self.register_buffer("times", torch.linspace(0, 1, n_steps + 1))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.early:
            x = block(x)
        if self.field is not None:
            from torchdiffeq import odeint

            x = odeint(self.field, x, self.times, method="euler")[-1]
        for block in self.late:
            x = block(x)
        return self.head(self.ln_f(x))


def seed_training_step(model: SeedLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """The seed's step: full logits, cross-entropy, backward, clip to norm 1, AdamW."""
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()
