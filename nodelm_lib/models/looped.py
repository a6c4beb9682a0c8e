"""``looped``: gpt's block applied k times with shared weights and no time input (recurrent depth,
as in Geiping et al. 2025's Huginn): the discrete control any "continuous depth helps" claim must
beat at equal compute.

    x_{k+1} = Block(x_k),  k = 0 .. K - 1,  one Block shared by every step

It is solved as a residual stack by the ODE block the continuous arms use (x + f(x), f the block's
residual branch), so that its number of loops is a solver setting like their steps: ``ode.n_steps``
(``n_layers`` as trained: its depth rule), any other at inference (``set_ode(n_steps=k)``), a random
number in training (``ode.grid_min_steps`` .. ``grid_max_steps``), and one NFE per loop. It is not a
continuous family: the field ignores t (no time input, nothing depends on depth), and only Euler's
x + f(x) is a loop.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.layers import Block

from .common import ODEBlock, OneBlockLM
from .registry import register_family


def _check(cfg: ModelConfig) -> None:
    """A loop adds its block's branch once per step, whatever the step's length: Euler steps of
    even length only, as many as its layers."""
    if cfg.n_layers != cfg.ode.n_steps:
        raise ValueError(f"model.n_layers={cfg.n_layers} but model.ode.n_steps={cfg.ode.n_steps}: for "
                         f"model.arch='looped' the depth is the number of loops; set both to the same value")
    if cfg.ode.method != "euler":
        raise ValueError(f"model.arch='looped' applies its block once per step (x + f(x)): it needs "
                         f"model.ode.method='euler', got {cfg.ode.method!r}")
    if cfg.ode.grid_end_jitter > 0 or cfg.ode.grid_placement != "uniform":
        raise ValueError("model.arch='looped' varies its number of loops only: its random training grids need "
                         "ode.grid_end_jitter=0 and ode.grid_placement='uniform'")


FAMILY = Family("looped", depth=families.solver_steps, options=(families.PARALLEL,), check=_check,
                summary="gpt's block applied n_layers times with shared weights and no time input (recurrent depth)")


class LoopedField(nn.Module):
    """f(t, x) = Block(x) - x: the residual branches of gpt's block (sequential, or with
    ``parallel=True`` the parallel form), so that one Euler step of the residual stack is the block.
    ``t`` is not read."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.block = Block(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, cfg.bias, cfg.parallel,
                           cfg.position == "rope")

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        block = self.block
        a = block.attn(block.ln_1(x))
        return a + block.mlp(block.ln_2(x if block.parallel else x + a))

    def freeze(self, t: torch.Tensor, control=None, device=None) -> Frozen:
        """This field for fast decoding (the same at every t)."""
        block = self.block
        return Frozen("field" if block.parallel else "branches", freeze_layer(block.ln_1), freeze_layer(block.attn),
                      freeze_layer(block.ln_2), freeze_layer(block.mlp))


class LoopedGPT(OneBlockLM):
    """One gpt block looped ``ode.n_steps`` times (``n_layers`` as trained)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.ode_block = ODEBlock(LoopedField(cfg), cfg.ode, cfg.dropout, integration="residual")
        self.init_weights(n_residual_layers=cfg.n_layers)  # as gpt's: the loop adds n_layers blocks' worth


register_family(FAMILY, LoopedGPT)
