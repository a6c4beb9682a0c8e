"""Weights generated for every time of a fixed-step solve at once (``time_grid.TimeGrid``): the same
model output and gradients as generating them at each field evaluation, with one batched call
per layer per forward pass."""

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.models.common import ODEBlock
from nodelm_lib.nn.time_layers import HyperLinear, ModulatedLinear


def model(arch: str, method: str, dtype=torch.float64):
    torch.manual_seed(0)
    cfg = nl.ModelConfig(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=3, max_seq_len=16,
                         ode=nl.ODEConfig(method=method, n_steps=3), time_features=8, time_hidden=16,
                         hyper_dim=4, ssm_state_size=4)
    m = nl.build_model(cfg).to(dtype)
    with torch.no_grad():  # off the initialisation, so that every time dependence matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def loss_and_grads(m, idx, tgt):
    m.zero_grad()
    _, loss = m(idx, tgt)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["node", "ti_mlp", "ti_ssm"])
@pytest.mark.parametrize("method", ["euler", "rk4", "midpoint"])
def test_grid_gives_the_per_evaluation_loss_and_gradients(monkeypatch, arch, method):
    m = model(arch, method)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    tgt = torch.roll(idx, -1, 1)
    with_grid = loss_and_grads(m, idx, tgt)
    monkeypatch.setattr(ODEBlock, "field_times", lambda self, x: None)  # one weight set per evaluation
    without = loss_and_grads(m, idx, tgt)
    torch.testing.assert_close(with_grid[0], without[0], atol=1e-12, rtol=1e-12)
    assert with_grid[1].keys() == without[1].keys()
    for name in without[1]:
        torch.testing.assert_close(with_grid[1][name], without[1][name], atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("arch, layer", [("node", HyperLinear), ("ti_mlp", ModulatedLinear)])
def test_each_layer_generates_its_weights_once_per_forward(monkeypatch, arch, layer):
    """rk4, 3 steps: 12 field evaluations at 7 distinct times, one batched call per layer."""
    m = model(arch, "rk4")
    calls = []
    original = layer.weights_at
    monkeypatch.setattr(layer, "weights_at", lambda self, inputs: calls.append(len(inputs)) or original(self, inputs))
    m(torch.zeros(1, 5, dtype=torch.long))
    n_layers = sum(isinstance(mod, layer) for mod in m.modules())
    assert calls == [7] * n_layers  # t = 0, 1/6, 1/3, 1/2, 2/3, 5/6 and 1 (midpoints shared by stages 2 and 3)


def test_grid_times_are_the_solver_times_bit_for_bit():
    """The grid's times are formed as the solver forms its stage times, so the field's time
    code is identical with and without the grid (float32: 1/3 and 2/3 are not exact)."""
    m = model("node", "rk4", torch.float32)
    seen = []
    field = m.ode_block.field
    original = field.forward
    field.forward = lambda t, x: seen.append(t.item()) or original(t, x)
    grid = m.ode_block.field_times(torch.zeros(1, dtype=torch.float32))
    m(torch.zeros(1, 4, dtype=torch.long))
    assert sorted(set(seen)) == grid.tolist()


@pytest.mark.parametrize("sensitivity, grad_enabled, batched", [("direct", True, True), ("checkpoint", True, False),
                                                               ("checkpoint", False, True)])
def test_grid_only_where_backward_does_not_evaluate_the_field_again(monkeypatch, sensitivity, grad_enabled, batched):
    """checkpoint recomputes each step in backward, outside the solve: no grid while it trains
    (one weight set per evaluation); with no gradient at all the grid is safe."""
    m = model("node", "euler")
    m.ode_block.ode = nl.ODEConfig(method="euler", n_steps=3, sensitivity=sensitivity)
    sizes = []
    original = HyperLinear.weights_at
    monkeypatch.setattr(HyperLinear, "weights_at", lambda self, inputs: sizes.append(len(inputs)) or original(self, inputs))
    with torch.set_grad_enabled(grad_enabled):
        m(torch.zeros(1, 4, dtype=torch.long))
    assert set(sizes) == ({3} if batched else {1})


def test_no_grid_for_adaptive_methods():
    m = model("node", "euler")
    x = torch.zeros(1, 2, 32, dtype=torch.float64)
    assert m.ode_block.field_times(x) is not None
    m.ode_block.ode = nl.ODEConfig(method="dopri5")
    assert m.ode_block.field_times(x) is None
