"""``time_layers.basis_product``, the hypernetwork's e @ basis with its products split into blocks of
basis rows on a CPU: the same function and gradients as the one product, and the one product
wherever the blocked path does not apply."""

import pytest
import torch

from nodelm_lib.nn import time_layers
from nodelm_lib.nn.time_layers import HyperLinear, basis_product

E, N, S = 37, 96, 4  # E not a multiple of either block size: the last blocks are partial


def inputs(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(S, E, dtype=dtype, generator=g).requires_grad_()
    basis = torch.randn(E, N, dtype=dtype, generator=g).requires_grad_()
    return e, basis


def test_blocked_path_is_taken_and_has_the_products_gradients():
    e, basis = inputs()
    out = basis_product(e, basis)
    assert type(out.grad_fn).__name__ == "_BlockedBasisProductBackward"
    torch.testing.assert_close(out, e @ basis, atol=1e-12, rtol=1e-12)
    assert torch.autograd.gradcheck(basis_product, (e, basis))


def test_float32_gradients_match_autograd_of_the_one_product():
    e, basis = inputs(torch.float32)
    G = torch.randn(S, N, generator=torch.Generator().manual_seed(1))
    blocked = torch.autograd.grad(basis_product(e, basis), (e, basis), G)
    plain = torch.autograd.grad(e @ basis, (e, basis), G)
    for a, b in zip(blocked, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_only_the_inputs_that_need_a_gradient_get_one():
    e, basis = inputs()
    grad_e, = torch.autograd.grad(basis_product(e, basis.detach()), e, torch.ones(S, N, dtype=e.dtype))
    torch.testing.assert_close(grad_e, torch.ones(S, N, dtype=e.dtype) @ basis.detach().t())
    with torch.no_grad():
        out = basis_product(e, basis)
    assert out.grad_fn is None
    torch.testing.assert_close(out, (e @ basis).detach())


@pytest.mark.parametrize("case", ["bf16 autocast", "mixed dtypes", "torch.func"])
def test_one_product_where_the_blocked_path_does_not_apply(monkeypatch, case):
    called = []
    monkeypatch.setattr(time_layers, "_blocked_product", lambda *a: called.append(1))
    e, basis = inputs(torch.float32)
    if case == "bf16 autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = basis_product(e, basis)
        assert out.dtype == torch.bfloat16
    elif case == "mixed dtypes":  # refused, as by the one product
        with pytest.raises(RuntimeError, match="dtype"):
            basis_product(e.double(), basis)
    else:
        out, tangent = torch.func.jvp(lambda v: basis_product(v, basis.detach()), (e.detach(),), (torch.ones_like(e),))
        torch.testing.assert_close(tangent, torch.ones_like(e) @ basis.detach())
    assert not called


def test_hyper_linear_weights_are_unchanged_by_blocking(monkeypatch):
    """W(t) through the blocked path equals B + sum_k e_k(t) A_k summed term by term (float64)."""
    torch.manual_seed(0)
    layer = HyperLinear(8, 12, n_basis=40, code_dim=5, hidden=16).double()
    codes = torch.randn(3, 5, dtype=torch.float64)
    weight, _ = layer.weights_at(codes)
    e = layer.coefficients(codes)
    expected = layer.weight + sum(e[:, k, None, None] * layer.weight_basis[k] for k in range(40))
    torch.testing.assert_close(weight, expected, atol=1e-12, rtol=1e-12)


def test_flop_counter_sees_every_block():
    """``profiling.forward_flops_per_token`` counts a CPU model's products: blocking must not hide
    any (``addmm_`` is not counted by torch's FLOP counter; ``addmm(out=)`` is)."""
    from torch.utils.flop_counter import FlopCounterMode

    e, basis = inputs(torch.float32)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
            basis_product(e, basis)
        assert counter.get_total_flops() == 2 * S * E * N
