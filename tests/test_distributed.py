"""Data-parallel training under torchrun (gloo, 2 CPU processes): the numbers of one process, one
writer, and a resume across world sizes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.training import distributed
from nodelm_lib.training.record import CHECKPOINT_NAME, RECORD_NAME

REPO = Path(__file__).resolve().parents[1]
STEPS, GLOBAL_BATCH, CUT_AT = 20, 8, 10
TOLERANCE = 1e-5
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def tiny(out_dir: Path, **kw) -> nl.TrainConfig:
    # the hybrid: an ODE block under DDP, and a parameter no training step uses (control_proj)
    model = nl.ModelConfig(arch="hybrid", vocab_size=256, d_model=32, n_heads=4, n_layers=2, max_seq_len=32,
                           ode_start=0, ode_end=1, dropout=0.0)
    base = dict(model=model, batch_size=GLOBAL_BATCH, seq_len=32, max_steps=STEPS, lr=3e-3, warmup_steps=3,
                eval_interval=CUT_AT, eval_batches=3, progress=False, device="cpu", out_dir=str(out_dir),
                checkpoint_interval=CUT_AT)
    base.update(kw)
    return nl.TrainConfig(**base)


# Run by every rank: the whole run through the command line, then the same run stopped after CUT_AT
# steps. Each rank lists the files the trainer wrote (the checkpoint and record writers, patched).
RANK_SCRIPT = textwrap.dedent("""
    import dataclasses, importlib, os, sys
    import nodelm_lib as nl
    from nodelm_lib import cli

    from nodelm_lib.training import record, state

    out, config, cut_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    log = open(os.path.join(out, f"writes-rank{os.environ['RANK']}.txt"), "w")

    def listed(write):
        def wrapped(path, *args, **kwargs):
            log.write(f"{path}\\n")
            log.flush()
            return write(path, *args, **kwargs)
        return wrapped

    state.atomic_write = listed(state.atomic_write)  # the checkpoint
    record.atomic_write_text = listed(record.atomic_write_text)  # the record

    cli.main(["train", "--config", config, "--set", f"out_dir={out}/whole", "--record", f"{out}/whole.json"])

    class Killed(Exception):
        pass

    def kill(step, row, model):
        if step == cut_at:
            raise Killed(f"stopped after step {step}")

    try:
        nl.train(dataclasses.replace(nl.load_yaml(config), out_dir=f"{out}/cut"), callback=kill)
    except Killed:
        pass
""")


def torchrun_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch with 2 gloo processes: the whole run (CLI) and the run cut at CUT_AT."""
    out = tmp_path_factory.mktemp("ddp")
    config = out / "config.yaml"
    nl.save_yaml(tiny(out_dir=out / "unused"), config)
    script = out / "ranks.py"
    script.write_text(RANK_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(out), str(config), str(CUT_AT)]
    proc = subprocess.run(cmd, cwd=out, env=torchrun_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same run in this (single) process, global batch 8 on one rank."""
    return nl.train(tiny(out_dir=tmp_path_factory.mktemp("single")))


def losses(record: nl.RunRecord) -> list[float]:
    return [row["loss"] for row in record.metrics]


def test_two_ranks_compute_what_one_process_computes(two_ranks, one_process):
    out, proc = two_ranks
    ddp = nl.RunRecord.from_json(out / "whole.json")
    assert ddp.status == "completed" and ddp.config_hash == one_process.config_hash
    assert ddp.environment["world_size"] == 2 and ddp.environment["backend"] == "gloo"
    assert [row["step"] for row in ddp.metrics] == list(range(1, STEPS + 1))
    assert losses(ddp) == pytest.approx(losses(one_process), abs=TOLERANCE, rel=0)
    assert [e["val_loss"] for e in ddp.evals] == pytest.approx([e["val_loss"] for e in one_process.evals],
                                                               abs=TOLERANCE, rel=0)
    for key in ("train_loss", "val_loss", "test_loss"):
        assert ddp.final[key] == pytest.approx(one_process.final[key], abs=TOLERANCE, rel=0), key
    assert ddp.final["val_tokens"] == one_process.final["val_tokens"]
    # the gradients were averaged, not summed or left per rank: the weights match too
    ddp_model = nl.load_model(out / "whole" / CHECKPOINT_NAME)
    for name, value in one_process.model.state_dict().items():
        torch.testing.assert_close(ddp_model.state_dict()[name], value, atol=TOLERANCE, rtol=0, msg=name)
    assert proc.stdout.count(f"hybrid seed 0 ({ddp.config_hash})") == 1  # rank 0 alone reports


def test_only_rank_0_writes_and_each_checkpoint_once(two_ranks):
    out, _ = two_ranks
    assert (out / "writes-rank1.txt").read_text() == ""
    writes = (out / "writes-rank0.txt").read_text().splitlines()
    whole, cut = out / "whole", out / "cut"
    # whole run: checkpoints at steps 10 and 20 and the final model (as one process writes them), its
    # record and the CLI's --record; cut run: the checkpoint of step 10 and its record
    assert sorted(writes) == sorted([str(whole / CHECKPOINT_NAME)] * 3 + [str(whole / RECORD_NAME), str(out / "whole.json"),
                                     str(cut / CHECKPOINT_NAME), str(cut / RECORD_NAME)])
    assert sorted(p.name for p in whole.iterdir()) == [CHECKPOINT_NAME, RECORD_NAME]  # no stray temporary files
    assert torch.load(cut / CHECKPOINT_NAME, weights_only=True)["step"] == CUT_AT


def test_a_two_rank_checkpoint_resumes_on_one_process_to_the_same_numbers(two_ranks, one_process):
    out, _ = two_ranks
    cut = nl.RunRecord.from_json(out / "cut" / RECORD_NAME)
    assert cut.status == "interrupted" and len(cut.metrics) == CUT_AT
    state = torch.load(out / "cut" / CHECKPOINT_NAME, weights_only=True)
    assert len(state["rank_rng"]) == 2  # every rank's random state, for a resume on 2 ranks
    resumed = nl.train(tiny(out_dir=out / "cut", resume=True))
    assert resumed.status == "completed" and len(resumed.metrics) == STEPS
    assert losses(resumed) == pytest.approx(losses(one_process), abs=TOLERANCE, rel=0)
    for key in ("train_loss", "val_loss", "test_loss"):
        assert resumed.final[key] == pytest.approx(one_process.final[key], abs=TOLERANCE, rel=0), key


def test_a_global_batch_that_does_not_divide_is_refused_naming_both_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match=r"batch_size=9 \(the global batch\) does not divide among 2 processes"):
        nl.train(tiny(out_dir=tmp_path, batch_size=9))
    assert not torch.distributed.is_initialized()  # refused before joining any process group


def test_ranks_take_disjoint_rows_of_one_global_batch():
    x = torch.arange(8 * 3).view(8, 3)
    shards = [distributed.local_rows(distributed.Context(rank=r, world_size=4), x)[0] for r in range(4)]
    assert torch.equal(torch.cat(shards), x)  # disjoint, in order, covering the global batch
    assert distributed.local_rows(distributed.SINGLE, x)[0] is x


def test_the_launch_is_read_from_torchruns_environment():
    assert distributed.launch_context({}) == distributed.SINGLE
    ctx = distributed.launch_context({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.is_main) == (3, 1, 4, False)
    with pytest.raises(ValueError, match=r"RANK=4 must be in \[0, WORLD_SIZE=4\)"):
        distributed.launch_context({"WORLD_SIZE": "4", "RANK": "4"})
    with pytest.raises(ValueError, match="data-parallel training runs on 'cuda' or 'cpu', not device='mps'"):
        distributed.process_device(ctx, torch.device("mps"))


# Rank 1 finishes late (it stands for a rank that crashed or hangs): rank 0 waits for it at exit no
# longer than EXIT_WAIT, warns, and still exits cleanly; neither rank aborts.
LATE_RANK_SCRIPT = textwrap.dedent("""
    import datetime, os, time
    import torch
    from nodelm_lib.training import distributed

    distributed.EXIT_WAIT = datetime.timedelta(seconds=1)
    ctx = distributed.launch_context()
    distributed.setup(ctx, torch.device("cpu"))
    if ctx.rank == 1:
        time.sleep(6)
    print(f"rank {ctx.rank} done", flush=True)
""")


def test_a_rank_leaves_at_exit_without_a_peer_that_does_not_arrive(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(LATE_RANK_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=torchrun_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    assert "leaving the process group without the other ranks" in proc.stderr
