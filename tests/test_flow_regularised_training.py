"""The flow regularisers as training options (ODEConfig.kinetic_weight, jacobian_weight): the penalty
is minimised with the loss but not logged in it, reaches every continuous arm's parameters (the
Jacobian term backpropagates through attention twice), and is reproducible from the run seed."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.ode.regularisers import kinetic_energy


def model_config(arch: str, **ode) -> nl.ModelConfig:
    cfg = nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=3, max_seq_len=16, control_dim=0,
                         ode=nl.ODEConfig(n_steps=3, **ode))
    return nl.config.for_arch(cfg, arch)


def run(**ode) -> nl.RunRecord:
    tc = nl.TrainConfig(model=model_config("node", **ode), batch_size=2, seq_len=16, max_steps=5, eval_interval=5,
                        eval_batches=1, progress=False, device="cpu")
    return nl.train(tc)


@pytest.mark.parametrize("arch", ["hybrid", "node", "ti_mlp", "ti_ssm"])
def test_the_penalty_reaches_every_parameter_of_the_field(arch):
    torch.manual_seed(0)
    model = nl.build_model(model_config(arch, kinetic_weight=0.5, jacobian_weight=0.5)).train()
    model.draw_step(seed=0, step=0)
    x = torch.randint(0, 256, (2, 8))
    _, loss = model(x, x)
    penalty, logged = model.flow_penalty()
    assert penalty is not None and penalty.item() > 0 and set(logged) == {"flow/kinetic", "flow/jacobian"}
    penalty.backward()
    field = model.ode_block.field
    grads = [p.grad for p in field.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_the_kinetic_term_is_the_left_riemann_sum_of_the_field_along_the_solve():
    torch.manual_seed(0)
    model = nl.build_model(model_config("ti_mlp", kinetic_weight=1.0)).train()
    x = torch.randint(0, 256, (2, 8))
    model(x)
    penalty, _ = model.flow_penalty()
    block, h = model.ode_block, model.embed(x)
    expected = 0.0
    for t, dt in block.step_times(h.dtype):  # Euler: x_{m+1} = x_m + dt f(t_m, x_m)
        f = block.vector_field(t, h)
        expected = expected + dt * kinetic_energy(f)
        h = h + dt * f
    assert penalty.item() == pytest.approx(expected.item(), rel=1e-5)


def test_evaluation_gathers_no_penalty():
    model = nl.build_model(model_config("node", kinetic_weight=1.0, jacobian_weight=1.0)).eval()
    model(torch.zeros(1, 4, dtype=torch.long))
    assert model.flow_penalty() == (None, {})


def test_a_regularised_run_is_reproducible_logs_the_integrals_and_differs_from_a_plain_one():
    plain, first, second = run(), run(kinetic_weight=1.0, jacobian_weight=1.0), run(kinetic_weight=1.0, jacobian_weight=1.0)
    assert [m["loss"] for m in first.metrics] == [m["loss"] for m in second.metrics]
    assert [m["flow/jacobian"] for m in first.metrics] == [m["flow/jacobian"] for m in second.metrics]
    assert "flow/kinetic" not in plain.metrics[0]
    assert plain.metrics[0]["loss"] == first.metrics[0]["loss"]  # the logged loss is the cross-entropy
    assert plain.final["val_loss"] != first.final["val_loss"]  # the penalty's gradient moved the weights


@pytest.mark.parametrize("ode, message", [
    (dict(kinetic_weight=-1.0), r"ode.kinetic_weight=-1.0 is not valid; it must be >= 0"),
    (dict(jacobian_weight=1.0, sensitivity="checkpoint"), r"they need ode.sensitivity='direct' .*got sensitivity='checkpoint'"),
    (dict(kinetic_weight=1.0, method="reversible_heun", sensitivity="direct"), r"ode.method one of 'euler'.*got .*method='reversible_heun'"),
])
def test_bad_regulariser_options_are_named(ode, message):
    with pytest.raises(ValueError, match=message):
        nl.ODEConfig(**ode)


def test_compile_with_a_regulariser_is_refused():
    with pytest.raises(ValueError, match="compile=True with the flow regularisers .* is not supported"):
        nl.TrainConfig(model=model_config("node", kinetic_weight=1.0), seq_len=16, compile=True)


def test_the_training_flops_count_the_mean_grid_and_the_jacobian_vjps():
    from nodelm_lib.training.flops import forward_flops_per_token, training_forward_flops_per_token

    model = nl.build_model(model_config("node")).eval()

    def at(n: int) -> float:
        model.set_ode(n_steps=n)
        return forward_flops_per_token(model, 16, 2)

    plain = model_config("node").ode
    assert training_forward_flops_per_token(model, plain, 16, 2) == 0.0  # the same as the evaluation count
    grids = nl.ODEConfig(n_steps=3, grid_min_steps=2, grid_max_steps=6)
    assert training_forward_flops_per_token(model, grids, 16, 2) == pytest.approx((at(2) + at(6)) / 2)
    assert training_forward_flops_per_token(model, grids, 16, 2) == pytest.approx(at(4))  # linear in the steps
    jacobian = nl.ODEConfig(n_steps=3, jacobian_weight=1.0)
    per_step = at(4) - at(3)
    assert training_forward_flops_per_token(model, jacobian, 16, 2) == pytest.approx(at(3) + 3 * 2 * per_step)
    model.set_ode(n_steps=3)


def test_a_run_records_its_training_flops():
    record = run(grid_min_steps=4, grid_max_steps=8)  # 6 steps on average, 3 in evaluation
    assert record.step_flops_per_token == record.train_flops_per_token > record.flops_per_token
    assert run().train_flops_per_token == 0.0
