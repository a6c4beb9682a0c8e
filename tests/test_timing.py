"""How long a run takes, from stored records (``runs.timing``): training priced per step, scoring
per scored token, records keyed as this version reads their configs, this machine's records first."""

from __future__ import annotations

import math

import pytest

import nodelm_lib as nl
from conftest import fake_record
from nodelm_lib.data import load_tokens
from nodelm_lib.experiments import protocol, scaling
from nodelm_lib.runs import timing
from nodelm_lib.runs.budget import estimate_run_s
from nodelm_lib.runs.store import load_records
from nodelm_lib.training.evaluation import scored_tokens
from nodelm_lib.training.flops import forward_flops
from nodelm_lib.training.profiling import cpu_description

HERE = cpu_description()
ELSEWHERE = {"cpu_name": "Some Other CPU", "cpu_capability": "AVX512"}


def tiny(**kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    base = dict(model=model, dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16, max_steps=6,
                eval_interval=4, eval_batches=2, eval_on="batches", lr=1e-3, seed=0, device="cpu", progress=False)
    return nl.TrainConfig(**{**base, **kw})


def window_tokens(split: str, seq_len: int = 16) -> int:
    """Tokens of a tiny-shakespeare split in consecutive windows of ``seq_len``, counted here."""
    return (len(load_tokens("tinyshakespeare", split, "char")) - 1) // seq_len * seq_len


def width_configs(archs, widths) -> dict[str, nl.TrainConfig]:
    base = protocol.base_config(n_heads=4, n_layers=2, max_seq_len=32, ssm_state_size=4, ode_method="euler",
                                dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16, max_steps=10,
                                warmup_steps=1, min_lr_ratio=0.1, beta2=0.99, eval_interval=5, eval_batches=1,
                                eval_on="batches", device="cpu")
    return {name: nl.config.with_values(base, cell) for name, cell in scaling.width_cells(base.model, archs, widths).items()}


@pytest.mark.parametrize("eval_on, score_test", [("batches", True), ("whole_split", True),
                                                  ("whole_split_at_end", True), ("whole_split_at_end", False)])
def test_the_tokens_a_run_scores_are_those_its_record_shows(eval_on, score_test):
    """``scored_tokens`` of a config counts what a real run of it evaluates: its curve's points
    (step 0, every ``eval_interval`` steps and the last) and its final scores."""
    tc = tiny(eval_on=eval_on, score_test=score_test, model=nl.ModelConfig(arch="gpt", d_model=8, n_heads=2,
                                                                           n_layers=1, max_seq_len=64), seq_len=64)
    record = nl.train(tc)
    assert [e["step"] for e in record.evals] == [0, 4, 6]
    assert timing.recorded_scored_tokens(record) == scored_tokens(tc)
    curve = record.final["val_tokens"] if eval_on == "whole_split" else 2 * 2 * 64
    final = record.final["val_tokens"] if eval_on == "whole_split_at_end" else 0
    assert scored_tokens(tc) == 3 * curve + final + record.final.get("test_tokens", 0)
    assert ("test_tokens" in record.final) == score_test


def test_a_run_pays_its_steps_for_training_and_its_scored_tokens_for_scoring(tmp_path):
    """A short run that scores a whole split is mostly scoring: priced from a long run of the same
    shape, its scoring follows the tokens it scores, not its steps (priced by wall time per step,
    a 500-step WikiText-2 selection run came out at a third of its time)."""
    long = tiny(max_steps=2000, eval_interval=400, eval_on="whole_split_at_end")
    val, test = (window_tokens(split) for split in ("validation", "test"))
    scored = 6 * 2 * 2 * 16 + val + test  # 6 curve points of 2 batches, then both whole splits
    assert scored_tokens(long) == scored
    fake_record(long, 0.1, steps=2000, other_s=100.0, evals=[{}] * 6,
                final={"val_tokens": val, "test_tokens": test}).to_json(tmp_path / "long.json")
    records = load_records(tmp_path)
    assert timing.recorded_scored_tokens(records[0]) == scored
    short = tiny(max_steps=500, eval_interval=100, eval_on="whole_split_at_end", score_test=False, seed=1)
    got = timing.run_times([short, long], records)
    assert got["source"].tolist() == ["measured", "measured"]
    assert got["s_per_step"].tolist() == pytest.approx([0.1, 0.1])
    assert got["scoring_s"].iloc[0] == pytest.approx(100.0 * scored_tokens(short) / scored, rel=1e-9)
    assert got["seconds"].tolist() == pytest.approx([500 * 0.1 + got["scoring_s"].iloc[0], 2000 * 0.1 + 100.0])
    assert got["seconds"].iloc[0] > 2 * 500 * 0.1  # scoring a whole split outweighs 500 steps here
    seconds, how = estimate_run_s(short, records)
    assert seconds == pytest.approx(got["seconds"].iloc[0] + timing.STARTUP_S) and how == "measured"


def test_a_record_that_scored_nothing_prices_its_other_seconds_as_they_are(tmp_path):
    fake_record(tiny(), 0.2, steps=10, other_s=3.0).to_json(tmp_path / "a.json")
    (got,) = timing.run_times([tiny(max_steps=40, seed=5)], load_records(tmp_path)).to_dict("records")
    assert got["scoring_s"] == pytest.approx(3.0) and got["seconds"] == pytest.approx(40 * 0.2 + 3.0)


def test_a_record_written_before_a_config_field_existed_still_times_its_shape(tmp_path):
    """An older record's stored config lacks a field added since (``model.position``, which this
    version reads as "learned"); it must still count as measured, not fall back to gpt scaled (as
    every WikiText-2 record did)."""
    record = fake_record(tiny(model=nl.ModelConfig(arch="ssm", d_model=16, n_heads=2, n_layers=1, max_seq_len=16,
                                                   ssm_state_size=4)), 0.3)
    del record.config["model"]["position"]
    record.to_json(tmp_path / "old.json")
    fake_record(tiny(), 0.1).to_json(tmp_path / "gpt.json")
    config = tiny(model=nl.ModelConfig(arch="ssm", d_model=16, n_heads=2, n_layers=1, max_seq_len=16,
                                       ssm_state_size=4), seed=3)
    assert nl.config.to_dict(load_records(tmp_path)[0].train_config)["model"]["position"] == "learned"
    (got,) = timing.run_times([config], load_records(tmp_path)).to_dict("records")
    assert got["source"] == "measured" and got["s_per_step"] == pytest.approx(0.3)


def test_this_machines_records_come_first_and_another_machines_are_named(tmp_path):
    fake_record(tiny(seed=1), 0.3, environment=ELSEWHERE).to_json(tmp_path / "other.json")
    config = tiny(seed=9)
    (got,) = timing.run_times([config], load_records(tmp_path)).to_dict("records")
    assert got["s_per_step"] == pytest.approx(0.3)
    assert got["source"] == "measured on another machine: Some Other CPU (AVX512)"
    fake_record(tiny(seed=2), 0.1).to_json(tmp_path / "here.json")
    fake_record(tiny(seed=3), 0.1).to_json(tmp_path / "here2.json")
    fake_record(tiny(seed=4), 0.3, environment=ELSEWHERE).to_json(tmp_path / "other2.json")
    (got,) = timing.run_times([config], load_records(tmp_path)).to_dict("records")
    assert got["s_per_step"] == pytest.approx(0.1) and got["source"] == "measured"  # not the median of all four
    assert timing.machine_of({"device_name": "NVIDIA H100", **HERE}) == "NVIDIA H100"


def test_step_times_are_measured_for_a_stored_model_and_scaled_by_flops_for_another_width(tmp_path):
    configs = width_configs(["gpt", "ti_mlp"], [16, 32, 64])
    flops = {name: forward_flops(tc) for name, tc in configs.items()}
    # gpt at 16 and 32: a + b F with a fixed share of 0.25 at d=32; ti_mlp measured at 32 only
    b = 0.75 * 0.1 / flops["gpt d=32"]
    a = 0.1 - b * flops["gpt d=32"]
    for name, s in {"gpt d=16": a + b * flops["gpt d=16"], "gpt d=32": 0.1, "ti_mlp d=32": 0.2}.items():
        fake_record(configs[name], s, other_s=1.0).to_json(tmp_path / f"{name}.json")
    got = timing.run_times([configs["gpt d=32"], configs["ti_mlp d=64"], configs["gpt d=64"]], load_records(tmp_path))
    assert got["source"].iloc[0] == "measured" and got["s_per_step"].iloc[0] == pytest.approx(0.1)
    assert got["seconds"].iloc[0] == pytest.approx(10 * 0.1 + 1.0)
    scale = 0.25 + 0.75 * flops["ti_mlp d=64"] / flops["ti_mlp d=32"]
    assert got["s_per_step"].iloc[1] == pytest.approx(0.2 * scale, rel=1e-6)
    assert got["scoring_s"].iloc[1] == pytest.approx(1.0 * scale, rel=1e-6)  # scoring also grows with FLOPs
    assert "scaled by FLOPs" in got["source"].iloc[1] and "fixed share 0.25" in got["source"].iloc[1]
    assert got["s_per_step"].iloc[2] == pytest.approx(a + b * flops["gpt d=64"], rel=1e-6)


def test_an_arm_with_no_record_of_its_own_or_of_gpt_is_priced_from_another_arm_of_the_same_shape(tmp_path):
    """A GPU sweep in chunks meets arms before gpt's records come home: the first chunk of 02's gpu
    profile priced every arm after hybrid at the assumed 150 s although hybrid's records were there."""
    configs = width_configs(["gpt", "ti_mlp", "ssm"], [16, 64])
    fake_record(configs["ti_mlp d=16"], 0.2).to_json(tmp_path / "ti_mlp.json")
    fake_record(configs["gpt d=64"], 0.3).to_json(tmp_path / "gpt_wide.json")  # width-free key: gpt d=64 is gpt
    other_shape = nl.config.with_values(configs["ssm d=16"], {"batch_size": 3})
    records = [r for r in load_records(tmp_path) if r.config["model"]["arch"] == "ti_mlp"]
    got = timing.run_times([configs["ssm d=16"], other_shape], records)
    flops = forward_flops(configs["ssm d=16"]) / forward_flops(configs["ti_mlp d=16"])
    assert got["s_per_step"].iloc[0] == pytest.approx(0.2 * flops, rel=1e-6)  # one width: no fixed share
    assert "no record of this arm or of gpt: ti_mlp's" in got["source"].iloc[0]
    assert math.isnan(got["seconds"].iloc[1]) and got["source"].iloc[1] == "no record of this arm or of gpt"
    # with gpt's record in the store, gpt prices the arm as before
    with_gpt = timing.run_times([configs["ssm d=16"]], load_records(tmp_path))
    assert "gpt's" in with_gpt["source"].iloc[0]


def test_a_models_flops_are_counted_once_per_shape_in_a_process(monkeypatch):
    """An estimate over a store prices hundreds of records of a few shapes: ``forward_flops``
    counts each (model, sequence length, batch) once, and a copy of a config is the same shape."""
    from nodelm_lib.training import flops

    counts = []
    real = flops._count_forward_flops
    flops.forget_counts()
    monkeypatch.setattr(flops, "_count_forward_flops", lambda *a: counts.append(a[1:]) or real(*a))
    first = forward_flops(tiny())
    assert forward_flops(tiny(seed=3, lr=5e-3)) == first and counts == [(16, 2)]  # same model and shape
    assert forward_flops(tiny(), batch_size=1) == first and counts == [(16, 2), (16, 1)]  # gpt: no per-pass cost
    assert forward_flops(tiny(model=nl.ModelConfig(arch="gpt", d_model=32, n_heads=2, n_layers=1,
                                                   max_seq_len=16))) > first
    assert len(counts) == 3 and first == real(flops.model_with_vocab(tiny()), 16, 2)


def test_a_records_timing_row_takes_its_own_flop_count_at_its_batch(monkeypatch):
    """``record_timings`` reads a record's FLOPs from the record where it counted them at the
    whole batch (``store.read_record`` makes sure it has), and counts a data-parallel record's
    (per rank) again at the whole batch, as a config is counted."""
    from nodelm_lib.training import flops

    counted = []
    real = flops._count_forward_flops
    flops.forget_counts()
    monkeypatch.setattr(flops, "_count_forward_flops", lambda *a: counted.append(a[1:]) or real(*a))
    whole = fake_record(tiny(), 0.1, flops_per_token=123.0, flops_batch_size=2)
    per_rank = fake_record(tiny(seed=1), 0.1, flops_per_token=123.0, flops_batch_size=1)
    rows = timing.record_timings([whole, per_rank])
    assert rows["flops"].tolist() == [123.0, forward_flops(tiny())]
    assert counted == [(16, 2)]  # the first row counted nothing; the second once, at the whole batch
