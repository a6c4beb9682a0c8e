"""The compiled CPU scan (``models/scan_cpu.py``): the library's scan's function at inference, on
every shape the loop handles (channels not a multiple of the vector width, one position, a
starting state, strided slices), causal, and chosen per layer without changing training."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.models import scan_cpu
from nodelm_lib.models.scans import selective_scan, selective_scan_reference
from nodelm_lib.models.ssm import SelectiveSSM, check_kernel, use_scan_kernel

needs_build = pytest.mark.skipif(not scan_cpu.available(), reason=f"cannot build: {scan_cpu.unavailable_reason()}")


def inputs(batch, T, D, N, h0=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, T, D, generator=g)
    # delta, B_s, C_s as the layer makes them: slices of one projection (strided along positions)
    proj = torch.randn(batch, T, D + 2 * N, generator=g)
    delta, B_s, C_s = proj.split([D, N, N], dim=-1)
    delta = torch.nn.functional.softplus(delta)
    A = -torch.rand(D, N, generator=g) * 2 - 0.05
    state = torch.randn(batch, D, N, generator=g) if h0 else None
    return x, delta, A, B_s, C_s, state


@needs_build
@pytest.mark.parametrize("batch,T,D,N,h0", [(3, 17, 24, 4, False), (2, 64, 128, 16, True), (1, 1, 40, 8, True),
                                            (4, 5, 16, 16, False), (2, 9, 7, 3, True)])
def test_the_compiled_scan_computes_the_library_scans_function(batch, T, D, N, h0):
    args = inputs(batch, T, D, N, h0)
    with torch.no_grad():
        y, last = scan_cpu.cpu_selective_scan(*args)
        want_y, want_last = selective_scan(*args)
        exact_y, exact_last = selective_scan_reference(*(None if t is None else t.double() for t in args))
    assert y.shape == (batch, T, D) and last.shape == (batch, D, N)
    # within float32 rounding of the library's scan, and as close as it is to the float64 truth
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-5)
    tolerance = 4 * (want_y.double() - exact_y).abs().max().item() + 1e-6
    assert (y.double() - exact_y).abs().max().item() <= tolerance
    torch.testing.assert_close(last.double(), exact_last, rtol=1e-5, atol=1e-5)


@needs_build
def test_the_compiled_scan_is_causal():
    x, delta, A, B_s, C_s, _ = inputs(2, 12, 24, 4)
    with torch.no_grad():
        y = scan_cpu.cpu_selective_scan(x, delta, A, B_s, C_s)[0]
        x2, C2 = x.clone(), C_s.clone()
        x2[:, 7] += 1.0
        C2[:, 7] += 1.0
        y2 = scan_cpu.cpu_selective_scan(x2, delta, A, B_s, C2)[0]
    assert torch.equal(y[:, :7], y2[:, :7])  # nothing before position 7 moves, bit for bit
    assert not torch.equal(y[:, 7], y2[:, 7])


@needs_build
def test_the_compiled_scan_continues_from_a_state_like_one_long_scan():
    x, delta, A, B_s, C_s, _ = inputs(2, 10, 24, 4)
    with torch.no_grad():
        whole, last = scan_cpu.cpu_selective_scan(x, delta, A, B_s, C_s)
        first, mid = scan_cpu.cpu_selective_scan(x[:, :6], delta[:, :6], A, B_s[:, :6], C_s[:, :6])
        rest, end = scan_cpu.cpu_selective_scan(x[:, 6:], delta[:, 6:], A, B_s[:, 6:], C_s[:, 6:], mid)
    assert torch.equal(torch.cat([first, rest], 1), whole) and torch.equal(end, last)


@needs_build
def test_with_autograd_or_in_float64_the_library_scan_runs_unchanged():
    args = inputs(2, 8, 24, 4, h0=True)
    x = args[0].clone().requires_grad_()
    y, _ = scan_cpu.cpu_selective_scan(x, *args[1:])
    want, _ = selective_scan(x, *args[1:])
    assert torch.equal(y, want) and y.requires_grad
    double = [None if t is None else t.double() for t in args]
    with torch.no_grad():
        assert torch.equal(scan_cpu.cpu_selective_scan(*double)[0], selective_scan(*double)[0])


def test_another_device_or_a_bad_shape_is_refused_with_the_reason():
    args = inputs(2, 8, 24, 4)
    with pytest.raises(ValueError, match=r"kernel='cpu' runs on CPU tensors; got tensors on \['meta'\]"):
        scan_cpu.cpu_selective_scan(*(t.to("meta") for t in args[:5]))
    x, delta, A, B_s, C_s, _ = args
    with torch.no_grad(), pytest.raises(ValueError, match=r"B_s has shape \(2, 8, 5\); .* must be \(2, 8, 4\)"):
        scan_cpu.cpu_selective_scan(x, delta, A, torch.randn(2, 8, 5), C_s)


def test_a_bad_kernel_name_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="kernel='cuda' is not valid; choose None .* 'triton' .* or 'cpu'"):
        check_kernel("cuda")
    with pytest.raises(ValueError, match="kernel='fast' is not valid"):
        use_scan_kernel(torch.nn.Linear(2, 2), "fast")


def test_an_unbuildable_kernel_says_why(monkeypatch):
    monkeypatch.setattr(scan_cpu, "unavailable_reason", lambda: "ninja is not installed")
    scan_cpu.load_kernel.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="kernel='cpu' cannot be built here: ninja is not installed"):
            scan_cpu.build()
    finally:
        scan_cpu.load_kernel.cache_clear()
    with pytest.raises(ValueError, match=r"cap='SSE' is not valid; choose one of \['AVX512', 'AVX2', 'DEFAULT'\]"):
        scan_cpu.load_kernel("SSE")


@needs_build
def test_a_model_on_the_cpu_kernel_gives_the_same_logits_at_inference_and_trains_as_before():
    cfg = nl.config.for_arch(nl.ModelConfig(vocab_size=32, d_model=48, n_heads=4, n_layers=4, max_seq_len=16), "ti_ssm")
    torch.manual_seed(0)
    model = nl.build_model(cfg).eval()
    tokens = torch.randint(0, 32, (3, 16))
    with torch.no_grad():
        want = model(tokens)[0]
    assert use_scan_kernel(model, "cpu") == sum(isinstance(m, SelectiveSSM) for m in model.modules()) > 0
    with torch.no_grad():
        got = model(tokens)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # training differentiates through the library's scan: the same loss and gradients bit for bit
    model.train()
    loss_cpu = model(tokens, tokens)[1]
    grads_cpu = torch.autograd.grad(loss_cpu, list(model.parameters()), allow_unused=True)
    assert use_scan_kernel(model, None) > 0
    loss = model(tokens, tokens)[1]
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert torch.equal(loss_cpu, loss)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(grads_cpu, grads))
    assert use_scan_kernel(torch.nn.Linear(2, 2), "cpu") == 0  # no SSM: nothing to set


@needs_build
@pytest.mark.slow
@pytest.mark.parametrize("cap", ["AVX2", "DEFAULT"])
def test_the_builds_for_narrower_vectors_compute_the_same_function(cap):
    """Sessions run on AVX2 and AVX-512 CPUs: each build that this CPU can run is checked here."""
    if cap == "AVX2" and scan_cpu.capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's capability is {scan_cpu.capability()}: it cannot run AVX2 code")
    args = inputs(2, 9, 40, 4, h0=True)
    with torch.no_grad():
        rows = [t if t.stride(-1) == 1 else t.contiguous() for t in (args[0], args[1], args[3], args[4])]
        y, last = scan_cpu.load_kernel(cap).scan(rows[0], rows[1], args[2].t().contiguous(), rows[2], rows[3], args[5])
        want_y, want_last = selective_scan(*args)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-5)


@needs_build
@pytest.mark.parametrize("D,h0", [(24, False), (128, True), (7, True)])
def test_the_one_pass_mixing_step_is_the_layers_composition(D, h0):
    x, _, A, B_s, C_s, state = inputs(2, 11, D, 4, h0)
    g = torch.Generator().manual_seed(1)
    raw = torch.randn(2, 11, D, generator=g) * 8  # past softplus's threshold (20) at some entries
    raw[0, 0, 0] = 25.0
    skip, gate = torch.rand(D, generator=g) * 2, torch.randn(2, 11, D, generator=g)
    with torch.no_grad():
        mixed, last = scan_cpu.gated_scan(x, raw, A, B_s, C_s, state, skip, gate)
        y, want_last = selective_scan(x, torch.nn.functional.softplus(raw), A, B_s, C_s, state)
        want = (y + skip * x) * torch.nn.functional.silu(gate)
    torch.testing.assert_close(mixed, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, want_last, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"skip must be \(%d,\) and gate" % D):
        scan_cpu.gated_scan(x, raw, A, B_s, C_s, state, skip[:-1], gate)
