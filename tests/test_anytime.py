"""Loss against inference compute (experiments/anytime.py): the NFE reported is the field's own count,
a setting is restored after use, and the anytime profile and area are what their definitions give."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.experiments import anytime
from nodelm_lib.experiments.anytime import SolveSetting


def tiny(arch: str) -> nl.models.CausalLM:
    torch.manual_seed(0)
    cfg = nl.config.for_arch(nl.ModelConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_seq_len=16), arch)
    return nl.build_model(cfg).eval()


def batches(n: int = 2, b: int = 3, t: int = 8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 32, (b, t), generator=g), torch.randint(0, 32, (b, t), generator=g)) for _ in range(n)]


def counting(model) -> list[int]:
    """A counter of the model's field evaluations, by a hook on the field module itself."""
    calls = [0]
    block = next(m for m in model.modules() if isinstance(m, nl.models.ODEBlock))
    block.field.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("arch", ["node", "ti_mlp", "ti_ssm", "hybrid"])
def test_the_nfe_reported_is_the_number_of_field_evaluations(arch):
    model, data = tiny(arch), batches()
    calls = counting(model)
    fixed = anytime.evaluate_settings(model, data, [SolveSetting("euler", n_steps=3), SolveSetting("rk4", n_steps=2)])
    assert fixed["nfe"].tolist() == [3, 8] and calls[0] == (3 + 8) * len(data)  # one solve per batch
    calls[0] = 0
    adaptive = anytime.evaluate_settings(model, data, [SolveSetting("dopri5", rtol=1e-3)])
    assert calls[0] == pytest.approx(adaptive["nfe"].iloc[0] * 2 * 3 * 8)  # a solve per token: each prefix alone
    assert adaptive["nfe"].iloc[0] >= 6  # dopri5: at least one accepted step of 6 new stages
    assert (fixed["ms_per_token"] > 0).all() and (fixed["tokens"] == 2 * 3 * 8).all()


def test_the_loss_on_a_fixed_grid_is_the_model_s_own():
    model, data = tiny("node"), batches()
    table = anytime.evaluate_settings(model, data, [SolveSetting("euler", n_steps=2)])
    with torch.no_grad():
        own = sum(float(model(x, y)[1]) for x, y in data) / len(data)
    assert table["loss"].iloc[0] == pytest.approx(own, rel=1e-6)


def test_per_sequence_nfe_matches_the_field_count_and_the_evaluation():
    model, data = tiny("node"), batches(n=1, t=5)
    setting = SolveSetting("dopri5", rtol=1e-4)
    calls = counting(model)
    per_row = anytime.per_sequence_nfe(model, data, setting)
    assert len(per_row) == 3 and calls[0] == pytest.approx(per_row["nfe"].sum() * 5)
    whole = anytime.evaluate_settings(model, data, [setting])
    assert whole["nfe"].iloc[0] == pytest.approx(per_row["nfe"].mean())
    assert whole["loss"].iloc[0] == pytest.approx(per_row["loss"].mean())
    assert (per_row["max_nfe"] >= per_row["nfe"]).all()


@pytest.mark.parametrize("by_prefix", [True, False])
def test_a_stride_scores_every_kth_position_as_the_full_scoring_does(by_prefix):
    model, data = tiny("node"), batches(n=1, t=8)
    setting = SolveSetting("dopri5", rtol=1e-3) if by_prefix else SolveSetting("euler", n_steps=2)
    with anytime.solved_with(model, setting):
        every, _, solved = anytime._scored(model, data, torch.device("cpu"), by_prefix=by_prefix)
        strided, _, strided_solved = anytime._scored(model, data, torch.device("cpu"), by_prefix=by_prefix, stride=3)
    assert strided["position"].unique().tolist() == [2, 5]  # positions k-1, 2k-1, ...
    kept = every[every["position"].isin([2, 5])].reset_index(drop=True)
    pd.testing.assert_frame_equal(strided, kept)
    # the time is per token computed: a prefix solve per scored token, a whole batch on a fixed grid
    assert (solved, strided_solved) == ((3 * 8, 3 * 2) if by_prefix else (3 * 8, 3 * 8))


def test_every_setting_scores_the_same_strided_tokens():
    model, data = tiny("node"), batches(n=1, t=8)
    adaptive, fixed = SolveSetting("dopri5", rtol=1e-3), SolveSetting("euler", n_steps=2)
    calls = counting(model)
    table = anytime.evaluate_settings(model, data, [adaptive, fixed], stride=3)
    assert table["tokens"].tolist() == [3 * 2, 3 * 2]
    assert calls[0] == pytest.approx(table["nfe"].iloc[0] * 6 + 2)  # one adaptive solve per scored prefix
    with anytime.solved_with(model, fixed), torch.no_grad():
        logits, _ = model(data[0][0])
    own = torch.nn.functional.cross_entropy(logits[:, [2, 5]].flatten(0, 1), data[0][1][:, [2, 5]].flatten())
    assert table["loss"].iloc[1] == pytest.approx(float(own), rel=1e-6)
    per_row = anytime.per_sequence_nfe(model, data, adaptive, stride=3)
    assert per_row["nfe"].mean() == pytest.approx(table["nfe"].iloc[0])
    assert anytime.score_as_trained(model, data, stride=3)["loss"] == pytest.approx(table["loss"].iloc[1])


@pytest.mark.parametrize("stride", [0, -1, 1.5, True, "2"])
def test_a_bad_stride_is_named(stride):
    with pytest.raises(ValueError, match="stride"):
        anytime.evaluate_settings(tiny("node"), batches(n=1), [SolveSetting("dopri5", rtol=1e-2)], stride=stride)


def test_a_batch_wide_adaptive_solve_is_not_causal_which_is_why_each_prefix_is_solved_alone():
    model = tiny("ti_mlp")
    x = torch.randint(0, 32, (1, 10), generator=torch.Generator().manual_seed(2))
    changed = x.clone()
    changed[0, 9] = (x[0, 9] + 1) % 32
    with anytime.solved_with(model, SolveSetting("dopri5", rtol=1e-3)), torch.no_grad():
        leaked = not torch.equal(model(x)[0][:, :9], model(changed)[0][:, :9])
        y = torch.zeros_like(x)
        a = anytime._scored(model, [(x, y)], torch.device("cpu"), by_prefix=True)[0]
        b = anytime._scored(model, [(changed, y)], torch.device("cpu"), by_prefix=True)[0]
    assert leaked  # the steps chosen for the whole sequence depend on its last token
    assert a["loss"].iloc[:9].tolist() == b["loss"].iloc[:9].tolist()


def test_a_setting_is_restored_and_the_trained_solve_unchanged():
    model, data = tiny("node"), batches()
    trained = model.ode_block.ode
    before = model(data[0][0])[0]
    anytime.evaluate_settings(model, data, [SolveSetting("dopri5", rtol=1e-2)])
    assert model.ode_block.ode == trained and torch.equal(model(data[0][0])[0], before)


def test_a_model_without_an_ode_block_is_refused():
    with pytest.raises(ValueError, match="GPT has no ODE block to reconfigure"):
        anytime.evaluate_settings(tiny("gpt"), batches(), [SolveSetting("euler", n_steps=2)])


def test_fixed_grid_settings_cost_the_budgets():
    assert [s.n_steps for s in anytime.fixed_grid_settings([1, 2, 3, 4, 6, 8, 12, 16])] == [1, 2, 3, 4, 6, 8, 12, 16]
    assert [s.n_steps for s in anytime.fixed_grid_settings([1, 2, 3, 4, 6, 8, 12, 16], "rk4")] == [1, 2, 3, 4]


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="rk5", n_steps=2), r"method='rk5' is not valid; choose one of 'euler'"),
    (dict(method="euler"), r"a fixed-step method \('euler'\) needs n_steps, an integer >= 1; got None"),
    (dict(method="dopri5", rtol=0.0), r"an adaptive method \('dopri5'\) needs rtol, a finite number > 0; got 0.0"),
])
def test_a_bad_setting_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SolveSetting(**kwargs)


CURVE = pd.DataFrame({"nfe": [2, 4, 8, 16], "loss": [3.0, 2.0, 2.5, 1.0]})


def test_the_anytime_profile_is_the_best_loss_within_each_budget():
    profile = anytime.anytime_profile(CURVE, [1, 2, 3, 4, 8, 12, 16, 100])
    assert profile.isna().tolist() == [True] + [False] * 7
    assert profile.iloc[1:].tolist() == [3.0, 3.0, 2.0, 2.0, 2.0, 1.0, 1.0]


def test_the_anytime_area_integrates_the_profile_in_log2_nfe():
    # on [2, 16]: 3.0 over log2 2..4 (width 1), 2.0 over 4..16 (width 2): (3 + 4) / 3
    assert anytime.anytime_area(CURVE, 2, 16) == pytest.approx(7 / 3)
    assert anytime.anytime_area(CURVE, 4, 8) == pytest.approx(2.0)
    assert anytime.anytime_area(CURVE, 2, 32) == pytest.approx((3 + 2 * 2 + 1 * 1) / 4)
    with pytest.raises(ValueError, match="no point within the lowest budget 1 .its cheapest costs 2"):
        anytime.anytime_area(CURVE, 1, 16)
    assert math.isfinite(anytime.anytime_area(CURVE.sample(frac=1, random_state=0), 2, 16))


def test_decoding_at_each_setting_reports_its_nfe_and_speed():
    model = tiny("node")
    prompt = torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(0))
    table = anytime.decode_speed(model, prompt, [SolveSetting("euler", n_steps=2), SolveSetting("rk4", n_steps=1),
                                                 SolveSetting("dopri5", rtol=1e-3)], max_new_tokens=4, rounds=1)
    assert table["nfe"].tolist()[:2] == [2, 4] and table["cached"].tolist() == [True, True, False]
    assert table["nfe"].iloc[2] >= 6 and (table["tokens_per_s"] > 0).all()
    assert model.ode_block.ode.n_steps == 2 and model.ode_block.ode.method == "euler"  # restored


def test_generate_decodes_at_another_depth_with_the_cache_as_without():
    model = tiny("ti_mlp")
    prompt = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(0))
    cached = nl.generate(model, prompt, 6, temperature=0.0, ode={"n_steps": 5})
    assert torch.equal(cached, nl.generate(model, prompt, 6, temperature=0.0, ode={"n_steps": 5}, use_cache=False))
    with anytime.solved_with(model, SolveSetting("euler", n_steps=5)):
        assert torch.equal(cached, nl.generate(model, prompt, 6, temperature=0.0))
    assert model.ode_block.ode.n_steps == 2


@pytest.mark.parametrize("arch", ["hybrid", "node", "ti_mlp", "ti_ssm"])
def test_every_arm_is_causal_at_every_nfe(arch):
    """On every fixed grid of the budgets, and at an adaptive tolerance as evaluate_settings solves it."""
    model = tiny(arch)
    x = torch.randint(0, 32, (1, 10), generator=torch.Generator().manual_seed(2))
    changed = x.clone()
    changed[0, 6] = (x[0, 6] + 1) % 32
    for setting in anytime.fixed_grid_settings([1, 2, 3, 4, 6, 8, 12, 16]):
        with anytime.solved_with(model, setting), torch.no_grad():
            a, b = model(x)[0], model(changed)[0]
        assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:]), setting.label
    y = torch.zeros_like(x)
    with anytime.solved_with(model, SolveSetting("dopri5", rtol=1e-3)):
        a = anytime._scored(model, [(x, y)], torch.device("cpu"), by_prefix=True)[0]["loss"]
        b = anytime._scored(model, [(changed, y)], torch.device("cpu"), by_prefix=True)[0]["loss"]
    assert a.iloc[:6].tolist() == b.iloc[:6].tolist() and a.iloc[6:].tolist() != b.iloc[6:].tolist()
