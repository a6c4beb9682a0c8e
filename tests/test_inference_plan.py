"""An inference solve's grid is formed once per setting (``ODEBlock.inference_plan``): the planned
solve is the unplanned one bit for bit, for every one-block family, and the plan follows the
settings (steps, method, dtype, mode). Also Euler's single stage weight (``weighted_sum``)."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.models.common import ODEBlock
from nodelm_lib.ode.runge_kutta import weighted_sum

ARCHS = ["node", "ti_mlp", "ti_ssm", "looped", "hybrid"]
SETTINGS = [dict(method="euler", n_steps=n) for n in (1, 3, 4)] + [dict(method="rk4", n_steps=2),
                                                                   dict(method="midpoint", n_steps=3)]


def model(arch: str):
    torch.manual_seed(0)
    cfg = nl.config.for_arch(nl.ModelConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=4, max_seq_len=16,
                                            time_features=8, time_hidden=16, hyper_dim=4, ssm_state_size=4), arch)
    m = nl.build_model(cfg)
    with torch.no_grad():  # off the initialisation, so that every part of the field matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def tokens(seed=1):
    return torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def eval_logits(m, idx):
    return m(idx)[0]


def settings_for(arch):
    return [s for s in SETTINGS if s["method"] == "euler"] if arch == "looped" else SETTINGS  # a loop is Euler's


@pytest.mark.parametrize("arch", ARCHS)
def test_a_planned_solve_is_the_unplanned_one_bit_for_bit(monkeypatch, arch):
    m = model(arch)
    idx = tokens()
    for setting in settings_for(arch):
        m.set_ode(**setting)
        with monkeypatch.context() as patch:
            patch.setattr(ODEBlock, "inference_plan", lambda self, x: None)
            reference = eval_logits(m, idx)
            reference_nfe = m.ode_block.counters.nfe
        for _ in range(2):  # the first pass forms the plan, the second reads it
            assert torch.equal(eval_logits(m, idx), reference), setting
            assert m.ode_block.counters.nfe == reference_nfe, setting
        assert m.ode_block._plan is not None and m.ode_block._plan.ode == m.ode_block.ode


def test_the_plan_is_formed_once_and_follows_the_setting_dtype_and_mode():
    m = model("ti_mlp")
    idx = tokens()
    eval_logits(m, idx)
    plan = m.ode_block._plan
    eval_logits(m, tokens(2))
    assert m.ode_block._plan is plan  # reused: same steps, same dtype
    m.set_ode(n_steps=2)
    eval_logits(m, idx)
    assert m.ode_block._plan is not plan and len(m.ode_block._plan.steps) == 2
    m.ode_block.ode.n_steps = 5  # changed in place: the plan compares the settings, not the object
    eval_logits(m, idx)
    assert len(m.ode_block._plan.steps) == 5
    m.double()
    eval_logits(m, idx)
    assert m.ode_block._plan.dtype == torch.float64
    m.train()
    assert m.ode_block._plan is None
    m.eval()


def test_no_plan_with_autograd_in_training_or_for_an_adaptive_method():
    m = model("node")
    idx = tokens()
    with torch.enable_grad():
        m(idx)
    assert m.ode_block._plan is None
    m.train()
    with torch.no_grad():
        m(idx)
    assert m.ode_block._plan is None
    m.eval()
    m.set_ode(method="dopri5", rtol=1e-4, atol=1e-5)
    eval_logits(m, idx)
    assert m.ode_block._plan is None and m.ode_block.counters.nfe > 0


def test_a_planned_solve_is_causal():
    m = model("ti_ssm")
    idx = tokens()
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    before, after = eval_logits(m, idx), eval_logits(m, changed)
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.equal(before[:, 10:], after[:, 10:])


def test_a_single_weight_of_one_returns_its_stage_and_other_weights_sum():
    k = [torch.randn(5, 7) for _ in range(3)]
    assert weighted_sum([1.0], k[:1]) is k[0]
    assert weighted_sum([0.0, 1.0], k[:2]) is k[1]
    assert torch.equal(weighted_sum([0.5], k[:1]), k[0] * 0.5)
    total = weighted_sum([1.0, 0.0, 2.0], k)
    assert torch.equal(total, (k[0] * 1.0).add_(k[2], alpha=2.0))
    assert total is not k[0]
    before = k[0].clone()
    assert torch.equal(k[0], before)  # a sum of several stages does not write into the first


def test_euler_steps_and_gradients_are_unchanged_by_the_single_weight():
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 6, requires_grad=True)
    field = lambda t, h: torch.tanh(h @ w) * (1 + t)  # noqa: E731
    out = nl.odeint(field, x, torch.tensor([0.0, 1.0]), method="euler", steps_per_interval=4)[-1]
    out.sum().backward()
    grads = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    h = x
    for m in range(4):  # x + dt * (f * 1.0), as the stage's copy computed it
        h = torch.addcmul(h, field(torch.tensor(0.25 * m), h) * 1.0, torch.tensor(0.25))
    h.sum().backward()
    assert torch.equal(out, h)
    assert torch.equal(grads[0], x.grad) and torch.equal(grads[1], w.grad)
