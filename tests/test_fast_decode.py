"""Fast decoding (frozen weights, plain functions) against the model's own forward, for every
arch, solver and ablation switch; the fallback for models it does not know; its errors."""

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.generation.sampling import fast_decode
from nodelm_lib.config import ARCHS
from nodelm_lib.models.gpt import GPT
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
