"""Fast incremental decoding: every call site's weights frozen once, then plain functions per token.

A token decoded through the modules (``model(idx, cache=cache)``) at small sizes
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

What is frozen is the models' own business (``nn.frozen``): ``CausalLM.decode_stages()`` lists
the body's blocks and ODE blocks, a block's ``freeze()`` and an ODE field's ``freeze(t, control,
device)`` build a ``Frozen`` from their layers' ``frozen_at``. So a new family is decoded fast by
implementing those next to its ``body`` / ``forward``; a model where they are missing or not
trusted (``supports``: a subclass that changes ``forward`` or ``body`` but inherits them, a layer
without a frozen form, extra forward arguments) decodes through the modules, as before.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from nodelm_lib.models.common import CausalLM, ODEBlock
from nodelm_lib.nn.decode_cache import DecodeCache
from nodelm_lib.nn.frozen import LAYER_NORM_EPS, Frozen, FrozenAttention, FrozenSSM, NotFreezable, Weights, honours
from nodelm_lib.nn.layers import attend

# --------------------------------------------------------------------------- evaluation


def _layer_norm(x: torch.Tensor, weights: Weights) -> torch.Tensor:
    # torch.layer_norm is what F.layer_norm (and nn.LayerNorm, eps 1e-5) calls, minus its Python checks
    return torch.layer_norm(x, (x.shape[-1],), *weights, LAYER_NORM_EPS)


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


def _attention(attn: FrozenAttention, h: torch.Tensor, slot: dict, past: int, capacity: int) -> torch.Tensor:
    y = attend(F.linear(h, *attn.qkv), attn.n_heads, slot, past, capacity, rope=attn.rope)
    return F.linear(y, *attn.proj)


def run(frozen: Frozen, x: torch.Tensor, slot: dict, past: int, capacity: int) -> torch.Tensor:
    """The new positions x (B, T, D) through one frozen evaluation; ``slot`` holds its keys,
    values and SSM state over the ``past`` earlier positions."""
    if frozen.form == "sequential":
        x = x + _attention(frozen.attn, _layer_norm(x, frozen.ln_1), slot, past, capacity)
        return x + _mix(frozen.mixer, _layer_norm(x, frozen.ln_2), slot)
    if frozen.form == "branches":  # a sequential block less its input: the solver adds the residual
        a = _attention(frozen.attn, _layer_norm(x, frozen.ln_1), slot, past, capacity)
        return a + _mix(frozen.mixer, _layer_norm(x + a, frozen.ln_2), slot)
    h = x
    for shift in frozen.shifts:
        h = h + shift
    a = _attention(frozen.attn, _layer_norm(h, frozen.ln_1), slot, past, capacity)
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
    """The body's stages (``CausalLM.decode_stages``) where the class that defines them also runs
    them (defines ``body``, ``forward`` and ``embed`` or subclasses the classes that do); else None."""
    return model.decode_stages() if honours(model, "decode_stages", ("body", "forward", "embed")) else None


def _stage_supported(stage: nn.Module) -> bool:
    if isinstance(stage, ODEBlock):  # ``_solve`` stands in for its forward and vector_field
        return honours(stage, "check_control", ("forward", "vector_field")) and honours(stage.field, "freeze")
    return honours(stage, "freeze")


def _freezes(stages: list[nn.Module], like: torch.Tensor) -> bool:
    """Whether every stage freezes: its layers all have trusted frozen forms (``freeze_layer``
    raises ``NotFreezable`` otherwise). Tried once at t = 0: a block only gathers its tensors, a
    field forms its weights at one time."""
    t = torch.zeros((), dtype=like.dtype, device=like.device)
    try:
        with torch.no_grad():
            for stage in stages:
                stage.field.freeze(t, None, like.device) if isinstance(stage, ODEBlock) else stage.freeze()
    except NotFreezable:
        return False
    return True


def supports(model: CausalLM, model_kwargs: dict | None = None) -> bool:
    """Whether ``FastDecoder`` decodes ``model`` (with these forward arguments); otherwise
    ``generate`` decodes through the modules."""
    if not set(model_kwargs or {}) <= model.decode_kwargs:
        return False
    stages = _stages(model)
    return stages is not None and all(map(_stage_supported, stages)) and _freezes(stages, model.wte.weight)


class FastDecoder:
    """Incremental decoding of ``model`` (in eval mode) through frozen weights.

    ``decoder(idx)`` takes the next positions (B, T) (the prompt first, then one token at a
    time) and returns the logits of the last one, (B, V); ``length`` positions are held, at
    most ``capacity`` (and at most ``max_seq_len`` with learned positions). ``control`` is the
    hybrid's control vector, as ``model(..., control=)``.
    """

    def __init__(self, model: CausalLM, capacity: int, control: torch.Tensor | None = None):
        if not supports(model, {} if control is None else {"control": control}):
            raise ValueError(f"FastDecoder cannot freeze {type(model).__name__} with these arguments (supports: "
                             "decode_stages, freeze and frozen_at, each defined with the code it replaces); "
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
                x = self._solve(stage, x) if isinstance(stage, ODEBlock) else self._evaluate(stage.freeze, x)
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
            control = block.check_control(self.control, x)
            self._solves[block] = solver, t, solver.step_times(t), control
        solver, t, grid, control = self._solves[block]
        constant, residual, steps = block.modulation == "constant", block.integration == "residual", float(block.ode.n_steps)

        def field(t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            # t matters on the first pass only, when the call site is frozen
            out = self._evaluate(lambda: block.field.freeze(torch.zeros_like(t) if constant else t, control,
                                                            x.device), h)
            return out * steps if residual else out

        return solver.march(field, x, t, grid=grid)[0][-1]
