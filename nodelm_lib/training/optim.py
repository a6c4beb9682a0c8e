"""The optimiser (AdamW with decay on matrices only), the learning-rate schedule (linear warmup,
cosine to ``min_lr_ratio``) and gradient norms and clipping by module group."""

from __future__ import annotations

import math

import torch

from nodelm_lib.config import TrainConfig
from nodelm_lib.models import CausalLM


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / span)
    min_lr = tc.lr * tc.min_lr_ratio
    return min_lr + 0.5 * (tc.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) only: not on biases, norms or scalars."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = dict(lr=tc.lr, betas=(tc.beta1, tc.beta2))
    try:  # the fused kernel: one kernel for the whole update, several times faster on CPU
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, **kwargs)


def grad_norms(model: CausalLM, groups: dict[str, list[str]]) -> dict[str, float]:
    """L2 norm of the gradient, in total and per module group (before clipping)."""
    return measure_gradients(model, groups)[0]


def measure_gradients(model: CausalLM, groups: dict[str, list[str]]) -> tuple[dict[str, float], list, list]:
    """``grad_norms``, the gradients and their per-tensor norms (tensors), from one read of the
    gradients: what a training step logs and what ``clip_gradients`` then needs."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        raise RuntimeError("no parameter has a gradient: was backward() called?")
    grads = [g for _, g in named]
    per_tensor = list(torch._foreach_norm(grads))
    values = torch.stack(per_tensor).float().tolist()  # one host sync
    norms = dict(zip((n for n, _ in named), values))
    squares = {g: sum(norms[n] ** 2 for n in members if n in norms) for g, members in groups.items()}
    out = {"grad_norm": math.sqrt(sum(squares.values()))}
    out.update({f"grad_norm/{g}": math.sqrt(s) for g, s in squares.items()})
    return out, grads, per_tensor


def clip_gradients(grads: list[torch.Tensor], norms: list[torch.Tensor], max_norm: float) -> None:
    r"""``torch.nn.utils.clip_grad_norm_`` from per-tensor norms already computed: every gradient
    scaled by :math:`\min(1, c / (\lVert(\lVert g_i\rVert)_i\rVert + 10^{-6}))`, by the same
    operations, so to the same numbers, with one pass over the gradients instead of two
    (``grad_norms`` has read them once; with Tong et al.'s hypernetwork a pass over node's
    parameters is a visible share of its step). On a CPU, where reading the factor costs no
    device synchronisation, a factor of exactly 1 (no clipping, most steps of a run) skips the
    pass: multiplying by 1 changes no number."""
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if factor.device.type == "cpu" and factor.item() == 1.0:
        return
    torch._foreach_mul_(grads, factor)
