"""Training, compilation, decoding and model files on a CUDA GPU, checked against the CPU.

Skipped without CUDA. On CUDA the trainer runs float32 matmuls on TF32 tensor cores
(``train.enable_tf32``): 10 mantissa bits in the products, so CUDA and CPU losses agree to
about 1e-3, not to float32's 1e-6.
"""

import contextlib
import math

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.config import ARCHS
from nodelm_lib.training.record import CHECKPOINT_NAME

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tiny_run(arch="gpt", **kw) -> nl.TrainConfig:
    model = nl.ModelConfig(arch=arch, d_model=32, n_heads=4, n_layers=2, max_seq_len=32, ode_start=0, ode_end=1,
                           ode=nl.ODEConfig(n_steps=2))
    base = dict(model=model, batch_size=4, seq_len=32, max_steps=5, lr=3e-3, warmup_steps=2,
                eval_interval=5, eval_batches=2, progress=False)
    base.update(kw)
    return nl.TrainConfig(**base)


def losses(rec: nl.RunRecord) -> list[float]:
    return [row["loss"] for row in rec.metrics]


@contextlib.contextmanager
def exact_float32():
    """TF32 off for the block (the trainer turns it on process-wide)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("arch", ["gpt", "hybrid"])
def test_float32_steps_on_cuda_match_the_cpu(arch):
    """Same initialisation (built on the CPU, then moved) and the same batches (a CPU generator)."""
    cpu = nl.train(tiny_run(arch, device="cpu"))
    gpu = nl.train(tiny_run(arch, device="cuda"))
    assert gpu.environment["device"].startswith("cuda") and gpu.environment["tf32_matmul"] is True
    assert torch.backends.cuda.matmul.allow_tf32  # enabled by the trainer
    assert gpu.metrics[0]["loss"] == pytest.approx(cpu.metrics[0]["loss"], abs=2e-3)
    assert losses(gpu) == pytest.approx(losses(cpu), abs=1e-2)
    assert gpu.final["val_loss"] == pytest.approx(cpu.final["val_loss"], abs=1e-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_steps_on_cuda_are_close_to_float32_on_the_cpu(arch):
    """Every arch: autocast's op lists differ between CUDA and the CPU (on CUDA softplus stays in
    float32, so ti_ssm's scan once got mixed inputs and failed here only)."""
    cpu = nl.train(tiny_run(arch, device="cpu"))
    bf16 = nl.train(tiny_run(arch, device="cuda", dtype="bfloat16"))
    assert bf16.status == "completed" and all(math.isfinite(x) for x in losses(bf16))
    assert bf16.metrics[0]["loss"] == pytest.approx(cpu.metrics[0]["loss"], abs=0.05)  # same init, same batch
    assert losses(bf16) == pytest.approx(losses(cpu), abs=0.1)


@pytest.mark.parametrize("arch, dtype", [("gpt", "float32")] + [(arch, "bfloat16") for arch in ARCHS])
def test_compiled_training_on_cuda_matches_eager(arch, dtype, tmp_path):
    """The gpu profiles train every arch compiled under bf16 autocast."""
    eager = nl.train(tiny_run(arch, device="cuda", dtype=dtype))
    compiled = nl.train(tiny_run(arch, device="cuda", dtype=dtype, compile=True, out_dir=str(tmp_path)))
    tol = 2e-3 if dtype == "float32" else 2e-2  # inductor fuses and reorders; bf16 rounds at 3 digits
    assert losses(compiled) == pytest.approx(losses(eager), abs=tol)
    assert compiled.compile_time_s > 0 and eager.compile_time_s == 0.0
    state = torch.load(tmp_path / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert not any("_orig_mod" in key for key in state["model"])


def test_peak_cuda_memory_is_recorded():
    rec = nl.train(tiny_run(device="cuda"))
    assert rec.environment["device_name"] == torch.cuda.get_device_name()
    assert 0 < rec.peak_memory_mb <= torch.cuda.get_device_properties(0).total_memory / 2**20
    assert rec.activation_mb > 0


def trained_like(arch: str, device: str) -> nl.models.CausalLM:
    """A model moved off its initialisation, so greedy decoding has no near-ties."""
    cfg = nl.ModelConfig(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=16,
                         ode=nl.ODEConfig(method="rk4", n_steps=2), time_features=8, time_hidden=16,
                         ssm_state_size=4, ode_start=0, ode_end=1)
    torch.manual_seed(0)
    model = nl.build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.to(device).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_on_cuda_equals_recomputing(arch):
    """Past max_seq_len too (4 + 14 > 16 positions), as test_generate.py checks on the CPU."""
    model = trained_like(arch, "cuda")
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1)).cuda()
    with exact_float32():
        cached, cached_logits = nl.generate(model, idx, 14, temperature=0, return_logits=True)
        plain, plain_logits = nl.generate(model, idx, 14, temperature=0, use_cache=False, return_logits=True)
    assert cached.device.type == "cuda" and torch.equal(cached, plain)
    torch.testing.assert_close(cached_logits, plain_logits, rtol=0, atol=1e-4)


def test_a_model_saved_on_cuda_loads_on_the_cpu(tmp_path):
    model = trained_like("hybrid", "cuda")
    nl.save_model(model, tmp_path / "model.pt", tokenizer="char")
    loaded = nl.load_model(tmp_path / "model.pt", device="cpu")
    assert next(loaded.parameters()).device.type == "cpu"
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with exact_float32():
        expected = model(idx.cuda())[0].cpu()
    torch.testing.assert_close(loaded(idx)[0], expected, rtol=1e-4, atol=1e-4)


def test_a_cuda_training_checkpoint_loads_on_the_cpu(tmp_path):
    rec = nl.train(tiny_run(device="cuda", out_dir=str(tmp_path / "run"), checkpoint_interval=5))
    loaded = nl.load_model(tmp_path / "run", device="cpu")
    idx = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    with exact_float32():
        expected = rec.model.eval()(idx.cuda())[0].cpu()
    torch.testing.assert_close(loaded(idx)[0], expected, rtol=1e-4, atol=1e-4)
    assert loaded.checkpoint_metadata["step"] == 5 and loaded.checkpoint_metadata["tokenizer"] == "char"


def test_the_head_loss_on_cuda_equals_the_chunked_loss_on_the_cpu():
    """On CUDA the loss is F.linear + F.cross_entropy (bf16 product under autocast, fusable);
    on the CPU the chunked loop. Same value and gradients in float32."""
    from nodelm_lib.nn.losses import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(300, 16, generator=g), torch.randn(1000, 16, generator=g) * 0.1
    y = torch.randint(0, 1000, (300,), generator=g)
    results = []
    for device in ("cpu", "cuda"):
        hd, wd = (t.detach().clone().to(device).requires_grad_() for t in (h, w))
        with exact_float32():
            loss = linear_cross_entropy(hd, wd, y.to(device))
            loss.backward()
        results.append((loss.item(), hd.grad.cpu(), wd.grad.cpu()))
    (cpu_loss, *cpu_grads), (gpu_loss, *gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, abs=1e-5)
    for a, b in zip(gpu_grads, cpu_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
