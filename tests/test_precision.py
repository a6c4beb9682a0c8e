"""Compiled training, the config hash of the new fields, and where bf16 may run on a CPU."""

import glob
import json
import shutil
from pathlib import Path

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.config import from_dict
from nodelm_lib.training.device import ALLOW_EMULATED_BF16_ENV, check_dtype_supported, cpu_has_native_bf16
from nodelm_lib.training.record import CHECKPOINT_NAME, RECORD_NAME

REPO = Path(__file__).resolve().parents[1]
AVX2_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2".split()  # an AVX2 EPYC's, abridged


def tiny_run(**kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
    base = dict(model=model, batch_size=4, seq_len=32, max_steps=20, lr=3e-3, warmup_steps=3,
                eval_interval=10, eval_batches=2, progress=False)
    base.update(kw)
    return nl.TrainConfig(**base)


# inductor compiles the CPU kernels with the system's C++ compiler
needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++); none found")


@pytest.mark.slow
@needs_compiler
def test_compiled_training_matches_eager_and_records_its_compile_time(tmp_path):
    eager = nl.train(tiny_run())
    compiled = nl.train(tiny_run(compile=True, out_dir=str(tmp_path)))
    assert len(compiled.metrics) == len(eager.metrics) == 20
    for a, b in zip(eager.metrics, compiled.metrics):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4), (a["step"], a["loss"], b["loss"])
    assert compiled.final["val_loss"] == pytest.approx(eager.final["val_loss"], abs=1e-4)
    assert eager.compile_time_s == 0.0 and compiled.compile_time_s > 0
    assert compiled.compile_time_s <= compiled.train_time_s  # the first step is part of the training time
    # the record keeps it; the checkpoint holds the eager module's names, and the returned model is eager
    assert nl.RunRecord.from_json(tmp_path / RECORD_NAME).compile_time_s == compiled.compile_time_s
    state = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert state["model"].keys() == eager.model.state_dict().keys()
    assert not any("_orig_mod" in k for k in state["model"])
    assert type(compiled.model) is type(eager.model)
    loaded = nl.load_model(tmp_path)
    idx = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loaded(idx)[0], compiled.model.eval()(idx)[0])
    assert nl.generate(loaded, idx, 4, temperature=0).shape == (1, 12)  # decoding with the KV cache


@pytest.mark.slow
@needs_compiler
def test_compiled_ti_ssm_step_matches_eager():
    """Inductor compiles ti_ssm around the scan operator (its kernels take the operator's outputs
    at the strides of its fake function): loss and every gradient as in eager."""
    from nodelm_lib.config import for_arch
    from nodelm_lib.models.scans import COMPILED_SCAN

    if COMPILED_SCAN is None:
        pytest.skip("torch.library.custom_op needs torch >= 2.4")
    cfg = for_arch(nl.ModelConfig(arch="gpt", vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=24,
                                  ssm_state_size=4), "ti_ssm")
    torch.manual_seed(0)
    model = nl.build_model(cfg).train()
    x = torch.randint(0, cfg.vocab_size, (3, 24))

    def step(m):
        model.zero_grad(set_to_none=True)
        _, loss = m(x, torch.roll(x, -1, 1))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = step(model)
    torch._dynamo.reset()
    loss_c, grads_c = step(torch.compile(model))
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for g, g_c in zip(grads, grads_c, strict=True):
        torch.testing.assert_close(g_c, g, rtol=1e-4, atol=1e-6)


def test_old_records_load_without_a_compile_time():
    rec = nl.RunRecord(config=nl.config.to_dict(tiny_run()), config_hash="x", seed=0)
    old = json.loads(rec.to_json())
    del old["compile_time_s"], old["digest"]  # records of that time had neither
    assert nl.RunRecord.from_json(json.dumps(old)).compile_time_s == 0.0


def test_compile_leaves_the_hash_alone_until_it_is_set():
    # hashes of the code before `compile` existed: stored records keep their names
    assert nl.TrainConfig().config_hash() == "997f4cb0f8a6f28e"
    assert tiny_run().config_hash() == "2a4eed35c3331c9f"
    assert nl.TrainConfig(compile=False).config_hash() == nl.TrainConfig().config_hash()
    assert nl.TrainConfig(compile=True).config_hash() != nl.TrainConfig().config_hash()
    assert nl.config.apply_overrides(nl.TrainConfig(), ["compile=true"]).compile is True


def test_every_stored_record_still_has_its_hash():
    """Records still hash to their names; stored evaluations (``<store>/evaluations/``) belong to a
    record beside them and carry its final validation loss."""
    paths = glob.glob(str(REPO / "results" / "runs" / "**" / "*.json"), recursive=True)
    if not paths:
        pytest.skip("no stored run records in results/runs")
    for path in map(Path, paths):
        stored = json.loads(path.read_text())
        if path.parent.name == "evaluations":
            record = json.loads((path.parent.parent / path.name).read_text())
            assert stored["config_hash"] == record["config_hash"] == path.stem, path
            assert stored["final_val_loss"] == record["final"]["val_loss"], path
            continue
        assert from_dict(nl.TrainConfig, stored["config"]).config_hash() == stored["config_hash"], path


def test_native_bf16_is_read_from_the_cpu_flags():
    assert not cpu_has_native_bf16(AVX2_FLAGS)
    assert not cpu_has_native_bf16(AVX2_FLAGS + ["avx512f", "avx512bw", "avx512vl"])  # AVX-512 alone emulates
    assert cpu_has_native_bf16(AVX2_FLAGS + ["avx512f", "avx512_bf16"])  # Zen 4, Cooper Lake
    assert cpu_has_native_bf16(AVX2_FLAGS + ["amx_tile", "amx_bf16"])  # Sapphire Rapids
    assert cpu_has_native_bf16(["fp", "asimd", "bf16"])  # aarch64 (Graviton 3)


def test_bf16_on_a_cpu_without_native_bf16_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.delenv(ALLOW_EMULATED_BF16_ENV, raising=False)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"dtype='bfloat16' on device='cpu'.*no native bfloat16.*emulate.*"
                                         r"slower than float32.*NODELM_ALLOW_EMULATED_BF16=1"):
        check_dtype_supported("bfloat16", cpu, flags=AVX2_FLAGS)
    check_dtype_supported("bfloat16", cpu, flags=AVX2_FLAGS + ["avx512_bf16"])  # native: allowed
    check_dtype_supported("bfloat16", cpu, flags=AVX2_FLAGS + ["amx_bf16"])
    check_dtype_supported("float32", cpu, flags=AVX2_FLAGS)
    monkeypatch.setenv(ALLOW_EMULATED_BF16_ENV, "1")
    check_dtype_supported("bfloat16", cpu, flags=AVX2_FLAGS)  # asked for explicitly


@pytest.mark.skipif(cpu_has_native_bf16(), reason="this CPU computes bf16 natively: nl.train allows it")
def test_train_refuses_emulated_bf16_before_any_work(monkeypatch):
    monkeypatch.delenv(ALLOW_EMULATED_BF16_ENV, raising=False)
    with pytest.raises(ValueError, match=ALLOW_EMULATED_BF16_ENV):
        nl.train(tiny_run(device="cpu", dtype="bfloat16"))


@pytest.mark.parametrize("arm", ["gpt", "hybrid", "node", "ti_mlp", "ti_ssm", "ssm"])
def test_every_arm_trains_under_bfloat16_autocast_close_to_float32(arm):
    """One training step's loss and gradients under bf16 autocast (what the gpu profiles run, and a
    CPU with native bf16) against float32, from the same weights and batch: every arm runs (the
    selective scan once failed on CUDA: bf16 inputs into its float32 buffers) and agrees to bf16's
    precision. Autocast on the CPU emulates bf16 where it is not native: slow, same code path."""
    from nodelm_lib.config import for_arch
    from nodelm_lib.experiments.protocol import CONTROLS

    base = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=32, n_heads=4, n_layers=3, max_seq_len=32,
                          ssm_state_size=4)
    cfg = CONTROLS[arm](base) if arm in CONTROLS else for_arch(base, arm)
    torch.manual_seed(0)
    model = nl.build_model(cfg).train()
    x = torch.randint(0, cfg.vocab_size, (2, 32))

    def loss_and_grads(autocast: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(x, torch.roll(x, -1, 1), return_logits=False)
        loss.backward()
        return loss.float().item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    loss32, grad32 = loss_and_grads(False)
    loss16, grad16 = loss_and_grads(True)
    assert torch.isfinite(grad16).all()
    assert loss16 == pytest.approx(loss32, abs=0.05)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.98


@pytest.mark.parametrize("arm", ["gpt", "hybrid", "node", "ti_mlp", "ti_ssm", "ssm"])
def test_every_arm_traces_to_one_graph_for_torch_compile(arm):
    """The gpu profiles compile every arm: a graph break splits the step into pieces run one by
    one (the decode cache's and the time grid's context variables once broke node's into dozens,
    and compiled training ran 1.8x slower than eager on an H100). Dynamo's trace only: no C++
    compiler needed.

    The SSM arms' scan must be one operator per call of a layer (``nodelm::selective_scan``), with
    none of its loop's in-place steps in the graph: traced position by position, ti_ssm at 02's gpu
    sizes took 205 s to compile on a CPU (over 10 minutes on an H100) and its compiled step ran
    2.6x slower than eager."""
    from nodelm_lib.config import for_arch
    from nodelm_lib.experiments.protocol import CONTROLS
    from nodelm_lib.models.scans import COMPILED_SCAN
    from nodelm_lib.models.ssm import SelectiveSSM

    base = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=32, n_heads=4, n_layers=3, max_seq_len=32,
                          ssm_state_size=4)
    cfg = CONTROLS[arm](base) if arm in CONTROLS else for_arch(base, arm)
    model = nl.build_model(cfg).train()
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, torch.roll(x, -1, 1), return_logits=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    scan_calls = []  # one scan per call of a layer (ti_ssm calls its one layer at every solver step)
    for layer in (m for m in model.modules() if isinstance(m, SelectiveSSM)):
        layer.register_forward_hook(lambda *_: scan_calls.append(1))
    model(x, torch.roll(x, -1, 1), return_logits=False)
    if COMPILED_SCAN is not None:  # torch >= 2.4
        nodes = list(explained.graphs[0].graph.nodes)
        assert sum(str(n.target) == "nodelm.selective_scan.default" for n in nodes) == len(scan_calls)
        assert not [n for n in nodes if n.op == "call_method" and n.target == "addcmul_"]
    assert (len(scan_calls) > 0) == (arm in ("ti_ssm", "ssm"))


def test_a_compiled_model_refuses_a_decode_cache_instead_of_ignoring_it():
    """While compiling, layers do not see a decode cache (``decode_cache.compiling``): a compiled
    forward given one would silently attend to the new positions alone."""
    from nodelm_lib.nn.decode_cache import DecodeCache

    model = nl.build_model(nl.ModelConfig(arch="gpt", vocab_size=256, d_model=32, n_heads=4, n_layers=2,
                                          max_seq_len=32)).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(ValueError, match="decoding with a cache under torch.compile"):
        compiled(torch.randint(0, 256, (1, 4)), cache=DecodeCache(32))
