"""The run store: caching by config hash, atomic records, resume after a kill, the protocol."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import nodelm_lib as nl
import nodelm_lib.runs.store as store_module
from conftest import as_if_trained_elsewhere, fake_record
from nodelm_lib.experiments import protocol, sweeps
from nodelm_lib.config import with_values
from nodelm_lib.training.flops import forward_flops
from nodelm_lib.experiments.protocol import arm_configs, check_protocol
from nodelm_lib.runs.final_weights import weights_store
from nodelm_lib.runs.records import record_row, time_to_target
from nodelm_lib.runs.store import record_path, run_hash

REPO = Path(__file__).resolve().parents[1]


def tiny(max_steps: int = 12, **kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
    base = dict(model=model, batch_size=4, seq_len=32, max_steps=max_steps, lr=3e-3, warmup_steps=3,
                eval_interval=4, eval_batches=2, progress=False, device="cpu")
    base.update(kw)
    return nl.TrainConfig(**base)


def untimed(record: nl.RunRecord) -> dict:
    """What a run computed, without what it measured about the machine."""
    evals = [{k: v for k, v in row.items() if k != "train_time_s"} for row in record.evals]
    return {"metrics": record.metrics, "evals": evals, "final": record.final, "params": record.params,
            "config_hash": record.config_hash, "status": record.status}


def test_nl_train_is_still_the_function():
    assert callable(nl.train) and nl.train.__module__ == "nodelm_lib.training.loop"


def test_a_stored_run_is_read_back_not_rerun(tmp_path, monkeypatch):
    tc = tiny()
    first = nl.run(tc, store=tmp_path / "runs", checkpoints=tmp_path / "ckpt")
    path = record_path(tmp_path / "runs", first.config_hash)
    assert path.exists() and first.status == "completed"
    assert Path(first.checkpoint).exists() and nl.load_model(first.checkpoint).cfg == first.model.cfg

    def must_not_train(*args, **kwargs):
        raise AssertionError("a stored run was trained again")

    monkeypatch.setattr(store_module, "train", must_not_train)
    again = nl.run(tc, store=tmp_path / "runs", checkpoints=tmp_path / "ckpt")
    assert untimed(again) == untimed(nl.RunRecord.from_json(path))
    # anything that changes the numbers is another run
    with pytest.raises(AssertionError, match="trained again"):
        nl.run(tiny(lr=1e-3), store=tmp_path / "runs", checkpoints=tmp_path / "ckpt")


def test_final_models_read_stored_weights_and_retrain_missing_ones(tmp_path, monkeypatch):
    import shutil

    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    arms = {"a": {"model.arch": "gpt"}}
    runs, models = sweeps.final_models(tiny(max_steps=4), arms, [0, 1], **options)
    assert list(models) == [("a", 0), ("a", 1)] and runs["seed"].tolist() == [0, 1]
    assert not models[("a", 0)].training and models[("a", 0)].cfg.arch == "gpt"
    idx = torch.arange(8).reshape(1, 8)
    logits = models[("a", 0)](idx)[0]

    def must_not_train(*args, **kwargs):
        raise AssertionError("a run whose weights are on disk was trained again")

    with monkeypatch.context() as m:  # records and weights stored: read, not trained
        m.setattr(store_module, "train", must_not_train)
        _, again = sweeps.final_models(tiny(max_steps=4), arms, [0, 1], **options)
    assert torch.equal(again[("a", 0)](idx)[0], logits)
    assert not torch.equal(again[("a", 1)](idx)[0], logits)  # each seed its own model
    # a clone has the records but not the weights: the run is trained again, to the same numbers
    shutil.rmtree(tmp_path / "ckpt" / runs["config_hash"].iloc[0])
    retrained, third = sweeps.final_models(tiny(max_steps=4), arms, [0, 1], **options)
    assert retrained["val_loss"].tolist() == runs["val_loss"].tolist()
    assert torch.allclose(third[("a", 0)](idx)[0], logits, rtol=0, atol=1e-6)


def test_weights_trained_again_elsewhere_leave_the_stored_record_as_it_is(tmp_path, caplog):
    """On another kind of CPU a run trained again for its weights ends elsewhere: the stored record,
    which other tables read (02's and 07's read the runs 04 analyses), is kept byte for byte, the
    table is built from it, the retraining's record goes to a side store, and a warning says so."""
    import json
    import shutil

    options = dict(store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    arms = {"a": {"model.arch": "gpt"}}
    runs, _ = sweeps.final_models(tiny(max_steps=4), arms, [0], **options)
    config_hash = runs["config_hash"].iloc[0]
    path = record_path(tmp_path / "runs", config_hash)
    stored = as_if_trained_elsewhere(path)
    before = path.read_bytes()
    shutil.rmtree(tmp_path / "ckpt" / config_hash)  # a clone: records, no weights
    with caplog.at_level("WARNING"):
        table, models = sweeps.final_models(tiny(max_steps=4), arms, [0], **options)
    assert path.read_bytes() == before and table["val_loss"].iloc[0] == stored.final["val_loss"]
    side = record_path(weights_store(tmp_path / "ckpt"), config_hash)
    assert json.loads(side.read_text())["final"]["val_loss"] == runs["val_loss"].iloc[0]
    assert ("a", 0) in models and "ended elsewhere than their stored records" in caplog.text


def test_selected_lrs_reads_a_selection_file(tmp_path):
    import pandas as pd

    path = tmp_path / "seed_comparison_x_lr_selection.csv"
    pd.DataFrame({"arm": ["a", "a", "b"], "lr": [1e-3, 2e-3, 4e-3], "selected": [False, True, True]}).to_csv(path, index=False)
    assert protocol.selected_lrs(path) == protocol.selected_lrs(str(path)) == {"a": 2e-3, "b": 4e-3}
    with pytest.raises(FileNotFoundError, match=r"no learning-rate selection at .*missing.csv: run the notebook"):
        protocol.selected_lrs(tmp_path / "missing.csv")


def test_records_are_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    nl.RunRecord(config={}, config_hash="a", seed=0, status="completed").to_json(path)
    before = path.read_text()

    def crash(src, dst):
        raise OSError("disk died mid-write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        nl.RunRecord(config={}, config_hash="b", seed=1, status="completed").to_json(path)
    assert path.read_text() == before  # the old record is intact, never half-written


def test_an_isolated_run_computes_what_an_in_process_run_does(tmp_path):
    inside = nl.run(tiny(), store=tmp_path / "a", checkpoints=tmp_path / "ca")
    outside = nl.run(tiny(), store=tmp_path / "b", checkpoints=tmp_path / "cb", isolate=True)
    assert untimed(outside) == untimed(inside)
    assert outside.peak_memory_mb > 0 and outside.flops_per_token == inside.flops_per_token > 0


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    import nodelm_lib as nl
    sys.path.insert(0, {tests!r})
    from test_experiment import tiny, ARMS
    nl.sweep(tiny(max_steps={steps}, eval_interval=100), ARMS, seeds=[0], store={store!r}, checkpoints={ckpt!r},
             isolate=False, progress=False)
""")
ARMS = {"gpt": {}, "hybrid": {"model.arch": "hybrid", "model.ode_start": 0, "model.ode_end": 1}}


def test_a_killed_sweep_resumes_to_identical_records(tmp_path):
    steps = 400
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    script = SWEEP_SCRIPT.format(tests=str(REPO / "tests"), steps=steps, store=str(store), ckpt=str(ckpt))
    child = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, start_new_session=True)
    hybrid_cfg = arm_configs(tiny(max_steps=steps, eval_interval=100), ARMS, [0])[1][2]
    hybrid_ckpt = ckpt / run_hash(hybrid_cfg) / "checkpoint.pt"
    deadline = time.time() + 300
    while not hybrid_ckpt.exists():  # the first arm is done and the second one is under way
        assert child.poll() is None, "the sweep finished before it could be killed; make the runs longer"
        assert time.time() < deadline, "the sweep never reached its second run"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert len(list(store.glob("*.json"))) == 1  # only the first run had finished
    killed_at = torch.load(hybrid_ckpt, weights_only=True)["step"]
    assert 0 < killed_at < steps
    first_record = next(store.glob("*.json"))
    first_mtime = first_record.stat().st_mtime_ns

    resumed = nl.sweep(tiny(max_steps=steps, eval_interval=100), ARMS, seeds=[0], store=store, checkpoints=ckpt, isolate=False,
                       progress=False)
    assert first_record.stat().st_mtime_ns == first_mtime  # the finished run was not redone
    whole = nl.sweep(tiny(max_steps=steps, eval_interval=100), ARMS, seeds=[0], store=tmp_path / "whole", checkpoints=tmp_path / "cw",
                     isolate=False, progress=False)
    for h in whole["config_hash"]:
        a = nl.RunRecord.from_json(record_path(store, h))
        b = nl.RunRecord.from_json(record_path(tmp_path / "whole", h))
        assert untimed(a) == untimed(b)
    assert list(resumed["val_loss"]) == list(whole["val_loss"])


def test_every_arm_of_a_seed_sees_the_same_batches(monkeypatch):

    from nodelm_lib.training import loop as train_module

    seen: dict[str, list] = {}
    original = train_module.sample_batch

    def spy(*args, **kwargs):
        x, y = original(*args, **kwargs)
        seen.setdefault(current, []).append(x.clone())
        return x, y

    monkeypatch.setattr(train_module, "sample_batch", spy)
    for _, seed, tc in arm_configs(tiny(max_steps=6), ARMS | {"node": {"model.arch": "node", "model.n_layers": 4,
                                                                        "model.ode.n_steps": 4}}, [3]):
        current = tc.model.arch
        nl.train(tc)
    batches = list(seen.values())
    assert len(batches) == 3 and all(len(b) == 6 for b in batches)
    for other in batches[1:]:
        assert all(torch.equal(a, b) for a, b in zip(batches[0], other))


def test_expected_seconds_uses_measured_step_times_then_flops(tmp_path):
    """A model measured slow in the store is expected slow whatever its FLOPs; another width of it
    is scaled by FLOPs (``timing.step_seconds``); a model with no record of its own or of gpt is
    priced by its FLOPs at the others' seconds per FLOP, or by FLOPs alone in an empty store."""
    store = tmp_path / "runs"
    store.mkdir()
    small, wide = tiny(), with_values(tiny(), {"model.d_model": 64})
    ssm = with_values(tiny(), {"model.arch": "ssm"})
    fake_record(with_values(small, {"seed": 7}), seconds_per_step=0.5).to_json(record_path(store, "a"))
    guess = sweeps.expected_seconds([small, tiny(max_steps=24), wide, ssm], store)
    assert guess[0] == pytest.approx(12 * 0.5) and guess[1] == pytest.approx(24 * 0.5)  # measured, times steps
    # another width: the measured step scaled by FLOPs (one width only: no fixed share)
    assert guess[2] == pytest.approx(12 * 0.5 * forward_flops(wide) / forward_flops(small))
    # gpt's record prices any arch: ssm at gpt's step scaled by FLOPs
    assert guess[3] == pytest.approx(12 * 0.5 * forward_flops(ssm) / forward_flops(small))
    only_ssm = tmp_path / "only_ssm"  # no record of gpt: gpt at ssm's seconds per FLOP
    only_ssm.mkdir()
    fake_record(with_values(ssm, {"seed": 7}), seconds_per_step=0.5).to_json(record_path(only_ssm, "a"))
    per_flop = 0.5 / (forward_flops(ssm) * ssm.batch_size * ssm.seq_len)
    assert sweeps.expected_seconds([ssm, small], only_ssm) == pytest.approx(
        [12 * 0.5, 12 * per_flop * forward_flops(small) * small.batch_size * small.seq_len])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sweeps.expected_seconds([small, wide], empty) == pytest.approx(
        [12 * forward_flops(tc) * tc.batch_size * tc.seq_len for tc in (small, wide)])


def test_parallel_runs_start_longest_first(tmp_path, monkeypatch):
    started = []

    def fake_run(tc, store, checkpoints, isolate, need_checkpoint, threads):
        started.append(tc.max_steps)
        return fake_record(tc, 0.0)

    monkeypatch.setattr(sweeps, "run", fake_run)
    steps = [3, 40, 7, 25, 12, 1]
    records = sweeps.train_all([tiny(max_steps=n) for n in steps], store=tmp_path / "runs",
                                   checkpoints=tmp_path / "ckpt", isolate=True, workers=2, progress=False)
    assert [len(r.metrics) for r in records] == [10] * len(steps)  # records in the order given
    assert [r.config["max_steps"] for r in records] == steps
    by_length = sorted(steps, reverse=True)
    # two threads take the queue in order; adjacent runs may swap when both start at once
    assert all(abs(started.index(n) - by_length.index(n)) <= 1 for n in steps), started


def test_arms_may_differ_only_in_their_model():
    check_protocol(arm_configs(tiny(), ARMS, [0, 1]))
    with pytest.raises(ValueError, match=r"arm 'fast' changes the learning rate \(lr=0.01"):
        check_protocol(arm_configs(tiny(), {"gpt": {}, "fast": {"lr": 1e-2}}, [0]))
    configs = arm_configs(tiny(), ARMS, [0, 1])
    with pytest.raises(ValueError, match="same seeds"):
        check_protocol(configs[:-1])
    with pytest.raises(ValueError, match="unknown key 'model.widht'"):
        arm_configs(tiny(), {"x": {"model.widht": 3}}, [0])


def test_record_rows_and_time_to_target():
    record = nl.RunRecord(config=nl.config.to_dict(tiny()), config_hash="h", seed=2, status="completed",
                          metrics=[{"loss": 1.0}] * 10, final={"val_loss": 2.0, "test_loss": 2.1, "train_loss": 1.9},
                          train_time_s=5.0)
    row = record_row(record, arm="a")
    assert row["arm"] == "a" and row["ms_per_step"] == pytest.approx(500.0)
    assert row["val_ppl"] == pytest.approx(7.389056) and row["test_bits_per_token"] == pytest.approx(2.1 / 0.693147, 1e-5)
    import pandas as pd
    curves = pd.DataFrame({"arm": ["a"] * 3 + ["b"] * 3, "seed": [0] * 6, "step": [0, 4, 8] * 2,
                           "train_time_s": [0.0, 1.0, 2.0] * 2, "val_loss": [3.0, 2.4, 2.2, 3.0, 2.9, 2.8]})
    hit = time_to_target(curves, 2.5).set_index("arm")
    assert hit.loc["a", "time_to_target_s"] == 1.0 and hit.loc["a", "step_to_target"] == 4
    assert pd.isna(hit.loc["b", "time_to_target_s"])


# --------------------------------------------------------------------------- arms, FLOPs, tables


def test_for_arch_applies_each_archs_depth_convention():
    from nodelm_lib.config import for_arch

    base = nl.ModelConfig(vocab_size=256, d_model=32, n_heads=4, n_layers=6, ode=nl.ODEConfig(method="rk4", n_steps=3))
    assert for_arch(base, "node").ode == nl.ODEConfig(method="rk4", n_steps=6)
    hybrid = for_arch(base, "hybrid")
    assert (hybrid.ode_start, hybrid.ode_end, hybrid.ode.n_steps) == (2, 4, 3)
    constant = dataclasses.replace(for_arch(base, "ti_mlp"), modulation="constant")
    assert for_arch(constant, "gpt").modulation == "time"  # an option gpt does not have is reset
    with pytest.raises(ValueError, match="model.arch='rnn' is not valid"):
        for_arch(base, "rnn")


def test_with_values_sets_dotted_keys_and_whole_configs():
    from nodelm_lib.config import with_values

    tc = with_values(tiny(), {"model.ode.method": "rk4", "seed": 7})
    assert tc.model.ode.method == "rk4" and tc.seed == 7
    model = nl.ModelConfig(arch="node", vocab_size=256, d_model=16, n_heads=2, n_layers=2, ode=nl.ODEConfig(n_steps=2))
    assert with_values(tiny(), {"model": model}).model == model
    with pytest.raises(ValueError, match="model.n_layers=3 but model.ode.n_steps=2"):
        with_values(tiny(), {"model": model, "model.n_layers": 3})


def test_architecture_arms_add_a_parameter_matched_gpt():
    model = nl.ModelConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=4)
    arms = protocol.architecture_arms(model, ["gpt", "ti_mlp"], match_to="ti_mlp")
    assert list(arms) == ["gpt", "ti_mlp", "gpt_matched"]
    target = nl.count_params(arms["ti_mlp"]["model"])["non_embedding"]
    matched = arms["gpt_matched"]["model"]
    assert matched.arch == "gpt" and matched.d_model < model.d_model
    assert abs(nl.count_params(matched)["non_embedding"] - target) < 0.1 * target


def test_forward_flops_per_token_counts_matmuls_attention_and_every_stage(monkeypatch):
    from nodelm_lib.models.common import ODEBlock
    from nodelm_lib.training.flops import forward_flops_per_token

    d, L, T, V = 32, 2, 16, 256
    gpt = nl.build_model(nl.ModelConfig(vocab_size=V, d_model=d, n_heads=4, n_layers=L, max_seq_len=T))
    # per layer: qkv 3d^2, proj d^2, MLP 8d^2 multiply-adds per token, attention 2 T d (full T x T)
    assert forward_flops_per_token(gpt, T) == L * (2 * 12 * d * d + 2 * 2 * T * d) + 2 * d * V

    def body(method):
        cfg = nl.ModelConfig(arch="ti_mlp", vocab_size=V, d_model=d, n_heads=4, n_layers=2, max_seq_len=T,
                             ode=nl.ODEConfig(method=method, n_steps=2))
        return forward_flops_per_token(nl.build_model(cfg), T) - 2 * d * V

    # with weights generated once per distinct time (nn.TimeGrid), rk4's two midpoint stages share
    # theirs: fewer FLOPs than four full evaluations per step
    shared = body("rk4")
    monkeypatch.setattr(ODEBlock, "field_times", lambda self, x: None)  # weights per evaluation
    assert body("rk4") == pytest.approx(4 * body("euler"), rel=1e-6)  # four field evaluations per step
    assert shared < body("rk4")


def test_flops_per_token_counts_weights_generated_from_t_once_per_pass():
    """node's hypernetwork weights are generated once per forward pass, so per token they cost
    less at a larger batch; the two-count formula equals a direct count at that batch. A gpt
    costs the same per token at any batch."""
    from nodelm_lib.training.flops import _forward_flops, forward_flops_per_token

    T = 16
    node = nl.build_model(nl.config.for_arch(nl.ModelConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2,
                                                            max_seq_len=T), "node"))
    gpt = nl.build_model(nl.ModelConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=T))
    assert forward_flops_per_token(node, T, 5) == pytest.approx(_forward_flops(node, T, 5) / (5 * T), rel=1e-12)
    assert forward_flops_per_token(node, T, 5) < forward_flops_per_token(node, T, 2) < forward_flops_per_token(node, T)
    assert forward_flops_per_token(gpt, T, 5) == forward_flops_per_token(gpt, T)
    with pytest.raises(ValueError, match="batch_size=0"):
        forward_flops_per_token(gpt, T, 0)


def test_a_stored_record_counted_at_one_sequence_is_counted_again_at_its_batch(tmp_path):
    """Records written before the FLOPs count took the batch have it at one sequence: reading the
    store counts it again at the training batch and writes it back, once; a record counted at its
    batch, or one still running, is left as it is."""
    from nodelm_lib.training.flops import forward_flops
    from nodelm_lib.runs.store import load_records, read_record

    tc = tiny(model=nl.config.for_arch(tiny().model, "node"))
    old = fake_record(tc, 0.5)
    old.flops_per_token, old.flops_batch_size = forward_flops(tc, 1), 1
    path = record_path(tmp_path, "old")
    old.to_json(path)
    assert forward_flops(tc) < old.flops_per_token and tc.batch_size > 1
    read = read_record(path)
    assert read.flops_batch_size == tc.batch_size and read.flops_per_token == forward_flops(tc)
    assert nl.RunRecord.from_json(path).flops_per_token == read.flops_per_token  # written back
    written = path.read_text()
    assert load_records(tmp_path)[0].flops_per_token == read.flops_per_token and path.read_text() == written

    running = dataclasses.replace(old, status="running")
    running.to_json(path)
    assert read_record(path).flops_batch_size == 1 and path.read_text() == running.to_json()


def test_report_table_shows_mean_ci_and_the_paired_comparison():
    import pandas as pd

    from nodelm_lib.reporting import comparisons, tables

    runs = pd.DataFrame({"arm": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
                         "test_loss": [2.0, 2.1, 2.2, 1.5, 1.61, 1.69], "params": [100] * 3 + [50] * 3})
    table = tables.report_table(runs, {"test_loss": ("test loss", 3), "params": ("params", 0)}, reference="a",
                               test_metric="test_loss").set_index("arm")
    assert table.loc["a", "test loss"] == "2.100 ± 0.248"  # t_{0.975,2} * 0.1 / sqrt(3)
    assert table.loc["b", "params"] == "50"  # the same for every seed: no interval
    assert table.loc["a", "Δ test loss vs a"] == "–" and table.loc["b", "Δ test loss vs a"].startswith("-0.5 ± ")
    expected = comparisons.compare_arms(runs, "test_loss", "a").iloc[0]
    assert table.loc["b", "p (paired t, Holm)"] == f"{expected['p_t_holm']:.3g}"



ORPHAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import nodelm_lib as nl
from test_experiment import tiny
nl.run(tiny(max_steps=10**6, eval_interval=10**5), store={store!r}, checkpoints={ckpt!r}, isolate=True)
"""


def _pids_running(needle: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the training process through /proc")
def test_an_isolated_run_stops_when_its_sweep_is_killed(tmp_path):
    """A sweep killed hard must not leave its run training on: the restarted sweep would take over
    the dead sweep's claim and train the same hash a second time beside the orphan."""
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    long_run = tiny(max_steps=10**6, eval_interval=10**5)
    config_file = ckpt / run_hash(long_run) / "config.json"
    script = ORPHAN_SCRIPT.format(tests=str(REPO / "tests"), store=str(store), ckpt=str(ckpt))
    sweep = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    children = []
    try:
        deadline = time.time() + 120
        while not children:
            assert sweep.poll() is None, "the sweep stopped before its run started"
            assert time.time() < deadline, "the isolated run never started"
            time.sleep(0.1)
            children = _pids_running(str(config_file.parent)) if config_file.exists() else []
        time.sleep(1.0)  # past the child's start-up, into training
        sweep.kill()
        sweep.wait()
        deadline = time.time() + 20
        while _pids_running(str(config_file.parent)) and time.time() < deadline:
            time.sleep(0.2)
        assert not _pids_running(str(config_file.parent)), "the run trained on after its sweep was killed"
    finally:
        sweep.kill()
        for pid in _pids_running(str(config_file.parent)):
            os.kill(pid, signal.SIGKILL)


def test_a_run_trained_again_for_its_weights_keeps_its_stored_record(tmp_path, caplog):
    """Records are committed, checkpoints are not: a notebook that needs a stored run's weights
    (04 reads 02's models) trains it again. When the training reproduces the record, the record
    stays byte for byte (its commit and times are the ones the tables were built from); when it
    ends elsewhere (another kind of CPU) it stays byte for byte too, since other tables read it: the
    retraining's record goes to the side store, with a warning, and is what `run` returns, the
    record of the weights on disk, beside which evaluations of them belong."""
    import shutil

    tc = tiny()
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    first = nl.run(tc, store, ckpt)
    path = record_path(store, first.config_hash)
    elsewhere = dataclasses.replace(nl.RunRecord.from_json(path), wall_time_s=12345.0,
                                    environment={**first.environment, "git_commit": "0000000"})
    elsewhere.to_json(path)  # as if trained by another commit, at another speed
    stamped = path.read_text()
    shutil.rmtree(ckpt)
    again = nl.run(tc, store, ckpt, need_checkpoint=True)
    assert path.read_text() == stamped and again.environment["git_commit"] == "0000000"
    assert store_module.checkpoint_path(first.config_hash, ckpt).exists() and again.model is not None

    shifted = first.final["val_loss"] + 0.5  # its curve and final loss, consistently
    moved = dataclasses.replace(elsewhere, final={**first.final, "val_loss": shifted},
                                evals=[*first.evals[:-1], {**first.evals[-1], "val_loss": shifted}])
    moved.to_json(path)  # a record whose numbers this machine does not reproduce
    committed = path.read_bytes()
    shutil.rmtree(ckpt)
    with caplog.at_level("WARNING", logger="nodelm_lib.runs.store"):
        retrained = nl.run(tc, store, ckpt, need_checkpoint=True)
    assert "ended elsewhere than its stored record" in caplog.text
    assert path.read_bytes() == committed and retrained.final == first.final
    side = record_path(store_module.weights_store(ckpt), first.config_hash)
    assert nl.RunRecord.from_json(side).final == first.final
    assert store_module.evaluations_store(retrained, store, ckpt) == store_module.weights_store(ckpt)
    assert store_module.evaluations_store(moved, store, ckpt) == store
    # the weights on disk are the retraining's: reading them back gives its record, not the stored one
    assert nl.run(tc, store, ckpt, need_checkpoint=True).final == first.final
    assert nl.run(tc, store, ckpt).final == moved.final
