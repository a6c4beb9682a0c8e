"""``node``: Tong et al.'s Neural ODE transformer (ICLR 2025), every weight a function of t.

One shared parallel block is integrated over depth t in [0, 1]:

    dx/dt = f(t, x) = Attn_t(LN_t(x)) + MLP_t(LN'_t(x))

Every linear layer's weight and bias are generated from the time code phi(t) (sinusoidal
features of t with t appended) by a small per-layer network, W(t) = B + sum_k e_k(t) A_k
(``time_layers.HyperLinear``), and the layer norms' scale and shift are time-dependent
(``time_layers.TimeLayerNorm``, starting as plain layer norms). Euler with n steps is an
n-layer parallel-block transformer with dt-scaled residual updates: ``evaluate_at(n)`` exports
exactly that model as an ordinary ``gpt``.

Unlike the extension's published code (seed 001 README), attention is causal and the
model has positions (a learned table, or rotary ones with ``position="rope"``): both come from
the shared ``CausalLM`` and its attention layers.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig, ODEConfig
from nodelm_lib.families import Family, Option
from nodelm_lib.nn.decode_cache import cached_per_call
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.layers import mlp_hidden
from nodelm_lib.nn.time_grid import active_grid
from nodelm_lib.nn.time_layers import (HyperLinear, TimeAttention, TimeLayerNorm, TimeMLP, time_code, time_codes)
from nodelm_lib.ode import Solver

from .common import ContinuousDepthLM, TimeDependentField
from .gpt import GPT
from .registry import register_family

FAMILY = Family("node", continuous=True, depth=families.solver_steps, time_dependent_weights=True,
                options=(families.MODULATION, families.INTEGRATION, families.TIME_FEATURES, families.TIME_HIDDEN,
                         Option("hyper_dim", 4, families.positive)),
                summary="one block integrated over t in [0, 1], every weight W(t) from a hypernetwork")


class NodeField(TimeDependentField):
    """f(t, x) = Attn_t(LN_t(x)) + MLP_t(LN'_t(x)) with hypernetwork-generated weights."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.time_features = cfg.time_features
        code_dim = cfg.time_features + 1

        def linear(in_features: int, out_features: int) -> HyperLinear:
            return HyperLinear(in_features, out_features, cfg.hyper_dim, code_dim, cfg.time_hidden, cfg.bias)

        self.ln_1 = TimeLayerNorm(cfg.d_model, code_dim, cfg.bias)
        self.attn = TimeAttention(cfg.d_model, cfg.n_heads, cfg.dropout, linear, cfg.position == "rope")
        self.ln_2 = TimeLayerNorm(cfg.d_model, code_dim, cfg.bias)
        self.mlp = TimeMLP(cfg.d_model, cfg.mlp_ratio, cfg.dropout, linear)

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        grid = active_grid()
        if grid is not None:  # every weight at every grid time at once (``time_grid.TimeGrid``)
            code = grid.point(t, self, lambda times: time_codes(times, self.time_features).to(x.device))
        else:
            code = cached_per_call(lambda: self.code_at(t, x.device))  # t alone: once per stage
        return self.attn(self.ln_1(x, code), code) + self.mlp(self.ln_2(x, code), code)

    def freeze(self, t: torch.Tensor, control=None, device=None) -> Frozen:
        """This field at t for fast decoding: every layer at the time code phi(t)."""
        code = self.code_at(t, device)
        return Frozen("field", freeze_layer(self.ln_1, code), freeze_layer(self.attn, code),
                      freeze_layer(self.ln_2, code), freeze_layer(self.mlp, code))

    def code_at(self, t: torch.Tensor, device) -> torch.Tensor:
        """The time code phi(t) every time-dependent layer of one evaluation reads."""
        return time_code(t, self.time_features).to(device)

    def weights_at(self, t: torch.Tensor) -> dict:
        """Every weight, bias and layer-norm pair at the time code phi(t), as ``forward`` forms them."""
        code = self.code_at(t, next(self.parameters()).device)
        (w_qkv, b_qkv), (w_o, b_o) = self.attn.c_attn.weight_at(code), self.attn.c_proj.weight_at(code)
        (w_1, b_1), (w_2, b_2) = self.mlp.c_fc.weight_at(code), self.mlp.c_proj.weight_at(code)
        return dict(w_qkv=w_qkv, b_qkv=b_qkv, w_o=w_o, b_o=b_o, w_1=w_1, b_1=b_1, w_2=w_2, b_2=b_2,
                    ln_1=self.ln_1.weight_at(code), ln_2=self.ln_2.weight_at(code))


class NeuralODETransformer(ContinuousDepthLM):
    """Tong's Neural ODE transformer: ``NodeField`` integrated by ``ODEBlock`` over [0, 1]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, NodeField(cfg))

    @torch.no_grad()
    def evaluate_at(self, n: int | None = None) -> GPT:
        """The Euler discretisation with ``n`` steps (default ``ode.n_steps``) as an ordinary
        n-layer ``gpt`` with parallel blocks.

        Block i holds W(t_i), b(t_i) and the layer norms at t_i on the solver's own grid
        (t_i = i dt, dt = 1/n, computed as the solver does), with the output projections of
        attention and MLP scaled by dt, so that block i is x + dt f(t_i, x): its logits equal
        this model's solved with ``method="euler", n_steps=n``. The ablation switches carry
        over (constant modulation samples t = 0; residual integration does not scale by dt).
        """
        n = n or self.ode_block.ode.n_steps
        cfg = dataclasses.replace(self.cfg, arch="gpt", n_layers=n, parallel=True, ode=ODEConfig(n_steps=n),
                                  modulation="time", integration="ode")
        gpt = GPT(cfg).to(self.wte.weight.device, self.wte.weight.dtype)
        for name in ("wte", "wpe", "ln_f"):  # the gpt has the same position kind: no wpe with rope
            if getattr(self, name) is not None:
                getattr(gpt, name).load_state_dict(getattr(self, name).state_dict())
        weight = self.wte.weight
        t = self.ode_block.times(weight.dtype, weight.device)  # the interval the ODE block solves over
        for block, (t_i, dt) in zip(gpt.blocks, Solver("euler", n).step_times(t)):  # the solver's own grid
            if self.cfg.modulation == "constant":
                t_i = torch.zeros_like(t_i)
            scale = 1.0 if self.cfg.integration == "residual" else dt
            self._export_block(block, time_code(t_i, self.field.time_features).to(t.device), scale)
        return gpt.train(self.training)

    def _export_block(self, block: nn.Module, code: torch.Tensor, scale) -> None:
        f = self.field
        pairs = ((block.ln_1, f.ln_1, 1.0), (block.ln_2, f.ln_2, 1.0),
                 (block.attn.c_attn, f.attn.c_attn, 1.0), (block.attn.c_proj, f.attn.c_proj, scale),
                 (block.mlp.c_fc, f.mlp.c_fc, 1.0), (block.mlp.c_proj, f.mlp.c_proj, scale))
        for target, source, factor in pairs:
            weight, bias = source.weight_at(code)
            target.weight.copy_(weight * factor)
            if bias is not None:
                target.bias.copy_(bias * factor)


def param_count_formula(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of ``node`` for ``cfg``, counted by hand (a test checks it against the model).

    With D = d_model, F = time_features + 1 (the time code), H = time_hidden, E = hyper_dim
    and beta = 1 with biases (0 without), a ``HyperLinear(i, o)`` has
    (E + 1)(i o + beta o) weights plus its coefficient MLP (F H + H + H E + E), and a
    ``TimeLayerNorm`` (1 + beta) D (F + 1). The block has two layer norms and four linear
    layers (D -> 3D, D -> D, D -> M, M -> D with M the MLP width).
    """
    D, F, H, E = cfg.d_model, cfg.time_features + 1, cfg.time_hidden, cfg.hyper_dim
    beta = 1 if cfg.bias else 0
    M = mlp_hidden(D, cfg.mlp_ratio)

    def hyper_linear(i: int, o: int) -> int:
        return (E + 1) * (i * o + beta * o) + (F * H + H + H * E + E)

    layer_norm = (1 + beta) * D * (F + 1)
    block = 2 * layer_norm + hyper_linear(D, 3 * D) + hyper_linear(D, D) + hyper_linear(D, M) + hyper_linear(M, D)
    final_norm = (1 + beta) * D
    embeddings = cfg.vocab_size * D + (cfg.max_seq_len * D if cfg.position == "learned" else 0)  # rope: no table
    return {"total": embeddings + block + final_norm, "non_embedding": block + final_norm}


register_family(FAMILY, NeuralODETransformer)
