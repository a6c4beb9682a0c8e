"""LoRA (``nodelm_lib.nn.lora``): it starts at the base model, trains only its factors, leaves the
base weights unchanged, and merges back exactly into a plain model of the same keys."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.config import for_arch
from nodelm_lib.nn.lora import DEFAULT_TARGETS, add_lora, count_lora_parameters, lora_parameters, merge_lora

ARCHS = ["gpt", "hybrid", "node", "ti_mlp", "ti_ssm"]
BASE = nl.ModelConfig(arch="gpt", vocab_size=64, d_model=16, n_heads=2, n_layers=2, max_seq_len=16, dropout=0.0)


def tiny(arch: str, seed: int = 0, **ode):
    torch.manual_seed(seed)
    cfg = for_arch(dataclasses.replace(BASE, ode=nl.ODEConfig(**ode)) if ode else BASE, arch)
    return cfg, nl.build_model(cfg)


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def base_name(name: str) -> str:
    """The base model's name of a parameter of the adapted model."""
    return name.replace(".parametrizations.weight.original", ".weight")


@pytest.mark.parametrize("arch", ARCHS)
def test_adapted_model_starts_equal_to_base(arch):
    _, model = tiny(arch)
    idx, _ = batch()
    before, _ = model(idx)
    add_lora(model, rank=4)
    after, _ = model(idx)
    assert torch.equal(before, after)  # B = 0: W + s * (0 @ A) = W exactly


def finetune(model, trained, steps=6, lr=1e-2):
    """A few AdamW steps on one random batch; the losses before each step and after the last."""
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    idx, targets = batch()
    losses = []
    for _ in range(steps):
        _, loss = model(idx, targets)
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        losses.append(model(idx, targets)[1].item())
    return losses


@pytest.mark.parametrize("arch", ARCHS)
def test_training_changes_only_the_factors_and_merges_exactly(arch, tmp_path):
    cfg, model = tiny(arch)
    if arch != "gpt":
        model.set_ode(n_steps=3)  # the use case: adapt to a new grid (trained at n_layers = 2 steps)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    keys = list(model.state_dict())
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    trained = add_lora(model, rank=2)
    assert {id(p) for p in trained} == {id(p) for p in lora_parameters(model)}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == \
        [n for n, _ in model.named_parameters() if ".lora_" in n]
    factors = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}

    losses = finetune(model, trained)
    assert losses[-1] < losses[0], losses

    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert not torch.equal(p, factors[name]), f"{name} did not train"
        else:  # the base weights, `original` tensors included: bit for bit
            assert torch.equal(p, base[base_name(name)]), f"{name} changed"

    idx, _ = batch(seed=2)
    with torch.no_grad():
        adapted, _ = model(idx)
    merge_lora(model)
    with torch.no_grad():
        merged, _ = model(idx)
    # merge_lora stores the parametrization's own value W + s * (B @ A), the very expression each
    # adapted forward computes, so the merged weights and hence the logits are bit-equal
    assert torch.equal(adapted, merged)
    assert list(model.state_dict()) == keys
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert not lora_parameters(model)

    fresh = nl.build_model(cfg)
    fresh.load_state_dict(model.state_dict())  # strict: no missing or extra keys
    if arch != "gpt":
        fresh.set_ode(n_steps=3)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(idx)[0], merged)
    nl.save_model(model, tmp_path / "merged.pt")
    loaded = nl.load_model(tmp_path / "merged.pt")
    assert list(loaded.state_dict()) == keys
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def expected_count(model, rank):
    """rank * (in + out) over the weights the default targets pick, counted on the base model."""
    return sum(rank * sum(m.weight.shape) for name, m in model.named_modules()
               if name.rsplit(".", 1)[-1] in DEFAULT_TARGETS and m._parameters.get("weight") is not None)


@pytest.mark.parametrize("arch", ARCHS)
def test_trained_parameter_count(arch):
    _, model = tiny(arch)
    n_base = sum(p.numel() for p in model.parameters())
    expected = expected_count(model, rank=2)
    trained = add_lora(model, rank=2)
    assert count_lora_parameters(model) == sum(p.numel() for p in trained) == expected > 0
    assert 5 * expected < n_base  # far below the base count (~10x at this tiny width; ~100x at d=256, rank 8)


def test_tied_head_and_embeddings_are_not_adapted():
    _, model = tiny("hybrid")
    assert model.lm_head.weight is model.wte.weight
    add_lora(model, rank=2)
    adapted = {n.split(".parametrizations")[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted and all(n.rsplit(".", 1)[-1] in DEFAULT_TARGETS for n in adapted)
    assert model.wte.weight is model.lm_head.weight and not model.wte.weight.requires_grad


def test_targets_patterns_and_predicate():
    _, model = tiny("gpt")
    add_lora(model, rank=2, targets=["blocks.0.attn.*"])
    assert sorted({n.split(".parametrizations")[0] for n, _ in model.named_parameters() if ".lora_A" in n}) == \
        ["blocks.0.attn.c_attn", "blocks.0.attn.c_proj"]
    _, model = tiny("node")
    add_lora(model, rank=2, targets=lambda name, module: name.endswith("mlp.c_fc"))
    assert count_lora_parameters(model) == 2 * (16 + 64)


def test_alpha_scales_the_update():
    _, model = tiny("gpt")
    add_lora(model, rank=2, alpha=6.0, targets="blocks.0.mlp.c_fc")
    layer = model.blocks[0].mlp.c_fc
    lora = layer.parametrizations.weight[0]
    with torch.no_grad():
        lora.lora_B.normal_()
        assert torch.equal(layer.weight, layer.parametrizations.weight.original + 3.0 * (lora.lora_B @ lora.lora_A))


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=0), "rank=0 is not valid"),
    (dict(rank=-2), "rank=-2 is not valid"),
    (dict(rank=2.5), "rank=2.5 is not valid"),
    (dict(rank=True), "rank=True is not valid"),
    (dict(rank="4"), "rank='4' is not valid"),
    (dict(rank=17), r"rank=17 is not valid for blocks.0.attn.c_attn.weight of shape \(48, 16\): choose 1 <= rank <= 16"),
    (dict(alpha=0), "alpha=0 is not valid"),
    (dict(alpha=-1.0), "alpha=-1.0 is not valid"),
    (dict(alpha=math.nan), "alpha=nan is not valid"),
    (dict(alpha=math.inf), "alpha=inf is not valid"),
    (dict(alpha="1"), "alpha='1' is not valid"),
    (dict(targets=["nope"]), r"selects no weight of this GPT: choose among .*c_attn"),
    (dict(targets=[]), "targets=\\[\\] is not valid"),
    (dict(targets=[3]), "targets=\\[3\\] is not valid"),
])
def test_bad_inputs(kwargs, match):
    _, model = tiny("gpt")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        add_lora(model, **kwargs)
    # nothing happened: no factors, nothing frozen, same weights
    assert not lora_parameters(model) and all(p.requires_grad for p in model.parameters())
    assert list(model.state_dict()) == list(state)


def test_bad_uses():
    _, model = tiny("hybrid")
    with pytest.raises(ValueError, match="lm_head.weight is shared with wte.weight"):
        add_lora(model, targets=["lm_head"])
    with pytest.raises(ValueError, match="no LoRA adapters to merge"):
        merge_lora(model)
    add_lora(model, rank=2)
    with pytest.raises(ValueError, match="add_lora twice"):
        add_lora(model, rank=2)


@pytest.mark.parametrize("arch", ["gpt", "node", "ti_mlp", "ti_ssm"])
def test_gradients_reach_only_the_factors(arch):
    _, model = tiny(arch)
    base_params = list(model.parameters())
    add_lora(model, rank=2)
    idx, targets = batch()
    _, loss = model(idx, targets)
    loss.backward()
    assert all(p.grad is None for p in base_params)  # `original` tensors and everything else
    for m in model.modules():
        if hasattr(m, "lora_B"):
            assert m.lora_B.grad.abs().sum() > 0  # dL/dB = s dL/dW A^T
            assert torch.equal(m.lora_A.grad, torch.zeros_like(m.lora_A))  # dL/dA = s B^T dL/dW, and B = 0 at init

    if arch == "ti_ssm":
        return  # its scan (models.scans._SelectiveScan) is an autograd.Function without setup_context: no torch.func
    # torch.func: the same gradients as a function of the factors alone
    names = [n for n, _ in model.named_parameters() if ".lora_" in n]
    factors = {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}

    def loss_of(factors):
        return torch.func.functional_call(model, factors, (idx, targets))[1]

    grads = torch.func.grad(loss_of)(factors)
    assert sorted(grads) == sorted(names)
    for n, p in model.named_parameters():
        if ".lora_" in n:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-7)


def test_adjoint_gradient_reaches_the_factors():
    """The adjoint methods differentiate the field's parameters that require grad: the factors."""
    _, model = tiny("node", method="euler", n_steps=2, sensitivity="backsolve")
    base_params = list(model.parameters())
    add_lora(model, rank=2)
    idx, targets = batch()
    model(idx, targets)[1].backward()
    assert all(p.grad is None for p in base_params)
    grads = [m.lora_B.grad for m in model.modules() if hasattr(m, "lora_B")]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_cross_entropy_matches_the_logits():
    """The adapted model's loss is the loss of its logits (the chunked head sees the same model)."""
    _, model = tiny("gpt")
    add_lora(model, rank=2)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(std=0.1)
    idx, targets = batch()
    logits, _ = model(idx)
    _, loss = model(idx, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
