"""bench/nanogpt_reference.py, the nanoGPT re-implementation the baby-config benchmark times
``gpt`` against: causal, near-uniform at initialisation, the parameter count of its formula,
the head tied to the token embedding, and the same function as ``gpt`` given the same weights."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nodelm_lib as nl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from nanogpt_reference import NanoGPT, NanoGPTConfig, NanoGPTTrainer, char_vocab_65, learning_rate  # noqa: E402

V, T = 65, 16


def tiny(bias: bool = False, **kw) -> NanoGPTConfig:
    return NanoGPTConfig(**dict(dict(block_size=T, vocab_size=V, n_layer=2, n_head=4, n_embd=32, bias=bias), **kw))


@pytest.mark.parametrize("bias", [False, True])
def test_causal(bias):
    torch.manual_seed(0)
    model = NanoGPT(tiny(bias)).eval()
    idx = torch.randint(0, V, (2, T))
    base, _ = model(idx, idx)  # with targets: logits at every position
    for j in (0, 5, T - 1):
        changed = idx.clone()
        changed[:, j] = (changed[:, j] + 1) % V
        logits, _ = model(changed, changed)
        assert torch.allclose(logits[:, :j], base[:, :j], atol=1e-6)
        assert not torch.allclose(logits[:, j], base[:, j])


def test_initial_loss_near_log_vocab():
    torch.manual_seed(0)
    model = NanoGPT(tiny())
    _, loss = model(torch.randint(0, V, (4, T)), torch.randint(0, V, (4, T)))
    assert abs(loss.item() - math.log(V)) < 0.05


@pytest.mark.parametrize("bias", [False, True])
def test_param_count_formula(bias):
    cfg = tiny(bias)
    C, L = cfg.n_embd, cfg.n_layer
    # per block: 2 LayerNorms, qkv (3C^2), attention projection (C^2), MLP (8C^2), and with bias
    # the LayerNorms' (2C), qkv's (3C), the projection's (C) and the MLP's (4C + C) biases
    per_block = 12 * C * C + 2 * C + (11 * C if bias else 0)
    total = V * C + T * C + L * per_block + C + (C if bias else 0)  # tied head counted once; ln_f
    model = NanoGPT(cfg)
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - T * C  # nanoGPT leaves out the position embeddings only


def test_weight_tying_survives_training():
    torch.manual_seed(0)
    model = NanoGPT(tiny())
    assert model.lm_head.weight is model.wte.weight
    data = np.random.default_rng(0).integers(0, V, 500).astype(np.uint16)
    trainer = NanoGPTTrainer(model, data, tiny(batch_size=2), torch.Generator().manual_seed(0))
    losses = [trainer.step() for _ in range(2)]
    assert all(math.isfinite(x) for x in losses)
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.grad is None  # zero_grad(set_to_none=True) after the step
    assert len(trainer.optimizer.param_groups[0]["params"]) == 1 + 1 + 2 * 4  # wte(=head), wpe, 4 matrices a block


def test_schedule():
    cfg = NanoGPTConfig()
    assert learning_rate(0, cfg) == pytest.approx(1e-3 / 101)
    assert learning_rate(cfg.warmup_iters, cfg) == pytest.approx(1e-3)
    assert learning_rate(cfg.lr_decay_iters, cfg) == pytest.approx(cfg.min_lr)
    assert learning_rate(cfg.lr_decay_iters + 1, cfg) == cfg.min_lr


def test_char_vocab_65():
    ids, alphabet = char_vocab_65(np.frombuffer(b"hello world", dtype=np.uint8))
    assert bytes(alphabet.astype(np.uint8)) == b" dehlorw" and ids.max() == 7


def test_same_function_as_gpt():
    """With the same weights, the reference and this library's ``gpt`` (bias on, as ours
    defaults) give the same loss: ``gpt`` is nanoGPT's model."""
    torch.manual_seed(0)
    ours = nl.build_model(nl.ModelConfig(arch="gpt", vocab_size=V, d_model=32, n_heads=4, n_layers=2,
                                         max_seq_len=T, dropout=0.0))
    ref = NanoGPT(tiny(bias=True))
    ref.load_state_dict({k.replace("blocks.", "h."): v for k, v in ours.state_dict().items()})
    idx, targets = torch.randint(0, V, (3, T)), torch.randint(0, V, (3, T))
    ref_logits, ref_loss = ref(idx, targets)
    our_logits, our_loss = ours(idx, targets)
    assert torch.allclose(ref_logits, our_logits, atol=1e-5)
    _, chunked = ours(idx, targets, return_logits=False)  # the loss training uses
    assert chunked.item() == pytest.approx(ref_loss.item(), abs=1e-5)
