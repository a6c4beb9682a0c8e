"""``looped``, the weight-tied discrete control (models/looped.py): one gpt block applied k times, its
number of loops a solver setting like the continuous arms' steps."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl


def configs(k: int, parallel: bool = False) -> tuple[nl.ModelConfig, nl.ModelConfig]:
    base = nl.ModelConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=k, max_seq_len=16, parallel=parallel)
    return nl.config.for_arch(base, "looped"), nl.config.for_arch(base, "gpt")


def tied_gpt(looped: nl.models.CausalLM, gpt_cfg: nl.ModelConfig) -> nl.models.CausalLM:
    """A gpt of gpt_cfg.n_layers blocks, each a copy of the loop's block, with the loop's embeddings."""
    gpt = nl.build_model(gpt_cfg)
    state = {k: v for k, v in looped.state_dict().items() if not k.startswith("ode_block.")}
    for i in range(gpt_cfg.n_layers):
        state.update({f"blocks.{i}.{k}": v for k, v in looped.field.block.state_dict().items()})
    gpt.load_state_dict(state)
    return gpt


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_k_loops_equal_a_gpt_of_k_copies_of_the_block(k, parallel):
    torch.manual_seed(0)
    looped_cfg, gpt_cfg = configs(k, parallel)
    looped = nl.build_model(looped_cfg).eval()
    gpt = tied_gpt(looped, gpt_cfg).eval()
    x = torch.randint(0, 32, (2, 10))
    # x + (a + m) for (x + a) + m, and f * k * (1 / k): equal up to float rounding
    torch.testing.assert_close(looped(x)[0], gpt(x)[0], atol=1e-5, rtol=1e-5)
    assert looped.ode_stats()["nfe"] == k


def test_the_number_of_loops_is_a_solver_setting():
    torch.manual_seed(0)
    looped_cfg, _ = configs(2)
    looped = nl.build_model(looped_cfg).eval()
    x = torch.randint(0, 32, (1, 8))
    looped.set_ode(n_steps=5)
    five = looped(x)[0]
    gpt = tied_gpt(looped, configs(5)[1]).eval()
    torch.testing.assert_close(five, gpt(x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 6])
def test_causal_at_every_number_of_loops_and_decoded_the_same_with_the_cache(k):
    torch.manual_seed(0)
    looped = nl.build_model(configs(3)[0]).eval()
    looped.set_ode(n_steps=k)
    x = torch.randint(0, 32, (1, 10))
    changed = x.clone()
    changed[0, 6] = (x[0, 6] + 1) % 32
    a, b = looped(x)[0], looped(changed)[0]
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:])
    prompt = x[:, :4]
    assert torch.equal(nl.generate(looped, prompt, 5, temperature=0.0),
                       nl.generate(looped, prompt, 5, temperature=0.0, use_cache=False))


def test_a_random_number_of_loops_trains_reproducibly():
    looped_cfg = nl.config.with_values(configs(3)[0], {"vocab_size": 256, "ode.grid_min_steps": 1,
                                                        "ode.grid_max_steps": 5})
    tc = nl.TrainConfig(model=looped_cfg, batch_size=2, seq_len=16, max_steps=6, eval_interval=6, eval_batches=1,
                        progress=False, device="cpu")
    first, second = nl.train(tc), nl.train(tc)
    loops = [m["ode/nfe"] for m in first.metrics]
    assert loops == [m["ode/nfe"] for m in second.metrics] and len(set(loops)) > 1 and max(loops) <= 5
    assert first.final == second.final


def test_the_loop_is_listed_with_the_families_and_has_no_time_input():
    assert "looped" in nl.config.ARCHS and "looped" not in nl.config.CONTINUOUS_ARCHS  # no time, no flow
    model = nl.build_model(configs(2)[0]).eval()
    x = torch.randn(1, 4, 16)
    field = model.field
    assert torch.equal(field(torch.tensor(0.0), x), field(torch.tensor(0.7), x))


@pytest.mark.parametrize("ode, message", [
    (dict(method="rk4"), r"model.arch='looped' applies its block once per step .* needs model.ode.method='euler'"),
    (dict(grid_min_steps=1, grid_max_steps=4, grid_end_jitter=0.1), r"varies its number of loops only"),
])
def test_what_a_loop_cannot_do_is_refused(ode, message):
    with pytest.raises(ValueError, match=message):
        nl.ModelConfig(arch="looped", n_layers=4, ode=nl.ODEConfig(n_steps=4, **ode))


def test_its_depth_is_its_number_of_loops():
    with pytest.raises(ValueError, match=r"model.n_layers=4 but model.ode.n_steps=3: for model.arch='looped'"):
        nl.ModelConfig(arch="looped", n_layers=4, ode=nl.ODEConfig(n_steps=3))
