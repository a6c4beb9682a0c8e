"""Frozen forms: a block or one evaluation of an ODE field with every weight fixed, as plain tensors.

Fast decoding (``generation.fast_decode``) runs new positions through these instead of the
modules. The layers and blocks build them themselves, so that a model family is decoded fast
without ``fast_decode`` knowing it:

- a layer has ``frozen_at(time_input)``: its weights at the time input its ``forward`` receives
  (a time code, a trunk output, or None for a static layer); plain ``nn.Linear`` and
  ``nn.LayerNorm`` have none, ``freeze_layer`` reads their weights;
- a discrete block has ``freeze()`` and an ODE field ``freeze(t, control, device)``, a ``Frozen``
  built from its layers' ``freeze_layer(...)``.

A frozen form replaces the module's ``forward``, so it is trusted only where it was written
next to that ``forward`` (``honours``): a subclass that changes ``forward`` but inherits
``frozen_at`` / ``freeze`` cannot be frozen, and its model decodes through the modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

Weights = tuple  # (weight, bias or None) of a linear layer or a layer norm

LAYER_NORM_EPS = 1e-5  # what fast decoding's layer norm uses: nn.LayerNorm's and F.layer_norm's default


@dataclass
class FrozenAttention:
    """Causal self-attention at one t: the fused q, k, v projection, the output projection and
    whether queries and keys are rotated (``layers.attend``)."""

    n_heads: int
    qkv: Weights
    proj: Weights
    rope: bool = False


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
    (x + Attn(LN_1 x) + Mixer(LN_2 x)), ``"field"``: scale * (Attn(LN_1 h) + Mixer(LN_2 h))
    with h = x + shift_1 + shift_2 ... (no residual: the solver adds it; no scale if None), or
    ``"branches"``: a sequential block less its input, a + Mixer(LN_2 (x + a)) with a = Attn(LN_1 x).
    ``mixer`` is an MLP's (c_fc, c_proj) weights, x -> W_2 GELU(W_1 x), or a ``FrozenSSM``.
    """

    form: str
    ln_1: Weights
    attn: FrozenAttention
    ln_2: Weights
    mixer: tuple[Weights, Weights] | FrozenSSM
    shifts: tuple[torch.Tensor, ...] = ()
    scale: torch.Tensor | None = None


class NotFreezable(TypeError):
    """A layer without a frozen form that can be trusted (``freeze_layer``)."""


def _definer(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def honours(module: nn.Module, method: str, mirrors: tuple[str, ...] = ("forward",)) -> bool:
    """Whether ``module``'s ``method`` may stand in for its ``mirrors``: it is defined in the class
    that defines each of them, or in a subclass of it. False for a subclass that overrides
    ``forward`` and inherits ``method``, which would then compute something else than the module."""
    owner = _definer(type(module), method)
    return owner is not None and all(issubclass(owner, _definer(type(module), m) or object) for m in mirrors)


def freeze_layer(layer: nn.Module, time_input=None):
    """``layer``'s frozen form at ``time_input``: its ``frozen_at`` where ``honours`` trusts it (with
    the layer's ``frozen_mirrors``, by default its ``forward``), the weights of a plain ``nn.Linear``
    or ``nn.LayerNorm``; ``NotFreezable`` otherwise."""
    if honours(layer, "frozen_at", getattr(layer, "frozen_mirrors", ("forward",))):
        return layer.frozen_at(time_input)
    if type(layer) is nn.Linear or (type(layer) is nn.LayerNorm and layer.eps == LAYER_NORM_EPS
                                    and len(layer.normalized_shape) == 1):
        return layer.weight, layer.bias
    raise NotFreezable(f"{type(layer).__name__} has no frozen form defined with its forward "
                       "(frozen_at); its model decodes through the modules")
