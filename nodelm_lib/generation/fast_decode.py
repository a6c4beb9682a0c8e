"""Fast incremental decoding: every call site's weights frozen once, then plain functions per token.

A token decoded through the modules (``model(idx, cache=cache)``) at the sizes of notebook 06
(d = 64, 4 layers or steps) does ~0.1 MFLOP of arithmetic per layer and ~50 module calls,
dropout calls in eval, solver bookkeeping and per-call weight lookups: its cost is Python and
dispatch, ~1 ms per token, within 5x of recomputing the whole window.

For a fixed-step solve every weight of a continuous-depth model depends on t alone, so at a
given call site (a discrete block, or one (step, stage) evaluation of an ODE field) it is the
same in every decoding pass. ``FastDecoder`` freezes each call site on the first pass (``Frozen``:
the layer norms, attention projections and mixer of that evaluation as plain tensors, the
time-dependent ones evaluated at that stage's t exactly as the module would) and from then on
runs the new positions through ``F.layer_norm`` / ``F.linear`` / ``layers.attend`` / the SSM
scan on them. What stays the module path's: the embedding, the solver loop
(``Solver.march``, so stage times and combinations are the solver's own arithmetic), the
KV / SSM-state slots (``DecodeCache``, one per evaluation in call order), and the ops of each
layer in their order, so the logits equal the module path's to rounding (the tests compare
both, and both with recomputing the window).

It knows the model families of this library by exact type (``supports``); anything else (a
subclass, another field, extra forward arguments) decodes through the modules, as before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from nodelm_lib.models.common import CausalLM, ODEBlock
from nodelm_lib.models.gpt import GPT
from nodelm_lib.models.hybrid import HybridField, HybridODEBlock, HybridODETransformer
from nodelm_lib.models.node import NeuralODETransformer, NodeField
from nodelm_lib.models.ssm import SelectiveSSM, SSMBlock, SSMTransformer
from nodelm_lib.models.time_indexed import TimeIndexedField, TimeIndexedMLP, TimeIndexedSSM
from nodelm_lib.nn.decode_cache import DecodeCache
from nodelm_lib.nn.layers import MLP, Block, attend
from nodelm_lib.nn.time_layers import HyperLinear, ModulatedLinear, TimeLayerNorm, TimeMLP

Weights = tuple  # (weight, bias or None) of a linear layer or a layer norm


@dataclass
class FrozenSSM:
    """A ``SelectiveSSM`` at one t: its three projections, A(t) and D(t), and its scan."""

    in_proj: Weights
    x_proj: Weights
    out_proj: Weights
    A: torch.Tensor
    D: torch.Tensor
    scan: Callable


@dataclass
class Frozen:
    """One evaluation of a block or an ODE field with every weight fixed.

    ``form``: ``"sequential"`` (x + Attn(LN_1 x), then + Mixer(LN_2 .)), ``"parallel"``
    (x + Attn(LN_1 x) + Mixer(LN_2 x)), or ``"field"``: scale * (Attn(LN_1 h) + Mixer(LN_2 h))
    with h = x + shift_1 + shift_2 ... (no residual: the solver adds it). ``mixer`` is an MLP's
    (c_fc, c_proj) weights or a ``FrozenSSM``. ``rope``: the attention rotates queries and keys
    (``layers.attend``).
    """

    form: str
    n_heads: int
    ln_1: Weights
    qkv: Weights
    proj: Weights
    ln_2: Weights
    mixer: tuple[Weights, Weights] | FrozenSSM
    shifts: tuple[torch.Tensor, ...] = field(default_factory=tuple)
    scale: torch.Tensor | None = None
    rope: bool = False


# --------------------------------------------------------------------------- freezing


def _linear(layer: nn.Module, time_input) -> Weights:
    """(W, b) of a linear layer at the time code / trunk output ``time_input`` (ignored if static)."""
    if isinstance(layer, HyperLinear):
        return layer.weight_at(time_input)
    if isinstance(layer, ModulatedLinear):
        return layer.weight_at(time_input), layer.bias
    return layer.weight, layer.bias  # nn.Linear, StaticLinear


def _norm(layer: nn.Module, code) -> Weights:
    return layer.weight_at(code) if isinstance(layer, TimeLayerNorm) else (layer.weight, layer.bias)


def _mixer(layer: nn.Module, time_input) -> tuple[Weights, Weights] | FrozenSSM:
    if isinstance(layer, SelectiveSSM):
        return FrozenSSM(_linear(layer.in_proj, time_input), _linear(layer.x_proj, time_input),
                         _linear(layer.out_proj, time_input), layer.A_at(time_input), layer.D_at(time_input),
                         layer.scan())
    return _linear(layer.c_fc, time_input), _linear(layer.c_proj, time_input)  # MLP, TimeMLP


def freeze_block(block: Block | SSMBlock) -> Frozen:
    """A discrete block (``gpt``, the hybrid's outer layers, ``ssm``)."""
    mixer = block.mlp if isinstance(block, Block) else block.mixer
    return Frozen("parallel" if block.parallel else "sequential", block.attn.n_heads, _norm(block.ln_1, None),
                  _linear(block.attn.c_attn, None), _linear(block.attn.c_proj, None), _norm(block.ln_2, None),
                  _mixer(mixer, None), rope=block.attn.rope)


def freeze_field(f: nn.Module, t: torch.Tensor, control: torch.Tensor | None, device) -> Frozen:
    """An ODE field at the stage time t, its time inputs computed as its ``forward`` computes them."""
    shifts, scale = (), None
    if isinstance(f, HybridField):
        time_input, shifts, scale = None, (f.time_embed.embed(t),), f.scale
        if control is not None:
            shifts += (f.control_proj(control).unsqueeze(1),)
    elif isinstance(f, NodeField):
        time_input = f.code_at(t, device)
    else:  # TimeIndexedField
        time_input = f.modulation.at_times(t.to(device).reshape(1))[0]
    mixer = f.mixer if isinstance(f, TimeIndexedField) else f.mlp
    return Frozen("field", f.attn.n_heads, _norm(f.ln_1, time_input), _linear(f.attn.c_attn, time_input),
                  _linear(f.attn.c_proj, time_input), _norm(f.ln_2, time_input), _mixer(mixer, time_input),
                  shifts, scale, f.attn.rope)


# --------------------------------------------------------------------------- evaluation


def _layer_norm(x: torch.Tensor, weights: Weights) -> torch.Tensor:
    # torch.layer_norm is what F.layer_norm (and nn.LayerNorm, eps 1e-5) calls, minus its Python checks
    return torch.layer_norm(x, (x.shape[-1],), *weights, 1e-5)


def _mix(mixer, u: torch.Tensor, slot: dict) -> torch.Tensor:
    if not isinstance(mixer, FrozenSSM):
        fc, proj = mixer
        return F.linear(F.gelu(F.linear(u, *fc)), *proj)
    D, N = mixer.D.shape[0], mixer.A.shape[1]  # SelectiveSSM._forward, op for op
    x, z = F.linear(u, *mixer.in_proj).chunk(2, dim=-1)
    x = F.silu(x)
    delta, B_s, C_s = F.linear(x, *mixer.x_proj).split([D, N, N], dim=-1)
    y, slot["state"] = mixer.scan(x, F.softplus(delta), mixer.A, B_s, C_s, slot.get("state"))
    y = y + mixer.D * x
    return F.linear(y * F.silu(z), *mixer.out_proj)


def _attention(frozen: Frozen, h: torch.Tensor, slot: dict, past: int, capacity: int) -> torch.Tensor:
    y = attend(F.linear(h, *frozen.qkv), frozen.n_heads, slot, past, capacity, rope=frozen.rope)
    return F.linear(y, *frozen.proj)


def run(frozen: Frozen, x: torch.Tensor, slot: dict, past: int, capacity: int) -> torch.Tensor:
    """The new positions x (B, T, D) through one frozen evaluation; ``slot`` holds its keys,
    values and SSM state over the ``past`` earlier positions."""
    if frozen.form == "sequential":
        x = x + _attention(frozen, _layer_norm(x, frozen.ln_1), slot, past, capacity)
        return x + _mix(frozen.mixer, _layer_norm(x, frozen.ln_2), slot)
    h = x
    for shift in frozen.shifts:
        h = h + shift
    a = _attention(frozen, _layer_norm(h, frozen.ln_1), slot, past, capacity)
    m = _mix(frozen.mixer, _layer_norm(h, frozen.ln_2), slot)
    if frozen.form == "parallel":
        return x + a + m
    return a + m if frozen.scale is None else frozen.scale * (a + m)


# --------------------------------------------------------------------------- the decoder


@contextlib.contextmanager
def _without_onednn():
    """float32 CPU kernels without oneDNN: its GELU builds a primitive per call, ~8 us of the ~10
    that a 256-element GELU costs (the native kernel: ~2 us); decoding's tensors are that small.
    The tokens are the same either way."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous


def _stages(model: CausalLM) -> list[nn.Module] | None:
    """The body's blocks and ODE blocks in order, for the families this module knows; else None."""
    kind = type(model)
    if kind in (GPT, SSMTransformer):
        return list(model.blocks)
    if kind is HybridODETransformer:
        return [*model.early_blocks, model.ode_block, *model.late_blocks]
    if kind in (NeuralODETransformer, TimeIndexedMLP, TimeIndexedSSM):
        return [model.ode_block]
    return None


def _stage_supported(stage: nn.Module) -> bool:
    if type(stage) in (Block, SSMBlock):
        return type(getattr(stage, "mlp", None) or stage.mixer) in (MLP, SelectiveSSM)
    if type(stage) in (ODEBlock, HybridODEBlock):
        f = stage.field
        return type(f) in (HybridField, NodeField) or (
            type(f) is TimeIndexedField and type(f.mixer) in (TimeMLP, SelectiveSSM))
    return False


def supports(model: CausalLM, model_kwargs: dict | None = None) -> bool:
    """Whether ``FastDecoder`` decodes ``model`` (with these forward arguments); otherwise
    ``generate`` decodes through the modules."""
    stages = _stages(model)
    allowed = {"control"} if type(model) is HybridODETransformer else set()
    return stages is not None and all(map(_stage_supported, stages)) and set(model_kwargs or {}) <= allowed


class FastDecoder:
    """Incremental decoding of ``model`` (in eval mode) through frozen weights.

    ``decoder(idx)`` takes the next positions (B, T) (the prompt first, then one token at a
    time) and returns the logits of the last one, (B, V); ``length`` positions are held, at
    most ``capacity`` (and at most ``max_seq_len`` with learned positions). ``control`` is the
    hybrid's control vector, as ``model(..., control=)``.
    """

    def __init__(self, model: CausalLM, capacity: int, control: torch.Tensor | None = None):
        if not supports(model, {} if control is None else {"control": control}):
            raise ValueError(f"FastDecoder does not know {type(model).__name__} (or its blocks); "
                             "decode it through the modules (generate does)")
        if model.training:
            raise ValueError("FastDecoder needs the model in eval mode (it leaves dropout out)")
        self.model, self.control = model, control
        self.stages = _stages(model)
        self.cache = DecodeCache(capacity)
        self._solves: dict[ODEBlock, tuple] = {}
        weight = model.wte.weight  # float32 on a CPU: native kernels (bf16 matmuls want oneDNN)
        self._native = weight.device.type == "cpu" and weight.dtype == torch.float32

    @property
    def length(self) -> int:
        return self.cache.length

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        model, past, T = self.model, self.cache.length, idx.shape[1]
        if model.context_limit is not None and past + T > model.context_limit:  # learned positions
            raise ValueError(f"sequence length {past + T} exceeds max_seq_len={model.cfg.max_seq_len}")
        x = model.wte.weight[idx]  # CausalLM.embed, without dropout
        if model.wpe is not None:
            x = x + model.wpe.weight[past:past + T]
        with self.cache.step(T), _without_onednn() if self._native else contextlib.nullcontext():
            for stage in self.stages:
                x = self._solve(stage, x) if isinstance(stage, ODEBlock) else self._evaluate(lambda: freeze_block(stage), x)
            h = _layer_norm(x[:, -1], (model.ln_f.weight, model.ln_f.bias))
            return F.linear(h, model.lm_head.weight)

    def _evaluate(self, freeze: Callable[[], Frozen], x: torch.Tensor) -> torch.Tensor:
        """The next call site: frozen on the first pass, then run on x."""
        slot = self.cache.slot()
        if "frozen" not in slot:
            slot["frozen"] = freeze()
        return run(slot["frozen"], x, slot, self.cache.length, self.cache.capacity)

    def _solve(self, block: ODEBlock, x: torch.Tensor) -> torch.Tensor:
        """``ODEBlock.forward`` without gradient bookkeeping: the solver's own loop over frozen
        field evaluations, with ``vector_field``'s two switches. The solver, its grid and the
        control are the same in every pass: set up on the first."""
        if block not in self._solves:
            solver, t = block.solver(), block.times(x.dtype, x.device)
            control = block._check_control(self.control, x) if isinstance(block, HybridODEBlock) else None
            self._solves[block] = solver, t, solver.step_times(t), control
        solver, t, grid, control = self._solves[block]
        constant, residual, steps = block.modulation == "constant", block.integration == "residual", float(block.ode.n_steps)

        def field(t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            # t matters on the first pass only, when the call site is frozen
            out = self._evaluate(lambda: freeze_field(block.field, torch.zeros_like(t) if constant else t,
                                                      control, x.device), h)
            return out * steps if residual else out

        return solver.march(field, x, t, grid=grid)[0][-1]
