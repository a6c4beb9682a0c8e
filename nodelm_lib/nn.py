"""Shared building blocks: causal self-attention, MLP, pre-LN block, time embedding.

Every model family is assembled from these, so a fix here (or a faster kernel) reaches all
of them. Attention uses ``F.scaled_dot_product_attention(is_causal=True)``: position i
attends to positions <= i only, which the causality tests check for every model.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------- decoding cache


class DecodeCache:
    r"""What incremental decoding keeps between forward passes: one slot per call site.

    A causal model evaluated on a fixed grid makes the same sequence of layer calls in every
    forward pass (blocks in order; for an ODE block, steps x stages of the field in the
    solver's order), and the call at a given place in that sequence computes, at position i,
    a value that depends on positions <= i only. So the k-th call of a pass can keep its
    state (attention keys and values, an SSM's last recurrent state, time-dependent weights
    that depend on t alone) in slot k and the next pass, fed only the new tokens, continues
    from it. ``length`` is the number of positions already processed.

    The model's ``forward(idx, cache=cache)`` activates the cache (``active_cache()``) for the
    duration of the pass and checks that the pass used every slot: a solver whose steps
    depend on the data (adaptive methods) would break the correspondence, and is refused
    before that by ``generate``.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity  # positions the K/V buffers hold (the model's max_seq_len)
        self.length = 0
        self._slots: list[dict] = []
        self._cursor = 0

    def slot(self) -> dict:
        """The next call site's state (a dict the layer owns)."""
        if self._cursor == len(self._slots):
            if self.length:
                raise RuntimeError("this forward pass made more layer calls than the one that filled the cache; "
                                   "incremental decoding needs a fixed call sequence (a fixed-step solver)")
            self._slots.append({})
        self._cursor += 1
        return self._slots[self._cursor - 1]

    @contextlib.contextmanager
    def step(self, n_new: int):
        """Activate the cache for one forward pass over ``n_new`` new positions."""
        if self.length + n_new > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.length} are used and "
                             f"{n_new} more were given: crop the context and start a new cache")
        self._cursor = 0
        token = _ACTIVE_CACHE.set(self)
        try:
            yield self
        finally:
            _ACTIVE_CACHE.reset(token)
        if self._cursor != len(self._slots):
            raise RuntimeError(f"this forward pass made {self._cursor} layer calls, the cache holds "
                               f"{len(self._slots)}: the call sequence changed between passes")
        self.length += n_new


_ACTIVE_CACHE: contextvars.ContextVar[DecodeCache | None] = contextvars.ContextVar("nodelm_decode_cache", default=None)


def active_cache() -> DecodeCache | None:
    """The cache of the forward pass in progress, or None outside incremental decoding."""
    return _ACTIVE_CACHE.get()


def cached_per_call(compute: Callable[[], object]) -> object:
    """``compute()``, or while decoding with a cache, its value from the first pass at this
    call site: for weights that depend on t alone, the same at a call site in every pass."""
    cache = active_cache()
    if cache is None:
        return compute()
    slot = cache.slot()
    if "value" not in slot:
        slot["value"] = compute()
    return slot["value"]


# --------------------------------------------------------------------------- weights on a time grid


class TimeGrid:
    r"""The times at which a fixed-step solve will evaluate its field, so that every weight that
    depends on t alone is generated for all of them at once: one batched call per layer per
    forward pass instead of one per field evaluation.

    Why: ``node``'s hypernetwork forms W(t) = B + sum_k e_k(t) A_k from E full-size basis
    matrices. Per evaluation that reads all E of them forward and writes (and accumulates) a
    full-size gradient for each backward; for S evaluations at once it is one (S x E) by
    (E x in*out) product each way. The time-indexed gates batch the same way, with S times
    fewer small kernels. Opened by ``ODEBlock`` for one solve (``time_grid``); a layer's
    batched weights are memoised on the grid, so they live as long as that pass's graph.
    """

    def __init__(self, times: torch.Tensor):
        self.times = times  # (S,)
        self._memo: dict[int, object] = {}

    def memo(self, owner: object, compute: Callable[[], object]) -> object:
        """``compute()`` once per grid for ``owner`` (a layer), then the stored value."""
        key = id(owner)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def point(self, t: torch.Tensor, owner: object, inputs_at: Callable[[torch.Tensor], torch.Tensor]) -> "GridPoint":
        """t as a point of this grid, carrying ``inputs_at(times)`` (owner's batched time code
        or trunk output, (S, ...)). t is found as the nearest grid time on its device, without
        a host synchronisation."""
        index = (self.times - t.to(self.times)).abs().argmin()
        return GridPoint(self, index, self.memo(owner, lambda: inputs_at(self.times)))


class GridPoint:
    """A field evaluation's time on a ``TimeGrid``: what time-dependent layers receive in place
    of the time code (node) or the trunk output h(t) (ti_*) while a grid is open."""

    def __init__(self, grid: TimeGrid, index: torch.Tensor, inputs: torch.Tensor):
        self.grid, self.index, self.inputs = grid, index, inputs

    @property
    def value(self) -> torch.Tensor:
        """The input at this time alone (what the layer would get without a grid)."""
        return self.inputs[self.index]

    def take(self, layer: nn.Module, weights_at: Callable[[torch.Tensor], tuple]) -> tuple:
        """``layer``'s weights at this time: ``weights_at(inputs)`` for every grid time, computed
        once per grid, indexed at this one (a tuple of (S, ...) tensors or None)."""
        batched = self.grid.memo(layer, lambda: weights_at(self.inputs))
        return tuple(None if w is None else w[self.index] for w in batched)


_ACTIVE_GRID: contextvars.ContextVar[TimeGrid | None] = contextvars.ContextVar("nodelm_time_grid", default=None)


def active_grid() -> TimeGrid | None:
    """The time grid of the solve in progress, or None."""
    return _ACTIVE_GRID.get()


@contextlib.contextmanager
def time_grid(times: torch.Tensor):
    """Open a ``TimeGrid`` over ``times`` for the duration of one solve."""
    token = _ACTIVE_GRID.set(TimeGrid(times))
    try:
        yield
    finally:
        _ACTIVE_GRID.reset(token)


def time_dependent(value, layer: nn.Module, weights_at: Callable[[torch.Tensor], tuple]) -> tuple:
    """``layer``'s weights for ``value``: a ``GridPoint`` (batched over the grid's times) or a
    single time's code / trunk output (batched over one time; cached per call site while
    decoding). ``weights_at`` maps (S, ...) inputs to a tuple of (S, ...) weights."""
    if isinstance(value, GridPoint):
        return value.take(layer, weights_at)
    return cached_per_call(lambda: tuple(None if w is None else w[0] for w in weights_at(value[None])))


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
        y = causal_attention(self.c_attn(x), self.n_heads, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y))


def causal_attention(qkv: torch.Tensor, n_heads: int, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal multi-head attention from fused projections ``qkv`` (B, T, 3D) to (B, T, D),
    before the output projection. Shared by every attention layer, fixed or time-dependent.

    While decoding with a ``DecodeCache``, the T new positions attend to the cached keys and
    values of this call site as well as to each other (causally)."""
    B, T, D3 = qkv.shape
    D = D3 // 3
    # (B, T, D) -> (B, H, T, d_h)
    q, k, v = (z.view(B, T, n_heads, D // n_heads).transpose(1, 2) for z in qkv.split(D, dim=2))
    mask, is_causal = None, True
    cache = active_cache()
    if cache is not None:
        k, v = _extend_kv(cache.slot(), k, v, cache.length, cache.capacity)
        past = cache.length
        if past and T == 1:  # one new query sees every key
            is_causal = False
        elif past:  # query i (position past + i) sees keys 0 .. past + i
            mask, is_causal = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(past), False
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p)
    return y.transpose(1, 2).contiguous().view(B, T, D)


def _extend_kv(slot: dict, k: torch.Tensor, v: torch.Tensor, past: int, capacity: int):
    """Write the new keys/values at positions past .. past + T into the slot's buffers
    (allocated once, at the cache's capacity) and return views of everything so far."""
    if "k" not in slot:
        B, H, _, dh = k.shape
        slot["k"], slot["v"] = (k.new_empty(B, H, capacity, dh) for _ in range(2))
    end = past + k.shape[2]
    slot["k"][:, :, past:end] = k
    slot["v"][:, :, past:end] = v
    return slot["k"][:, :, :end], slot["v"][:, :, :end]


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


class Block(nn.Module):
    """Pre-LN transformer block: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``.

    ``parallel=True`` is the parallel form (GPT-J, PaLM) ``x + Attn(LN_1(x)) + MLP(LN_2(x))``:
    one Euler step of the continuous-depth models' field, which is what ``node.evaluate_at``
    exports into.
    """

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float = 4, dropout: float = 0.0, bias: bool = True,
                 parallel: bool = False):
        super().__init__()
        self.parallel = parallel
        self.ln_1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, bias)
        self.ln_2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, mlp_ratio, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            return x + self.attn(self.ln_1(x)) + self.mlp(self.ln_2(x))
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


# --------------------------------------------------------------------------- time-dependent layers
#
# Two ways to make a weight a function of depth t, used by the continuous-depth models:
#   HyperLinear      W(t) = B + sum_k e_k(t) A_k          (node: Tong et al. 2025)
#   ModulatedLinear  W(t) = W_base * sigmoid(g(t))        (ti_mlp, ti_ssm)
# Both take a precomputed time code (a vector that depends on t only) next to x, so that
# the code is computed once per field evaluation and not once per layer.


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
        weight = self.weight + (e @ self.weight_basis.flatten(1)).view(-1, *self.weight.shape)
        bias = None if self.bias is None else self.bias + e @ self.bias_basis
        return weight, bias

    def forward(self, x: torch.Tensor, code) -> torch.Tensor:
        return F.linear(x, *time_dependent(code, self, self.weights_at))


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


class StaticLinear(nn.Linear):
    """``nn.Linear`` with ``ModulatedLinear``'s call signature ``(x, h)``, ignoring h: the
    time-free stand-in that lets one layer class (``SelectiveSSM``) serve both the
    time-indexed model and its discrete control."""

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


class TimeAttention(nn.Module):
    """Causal self-attention whose two projections are time-dependent layers made by
    ``linear(in_features, out_features)``; ``forward(x, code)`` passes the time code on."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, linear):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.c_attn = linear(d_model, 3 * d_model)
        self.c_proj = linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        y = causal_attention(self.c_attn(x, code), self.n_heads, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y, code))


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
