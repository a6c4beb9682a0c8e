"""The Triton selective scan (``models/scan_triton.py``) against the sequential reference:
outputs and every input's gradient in float64 to 1e-10, the state's and the outputs' gradients
alone, determinism, and the layer running it. On a GPU the kernels run there; without one,
Triton's interpreter runs them on CPU tensors (``TRITON_INTERPRET=1``, which Triton reads when
it is imported, so it is set here first). Speed: ``bench/scan.py``, ``bench/record.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # a CPU-only process: nothing else here runs Triton
triton = pytest.importorskip("triton")


def _version(module) -> tuple[int, int]:
    return tuple(int(part) for part in module.__version__.split(".")[:2])


if os.environ.get("TRITON_INTERPRET") == "1" and _version(triton) < (3, 7) and _version(np) >= (2, 4):
    # the interpreter converts a one-element array to an int, which NumPy 2.4 refuses
    pytest.skip(f"Triton {triton.__version__}'s interpreter fails under NumPy {np.__version__}: the CPU tests of "
                "the kernels need Triton >= 3.7 or NumPy < 2.4", allow_module_level=True)

from nodelm_lib.models import scan_triton  # noqa: E402
from nodelm_lib.models.scans import selective_scan_reference  # noqa: E402

NAMES = ("x", "delta", "A", "B_s", "C_s", "h0")


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def scan_inputs(B: int, T: int, D: int, N: int, h0: bool = True, seed: int = 0) -> list[torch.Tensor | None]:
    """A scan's inputs in float64, each requiring its gradient: decays in (0, 1) as the layer's."""
    g = torch.Generator().manual_seed(seed)
    x, B_s, C_s = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((B, T, D), (B, T, N), (B, T, N)))
    delta = torch.rand(B, T, D, generator=g, dtype=torch.float64) * 0.5 + 0.01
    A = -torch.rand(D, N, generator=g, dtype=torch.float64) * 2 - 0.05
    state = torch.randn(B, D, N, generator=g, dtype=torch.float64) if h0 else None
    return [None if t is None else t.to(DEVICE).requires_grad_() for t in (x, delta, A, B_s, C_s, state)]


def grads(scan, inputs, use_y: bool = True, use_last: bool = True, seed: int = 1):
    """Outputs and every input's gradient of a random linear function of (y, last)."""
    inputs = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y, last = scan(*inputs)
    g = torch.Generator().manual_seed(seed)
    loss = 0
    if use_y:
        loss = loss + (y * torch.randn(y.shape, generator=g, dtype=y.dtype).to(y.device)).sum()
    if use_last:
        loss = loss + (last * torch.randn(last.shape, generator=g, dtype=last.dtype).to(y.device)).sum()
    loss.backward()
    return y.detach(), last.detach(), [None if t is None else t.grad for t in inputs]


@pytest.mark.parametrize("shape", [(2, 7, 40, 5), (1, 1, 32, 4), (3, 9, 8, 16)])  # partial channel blocks, N not a power of 2
@pytest.mark.parametrize("h0", [True, False])
def test_the_triton_scan_equals_the_reference_with_every_gradient_in_float64(shape, h0):
    inputs = scan_inputs(*shape, h0=h0)
    y, last, got = grads(scan_triton.triton_selective_scan, inputs)
    y_ref, last_ref, want = grads(selective_scan_reference, inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(last, last_ref, rtol=0, atol=1e-10)
    for name, a, b in zip(NAMES, got, want):
        if b is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"grad {name}: {m}")


# many programs, or one block wider than the channels; the loop pipelined or not (a GPU runs it
# either way; Triton's interpreter ignores stages)
@pytest.mark.parametrize("block_d,stages", [(4, scan_triton.STAGES), (64, 1)])
def test_any_channel_block_or_pipelining_gives_the_same_scan(block_d, stages):
    inputs = scan_inputs(2, 5, 40, 3)
    y, last, got = grads(lambda *t: scan_triton.triton_selective_scan(*t, block_d=block_d, stages=stages), inputs)
    y_ref, last_ref, want = grads(selective_scan_reference, inputs)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"grad {name}: {m}")
    with pytest.raises(ValueError, match="block_d=24 is not valid; it must be a power of two"):
        scan_triton.triton_selective_scan(*inputs, block_d=24)
    for stages in (0, 2.0, True):
        with pytest.raises(ValueError, match=f"stages={stages!r} is not valid; it must be a whole number >= 1"):
            scan_triton.triton_selective_scan(*inputs, stages=stages)


@pytest.mark.parametrize("use_y,use_last", [(True, False), (False, True)])
def test_only_the_outputs_or_only_the_last_state_carry_a_gradient(use_y, use_last):
    inputs = scan_inputs(2, 6, 33, 3)
    _, _, got = grads(scan_triton.triton_selective_scan, inputs, use_y, use_last)
    _, _, want = grads(selective_scan_reference, inputs, use_y, use_last)
    for name, a, b in zip(NAMES, got, want):
        b = torch.zeros_like(a) if b is None else b  # the reference's last state does not read C_s
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"grad {name}: {m}")


def test_the_triton_scan_is_deterministic_and_refuses_mixed_or_half_dtypes():
    inputs = [t.detach().float().requires_grad_() for t in scan_inputs(2, 5, 70, 4)]
    first, second = grads(scan_triton.triton_selective_scan, inputs), grads(scan_triton.triton_selective_scan, inputs)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert all(torch.equal(a, b) for a, b in zip(first[2], second[2]))  # partial sums added in a fixed order
    x, delta, A, B_s, C_s, h0 = (t.detach() for t in inputs)
    with pytest.raises(ValueError, match=r"all float32 or all float64; got \['torch.float32', 'torch.float64'\]"):
        scan_triton.triton_selective_scan(x, delta, A.double(), B_s, C_s, h0)
    with pytest.raises(ValueError, match="all float32 or all float64"):
        scan_triton.triton_selective_scan(x.bfloat16(), delta.bfloat16(), A.bfloat16(), B_s.bfloat16(), C_s.bfloat16())
    with pytest.raises(ValueError, match=r"same shape \(B, T, D\)"):
        scan_triton.triton_selective_scan(x, delta[:, :-1], A, B_s, C_s)
    with pytest.raises(ValueError, match=r"T >= 1; got \(2, 0, 70\)"):
        scan_triton.triton_selective_scan(x[:, :0], delta[:, :0], A, B_s[:, :0], C_s[:, :0])
    with pytest.raises(ValueError, match=r"B_s has shape \(2, 5, 3\); with x \(2, 5, 70\) and A's 4 states it must be \(2, 5, 4\)"):
        scan_triton.triton_selective_scan(x, delta, A, B_s[..., :3], C_s)
    with pytest.raises(ValueError, match=r"h0 has shape \(2, 4, 70\); .* must be \(2, 70, 4\)"):
        scan_triton.triton_selective_scan(x, delta, A, B_s, C_s, h0.transpose(1, 2))
    big = torch.zeros(1, 1, 1).expand(2**12, 2**10, 2**5)  # 2**27 positions x channels, no memory
    big_bc = torch.zeros(1, 1, 1).expand(2**12, 2**10, 16)
    with pytest.raises(ValueError, match=r"fewer than 2\*\*31 state entries \(B T D N\); got 2147483648"):
        scan_triton.triton_selective_scan(big, big, torch.zeros(1, 1).expand(2**5, 16), big_bc, big_bc)


def test_a_layer_on_the_triton_kernels_gives_its_reference_forward_and_gradients():
    from nodelm_lib.models.ssm import SelectiveSSM

    torch.manual_seed(0)
    layer = SelectiveSSM(d_model=24, state_size=4, hidden=8).double().to(DEVICE)
    u, h = (torch.randn(*shape, dtype=torch.float64).to(DEVICE) for shape in ((2, 6, 24), (8,)))
    want = layer.reference_forward(u, h)
    (w_grad,) = torch.autograd.grad(want.square().sum(), layer.A_log)
    layer.kernel = "triton"
    got = layer(u, h)
    (g_grad,) = torch.autograd.grad(got.square().sum(), layer.A_log)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g_grad, w_grad, rtol=1e-10, atol=1e-10)
    layer.kernel = "cuda"
    with pytest.raises(ValueError, match="kernel='cuda' is not valid; choose None"):
        layer(u, h)


def test_a_compiled_layer_runs_the_triton_scan_as_one_operator_without_a_graph_break():
    from nodelm_lib.models.ssm import SelectiveSSM

    torch.manual_seed(0)
    layer = SelectiveSSM(d_model=24, state_size=4, hidden=8).to(DEVICE)
    u, h = torch.randn(2, 6, 24, device=DEVICE), torch.randn(8, device=DEVICE)
    want = layer.reference_forward(u, h)
    (w_grad,) = torch.autograd.grad(want.square().sum(), layer.A_log)
    layer.kernel = "triton"
    compiled = torch.compile(layer, fullgraph=True)  # a graph break would raise here
    got = compiled(u, h)
    (g_grad,) = torch.autograd.grad(got.square().sum(), layer.A_log)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_grad, w_grad, rtol=1e-5, atol=1e-6)

