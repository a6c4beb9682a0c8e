"""The comparison protocol of notebook 02: per-arm learning rates only through a recorded
selection, the control arms, and the derived quantities of its table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import nodelm_lib as nl
from nodelm_lib.experiments import lr_selection, protocol, sweeps
from nodelm_lib.runs import records
from nodelm_lib.reporting import tables
from nodelm_lib.experiments.lr_selection import select_lr
from nodelm_lib.experiments.protocol import arm_configs, check_protocol, selected_lrs


def tiny(**kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    base = dict(model=model, batch_size=2, seq_len=16, max_steps=4, lr=1e-3, warmup_steps=1, eval_interval=4,
                eval_batches=1, progress=False, device="cpu")
    base.update(kw)
    return nl.TrainConfig(**base)


ARMS = {"a": {}, "b": {"model.d_model": 32}}


def test_an_unrecorded_learning_rate_change_is_refused():
    configs = arm_configs(tiny(), {"a": {}, "b": {"lr": 4e-3}}, seeds=[0, 1])
    with pytest.raises(ValueError, match=r"arm 'b' changes the learning rate \(lr=0.004, arm 'a' lr=0.001\) "
                                         r"without a recorded selection"):
        check_protocol(configs)
    check_protocol(configs, {"a": 1e-3, "b": 4e-3})  # recorded: accepted
    with pytest.raises(ValueError, match="arm 'b' runs at lr=0.004 but its recorded selection chose lr=0.002"):
        check_protocol(configs, {"a": 1e-3, "b": 2e-3})
    with pytest.raises(ValueError, match="arm 'b' has no recorded learning-rate selection"):
        check_protocol(configs, {"a": 1e-3})


def test_other_protocol_changes_are_still_refused_with_a_selection():
    configs = arm_configs(tiny(), {"a": {}, "b": {"lr": 4e-3, "max_steps": 8}}, seeds=[0])
    with pytest.raises(ValueError, match=r"arm 'b' changes the training protocol \(max_steps\)"):
        check_protocol(configs, {"a": 1e-3, "b": 4e-3})


def test_select_lr_picks_the_lowest_validation_loss_per_arm_and_sweep_uses_it(tmp_path):
    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    table = select_lr(tiny(), ARMS, [1e-4, 3e-3], seed=100, max_steps=3, reported_seeds=[0], **options)
    assert set(table.columns) >= {"arm", "lr", "seed", "steps", "val_loss", "selected", "config_hash"}
    assert (table["steps"] == 3).all() and (table["seed"] == 100).all()
    for arm, group in table.groupby("arm"):
        best = group.loc[group["val_loss"].idxmin()]
        assert group["selected"].sum() == 1 and bool(best["selected"]), group
    chosen = selected_lrs(table)
    runs = nl.sweep(tiny(), ARMS, [0], lr_selection=table, **options)
    assert dict(zip(runs["arm"], runs["lr"])) == chosen
    # the curves of that sweep are found under the same selection
    curves = sweeps.curves(tiny(), ARMS, [0], store=tmp_path / "runs", lr_selection=table)
    assert set(curves["arm"]) == {"a", "b"} and (curves["train_flops"] >= 0).all()


def test_select_lr_refuses_a_reported_seed_and_an_empty_grid():
    with pytest.raises(ValueError, match="seed=0 is one of the reported seeds"):
        select_lr(tiny(), ARMS, [1e-3], seed=0, reported_seeds=[0, 1])
    with pytest.raises(ValueError, match="lrs is empty"):
        select_lr(tiny(), ARMS, [], seed=5)


def test_selected_lrs_refuses_an_ambiguous_table():
    table = pd.DataFrame({"arm": ["a", "a"], "lr": [1e-3, 2e-3], "selected": [True, True]})
    with pytest.raises(ValueError, match="several rates"):
        selected_lrs(table)
    with pytest.raises(ValueError, match="lacks column"):
        selected_lrs(table.drop(columns="selected"))


def test_rates_at_the_grid_edge_are_named_and_interior_ones_are_not():
    table = pd.DataFrame({"arm": ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"],
                          "lr": [1e-3, 2e-3, 4e-3] * 3 + [1e-3],
                          "selected": [False, False, True, False, True, False, True, False, False, True]})
    # a: best at the top, c: at the bottom, b: inside, d: one rate only (no grid to widen)
    assert lr_selection.rates_at_grid_edge(table) == {"a": 4e-3, "c": 1e-3}
    assert lr_selection.rates_at_grid_edge(table[table["arm"] == "b"]) == {}


def test_compare_lr_rankings():
    short = pd.DataFrame({"arm": ["a"] * 3, "lr": [1, 2, 4], "steps": 5, "val_loss": [3.0, 2.0, 2.5],
                          "selected": [False, True, False]})
    full = short.assign(steps=20, val_loss=[2.0, 1.5, 1.4], selected=[False, False, True])
    check = records.compare_lr_rankings(short, full)
    assert check["rank_short"].tolist() == [3, 1, 2] and check["rank_full"].tolist() == [3, 2, 1]
    assert not check["same_ranking"].any() and not check["same_choice"].any()
    same = records.compare_lr_rankings(short, short.assign(steps=20))
    assert same["same_ranking"].all() and same["same_choice"].all()


def test_controls_and_presets():
    model = nl.ModelConfig(vocab_size=256, d_model=32, n_heads=4, n_layers=4)
    arms = protocol.architecture_arms(model, ["gpt", "node", "ti_ssm"], controls=["gpt_parallel", "ssm"],
                                      presets={"node": "tong"})
    assert arms["gpt_parallel"]["model"].arch == "gpt" and arms["gpt_parallel"]["model"].parallel
    assert not arms["gpt"]["model"].parallel
    ssm, ti_ssm = arms["ssm"]["model"], arms["ti_ssm"]["model"]
    assert ssm.arch == "ssm" and ssm.parallel and ssm.ssm_state_size == ti_ssm.ssm_state_size
    node = arms["node"]["model"]
    assert (node.hyper_dim, node.time_features, node.time_hidden) == (64, 64, 64)
    with pytest.raises(ValueError, match="control 'rnn' is not valid; choose one of 'gpt_parallel', 'ssm'"):
        protocol.architecture_arms(model, ["gpt"], controls=["rnn"])
    with pytest.raises(ValueError, match="preset 'huge'"):
        protocol.architecture_arms(model, ["node"], presets={"node": "huge"})


def test_tong_preset_is_the_51_5M_parameter_model_at_the_seed_scale():
    # the seed extension's "Tong's Neural ODE: 51.5M" at d=256, 6 layers (non-embedding count)
    cfg = nl.config.for_arch(nl.ModelConfig(d_model=256, n_heads=4, n_layers=6), "node")
    cfg = nl.ModelConfig(**{**nl.config.to_dict(cfg), "ode": cfg.ode, **nl.config.TONG_HYPERNETWORK})
    assert nl.count_params(cfg)["non_embedding"] == pytest.approx(51.5e6, rel=0.01)


def test_ssm_control_has_the_mixer_of_ti_ssm_without_time():
    cfg = nl.ModelConfig(arch="ssm", vocab_size=64, d_model=16, n_heads=2, n_layers=3, max_seq_len=16, parallel=True)
    model = nl.build_model(cfg)
    mixers = [b.mixer for b in model.blocks]
    assert len(mixers) == 3 and not any(m.time_dependent for m in mixers)
    assert not any("gate" in name or "head" in name for name, _ in model.named_parameters())
    with pytest.raises(ValueError, match="ssm has no MLP"):
        nl.match_params(cfg, 1000, by="mlp_ratio")


def test_pooled_loss_weights_splits_by_tokens():
    runs = pd.DataFrame({"val_loss": [1.0], "val_tokens": [100], "test_loss": [2.0], "test_tokens": [300]})
    assert records.pooled_loss(runs).iloc[0] == pytest.approx(1.75)


def test_reference_rows_fill_only_their_columns():
    table = pd.DataFrame({"arm": ["gpt"], "seeds": [5], "val loss": ["1.9 ± 0.1"], "test loss": ["2.0 ± 0.1"]})
    refs = pd.DataFrame({"model": ["bigram"], "val_loss": [2.4734], "test_loss": [2.5019]})
    out = tables.append_reference_rows(table, refs, {"val_loss": "val loss", "test_loss": "test loss"})
    assert out.iloc[1].tolist() == ["bigram", "–", "2.473", "2.502"]
    with pytest.raises(ValueError, match="column 'ppl' is not in the table"):
        tables.append_reference_rows(table, refs, {"val_loss": "ppl"})
    with pytest.raises(ValueError, match="the references have no column 'test_ppl'"):
        tables.append_reference_rows(table, refs, {"test_ppl": "test loss"})


def test_reference_rows_print_their_values_as_the_arms_columns_do():
    """(label, decimals) as report_table takes them, thousands separated; a NaN (a character
    corpus has no perplexity per word) is a dash."""
    table = pd.DataFrame({"arm": ["gpt"], "test ppl": ["1,584.25 ± 364.09"], "test word ppl": ["7,166.41 ± 1.1"]})
    refs = pd.DataFrame({"model": ["bigram", "char bigram"], "test_ppl": [1234.5678, 3.3], "test_word_ppl": [98765.4321, math.nan]})
    out = tables.append_reference_rows(table, refs, {"test_ppl": ("test ppl", 2), "test_word_ppl": ("test word ppl", 1)})
    assert out.iloc[1].tolist() == ["bigram", "1,234.57", "98,765.4"]
    assert out.iloc[2].tolist() == ["char bigram", "3.30", "–"]


def test_record_row_carries_lr_tokens_and_training_flops(tmp_path):
    rec = nl.train(tiny(eval_on="whole_split", max_steps=2, eval_interval=2))
    row = records.record_row(rec)
    assert row["lr"] == 1e-3 and row["val_tokens"] == rec.final["val_tokens"] > 0
    assert row["train_flops"] == pytest.approx(3 * rec.flops_per_token * 2 * 2 * 16)
    assert row["activation_mb"] > 0 and math.isfinite(row["test_loss"])


def test_two_workers_store_the_records_one_process_computes(tmp_path):
    arms = {"a": {}, "b": {"model.n_layers": 2}}
    parallel = nl.sweep(tiny(), arms, [0], store=tmp_path / "p", checkpoints=tmp_path / "pc", workers=2,
                        progress=False)
    serial = nl.sweep(tiny(), arms, [0], store=tmp_path / "s", checkpoints=tmp_path / "sc", isolate=False,
                      progress=False)
    assert parallel["arm"].tolist() == serial["arm"].tolist() == ["a", "b"]
    assert parallel["config_hash"].tolist() == serial["config_hash"].tolist()
    # one thread each in the workers, two in this process: equal up to float rounding
    assert parallel["val_loss"].tolist() == pytest.approx(serial["val_loss"].tolist(), rel=1e-5)
    with pytest.raises(ValueError, match="workers > 1 needs isolate=True"):
        nl.sweep(tiny(), arms, [0], store=tmp_path / "x", isolate=False, workers=2, progress=False)


def test_the_committed_cpu_selection_chose_every_rate_inside_its_grid():
    # 02's cpu profile: a best rate at an edge of the grid would say the grid is too narrow there
    selection = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "seed_comparison_cpu_lr_selection.csv")
    assert lr_selection.rates_at_grid_edge(selection) == {}
    assert selection["arm"].nunique() == 8 and selection.groupby("arm")["lr"].nunique().min() >= 3


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("profile", ["cpu", "cpu_wikitext2"])
def test_comparison_setup_rebuilds_the_committed_runs_of_02(profile):
    """``comparison_setup`` builds 02's base and arms as the notebook's third cell did: every run
    of the committed table has the config hash of the config it makes at the selected rate."""
    params = nl.profiles.load_profile("02_seed_comparison", profile)
    base, arms = protocol.comparison_setup(params)
    runs = pd.read_csv(ROOT / "results" / f"seed_comparison_{profile}_runs.csv")
    selection = ROOT / "results" / f"seed_comparison_{profile}_lr_selection.csv"
    configs = protocol.sweep_configs(base, arms, params["seeds"], selection)
    assert sorted(arms) == sorted(runs["arm"].unique())
    built = {(name, seed): nl.runs.store.run_hash(tc) for name, seed, tc in configs}
    committed = {(row.arm, row.seed): row.config_hash for row in runs.itertuples()}
    assert built == committed


def test_the_gpu_stores_records_are_runs_of_the_gpu_profiles_search():
    """The gpu profile's selection runs trained on a lease (results/runs/gpu) are configs that
    ``comparison_setup`` makes: the next lease's chunk continues the same search."""
    params = nl.profiles.load_profile("02_seed_comparison", "gpu")
    base, arms = protocol.comparison_setup(params)
    search = {nl.runs.store.run_hash(tc) for *_, tc in lr_selection.lr_search_configs(
        base, arms, params["lr_grid"], params["lr_seeds"], params["lr_steps"])}
    stored = [p.stem for p in (ROOT / "results" / "runs" / "gpu").glob("*.json")]
    assert stored and set(stored) <= search


def test_comparison_setup_names_the_parameters_it_lacks():
    params = nl.profiles.load_profile("02_seed_comparison", "cpu")
    del params["tokenizer"], params["presets"]
    with pytest.raises(ValueError, match=r"lack 'tokenizer', 'presets'"):
        protocol.comparison_setup(params)
