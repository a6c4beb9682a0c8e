"""Measurements that do not depend on the machine's timer: memory kept for backward."""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def saved_tensor_bytes(fn: Callable[[], T]) -> tuple[int, T]:
    """Run ``fn()`` and return (bytes of every tensor autograd saved for backward, its result).

    Deterministic and device-independent, so it can be asserted in tests (e.g. that a
    gradient method's memory does not grow with the number of solver steps). Tensors saved
    twice are counted twice: it is an upper bound on what backward holds.
    """
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out
