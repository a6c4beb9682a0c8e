"""Model invariants for every arch: causality, gradient flow, shapes, errors."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nodelm_lib as nl
from nodelm_lib.config import ARCHS
from conftest import assert_every_parameter_gets_a_gradient



class _Operators(TorchDispatchMode):
    """Records every operator run inside it, with the dtypes of its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, {a.dtype for a in args if isinstance(a, torch.Tensor)}))
        return func(*args, **(kwargs or {}))


def tiny(arch: str, **kw) -> nl.ModelConfig:
    base = dict(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=4, max_seq_len=32)
    base.update(kw)
    return nl.ModelConfig(**base)


@pytest.fixture(params=ARCHS)
def model(request):
    torch.manual_seed(0)
    return nl.build_model(tiny(request.param)).eval()


def test_forward_shapes_and_untrained_loss(model):
    idx = torch.randint(0, 64, (3, 20))
    logits, loss = model(idx)
    assert logits.shape == (3, 20, 64) and loss is None
    _, loss = model(idx, torch.randint(0, 64, (3, 20)))
    # (targets unrelated to the input: with tied embeddings, predicting the input token itself
    # is already easier at init.) nanoGPT init gives near-uniform predictions: loss ~ log(vocab)
    assert abs(loss.item() - math.log(64)) < 0.1


def test_causality(model):
    """Changing token j never changes the logits at positions i < j."""
    torch.manual_seed(1)
    idx = torch.randint(0, 64, (2, 24))
    base, _ = model(idx)
    for j in (0, 7, 23):
        changed = idx.clone()
        changed[:, j] = (changed[:, j] + 1) % 64
        logits, _ = model(changed)
        torch.testing.assert_close(logits[:, :j], base[:, :j], rtol=0, atol=1e-6)
        assert (logits[:, j:] - base[:, j:]).abs().max() > 1e-6, "the change at j must be visible from j on"


def test_every_parameter_gets_a_finite_nonzero_gradient(model):
    assert_every_parameter_gets_a_gradient(model, 16)


def test_sequence_longer_than_max_seq_len_is_a_clear_error(model):
    with pytest.raises(ValueError, match="exceeds max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_tied_head_and_param_counts():
    m = nl.build_model(tiny("gpt"))
    assert m.lm_head.weight is m.wte.weight
    total = sum(p.numel() for p in m.parameters())
    assert m.num_params() == total
    assert m.num_params(non_embedding=True) == total - 64 * 32 - 32 * 32
    # 4 blocks of 12 D^2 + 13 D (weights, biases, 2 layer norms) plus the final norm
    d = 32
    assert m.num_params(non_embedding=True) == 4 * (12 * d * d + 13 * d) + 2 * d


def test_hybrid_structure_and_output_scale():
    m = nl.build_model(tiny("hybrid", n_layers=6, ode_start=2, ode_end=4))
    assert len(m.early_blocks) == 2 and len(m.late_blocks) == 2
    assert m.ode_block.field.scale.item() == pytest.approx(0.1)
    assert "ode_block" in m.param_groups()


def test_hybrid_control_changes_logits_and_is_validated():
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid")).eval()
    idx = torch.randint(0, 64, (2, 10))
    plain, _ = m(idx)
    steered, _ = m(idx, control=torch.randn(2, 4))
    assert (steered - plain).abs().max() > 1e-6
    broadcast, _ = m(idx, control=torch.ones(4))
    per_row, _ = m(idx, control=torch.ones(2, 4))
    torch.testing.assert_close(broadcast, per_row)
    with pytest.raises(ValueError, match="control must have shape"):
        m(idx, control=torch.ones(3))
    no_control = nl.build_model(tiny("hybrid", control_dim=0))
    with pytest.raises(ValueError, match="control_dim=0"):
        no_control(idx, control=torch.ones(4))


def test_hybrid_gets_control_gradient():
    m = nl.build_model(tiny("hybrid"))
    u = torch.randn(2, 4, requires_grad=True)
    _, loss = m(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)), control=u)
    loss.backward()
    assert u.grad is not None and u.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["euler", "reversible_heun", "rk4", "dopri5"])
def test_hybrid_integrates_with_each_method(method):
    """Fixed-step methods run in-library, adaptive ones through torchdiffeq; both agree
    with a fine rk4 reference because the initial field is small and smooth."""
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid")).eval()
    idx = torch.randint(0, 64, (1, 12))
    m.ode_block.ode = nl.ODEConfig(method="rk4", n_steps=64)
    ref, _ = m(idx)
    m.ode_block.ode = nl.ODEConfig(method=method, n_steps=8, rtol=1e-7, atol=1e-8)
    out, _ = m(idx)
    atol = {"euler": 1e-3, "reversible_heun": 1e-4}.get(method, 1e-5)  # order 1, 2, then 4-5
    torch.testing.assert_close(out, ref, rtol=0, atol=atol)


def test_unknown_arch_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'gpt', 'hybrid'"):
        nl.ModelConfig(arch="transformer")
    with pytest.raises(ValueError, match="vocab_size is None"):
        nl.build_model(nl.ModelConfig(arch="gpt"))


@pytest.mark.parametrize("columns", [7, 40, 1024])  # 7: six vocabulary blocks, the last one partial
@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_chunked_linear_cross_entropy_matches_the_full_logits(chunk, columns, monkeypatch):
    from nodelm_lib.nn import losses
    from nodelm_lib.nn.losses import linear_cross_entropy

    monkeypatch.setattr(losses, "HEAD_COLUMNS", columns)
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 40, (50,))
    ref = torch.nn.functional.cross_entropy(h @ w.t(), y)
    ref_gh, ref_gw = torch.autograd.grad(3.0 * ref, (h, w))
    loss = linear_cross_entropy(h, w, y, chunk)
    gh, gw = torch.autograd.grad(3.0 * loss, (h, w))  # the upstream gradient (3) is applied
    assert abs(loss.item() - ref.item()) < 1e-6
    torch.testing.assert_close(gh, ref_gh)
    torch.testing.assert_close(gw, ref_gw)
    with torch.no_grad():
        assert abs(linear_cross_entropy(h, w, y, chunk).item() - ref.item()) < 1e-6


@pytest.mark.parametrize("group_rows", [None, 9])  # 9: the gradient products in six groups of rows
@pytest.mark.parametrize("chunk", [7, None])
def test_under_cpu_bf16_autocast_the_head_products_run_in_bf16_as_autocast_runs_a_linear(chunk, group_rows,
                                                                                          monkeypatch):
    """Autocast does not cast the chunked loss's ``mm(out=)``: the head stayed in float32 under
    ``dtype="bfloat16"`` on a CPU. Now every product takes bf16 operands, and the loss and
    gradients are those of autocast's own ``F.cross_entropy(F.linear(h, w), y)``: the loss to
    float rounding, the gradients exactly in one group of rows and to bf16 rounding in several."""
    from nodelm_lib.nn import losses

    if group_rows:
        monkeypatch.setattr(losses, "LOW_PRECISION_LOGITS", group_rows * 40)
    torch.manual_seed(0)
    h = torch.randn(50, 16, requires_grad=True)
    w = (0.3 * torch.randn(40, 16)).requires_grad_()
    y = torch.randint(0, 40, (50,))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with _Operators() as operators:
            loss = losses.linear_cross_entropy(h, w, y, chunk)
            gh, gw = torch.autograd.grad(loss, (h, w))
        ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w), y)
        with torch.no_grad():
            no_grad_loss = losses.linear_cross_entropy(h, w, y, chunk)
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    products = [dtypes for func, dtypes in operators.calls if func.overloadpacket in (torch.ops.aten.mm,
                                                                                      torch.ops.aten.addmm)]
    assert products and all(dtypes == {torch.bfloat16} for dtypes in products), products
    assert loss.dtype == gh.dtype == gw.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 1e-6 and abs(no_grad_loss.item() - ref.item()) < 1e-6
    tol = dict(rtol=0, atol=0) if group_rows is None else dict(rtol=2e-2, atol=1e-4)
    torch.testing.assert_close(gh, ref_gh, rtol=0, atol=0)
    torch.testing.assert_close(gw, ref_gw, **tol)
    exact = torch.autograd.grad(torch.nn.functional.cross_entropy(h @ w.t(), y), (h, w))
    for got, want in zip((gh, gw), exact):  # and float32's to bf16 rounding
        assert (got - want).norm() < 1e-2 * want.norm()


def test_the_bf16_head_keeps_its_gradient_logits_between_calls_and_computes_the_same():
    """The low-precision loss's gradient-logit buffer G (206 MB at the GPT-2 vocabulary, mmap'd and
    page-faulted every step when fresh) is one kept buffer: the same memory on the next call,
    grown for a larger one, freed by ``release_kept_buffers``, and the numbers are those of a
    fresh buffer filled with garbage."""
    from nodelm_lib.nn import losses

    torch.manual_seed(0)
    h, w, y = torch.randn(50, 16), 0.3 * torch.randn(40, 16), torch.randint(0, 40, (50,))

    def loss_and_grads(rows=50):
        return losses._chunked_cross_entropy_low_precision(h[:rows], w, y[:rows], 7, True, torch.bfloat16)

    losses.release_kept_buffers()
    first = loss_and_grads()
    (kept,) = losses._KEPT_GRADIENT_LOGITS.values()
    kept.fill_(float("nan"))  # whatever the last call left: every row is written before it is read
    second = loss_and_grads(30)
    assert losses._KEPT_GRADIENT_LOGITS[torch.bfloat16, torch.device("cpu")].data_ptr() == kept.data_ptr()
    again = loss_and_grads()
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert all(torch.isfinite(t).all() for t in second)
    losses.release_kept_buffers()
    assert not losses._KEPT_GRADIENT_LOGITS
    loss_and_grads(30)
    assert losses._KEPT_GRADIENT_LOGITS[torch.bfloat16, torch.device("cpu")].numel() == 30 * 40
    for a, b in zip(first, loss_and_grads()):  # grown to 50 rows
        assert torch.equal(a, b)
    assert losses._KEPT_GRADIENT_LOGITS[torch.bfloat16, torch.device("cpu")].numel() == 50 * 40


def test_chunked_loss_backward_hands_its_gradient_over_and_stays_right_when_retained(monkeypatch):
    """loss.backward() gives the head's weight the (V, D) gradient the forward computed (no copy); a retained
    graph backpropagated twice still accumulates twice the true gradient."""
    from nodelm_lib.nn import losses

    handed = []
    backward = losses._ChunkedLinearCrossEntropy.backward

    def spy(ctx, grad_out):
        handed.append(ctx.saved_tensors[1].data_ptr())  # the gradient the forward computed
        return backward(ctx, grad_out)

    monkeypatch.setattr(losses._ChunkedLinearCrossEntropy, "backward", staticmethod(spy))
    torch.manual_seed(0)
    h, y = torch.randn(30, 8), torch.randint(0, 50, (30,))
    w = torch.randn(50, 8, requires_grad=True)
    ref = torch.autograd.grad(torch.nn.functional.cross_entropy(h @ w.t(), y), w)[0]
    losses.linear_cross_entropy(h, w, y, chunk=7).backward()
    assert w.grad.data_ptr() == handed[-1]
    torch.testing.assert_close(w.grad, ref)
    w.grad = None
    loss = losses.linear_cross_entropy(h, w, y, chunk=7)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * ref)


def test_the_head_forward_in_vocabulary_blocks_writes_every_logit(monkeypatch):
    from nodelm_lib.nn import losses

    monkeypatch.setattr(losses, "HEAD_COLUMNS", 16)
    h, w = torch.randn(5, 8), torch.randn(50, 8)  # 50 = 3 blocks of 16 and one of 2
    out = torch.full((5, 50), float("nan"))
    assert losses._logits(h, w, out) is out
    torch.testing.assert_close(out, h @ w.t(), rtol=1e-6, atol=1e-6)


def test_model_loss_without_logits_equals_the_full_path(model):
    idx, tgt = torch.randint(0, 64, (2, 12)), torch.randint(0, 64, (2, 12))
    logits, full = model(idx, tgt)
    none, chunked = model(idx, tgt, return_logits=False)
    assert none is None and abs(full.item() - chunked.item()) < 1e-5
    g_full = torch.autograd.grad(full, model.wte.weight)[0]
    g_chunked = torch.autograd.grad(chunked, model.wte.weight)[0]
    torch.testing.assert_close(g_chunked, g_full, rtol=1e-4, atol=1e-6)


def test_hybrid_checkpoint_sensitivity_gives_the_direct_gradients_even_with_dropout():
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid", dropout=0.1, ode=nl.ODEConfig(method="rk4", n_steps=3))).train()
    idx, tgt, u = torch.randint(0, 64, (2, 10)), torch.randint(0, 64, (2, 10)), torch.randn(2, 4)
    grads = {}
    for sens in ("direct", "checkpoint"):
        m.ode_block.ode = nl.ODEConfig(method="rk4", n_steps=3, sensitivity=sens)
        torch.manual_seed(1)  # same dropout masks; checkpointing must replay them in backward
        _, loss = m(idx, tgt, control=u)
        grads[sens] = torch.autograd.grad(loss, list(m.parameters()))
    for (name, _), a, b in zip(m.named_parameters(), grads["direct"], grads["checkpoint"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7, msg=name)


def test_hybrid_reversible_sensitivity_matches_direct():
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid")).train()
    idx, tgt = torch.randint(0, 64, (2, 10)), torch.randint(0, 64, (2, 10))
    u = torch.randn(2, 4, requires_grad=True)
    grads = {}
    for sens in ("direct", "reversible"):
        m.ode_block.ode = nl.ODEConfig(method="reversible_heun", n_steps=6, sensitivity=sens)
        _, loss = m(idx, tgt, control=u)
        grads[sens] = torch.autograd.grad(loss, [u, *m.parameters()])
    names = ["control"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, grads["direct"], grads["reversible"]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    m_drop = nl.build_model(tiny("hybrid", dropout=0.1, ode=nl.ODEConfig(method="reversible_heun", sensitivity="reversible")))
    with pytest.raises(ValueError, match="needs a deterministic field"):
        m_drop.train()(idx, tgt)


@pytest.mark.parametrize("sensitivity", ["backsolve", "interpolating", "quadrature"])
def test_hybrid_continuous_adjoints_match_direct(sensitivity):
    """Every parameter and the control vector, through the whole model (float32, 16 rk4 steps)."""
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid", ode_scale_init=1.0)).train()
    idx, tgt = torch.randint(0, 64, (2, 10)), torch.randint(0, 64, (2, 10))
    u = torch.randn(2, 4, requires_grad=True)
    grads = {}
    for sens in ("direct", sensitivity):
        m.set_ode(method="rk4", n_steps=16, sensitivity=sens)
        _, loss = m(idx, tgt, control=u)
        grads[sens] = torch.autograd.grad(loss, [u, *m.parameters()])
    assert m.ode_stats()["nfe_backward"] > 0
    names = ["control"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, grads["direct"], grads[sensitivity]):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-6, msg=name)
    m_drop = nl.build_model(tiny("hybrid", dropout=0.1, ode=nl.ODEConfig(sensitivity=sensitivity)))
    with pytest.raises(ValueError, match="needs a deterministic field"):
        m_drop.train()(idx, tgt)


def test_set_ode_evaluates_at_other_steps_and_solvers_and_reports_the_cost():
    torch.manual_seed(0)
    m = nl.build_model(tiny("hybrid", ode=nl.ODEConfig(method="euler", n_steps=4))).eval()
    idx = torch.randint(0, 64, (1, 12))
    m(idx)
    assert m.ode_stats() == {"nfe": 4, "n_accepted": 4, "n_rejected": 0, "nfe_backward": 0}
    m.set_ode(method="rk4", n_steps=32)
    fine, _ = m(idx)
    assert m.ode_stats()["nfe"] == 128
    m.set_ode(method="dopri5", rtol=1e-7, atol=1e-8)
    adaptive, _ = m(idx)
    stats = m.ode_stats()
    assert stats["n_accepted"] >= 1 and stats["nfe"] >= 6 * stats["n_accepted"]
    torch.testing.assert_close(adaptive, fine, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="ode.method"):
        m.set_ode(method="rk5")
    with pytest.raises(ValueError, match="no ODE block"):
        nl.build_model(tiny("gpt")).set_ode(n_steps=2)
    assert nl.build_model(tiny("gpt")).ode_stats() == {}


def host_syncs_of_a_training_pass(arch: str) -> int:
    """Reads of a tensor's value into Python (``.item()``, indexing by a 0-d tensor) in a forward and
    backward: each one stops the host until a GPU has caught up."""
    torch.manual_seed(0)
    model = nl.build_model(tiny(arch, dropout=0.0)).train()
    idx = torch.randint(0, 64, (2, 16))
    with _Operators() as operators:
        model(idx, torch.roll(idx, -1, 1), return_logits=False)[1].backward()
    return sum(func.__name__.startswith("_local_scalar_dense") for func, _ in operators.calls)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_training_pass_reads_no_more_values_to_the_host_than_gpts(arch):
    """The time-dependent arms pick their weights on the time grid on the device: indexing by the
    grid index as a tensor made it a Python int, one host synchronisation per weight per field
    evaluation on a GPU (48 per node step at 02's sizes). gpt's one is the CPU loss's check."""
    assert host_syncs_of_a_training_pass(arch) == host_syncs_of_a_training_pass("gpt")
