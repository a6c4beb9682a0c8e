"""Fast decoding (frozen weights, plain functions) against the model's own forward, for every
arch, solver and ablation switch; a family added through the decoding protocol; the fallback
for models it cannot trust; its errors."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib import models
from nodelm_lib.generation.sampling import fast_decode
from nodelm_lib.config import ARCHS
from nodelm_lib.families import Family
from nodelm_lib.models.common import CausalLM, ODEBlock
from nodelm_lib.models.gpt import GPT
from nodelm_lib.models.hybrid import HybridODEBlock
from nodelm_lib.models.ssm import SelectiveSSM
from nodelm_lib.nn.frozen import Frozen, freeze_layer
from nodelm_lib.nn.layers import Block, CausalSelfAttention
from nodelm_lib.nn.time_layers import HyperLinear
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS

from test_generate import small, trained_like

CASES = [(arch, "euler") for arch in ARCHS] + [(arch, m) for arch in ("hybrid", "node", "ti_mlp", "ti_ssm")
                                                for m in FIXED_STEP_METHODS if m != "euler"]


def decode_in_parts(model, idx, parts=(5, 1, 1, 3), **kw) -> tuple[torch.Tensor, list[int]]:
    """The fast decoder fed ``idx`` in consecutive parts: the last logits of every part, and
    the positions they belong to."""
    decoder = fast_decode.FastDecoder(model, model.cfg.max_seq_len, **kw)
    logits, ends, start = [], [], 0
    for n in parts:
        logits.append(decoder(idx[:, start:start + n]))
        start += n
        ends.append(start - 1)
    assert decoder.length == start
    return torch.stack(logits, dim=1), ends


def check_against_forward(model, idx, **kw):
    with torch.inference_mode():
        full, _ = model(idx, **kw)
        got, ends = decode_in_parts(model, idx, **kw)
    torch.testing.assert_close(got, full[:, ends], rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch, method", CASES)
def test_fast_decoder_matches_the_forward_pass(arch, method):
    """Prefill 5 positions, then 1, 1 and 3 at once (a multi-position pass with a past): each
    pass's last logits equal the full forward's at that position, for every arch and every
    fixed-step method (each scheme's own order of field evaluations)."""
    model = trained_like(small(arch, method, n_layers=2, ode=nl.ODEConfig(method=method, n_steps=2)))
    assert fast_decode.supports(model)
    check_against_forward(model, torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("arch, switches", [("ti_mlp", dict(modulation="constant")),
                                            ("ti_mlp", dict(integration="residual")),
                                            ("node", dict(modulation="constant", integration="residual")),
                                            ("ti_ssm", dict(integration="residual")),
                                            ("gpt", dict(parallel=True)), ("ssm", dict(parallel=False)),
                                            ("hybrid", dict(parallel=True, bias=False))])
def test_fast_decoder_follows_the_ablation_switches_and_block_forms(arch, switches):
    """t = 0 at every stage, x + f instead of x + dt f, parallel / sequential blocks, no biases."""
    model = trained_like(small(arch, **switches))
    check_against_forward(model, torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(2)))


def test_fast_decoder_passes_the_hybrids_control_vector():
    model = trained_like(small("hybrid", "rk4"))
    control = torch.randn(2, model.cfg.control_dim)
    idx = torch.randint(0, 64, (2, 10))
    check_against_forward(model, idx, control=control)
    with torch.inference_mode():  # the control changes the logits: it is not ignored
        assert not torch.allclose(decode_in_parts(model, idx, control=control)[0], decode_in_parts(model, idx)[0])


def test_fast_decoder_uses_the_ssm_layers_own_scan():
    """A mixer with ``chunk_size`` set scans with the chunked recurrence, as its forward does."""
    model = trained_like(small("ti_ssm", "rk4"))
    model.field.mixer.chunk_size = 4
    check_against_forward(model, torch.randint(0, 64, (2, 10)))


def test_each_call_site_is_frozen_once():
    """rk4 with 2 steps: 8 field evaluations frozen on the prefill pass, none after."""
    model = trained_like(small("node", "rk4", n_layers=2, ode=nl.ODEConfig(method="rk4", n_steps=2)))
    decoder = fast_decode.FastDecoder(model, model.cfg.max_seq_len)
    calls, freeze = [], model.field.freeze
    model.field.freeze = lambda *a: calls.append(1) or freeze(*a)
    with torch.inference_mode():
        decoder(torch.zeros(1, 3, dtype=torch.long))
        for _ in range(5):
            decoder(torch.zeros(1, 1, dtype=torch.long))
    assert len(calls) == 2 * 4


class Variant(GPT):
    """A subclass may change anything: fast decoding does not assume it behaves like GPT."""

    def body(self, x):
        return super().body(x) * 0.5


def test_a_model_it_does_not_know_decodes_through_the_modules():
    model = Variant(small("gpt")).eval()
    assert not fast_decode.supports(model)
    assert not fast_decode.supports(trained_like(small("gpt")), {"control": None})  # gpt takes no control
    with pytest.raises(ValueError, match="cannot freeze Variant"):
        fast_decode.FastDecoder(model, 8)
    idx = torch.randint(0, 64, (1, 4))
    cached, logits = nl.generate(model, idx, 6, temperature=0, return_logits=True)
    plain, plain_logits = nl.generate(model, idx, 6, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(logits, plain_logits, rtol=0, atol=1e-5)


def test_fast_decoder_refuses_training_mode_and_overflow():
    model = trained_like(small("gpt"))
    with pytest.raises(ValueError, match="eval mode"):
        fast_decode.FastDecoder(model.train(), 24)
    decoder = fast_decode.FastDecoder(model.eval(), 24)
    with torch.inference_mode():
        decoder(torch.zeros(1, 20, dtype=torch.long))
        with pytest.raises(ValueError, match="sequence length 25 exceeds max_seq_len=24"):
            decoder(torch.zeros(1, 5, dtype=torch.long))


def test_onednn_setting_is_restored():
    model = trained_like(small("gpt"))
    before = torch.backends.mkldnn.enabled
    nl.generate(model, torch.zeros(1, 2, dtype=torch.long), 3, temperature=0)
    assert torch.backends.mkldnn.enabled == before


# --------------------------------------------------------------------------- a family of its own
# The extension path of docs/guides/adding-a-family.md ("Fast decoding"): a layer, a block, an ODE field
# and a CausalLM that fast_decode has never heard of, each saying how it freezes.


class GatedLinear(nn.Module):
    """A layer the library does not have: W * sigmoid(g), one learned gate per output row."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) * 0.1)
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.gate = nn.Parameter(torch.zeros(out_features, 1))

    def forward(self, x):
        return F.linear(x, self.weight * torch.sigmoid(self.gate), self.bias)

    def frozen_at(self, time_input=None):
        return self.weight * torch.sigmoid(self.gate), self.bias


class GatedMLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.c_fc, self.c_proj = GatedLinear(d_model, 2 * d_model), nn.Linear(2 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))

    def frozen_at(self, time_input=None):
        return freeze_layer(self.c_fc), freeze_layer(self.c_proj)


class ToyBlock(nn.Module):
    """x + Attn(LN_1 x) + GatedMLP(LN_2 x)."""

    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, rope=cfg.position == "rope")
        self.mlp = GatedMLP(cfg.d_model)

    def forward(self, x):
        return x + self.attn(self.ln_1(x)) + self.mlp(self.ln_2(x))

    def freeze(self):
        return Frozen("parallel", freeze_layer(self.ln_1), freeze_layer(self.attn), freeze_layer(self.ln_2),
                      freeze_layer(self.mlp))


class DriftField(nn.Module):
    """f(t, x) = Attn(LN_1 h) + GatedMLP(LN_2 h) with h = x + t v: a field that depends on t."""

    def __init__(self, cfg):
        super().__init__()
        self.block = ToyBlock(cfg)
        self.drift = nn.Parameter(torch.randn(cfg.d_model))

    def forward(self, t, x):
        b, h = self.block, x + t * self.drift
        return b.attn(b.ln_1(h)) + b.mlp(b.ln_2(h))

    def freeze(self, t, control, device):
        frozen = self.block.freeze()
        frozen.form, frozen.shifts = "field", (t * self.drift,)
        return frozen


class ToyLM(CausalLM):
    """Discrete toy blocks, then the drift field integrated over [0, 1]."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(ToyBlock(cfg) for _ in range(cfg.n_layers))
        self.ode_block = ODEBlock(DriftField(cfg), cfg.ode)
        self.init_weights(n_residual_layers=cfg.n_layers + 1)

    def body(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ode_block(x)

    def decode_stages(self):
        return [*self.blocks, self.ode_block]


@pytest.fixture
def toy():
    """The toy family registered as arch "toy", as a family's file in models/ registers itself."""
    models.register_family(Family("toy"), ToyLM)
    yield lambda **kw: trained_like(small("toy", **kw))
    models.unregister_family("toy")


def generate_both_ways(model, n=30, **kw):
    """Greedy tokens and logits with the cache (fast when supported) and by recomputing the
    window; 4 + 30 tokens outgrow the window of 24, so the cache is also rebuilt."""
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(5))
    cached = nl.generate(model, idx, n, temperature=0, return_logits=True, **kw)
    plain = nl.generate(model, idx, n, temperature=0, use_cache=False, return_logits=True, **kw)
    assert torch.equal(cached[0], plain[0])
    torch.testing.assert_close(cached[1], plain[1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_a_family_added_through_the_protocol_is_fast_decoded(toy, monkeypatch, method):
    model = toy(ode=nl.ODEConfig(method=method, n_steps=2))
    assert isinstance(model, ToyLM) and fast_decode.supports(model)
    check_against_forward(model, torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(6)))
    decoders, decoder = [], fast_decode.FastDecoder
    monkeypatch.setattr(fast_decode, "FastDecoder", lambda *a, **k: decoders.append(1) or decoder(*a, **k))
    generate_both_ways(model)
    assert decoders  # the fast path decoded it, not the modules


def test_the_toy_family_with_rope_decodes_past_max_seq_len(toy):
    generate_both_ways(toy(position="rope"), window=32)


# --------------------------------------------------------------------------- what is not trusted


class LoudToyBlock(ToyBlock):
    def forward(self, x):
        return super().forward(x) * 1.5


class HalfBlock(Block):
    def forward(self, x):
        return super().forward(x) * 0.5


class ShiftedHyperLinear(HyperLinear):
    def forward(self, x, code):
        return super().forward(x, code) + 0.1


class HalfScanSSM(SelectiveSSM):
    """Overrides ``_forward`` only, which ``SelectiveSSM.frozen_mirrors`` names."""

    def _forward(self, u, h, scan):
        return 0.5 * super()._forward(u, h, scan)


class DampedODEBlock(HybridODEBlock):
    def vector_field(self, t, x, *args):
        return 0.5 * super().vector_field(t, x, *args)


class NoisyLinear(nn.Linear):
    """A linear layer with no frozen form at all."""

    def forward(self, x):
        return super().forward(x) + 0.1


@pytest.mark.parametrize("arch, where, cls", [
    ("toy", lambda m: m.blocks[0], LoudToyBlock),
    ("toy", lambda m: m.ode_block.field.block.mlp.c_fc, NoisyLinear),
    ("gpt", lambda m: m.blocks[1], HalfBlock),
    ("node", lambda m: m.field.mlp.c_fc, ShiftedHyperLinear),
    ("ti_ssm", lambda m: m.field.mixer, HalfScanSSM),
    ("ssm", lambda m: m.blocks[0].mixer, HalfScanSSM),
    ("hybrid", lambda m: m.ode_block, DampedODEBlock),
], ids=["toy-block", "toy-field-layer", "gpt-block", "node-layer", "ti_ssm-mixer", "ssm-mixer", "hybrid-ode-block"])
def test_a_subclass_that_changes_forward_decodes_through_the_modules(toy, arch, where, cls):
    """A block, layer or ODE block whose class changes what its forward computes but inherits
    ``freeze`` / ``frozen_at`` (or has none): fast decoding would be wrong, so it is not used."""
    model = toy() if arch == "toy" else trained_like(small(arch))
    original = copy.deepcopy(model)
    where(model).__class__ = cls
    idx = torch.randint(0, 64, (2, 6))
    with torch.inference_mode():
        assert not torch.allclose(model(idx)[0], original(idx)[0])  # the subclass matters
    assert fast_decode.supports(original) and not fast_decode.supports(model)
    generate_both_ways(model)
