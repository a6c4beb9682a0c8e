"""Attention's two kernels: torch's scaled_dot_product_attention, and the explicit products
``attend`` runs instead on a CPU in bf16 / fp16 (where torch's CPU flash kernel is 3-5x slower;
``bench/attention.py``). Both must give the same function, gradients, masks and causality."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import nodelm_lib as nl
from nodelm_lib.config import ARCHS
from nodelm_lib.nn.layers import attend, explicit_attention

FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class _Ops(TorchDispatchMode):
    """The set of aten operators run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def qkv(B=2, H=3, T=9, S=None, dh=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, dh, dtype=dtype, generator=g)
    k, v = (torch.randn(B, H, S or T, dh, dtype=dtype, generator=g) for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)]


@pytest.mark.parametrize("case", ["causal", "decode_mask", "no_mask"])
def test_explicit_attention_is_sdpa_in_float64_with_its_gradients(case):
    """The same function and gradients as torch's SDPA, to float64 rounding: the causal square,
    the decode cache's rectangle (3 new queries after 6 cached keys), and no mask."""
    T, S = (3, 9) if case == "decode_mask" else (9, 9)
    allowed = {"causal": torch.ones(T, T, dtype=torch.bool).tril(),
               "decode_mask": torch.ones(T, S, dtype=torch.bool).tril(S - T), "no_mask": None}[case]
    ours, ref = qkv(T=T, S=S), qkv(T=T, S=S)
    y = explicit_attention(*ours, allowed)
    y_ref = F.scaled_dot_product_attention(*ref, attn_mask=allowed)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    w = torch.randn_like(y)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)


def test_explicit_attention_dropout_drops_the_weights():
    """``dropout_p`` acts on the attention weights: at p = 1 every weight is dropped."""
    q, k, v = qkv()
    assert explicit_attention(q, k, v, None, dropout_p=1.0).abs().max() == 0
    assert explicit_attention(q, k, v, None, dropout_p=0.0).abs().max() > 0


def test_attend_keeps_flash_in_float32_and_runs_explicit_products_under_cpu_bf16_autocast():
    """The kernel choice: float32 on a CPU stays on torch's flash kernel (the faster there);
    bf16 does not use it, and its output is float32's to bf16 precision."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 3 * 32)
    with _Ops() as ops32:
        y32 = attend(x, n_heads=4)
    assert FLASH_CPU in ops32.ops
    with _Ops() as ops16:
        y16 = attend(x.bfloat16(), n_heads=4)
    assert FLASH_CPU not in ops16.ops
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), y32, rtol=0, atol=3e-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_is_causal_under_cpu_bf16_autocast(arch):
    """test_models' causality check on the bf16 path: changing token j leaves the logits before j
    bit for bit unchanged, and changes them from j on."""
    torch.manual_seed(0)
    model = nl.build_model(nl.ModelConfig(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=4,
                                          max_seq_len=32)).eval()
    idx = torch.randint(0, 64, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        base, _ = model(idx)
        for j in (0, 7, 23):
            changed = idx.clone()
            changed[:, j] = (changed[:, j] + 1) % 64
            logits, _ = model(changed)
            assert torch.equal(logits[:, :j], base[:, :j]), f"position < {j} saw token {j}"
            assert (logits[:, j:] - base[:, j:]).abs().max() > 0, "the change at j must be visible from j on"


def test_cached_passes_under_cpu_bf16_autocast_match_the_full_forward():
    """Prefill 7 positions, then 1, then 3 at once, under bf16 autocast (the explicit kernel with
    the cache's rectangular mask): each pass's logits are the full forward's at those positions,
    to bf16 precision."""
    from nodelm_lib.nn.decode_cache import DecodeCache

    torch.manual_seed(0)
    model = nl.build_model(nl.ModelConfig(arch="gpt", vocab_size=64, d_model=32, n_heads=4, n_layers=2,
                                          max_seq_len=16)).eval()
    idx = torch.randint(0, 64, (2, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = model(idx)
        cache = DecodeCache(model.cfg.max_seq_len)
        parts = [model(idx[:, a:b], cache=cache)[0] for a, b in ((0, 7), (7, 8), (8, 11))]
    torch.testing.assert_close(torch.cat(parts, dim=1).float(), full.float(), rtol=0, atol=3e-2)
