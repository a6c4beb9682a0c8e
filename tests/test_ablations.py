"""Notebook 03's experiments: ablation arms, depth curves, fine-tuning at another depth."""

from __future__ import annotations

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.runs import store as run_store
from nodelm_lib.experiments import ablations
from nodelm_lib.training.model_files import load_model
from nodelm_lib.experiments.protocol import arm_configs
from nodelm_lib.runs.store import checkpoint_path, run
from nodelm_lib.training.state import load_parent_weights
from nodelm_lib.training.evaluation import with_tokenizer_vocab


def tiny_ti_mlp(steps: int = 2, **kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="ti_mlp", vocab_size=256, d_model=32, n_heads=4, n_layers=steps, max_seq_len=32,
                           ode=nl.ODEConfig(n_steps=steps))
    base = dict(model=model, batch_size=4, seq_len=32, max_steps=12, lr=3e-3, warmup_steps=3,
                eval_interval=4, eval_batches=2, progress=False, device="cpu")
    return nl.TrainConfig(**{**base, **kw})


def test_ablation_arms_share_their_reference_and_check_it():
    model = nl.ModelConfig(arch="ti_mlp", vocab_size=256, d_model=32, n_heads=4, n_layers=4, ode=nl.ODEConfig(n_steps=4))
    studies = ablations.ablation_arms(model)
    for reference, arms in studies.values():
        assert reference in arms
    assert studies["modulation"][1]["time"] == studies["steps_solver"][1]["euler 4"] == {"model": model}
    assert studies["steps_solver"][1]["rk4 8"]["model"].ode == nl.ODEConfig(method="rk4", n_steps=8)
    assert studies["state_size"][1]["N=64"]["model"].arch == "ti_ssm"
    with pytest.raises(ValueError, match="'euler 4'"):
        ablations.ablation_arms(model, steps=(2, 8))
    with pytest.raises(ValueError, match="ti_mlp"):
        ablations.ablation_arms(nl.ModelConfig(vocab_size=256))


def test_ablation_steps_per_solver_and_the_state_size_reference():
    model = nl.ModelConfig(arch="ti_mlp", vocab_size=256, d_model=32, n_heads=4, n_layers=4, ssm_state_size=16,
                           ode=nl.ODEConfig(n_steps=4))
    studies = ablations.ablation_arms(model, steps={"euler": [2, 4, 8], "rk4": [2, 4]}, state_sizes=[8, 16, 32])
    assert list(studies["steps_solver"][1]) == ["euler 2", "euler 4", "euler 8", "rk4 2", "rk4 4"]
    assert studies["steps_solver"][1]["rk4 2"]["model"].n_layers == 2  # the depth is the number of steps
    reference, sizes = studies["state_size"]
    assert reference == "N=16"  # the model's own state size: notebook 02's ti_ssm arm
    assert sizes["N=16"]["model"] == nl.config.for_arch(model, "ti_ssm")
    with pytest.raises(ValueError, match="'N=16'"):
        ablations.ablation_arms(model, state_sizes=[8, 32])


def test_arms_inherit_the_rate_selected_for_their_architecture():
    model = nl.ModelConfig(arch="ti_mlp", vocab_size=256, d_model=32, n_heads=4, n_layers=4, ode=nl.ODEConfig(n_steps=4))
    studies = ablations.ablation_arms(model, steps=[4], solvers=["euler"], state_sizes=[16])
    arms = {**studies["modulation"][1], **studies["state_size"][1]}
    assert ablations.inherited_lrs(arms, {"ti_mlp": 2e-3, "ti_ssm": 4e-3}) == {"time": 2e-3, "constant": 2e-3,
                                                                                "N=16": 4e-3}
    with pytest.raises(ValueError, match="'ti_ssm'"):
        ablations.inherited_lrs(arms, {"ti_mlp": 2e-3})


def test_depth_curve_at_the_trained_steps_reproduces_the_runs_validation_loss(tmp_path):
    record = nl.run(tiny_ti_mlp(), store=tmp_path / "runs", checkpoints=tmp_path / "ckpt")
    curve = ablations.depth_curve(record, [1, 2, 4], ["euler", "rk4"], checkpoints=tmp_path / "ckpt",
                                  splits=("validation", "test")).set_index(["method", "n_steps"])
    assert curve.loc[("euler", 2), "val_loss"] == pytest.approx(record.final["val_loss"], abs=1e-6)
    assert curve.loc[("euler", 2), "test_loss"] == pytest.approx(record.final["test_loss"], abs=1e-6)
    assert list(curve["nfe"]) == [1, 2, 4, 4, 8, 16]
    assert curve.loc[("euler", 4), "val_loss"] != curve.loc[("euler", 2), "val_loss"]
    first = ablations.depth_curve(record, [2], checkpoints=tmp_path / "ckpt", max_batches=1)
    assert first["val_loss"].iloc[0] != curve.loc[("euler", 2), "val_loss"]  # one of the two batches
    with pytest.raises(FileNotFoundError, match="need_checkpoint=True"):
        ablations.depth_curve(record, [2], checkpoints=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="'train'"):
        ablations.depth_curve(record, [2], checkpoints=tmp_path / "ckpt", splits=["train"])


def test_a_depth_curve_is_kept_beside_the_record_and_read_back_without_the_weights(tmp_path):
    """What a fresh clone of committed results has: records and stored evaluations, no checkpoints."""
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    record = nl.run(tiny_ti_mlp(), store=store, checkpoints=ckpt)
    args = dict(eval_steps=[1, 2], methods=["euler", "rk4"], splits=("validation", "test"), max_batches=1)
    computed = ablations.depth_curve(record, checkpoints=ckpt, store=store, **args)
    assert run_store.evaluations_path(store, record.config_hash).exists()
    assert [r.config_hash for r in run_store.load_records(store)] == [record.config_hash]  # not taken for a record
    assert not ablations.depth_curve_missing(record, [1, 2], ["euler", "rk4"], ("validation", "test"), 1, store)
    assert ablations.depth_curve_missing(record, [4], ["euler"], ("validation",), 1, store)
    assert ablations.depth_curve_missing(record, [1], ["euler"], ("validation",), None, store)  # other batches
    nofile = tmp_path / "nowhere"
    read_back = ablations.depth_curve(record, checkpoints=nofile, store=store, **args)
    assert read_back.equals(computed)
    with pytest.raises(FileNotFoundError, match="need_checkpoint=True"):  # a point never evaluated
        ablations.depth_curve(record, [4], checkpoints=nofile, store=store, max_batches=1)
    # evaluations of another training of the run (retrained elsewhere: another final loss) are not used
    other = nl.RunRecord.from_json(run_store.record_path(store, record.config_hash))
    other.final["val_loss"] += 1e-3
    assert ablations.depth_curve_missing(other, [1], ["euler"], ("validation",), 1, store)
    with pytest.raises(FileNotFoundError):
        ablations.depth_curve(other, [1], ["euler"], checkpoints=nofile, store=store, max_batches=1)


def test_depth_curves_retrain_only_a_run_that_has_neither_stored_points_nor_weights(tmp_path, monkeypatch):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    a = nl.run(tiny_ti_mlp(seed=0), store=store, checkpoints=ckpt)
    b = nl.run(tiny_ti_mlp(seed=1), store=store, checkpoints=ckpt)
    first = ablations.depth_curves([("a", a)], [1, 2], max_batches=1, store=store, checkpoints=ckpt, isolate=False)
    assert list(first["arm"]) == ["a", "a"] and list(first["n_steps"]) == [1, 2]
    checkpoint_path(b.config_hash, ckpt).unlink()
    checkpoint_path(a.config_hash, ckpt).unlink()
    trained = []
    original = run_store.train_into_store
    monkeypatch.setattr(run_store, "train_into_store", lambda tc, *args, **kw: trained.append(tc.config_hash())
                        or original(tc, *args, **kw))
    both = ablations.depth_curves([("a", a), ("b", b)], [1, 2], max_batches=1, store=store, checkpoints=ckpt,
                                  isolate=False)
    assert trained == [b.config_hash]  # a's points are stored; b had neither points nor weights
    assert both[both["arm"] == "a"].reset_index(drop=True).equals(first)
    # b was trained again on the same CPU: the same numbers, so its points are stored under its record
    assert nl.RunRecord.from_json(run_store.record_path(store, b.config_hash)).final == b.final
    assert not ablations.depth_curve_missing(b, [1, 2], max_batches=1, store=store)


def test_fine_tuning_at_the_trained_depth_starts_from_the_trained_model_exactly(tmp_path):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    parent_tc = tiny_ti_mlp()
    parent = run(parent_tc, store, ckpt, need_checkpoint=True)
    child_tc = ablations.finetune_config(parent_tc, 2, fraction=0.5, lr_scale=0.1)
    assert child_tc.init_from == parent.config_hash and child_tc.seed == parent_tc.seed
    assert (child_tc.max_steps, child_tc.warmup_steps, child_tc.lr) == (6, 2, pytest.approx(3e-4))
    child = run(child_tc, store, ckpt, need_checkpoint=True)
    # m = n: the fine-tuning run's first evaluation is the trained model's final one, to the bit
    assert child.evals[0]["val_loss"] == parent.final["val_loss"]
    assert child.evals[-1]["val_loss"] != parent.final["val_loss"]  # and then it trains
    # the weights it started from are the parent's (checked on a fresh model at another depth)
    deeper = ablations.finetune_config(parent_tc, 3, fraction=0.5, lr_scale=0.1)
    model = nl.models.build_model(deeper.model)
    load_parent_weights(model, nl.config.with_values(deeper, {"out_dir": str(ckpt / "x")}))
    trained = load_model(checkpoint_path(parent.config_hash, ckpt))
    for (name, a), (_, b) in zip(model.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(a, b), name


def test_fine_tuning_refuses_a_missing_or_different_parent(tmp_path):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    parent_tc = tiny_ti_mlp()
    orphan = ablations.finetune_config(parent_tc, 3, fraction=0.5, lr_scale=0.1)
    with pytest.raises(FileNotFoundError, match=parent_tc.config_hash()):
        run(orphan, store, ckpt)
    run(parent_tc, store, ckpt, need_checkpoint=True)
    wider = nl.config.with_values(orphan, {"model.d_model": 64})
    with pytest.raises(ValueError, match="d_model"):
        run(wider, store, ckpt)
    with pytest.raises(ValueError, match="needs out_dir"):
        nl.train(orphan)


def test_depth_transfer_pairs_every_variant_with_its_parent_by_seed(tmp_path):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    base = tiny_ti_mlp()
    arms = {"ti_mlp": {"model": base.model}}
    table = ablations.depth_transfer(base, arms, [0, 1], to_steps=[1, 3], fraction=0.5, store=store,
                                     checkpoints=ckpt, isolate=False, progress=False)
    parents = {seed: tc.config_hash() for _, seed, tc in arm_configs(with_tokenizer_vocab(base),
                                                                     arms, [0, 1])}
    assert set(map(tuple, table[["variant", "to_steps"]].drop_duplicates().to_numpy())) == {
        ("trained", 2),
        *((v, m) for v in ("evaluated", "finetuned", "continued", "scratch_short", "scratch_full") for m in (1, 3))}
    assert len(table) == 2 * (1 + 5 * 2)
    for _, row in table.iterrows():
        assert row["parent_hash"] == parents[row["seed"]]
        assert row["trained_steps"] == 2
        record = nl.RunRecord.from_json(store / f"{row['config_hash']}.json")
        assert record.seed == row["seed"]
        if row["variant"] == "finetuned":
            assert record.train_config.init_from == parents[row["seed"]]
            # (a) is the fine-tuning run's own first evaluation: the same model on the same batches
            evaluated = table[(table["variant"] == "evaluated") & (table["seed"] == row["seed"])
                              & (table["to_steps"] == row["to_steps"])]
            assert record.evals[0]["val_loss"] == pytest.approx(float(evaluated["val_loss"].iloc[0]), abs=1e-6)
        if row["variant"] == "continued":  # the control: the parent trained on at its own depth, one run for every m
            assert record.train_config.init_from == parents[row["seed"]]
            assert record.train_config.model == with_tokenizer_vocab(base).model
            assert record.train_config.max_steps == round(base.max_steps * 0.5)
            same = table[(table["variant"] == "continued") & (table["seed"] == row["seed"])]["config_hash"]
            assert same.nunique() == 1
        if row["variant"] == "scratch_full":  # the same run as a steps_solver arm at that depth
            assert record.train_config.init_from is None and record.train_config.max_steps == base.max_steps
            assert record.train_config.model == ablations.at_depth(base.model, row["to_steps"])
    summary = ablations.transfer_summary(table)
    assert list(summary["to_steps"]) == [1] * 5 + [2] + [3] * 5  # m ascending, the parent at its own n
    assert list(summary["variant"][:5]) == ["evaluated", "finetuned", "continued", "scratch_short", "scratch_full"]
    control = summary[(summary["to_steps"] == 3) & (summary["variant"] == "continued")].iloc[0]
    pairs3 = table[table["to_steps"] == 3].pivot(index="seed", columns="variant", values="test_loss")
    assert control["finetuned_minus"] == pytest.approx((pairs3["finetuned"] - pairs3["continued"]).mean())
    tests = ablations.transfer_tests(summary)
    assert len(tests) == 2 * 4 and set(tests["reference"]) == {"evaluated", "continued", "scratch_short", "scratch_full"}
    assert tests.loc[(tests["arm"] == "ti_mlp fine-tuned m=3") & (tests["reference"] == "continued"),
                     "mean_diff"].iloc[0] == pytest.approx(control["finetuned_minus"])
    row = summary[(summary["to_steps"] == 1) & (summary["variant"] == "scratch_short")].iloc[0]
    pairs = table[table["to_steps"] == 1].pivot(index="seed", columns="variant", values="test_loss")
    assert row["finetuned_minus"] == pytest.approx((pairs["finetuned"] - pairs["scratch_short"]).mean())


def test_full_budget_scratch_runs_only_at_the_listed_depths():
    parent = tiny_ti_mlp()
    every = [(v, m) for v, m, _ in ablations.transfer_configs(parent, [1, 3], 0.5, 0.1)]
    assert every == [("finetuned", 1), ("continued", 1), ("scratch_short", 1), ("scratch_full", 1),
                     ("finetuned", 3), ("continued", 3), ("scratch_short", 3), ("scratch_full", 3)]
    some = [(v, m) for v, m, _ in ablations.transfer_configs(parent, [1, 3], 0.5, 0.1, full_at=[1])]
    assert some == [("finetuned", 1), ("continued", 1), ("scratch_short", 1), ("scratch_full", 1),
                    ("finetuned", 3), ("continued", 3), ("scratch_short", 3)]
    with pytest.raises(ValueError, match=r"\[8\].*\[1, 3\]"):
        ablations.transfer_configs(parent, [1, 3], 0.5, 0.1, full_at=[8])
    with pytest.raises(ValueError, match="node"):
        ablations.depth_transfer(parent, {"ti_mlp": {"model": parent.model}}, [0], [1], full_budget={"node": [1]})


def test_depth_transfer_reads_a_finished_study_back_without_any_weights(tmp_path, monkeypatch):
    """Records and stored evaluations are what is committed: with them the study's table comes
    back exactly, with no checkpoint on disk and nothing trained (once every run was retrained)."""
    import shutil

    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    base = tiny_ti_mlp(max_steps=6, eval_interval=3)
    options = dict(to_steps=[1], fraction=0.5, store=store, isolate=False, progress=False)
    table = ablations.depth_transfer(base, {"ti_mlp": {"model": base.model}}, [0], checkpoints=ckpt, **options)
    shutil.rmtree(ckpt)

    def refuse(tc, *args, **kw):
        raise AssertionError(f"trained {tc.config_hash()} again")

    monkeypatch.setattr(run_store, "train_into_store", refuse)
    again = ablations.depth_transfer(base, {"ti_mlp": {"model": base.model}}, [0], checkpoints=ckpt, **options)
    assert again.equals(table)
    # a fine-tuning run not yet stored needs its parent's weights: the parent is trained again first
    finetuned = table[table["variant"] == "finetuned"]["config_hash"].iloc[0]
    run_store.record_path(store, finetuned).unlink()
    with pytest.raises(AssertionError, match=table[table["variant"] == "trained"]["config_hash"].iloc[0]):
        ablations.depth_transfer(base, {"ti_mlp": {"model": base.model}}, [0], checkpoints=ckpt, **options)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_03s_base_is_02s_so_its_references_and_parents_are_02s_runs(profile):
    """Notebook 03 builds 02's base config at ``base_steps`` Euler steps: its reference arms and
    fine-tuning parents then have the config hashes of 02's runs of the same profile and are read
    back from the store, not trained again."""
    from nodelm_lib.experiments import protocol
    from nodelm_lib.experiments.profiles import load_profile

    p02, p03 = load_profile("02_seed_comparison", profile), load_profile("03_ablations", profile)
    base02 = protocol.base_from_params(p02)
    base03 = protocol.base_from_params({**p03, "n_layers": p03["base_steps"], "ode_method": "euler"})
    assert base03 == base02  # same config, so same hashes for the same model and seed
    assert set(p03["seeds"]) <= set(p02["seeds"])
