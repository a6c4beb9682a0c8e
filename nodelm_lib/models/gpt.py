"""``gpt``: a pre-LN decoder-only transformer (nanoGPT-like), the discrete baseline.

``parallel=True`` gives parallel blocks x + Attn(LN(x)) + MLP(LN'(x)), the form that
``node``'s ``evaluate_at`` exports into.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family
from nodelm_lib.nn.layers import Block

from .common import CausalLM
from .registry import register_family

FAMILY = Family(families.BASELINE, options=(families.PARALLEL,),
                summary="pre-LN decoder-only transformer (nanoGPT-like), the discrete baseline")


class GPT(CausalLM):
    """``n_layers`` pre-LN blocks between the shared embeddings and the tied head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, cfg.bias, cfg.parallel, cfg.position == "rope")
            for _ in range(cfg.n_layers)
        )
        self.init_weights(n_residual_layers=cfg.n_layers)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def decode_stages(self) -> list[nn.Module]:
        return list(self.blocks)


register_family(FAMILY, GPT)
