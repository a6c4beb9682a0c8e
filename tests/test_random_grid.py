"""Training on random solver grids (ode.random_grid, ODEConfig.grid_*): a grid is a function of
(run seed, step), part of the config hash, drawn only in training, and solved as the grid it names."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.ode.random_grid import GridDistribution, step_generator

CONTINUOUS = ["hybrid", "node", "ti_mlp", "ti_ssm"]


def model_config(arch: str, vocab_size: int = 32, **ode) -> nl.ModelConfig:
    cfg = nl.ModelConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=4, max_seq_len=16,
                         ode=nl.ODEConfig(n_steps=4, **ode))
    return nl.config.for_arch(cfg, arch)


def test_a_grid_is_a_function_of_seed_and_step():
    grids = GridDistribution(1, 8, end_jitter=0.25, placement="random")
    draw = lambda seed, step: grids.draw(step_generator(seed, step))  # noqa: E731
    assert torch.equal(draw(0, 3), draw(0, 3))
    assert not torch.equal(draw(0, 3), draw(0, 4)) and not torch.equal(draw(0, 3), draw(1, 3))
    for step in range(200):
        t = draw(7, step)
        n = t.numel() - 1
        assert 1 <= n <= 8 and t[0] == 0 and 0.75 <= t[-1] <= 1.25 and bool((t.diff() > 0).all())
    counts = {draw(7, step).numel() - 1 for step in range(200)}
    assert counts == set(range(1, 9))  # every count of the range is drawn


def test_placement_and_end_time():
    uniform = GridDistribution(5, 5).draw(step_generator(0, 0))
    assert torch.allclose(uniform, torch.linspace(0, 1, 6))
    placed = GridDistribution(5, 5, placement="random").draw(step_generator(0, 0))
    assert placed[-1] == 1 and not torch.allclose(placed, uniform)


def test_the_grid_options_are_part_of_the_hash_and_absent_ones_change_no_hash():
    base = nl.TrainConfig(model=model_config("node"), seq_len=16)
    hashes = {base.config_hash()}
    for ode in (dict(grid_min_steps=1, grid_max_steps=8), dict(grid_end_jitter=0.1), dict(grid_placement="random"),
                dict(grid_min_steps=2, grid_max_steps=8)):
        hashes.add(nl.TrainConfig(model=model_config("node", **ode), seq_len=16).config_hash())
    assert len(hashes) == 5
    stored = nl.config.to_dict(base)  # a record written before the options existed has none of them
    for key in ("grid_min_steps", "grid_max_steps", "grid_end_jitter", "grid_placement"):
        del stored["model"]["ode"][key]
    assert nl.config.from_dict(nl.TrainConfig, stored).config_hash() == base.config_hash()


@pytest.mark.parametrize("arch", CONTINUOUS)
def test_training_solves_the_drawn_grid_and_evaluation_the_trained_one(arch):
    torch.manual_seed(0)
    model = nl.build_model(model_config(arch, grid_min_steps=1, grid_max_steps=8))
    x = torch.randint(0, 32, (2, 8))
    model.train()
    model.draw_step(seed=3, step=11)
    n = model.ode_block.drawn_grid.numel() - 1
    drawn = model(x)[0]
    assert model.ode_stats()["nfe"] == n
    model.eval()
    model(x)
    assert model.ode_stats()["nfe"] == 4
    model.set_ode(n_steps=n)  # the drawn grid is n even steps over [0, 1]: the same solve, up to rounding of t
    assert torch.allclose(model(x)[0], drawn, atol=1e-5)


def test_a_residual_stack_adds_f_once_per_drawn_step():
    torch.manual_seed(0)
    cfg = model_config("ti_mlp", grid_min_steps=2, grid_max_steps=6)
    cfg = nl.config.with_values(cfg, {"integration": "residual"})
    model = nl.build_model(cfg)
    x = torch.randint(0, 32, (2, 8))
    model.train()
    model.draw_step(seed=0, step=1)
    n = model.ode_block.drawn_grid.numel() - 1
    drawn = model(x)[0]
    model.eval()
    model.set_ode(n_steps=n)
    assert n != 4 and torch.allclose(model(x)[0], drawn, atol=1e-5)


@pytest.mark.parametrize("arch", CONTINUOUS)
def test_every_arm_is_causal_on_a_drawn_grid(arch):
    torch.manual_seed(0)
    model = nl.build_model(model_config(arch, grid_min_steps=1, grid_max_steps=8, grid_placement="random",
                                        grid_end_jitter=0.2))
    model.train()
    model.draw_step(seed=1, step=2)
    x = torch.randint(0, 32, (1, 10))
    changed = x.clone()
    changed[0, 6] = (x[0, 6] + 1) % 32
    a, b = model(x)[0], model(changed)[0]
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:])


def test_a_run_on_random_grids_is_reproducible_and_draws_from_seed_and_step():
    tc = nl.TrainConfig(model=model_config("node", vocab_size=256, grid_min_steps=1, grid_max_steps=8), batch_size=2, seq_len=16,
                        max_steps=12, eval_interval=12, eval_batches=1, progress=False, device="cpu")
    first, second = nl.train(tc), nl.train(tc)
    steps = [m["ode/nfe"] for m in first.metrics]
    assert steps == [m["ode/nfe"] for m in second.metrics] and first.final == second.final
    grids = tc.model.ode.training_grids()
    assert steps == [grids.draw(step_generator(tc.seed, k)).numel() - 1 for k in range(12)]
    assert len(set(steps)) > 1


@pytest.mark.parametrize("ode, message", [
    (dict(grid_min_steps=3, grid_max_steps=2), r"ode.grid_min_steps=3, ode.grid_max_steps=2 is not a valid range"),
    (dict(grid_min_steps=0, grid_max_steps=4), r"ode.grid_min_steps=0, ode.grid_max_steps=4 is not a valid range"),
    (dict(grid_end_jitter=1.0), r"ode.grid_end_jitter=1.0 is not valid; it must be in \[0, 1\)"),
    (dict(grid_placement="sobol"), r"ode.grid_placement='sobol' is not valid; choose one of 'uniform', 'random'"),
    (dict(method="dopri5", grid_min_steps=1, grid_max_steps=4), r"random training grids need a fixed-step method"),
])
def test_bad_grid_options_are_named(ode, message):
    with pytest.raises(ValueError, match=message):
        nl.ODEConfig(**ode)


def test_a_residual_stack_may_not_have_a_jittered_or_placed_grid():
    with pytest.raises(ValueError, match="may vary the number of steps only"):
        nl.config.with_values(model_config("ti_mlp", grid_end_jitter=0.1), {"integration": "residual"})
