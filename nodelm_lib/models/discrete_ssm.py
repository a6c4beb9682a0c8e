"""``ssm``: the discrete control of ``ti_ssm``, ``n_layers`` blocks with the selective
state-space layer (``ssm.py``) in the MLP's place and their own weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.layers import CausalSelfAttention

from .common import CausalLM
from .registry import register_family
from .ssm import SelectiveSSM

FAMILY = Family("ssm", options=(families.PARALLEL, families.SSM_STATE_SIZE), has_mlp=False,
                summary="discrete blocks with the selective SSM in the MLP's place (ti_ssm's control)")


class SSMBlock(nn.Module):
    """A transformer block with the selective SSM in the MLP's place and no time dependence:
    ``x + Attn(LN_1(x)) + SSM(LN_2(x))`` (``parallel=True``, ti_ssm's field as one Euler step
    of size 1) or ``x + Attn(LN_1(x))`` then ``+ SSM(LN_2(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.parallel = cfg.parallel
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.bias, cfg.position == "rope")
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mixer = SelectiveSSM(cfg.d_model, cfg.ssm_state_size, None, cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            return x + self.attn(self.ln_1(x)) + self.mixer(self.ln_2(x))
        x = x + self.attn(self.ln_1(x))
        return x + self.mixer(self.ln_2(x))

    def freeze(self) -> Frozen:
        return Frozen("parallel" if self.parallel else "sequential", freeze_layer(self.ln_1), freeze_layer(self.attn),
                      freeze_layer(self.ln_2), freeze_layer(self.mixer))


class SSMTransformer(CausalLM):
    """``ssm``: ``n_layers`` discrete ``SSMBlock``s with their own weights. The control that
    separates ti_ssm's mixer from its time-indexed sharing: ti_ssm differs from it in depth
    handling only, ``gpt`` (same ``parallel``) in the mixer only.

    Positions: the scan is positional by construction (a recurrence over positions), so
    ``position="rope"`` means what it means for ``gpt``: no position table, and each block's
    attention rotates its queries and keys; the scan is unchanged."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(SSMBlock(cfg) for _ in range(cfg.n_layers))
        self.init_weights(n_residual_layers=cfg.n_layers)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def decode_stages(self) -> list[nn.Module]:
        return list(self.blocks)


register_family(FAMILY, SSMTransformer)
