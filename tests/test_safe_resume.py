"""The CLI never trains over a checkpoint unasked; a resumed run says so; an isolated run's log is appended."""

from __future__ import annotations

import dataclasses
import logging

import pytest

import nodelm_lib as nl
from nodelm_lib.cli import main
from nodelm_lib.config import apply_overrides
from nodelm_lib.runs.isolated import train_in_subprocess
from nodelm_lib.training.record import CHECKPOINT_NAME

TINY = ["--set", "model.d_model=32", "--set", "model.n_layers=2", "--set", "model.max_seq_len=32",
        "--set", "batch_size=4", "--set", "seq_len=32", "--set", "eval_batches=2", "--set", "eval_interval=3",
        "--set", "warmup_steps=2", "--set", "progress=false", "--set", "device=cpu"]


def cli_train(out_dir, steps: int, *extra: str) -> list[str]:
    return ["train", *TINY, "--set", f"out_dir={out_dir}", "--set", f"max_steps={steps}", *extra]


class Interrupt(Exception):
    pass


def interrupted_run(out_dir, steps: int, at: int) -> nl.TrainConfig:
    """The CLI's config for ``cli_train(out_dir, steps)``, trained up to step ``at`` (checkpointed
    there) and then interrupted."""
    tc = apply_overrides(nl.TrainConfig(), TINY[1::2] + [f"out_dir={out_dir}", f"max_steps={steps}",
                                                         f"checkpoint_interval={at}"])

    def stop(step, row, model):
        if step == at:
            raise Interrupt

    with pytest.raises(Interrupt):
        nl.train(tc, callback=stop)
    return tc


def test_the_cli_refuses_to_train_over_a_checkpoint_and_names_both_ways_out(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    tc = interrupted_run(out, 6, at=3)
    before = (out / CHECKPOINT_NAME).read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(cli_train(out, 6))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: out_dir {out} holds a checkpoint" in err and "start at step 0 and overwrite it" in err
    assert "--resume (or --set resume=true) to continue" in err and "--overwrite to start again from step 0" in err
    assert "Traceback" not in err and (out / CHECKPOINT_NAME).read_bytes() == before  # untouched

    whole = nl.train(dataclasses.replace(tc, out_dir=None, checkpoint_interval=0))
    with caplog.at_level(logging.INFO, logger="nodelm_lib.training.loop"):
        assert main(cli_train(out, 6, "--resume", "--record", str(tmp_path / "b.json"))) == 0
    assert "resumed from step 3 of 6" in caplog.text
    resumed = nl.RunRecord.from_json(tmp_path / "b.json")
    assert resumed.config_hash == whole.config_hash
    assert resumed.metrics == whole.metrics and resumed.final == whole.final  # continued, not restarted

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nodelm_lib.training.loop"):
        assert main(cli_train(out, 6, "--overwrite", "--record", str(tmp_path / "c.json"))) == 0
    assert "resumed" not in caplog.text and "starts at step 0 and replaces it" in caplog.text
    assert nl.RunRecord.from_json(tmp_path / "c.json").final == whole.final  # from step 0: the same numbers


def test_resume_and_overwrite_are_one_choice(tmp_path):
    with pytest.raises(SystemExit):
        main(cli_train(tmp_path, 3, "--resume", "--overwrite"))


def test_an_isolated_runs_log_is_appended_and_says_it_resumed(tmp_path):
    model = nl.ModelConfig(vocab_size=256, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
    tc = nl.TrainConfig(model=model, batch_size=4, seq_len=32, max_steps=3, eval_interval=3, eval_batches=1,
                        progress=False, device="cpu", out_dir=str(tmp_path), resume=True, checkpoint_interval=3)
    first = train_in_subprocess(tc, tmp_path)
    second = train_in_subprocess(tc, tmp_path)  # its checkpoint is at the last step: nothing left to train
    assert second.final == first.final
    log = (tmp_path / "train.log").read_text()
    assert log.count(f"run {tc.config_hash()} (gpt, seed 0), 3 steps") == 2  # both attempts kept
    assert "resumed from step 3 of 3" in log.split(f"run {tc.config_hash()}")[2]
    assert "Warning" not in log  # `python -m` of an already imported module made runpy warn in every run's log
