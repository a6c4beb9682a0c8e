"""Time-dependent layers of the continuous-depth models: time codes and the time embedding,
hypernetwork (``HyperLinear``, ``TimeLayerNorm``) and gated (``TimeModulation``,
``ModulatedLinear``) weights, and attention / MLP built from them. Each layer's ``frozen_at``
gives its weights at one time input, for fast decoding (``frozen``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decode_cache import cached_per_call, compiling
from .frozen import FrozenAttention, freeze_layer
from .layers import causal_attention, mlp_hidden
from .losses import autocast_dtype
from .time_grid import active_grid, time_dependent


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


def time_code(t: torch.Tensor, n_features: int) -> torch.Tensor:
    """phi(t) = [sin(w_k t), cos(w_k t), t]: the sinusoidal features with t itself appended
    (so that a network reading phi can also be monotone in t). Shape (n_features + 1,)."""
    return time_codes(t.reshape(1), n_features)[0]


def time_codes(times: torch.Tensor, n_features: int) -> torch.Tensor:
    """``time_code`` of each of S times: (S, n_features + 1)."""
    times = times.reshape(-1, 1).float()
    return torch.cat([sinusoidal_features(times, n_features), times], dim=-1)


class TimeEmbedding(nn.Module):
    """Map a scalar t to a D-dimensional vector: sinusoidal features -> Linear -> SiLU -> Linear."""

    def __init__(self, d_model: int, n_features: int = 32):
        super().__init__()
        self.n_features = n_features
        self.mlp = nn.Sequential(nn.Linear(n_features, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # depends on t alone: while decoding, computed once per call site (solver stage)
        return cached_per_call(lambda: self.embed(t))

    def embed(self, t: torch.Tensor) -> torch.Tensor:
        feats = sinusoidal_features(t, self.n_features).to(self.mlp[0].weight.dtype)
        return self.mlp(feats).reshape(-1)  # (D,), broadcast over batch and positions


# Two ways to make a weight a function of depth t, used by the continuous-depth models:
#   HyperLinear      W(t) = B + sum_k e_k(t) A_k          (node: Tong et al. 2025)
#   ModulatedLinear  W(t) = W_base * sigmoid(g(t))        (ti_mlp, ti_ssm)
# Both take a precomputed time code (a vector that depends on t only) next to x, so that
# the code is computed once per field evaluation and not once per layer.


def basis_product(e: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    r"""``e @ basis`` for ``HyperLinear``: (S, E) coefficients times the (E, N) flattened basis
    matrices A_k (N = in * out), with the product and its basis gradient :math:`e^\top G` split
    into blocks of basis rows on a CPU.

    Why: S (the grid's times, ~4) and E (~64) are small and N large, and MKL runs these skinny
    products several times slower than memory allows; in blocks, about twice as fast (the
    measurement is on the docs' Benchmarks page). The gradient's blocks split its output rows (each row still one product, the
    same numbers); the forward's accumulate the sum over k in partial sums of
    ``FORWARD_BLOCK`` terms (a reordered float sum). Elsewhere (GPU, autocast, another dtype,
    ``torch.compile``, ``torch.func`` transforms) it is the one product.
    """
    if not _blocked_products_apply(e, basis):
        return e @ basis
    if torch.is_grad_enabled() and (e.requires_grad or basis.requires_grad):
        return _BlockedBasisProduct.apply(e, basis)
    return _blocked_product(e, basis)


FORWARD_BLOCK, GRADIENT_BLOCK = 16, 8  # basis rows per product (forward: 8-32 alike; gradient: best of 1-64)


def _blocked_products_apply(e: torch.Tensor, basis: torch.Tensor) -> bool:
    """Where ``basis_product`` blocks: eager CPU products in one float dtype (bf16 goes through
    oneDNN, and functorch transforms cannot run the autograd Function)."""
    return (basis.device.type == "cpu" and e.dtype == basis.dtype and basis.dtype in (torch.float32, torch.float64)
            and autocast_dtype(basis.device) is None and not compiling()
            and not torch._C._are_functorch_transforms_active())


def _blocked_product(e: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """e @ basis, summed over k in blocks of ``FORWARD_BLOCK``."""
    out = e[:, :FORWARD_BLOCK] @ basis[:FORWARD_BLOCK]
    for k in range(FORWARD_BLOCK, basis.shape[0], FORWARD_BLOCK):  # addmm with out=, not addmm_: the
        torch.addmm(out, e[:, k:k + FORWARD_BLOCK], basis[k:k + FORWARD_BLOCK], out=out)  # FLOP counter sees it
    return out


def _blocked_basis_gradient(e: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """e^T grad, (E, N), ``GRADIENT_BLOCK`` rows per product."""
    e_t = e.t().contiguous()
    out = grad.new_empty(e_t.shape[0], grad.shape[1])
    for k in range(0, e_t.shape[0], GRADIENT_BLOCK):
        torch.mm(e_t[k:k + GRADIENT_BLOCK], grad, out=out[k:k + GRADIENT_BLOCK])
    return out


class _BlockedBasisProduct(torch.autograd.Function):
    """``basis_product``'s blocked products with autograd: grad_e = G basis^T (one product),
    grad_basis = e^T G (blocked)."""

    @staticmethod
    def forward(ctx, e: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(e, basis)
        return _blocked_product(e, basis)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        e, basis = ctx.saved_tensors
        grad_e = grad @ basis.t() if ctx.needs_input_grad[0] else None
        grad_basis = _blocked_basis_gradient(e, grad) if ctx.needs_input_grad[1] else None
        return grad_e, grad_basis


class HyperLinear(nn.Module):
    r"""Linear layer whose weight and bias are generated from t (Tong et al., ICLR 2025).

    .. math::
        e(t) = \mathrm{MLP}(\phi(t)) \in \mathbb{R}^E, \quad
        W(t) = B + \sum_{k=1}^{E} e_k(t) A_k, \quad b(t) = b_0 + \sum_k e_k(t) a_k

    with :math:`\phi(t)` the time code (sinusoidal features and t), a small per-layer MLP
    ``code_dim -> hidden -> E`` and E full-size basis matrices A_k (``n_basis``) plus the
    static B. Generating W(t) costs E * in * out multiply-adds per evaluation, negligible
    next to applying it to B * T tokens.
    """

    owns_init = True  # CausalLM.init_weights calls reset_parameters instead of its own init

    def __init__(self, in_features: int, out_features: int, n_basis: int, code_dim: int, hidden: int,
                 bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.coefficients = nn.Sequential(nn.Linear(code_dim, hidden), nn.SiLU(), nn.Linear(hidden, n_basis))
        self.weight = nn.Parameter(torch.empty(out_features, in_features))  # B
        self.weight_basis = nn.Parameter(torch.empty(n_basis, out_features, in_features))  # A_k
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.bias_basis = nn.Parameter(torch.zeros(n_basis, out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """B ~ N(0, std); A_k ~ N(0, std / sqrt(E)) so that W(t) starts near std whatever E;
        biases zero; the coefficient MLP keeps PyTorch's default init, so e(t) = O(1) and
        every A_k gets a gradient from the first step."""
        nn.init.normal_(self.weight, std=std)
        nn.init.normal_(self.weight_basis, std=std / math.sqrt(self.weight_basis.shape[0]))
        if self.bias is not None:
            nn.init.zeros_(self.bias)
            nn.init.zeros_(self.bias_basis)
        for layer in self.coefficients:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def weight_at(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W(t), b(t)) for the time code of t."""
        weight, bias = self.weights_at(code[None])
        return weight[0], None if bias is None else bias[0]

    def weights_at(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W(t_s), b(t_s)) for S time codes (S, F): (S, out, in) and (S, out), one product."""
        e = self.coefficients(codes.to(self.weight.dtype))  # (S, E)
        weight = self.weight + basis_product(e, self.weight_basis.flatten(1)).view(-1, *self.weight.shape)
        bias = None if self.bias is None else self.bias + e @ self.bias_basis
        return weight, bias

    def forward(self, x: torch.Tensor, code) -> torch.Tensor:
        return F.linear(x, *time_dependent(code, self, self.weights_at))

    def frozen_at(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight_at(code)


class TimeLayerNorm(nn.Module):
    r"""LayerNorm with a time-dependent affine map: scale :math:`\gamma + F\phi(t)` and shift
    :math:`\beta + G\phi(t)`, with F and G zero-initialised so it starts as a plain LayerNorm."""

    def __init__(self, d_model: int, code_dim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.weight_mod = nn.Parameter(torch.zeros(d_model, code_dim))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None
        self.bias_mod = nn.Parameter(torch.zeros(d_model, code_dim)) if bias else None

    def weight_at(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scale, shift) for the time code of t."""
        weight, bias = self.weights_at(code[None])
        return weight[0], None if bias is None else bias[0]

    def weights_at(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scale, shift) for S time codes (S, F): (S, D) each."""
        codes = codes.to(self.weight.dtype)
        weight = self.weight + codes @ self.weight_mod.t()
        bias = None if self.bias is None else self.bias + codes @ self.bias_mod.t()
        return weight, bias

    def forward(self, x: torch.Tensor, code) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), *time_dependent(code, self, self.weights_at))

    def frozen_at(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight_at(code)


class TimeModulation(nn.Module):
    r"""The shared trunk of the time-indexed models' g(t): :math:`h(t) = \mathrm{SiLU}(W\phi(t) + c)`.

    One trunk per field; each ``ModulatedLinear`` adds its own linear head on h(t), so g is a
    two-layer MLP on the time code whose first layer is shared by all weights.
    """

    owns_init = True

    def __init__(self, n_features: int, hidden: int):
        super().__init__()
        self.n_features = n_features
        self.net = nn.Sequential(nn.Linear(n_features + 1, hidden), nn.SiLU())

    def reset_parameters(self, std: float = 0.02) -> None:
        """PyTorch's default init (``std`` unused): h(t) must vary with t from the start."""
        self.net[0].reset_parameters()

    def forward(self, t: torch.Tensor):
        """h(t) (H,); while a ``TimeGrid`` is open, a ``GridPoint`` carrying h at every grid time."""
        grid = active_grid()
        if grid is not None:
            return grid.point(t, self, self.at_times)
        # depends on t alone: while decoding, computed once per call site (solver stage)
        return cached_per_call(lambda: self.at_times(t.reshape(1))[0])

    def at_times(self, times: torch.Tensor) -> torch.Tensor:
        """h(t_s) for S times: (S, H)."""
        return self.net(time_codes(times, self.n_features).to(self.net[0].weight.dtype))


class ModulatedLinear(nn.Module):
    r"""Linear layer with shared base weights gated in time (the time-indexed models):

    .. math::
        W_{\mathrm{eff}}(t) = W_{\mathrm{base}} \odot \sigma\big(r(t)\,\mathbf{1}^\top
        + \mathbf{1}\,c(t)^\top\big), \qquad r(t) = R\,h(t),\; c(t) = C\,h(t)

    g(t) has row + column structure: a logit per output row and one per input column, from
    linear heads R (out x H) and C (in x H) on the trunk's h(t). Why this structure: a full
    g(t) needs an out x in output layer per weight, i.e. Tong's hypernetwork cost for a
    strictly less expressive (multiplicative) family; a row-only gate equals gating the
    layer's outputs (FiLM on activations) and cannot change which input directions a weight
    reads; a scalar gate is only a per-layer step size. Row + column gates select both inputs
    and outputs for H (in + out) parameters per weight and keep |W_eff| <= |W_base|
    elementwise. sigmoid(r_o + c_i) does not factor, so W_eff is formed at every evaluation
    (in * out operations, small next to the B * T-row matmul). The bias is not modulated.
    """

    owns_init = True

    def __init__(self, in_features: int, out_features: int, hidden: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.row_gate = nn.Linear(hidden, out_features)
        self.col_gate = nn.Linear(hidden, in_features, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """W_base ~ N(0, 2 std): the gate starts near sigmoid(0) = 1/2, so W_eff starts near the
        nanoGPT scale std. The heads are small but not zero (zero heads would leave the
        trunk without gradient)."""
        nn.init.normal_(self.weight, std=2 * std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        for head in (self.row_gate, self.col_gate):
            nn.init.normal_(head.weight, std=0.02)
        nn.init.zeros_(self.row_gate.bias)

    def weight_at(self, h: torch.Tensor) -> torch.Tensor:
        """W_eff(t) for the trunk output h(t)."""
        return self.weights_at(h[None])[0][0]

    def weights_at(self, hs: torch.Tensor) -> tuple[torch.Tensor]:
        """(W_eff(t_s),) for S trunk outputs (S, H): (S, out, in)."""
        logits = self.row_gate(hs)[:, :, None] + self.col_gate(hs)[:, None, :]
        return (self.weight * torch.sigmoid(logits),)

    def forward(self, x: torch.Tensor, h) -> torch.Tensor:
        return F.linear(x, time_dependent(h, self, self.weights_at)[0], self.bias)

    def frozen_at(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight_at(h), self.bias


class StaticLinear(nn.Linear):
    """``nn.Linear`` with ``ModulatedLinear``'s call signature ``(x, h)``, ignoring h: the
    time-free stand-in that lets one layer class (``SelectiveSSM``) serve both the
    time-indexed model and its discrete control."""

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)

    def frozen_at(self, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight, self.bias


class TimeAttention(nn.Module):
    """Causal self-attention whose two projections are time-dependent layers made by
    ``linear(in_features, out_features)``; ``forward(x, code)`` passes the time code on.
    ``rope``: rotary positions, as in ``layers.CausalSelfAttention``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, linear, rope: bool = False):
        super().__init__()
        self.n_heads = n_heads
        self.rope = rope
        self.dropout = dropout
        self.c_attn = linear(d_model, 3 * d_model)
        self.c_proj = linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        y = causal_attention(self.c_attn(x, code), self.n_heads, self.dropout if self.training else 0.0, self.rope)
        return self.resid_dropout(self.c_proj(y, code))

    def frozen_at(self, code: torch.Tensor) -> FrozenAttention:
        qkv, proj = freeze_layer(self.c_attn, code), freeze_layer(self.c_proj, code)
        return FrozenAttention(self.n_heads, qkv, proj, self.rope)


class TimeMLP(nn.Module):
    """``W_2(t) GELU(W_1(t) x)`` with time-dependent layers made by ``linear``."""

    def __init__(self, d_model: int, ratio: float, dropout: float, linear):
        super().__init__()
        hidden = mlp_hidden(d_model, ratio)
        self.c_fc = linear(d_model, hidden)
        self.c_proj = linear(hidden, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x, code)), code))

    def frozen_at(self, code: torch.Tensor) -> tuple:
        return freeze_layer(self.c_fc, code), freeze_layer(self.c_proj, code)
