"""Learning-rate selection that checks itself: margins against the selection seeds' spread, unstable
neighbours and their half-steps, the full-length check that decides, and the divergence rule."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from nodelm_lib.experiments import lr_checks
from nodelm_lib.experiments.lr_checks import DivergenceRule, arm_checks, divergence_rule
from nodelm_lib.experiments.lr_selection import LRSelectionWarning, select_lr
from nodelm_lib.runs import store
from test_lr_selection import table_from, tiny

SEEDS = (100, 101)


def synthetic(losses: dict[str, dict[float, list[float]]], seeds=SEEDS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(select_lr's table, its runs seed by seed) from arm -> lr -> one validation loss per seed."""
    long = pd.DataFrame([{"arm": arm, "lr": lr, "seed": s, "val_loss": v,
                          "status": "completed" if math.isfinite(v) else "failed"}
                         for arm, by_lr in losses.items() for lr, vs in by_lr.items() for s, v in zip(seeds, vs)])
    return table_from(losses, seeds), long


def checks_of(losses, seeds=SEEDS, **kw) -> pd.DataFrame:
    return arm_checks(*synthetic(losses, seeds), **kw).set_index("arm")


def test_the_margin_its_spread_and_interval_are_the_paired_differences_of_the_seeds():
    runner, best = [2.00, 2.10, 2.04], [1.90, 1.96, 1.97]
    row = checks_of({"a": {1e-3: runner, 2e-3: best, 4e-3: [2.3, 2.4, 2.5]}}, seeds=(100, 101, 102)).loc["a"]
    assert (row["lr"], row["runner_up"], row["next_up"], row["n_seeds"]) == (2e-3, 1e-3, 4e-3, 3)
    diff = np.subtract(runner, best)
    assert row["margin"] == pytest.approx(diff.mean()) and row["spread"] == pytest.approx(np.std(diff, ddof=1))
    ci = stats.ttest_rel(runner, best).confidence_interval(0.95)
    assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((ci.low, ci.high))
    assert row["margin_inside_spread"] is False


def test_a_margin_inside_the_spread_is_flagged_and_one_seed_leaves_it_unknown():
    inside = checks_of({"b": {1e-3: [2.00, 2.10], 2e-3: [2.05, 2.04]}}).loc["b"]  # differences -0.05, +0.06
    assert inside["margin"] == pytest.approx(0.005) and inside["margin_inside_spread"] is True
    assert math.isnan(inside["next_up"]) and inside["unstable_neighbour"] is None  # chosen at the top edge
    one = checks_of({"c": {1e-3: [2.0], 2e-3: [1.9]}}, seeds=(100,)).loc["c"]
    assert one["margin"] == pytest.approx(0.1) and math.isnan(one["spread"]) and one["margin_inside_spread"] is None
    alone = checks_of({"d": {1e-3: [2.0, 2.0], 2e-3: [math.nan, 1.0]}}).loc["d"]  # one completed rate
    assert math.isnan(alone["runner_up"]) and alone["margin_inside_spread"] is None


@pytest.mark.parametrize("above, gap, diverged_above, flagged, reason", [
    ([1.875, 1.78125], 0.1, None, True, "seed 100 +0.1250 worse"),          # one seed 0.125 worse
    ([1.8125, 1.78125], 0.1, None, False, ""),                              # 0.0625 worse: inside the gap
    ([1.8125, 1.78125], 0.05, None, True, "seed 100 +0.0625 worse"),        # ... outside a smaller gap
    ([1.8125, 1.78125], 0.1, 1.8, True, "seed 100 diverged (1.8125 > 1.8000)"),
    ([math.nan, 1.78125], 0.1, None, True, "seed 100 failed"),
])
def test_the_unstable_neighbour_is_the_next_rate_up_with_a_seed_much_worse_or_diverged(above, gap, diverged_above,
                                                                                     flagged, reason):
    losses = {"a": {5e-4: [1.90, 1.90], 1e-3: [1.75, 1.75], 2e-3: above, 4e-3: [math.nan, math.nan]}}
    row = checks_of(losses, unstable_gap=gap, diverged_above=diverged_above).loc["a"]
    assert row["lr"] == 1e-3 and row["next_up"] == 2e-3
    assert row["unstable_neighbour"] is flagged and row["unstable_reason"] == reason


def test_the_neighbour_check_can_be_off_and_refuses_a_bad_gap():
    losses = {"a": {1e-3: [1.75, 1.75], 2e-3: [3.0, 3.0]}}
    assert checks_of(losses, unstable_gap=None).loc["a", "unstable_neighbour"] is None
    for bad in (0, -0.1, math.nan):
        with pytest.raises(ValueError, match=rf"unstable_gap={bad!r} is not valid; give a loss gap in nats > 0"):
            checks_of(losses, unstable_gap=bad)


def test_an_unstable_neighbour_gets_the_half_step_once():
    losses = {"a": {5e-4: [1.9, 1.9], 1e-3: [1.75, 1.75], 2e-3: [2.0, 1.76]},   # unstable: half-step
              "b": {5e-4: [1.9, 1.9], 1e-3: [1.75, 1.75], 2e-3: [1.76, 1.76]}}  # stable: nothing
    table, long = synthetic(losses)
    grids = {arm: sorted(g) for arm, g in losses.items()}
    add = lr_checks.half_step_rates(arm_checks(table, long), grids)
    assert add == {"a": [pytest.approx(math.sqrt(1e-3 * 2e-3), rel=1e-5)]}
    # with the half-step in the grid, or the neighbours already a half-step apart, nothing more is added
    assert lr_checks.half_step_rates(arm_checks(table, long), {**grids, "a": grids["a"] + [add["a"][0]]}) == {}
    near = {"a": {1e-3: [1.75, 1.75], 1.41421e-3: [2.0, 1.76]}}
    assert lr_checks.half_step_rates(arm_checks(*synthetic(near)), {"a": [1e-3, 1.41421e-3]}) == {}


def test_select_lr_checked_searches_the_half_step_as_new_selection_runs(monkeypatch):
    """A fake selection whose seed 101 jumps above 1.5e-3: the first round chooses 1e-3 beside the
    unstable 2e-3, the second searches their half-step, and the search stops there."""
    def loss(lr, seed):
        return 1.75 + 0.1 * math.log2(lr / 1.3e-3) ** 2 + (0.3 if seed == 101 and lr > 1.5e-3 else 0.0)

    grids_seen = []

    def fake_refined(base, arms, grids, seed, **options):
        grids_seen.append({a: list(g) for a, g in grids.items()})
        return synthetic({a: {lr: [loss(lr, s) for s in SEEDS] for lr in g} for a, g in grids.items()})[0]

    monkeypatch.setattr(lr_checks, "select_lr_refined", fake_refined)
    monkeypatch.setattr(lr_checks, "selection_seed_losses", lambda selection, store: synthetic(
        {a: {lr: [loss(lr, s) for s in SEEDS] for lr in g["lr"]} for a, g in selection.groupby("arm")})[1])
    selection, checks = lr_checks.select_lr_checked(None, {"a": {}}, [5e-4, 1e-3, 2e-3], list(SEEDS))
    half = float(f"{math.sqrt(2e-6):.6g}")
    assert grids_seen == [{"a": [5e-4, 1e-3, 2e-3]}, {"a": [5e-4, 1e-3, half, 2e-3]}]
    assert checks.set_index("arm").loc["a", "lr"] == half
    assert lr_checks.select_lr_checked(None, {"a": {}}, [5e-4, 1e-3, 2e-3], list(SEEDS), unstable_gap=None)
    assert len(grids_seen) == 3  # without the neighbour check: one selection, no half-step
    with pytest.raises(ValueError, match="max_half_steps=-1 is not valid"):
        lr_checks.select_lr_checked(None, {"a": {}}, [1e-3], list(SEEDS), max_half_steps=-1)


def test_the_full_length_check_takes_every_arm_not_shown_outside_its_spread():
    checks = arm_checks(*synthetic({"inside": {1e-3: [2.00, 2.10], 2e-3: [2.05, 2.04]},
                                    "outside": {1e-3: [2.0, 2.1], 2e-3: [1.9, 1.96]},
                                    "single": {1e-3: [2.0, math.nan], 2e-3: [1.9, 1.9]}}))
    assert lr_checks.full_length_arms(checks) == ["inside"]
    one = arm_checks(*synthetic({"one_seed": {1e-3: [2.0], 2e-3: [1.9]}}, seeds=(100,)))
    assert lr_checks.full_length_arms(one) == ["one_seed"]  # one seed shows no spread: checked


def test_the_full_length_check_trains_both_rates_at_full_length_and_decides(tmp_path):
    """Tiny runs through a store: a short selection whose (forced) choice 1e-5 is checked against
    1e-2 at the full 6 steps on both selection seeds; the full-length runs decide (1e-2 learns,
    1e-5 barely moves), the sweep's table follows, the plan finds the same runs stored, and a
    second check trains nothing."""
    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    base, arms = tiny(max_steps=6, eval_interval=3), {"a": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        selection = select_lr(base, arms, [1e-5, 1e-2], list(SEEDS), max_steps=3, reported_seeds=[0], **options)
    checks = arm_checks(selection, lr_checks.selection_seed_losses(selection, tmp_path / "runs"))
    # force the short choice to 1e-5 and its margin inside the spread: the check must overrule it
    checks.loc[0, ["lr", "runner_up", "margin_inside_spread"]] = [1e-5, 1e-2, True]
    configs = lr_checks.full_length_configs(base, arms, checks, list(SEEDS))
    assert sorted((lr, s, tc.max_steps) for _, lr, s, tc in configs) == [(1e-5, 100, 6), (1e-5, 101, 6),
                                                                         (1e-2, 100, 6), (1e-2, 101, 6)]
    decisions = lr_checks.full_length_check(base, arms, checks, list(SEEDS), reported_seeds=[0], **options)
    stored = {r.config_hash: r for r in store.load_records(tmp_path / "runs")}
    assert len(stored) == 8
    full = {lr: np.mean([stored[store.run_hash(tc)].final["val_loss"] for _, r, _, tc in configs if r == lr])
            for lr in (1e-5, 1e-2)}
    row = decisions.set_index("arm").loc["a"]
    assert row["full_lr"] == min(full, key=full.get) == 1e-2 and decisions["changed"].tolist() == [True]
    assert (row["full_val_loss"], row["full_val_loss_runner_up"]) == pytest.approx((full[1e-5], full[1e-2]))
    assert row["steps"] == 6 and row["n_seeds"] == 2
    decided = lr_checks.decided_selection(selection, decisions)
    assert decided.loc[decided["selected"], "lr"].tolist() == [1e-2]
    assert set(decided["decided_by"]) == {"full-length check"}
    # the plan derives the same configs from the selection's records, and finds them stored
    checks_plan, plan = lr_checks.missing_full_length_runs(selection, tmp_path / "runs", 6)
    if lr_checks.full_length_arms(checks_plan):
        assert set(plan["config_hash"]) <= {store.run_hash(tc) for *_, tc in configs}
        assert plan["stored"].all()
    lr_checks.full_length_check(base, arms, checks, list(SEEDS), reported_seeds=[0], **options)
    assert len(list((tmp_path / "runs").glob("*.json"))) == 8  # read back, nothing trained


def test_the_plan_lists_the_missing_full_length_runs_with_their_expected_time(tmp_path):
    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        selection = select_lr(tiny(), {"a": {}}, [1e-3, 1.01e-3], list(SEEDS), max_steps=2, **options)
    selection["margin_sd"] = math.inf  # not read: the plan recomputes the checks from the records
    checks, plan = lr_checks.missing_full_length_runs(selection, tmp_path / "runs", 8)
    assert lr_checks.full_length_arms(checks) == (["a"] if checks.loc[0, "margin_inside_spread"] is not False else [])
    if len(plan):
        assert (~plan["stored"]).all() and set(plan["steps"]) == {8} and set(plan["seed"]) == set(SEEDS)
        per_step = np.mean([r.train_time_s / 2 for r in store.load_records(tmp_path / "runs")])
        assert plan["est_train_time_s"].to_numpy() == pytest.approx(per_step * 8)
        assert "missing from the store" in lr_checks.format_plan(checks, plan)


# ------------------------------------------------------------------------------------------ divergence

@pytest.mark.parametrize("value, message", [
    ({"above": "quadgram"}, r"above='quadgram' is not valid; name a reference model \(unigram, bigram, trigram\)"),
    ({"above": -1.0}, r"above=-1.0 is not valid"),
    ({"above": float("nan")}, r"above=nan is not valid"),
    ({"above": True}, r"above=True is not valid"),
    ({"above": "bigram", "action": "drop"}, r"action='drop' is not valid; choose one of rerun_lower, report"),
    ({"above": "bigram", "when": "end"}, r"unknown key\(s\) \['when'\]; its keys are 'above' \(required\), 'action' and 'seed_margin'"),
    ({"action": "report"}, r"'above' is missing"),
    ("bigram", r"divergence='bigram' is not valid; give None or a mapping"),
])
def test_a_bad_divergence_rule_is_refused_naming_the_valid_choices(value, message):
    with pytest.raises(ValueError, match=message):
        divergence_rule(value)


def test_the_divergence_rule_reads_its_level_from_the_references():
    refs = {"unigram": 3.3, "bigram": 2.47}
    assert divergence_rule(None) is None and divergence_rule(False) is None
    rule = divergence_rule({"above": "bigram"})
    assert rule == DivergenceRule("bigram", "rerun_lower") and rule.threshold(refs) == 2.47
    assert rule.diverged(2.48, refs) and not rule.diverged(2.47, refs) and rule.diverged(math.nan, refs)
    assert DivergenceRule(2.0, "report").threshold() == 2.0
    with pytest.raises(ValueError, match=r"needs that reference's validation loss; the references given are \['unigram'\]"):
        rule.threshold({"unigram": 3.3})
    assert "above the bigram's (2.470)" in rule.describe(refs) and "rerun once at the next lower rate" in rule.describe(refs)


def runs_table() -> pd.DataFrame:
    return pd.DataFrame([{"arm": "a", "seed": 0, "lr": 4e-3, "status": "completed", "val_loss": 1.9},
                         {"arm": "a", "seed": 1, "lr": 4e-3, "status": "completed", "val_loss": 2.6},
                         {"arm": "b", "seed": 0, "lr": 1e-3, "status": "failed", "val_loss": math.nan}])


def test_a_diverged_run_is_rerun_once_at_the_next_lower_rate_and_reported():
    calls = []

    def rerun(arm, seed, lr):
        calls.append((arm, seed, lr))
        return {"arm": "ignored", "seed": seed, "lr": lr, "status": "completed", "val_loss": 1.95 if arm == "a" else 2.9}

    grids = {"a": [2e-3, 4e-3, 8e-3], "b": [1e-3]}
    runs, report = lr_checks.apply_divergence(runs_table(), DivergenceRule("bigram"), {"bigram": 2.47}, grids, rerun)
    assert calls == [("a", 1, 2e-3), ("b", 0, 5e-4)]  # b has no lower rate: half of its own
    assert runs["lr"].tolist() == [4e-3, 2e-3, 5e-4] and runs["arm"].tolist() == ["a", "a", "b"]
    assert runs["val_loss"].tolist() == [1.9, 1.95, 2.9]
    assert runs["diverged_at_lr"].fillna(0).tolist() == [0, 4e-3, 1e-3]
    assert runs.loc[1, "divergence"] == "rerun at lr 0.002: diverged at lr 0.004 (val 2.6000 > 2.4700)"
    assert runs.loc[2, "divergence"].endswith("the rerun diverged too") and runs.loc[0, "divergence"] == ""
    assert report["rerun_diverged"].tolist() == [False, True] and report["rerun_lr"].tolist() == [2e-3, 5e-4]


def test_a_report_only_rule_keeps_the_run_and_no_rule_changes_nothing():
    def rerun(*args):
        raise AssertionError("a report-only rule reruns nothing")

    runs, report = lr_checks.apply_divergence(runs_table(), DivergenceRule(2.5, "report"), None, {}, rerun)
    assert runs["val_loss"].tolist()[:2] == [1.9, 2.6] and len(report) == 2
    assert runs.loc[1, "divergence"] == "diverged at lr 0.004 (val 2.6000 > 2.5000)"
    same, empty = lr_checks.apply_divergence(runs_table(), None, None, {}, rerun)
    assert same.equals(runs_table()) and empty.empty


def test_the_seed_margin_of_the_one_rule_reruns_a_run_far_above_its_siblings():
    table = pd.DataFrame([{"arm": "a", "seed": s, "lr": 4e-3, "status": "completed", "val_loss": v}
                          for s, v in enumerate([1.80, 1.82, 2.10])])
    calls = []

    def rerun(arm, seed, lr):
        calls.append((arm, seed, lr))
        return {"seed": seed, "lr": lr, "status": "completed", "val_loss": 1.83}

    rule = divergence_rule({"above": "bigram", "seed_margin": 0.1})  # 2.10 is below the bigram, 0.29 above its siblings
    runs, report = lr_checks.apply_divergence(table, rule, {"bigram": 2.47}, {"a": [2e-3, 4e-3]}, rerun)
    assert calls == [("a", 2, 2e-3)] and runs["val_loss"].tolist() == [1.80, 1.82, 1.83]
    assert "0.290 above the median 1.810 of its other seeds" in runs.loc[2, "divergence"]
    assert report["rerun_diverged"].tolist() == [False]
    # the same rule flags the same run in a results table (divergence.divergence_reasons, as 07's report does)
    from nodelm_lib.experiments import divergence
    assert divergence.diverged(table, rule, {"bigram": 2.47}).tolist() == [False, False, True]
