"""``ti_mlp`` and ``ti_ssm``: time-indexed parameter sharing (the seed-001 extension).

One set of base weights is shared by all depths and gated in time,
W_eff(t) = W_base * sigmoid(g(t)) (``time_layers.ModulatedLinear``; its docstring says which
structure g has and why), with g a small network on the sinusoidal time code. The block is in
parallel form and integrated over t in [0, 1] like ``node``:

    ti_mlp:  dx/dt = Attn_t(LN_1(x)) + MLP_t(LN_2(x))
    ti_ssm:  dx/dt = Attn_t(LN_1(x)) + SSM_t(LN_2(x))

where SSM_t is a selective diagonal state-space layer over positions (``models/ssm.py``)
whose parameters are modulated in t by the same trunk. The layer norms are shared and
static. ``modulation="constant"`` and ``integration="residual"`` (``ModelConfig``) are the
seed's two open questions: is the gain from t, and is the dt factor needed?

Unlike the published extension, attention is causal (it pooled the whole window) and
there are positions (``CausalLM``: a learned table, or rotary ones with ``position="rope"``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.time_layers import ModulatedLinear, TimeAttention, TimeMLP, TimeModulation

from .common import ContinuousDepthLM, TimeDependentField
from .registry import register_family
from .ssm import SelectiveSSM

_TIME_INDEXED = (families.MODULATION, families.INTEGRATION, families.TIME_FEATURES, families.TIME_HIDDEN)
TI_MLP = Family("ti_mlp", continuous=True, depth=families.solver_steps, time_dependent_weights=True,
                options=_TIME_INDEXED, summary="one block integrated over t, shared weights gated by g(t)")
# models/scans.py's scan is an autograd.Function without setup_context: torch.func.jvp refuses it
TI_SSM = Family("ti_ssm", continuous=True, depth=families.solver_steps, time_dependent_weights=True,
                options=(*_TIME_INDEXED, families.SSM_STATE_SIZE), has_mlp=False, forward_mode=False,
                summary="ti_mlp with the MLP replaced by a selective state-space layer modulated in t")


class TimeIndexedField(TimeDependentField):
    """f(t, x) = Attn_t(LN_1(x)) + Mixer_t(LN_2(x)), every weight gated by g(t).

    ``mixer`` is ``"mlp"`` (ti_mlp) or ``"ssm"`` (ti_ssm). The trunk h(t) is computed once
    per evaluation and shared by every gated layer.
    """

    def __init__(self, cfg: ModelConfig, mixer: str):
        super().__init__()

        def linear(in_features: int, out_features: int) -> ModulatedLinear:
            return ModulatedLinear(in_features, out_features, cfg.time_hidden, cfg.bias)

        self.modulation = TimeModulation(cfg.time_features, cfg.time_hidden)
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = TimeAttention(cfg.d_model, cfg.n_heads, cfg.dropout, linear, cfg.position == "rope")
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        if mixer == "mlp":
            self.mixer = TimeMLP(cfg.d_model, cfg.mlp_ratio, cfg.dropout, linear)
        else:
            self.mixer = SelectiveSSM(cfg.d_model, cfg.ssm_state_size, cfg.time_hidden, cfg.bias)

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.modulation(t.to(x.device))
        return self.attn(self.ln_1(x), h) + self.mixer(self.ln_2(x), h)

    def weights_at(self, t: torch.Tensor) -> dict:
        """The gated weights at the trunk output h(t); biases and layer norms are static, and the
        state-space mixer has no MLP weights (None)."""
        h = self.modulation(t.to(next(self.parameters()).device))  # as forward forms it
        attn, mixer = self.attn, self.mixer
        mlp = (dict(w_1=mixer.c_fc.weight_at(h), b_1=mixer.c_fc.bias, w_2=mixer.c_proj.weight_at(h),
                    b_2=mixer.c_proj.bias) if isinstance(mixer, TimeMLP) else dict(w_1=None, b_1=None, w_2=None, b_2=None))
        return dict(w_qkv=attn.c_attn.weight_at(h), b_qkv=attn.c_attn.bias, w_o=attn.c_proj.weight_at(h),
                    b_o=attn.c_proj.bias, **mlp, ln_1=(self.ln_1.weight, self.ln_1.bias),
                    ln_2=(self.ln_2.weight, self.ln_2.bias))

    def freeze(self, t: torch.Tensor, control=None, device=None) -> Frozen:
        """This field at t for fast decoding: every gated layer at the trunk output h(t)."""
        h = self.modulation.at_times(t.to(device).reshape(1))[0]  # what forward's cached modulation(t) computes
        return Frozen("field", freeze_layer(self.ln_1), freeze_layer(self.attn, h), freeze_layer(self.ln_2),
                      freeze_layer(self.mixer, h))


class TimeIndexedMLP(ContinuousDepthLM):
    """``ti_mlp``: shared attention + MLP weights gated in time."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, TimeIndexedField(cfg, "mlp"))


class TimeIndexedSSM(ContinuousDepthLM):
    """``ti_ssm``: shared attention weights gated in time, the MLP replaced by a selective
    state-space layer modulated in time (``ssm_state_size`` states per channel)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, TimeIndexedField(cfg, "ssm"))


register_family(TI_MLP, TimeIndexedMLP)
register_family(TI_SSM, TimeIndexedSSM)
