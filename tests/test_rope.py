"""Rotary positions (``position="rope"``): the rotation against explicit rotation matrices, the
relative-position property, and every arch with rope: causal, finite non-zero gradients, every
gradient method, KV-cache and fast decoding equal to recomputing (past ``max_seq_len`` too), and
a gpt evaluated at 4x its training context equal to a slow float64 reference. Learned positions
keep refusing sequences past ``max_seq_len``."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.generation.sampling import fast_decode
from nodelm_lib.config import ARCHS, CONTINUOUS_ARCHS
from nodelm_lib.nn.decode_cache import DecodeCache
from nodelm_lib.nn.layers import ROPE_BASE, CausalSelfAttention, apply_rope, rope_cos_sin
from nodelm_lib.models import param_count_formula
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS
from nodelm_lib.nn.time_layers import TimeAttention
from nodelm_lib.training.evaluation import evaluate_split
from conftest import assert_every_parameter_gets_a_gradient

from test_generate import small, trained_like

F64 = torch.float64
CONTEXT = 8  # max_seq_len of the models below: the "training context"


def rope_model(arch: str, method: str = "euler", n: int = 2, **kw) -> nl.models.CausalLM:
    """A small rope model moved off its initialisation, ``n`` layers (= solver steps)."""
    kw = {"max_seq_len": CONTEXT, **kw}
    return trained_like(small(arch, method, n_layers=n, ode=nl.ODEConfig(method=method, n_steps=n),
                              position="rope", **kw))


def rotation_matrices(positions, head_dim: int) -> torch.Tensor:
    """R_p (head_dim, head_dim) in float64 for each position p, from Python's math: the rotation by
    p theta_i in the plane of dimensions (i, i + head_dim / 2), theta_i = base^(-2i / head_dim)."""
    half = head_dim // 2
    R = torch.zeros(len(positions), head_dim, head_dim, dtype=F64)
    for n, p in enumerate(positions):
        for i in range(half):
            angle = p * ROPE_BASE ** (-2 * i / head_dim)
            c, s = math.cos(angle), math.sin(angle)
            R[n, i, i], R[n, i, i + half], R[n, i + half, i], R[n, i + half, i + half] = c, -s, s, c
    return R


def rotate_slowly(x: torch.Tensor, start: int) -> torch.Tensor:
    """x (..., T, d_h) rotated position by position with ``rotation_matrices``."""
    R = rotation_matrices(range(start, start + x.shape[-2]), x.shape[-1])
    return torch.einsum("tij,...tj->...ti", R, x.to(F64))


# --------------------------------------------------------------------------- the rotation


@pytest.mark.parametrize("start", [0, 5, 4000])
def test_rotation_matches_explicit_rotation_matrices(start):
    """In float64 to rounding; in float32 to float32 rounding of x even at position ~4000, where
    angles formed in float32 would be off by ~2e-4 rad."""
    x = torch.randn(2, 3, 12, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    expected = rotate_slowly(x, start)
    torch.testing.assert_close(apply_rope(x, *rope_cos_sin(start, 12, 16, dtype=F64)), expected, rtol=0, atol=1e-12)
    got32 = apply_rope(x.float(), *rope_cos_sin(start, 12, 16, dtype=torch.float32))
    torch.testing.assert_close(got32.double(), expected, rtol=0, atol=2e-6)


def test_scores_depend_on_the_relative_position_only():
    """The same q at every position and the same k at every position: after rotation the score of
    (i, j) is a function of i - j, whatever the offset of the whole sequence, and not a constant."""
    g = torch.Generator().manual_seed(1)
    T, dh = 40, 16
    q, k = (torch.randn(dh, dtype=F64, generator=g).expand(1, 1, T, dh) for _ in range(2))

    def scores(start: int) -> torch.Tensor:
        cos, sin = rope_cos_sin(start, T, dh, dtype=F64)
        return (apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2))[0, 0]

    S = scores(0)
    for shift in (1, 7, 25):
        torch.testing.assert_close(S[shift:, shift:], S[:-shift, :-shift], rtol=0, atol=1e-12)
    torch.testing.assert_close(scores(1000), S, rtol=0, atol=1e-10)
    assert (S[0] - S[0, 0]).abs().max() > 1e-2, "the score must change with the distance"
    torch.testing.assert_close(S.diagonal(), torch.full((T,), float(q[0, 0, 0] @ k[0, 0, 0]), dtype=F64),
                               rtol=0, atol=1e-12)  # distance 0: the unrotated product


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("arch", ARCHS)
def test_a_rope_model_has_no_position_table_and_every_attention_rotates(arch):
    """No ``wpe`` parameter (the counts drop by exactly the table), the same non-embedding count
    as the learned model, and every attention layer rotates: switching one off changes the logits."""
    learned = nl.build_model(small(arch, max_seq_len=CONTEXT))
    model = rope_model(arch, n=3)
    assert model.wpe is None and not any("wpe" in name for name, _ in model.named_parameters())
    assert model.num_params() == learned.num_params() - CONTEXT * model.cfg.d_model
    assert model.num_params(non_embedding=True) == learned.num_params(non_embedding=True)
    assert nl.count_params(model.cfg) == {"total": model.num_params(), "non_embedding": model.num_params(True)}
    attention = [m for m in model.modules() if isinstance(m, (CausalSelfAttention, TimeAttention))]
    assert attention and all(m.rope for m in attention)
    assert not any(m.rope for m in learned.modules() if isinstance(m, (CausalSelfAttention, TimeAttention)))
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base, _ = model(idx)
        for layer in attention:
            layer.rope = False
            assert (model(idx)[0] - base).abs().max() > 1e-6, f"{layer} does not rotate"
            layer.rope = True


def test_node_param_formula_and_evaluate_at_with_rope():
    cfg = small("node", position="rope", n_layers=3)
    model = trained_like(cfg)
    assert param_count_formula(cfg) == {"total": model.num_params(), "non_embedding": model.num_params(True)}
    gpt = model.evaluate_at(3)
    assert gpt.cfg.position == "rope" and gpt.wpe is None
    idx = torch.randint(0, 64, (2, 4 * CONTEXT))
    with torch.no_grad():
        torch.testing.assert_close(gpt(idx)[0], model(idx)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_rope_models_are_causal_at_four_times_their_context(arch):
    """test_models' causality check on a 32-position sequence of a model with max_seq_len 8."""
    model = rope_model(arch)
    idx = torch.randint(0, 64, (2, 4 * CONTEXT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base, _ = model(idx)
        assert torch.isfinite(base).all()
        for j in (0, 7, 20, 31):
            changed = idx.clone()
            changed[:, j] = (changed[:, j] + 1) % 64
            logits, _ = model(changed)
            torch.testing.assert_close(logits[:, :j], base[:, :j], rtol=0, atol=1e-6)
            assert (logits[:, j:] - base[:, j:]).abs().max() > 1e-6, "the change at j must be visible from j on"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_of_a_rope_model_gets_a_finite_nonzero_gradient(arch):
    assert_every_parameter_gets_a_gradient(rope_model(arch, n=3), 2 * CONTEXT)


@pytest.mark.parametrize("arch", ("hybrid", *CONTINUOUS_ARCHS))
@pytest.mark.parametrize("method, sensitivity, tol", [
    ("rk4", "checkpoint", 1e-6),
    ("reversible_heun", "reversible", 1e-5),
    ("rk4", "interpolating", 1e-2),  # a continuous adjoint: the discretisation error (test_model_zoo)
])
def test_gradient_methods_give_the_direct_gradients_with_rope(arch, method, sensitivity, tol):
    model = rope_model(arch, method, n=4).train()
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    extra = {"control": torch.randn(2, 4)} if arch == "hybrid" else {}  # every parameter in use

    def grads():
        model.zero_grad()
        model(idx, idx.roll(-1, 1), **extra)[1].backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    direct = grads()
    model.set_ode(sensitivity=sensitivity)
    other = grads()
    torch.testing.assert_close(other, direct, rtol=0, atol=tol * direct.abs().max().item())


# --------------------------------------------------------------------------- decoding

CASES = [("gpt", "euler"), ("ssm", "euler")] + [(arch, m) for arch in ("hybrid", *CONTINUOUS_ARCHS)
                                                for m in FIXED_STEP_METHODS]


@pytest.mark.parametrize("arch, method", CASES)
def test_greedy_decoding_with_cache_equals_recomputing_with_rope(arch, method):
    """4 + 14 positions: with the default window (max_seq_len 8: the context is cropped and the
    cache rebuilt) and with a window of 4x max_seq_len (cached keys at positions past 8)."""
    model = rope_model(arch, method)
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))
    for window in (None, 4 * CONTEXT):
        cached, cached_logits = nl.generate(model, idx, 14, temperature=0, return_logits=True, window=window)
        plain, plain_logits = nl.generate(model, idx, 14, temperature=0, use_cache=False, return_logits=True,
                                          window=window)
        assert torch.equal(cached, plain)
        torch.testing.assert_close(cached_logits, plain_logits, rtol=0, atol=1e-5)
    # the window matters: 4x the context sees tokens the cropped one has dropped
    assert not torch.allclose(nl.generate(model, idx, 14, temperature=0, return_logits=True)[1],
                              cached_logits, atol=1e-5)


def decode_in_parts(step, idx, parts):
    """``step(chunk)`` -> logits (B, T, V) or last logits (B, V), for consecutive chunks of idx."""
    logits, start = [], 0
    for n in parts:
        out = step(idx[:, start:start + n])
        logits.append(out if out.ndim == 3 else out[:, None])
        start += n
    return logits


PARTS = (5, 1, 1, 3, 12, 1)  # 23 positions, most past max_seq_len 8


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_passes_through_the_modules_match_the_full_forward_past_max_seq_len(arch):
    """A DecodeCache of 4x max_seq_len fed 5, 1, 1, 3, 12, 1 positions: every position's logits
    equal the full 23-position forward's, so each cached key kept its absolute position's rotation."""
    model = rope_model(arch, "rk4" if arch in CONTINUOUS_ARCHS else "euler")
    idx = torch.randint(0, 64, (2, sum(PARTS)), generator=torch.Generator().manual_seed(3))
    cache = DecodeCache(4 * CONTEXT)
    with torch.no_grad():
        full, _ = model(idx)
        parts = decode_in_parts(lambda chunk: model(chunk, cache=cache)[0], idx, PARTS)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    assert cache.length == sum(PARTS)


@pytest.mark.parametrize("arch, method", [(a, "euler") for a in ARCHS] + [("node", "rk4"), ("ti_ssm", "heun")])
def test_fast_decoder_matches_the_forward_pass_past_max_seq_len(arch, method):
    model = rope_model(arch, method)
    assert fast_decode.supports(model)
    idx = torch.randint(0, 64, (2, sum(PARTS)), generator=torch.Generator().manual_seed(4))
    decoder = fast_decode.FastDecoder(model, 4 * CONTEXT)
    with torch.inference_mode():
        full, _ = model(idx)
        got = torch.cat(decode_in_parts(decoder, idx, PARTS), dim=1)
    ends = [sum(PARTS[:i + 1]) - 1 for i in range(len(PARTS))]
    torch.testing.assert_close(got, full[:, ends], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="the cache holds 32 positions"):
        decoder(torch.zeros(2, 10, dtype=torch.long))


def test_cached_passes_with_rope_under_cpu_bf16_autocast_match_the_full_forward():
    model = rope_model("gpt")
    idx = torch.randint(0, 64, (2, 20))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = model(idx)
        cache = DecodeCache(4 * CONTEXT)
        parts = [model(idx[:, a:b], cache=cache)[0] for a, b in ((0, 7), (7, 8), (8, 20))]
    torch.testing.assert_close(torch.cat(parts, dim=1).float(), full.float(), rtol=0, atol=3e-2)


# --------------------------------------------------------------------------- past the training context


def reference_gpt_logits(model, idx: torch.Tensor) -> torch.Tensor:
    """A rope gpt's forward written out in float64: explicit rotation matrices, scores, causal
    mask and softmax, layer norms and MLP from the module's weights (no SDPA, no ``apply_rope``);
    sequential or parallel blocks."""
    cfg = model.cfg
    B, T = idx.shape
    D, H = cfg.d_model, cfg.n_heads
    dh = D // H

    def linear(layer, x):
        return x @ layer.weight.double().T + layer.bias.double()

    def norm(layer, x):
        return F.layer_norm(x, (D,), layer.weight.double(), layer.bias.double())

    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def attention(block, x):
        qkv = linear(block.attn.c_attn, norm(block.ln_1, x)).split(D, -1)
        q, k, v = (z.reshape(B, T, H, dh).transpose(1, 2) for z in qkv)
        q, k = rotate_slowly(q, 0), rotate_slowly(k, 0)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~causal, -math.inf)
        return linear(block.attn.c_proj, (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))

    def mlp(block, x):
        return linear(block.mlp.c_proj, F.gelu(linear(block.mlp.c_fc, norm(block.ln_2, x))))

    x = model.wte.weight.double()[idx]
    for block in model.blocks:
        if block.parallel:
            x = x + attention(block, x) + mlp(block, x)
        else:
            x = x + attention(block, x)
            x = x + mlp(block, x)
    return norm(model.ln_f, x) @ model.wte.weight.double().T


def test_a_rope_gpt_at_four_times_its_context_matches_a_slow_reference():
    model = rope_model("gpt", n=2)
    idx = torch.randint(0, 64, (2, 4 * CONTEXT), generator=torch.Generator().manual_seed(5))
    expected = reference_gpt_logits(model, idx)
    with torch.no_grad():
        torch.testing.assert_close(copy.deepcopy(model).double()(idx)[0], expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(model(idx)[0].double(), expected, rtol=0, atol=1e-4)
    # the reference is not trivially satisfied: without the rotation the logits differ
    model.blocks[0].attn.rope = False
    with torch.no_grad():
        assert (model(idx)[0].double() - expected).abs().max() > 1e-5


def test_a_rope_node_at_four_times_its_context_matches_the_slow_reference_of_its_export():
    """node's Euler solve is its ``evaluate_at`` gpt (parallel blocks), which the float64
    reference evaluates independently: the continuous-depth path past max_seq_len."""
    model = rope_model("node", n=3)
    idx = torch.randint(0, 64, (2, 4 * CONTEXT), generator=torch.Generator().manual_seed(7))
    expected = reference_gpt_logits(model.evaluate_at(3), idx)
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0].double(), expected, rtol=0, atol=1e-4)


def test_evaluating_a_split_at_four_times_the_context():
    """evaluate_split takes seq_len past max_seq_len for rope, and refuses it for learned positions."""
    tokens = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(6)).numpy()
    result = evaluate_split(rope_model("ti_mlp"), tokens, seq_len=4 * CONTEXT, batch_size=4)
    assert result["seq_len"] == 32 and math.isfinite(result["loss"])
    learned = trained_like(small("ti_mlp", max_seq_len=CONTEXT, n_layers=3))
    with pytest.raises(ValueError, match="seq_len=32 exceeds the model's max_seq_len=8"):
        evaluate_split(learned, tokens, seq_len=32)


@pytest.mark.parametrize("arch", ARCHS)
def test_learned_positions_refuse_contexts_past_max_seq_len(arch):
    """The forward pass, the fast decoder and generate's window all say max_seq_len."""
    model = trained_like(small(arch, max_seq_len=CONTEXT))
    assert model.context_limit == CONTEXT and rope_model(arch).context_limit is None
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    decoder = fast_decode.FastDecoder(model, 4 * CONTEXT)
    with torch.inference_mode(), pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len=8"):
        decoder(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="window=9 exceeds max_seq_len=8: a model with model.position='learned'"):
        nl.generate(model, torch.zeros(1, 2, dtype=torch.long), 1, window=9)


# --------------------------------------------------------------------------- config and files


def test_position_is_validated_and_parsed_from_text():
    with pytest.raises(ValueError, match="model.position='alibi' is not valid; choose one of 'learned', 'rope'"):
        nl.ModelConfig(position="alibi")
    with pytest.raises(ValueError, match=r"model.d_model / model.n_heads = 3 is odd"):
        nl.ModelConfig(position="rope", d_model=12, n_heads=4)
    tc = nl.apply_overrides(nl.TrainConfig(), ["model.position=rope"])
    assert tc.model.position == "rope" and nl.TrainConfig().model.position == "learned"


def test_match_params_by_width_keeps_rope_heads_even():
    cfg = small("gpt", position="rope", n_heads=3, d_model=24)
    target = nl.count_params(small("gpt", d_model=54, n_heads=3))["non_embedding"]
    matched = nl.match_params(cfg, target, by="d_model")
    assert matched.position == "rope" and (matched.d_model // 3) % 2 == 0
    assert abs(nl.count_params(matched)["non_embedding"] - target) / target < 0.2


def test_a_rope_model_file_round_trips(tmp_path):
    model = rope_model("hybrid")
    nl.save_model(model, tmp_path / "m.pt", tokenizer="char")
    back = nl.load_model(tmp_path / "m.pt")
    assert back.cfg.position == "rope" and back.wpe is None
    idx = torch.randint(0, 64, (1, 3 * CONTEXT))
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], model(idx)[0], rtol=0, atol=0)


def test_the_cli_generates_with_a_window_past_max_seq_len_for_rope_only(tmp_path, capsys):
    from nodelm_lib.cli import main

    for position in ("rope", "learned"):
        torch.manual_seed(0)
        model = nl.build_model(nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=2,
                                              max_seq_len=CONTEXT, position=position))
        nl.save_model(model, tmp_path / f"{position}.pt", tokenizer="char")
    argv = ["generate", "--prompt", "ROMEO:", "--max-new-tokens", "20", "--temperature", "0", "--window", "32"]
    assert main([*argv, "--checkpoint", str(tmp_path / "rope.pt")]) == 0
    assert len(capsys.readouterr().out.rstrip("\n")) >= 6
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--checkpoint", str(tmp_path / "learned.pt")])
    assert exit_info.value.code == 2
    assert "window=32 exceeds max_seq_len=8" in capsys.readouterr().err
