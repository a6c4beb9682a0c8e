"""The chunked parallel scan against the sequential loop, and the selective SSM layer's
invariants: equal to its sequential version, causal, stable A(t), modulated in t, every
parameter trained."""

import pytest
import torch

from nodelm_lib.models.scans import COMPILED_SCAN, linear_recurrence, linear_recurrence_reference, selective_scan, selective_scan_reference
from nodelm_lib.models.ssm import SelectiveSSM


def random_recurrence(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=dtype) * 0.98 + 0.01  # in (0, 1)
    b = torch.randn(shape, generator=g, dtype=dtype)
    return a, b


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 16, None])
@pytest.mark.parametrize("T", [1, 5, 16, 17, 64, 100])
def test_scan_matches_reference(T, chunk_size):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        a, b = random_recurrence((3, T, 2), dtype)
        expected = linear_recurrence_reference(a, b)
        got = linear_recurrence(a, b, chunk_size)
        assert got.shape == expected.shape and got.dtype == dtype
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("chunk_size", [1, 4, 16, None])
def test_scan_gradients_match_reference_with_state_shape(chunk_size):
    """(B, T, D, N) states, and d/da, d/db of a random projection of h agree with the loop's."""
    a, b = random_recurrence((2, 37, 3, 4))
    w = torch.randn(a.shape, dtype=a.dtype)
    grads = []
    for fn in (lambda a, b: linear_recurrence(a, b, chunk_size), linear_recurrence_reference):
        a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = fn(a_, b_)
        (out * w).sum().backward()
        grads.append((out.detach(), a_.grad, b_.grad))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_scan_stable_for_extreme_decays():
    """a near 0 and near 1 over T = 512: finite, and equal to the loop (no exp(-cumsum log a))."""
    g = torch.Generator().manual_seed(0)
    a = torch.where(torch.rand(2, 512, 8, generator=g) < 0.5, 1e-30, 1 - 1e-7).float()
    a[:, :, :2] = 1e-38  # near float32's smallest normal: log-space tricks would overflow here
    b = torch.randn(2, 512, 8, generator=g)
    got = linear_recurrence(a, b, 16)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, linear_recurrence_reference(a, b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, 3, 12, -4])
def test_bad_chunk_size_raises(bad):
    with pytest.raises(ValueError, match=f"chunk_size={bad}"):
        SelectiveSSM(8, 4, 6, chunk_size=bad)
    a = torch.rand(1, 4, 2)
    with pytest.raises(ValueError, match=f"chunk_size={bad}"):
        linear_recurrence(a, a, bad)


# --------------------------------------------------------------------------- layer

D, N, H = 12, 4, 6


@pytest.fixture
def layer():
    torch.manual_seed(0)
    ssm = SelectiveSSM(D, N, H, chunk_size=4)
    with torch.no_grad():  # larger weights than at init, so that every path matters in the tests
        for p in ssm.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return ssm


def test_layer_matches_sequential_reference(layer):
    u, h = torch.randn(2, 19, D), torch.randn(H)
    out = layer(u, h)
    assert out.shape == (2, 19, D)
    torch.testing.assert_close(out, layer.reference_forward(u, h), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scan", ["chunked", "fused"])
def test_layer_is_causal(layer, scan):
    """Changing u at position j never changes the output before j (and does change it at j)."""
    if scan == "fused":
        layer = fused_copy(layer)
    u, h = torch.randn(2, 20, D), torch.randn(H)
    base = layer(u, h)
    for j in (0, 7, 19):
        changed = u.clone()
        changed[:, j] += torch.randn(2, D)
        out = layer(changed, h)
        torch.testing.assert_close(out[:, :j], base[:, :j], atol=0, rtol=0)
        assert (out[:, j] - base[:, j]).abs().max() > 1e-4


def fused_copy(layer: SelectiveSSM) -> SelectiveSSM:
    """The same layer with the default (fused) scan instead of the fixture's chunked one."""
    fused = SelectiveSSM(D, N, H)
    fused.load_state_dict(layer.state_dict())
    return fused


def test_A_negative_for_every_t(layer):
    for seed in range(5):
        h = 10 * torch.randn(H, generator=torch.Generator().manual_seed(seed))
        A = layer.A_at(h)
        assert A.shape == (D, N) and (A < 0).all()


def test_init_values():
    torch.manual_seed(0)
    ssm = SelectiveSSM(D, N, H)
    h = torch.zeros(H)  # heads have zero bias: at h = 0, A(t) = -exp(A_log) = -(1..N), D(t) = 1
    torch.testing.assert_close(ssm.A_at(h), -torch.arange(1.0, N + 1).expand(D, N))
    torch.testing.assert_close(ssm.D_at(h), torch.ones(D))
    dt = torch.nn.functional.softplus(ssm.x_proj.bias[:D])
    assert (dt >= 1e-3 - 1e-7).all() and (dt <= 1e-1 + 1e-6).all()
    assert (ssm.x_proj.bias[D:] == 0).all()
    assert not any(name.endswith("c_proj.weight") for name, _ in ssm.named_parameters())


def test_output_depends_on_t(layer):
    u = torch.randn(2, 10, D)
    out_0, out_1 = layer(u, torch.randn(H)), layer(u, torch.randn(H))
    assert (out_0 - out_1).abs().max() > 1e-3


@pytest.mark.parametrize("bias", [True, False])
def test_every_parameter_gets_gradient(bias):
    """At the real init (not the perturbed fixture): a finite, non-zero gradient everywhere."""
    torch.manual_seed(0)
    ssm = SelectiveSSM(D, N, H, bias=bias, chunk_size=4)
    h = torch.randn(H, requires_grad=True)
    out = ssm(torch.randn(2, 9, D), h)
    (out * torch.randn_like(out)).sum().backward()
    for name, p in ssm.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert h.grad.abs().sum() > 0


# --------------------------------------------------------------------------- the fused selective scan


def _scan_inputs(dtype, Bt=3, T=13, D=5, N=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(Bt, T, D, dtype=dtype, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(Bt, T, D, dtype=dtype, generator=g))
    A = -3 * torch.rand(D, N, dtype=dtype, generator=g)
    B_s, C_s = (torch.randn(Bt, T, N, dtype=dtype, generator=g) for _ in range(2))
    h0 = torch.randn(Bt, D, N, dtype=dtype, generator=g)
    return [t.requires_grad_() for t in (x, delta, A, B_s, C_s, h0)]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("with_h0", [False, True])
def test_selective_scan_matches_reference_values_and_gradients(dtype, tol, with_h0):
    """Outputs, last state and the gradients of every input (h0 included) agree with the
    sequential recurrence differentiated by autograd: 1e-10 in float64, 1e-5 in float32."""
    *inputs, h0 = _scan_inputs(dtype)
    inputs = inputs + ([h0] if with_h0 else [])
    y, last = selective_scan(*inputs)
    y_ref, last_ref = selective_scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(last, last_ref, atol=tol, rtol=tol)
    g_y, g_last = torch.randn_like(y), torch.randn_like(last)
    got = torch.autograd.grad((y * g_y).sum() + (last * g_last).sum(), inputs)
    expected = torch.autograd.grad((y_ref * g_y).sum() + (last_ref * g_last).sum(), inputs)
    for name, a, b in zip(("x", "delta", "A", "B", "C", "h0"), got, expected):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("block", [1, 4, 5, 12, 13, 100])
@pytest.mark.parametrize("with_h0", [False, True])
def test_selective_scan_in_blocks_matches_reference(block, with_h0):
    """Any block length (one position, blocks that do or do not divide T = 13, one block, longer
    than T) gives the sequential recurrence's outputs and gradients to 1e-10 in float64: the
    state and the adjoint are carried across block edges."""
    *inputs, h0 = _scan_inputs(torch.float64)
    inputs = inputs + ([h0] if with_h0 else [])
    y, last = selective_scan(*inputs, *([] if with_h0 else [None]), block=block)
    y_ref, last_ref = selective_scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(last, last_ref, atol=1e-10, rtol=1e-10)
    g_y, g_last = torch.randn_like(y), torch.randn_like(last)
    got = torch.autograd.grad((y * g_y).sum() + (last * g_last).sum(), inputs)
    expected = torch.autograd.grad((y_ref * g_y).sum() + (last_ref * g_last).sum(), inputs)
    for name, a, b in zip(("x", "delta", "A", "B", "C", "h0"), got, expected):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=name)


def test_selective_scan_keeps_one_state_sized_tensor_for_backward():
    """Backward rebuilds the decays exp(Delta A) block by block instead of keeping them: of the
    (B, T, D, N)-sized tensors only the states H are saved (peak memory of a ti_ssm training step
    at B 32, T 256: 813 -> 561 MB), and the gradients still match the reference (tests above)."""
    inputs = _scan_inputs(torch.float32, Bt=2, T=20, D=6, N=3)
    state_sized = 2 * 20 * 6 * 3
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, _ = selective_scan(*inputs, block=8)
    assert saved.count(state_sized) == 1, saved
    assert max(saved) == state_sized


def test_selective_scan_rejects_a_bad_block():
    with pytest.raises(ValueError, match="block=0"):
        selective_scan(*_scan_inputs(torch.float64)[:5], block=0)


def test_selective_scan_passes_gradcheck():
    inputs = _scan_inputs(torch.float64, Bt=2, T=5, D=3, N=2)
    assert torch.autograd.gradcheck(lambda *z: selective_scan(*z), inputs)


needs_custom_op = pytest.mark.skipif(COMPILED_SCAN is None, reason="torch.library.custom_op needs torch >= 2.4")


@needs_custom_op
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("use_last", [False, True])
def test_the_compiled_scan_operator_equals_the_eager_scan_bit_for_bit(with_h0, use_last):
    """``torch.ops.nodelm.selective_scan`` (what the model calls while compiling) runs the same
    code as ``_SelectiveScan``: equal outputs and gradients, and opcheck's schema, fake-tensor and
    autograd checks pass. Without the last state's gradient, its grad is None (not zeros)."""
    *inputs, h0 = _scan_inputs(torch.float32, T=37)
    inputs.append(h0 if with_h0 else None)
    leaves = [t for t in inputs if t is not None]
    y, last = selective_scan(*inputs, block=8)
    y_op, last_op, _states = COMPILED_SCAN(*inputs, 8)
    assert torch.equal(y, y_op) and torch.equal(last, last_op) and y_op.is_contiguous()
    g = torch.Generator().manual_seed(1)
    grad_y, grad_last = torch.randn(y.shape, generator=g), torch.randn(last.shape, generator=g)
    loss = (lambda y, last: (y * grad_y).sum() + (use_last and (last * grad_last).sum()))
    expected = torch.autograd.grad(loss(y, last), leaves)
    got = torch.autograd.grad(loss(y_op, last_op), leaves)
    assert all(torch.equal(e, a) for e, a in zip(expected, got, strict=True))
    torch.library.opcheck(COMPILED_SCAN, (*inputs, 8))


def test_selective_scan_continues_from_a_state():
    """Scanning positions [0, j) and then [j, T) from the state at j - 1 equals one scan."""
    x, delta, A, B_s, C_s, _ = (t.detach() for t in _scan_inputs(torch.float64, T=10))
    y, last = selective_scan(x, delta, A, B_s, C_s)
    y1, h = selective_scan(x[:, :4], delta[:, :4], A, B_s[:, :4], C_s[:, :4])
    y2, last2 = selective_scan(x[:, 4:], delta[:, 4:], A, B_s[:, 4:], C_s[:, 4:], h)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, atol=1e-12, rtol=0)
    torch.testing.assert_close(last2, last, atol=1e-12, rtol=0)


def test_fused_layer_matches_reference_and_chunked(layer):
    """The default layer (fused scan) and the chunked one give the reference's outputs."""
    fused = fused_copy(layer)
    u, h = torch.randn(2, 19, D), torch.randn(H)
    torch.testing.assert_close(fused(u, h), layer.reference_forward(u, h), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused(u, h), layer(u, h), atol=1e-5, rtol=1e-5)


def test_selective_scan_rejects_mismatched_shapes():
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="same shape"):
        selective_scan(x, torch.rand(2, 4, 3), -torch.rand(3, 2), torch.randn(2, 5, 2), torch.randn(2, 5, 2))


def test_selective_scan_with_as_many_states_as_channels():
    """N == D must not confuse the layout (a bug found by the whole-split evaluation test)."""
    inputs = _scan_inputs(torch.float64, D=4, N=4)
    y, last = selective_scan(*inputs)
    y_ref, last_ref = selective_scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(last, last_ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("with_h0", [False, True])
def test_one_position_without_gradients_matches_reference(with_h0):
    """A decoding step (T = 1, no gradient wanted) takes the short path (``_scan_step``): the
    sequential recurrence's output and state to 1e-12; with gradients wanted, T = 1 still
    goes through the differentiable scan, with the reference's gradients."""
    x, delta, A, B_s, C_s, h0 = (t.detach() for t in _scan_inputs(torch.float64, T=1))
    h0 = h0 if with_h0 else None
    y_ref, last_ref = selective_scan_reference(x, delta, A, B_s, C_s, *([h0] if with_h0 else []))
    with torch.no_grad():
        y, last = selective_scan(x, delta, A, B_s, C_s, h0)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(last, last_ref, atol=1e-12, rtol=0)
    x.requires_grad_(True)
    y, _ = selective_scan(x, delta, A, B_s, C_s, h0)
    y_ref, _ = selective_scan_reference(x, delta, A, B_s, C_s, *([h0] if with_h0 else []))
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(y_ref.sum(), x)[0],
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("autocast", [False, True])
def test_the_layers_scan_runs_in_float32_whatever_its_inputs_arrive_in(chunk_size, autocast):
    """Under CUDA's autocast the scan's inputs arrive mixed (bf16 projections, a float32 softplus
    and A(t)); a bf16-weight model gives it bf16 throughout. The layer's scan computes in float32
    either way: values and gradients equal the float64 recurrence of the same (rounded) inputs to
    float32 precision, y comes back in x's dtype, the state in float32."""
    *inputs, h0 = _scan_inputs(torch.float32)
    rounded = [t.detach().to(torch.bfloat16) if name in "xBC" else t.detach()
               for name, t in zip(("x", "delta", "A", "B", "C"), inputs)]
    mixed = [t.clone().requires_grad_() for t in rounded]
    exact = [t.double().requires_grad_() for t in rounded]
    scan = SelectiveSSM(5, 4, 6, chunk_size=chunk_size).scan()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y, last = scan(*mixed)
    y_ref, last_ref = selective_scan_reference(*exact)
    assert y.dtype == torch.bfloat16 and last.dtype == torch.float32
    torch.testing.assert_close(y.double(), y_ref, atol=2e-2, rtol=1e-2)  # bf16 rounding of y only
    torch.testing.assert_close(last.double(), last_ref, atol=1e-5, rtol=1e-5)
    g_y = torch.randn(y.shape, dtype=torch.float64)
    got = torch.autograd.grad((y.double() * g_y).sum() + last.sum(), mixed)
    expected = torch.autograd.grad((y_ref * g_y).sum() + last_ref.sum(), exact)
    for name, a, b, t in zip(("x", "delta", "A", "B", "C"), got, expected, mixed):
        assert a.dtype == t.dtype, name
        # dL/dy reaches the scan rounded to bf16 (y's dtype): 2^-8 relative, not float32's 2^-24
        assert (a.double() - b).norm() <= 1e-2 * b.norm(), name
