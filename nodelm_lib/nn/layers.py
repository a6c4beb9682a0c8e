"""Standard transformer layers: causal self-attention (with the decode cache's keys and
values), the MLP and the pre-LN block.

Every model family is assembled from these, so a fix here (or a faster kernel) reaches all
of them. Attention uses ``F.scaled_dot_product_attention(is_causal=True)``: position i
attends to positions <= i only, which the causality tests check for every model. With
``rope=True`` it rotates queries and keys by their positions first (``rope_cos_sin``,
``apply_rope``): a model with ``position="rope"`` knows positions through that alone.
Attention, the MLP and the block also say how they freeze for fast decoding (``frozen``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decode_cache import active_cache
from .frozen import Frozen, FrozenAttention, freeze_layer

# the base of the rotary frequencies theta_i = base^(-2i / d_h), as in RoFormer, GPT-NeoX and LLaMA
ROPE_BASE = 10000.0


class CausalSelfAttention(nn.Module):
    r"""Multi-head causal self-attention.

    For heads h = 1..H with d_h = D / H:
    :math:`\mathrm{head}_h = \mathrm{softmax}(Q_h K_h^\top / \sqrt{d_h} + M) V_h`, with M the
    causal mask (0 where j <= i, -inf elsewhere), and the output ``W_O [head_1; ...; head_H]``.
    Q, K, V come from one fused (D, 3D) projection. With ``rope=True``, Q_h and K_h are rotated
    by their positions first (``apply_rope``).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, rope: bool = False):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.rope = rope
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = causal_attention(self.c_attn(x), self.n_heads, self.dropout if self.training else 0.0, self.rope)
        return self.resid_dropout(self.c_proj(y))

    def frozen_at(self, time_input=None) -> FrozenAttention:
        return FrozenAttention(self.n_heads, freeze_layer(self.c_attn), freeze_layer(self.c_proj), self.rope)


def causal_attention(qkv: torch.Tensor, n_heads: int, dropout_p: float = 0.0, rope: bool = False) -> torch.Tensor:
    """Causal multi-head attention from fused projections ``qkv`` (B, T, 3D) to (B, T, D),
    before the output projection. Shared by every attention layer, fixed or time-dependent.
    ``rope``: rotate queries and keys by their positions (``apply_rope``).

    While decoding with a ``DecodeCache``, the T new positions attend to the cached keys and
    values of this call site as well as to each other (causally); they are positions
    ``cache.length`` onwards, which is where rope rotates them to."""
    cache = active_cache()
    if cache is None:
        return attend(qkv, n_heads, dropout_p=dropout_p, rope=rope)
    return attend(qkv, n_heads, cache.slot(), cache.length, cache.capacity, dropout_p, rope)


def attend(qkv: torch.Tensor, n_heads: int, slot: dict | None = None, past: int = 0, capacity: int = 0,
           dropout_p: float = 0.0, rope: bool = False) -> torch.Tensor:
    """``causal_attention`` with its decoding state explicit: with a ``slot``, the keys and values
    of ``past`` earlier positions are read from it (buffers of ``capacity`` positions) and the
    new ones written to it (``fast_decode`` calls this directly). The T new positions are
    ``past .. past + T - 1``: with ``rope`` their queries and keys are rotated to those absolute
    positions, and the cache keeps rotated keys, so a cached key never needs rotating again."""
    B, T, D3 = qkv.shape
    D = D3 // 3
    H, dh = n_heads, D // n_heads
    # (B, T, 3D) -> (3, B, H, T, d_h): q, k, v as views, in three ops whatever the decoding state
    q, k, v = qkv.view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4).unbind(0)
    if rope:
        cos, sin = _rope_tables(slot, past, T, capacity, dh, q)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    mask, is_causal = None, True
    if slot is not None:
        # the new keys and values as (2, B, H, T, d_h): a view of qkv, unless rope made new keys
        new = torch.stack((k, v)) if rope else qkv.view(B, T, 3, H, dh).narrow(2, 1, 2).permute(2, 0, 3, 1, 4)
        k, v = _extend_kv(slot, new, past, capacity)
        if past and T == 1:  # one new query sees every key
            is_causal = False
        elif past:  # query i (position past + i) sees keys 0 .. past + i
            mask, is_causal = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(past), False
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        if mask is None and is_causal:
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        y = explicit_attention(q, k, v, mask, dropout_p)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p)
    return y.transpose(1, 2).contiguous().view(B, T, D)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None,
                       dropout_p: float = 0.0) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_h) + M) v`` as matrix products, with M -inf where ``allowed``
    (bool, broadcast over the scores) is False; what ``attend`` runs on a CPU in bf16 / fp16.

    Why: torch's CPU flash-attention kernel in bf16 (torch 2.13) takes 3-5x the time of these
    three ops in its forward + backward (``bench/attention.py``), while in float32 it is the
    faster of the two. The scores are rounded to bf16 before the softmax, which computes in
    float32 inside and rounds its output, as flash attention rounds its weights before ``@ v``."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    return weights @ v


def _extend_kv(slot: dict, new: torch.Tensor, past: int, capacity: int):
    """Write the new keys and values ``new`` (2, B, H, T, d_h) at positions past .. past + T of
    the slot's buffer (2, B, H, capacity, d_h), allocated once, in one copy; return views of the
    keys and values so far."""
    _, B, H, T, dh = new.shape
    if "kv" not in slot:
        slot["kv"] = new.new_empty(2, B, H, capacity, dh)
    kv = slot["kv"]  # narrow / copy_ / unbind: single ops, where slice indexing parses in Python
    kv.narrow(3, past, T).copy_(new)
    return kv.narrow(3, 0, past + T).unbind(0)


def _rope_tables(slot: dict | None, past: int, T: int, capacity: int, dh: int, like: torch.Tensor):
    """``rope_cos_sin`` for positions past .. past + T - 1. While decoding, views of tables over
    the slot's ``capacity`` positions made on its first pass (the same numbers): a decoded token
    then costs two views here, not a dozen small ops per call site."""
    if slot is None:
        return rope_cos_sin(past, T, dh, like.device, like.dtype)
    if "rope" not in slot:
        slot["rope"] = rope_cos_sin(0, capacity, dh, like.device, like.dtype)
    cos, sin = slot["rope"]
    return cos.narrow(0, past, T), sin.narrow(0, past, T)


def rope_cos_sin(start: int, length: int, head_dim: int, device=None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    r"""cos and sin of the rotary angles :math:`p\,\theta_i` for the positions p = start ..
    start + length - 1 and the frequencies :math:`\theta_i = 10000^{-2i/d_h}`, i < d_h / 2:
    two (length, d_h / 2) tensors in ``dtype``.

    Computed for the positions asked for, not read from a table, so that no length is a limit.
    The angles are formed in float64 (float32 on MPS, which has none): an angle grows with its
    position, and so does its float32 rounding error (~1e-3 rad by position 16k)."""
    exact = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
    freqs = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=exact) / head_dim)
    angles = torch.arange(start, start + length, device=device, dtype=exact)[:, None] * freqs
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r"""Rotary position embedding of x (..., T, d_h) with ``rope_cos_sin``'s (T, d_h / 2) tables:
    each pair (x_i, x_{i + d_h/2}) is rotated by the angle of its position and frequency i
    (the half-split layout of GPT-NeoX and LLaMA in HF).

    Rotations of q at position m and k at position n give
    :math:`(R_m q)^\top R_n k = q^\top R_{n-m} k`: attention scores see only the relative
    position n - m, and a key rotated once, when it is cached, stays right for every later query."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def mlp_hidden(d_model: int, ratio: float) -> int:
    """Hidden size of an MLP of width ratio ``ratio`` (rounded: ratios need not be integers)."""
    return max(1, round(ratio * d_model))


class MLP(nn.Module):
    """Position-wise feed-forward network ``W_2 GELU(W_1 x)`` with hidden size ``ratio * D``."""

    def __init__(self, d_model: int, ratio: float = 4, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        hidden = mlp_hidden(d_model, ratio)
        self.c_fc = nn.Linear(d_model, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))

    def frozen_at(self, time_input=None) -> tuple:
        return freeze_layer(self.c_fc), freeze_layer(self.c_proj)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``.

    ``parallel=True`` is the parallel form (GPT-J, PaLM) ``x + Attn(LN_1(x)) + MLP(LN_2(x))``:
    one Euler step of the continuous-depth models' field, which is what ``node.evaluate_at``
    exports into. ``rope``: rotary positions in its attention (``CausalSelfAttention``).
    """

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float = 4, dropout: float = 0.0, bias: bool = True,
                 parallel: bool = False, rope: bool = False):
        super().__init__()
        self.parallel = parallel
        self.ln_1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, bias, rope)
        self.ln_2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, mlp_ratio, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            return x + self.attn(self.ln_1(x)) + self.mlp(self.ln_2(x))
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def freeze(self) -> Frozen:
        """This block with its weights as plain tensors, for fast decoding (``frozen``)."""
        return Frozen("parallel" if self.parallel else "sequential", freeze_layer(self.ln_1), freeze_layer(self.attn),
                      freeze_layer(self.ln_2), freeze_layer(self.mlp))
