"""Notebook 09's experiment (experiments/inference_compute.py): its arms, its stored curves, and its
tests at NFE budgets, checked on synthetic curves whose answers are known and on a tiny trained run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

import nodelm_lib as nl
from nodelm_lib.experiments.anytime import SolveSetting
from nodelm_lib.experiments import inference_compute as ic
from nodelm_lib.runs import store as run_store


def base_model(arch: str) -> nl.ModelConfig:
    return nl.config.for_arch(nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=2, max_seq_len=16), arch)


def test_the_arms_keep_the_fixed_ones_and_add_random_grids_and_a_regularised_one():
    fixed = {a: {"model": base_model(a)} for a in ("gpt", "node", "ti_mlp")}
    arms = ic.compute_arms(fixed, random_steps=(1, 6), regularised={"node": {"kinetic_weight": 0.1}})
    assert list(arms) == ["gpt", "node", "ti_mlp", "node random", "ti_mlp random", "node reg"]
    assert arms["node"]["model"] == fixed["node"]["model"]  # notebook 02's arm: its stored runs
    random = arms["node random"]["model"].ode
    assert (random.grid_min_steps, random.grid_max_steps, random.kinetic_weight) == (1, 6, 0.0)
    assert arms["node reg"]["model"].ode.kinetic_weight == 0.1 and arms["node reg"]["model"].ode.grid_max_steps == 6
    with pytest.raises(ValueError, match="regularised arm 'hybrid' is none of the arms 'gpt', 'node', 'ti_mlp'"):
        ic.compute_arms(fixed, (1, 6), {"hybrid": {"kinetic_weight": 0.1}})


def synthetic_curves(seeds=range(5)) -> pd.DataFrame:
    """Two arms over NFE 1..8: 'flow' improves with NFE, 'loop' is flat; seed noise shared (paired)."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in seeds:
        noise = rng.normal(0, 0.01)
        for nfe in (1, 2, 4, 8):
            rows.append({"arm": "flow", "seed": seed, "setting": f"euler {nfe}", "adaptive": False, "nfe": nfe,
                         "loss": 2.0 - 0.1 * math.log2(nfe) + noise + rng.normal(0, 0.002), "ms_per_token": nfe})
            rows.append({"arm": "loop", "seed": seed, "setting": f"euler {nfe}", "adaptive": False, "nfe": nfe,
                         "loss": 2.0 + noise + rng.normal(0, 0.002), "ms_per_token": nfe})
    return pd.DataFrame(rows)


def test_budget_tests_are_paired_t_tests_of_the_anytime_profiles():
    curves = synthetic_curves()
    tests = ic.budget_tests(curves, [1, 4, 8], reference="loop")
    assert tests["budget"].tolist() == [1, 4, 8] and (tests["arm"] == "flow").all()
    best = curves[curves["nfe"] <= 8].groupby(["seed", "arm"])["loss"].min().unstack("arm")  # within the budget
    expected = scipy.stats.ttest_rel(best["flow"], best["loop"])
    row = tests[tests["budget"] == 8].iloc[0]
    assert row["p_t"] == pytest.approx(expected.pvalue) and row["mean_diff"] == pytest.approx(-0.3, abs=0.01)


def test_a_fixed_depth_model_is_compared_at_its_own_nfe():
    curves = synthetic_curves()
    gpt = pd.DataFrame({"arm": "gpt", "seed": range(5), "nfe": 4, "loss": [1.9, 1.91, 1.89, 1.9, 1.92]})
    tests = ic.budget_tests(curves, [], reference="loop", points=gpt)
    assert set(tests["arm"]) == {"flow", "loop"} and (tests["budget"] == 4).all() and (tests["reference"] == "gpt").all()
    flow = tests[tests["arm"] == "flow"].iloc[0]
    at4 = curves[(curves["nfe"] == 4) & (curves["arm"] == "flow")].set_index("seed")["loss"]
    assert flow["mean_diff"] == pytest.approx((at4 - gpt.set_index("seed")["loss"]).mean())


def test_areas_and_the_curve_table():
    curves = synthetic_curves()
    areas = ic.area_tests(curves, 1, 8, reference="loop")
    # flow's profile: 2.0 - 0.1 log2(nfe) on [1, 8] in steps: mean over log2 of (2.0, 1.9, 1.8) on widths 1, 1, 1: 1.9
    assert areas.iloc[0]["mean_diff"] == pytest.approx(-0.1, abs=0.01)
    table = ic.curve_table(curves)
    row = table[(table["arm"] == "flow") & (table["setting"] == "euler 8")].iloc[0]
    ci = nl.reporting.stats.mean_ci(curves[(curves["arm"] == "flow") & (curves["nfe"] == 8)]["loss"])
    assert row["loss"] == pytest.approx(ci["mean"]) and row["ci_low"] == pytest.approx(ci["ci_low"]) and row["n_seeds"] == 5


def test_the_curve_grid_has_an_arm_per_row_and_a_setting_per_column_in_the_order_given():
    table = ic.curve_table(synthetic_curves())
    grid = ic.curve_grid(table, ["loop", "absent", "flow"], [SolveSetting("euler", n_steps=8), "euler 1", "dopri5 rtol=0.01"])
    assert grid["arm"].tolist() == ["loop", "flow"]
    assert list(grid.columns) == ["arm", "euler 8", "euler 1", "dopri5 rtol=0.01"]
    flow8 = table[(table["arm"] == "flow") & (table["setting"] == "euler 8")]["loss"].item()
    assert grid.set_index("arm").loc["flow", "euler 8"] == flow8 and grid["dopri5 rtol=0.01"].isna().all()


def test_a_curve_is_stored_beside_its_record_and_read_back_without_the_weights(tmp_path):
    tc = nl.TrainConfig(model=base_model("node"), batch_size=2, seq_len=16, max_steps=3, eval_interval=3,
                        eval_batches=2, progress=False, device="cpu")
    store, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    record = run_store.run(tc, store=store, checkpoints=checkpoints)
    settings = [SolveSetting("euler", n_steps=1), SolveSetting("euler", n_steps=3), SolveSetting("dopri5", rtol=1e-2)]
    first = ic.anytime_curve(record, settings, "validation", max_batches=1, checkpoints=checkpoints, store=store)
    assert first["nfe"].tolist()[:2] == [1, 3] and not ic.curve_missing(record, settings, "validation", 1, store)
    for path in checkpoints.rglob("*.pt"):
        path.unlink()
    again = ic.anytime_curve(record, settings, "validation", max_batches=1, checkpoints=checkpoints, store=store)
    pd.testing.assert_frame_equal(first, again)
    with pytest.raises(FileNotFoundError, match="no final model of run"):
        ic.anytime_curve(record, [SolveSetting("euler", n_steps=5)], "validation", 1, checkpoints, store)
    # a strided point is another point: it is not read back as the full one, nor computed from it
    assert ic.curve_missing(record, settings[:1], "validation", 1, store, stride=4)
    assert ic.point_key(settings[2], "validation", 1, 4) == "anytime dopri5 rtol=0.01 validation first 1 every 4"
    assert ic.point_key(ic.AS_TRAINED, "validation", None, 2) == "anytime as trained validation all every 2"


def test_a_stack_of_layers_is_scored_as_trained_at_its_depth_and_stored(tmp_path):
    tc = nl.TrainConfig(model=base_model("gpt"), batch_size=2, seq_len=16, max_steps=3, eval_interval=3,
                        eval_batches=2, progress=False, device="cpu")
    store, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    record = run_store.run(tc, store=store, checkpoints=checkpoints)
    points = ic.trained_points([("gpt", record)], "validation", 1, store=store, checkpoints=checkpoints, isolate=False)
    assert points["nfe"].tolist() == [2.0] and points["setting"].tolist() == [ic.AS_TRAINED]
    model = nl.load_model(checkpoints / record.config_hash)
    batch = nl.training.evaluation.final_eval_batches(record.train_config, "validation")[0]
    with torch.no_grad():
        assert points["loss"].iloc[0] == pytest.approx(float(model(*batch)[1]), rel=1e-6)
    for path in checkpoints.rglob("*.pt"):
        path.unlink()
    again = ic.trained_points([("gpt", record)], "validation", 1, store=store, checkpoints=checkpoints, isolate=False)
    pd.testing.assert_frame_equal(points, again)


def test_a_loop_is_solved_on_euler_grids_only():
    loop, flow = base_model("looped"), base_model("node")
    euler, rk4, adaptive = SolveSetting("euler", n_steps=5), SolveSetting("rk4", n_steps=2), SolveSetting("dopri5", rtol=1e-2)
    assert [ic.applicable(loop, s) for s in (euler, rk4, adaptive)] == [True, False, False]
    assert [ic.applicable(flow, s) for s in (euler, rk4, adaptive)] == [True, True, True]
    assert [ic.applicable(base_model("hybrid"), s) for s in (euler, rk4, adaptive)] == [True, True, True]
    random = nl.config.with_values(flow, {"ode.grid_min_steps": 1, "ode.grid_max_steps": 4, "ode.kinetic_weight": 1.0})
    assert ic.applicable(random, adaptive)  # training-only options do not bind inference


def test_lora_recovery_fine_tunes_in_full_and_low_rank_and_reads_back(tmp_path):
    tc = nl.TrainConfig(model=base_model("node"), batch_size=2, seq_len=16, max_steps=8, eval_interval=8,
                        eval_batches=2, progress=False, device="cpu", lr=3e-3)
    store, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    parent = run_store.run(tc, store=store, checkpoints=checkpoints)
    options = dict(fraction=0.5, lr_scale=1.0, split="validation", max_batches=1, store=store, checkpoints=checkpoints,
                   isolate=False)
    table = ic.lora_recovery([("node", parent)], [1, 4], [2], **options)
    assert sorted(set(table["variant"])) == ["evaluated", "finetuned", "lora r2"] and len(table) == 6
    full = table[table["variant"] == "finetuned"].iloc[0]
    lora = table[table["variant"] == "lora r2"].iloc[0]
    assert lora["trained"] < full["trained"] and (table[table["variant"] == "finetuned"]["recovered"] == 1.0).all()
    assert (table[table["variant"] == "evaluated"]["recovered"] == 0.0).all()
    for path in checkpoints.rglob("*.pt"):
        path.unlink()
    pd.testing.assert_frame_equal(table, ic.lora_recovery([("node", parent)], [1, 4], [2], **options))
