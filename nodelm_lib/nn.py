"""Shared building blocks: causal self-attention, MLP, pre-LN block, time embedding.

Every model family is assembled from these, so a fix here (or a faster kernel) reaches all
of them. Attention uses ``F.scaled_dot_product_attention(is_causal=True)``: position i
attends to positions <= i only, which the causality tests check for every model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    r"""Multi-head causal self-attention.

    For heads h = 1..H with d_h = D / H:
    :math:`\mathrm{head}_h = \mathrm{softmax}(Q_h K_h^\top / \sqrt{d_h} + M) V_h`, with M the
    causal mask (0 where j <= i, -inf elsewhere), and the output ``W_O [head_1; ...; head_H]``.
    Q, K, V come from one fused (D, 3D) projection.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        # (B, T, D) -> (B, H, T, d_h)
        q, k, v = (z.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(B, T, D)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network ``W_2 GELU(W_1 x)`` with hidden size ``ratio * D``."""

    def __init__(self, d_model: int, ratio: int = 4, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.c_fc = nn.Linear(d_model, ratio * d_model, bias=bias)
        self.c_proj = nn.Linear(ratio * d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, bias)
        self.ln_2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, mlp_ratio, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def sinusoidal_features(t: torch.Tensor, dim: int, max_freq: float = 8.0) -> torch.Tensor:
    r"""Sinusoidal features of a scalar depth t: ``[sin(w_k t), cos(w_k t)]`` for k < dim/2.

    Frequencies w_k are geometric between 1 and ``max_freq`` rad per unit t. They are kept
    low on purpose: the field must be smooth in t on the solver's grid, or a few RK steps
    cannot resolve it (with frequencies up to 100, rk4 at 8 steps was no more accurate than
    Euler).
    """
    half = dim // 2
    freqs = torch.exp(torch.linspace(0.0, math.log(max_freq), half, device=t.device, dtype=torch.float32))
    angles = t.reshape(-1, 1).float() * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TimeEmbedding(nn.Module):
    """Map a scalar t to a D-dimensional vector: sinusoidal features -> Linear -> SiLU -> Linear."""

    def __init__(self, d_model: int, n_features: int = 32):
        super().__init__()
        self.n_features = n_features
        self.mlp = nn.Sequential(nn.Linear(n_features, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        feats = sinusoidal_features(t, self.n_features).to(self.mlp[0].weight.dtype)
        return self.mlp(feats).reshape(-1)  # (D,), broadcast over batch and positions


# --------------------------------------------------------------------------- output head + loss

# Rows per chunk so that one chunk of logits holds about 8M floats (32 MB): the full
# (B*T, V) logits of a GPT-2-vocabulary batch are ~400 MB, and allocating and freeing them
# every step dominated the step time on CPU.
CHUNK_LOGITS = 2**23


def _chunked_cross_entropy(h, weight, targets, chunk: int, with_grads: bool):
    r"""Mean cross-entropy of z = h W^T against ``targets`` and, if asked, its gradients.

    Per chunk of rows: loss += logsumexp(z) - z_y; and since the loss is a scalar, its
    gradients are formed at once: G = (softmax(z) - onehot(y)) / N, dL/dh = G W,
    dL/dW += G^T h. One logits buffer is reused for every chunk and all softmax work is in
    place: fresh (N, V) allocations cost more than the matmuls on CPU (page faults).
    """
    n, vocab = h.shape[0], weight.shape[0]
    acc = torch.promote_types(h.dtype, torch.float32)  # softmax and sums in >= float32
    h, weight = h.to(acc), weight.to(acc)
    total = torch.zeros((), dtype=acc, device=h.device)
    grad_h = torch.empty_like(h) if with_grads else None
    grad_w = torch.zeros_like(weight) if with_grads else None
    buf = torch.empty(min(chunk, n), vocab, dtype=acc, device=h.device)
    for start in range(0, n, chunk):
        hc, yc = h[start:start + chunk], targets[start:start + chunk]
        z = buf[: hc.shape[0]]
        torch.mm(hc, weight.t(), out=z)
        z_y = z.gather(1, yc[:, None]).squeeze(1)
        z_max = z.amax(dim=-1)
        z.sub_(z_max[:, None]).exp_()
        z_sum = z.sum(dim=-1)
        total += (z_sum.log() + z_max - z_y).sum()
        if with_grads:
            z.div_(z_sum[:, None] * n)  # softmax / N
            z[torch.arange(z.shape[0], device=z.device), yc] -= 1.0 / n
            torch.mm(z, weight, out=grad_h[start:start + chunk])
            grad_w.addmm_(z.t(), hc)
    return total / n, grad_h, grad_w


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper: forward computes the gradients, backward only scales them."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk):
        loss, grad_h, grad_w = _chunked_cross_entropy(h, weight, targets, chunk, with_grads=True)
        ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, grad_w * grad_out, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(h @ weight.T, targets)`` for h (N, D), weight (V, D), targets (N,),
    computed in row chunks so the (N, V) logits never exist at once."""
    chunk = chunk or max(1, CHUNK_LOGITS // weight.shape[0])
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(h, weight, targets, chunk)
    return _chunked_cross_entropy(h, weight, targets, chunk, with_grads=False)[0]
