"""Provenance that survives refactoring: a seeded sample of records retrained at HEAD comes back
exactly on the records' kind of CPU and within the measured tolerance on another
(``runs/reproducibility.py``)."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pandas as pd
import pytest

import nodelm_lib as nl
from nodelm_lib.runs import reproducibility as rp
from nodelm_lib.runs import store as run_store

# the tiny runs learn nothing in 3 steps, and say so
pytestmark = pytest.mark.filterwarnings("ignore::nodelm_lib.training.record.AboveUniformWarning")

REPO = Path(__file__).resolve().parents[1]


# The cheapest records of the committed cpu store (character-level, d=64, 4 layers, 250 steps at
# batch 8): seconds of training each, so that CI can afford them. The smoke store
# (results/runs/smoke) is rewritten by every nbval run and not committed.
COMMITTED_STORE = REPO / "results" / "runs" / "cpu"
CHEAP_COMMITTED = ["07f2628b1319fdc8", "35da1e6e6057d534", "5e853846e773f354"]  # gpt, ti_mlp, node


def tiny(arch: str, seed: int) -> nl.TrainConfig:
    model = nl.config.for_arch(nl.ModelConfig(vocab_size=256, d_model=16, n_heads=2, n_layers=2, max_seq_len=16), arch)
    return nl.TrainConfig(model=model, batch_size=2, seq_len=16, max_steps=3, eval_interval=3, eval_batches=2,
                          progress=False, device="cpu", seed=seed)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory) -> Path:
    """Three tiny runs trained here into a store of their own."""
    root = tmp_path_factory.mktemp("tiny")
    for arch, seed in (("gpt", 0), ("gpt", 1), ("ti_mlp", 0)):
        run_store.run(tiny(arch, seed), store=root / "runs", checkpoints=root / "checkpoints")
    return root / "runs"


def copy_store(store: Path, to: Path, edit=None) -> Path:
    """A copy of ``store``'s records, each passed through ``edit(record)`` and written with a new digest."""
    to.mkdir()
    for record in run_store.load_records(store):
        if edit is not None:
            edit(record)
        record.to_json(run_store.record_path(to, record.config_hash))
    return to


def test_a_sample_retrained_on_its_records_cpu_matches_them_exactly(tiny_store, tmp_path):
    work = tmp_path / "work"
    table = rp.check_reproducibility(run_store.load_records(tiny_store), n=2, seed=0, work_dir=work, progress=False)
    assert list(table.columns) == rp.COLUMNS
    assert table["config_hash"].nunique() == 2 and table["match"].all()
    assert (table["rule"] == rp.SAME_CPU_RULE).all() and (table["diff"] == 0).all() and (table["tolerance"] == 0).all()
    assert set(table["metric"]) == {"final train_loss", "final val_loss", "final test_loss", "val_loss curve",
                                    "train loss per step"}
    assert (table["record_cpu"] == table["this_cpu"]).all()
    assert table["head_commit"].iloc[0].split("+")[0] == table["record_commit"].iloc[0]
    # the retrainings went to the work folder, the records' store is as it was
    assert sorted(p.stem for p in (work / "store").glob("*.json")) == sorted(table["config_hash"].unique())
    assert len(list(tiny_store.glob("*.json"))) == 3
    # the same seed draws the same sample, whatever the records' order
    again = rp.sample_records(reversed(run_store.load_records(tiny_store)), 2, seed=0)
    assert [r.config_hash for r in again] == list(table["config_hash"].unique())
    assert "2 records retrained (2 same CPU: exact)" in rp.summary(table) and rp.summary(table).endswith("all match")


def test_a_tampered_final_loss_is_reported_as_a_mismatch(tiny_store, tmp_path):
    victim = run_store.load_records(tiny_store)[0].config_hash

    def tamper(record):
        if record.config_hash == victim:
            record.final["test_loss"] += 1e-6

    store = copy_store(tiny_store, tmp_path / "tampered", tamper)
    table = rp.check_reproducibility(run_store.load_records(store), n=3, seed=0, progress=False)
    bad = table[~table["match"]]
    assert list(bad["config_hash"]) == [victim] and list(bad["metric"]) == ["final test_loss"]
    assert bad["diff"].iloc[0] == pytest.approx(-1e-6, rel=1e-3)
    assert table[table["config_hash"] != victim]["match"].all()
    assert f"1 do not match ({victim})" in rp.summary(table)


def test_a_record_of_another_cpu_type_is_held_to_the_tolerance(tiny_store, tmp_path):
    def elsewhere(record):
        record.environment["cpu_name"] = "Some Other CPU"
        if record.seed == 1:  # one run's final loss moved by more than the tolerance
            record.final["test_loss"] += 0.5
        else:
            record.final["test_loss"] += 0.001

    store = copy_store(tiny_store, tmp_path / "other_cpu", elsewhere)
    table = rp.check_reproducibility(run_store.load_records(store), n=3, seed=0, progress=False)
    assert (table["rule"] == rp.OTHER_CPU_RULE).all() and table["record_cpu"].str.startswith("Some Other CPU").all()
    test_loss = table[table["metric"] == "final test_loss"].set_index("seed")
    assert (test_loss["tolerance"] == rp.CROSS_CPU_TOLERANCE).all()
    assert not test_loss.loc[1, "match"] and test_loss.loc[0, "match"].all()
    assert table[table["metric"] == "train loss per step"]["tolerance"].eq(rp.CROSS_CPU_STEP_TOLERANCE).all()
    loose = rp.check_reproducibility(run_store.load_records(store), n=3, seed=0, tolerance=1.0, progress=False)
    assert loose["match"].all() and (loose[loose["metric"].str.startswith("final")]["tolerance"] == 1.0).all()


def test_bad_requests_name_the_value_and_the_choices(tiny_store, tmp_path):
    records = run_store.load_records(tiny_store)
    with pytest.raises(ValueError, match=r"n=4 is larger than the 3 records that can be retrained .*choose n in 1..3"):
        rp.sample_records(records, 4)
    with pytest.raises(ValueError, match="n=0 is not valid"):
        rp.sample_records(records, 0)
    failed = dataclasses.replace(records[0], status="failed")
    assert rp.why_not_retrainable(failed) == "did not complete (status 'failed')"
    with pytest.raises(ValueError, match=r"larger than the 2 records that can be retrained \(of 3; 1 did not complete"):
        rp.sample_records([failed, *records[1:]], 3)
    table = tmp_path / "t_runs.csv"
    pd.DataFrame({"arm": ["gpt"], "config_hash": ["0123456789abcdef"]}).to_csv(table, index=False)
    with pytest.raises(ValueError, match=f"record 0123456789abcdef not found in {re.escape(str(tiny_store))}"):
        rp.records_of_table(table, tiny_store)
    pd.DataFrame({"arm": ["gpt"]}).to_csv(table, index=False)
    with pytest.raises(ValueError, match="has no config_hash column"):
        rp.records_of_table(table, tiny_store)
    work = tmp_path / "work"
    run_store.record_path(work / "store", records[0].config_hash).parent.mkdir(parents=True)
    records[0].to_json(run_store.record_path(work / "store", records[0].config_hash))
    with pytest.raises(ValueError, match="must not hold the run already"):
        rp.retrain(records[0], work)


def test_the_command_reads_a_table_prints_the_check_and_fails_on_a_mismatch(tiny_store, tmp_path, capsys):
    records = run_store.load_records(tiny_store)
    table = tmp_path / "tiny_runs.csv"
    pd.DataFrame({"arm": ["gpt a", "gpt b", "ti_mlp"], "config_hash": [r.config_hash for r in records]}).to_csv(
        table, index=False)
    assert rp.main([str(table), "--store", str(tiny_store), "--sample", "1", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "same CPU: exact" in out and out.strip().endswith("all match")
    assert rp.main([str(tiny_store), "--sample", "9"]) == 2
    assert "choose n in 1..3" in capsys.readouterr().err
    first = records[0].config_hash
    failed = copy_store(tiny_store, tmp_path / "failed",
                        lambda r: setattr(r, "status", "failed") if r.config_hash == first else None)
    assert rp.main([str(failed), "--sample", "3"]) == 2
    err = capsys.readouterr().err
    assert f"not drawn (1 of 3): {first} did not complete (status 'failed')" in err and "choose n in 1..2" in err

    def tamper(record):
        record.final["val_loss"] = record.evals[-1]["val_loss"] = record.final["val_loss"] + 0.1

    assert rp.main([str(copy_store(tiny_store, tmp_path / "bad", tamper)), "--sample", "1"]) == 1


def committed(config_hash: str):
    return run_store.read_record(run_store.record_path(COMMITTED_STORE, config_hash))


def test_the_retrain_sample_matches_its_records(tmp_path):
    """Two of the committed cpu store's cheapest records, retrained at HEAD: exact on their CPU
    type (the one their records name), within the cross-CPU tolerance elsewhere."""
    start = time.perf_counter()
    table = rp.check_reproducibility([committed(h) for h in CHEAP_COMMITTED], n=2, seed=0, progress=False)
    assert table["config_hash"].nunique() == 2
    mismatches = table[~table["match"]]
    assert mismatches.empty, mismatches.to_string()
    for _, row in table.iterrows():
        if row["record_cpu"] == row["this_cpu"]:
            assert row["rule"] == rp.SAME_CPU_RULE and row["recorded"] == row["retrained"]
        else:
            assert row["rule"] == rp.OTHER_CPU_RULE and abs(row["diff"]) <= row["tolerance"]
    print(f"retrained {list(table['config_hash'].unique())} in {time.perf_counter() - start:.1f} s: "
          f"{rp.summary(table)}")
