"""The arithmetic of the ``bench/`` scripts: the benchmark record's bounds beside each measured
ratio and the CSV the docs render (``record.py``), and the candidates that ``head_loss.py``
and ``scan.py`` time on a GPU (each must equal what the library computes to be worth timing)."""

import csv
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import op_times  # noqa: E402
import record  # noqa: E402
import sampled_final_loss  # noqa: E402
import scan  # noqa: E402
import store_read  # noqa: E402
import time_estimate  # noqa: E402
from head_loss import padded_cross_entropy  # noqa: E402
from nodelm_lib.models.scans import linear_recurrence_reference  # noqa: E402


def test_a_step_at_the_ceiling_has_mfu_one_and_the_measured_ratio_as_its_bound():
    # 200 GFLOP in 2 s on a 100 GFLOP/s machine: at the ceiling; a 3 s reference is 1.5x slower
    out = record.at_peak(200e9, 2.0, 3.0, 100.0)
    assert out["mfu"] == pytest.approx(1.0) and out["ratio_at_peak"] == pytest.approx(1.5)
    half = record.at_peak(200e9, 4.0, 3.0, 100.0)  # twice as slow: half the ceiling, same bound
    assert half["mfu"] == pytest.approx(0.5) and half["ratio_at_peak"] == pytest.approx(1.5)


def test_the_product_share_tells_a_matmul_from_elementwise_work():
    a = torch.randn(384, 384)
    x = torch.randn(200_000)
    assert record.product_share(lambda: [a @ a for _ in range(4)], 3) > 0.6
    assert record.product_share(lambda: [x.exp() for _ in range(4)], 3) < 0.1


def test_the_csv_has_every_column_and_dashes_for_what_a_row_lacks(tmp_path):
    rows = [dict(benchmark="b", case="gpt", threads=1, value=2.0, unit="ms/step", reference="r", reference_value=3.0,
                 ratio=1.5, flops_ratio=None, target=1.3, met=True, mfu=0.61, ratio_at_peak=1.64,
                 ratio_products_only=1.46, ratio_memory_floor=1.27, val_loss=1.8756, reference_val_loss=1.8899),
             dict(benchmark="b", case="x", threads=1, value=2.0, unit="ms/step", reference="r", reference_value=3.0,
                  ratio=None, flops_ratio=1.0, target=None, met=None)]
    record.write(rows, {"cpu_name": "test"}, tmp_path / "bench")
    table = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert table[0]["MFU"] == "0.61" and table[0]["ratio at peak"] == "1.64"
    assert table[0]["ratio, products only"] == "1.46" and table[0]["met"] == "yes"
    assert table[0]["ratio at memory floor"] == "1.27"
    assert table[0]["val loss / reference's"] == "1.876 / 1.890"
    lacking = ("MFU", "ratio at peak", "ratio at memory floor", "met", "val loss / reference's")
    assert {table[1][column] for column in lacking} == {"–"}


def test_the_memory_floor_adds_the_time_to_move_the_extra_parameters():
    # 10 GB/s; gpt 1M parameters in a 50 ms step, the arm 13M: 12M more, 11 accesses of 4 bytes each
    floor = record.memory_floor_ratio(0.05, 1_000_000, 13_000_000, 10.0)
    assert floor == pytest.approx((0.05 + 12e6 * 44 / 10e9) / 0.05)
    assert record.memory_floor_ratio(0.05, 1_000_000, 1_000_000, 10.0) == pytest.approx(1.0)  # nothing extra
    assert record.memory_floor_ratio(0.05, 1_000_000, 13_000_000, 20.0) < floor  # a faster memory, a lower floor


def test_the_memory_bandwidth_is_a_positive_rate_and_leaves_the_thread_count_alone():
    before = torch.get_num_threads()
    assert record.stream_gbps(1, mib=8, repeats=2) > 0
    assert torch.get_num_threads() == before


def test_the_float32_ceiling_is_a_positive_rate_and_leaves_the_thread_count_alone():
    before = torch.get_num_threads()
    assert record.float32_matmul_gflops(1, n=128, repeats=2) > 0
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("vocab", [64, 70, 127])  # no pad, 58 pad columns, 1
def test_the_padded_head_loss_equals_the_plain_one_with_its_gradients(vocab):
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, vocab, (50,))
    plain = torch.nn.functional.cross_entropy(h @ w.t(), y)
    padded = padded_cross_entropy(h, w, y)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(padded, (h, w)), torch.autograd.grad(plain, (h, w))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 7, 16, 33])
def test_the_log_depth_recurrence_equals_the_sequential_one_with_its_gradients(T):
    g = torch.Generator().manual_seed(T)
    a = (torch.rand(3, T, 4, 2, dtype=torch.float64, generator=g) * 0.98 + 0.01).requires_grad_()
    b = torch.randn(3, T, 4, 2, dtype=torch.float64, generator=g).requires_grad_()
    h, h_ref = scan.level_recurrence(a, b), linear_recurrence_reference(a, b)
    torch.testing.assert_close(h, h_ref, atol=1e-12, rtol=1e-12)
    w = torch.randn_like(h)
    got, expected = (torch.autograd.grad((x * w).sum(), (a, b)) for x in (h, h_ref))
    for name, u, v in zip("ab", got, expected):
        torch.testing.assert_close(u, v, atol=1e-12, rtol=1e-12, msg=name)


def test_every_scan_candidate_gives_the_librarys_outputs_and_gradients():
    xs = scan.inputs(batch=2, seq=20, channels=6, states=3, device="cpu")
    xs = [t.detach().double().requires_grad_() for t in xs]
    grads = (torch.randn(2, 20, 6, dtype=torch.float64), torch.randn(2, 6, 3, dtype=torch.float64))
    library = scan.forward_backward(scan.selective_scan, xs, grads)
    names = list(scan.candidates(20))
    assert any("log-depth" in n for n in names) and any("chunked, L=16" in n for n in names)
    for name, candidate in scan.candidates(20).items():
        for u, v in zip(scan.forward_backward(candidate, xs, grads), library):
            torch.testing.assert_close(u, v, atol=1e-10, rtol=1e-10, msg=name)


def test_the_scan_benchmark_runs_and_prints_a_row_per_candidate(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["scan.py", "--batch", "2", "--seq", "12", "--channels", "4", "--states", "2",
                                      "--repeats", "1", "--threads", str(torch.get_num_threads())])
    scan.main()
    out = capsys.readouterr().out
    assert "B=2 T=12 D=4 N=2" in out
    for name in scan.candidates(12):
        assert name in out


def test_a_scan_candidate_that_cannot_run_is_reported_and_the_others_are_still_timed(capsys, monkeypatch):
    """(The compiled associative_scan candidate, for one, runs on CUDA only.)"""
    def broken(*xs):
        raise RuntimeError("For combine_mode='pointwise', all input tensors need to be on CUDA or XPU")

    library = scan.candidates(12)
    monkeypatch.setattr(scan, "candidates", lambda T, device: {"broken (candidate)": broken, **library})
    monkeypatch.setattr(sys, "argv", ["scan.py", "--batch", "2", "--seq", "12", "--channels", "4", "--states", "2",
                                      "--repeats", "1", "--threads", str(torch.get_num_threads())])
    scan.main()
    out = capsys.readouterr().out
    assert "broken (candidate)" in out and "failed: RuntimeError: For combine_mode='pointwise'" in out
    assert all(name in out for name in library) and out.count(" ms ") == len(library)


def test_a_candidate_with_other_results_is_marked_wrong_and_one_without_an_operator_count_is_timed(
        capsys, monkeypatch):
    """(On an H100 the compiled associative_scan ran, gave a relative difference of 1.0, and refused
    the operator count's dispatch mode.)"""
    def doubled(*xs):
        y, last = scan.selective_scan(*xs)
        return 2 * y, 2 * last

    library = scan.candidates(12)
    uncountable = next(iter(library.values()))
    monkeypatch.setattr(scan, "candidates", lambda T, device: {"doubled (candidate)": doubled, **library})
    counts = iter([None] + [1] * len(library))
    monkeypatch.setattr(scan, "kernel_operators", lambda fn: next(counts))
    monkeypatch.setattr(sys, "argv", ["scan.py", "--batch", "2", "--seq", "12", "--channels", "4", "--states", "2",
                                      "--repeats", "1", "--threads", str(torch.get_num_threads())])
    scan.main()
    lines = capsys.readouterr().out.splitlines()
    doubled_row = next(line for line in lines if "doubled (candidate)" in line)
    assert "WRONG" in doubled_row and "    ? operators" in doubled_row
    assert sum("WRONG" in line for line in lines) == 1 and uncountable is not None


def test_a_model_on_the_chunked_scan_gives_the_fused_scans_outputs():
    import nodelm_lib as nl
    from nodelm_lib.models.ssm import SelectiveSSM

    cfg = nl.ModelConfig(arch="ti_ssm", vocab_size=11, d_model=16, n_heads=2, n_layers=4, max_seq_len=24,
                         dropout=0.0)
    torch.manual_seed(0)
    model = nl.build_model(cfg).double()
    x = torch.randint(0, 11, (2, 24))
    fused = model(x)
    record.with_scan_chunk(model, 8)
    layers = [m for m in model.modules() if isinstance(m, SelectiveSSM)]
    assert layers and all(m.chunk_size == 8 for m in layers)
    torch.testing.assert_close(model(x), fused, atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="chunk_size=6"):
        record.with_scan_chunk(model, 6)
    record.with_scan_chunk(model, "triton")  # the Triton kernels: tests/test_scan_triton.py runs them
    assert all(m.kernel == "triton" for m in layers)


def test_the_associative_scan_candidates_are_offered_where_torch_has_the_operator():
    if scan.associative_recurrence("generic") is None:
        pytest.skip("torch has no associative_scan (torch < 2.5)")
    assert "associative_scan, generic (candidate)" in scan.candidates(12)
    assert "associative_scan, compiled (candidate)" not in scan.candidates(12)  # pointwise: CUDA only
    assert "associative_scan, compiled (candidate)" in scan.candidates(12, "cuda")  # compiles when first called


def test_the_triton_scan_candidates_are_offered_on_cuda_pipelined_and_not():
    from nodelm_lib.models import scan_triton

    if not scan_triton.available():
        pytest.skip("Triton is not installed")
    names = [n for n in scan.candidates(12, "cuda") if n.startswith("Triton")]  # built, not run: no GPU needed
    assert f"Triton kernels, {scan_triton.BLOCK_D} channels a program, {scan_triton.STAGES} stages (candidate)" in names
    assert f"Triton kernels, {scan_triton.BLOCK_D} channels a program, not pipelined (candidate)" in names
    assert len(names) == len(set(names)) == 5
    assert not any(n.startswith("Triton") for n in scan.candidates(12))  # a CPU has only Triton's interpreter


def test_the_operator_count_skips_views_and_allocations_and_counts_each_kernel():
    x = torch.randn(4, 3)
    assert scan.kernel_operators(lambda: x.t().unsqueeze(0).transpose(1, 2).view(-1)) == 0  # views
    assert scan.kernel_operators(lambda: torch.empty(3).new_empty(2)) == 0  # allocations
    assert scan.kernel_operators(lambda: (x * 2).add_(1).sum()) == 3


def test_whole_runs_follow_nanogpts_schedule_taking_turns_per_interval():
    """Each runner takes every step once and is evaluated at 0, every interval and at the end,
    the two alternating who goes first per interval."""
    from nanogpt_vs_ours import whole_runs

    calls = []

    class Fake:
        def __init__(self, name):
            self.name, self.steps = name, 0

        def step(self):
            self.steps += 1
            calls.append((self.name, "step"))

        def estimate_loss(self, splits, eval_iters):
            calls.append((self.name, "eval"))
            return {"validation": float(self.steps)}  # the step it was evaluated at

    runners = {"a": Fake("a"), "b": Fake("b")}
    runs = whole_runs(runners, {}, max_iters=7, eval_interval=3)
    for name in "ab":
        assert runners[name].steps == 7
        assert [it for it, _ in runs[name]["evals"]] == [0, 3, 6, 7]
        assert [e["validation"] for _, e in runs[name]["evals"]] == [0, 3, 6, 7]
        assert runs[name]["wall_s"] > 0
    turns = [name for i, (name, what) in enumerate(calls) if what == "eval"]
    assert turns == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_operator_times_counts_every_call_and_times_the_products():
    """bench/op_times.py: each operator of each timed step is counted once, with its time; a large
    product takes more of it than an elementwise pass over its output."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)  # 1024 FLOPs per output element against relu's one
    plain, timed = op_times.operator_times(lambda x, y: (x @ y).relu_(), (a, b), steps=3, warmup=1, shapes=True)
    assert plain > 0
    assert timed.calls == {"aten.mm.default [(512, 512), (512, 512)]": 3, "aten.relu_.default [(512, 512)]": 3}
    mm, relu = (timed.seconds[k] for k in timed.calls)
    assert mm > relu > 0
    with pytest.raises(SystemExit, match="not valid; choose one of"):
        op_times.training_step("nope")


def test_the_odeint_part_times_both_solvers_on_the_same_tableau_and_rows_their_ratio():
    """Both sides of each pair integrate the same field on the same grid with the same tableau,
    so their end states agree (what makes the timing comparable); the record's rows carry the
    ratio ours / torchdiffeq against the 0.8 target."""
    import torchdiffeq

    import nodelm_lib as nl
    from nodelm_lib.models.hybrid import HybridField
    from odeint_vs_torchdiffeq import PAIRS

    torch.manual_seed(0)
    field = HybridField(nl.ModelConfig(arch="hybrid", d_model=8, n_heads=2, control_dim=0)).double()
    x0, t = torch.randn(2, 3, 8, dtype=torch.float64), torch.linspace(0, 1, 3, dtype=torch.float64)
    for ours, theirs in PAIRS:
        ends = nl.odeint(field, x0, t, method=ours)[-1], torchdiffeq.odeint(field, x0, t, method=theirs)[-1]
        torch.testing.assert_close(*ends, rtol=1e-12, atol=1e-12)
    rows = record.bench_odeint(repeats=1)
    assert [r["case"] for r in rows] == [f"{o} vs {t}" for o, t in PAIRS]
    for r in rows:
        assert r["value"] > 0 and r["ratio"] == pytest.approx(r["value"] / r["reference_value"])
        assert r["met"] == (r["ratio"] <= r["target"] == 0.8)


def test_many_runs_compares_k_runs_at_once_with_one_alone_by_wall_and_loop_throughput(monkeypatch):
    import many_runs
    from types import SimpleNamespace

    clock = iter([0.0, 50.0, 60.0, 70.0, 100.0, 120.0])  # warm-up, then one run alone: 10 s; four at once: 20 s
    monkeypatch.setattr(many_runs, "perf_counter", lambda: next(clock))

    def fake_train_all(configs, store, checkpoints, isolate, workers, progress):
        assert isolate and not progress and workers == (1 if len(configs) == 1 else 4)
        return [SimpleNamespace(status="completed", config_hash=f"h{tc.seed}", tokens_per_s=1000.0 / workers,
                                config=dict(max_steps=tc.max_steps, batch_size=tc.batch_size, seq_len=tc.seq_len),
                                compile_time_s=None, peak_memory_mb=None, environment={"cpu_name": "test"})
                for tc in configs]

    monkeypatch.setattr(many_runs, "train_all", fake_train_all)
    node = many_runs.base_config(tiny=False, steps=5, arm="node")
    assert node.model.arch == "node" and node.max_steps == 5 and node.eval_on == "batches"
    with pytest.raises(ValueError, match="arm='mamba' is not an arm of 02's gpu profile; choose one of gpt"):
        many_runs.base_config(tiny=False, steps=5, arm="mamba")
    base = many_runs.base_config(tiny=True, steps=5)
    assert base.max_steps == 5 and base.eval_interval == 5
    result = many_runs.compare(base, 4)
    assert result["alone"]["tokens"] == 5 * base.batch_size * base.seq_len
    assert result["wall_ratio"] == pytest.approx(4 * 10 / 20)  # 4x the tokens in 2x the time
    assert result["steady_ratio"] == pytest.approx(1.0)  # four loops at a quarter of the speed each

    def failing(configs, *args, **kwargs):
        return [SimpleNamespace(status="failed", config_hash="h0")]

    monkeypatch.setattr(many_runs, "train_all", failing)
    monkeypatch.setattr(many_runs, "perf_counter", lambda: 0.0)
    with pytest.raises(RuntimeError, match="did not complete"):
        many_runs.phase(base, [0], 1)


def test_the_time_estimate_bench_prices_each_record_from_the_others_and_replays_a_store(capsys, monkeypatch, tmp_path):
    """Three selection-seed runs and two reported ones of one shape on one machine, each 200 s of
    training and 60 s besides: each is estimated at its own time (plus the start-up allowance), and
    the replay packs the three selection runs on two lanes (two runs' time), then the reported two
    (one run's time)."""
    import nodelm_lib as nl
    from nodelm_lib.config import to_dict
    from nodelm_lib.runs import timing
    from nodelm_lib.training.evaluation import with_tokenizer_vocab
    from nodelm_lib.training.profiling import cpu_description
    from nodelm_lib.training.record import RunRecord

    model = nl.ModelConfig(arch="gpt", d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    for seed in (0, 1, 100, 101, 102):
        tc = with_tokenizer_vocab(nl.TrainConfig(model=model, dataset="tinyshakespeare", tokenizer="char", batch_size=2,
                                                 seq_len=16, max_steps=20, eval_interval=20, eval_batches=1,
                                                 eval_on="batches", seed=seed, device="cpu"))
        RunRecord(config=to_dict(tc), config_hash=tc.config_hash(), seed=seed, status="completed", metrics=[{}] * 20,
                  train_time_s=200.0, wall_time_s=260.0, environment=cpu_description()).to_json(tmp_path / f"{seed}.json")
    monkeypatch.setattr(sys, "argv", ["time_estimate.py", str(tmp_path)])
    time_estimate.main()
    out = capsys.readouterr().out
    assert "5 completed records, 5 estimated from all the others" in out
    ratio = (260.0 + timing.STARTUP_S) / 260.0
    assert f"{ratio:.2f}" in out and "{'measured': 5}" in out
    monkeypatch.setattr(sys, "argv", ["time_estimate.py", str(tmp_path), "--replay", "--set", "score_test=false"])
    time_estimate.main()
    out = capsys.readouterr().out
    run = 260.0 + timing.STARTUP_S  # the records scored nothing: score_test changes no estimate here
    minutes = {"selection": 2 * run / 60, "reported": run / 60}
    assert f"selection {minutes['selection']:.0f} min, reported {minutes['reported']:.0f} min" in out
    assert "selection runs with {'score_test': False}" in out and "(from this machine's records)" in out


def test_the_store_read_bench_times_each_part_against_parsing(capsys, monkeypatch, tmp_path):
    """On a store of two real records: a row per part, each with its ratio to parsing alone (1.00x
    for parsing itself); a store without records is refused."""
    import nodelm_lib as nl

    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    for seed in (0, 1):
        nl.run(nl.TrainConfig(model=model, batch_size=2, seq_len=16, max_steps=4, eval_interval=2, eval_batches=1,
                              progress=False, device="cpu", seed=seed), store=tmp_path / "runs", checkpoints=tmp_path / "ckpt")
    monkeypatch.setattr(sys, "argv", ["store_read.py", str(tmp_path / "runs"), "--repeat", "1"])
    store_read.main()
    out = capsys.readouterr().out
    assert "2 records" in out and "1.00x parse" in out
    names = ["parse", "parse + digest", "parse + digest (round trip)", "load_records", "timing rows",
             "FLOPs counted for every shape"]
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines()[1:]}
    assert sorted(rows) == sorted(names)
    with pytest.raises(SystemExit, match="no records in"):
        monkeypatch.setattr(sys, "argv", ["store_read.py", str(tmp_path)])
        store_read.main()


def test_the_sampled_final_loss_bench_prints_the_offset_and_how_far_each_paired_difference_moves(
        capsys, monkeypatch, tmp_path):
    """Two arms x two seeds whose fixed-batch validation loss is the whole split's plus a known
    offset: the per-run offset, and the paired difference to the reference measured both ways;
    selection-seed runs and unknown models are left out, and a store without both scores is refused."""
    import nodelm_lib as nl
    from nodelm_lib.config import to_dict
    from nodelm_lib.training.evaluation import with_tokenizer_vocab
    from nodelm_lib.training.record import RunRecord

    arms = {"gpt": nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=16),
            "ssm": nl.ModelConfig(arch="ssm", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=16)}
    monkeypatch.setattr(sampled_final_loss, "profile_arms", lambda notebook, profile: arms)
    whole = {("gpt", 0): 2.00, ("gpt", 1): 2.10, ("ssm", 0): 1.90, ("ssm", 1): 1.96, ("ssm", 100): 9.0}
    offset = {("gpt", 0): -0.01, ("gpt", 1): -0.03, ("ssm", 0): -0.02, ("ssm", 1): -0.04, ("ssm", 100): 0.0}
    for (name, seed), val in whole.items():
        tc = with_tokenizer_vocab(nl.TrainConfig(model=arms[name], batch_size=2, seq_len=16, max_steps=20,
                                                 eval_interval=20, eval_batches=1, eval_on="whole_split_at_end",
                                                 seed=seed, device="cpu"))
        RunRecord(config=to_dict(tc), config_hash=tc.config_hash(), seed=seed, status="completed", metrics=[{}] * 20,
                  evals=[{"step": 20, "val_loss": val + offset[name, seed]}],
                  final={"val_loss": val, "test_loss": val + 0.05, "val_tokens": 100, "test_tokens": 100},
                  train_time_s=1.0, wall_time_s=2.0).to_json(tmp_path / f"{name}{seed}.json")
    monkeypatch.setattr(sys, "argv", ["sampled_final_loss.py", str(tmp_path)])
    sampled_final_loss.main()
    out = capsys.readouterr().out
    assert "4 reported runs, 2 seeds" in out
    assert "offset -0.0250, SD 0.0129, range -0.0400..-0.0100" in out
    # ssm - gpt over the two seeds: whole split -0.10 and -0.14, on the batches -0.11 and -0.15
    ssm_row = [line for line in out.splitlines() if line.startswith("ssm")][-1]
    assert [float(v) for v in ssm_row.split()[1:]] == [-0.12, -0.13, -0.12, -0.01]
    assert "largest move of a paired difference: 0.0100; for scale, validation and test (both whole) differ by up to 0.0000" in out
    for path in tmp_path.glob("*.json"):
        path.unlink()
    with pytest.raises(SystemExit, match="no completed reported run scored both"):
        sampled_final_loss.main()


def test_the_gpu_kernel_profile_counts_busy_time_once_and_ranks_kernels_per_step(tmp_path):
    import gpu_kernels
    from gpu_kernels import DeviceEvent as E

    # two steps: "mm" 0-10 and 40-50 us, "scan" 8-20 (overlapping mm by 2 us) and 50-70, "fill" 100-101
    events = [E("mm", 0, 10), E("scan", 8, 20), E("mm", 40, 50), E("scan", 50, 70), E("fill", 100, 101)]
    assert gpu_kernels.busy_us(events) == pytest.approx(20 + 30 + 1)  # the overlap counted once
    assert gpu_kernels.busy_us([E("a", 0, 10), E("b", 2, 5)]) == pytest.approx(10)  # one inside another
    assert gpu_kernels.busy_us([]) == 0
    out = gpu_kernels.kernel_summary(events, steps=2, top=2)
    assert out["busy_ms"] == pytest.approx(51 / 1000 / 2)
    assert out["kernels"] == 2.5 and out["mean_kernel_us"] == pytest.approx(53 / 5)
    assert [(k["name"], k["calls"]) for k in out["top"]] == [("scan", 1), ("mm", 1)]  # fill is third
    assert out["top"][0]["ms"] == pytest.approx(32 / 1000 / 2) and out["top"][0]["share"] == pytest.approx(32 / 53)
    with pytest.raises(ValueError, match="steps=0 is not valid"):
        gpu_kernels.kernel_summary(events, steps=0)

    # the script end to end on the CPU: a row per mode and case, the chunked scan arm added
    gpu_kernels.main(["--tiny", "--modes", "eager", "--archs", "gpt", "ti_ssm", "--scan-chunk", "8",
                      "--steps", "1", "--out", str(tmp_path / "k")])
    import json
    rows = json.loads((tmp_path / "k.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["gpt", "ti_ssm", "ti_ssm, chunked L=8"]
    assert all(r["wall_ms"] > 0 and r["busy_ms"] == 0 for r in rows)  # no GPU time on a CPU
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--tiny", "--archs", "gpt", "mamba", "--out", str(tmp_path / "bad")])
