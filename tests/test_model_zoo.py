"""The continuous-depth model zoo (node, ti_mlp, ti_ssm): evaluate_at, parameter formula and
matching, presets, and the two ablation switches. Invariants every arch must satisfy
(causality, gradients, loss at init, length errors) are in test_models.py."""

import dataclasses

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.config import CONTINUOUS_ARCHS
from nodelm_lib.models import GPT, param_count_formula


def tiny(arch: str, n: int = 4, **kw) -> nl.ModelConfig:
    base = dict(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=n, max_seq_len=32,
                time_features=8, time_hidden=16, ssm_state_size=4, ode=nl.ODEConfig(n_steps=n))
    base.update(kw)
    return nl.ModelConfig(**base)


def perturbed(model: nl.models.CausalLM, scale: float = 0.05) -> nl.models.CausalLM:
    """The model with every parameter moved off its initialisation (zero-initialised
    modulations included), so that no equality below holds by accident of the init."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model.eval()


# --------------------------------------------------------------------------- node


@pytest.mark.parametrize("n", [1, 3, 6])
@pytest.mark.parametrize("switches", [{}, {"modulation": "constant"}, {"integration": "residual"}])
def test_node_evaluate_at_is_the_euler_solve_as_a_gpt(n, switches):
    torch.manual_seed(0)
    model = perturbed(nl.build_model(tiny("node", n, **switches)))
    gpt = model.evaluate_at(n)
    assert isinstance(gpt, GPT) and gpt.cfg.arch == "gpt" and len(gpt.blocks) == n
    idx = torch.randint(0, 64, (2, 20))
    ode_logits, _ = model(idx)
    torch.testing.assert_close(gpt(idx)[0], ode_logits, rtol=0, atol=1e-5)
    # an ordinary gpt: rebuilt from its own config, it takes the exported weights
    again = nl.build_model(gpt.cfg)
    again.load_state_dict(gpt.state_dict())
    torch.testing.assert_close(again.eval()(idx)[0], ode_logits, rtol=0, atol=1e-5)


def test_node_evaluate_at_other_steps_follows_the_solver_grid():
    """evaluate_at(8) of a model configured for 4 steps equals the 8-step Euler solve."""
    model = perturbed(nl.build_model(tiny("node", 4)))
    idx = torch.randint(0, 64, (1, 12))
    model.set_ode(n_steps=8)
    torch.testing.assert_close(model.evaluate_at(8)(idx)[0], model(idx)[0], rtol=0, atol=1e-5)
    # and differs from the 4-step one: the grid matters
    model.set_ode(n_steps=4)
    assert (model.evaluate_at(8)(idx)[0] - model(idx)[0]).abs().max() > 1e-4


def test_node_weights_depend_on_t_and_layer_norms_start_plain():
    model = nl.build_model(tiny("node"))
    f = model.field
    code0, code1 = (nl.nn.time_code(torch.tensor(t), 8) for t in (0.0, 1.0))
    w0, _ = f.attn.c_attn.weight_at(code0)
    w1, _ = f.attn.c_attn.weight_at(code1)
    assert (w0 - w1).abs().max() > 1e-4
    scale, shift = f.ln_1.weight_at(code1)
    assert torch.equal(scale, torch.ones(32)) and torch.equal(shift, torch.zeros(32))


@pytest.mark.parametrize("kw", [
    {},
    {"bias": False},
    {"hyper_dim": 2, "time_features": 4, "time_hidden": 8, "mlp_ratio": 2.5},
    {"d_model": 48, "n_heads": 6, "vocab_size": 100, "max_seq_len": 16},
])
def test_node_param_count_formula(kw):
    cfg = tiny("node", **kw)
    model = nl.build_model(cfg)
    counted = {"total": model.num_params(), "non_embedding": model.num_params(non_embedding=True)}
    assert param_count_formula(cfg) == counted
    assert nl.count_params(cfg) == counted


# --------------------------------------------------------------------------- the switches


@pytest.mark.parametrize("arch", CONTINUOUS_ARCHS)
def test_constant_modulation_makes_the_block_independent_of_t(arch):
    x = torch.randn(2, 10, 32)
    ts = [torch.tensor(t) for t in (0.0, 0.37, 1.0)]
    constant = perturbed(nl.build_model(tiny(arch, modulation="constant")))
    outs = [constant.ode_block.vector_field(t, x) for t in ts]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=0)
    timed = nl.build_model(tiny(arch)).eval()
    timed.load_state_dict(constant.state_dict())  # the same weights: now t matters
    timed = timed.ode_block
    assert (timed.vector_field(ts[0], x) - timed.vector_field(ts[2], x)).abs().max() > 1e-4
    torch.testing.assert_close(timed.vector_field(ts[0], x), outs[0], rtol=0, atol=0)


@pytest.mark.parametrize("arch", CONTINUOUS_ARCHS)
def test_residual_and_ode_integration_differ_by_the_dt_factor(arch):
    n = 4
    torch.manual_seed(0)
    ode = perturbed(nl.build_model(tiny(arch, n)))
    torch.manual_seed(0)
    residual = perturbed(nl.build_model(tiny(arch, n, integration="residual")))
    residual.load_state_dict(ode.state_dict())  # the init differs (residual depth scaling)
    x = torch.randn(2, 10, 32)
    for t in (0.0, 0.5):
        t = torch.tensor(t)
        torch.testing.assert_close(residual.ode_block.vector_field(t, x),
                                   n * ode.ode_block.vector_field(t, x), rtol=1e-6, atol=0)
    # the residual model is the discrete stack x <- x + f(t_k, x); the ode model steps dt f
    with torch.no_grad():
        stack, euler = x, x
        for k in range(n):
            t_k = torch.tensor(k / n)
            stack = stack + ode.field(t_k, stack)
            euler = euler + ode.field(t_k, euler) / n
        torch.testing.assert_close(residual.ode_block(x), stack, rtol=0, atol=1e-5)
        torch.testing.assert_close(ode.ode_block(x), euler, rtol=0, atol=1e-5)


def test_switch_errors_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match="model.modulation='fixed'.*'time', 'constant'"):
        tiny("ti_mlp", modulation="fixed")
    with pytest.raises(ValueError, match="model.integration='resid'.*'ode', 'residual'"):
        tiny("ti_mlp", integration="resid")
    with pytest.raises(ValueError, match="needs model.ode.method='euler', got 'rk4'"):
        tiny("ti_mlp", integration="residual", ode=nl.ODEConfig(method="rk4", n_steps=4))
    with pytest.raises(ValueError, match="applies to archs node, ti_mlp, ti_ssm only"):
        tiny("gpt", modulation="constant")
    with pytest.raises(ValueError, match="model.n_layers=6 but model.ode.n_steps=4"):
        nl.ModelConfig(arch="node", n_layers=6)
    # adaptive solvers choose their own steps: no depth to match
    nl.ModelConfig(arch="node", n_layers=6, ode=nl.ODEConfig(method="dopri5"))


@pytest.mark.parametrize("arch", CONTINUOUS_ARCHS)
@pytest.mark.parametrize("method, sensitivity, tol", [
    ("rk4", "checkpoint", 1e-6),  # exact discrete gradients
    ("reversible_heun", "reversible", 1e-5),  # exact up to the reversal's rounding
    # a continuous adjoint differs from the discrete gradient by the discretisation error
    # (O(h^4) here): this checks the plumbing, test_ode.py checks the convergence
    ("rk4", "interpolating", 1e-2),
])
def test_gradient_methods_apply_to_the_zoo(arch, method, sensitivity, tol):
    """Every arch integrates with any ODEConfig: the gradients of another gradient method
    agree with backprop through the same solver."""
    torch.manual_seed(0)
    model = perturbed(nl.build_model(tiny(arch, ode=nl.ODEConfig(method=method, n_steps=4))))
    idx = torch.randint(0, 64, (2, 12))

    def grads():
        model.zero_grad()
        model(idx, idx.roll(-1, 1))[1].backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    direct = grads()
    model.set_ode(sensitivity=sensitivity)
    other = grads()
    torch.testing.assert_close(other, direct, rtol=0, atol=tol * direct.abs().max().item())


# --------------------------------------------------------------------------- presets and matching


def test_small_preset_is_the_seed_gpu_shape_and_counts_like_a_real_gpt():
    cfg = nl.model_preset("small", "gpt", vocab_size=50257)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads) == (256, 6, 4)
    counts = nl.count_params(cfg)
    # seeds/README: a real 6 x 256 GPT has about 4.8M parameters outside the embeddings
    assert 4.7e6 < counts["non_embedding"] < 4.9e6
    assert counts["total"] == counts["non_embedding"] + 50257 * 256 + 256 * 256
    for arch in CONTINUOUS_ARCHS:
        assert nl.model_preset("small", arch).ode.n_steps == 6
    hybrid = nl.model_preset("small", "hybrid")
    assert (hybrid.ode_start, hybrid.ode_end) == (2, 4)
    assert nl.model_preset("large", "gpt", d_model=512).d_model == 512  # overrides win
    with pytest.raises(ValueError, match="preset='huge'.*'small', 'medium', 'large'"):
        nl.model_preset("huge")


@pytest.mark.parametrize("arch", ["gpt", "node", "ti_ssm"])
def test_match_params_by_width_reaches_the_target(arch):
    reference = nl.count_params(tiny("ti_mlp", d_model=64))["non_embedding"]
    matched = nl.match_params(tiny(arch), reference, by="d_model")
    got = nl.count_params(matched)["non_embedding"]
    # the closest multiple of n_heads: one step of width changes the count by < 15% here
    assert abs(got - reference) / reference < 0.15
    for k in (-1, 1):  # and no neighbouring width is closer
        other = dataclasses.replace(matched, d_model=matched.d_model + k * matched.n_heads)
        assert abs(nl.count_params(other)["non_embedding"] - reference) >= abs(got - reference)


def test_match_params_by_mlp_ratio_keeps_the_width():
    target = nl.count_params(tiny("gpt", mlp_ratio=2.0))["non_embedding"] + 1000
    matched = nl.match_params(tiny("gpt"), target, by="mlp_ratio")
    assert matched.d_model == 32
    got = nl.count_params(matched)["non_embedding"]
    # one unit of MLP hidden size is 2 D + 1 parameters per layer (4 layers)
    assert abs(got - target) <= 4 * (2 * 32 + 1) / 2
    with pytest.raises(ValueError, match="ti_ssm has no MLP"):
        nl.match_params(tiny("ti_ssm"), target, by="mlp_ratio")
    with pytest.raises(ValueError, match="by='depth'.*'d_model', 'mlp_ratio'"):
        nl.match_params(tiny("gpt"), target, by="depth")


def test_time_layers_keep_their_own_init_inside_a_model():
    """CausalLM.init_weights must not flatten what the time-dependent layers set up."""
    ssm = nl.build_model(tiny("ti_ssm")).field.mixer
    dt = torch.nn.functional.softplus(ssm.x_proj.bias[:32])
    assert 1e-3 <= dt.min() and dt.max() <= 1e-1 and dt.std() > 0  # Mamba's dt init survived
    ti = nl.build_model(tiny("ti_mlp")).field
    h0, h1 = ti.modulation(torch.tensor(0.0)), ti.modulation(torch.tensor(1.0))
    assert (h0 - h1).abs().max() > 0.1  # the trunk reads t from the start
    w = ti.mixer.c_fc.weight_at(h1)
    assert 0.015 < w.std() < 0.025  # base N(0, 0.04) times a gate near 1/2
    node = nl.build_model(tiny("node")).field
    e = node.mlp.c_fc.coefficients(nl.nn.time_code(torch.tensor(0.5), 8))
    assert e.abs().max() > 0.05  # O(1) mixing coefficients: every basis matrix learns
