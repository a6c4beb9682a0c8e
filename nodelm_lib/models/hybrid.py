"""``hybrid``: discrete blocks, one ODE block over t in [0, 1] in place of a span of layers,
then discrete blocks again (the seed-004 experiment).

The ODE block's field is one attention + MLP pair in parallel form, conditioned additively
on a time embedding e(t) and an optional control vector u:

    h = x + e(t) + P u,        dx/dt = alpha * [ Attn(LN_1(h)) + MLP(LN_2(h)) ]

alpha is a learned scalar initialised at 0.1 so that the flow starts close to the identity
(a residual block is Euler with dt = 1; alpha keeps each step's update small until training
decides otherwise).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family, Option
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.layers import MLP, Block, CausalSelfAttention
from nodelm_lib.nn.time_layers import TimeEmbedding

from .common import CausalLM, ODEBlock
from .registry import register_family


def middle_third(n_layers: int) -> dict[str, int]:
    """The hybrid's depth rule: its ODE block replaces the middle third of ``n_layers``."""
    return {"ode_start": n_layers // 3, "ode_end": n_layers - n_layers // 3}


def check_span(cfg: ModelConfig) -> None:
    if not 0 <= cfg.ode_start < cfg.ode_end <= cfg.n_layers:
        raise ValueError(
            f"model.ode_start={cfg.ode_start}, model.ode_end={cfg.ode_end} is not a valid span "
            f"of model.n_layers={cfg.n_layers}; need 0 <= ode_start < ode_end <= n_layers"
        )


FAMILY = Family("hybrid", depth=middle_third, check=check_span,
                options=(families.PARALLEL, Option("ode_start", 2), Option("ode_end", 4),
                         Option("control_dim", 4, families.non_negative), Option("ode_scale_init", 0.1)),
                summary="discrete blocks, an ODE block in place of a span of layers, discrete blocks")


class HybridField(nn.Module):
    """The vector field f(t, x; u) of the hybrid's ODE block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.control_dim = cfg.control_dim
        self.time_embed = TimeEmbedding(cfg.d_model)
        self.control_proj = nn.Linear(cfg.control_dim, cfg.d_model, bias=False) if cfg.control_dim else None
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.bias, cfg.position == "rope")
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg.d_model, cfg.mlp_ratio, cfg.dropout, cfg.bias)
        self.scale = nn.Parameter(torch.tensor(float(cfg.ode_scale_init)))

    def forward(self, t: torch.Tensor, x: torch.Tensor, control: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.time_embed(t)
        if control is not None:
            h = h + self.control_proj(control).unsqueeze(1)  # (B, D) -> (B, 1, D): same u at every position
        return self.scale * (self.attn(self.ln_1(h)) + self.mlp(self.ln_2(h)))

    def freeze(self, t: torch.Tensor, control: torch.Tensor | None, device=None) -> Frozen:
        """This field at t for fast decoding: e(t) and P u are the shifts, alpha the scale."""
        shifts = (self.time_embed.embed(t),)  # what forward's cached time_embed(t) computes
        if control is not None:
            shifts += (self.control_proj(control).unsqueeze(1),)
        return Frozen("field", freeze_layer(self.ln_1), freeze_layer(self.attn), freeze_layer(self.ln_2),
                      freeze_layer(self.mlp), shifts, self.scale)


class HybridODEBlock(ODEBlock):
    """The hybrid's ODE block: the shared ``ODEBlock`` plus the control vector's checks."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(HybridField(cfg), cfg.ode, cfg.dropout)

    def forward(self, x: torch.Tensor, control: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, self.check_control(control, x))

    def check_control(self, control: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        """``control`` (B, k) or (k,) as (B, k) in x's dtype; a ValueError for a wrong shape."""
        if control is None:
            return None
        k = self.field.control_dim
        if k == 0:
            raise ValueError("a control vector was given but the model has control_dim=0")
        if control.ndim == 1:
            control = control.unsqueeze(0).expand(x.shape[0], -1)
        if control.shape != (x.shape[0], k):
            raise ValueError(f"control must have shape ({x.shape[0]}, {k}) or ({k},), got {tuple(control.shape)}")
        return control.to(x.dtype)


class HybridODETransformer(CausalLM):
    """Blocks ``[0, ode_start)``, the ODE block, then blocks ``[ode_end, n_layers)``.

    ``model(idx, targets, control=u)`` passes the control vector u (shape (B, control_dim)
    or (control_dim,)) to the ODE block.
    """

    decode_kwargs = frozenset({"control"})

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)

        def blocks(n: int) -> nn.ModuleList:
            return nn.ModuleList(Block(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, cfg.bias, cfg.parallel,
                                       cfg.position == "rope")
                                 for _ in range(n))

        self.early_blocks = blocks(cfg.ode_start)
        self.ode_block = HybridODEBlock(cfg)
        self.late_blocks = blocks(cfg.n_layers - cfg.ode_end)
        self.init_weights(n_residual_layers=cfg.n_layers)

    def body(self, x: torch.Tensor, control: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.early_blocks:
            x = block(x)
        x = self.ode_block(x, control)
        for block in self.late_blocks:
            x = block(x)
        return x

    def decode_stages(self) -> list[nn.Module]:
        return [*self.early_blocks, self.ode_block, *self.late_blocks]


register_family(FAMILY, HybridODETransformer)
