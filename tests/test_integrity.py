"""Stored files verified on read: edited, copied and cut-short records, checkpoints and token
caches, empty claims, duplicate (arm, seed) rows, and the store command that moves bad files aside."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import nodelm_lib as nl
from nodelm_lib.runs import store as run_store
from nodelm_lib.runs import claims
from nodelm_lib import data
from nodelm_lib.reporting import comparisons
from nodelm_lib.cli import main as cli_main
from nodelm_lib.training.integrity import DIGEST_KEY, CheckpointError, RecordError, digest, parsed_digest
from nodelm_lib.runs.store_checks import check_store, quarantine
from nodelm_lib.runs.records import record_row
from nodelm_lib.runs.store import load_records, read_record, record_path, stored_record

REPO = Path(__file__).resolve().parents[1]


def tiny(seed: int = 0) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
    return nl.TrainConfig(model=model, batch_size=4, seq_len=32, max_steps=6, lr=3e-3, warmup_steps=2,
                          eval_interval=3, eval_batches=2, progress=False, device="cpu", seed=seed)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A store with seeds 0 and 1 of a tiny run, and their checkpoints."""
    root = tmp_path_factory.mktemp("trained")
    for seed in (0, 1):
        nl.run(tiny(seed), store=root / "runs", checkpoints=root / "ckpt")
    return root


@pytest.fixture
def store(trained, tmp_path) -> Path:
    """A private copy of the trained store (tests damage it)."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path / "runs"


def path_of(store: Path, seed: int) -> Path:
    return record_path(store, tiny(seed).config_hash())


def edit(path: Path, change, keep_digest: bool = True) -> None:
    """Change the JSON record at ``path`` by hand; without ``keep_digest`` as a record written
    before records had a digest."""
    stored = json.loads(path.read_text())
    change(stored)
    if not keep_digest:
        stored.pop("digest")
    path.write_text(json.dumps(stored, indent=1))


def test_a_stored_record_reads_back_verified_and_carries_a_digest(store):
    record = stored_record(tiny(0), store)
    assert record.status == "completed" and record.config_hash == path_of(store, 0).stem
    assert "digest" in json.loads(path_of(store, 0).read_text())
    assert check_store(store) == []


def test_the_digest_of_a_record_read_back_is_the_digest_it_was_written_with():
    """Reading skips the JSON round trip of ``digest`` (``parsed_digest``): for every value a
    record can hold, the digest of the parsed text must be the one computed when writing."""
    data = {"config": {"lr": 3e-3, "seed": 0, "steps": (1, 2)}, "final": {"val_loss": float("nan"),
            "bpc": float("inf"), "zero": -0.0}, "metrics": [{"step": 1, "loss": 5.563106060028076}],
            "by_width": {64: 1.5, 128: 2 ** 70}, "note": "Lyapunov λ ≥ 0", "error": None, "b": True}
    written = {**data, DIGEST_KEY: digest(data)}
    parsed = json.loads(json.dumps(written, indent=1))
    assert parsed_digest(parsed) == digest(data) == parsed[DIGEST_KEY]
    assert parsed_digest(parsed) != parsed_digest({**parsed, "b": False})  # it still sees each value


def test_cached_loading_reads_only_new_or_changed_records_and_still_verifies_them(store, monkeypatch):
    first = load_records(store, cached=True)
    assert [r.config_hash for r in first] == [r.config_hash for r in load_records(store)]
    reads = []
    real_read = run_store.read_record
    monkeypatch.setattr(run_store, "read_record", lambda path: reads.append(Path(path).name) or real_read(path))
    again = load_records(store, cached=True)
    assert reads == [] and all(a is b for a, b in zip(first, again))  # nothing re-read: the same objects
    os.utime(path_of(store, 1), ns=(time.time_ns(), time.time_ns() + 10**9))  # "changed": read again
    assert [r.config_hash for r in load_records(store, cached=True)] == [r.config_hash for r in first]
    assert reads == [path_of(store, 1).name]
    edit(path_of(store, 0), lambda r: r["config"].update(lr=1e-2))  # a hand edit is caught, cached or not
    with pytest.raises(RecordError, match=path_of(store, 0).name):
        load_records(store, cached=True)
    path_of(store, 0).unlink()  # a removed record leaves the cached list too
    assert [r.config_hash for r in load_records(store, cached=True)] == [path_of(store, 1).stem]


def test_a_hand_edited_lr_is_caught_by_the_digest_and_by_the_hash(store):
    path = path_of(store, 0)
    edit(path, lambda r: r["config"].update(lr=0.5))
    with pytest.raises(RecordError, match=rf"{path} was changed after it was written.*store quarantine {store}"):
        stored_record(tiny(0), store)
    edit(path, lambda r: None, keep_digest=False)  # an old record without a digest
    with pytest.raises(RecordError, match=rf"{path}: its stored config hashes to [0-9a-f]{{16}}, but the record says "
                                          rf"config_hash {path.stem}: the config was edited .*lr=0.5"):
        stored_record(tiny(0), store)


def test_a_hand_edited_loss_is_caught(store):
    path = path_of(store, 0)
    edit(path, lambda r: r["final"].update(test_loss=1.0))
    with pytest.raises(RecordError, match="changed after it was written.*hand-edited loss"):
        read_record(path)
    edit(path, lambda r: r["final"].update(val_loss=1.0), keep_digest=False)  # no digest: its own curve tells
    with pytest.raises(RecordError, match=r"its final val_loss is 1.0, but its own curve ends at .*edited after the run"):
        read_record(path)


def test_a_record_copied_under_another_seeds_hash_is_refused(store):
    seed0, seed1 = path_of(store, 0), path_of(store, 1)
    shutil.copy(seed1, seed0)
    with pytest.raises(RecordError, match=rf"{seed0}: the file is named for run {seed0.stem} but holds the record of "
                                          rf"run {seed1.stem} \(gpt seed 1\).*one seed twice"):
        stored_record(tiny(0), store)
    with pytest.raises(RecordError, match="named for run"):
        load_records(store)


def test_tables_refuse_two_rows_of_one_arm_and_seed(store):
    records = [nl.RunRecord.from_json(path_of(store, s)) for s in (0, 1, 1)]
    runs = pd.DataFrame([record_row(r, arm="gpt") for r in records])
    message = rf"arm 'gpt' has more than one run for seeds \[1\] \(runs {path_of(store, 1).stem}, "
    with pytest.raises(ValueError, match=message):
        comparisons.summary_table(runs, ["test_loss"])
    runs = pd.concat([runs, runs.assign(arm="other")])
    with pytest.raises(ValueError, match=message):
        comparisons.compare_arms(runs, "test_loss", reference="gpt")
    assert comparisons.summary_table(runs.drop_duplicates(["arm", "seed"]), ["test_loss"])["n"].tolist() == [2, 2]


@pytest.mark.parametrize("damage, message", [
    (lambda text: text[: len(text) // 2], "is not readable JSON"),
    (lambda text: "", "is not readable JSON"),
    (lambda text: "[1, 2]", "holds a JSON list, not a run record"),
    (lambda text: json.dumps({"config": {}, "seed": 0}), r"is not a run record \(missing fields \['config_hash'\]\)"),
    (lambda text: json.dumps({**json.loads(text), "lr": 1}), r"is not a run record \(unknown fields \['lr'\]\)"),
])
def test_an_unreadable_record_names_its_path_and_the_way_out(store, damage, message):
    path = path_of(store, 0)
    path.write_text(damage(path.read_text()))
    with pytest.raises(RecordError, match=rf"{path} {message}.*python -m nodelm_lib store quarantine {store}"):
        stored_record(tiny(0), store)


def test_quarantine_moves_bad_records_aside_and_the_run_trains_again(store, capsys):
    good = stored_record(tiny(0), store)
    bad = path_of(store, 0)
    bad.write_text(bad.read_text()[:100])
    assert cli_main(["store", "check", str(store)]) == 1
    out = capsys.readouterr().out
    assert f"bad: {bad} is not readable JSON" in out and "1 bad" in out
    assert cli_main(["store", "quarantine", str(store)]) == 0
    assert f"moved {bad} -> {store / 'quarantine' / bad.name}" in capsys.readouterr().out
    assert not bad.exists() and check_store(store) == []
    assert stored_record(tiny(0), store) is None
    again = nl.run(tiny(0), store=store, checkpoints=store.parent / "fresh")  # trains again, to the same numbers
    assert again.final == good.final and again.metrics == good.metrics


def test_a_cut_short_or_foreign_checkpoint_names_its_path(store):
    ckpt = store.parent / "ckpt" / tiny(0).config_hash() / "checkpoint.pt"
    whole = ckpt.read_bytes()
    ckpt.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=rf"model file {ckpt} cannot be read: it was cut short or is corrupt"):
        nl.load_model(ckpt)
    # resuming from it says what to do instead of a bare zip or EOF error
    tc = nl.TrainConfig(**{**tiny(0).__dict__, "max_steps": 8, "out_dir": str(ckpt.parent), "resume": True})
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt} cannot be read.*starts again from step 0"):
        nl.train(tc)
    ckpt.write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"model file {ckpt} is empty"):
        nl.load_model(ckpt)
    ckpt.write_text(path_of(store, 0).read_text())  # a record passed as a checkpoint is no pickle threat
    with pytest.raises(CheckpointError, match=r"is not a PyTorch file \(it starts with b'\{\\n \"', not a zip archive"):
        nl.load_model(ckpt)
    problems = check_store(None, checkpoints=store.parent / "ckpt")
    assert [p for p, _ in problems] == [ckpt]
    moved = quarantine(None, checkpoints=store.parent / "ckpt")
    assert moved[0][1] == store.parent / "ckpt" / "quarantine" / ckpt.relative_to(store.parent / "ckpt")


def test_a_corrupt_token_cache_is_rebuilt_with_a_warning(tmp_path, caplog):
    first = data.load_tokens("tinyshakespeare", "validation", "char", cache_dir=tmp_path)
    (cache,) = tmp_path.glob("*.npy")
    for damage in (cache.read_bytes()[:-100], b"", b"not numpy at all" * 8):
        cache.write_bytes(damage)
        with caplog.at_level(logging.WARNING, logger="nodelm_lib.data"):
            again = data.load_tokens("tinyshakespeare", "validation", "char", cache_dir=tmp_path)
        assert f"token cache {cache} is unreadable" in caplog.text and "tokenising again" in caplog.text
        assert np.array_equal(again, first) and np.array_equal(np.load(cache), first)  # rebuilt on disk
        caplog.clear()


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"host": "x"}'])
def test_an_empty_or_unparsable_claim_is_stale_at_once(tmp_path, text):
    path = claims.claim_path(tmp_path, "abc")
    path.write_text(text)
    info = claims.read_claim(tmp_path, "abc")
    assert "unreadable claim file" in claims.describe(info) and "1970" not in claims.describe(info)
    assert not claims.is_stale(info)  # within the moment an exclusive create takes to fill a claim
    old = time.time() - 2 * claims.UNREADABLE_GRACE_S
    os.utime(path, (old, old))
    assert claims.is_stale(claims.read_claim(tmp_path, "abc"), stale_after_s=3600)
    started = time.monotonic()
    with claims.wait_for_claim(tmp_path, "abc", stale_after_s=3600) as claim:
        assert claim.held() and time.monotonic() - started < 5


def test_the_evaluations_beside_a_record_are_checked(store):
    record = stored_record(tiny(0), store)
    path = run_store.write_evaluations(record, {"k": {"loss": 1.0}}, store)
    assert run_store.read_evaluations(record, store) == {"k": {"loss": 1.0}}
    path.write_text("{")
    with pytest.raises(RecordError, match=rf"{path} is not readable JSON.*store quarantine {store}"):
        run_store.read_evaluations(record, store)
    shutil.copy(run_store.write_evaluations(record, {}, store), path.with_name(f"{path_of(store, 1).stem}.json"))
    assert [p.name for p, _ in check_store(store)] == [f"{path_of(store, 1).stem}.json"]


def test_every_committed_record_passes_the_check():
    runs = REPO / "results" / "runs"
    if not runs.is_dir():
        pytest.skip("no committed run records")
    assert check_store(runs) == []
