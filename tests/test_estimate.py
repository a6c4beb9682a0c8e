"""GPU time estimates from FLOPs: scaling, the GPU table, sweeps and the printed table."""

import dataclasses

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.experiments.estimate import DEFAULT_MFU, GPU, GPUS, TABLE_GPUS, estimate_time, format_seconds, gpu_seconds, train_flops
from nodelm_lib.training.flops import TRAIN_FLOPS_PER_FORWARD_FLOP, forward_flops
from nodelm_lib.training.flops import forward_flops_per_token


def cfg(arch="gpt", **kw) -> nl.TrainConfig:
    model = nl.config.for_arch(nl.ModelConfig(d_model=64, n_heads=4, n_layers=4, max_seq_len=64), arch)
    base = dict(model=model, batch_size=8, seq_len=64, max_steps=1000)
    base.update(kw)
    return nl.TrainConfig(**base)


def test_forward_flops_are_the_records_count():
    tc = cfg("hybrid")
    model = nl.build_model(dataclasses.replace(tc.model, vocab_size=256))  # the char tokenizer's vocabulary
    assert forward_flops(tc) == forward_flops_per_token(model, tc.seq_len, tc.batch_size) > 0
    assert forward_flops(tc, 1) == forward_flops_per_token(model, tc.seq_len) > forward_flops(tc)
    assert train_flops(tc) == TRAIN_FLOPS_PER_FORWARD_FLOP * forward_flops(tc) * 1000 * 8 * 64


def test_an_adaptive_solver_is_counted_on_the_cpu_without_touching_the_random_state():
    tc = cfg("hybrid", model=dataclasses.replace(cfg("hybrid").model, ode=nl.ODEConfig(method="dopri5")))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert forward_flops(tc) > 0
    assert torch.equal(torch.rand(3), expected)


def test_time_is_linear_in_steps_and_inverse_in_the_peak():
    one, two = train_flops(cfg(max_steps=1000)), train_flops(cfg(max_steps=2000))
    assert two == pytest.approx(2 * one)
    assert gpu_seconds(two, "A100") == pytest.approx(2 * gpu_seconds(one, "A100"))
    slow, fast = GPU("slow", {"bfloat16": 100.0, "float32": 50.0}), GPU("fast", {"bfloat16": 200.0, "float32": 100.0})
    assert gpu_seconds(one, slow) == pytest.approx(2 * gpu_seconds(one, fast))
    assert gpu_seconds(one, slow, dtype="float32") == pytest.approx(2 * gpu_seconds(one, slow))
    assert gpu_seconds(one, "A100") / gpu_seconds(one, "H100") == pytest.approx(989 / 312)
    # and the definition itself: FLOPs / (peak x MFU)
    assert gpu_seconds(1e15, "A100", mfu=0.5) == pytest.approx(1e15 / (312e12 * 0.5))
    assert gpu_seconds(1e15, "a100") == gpu_seconds(1e15, "A100", mfu=DEFAULT_MFU)  # names ignore case
    # the whole estimate scales the same way
    short, long = estimate_time(cfg(max_steps=1000)), estimate_time(cfg(max_steps=3000))
    assert tuple(short.total) == TABLE_GPUS
    for name in TABLE_GPUS:
        assert long.total[name] == pytest.approx(3 * short.total[name])


def test_an_h200_is_known_by_name_and_prices_as_an_h100():
    # bench/record.py names the GPU it runs on; an H200 lease failed there when it was unknown
    assert "H200" in GPUS and "H200" not in TABLE_GPUS
    est = estimate_time(cfg(max_steps=1000), gpus=["h200", "H100"], dtype="bfloat16")
    assert est.total["H200"] == pytest.approx(est.total["H100"])
    assert gpu_seconds(1e15, "H200") == pytest.approx(gpu_seconds(1e15, "H100"))


def test_a_per_step_floor_bounds_launch_bound_runs():
    assert gpu_seconds(1e9, "H100", steps=1000, min_step_s=0.005) == pytest.approx(5.0)
    assert gpu_seconds(1e18, "H100", steps=1000, min_step_s=0.005) == pytest.approx(gpu_seconds(1e18, "H100"))


def test_unknown_gpus_and_bad_values_name_the_choices():
    with pytest.raises(ValueError, match=r"gpu='V100' is not valid; choose one of 'T4', 'L4', 'A100', 'H100'"):
        estimate_time(cfg(), gpus=["A100", "V100"])
    with pytest.raises(ValueError, match=r"gpu='V100' is not valid"):
        gpu_seconds(1e12, "V100")
    with pytest.raises(ValueError, match=r"mfu=0 is not valid"):
        gpu_seconds(1e12, "A100", mfu=0)
    with pytest.raises(ValueError, match=r"dtype='float16' is not valid; choose one of 'float32', 'bfloat16'"):
        gpu_seconds(1e12, "A100", dtype="float16")


def test_a_sweep_pools_seeds_and_prints_a_table():
    sweep = [cfg(arch, seed=s) for arch in ("gpt", "node") for s in range(3)]
    est = estimate_time(sweep, gpus=["T4", "H100"], dtype="bfloat16")
    assert [(r["label"], r["runs"]) for r in est.rows] == [("gpt", 3), ("node", 3)]
    gpt = est.rows[0]
    assert gpt["seconds"]["H100"] == pytest.approx(3 * gpu_seconds(train_flops(cfg()), "H100"))
    assert est.total["T4"] == pytest.approx(sum(r["seconds"]["T4"] for r in est.rows))
    text = str(est)
    assert "MFU 0.3, an assumption" in text and "total" in text and "T4" in text and "H100" in text
    assert "no bf16" in text  # the T4's caveat is printed with it
    labelled = estimate_time({"baseline": cfg(), "ode": cfg("node")}, gpus=["L4"])
    assert [r["label"] for r in labelled.rows] == ["baseline", "ode"]
    # (label, config) pairs: two arms of the same arch keep their names; an arm's seeds share a row
    pairs = estimate_time([(name, cfg(seed=s)) for name in ("gpt", "gpt_parallel") for s in range(2)], gpus=["L4"])
    assert [(r["label"], r["runs"]) for r in pairs.rows] == [("gpt", 2), ("gpt_parallel", 2)]
    # a learning-rate search's rates share a row too (a rate changes no FLOPs), its lengths do not
    search = [("gpt lr search", dataclasses.replace(cfg(seed=s), lr=lr)) for lr in (1e-3, 2e-3, 4e-3) for s in (0, 1)]
    longer = ("gpt lr search", dataclasses.replace(cfg(), max_steps=2 * cfg().max_steps))
    rows = estimate_time(search + [longer], gpus=["L4"]).rows
    assert [(r["label"], r["runs"], r["steps"]) for r in rows] == [
        ("gpt lr search", 6, cfg().max_steps), ("gpt lr search", 1, 2 * cfg().max_steps)]


def test_a_record_is_estimated_from_its_measured_flops():
    tc = cfg(max_steps=10)
    rec = nl.RunRecord(config=nl.config.to_dict(tc), config_hash=tc.config_hash(), seed=0,
                       params={"total": 1234}, flops_per_token=1e6)
    assert train_flops(rec) == 3 * 1e6 * 10 * 8 * 64
    (row,) = estimate_time(rec).rows
    assert row["params"] == 1234 and row["train_flops"] == train_flops(rec)


def test_format_seconds():
    assert [format_seconds(s) for s in (0.25, 42, 600, 3 * 3600, 5 * 86400)] == ["0.25 s", "42 s", "10 min",
                                                                                   "3.0 h", "5.0 d"]
