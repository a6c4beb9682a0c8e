"""Learning-rate selection that knows its own noise: several selection seeds averaged, the margin
between the best rate and the runner-up against the seeds' spread, per-arm grids, and grids that
grow outward from an edge and by half-steps beside a cliff."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import nodelm_lib as nl
from nodelm_lib.experiments import lr_selection
from nodelm_lib.runs import store
from nodelm_lib.experiments.lr_selection import LRSelectionWarning, refine_lr_grids, select_lr, selection_table
from test_comparison_protocol import tiny as tiny_protocol_config


def record(val_loss: float, status: str = "completed", tag: str = "") -> nl.RunRecord:
    final = {"val_loss": val_loss} if status == "completed" else {}
    return nl.RunRecord(config={}, config_hash=f"h{tag}", seed=0, status=status, final=final)


def table_from(losses: dict[str, dict[float, list[float]]], seeds=(100, 101)) -> pd.DataFrame:
    """select_lr's table from arm -> lr -> one validation loss per seed (NaN: a failed run)."""
    runs = [(arm, lr, s, 10, record(v, "completed" if math.isfinite(v) else "failed", f"{arm}{lr}{s}"))
            for arm, by_lr in losses.items() for lr, vs in by_lr.items() for s, v in zip(seeds, vs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        return selection_table(runs)


def test_the_selection_averages_its_seeds_and_reports_the_margin_against_their_spread():
    table = table_from({"a": {1e-3: [2.00, 2.10], 2e-3: [1.90, 1.96], 4e-3: [2.30, 2.50]}})
    best = table[table["selected"]].iloc[0]
    assert best["lr"] == 2e-3 and best["val_loss"] == pytest.approx(1.93)
    assert best["val_loss_sd"] == pytest.approx(np.std([1.90, 1.96], ddof=1))
    assert best["seeds"] == "100 101" and best["n_seeds"] == 2 and best["seed"] == 100
    # runner-up 1e-3 (mean 2.05): margin 0.12; per-seed differences 0.10 and 0.14, SD 0.0283
    assert best["margin"] == pytest.approx(0.12)
    assert best["margin_sd"] == pytest.approx(np.std([0.10, 0.14], ddof=1))
    assert best["within_noise"] is False or best["within_noise"] == False  # noqa: E712
    assert table["config_hashes"].str.split().map(len).eq(2).all()


def test_a_margin_inside_the_seeds_spread_is_flagged_and_warned_about():
    runs = [("a", lr, s, 10, record(v)) for lr, vs in {1e-3: [2.00, 2.10], 2e-3: [2.05, 2.04]}.items()
            for s, v in zip((100, 101), vs)]
    with pytest.warns(LRSelectionWarning, match=r"cannot tell the best rate from the runner-up for a \(margin"):
        table = selection_table(runs)
    # means 2.05 vs 2.045: margin 0.005; per-seed differences -0.05 and +0.06
    assert bool(table["within_noise"].iloc[0]) is True


def test_one_selection_seed_has_no_spread_and_no_warning():
    runs = [("a", lr, 100, 10, record(v)) for lr, v in {1e-3: 2.0, 2e-3: 1.9}.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("error", LRSelectionWarning)
        table = selection_table(runs)
    assert table["margin"].iloc[0] == pytest.approx(0.1) and math.isnan(table["margin_sd"].iloc[0])
    assert table["within_noise"].iloc[0] is None


def test_a_failed_seed_makes_its_rate_unselectable():
    table = table_from({"a": {1e-3: [2.0, 2.0], 2e-3: [1.5, math.nan]}})
    assert table.loc[table["selected"], "lr"].tolist() == [1e-3]
    assert table.loc[table["lr"] == 2e-3, "status"].iloc[0] == "failed"


def test_an_edge_choice_grows_the_grid_outward_by_its_spacing():
    table = table_from({"top": {1e-3: [2.1, 2.1], 2e-3: [2.0, 2.0], 4e-3: [1.9, 1.9]},
                        "bottom": {1e-3: [1.9, 1.9], 2e-3: [2.0, 2.0], 4e-3: [2.1, 2.1]},
                        "inside": {1e-3: [2.1, 2.1], 2e-3: [2.0, 2.0], 4e-3: [2.1, 2.1]}})
    assert refine_lr_grids(table) == {"top": [8e-3], "bottom": [5e-4]}


def test_a_cliff_above_the_best_rate_adds_half_steps_on_both_sides_once():
    # node-like: 2e-3 ends at the bigram level (2.47 >= 2.5 - 0.05), 4e-3 fails
    losses = {"node": {5e-4: [1.80, 1.80], 1e-3: [1.77, 1.78], 2e-3: [2.47, 2.49], 4e-3: [math.nan, math.nan]}}
    extra = refine_lr_grids(table_from(losses), cliff_loss=2.5)
    assert extra["node"] == pytest.approx([math.sqrt(5e-4 * 1e-3), math.sqrt(1e-3 * 2e-3)], rel=1e-5)
    # once refined, the neighbours are a half-step apart: no further refinement
    losses["node"].update({round(math.sqrt(5e-4 * 1e-3), 9): [1.78, 1.79], round(math.sqrt(2e-6), 9): [1.79, 1.80]})
    assert refine_lr_grids(table_from(losses), cliff_loss=2.5) == {}
    # without a cliff loss only a failure counts as a cliff
    inside = {5e-4: [1.9, 1.9], 1e-3: [1.8, 1.8], 2e-3: [2.4, 2.4], 4e-3: [1.9, 1.9]}
    assert refine_lr_grids(table_from({"a": inside})) == {}
    inside[2e-3] = [math.nan, 1.0]  # one seed failed: the rate failed
    assert refine_lr_grids(table_from({"a": inside})) == {"a": pytest.approx([math.sqrt(5e-7), math.sqrt(2e-6)], rel=1e-5)}


def test_per_arm_grids_are_checked():
    with pytest.raises(ValueError, match=r"lack arm\(s\) \['b'\]"):
        lr_selection.arm_grids(["a", "b"], {"a": [1e-3]})
    with pytest.raises(ValueError, match="lrs is empty for arm 'a'"):
        lr_selection.arm_grids(["a"], {"a": []})
    with pytest.raises(ValueError, match=r"learning rate\(s\) \[nan\] of arm 'a' are not valid"):
        lr_selection.arm_grids(["a"], [1e-3, float("nan")])
    assert lr_selection.arm_grids(["a", "b"], [2e-3, 1e-3, 2e-3]) == {"a": [1e-3, 2e-3], "b": [1e-3, 2e-3]}


def tiny(**kw) -> nl.TrainConfig:
    """notebook 02's protocol tests' tiny config, at 3 steps (one evaluation at the end)."""
    return tiny_protocol_config(**{"max_steps": 3, "eval_interval": 3, **kw})


def test_select_lr_trains_each_arm_rate_and_seed_once_and_refinement_reuses_the_store(tmp_path):
    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    arms = {"a": {}, "b": {"model.d_model": 32}}
    grids = {"a": [1e-4, 1e-3], "b": [3e-3]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        table = select_lr(tiny(), arms, grids, seed=[100, 101], reported_seeds=[0], **options)
    assert table[["arm", "lr"]].values.tolist() == [["a", 1e-4], ["a", 1e-3], ["b", 3e-3]]
    assert len(list((tmp_path / "runs").glob("*.json"))) == 6
    # each mean is the mean of its seeds' stored runs
    stored = {r.config_hash: r.final["val_loss"] for r in store.load_records(tmp_path / "runs")}
    for _, row in table.iterrows():
        assert row["val_loss"] == pytest.approx(np.mean([stored[h] for h in row["config_hashes"].split()]))
    # the refined search: "a" chose an edge, so its grid grows; "b" has one rate (no edge to grow)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        refined = lr_selection.select_lr_refined(tiny(), arms, grids, [100, 101], max_refinements=1,
                                                 reported_seeds=[0], **options)
    assert refined.groupby("arm")["lr"].nunique().to_dict() == {"a": 3, "b": 1}
    assert len(list((tmp_path / "runs").glob("*.json"))) == 8
    with pytest.raises(ValueError, match="seed=0 is one of the reported seeds"):
        select_lr(tiny(), arms, grids, seed=[100, 0], reported_seeds=[0], **options)
    with pytest.raises(ValueError, match="repeat a seed"):
        select_lr(tiny(), arms, grids, seed=[100, 100], **options)


def test_selection_runs_may_leave_the_test_split_unscored_and_the_sweep_still_scores_it(tmp_path, monkeypatch):
    """score_test=False: the selection runs evaluate validation only (other hashes, no test loss,
    the test split never read), the same validation losses as scoring runs; the sweep after it
    trains its reported runs with a test loss."""
    from nodelm_lib.training import evaluation, loop

    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    arms, grid = {"a": {}}, [1e-3, 3e-3]
    read = []
    real = evaluation.final_eval_batches
    monkeypatch.setattr(loop, "final_eval_batches", lambda tc, split, *a: read.append(split) or real(tc, split, *a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        lean = select_lr(tiny(), arms, grid, seed=100, score_test=False, **options)
        assert "test" not in read
        full = select_lr(tiny(), arms, grid, seed=100, **options)
    assert "test" in read
    assert set(lean["config_hash"]).isdisjoint(full["config_hash"])
    assert lean["val_loss"].tolist() == full["val_loss"].tolist()
    for h in lean["config_hash"]:
        final = nl.RunRecord.from_json(store.record_path(tmp_path / "runs", h)).final
        assert "test_loss" not in final and math.isfinite(final["val_loss"])
    runs = nl.sweep(tiny(), arms, [0], lr_selection=lean, **options)
    assert runs["test_loss"].notna().all()


def test_selection_runs_may_be_judged_on_the_validation_curves_batches(tmp_path, monkeypatch):
    """eval_on="batches" over a whole_split_at_end base: the selection runs never score a whole
    split (other hashes); each rate's validation loss is its run's last curve point, the loss of
    the fixed batches, which the whole-split runs evaluate too but then replace."""
    from nodelm_lib.training import evaluation

    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    arms, grid = {"a": {}}, [1e-3, 3e-3]
    base = tiny(eval_on="whole_split_at_end")
    whole = []
    real = evaluation.split_windows
    monkeypatch.setattr(evaluation, "split_windows", lambda *a, **k: whole.append(1) or real(*a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        curve = select_lr(base, arms, grid, seed=100, score_test=False, eval_on="batches", **options)
        assert not whole
        full = select_lr(base, arms, grid, seed=100, score_test=False, **options)
    assert whole
    assert set(curve["config_hash"]).isdisjoint(full["config_hash"])
    for row_curve, row_full in zip(curve.itertuples(), full.itertuples()):
        scored = nl.RunRecord.from_json(store.record_path(tmp_path / "runs", row_curve.config_hash))
        reference = nl.RunRecord.from_json(store.record_path(tmp_path / "runs", row_full.config_hash))
        assert scored.final["val_loss"] == scored.evals[-1]["val_loss"] == reference.evals[-1]["val_loss"]
        assert scored.final["val_tokens"] < reference.final["val_tokens"]
    with pytest.raises(ValueError, match="eval_on"):
        lr_selection.lr_search_configs(base, arms, grid, 100, eval_on="every_window")


def test_score_test_at_its_default_keeps_every_hash():
    d = nl.TrainConfig()
    assert nl.TrainConfig(score_test=True).config_hash() == d.config_hash()
    assert nl.TrainConfig(score_test=False).config_hash() != d.config_hash()
