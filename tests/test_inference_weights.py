"""Inference keeps the time-dependent weights of a fixed grid from one forward pass to the next
(``ODEBlock.open_grid``, ``time_grid.KeptGrid``), and the selective scan keeps no states without
autograd: the logits are those of the uncached path exactly, the kept weights are formed again
whenever the parameters, the grid or the mode change, and training is untouched."""

import copy

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.models import scans
from nodelm_lib.models.scans import _SelectiveScan, inference_block, selective_scan
from nodelm_lib.nn.time_layers import HyperLinear, ModulatedLinear

ARCHS = ["node", "ti_mlp", "ti_ssm"]
LAYER = {"node": HyperLinear, "ti_mlp": ModulatedLinear, "ti_ssm": ModulatedLinear}


def model(arch: str):
    torch.manual_seed(0)
    cfg = nl.ModelConfig(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=4, max_seq_len=16,
                         ode=nl.ODEConfig(method="euler", n_steps=4), time_features=8, time_hidden=16,
                         hyper_dim=4, ssm_state_size=4)
    m = nl.build_model(cfg)
    with torch.no_grad():  # off the initialisation, so that every time dependence matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def tokens(seed=1, shape=(3, 16)):
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


def logits(m, idx, keep=True, grad=False):
    """Logits of an eval pass: with or without kept weights, or with autograd on (the training
    path's ops: index_select, the scan that keeps its states)."""
    m.ode_block.keep_inference_weights = keep
    try:
        with torch.set_grad_enabled(grad):
            return m(idx)[0].detach()
    finally:
        m.ode_block.keep_inference_weights = True


def count_weight_calls(monkeypatch, layer) -> list:
    calls = []
    original = layer.weights_at
    monkeypatch.setattr(layer, "weights_at", lambda self, inputs: calls.append(len(inputs)) or original(self, inputs))
    return calls


SETTINGS = [dict(method="euler", n_steps=n) for n in (1, 2, 4, 8)] + [dict(method="rk4", n_steps=2),
                                                                        dict(method="dopri5", rtol=1e-4, atol=1e-5)]


@pytest.mark.parametrize("arch", ARCHS)
def test_kept_weights_give_the_uncached_logits_exactly(arch):
    """Several NFE, a multi-stage method and an adaptive one (no grid: nothing kept), each over two
    passes (the second reads the kept weights) against the uncached path and the training path's
    ops, bit for bit."""
    m = model(arch)
    idx = tokens()
    for setting in SETTINGS:
        m.set_ode(**setting)
        reference = logits(m, idx, keep=False)
        assert torch.equal(logits(m, idx, grad=True), reference), setting
        for _ in range(2):
            assert torch.equal(logits(m, idx), reference), setting


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_are_formed_once_for_many_passes(monkeypatch, arch):
    m = model(arch)
    calls = count_weight_calls(monkeypatch, LAYER[arch])
    n_layers = sum(isinstance(mod, LAYER[arch]) for mod in m.modules())
    with torch.no_grad():
        for seed in range(3):  # other batches, even of another shape, at the same grid
            m(tokens(seed, (2 + seed, 8 + seed)))
    assert calls == [4] * n_layers  # the 4 times of a 4-step Euler grid, once per layer
    with torch.no_grad():
        m.set_ode(n_steps=2)  # another grid: formed for it
        m(tokens())
        m(tokens())
    assert calls == [4] * n_layers + [2] * n_layers


def test_no_kept_weights_with_autograd_in_training_or_when_turned_off(monkeypatch):
    m = model("ti_mlp")
    calls = count_weight_calls(monkeypatch, ModulatedLinear)
    n_layers = sum(isinstance(mod, ModulatedLinear) for mod in m.modules())
    idx = tokens()
    for _ in range(2):
        m(idx)  # eval, gradient on
    with torch.no_grad():
        m.train()
        m(idx), m(idx)
        m.eval()
        m.ode_block.keep_inference_weights = False
        m(idx), m(idx)
    assert calls == [4] * (6 * n_layers)


def _optimizer_step(m):
    """In eval mode (no dropout to turn off): train() alone would drop the kept weights."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    idx = tokens(5)
    m(idx, torch.roll(idx, -1, 1))[1].backward()
    opt.step()


def _load_other_weights(m):
    other = model("node")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    m.load_state_dict(other.state_dict())


def _in_place_update(m):
    with torch.no_grad():
        m.ode_block.field.attn.c_attn.weight_basis.add_(0.1)


def _to_float64(m):
    m.double()


@pytest.mark.parametrize("change", [_optimizer_step, _load_other_weights, _in_place_update, _to_float64])
def test_kept_weights_follow_the_parameters(change):
    """After an optimizer step, load_state_dict, an in-place edit or a dtype change the next pass
    forms the weights again: its logits are the uncached path's with the new parameters."""
    m = model("node")
    idx = tokens()
    with torch.no_grad():
        before = m(idx)[0]
    change(m)
    after = logits(m, idx)
    assert not torch.equal(after.to(before.dtype), before)
    assert torch.equal(after, logits(m, idx, keep=False))


def test_train_and_eval_drop_the_kept_weights():
    m = model("ti_ssm")
    with torch.no_grad():
        m(tokens())
    assert m.ode_block.kept_grid._grid is not None
    m.train()
    assert m.ode_block.kept_grid._grid is None
    m.eval()
    with torch.no_grad():
        m(tokens())
    m.eval()
    assert m.ode_block.kept_grid._grid is None


@pytest.mark.parametrize("arch", ARCHS)
def test_training_gradients_do_not_depend_on_kept_weights(arch):
    """A training step after inference passes (weights kept) has the gradients, bit for bit, of
    the same step in a model that never ran one."""
    fresh, used = model(arch), model(arch)
    with torch.no_grad():
        used(tokens(3)), used(tokens(4))
    grads = []
    for m in (fresh, used):
        m.train()
        idx = tokens(5)
        loss = m(idx, torch.roll(idx, -1, 1))[1]
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(grads[0][1][n], grads[1][1][n]) for n in grads[0][1])


@pytest.mark.parametrize("arch", ARCHS)
def test_causal_with_kept_weights(arch):
    m = model(arch)
    idx = tokens()
    with torch.no_grad():
        base = m(idx)[0]  # forms the kept weights
        for j in (0, 7, 15):
            changed = idx.clone()
            changed[:, j] = (changed[:, j] + 1) % 64
            out = m(changed)[0]
            assert torch.equal(out[:, :j], base[:, :j]), j
            assert not torch.equal(out[:, j:], base[:, j:]), j


def test_a_copied_model_keeps_its_own_weights():
    """deepcopy (the benchmark copies a block per setting): the copy forms its own weights."""
    m = model("ti_mlp")
    idx = tokens()
    with torch.no_grad():
        m(idx)
    twin = copy.deepcopy(m)
    with torch.no_grad():
        twin.ode_block.field.attn.c_attn.weight.mul_(2.0)
    assert torch.equal(logits(twin, idx), logits(twin, idx, keep=False))
    assert torch.equal(logits(m, idx), logits(m, idx, keep=False))
    assert not torch.equal(logits(twin, idx), logits(m, idx))


@pytest.mark.parametrize("T, with_h0", [(16, False), (37, True), (64, False), (5, True)])
def test_scan_without_kept_states_equals_the_differentiable_scan(T, with_h0):
    """No autograd: the states go into one block's buffer, not a full tensor; y and the last
    state are the autograd Function's bit for bit (blocks of 16: T = 37 ends mid-block)."""
    g = torch.Generator().manual_seed(T)
    B, D, N = 3, 8, 4
    x, delta = torch.randn(B, T, D, generator=g), torch.rand(B, T, D, generator=g) * 0.5
    A = -torch.rand(D, N, generator=g) * 2
    B_s, C_s = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g)
    h0 = torch.randn(B, D, N, generator=g) if with_h0 else None
    y_ref, last_ref = _SelectiveScan.apply(x, delta, A, B_s, C_s, h0, 16)
    with torch.no_grad():
        y, last = selective_scan(x, delta, A, B_s, C_s, h0)
    assert torch.equal(y, y_ref) and torch.equal(last, last_ref)


@pytest.mark.parametrize("block", [1, 2, 3, 4, 16, 64])
def test_the_scan_without_kept_states_equals_the_differentiable_scan_at_any_block(block):
    """The inference scan's block is sized to the cache (``inference_block``), not fixed: at any
    block, including one that ends mid-sequence and one past its end, y and the last state are
    the training scan's (blocks of 16) bit for bit, at a width whose read-out is a real matmul
    (D 128, N 16). This is what lets the block change without changing any stored evaluation."""
    g = torch.Generator().manual_seed(block)
    B, T, D, N = 2, 37, 128, 16
    x, delta = torch.randn(B, T, D, generator=g), torch.rand(B, T, D, generator=g) * 0.5
    A = -torch.rand(D, N, generator=g) * 16
    B_s, C_s, h0 = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g), torch.randn(B, D, N, generator=g)
    y_ref, last_ref = _SelectiveScan.apply(x, delta, A, B_s, C_s, h0, scans.SCAN_BLOCK)
    with torch.no_grad():
        y, last = selective_scan(x, delta, A, B_s, C_s, h0, block=block)
    assert torch.equal(y, y_ref) and torch.equal(last, last_ref)


def test_the_inference_block_is_the_largest_power_of_two_that_fits_the_cache_budget(monkeypatch):
    """Two (block, B, N, D) buffers fit ``INFERENCE_BLOCK_BYTES``: 4 positions at 02's cpu shape
    (B 12, N 16, D 128, float32: 192 KiB per position), 64 for one window of 08 (B 1), and one
    position when even one does not fit."""
    monkeypatch.setattr(scans, "INFERENCE_BLOCK_BYTES", 1 << 20)
    assert inference_block(12, 16, 128) == 4
    assert inference_block(1, 16, 128) == 64
    assert inference_block(12, 16, 128, itemsize=8) == 2
    assert inference_block(512, 16, 128) == 1
    for batch in range(1, 40):
        block = inference_block(batch, 16, 128)
        assert block & (block - 1) == 0
        assert 2 * block * batch * 16 * 128 * 4 <= (1 << 20) or block == 1
        assert 4 * block * batch * 16 * 128 * 4 > (1 << 20)  # twice the block would not fit
