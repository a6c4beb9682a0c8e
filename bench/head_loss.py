"""Output head + cross-entropy, forward and backward, in one run: what the library runs
(``losses.linear_cross_entropy``: chunked on a CPU, ``F.cross_entropy(F.linear(h, W), y)`` on a
GPU) against the reference ``F.cross_entropy(h @ W.T, y)`` that holds all logits, and on a GPU a
candidate not yet in the library: the same loss over logits padded to a multiple of 64 columns.

    python bench/head_loss.py                 # the seed's config: N = 32*64 rows, D=256, V=50257
    python bench/head_loss.py --rows 4096 --vocab 256
    python bench/head_loss.py --device cuda --rows 4096   # 02's gpu profile: bf16 autocast, + padded

Why the padded candidate: with V = 50257 the (N, V) bf16 logits have a row stride that is not a
multiple of 8 elements, which keeps cuBLAS from Hopper's aligned GEMM kernels (the H100 profile of
02's gpu step showed the head's product in an sm75 kernel at ~84 TFLOP/s). Padding W with zero
rows and adding a bias of -inf on the pad columns leaves the loss and every gradient exactly as
they were (exp(-inf) = 0); the script prints the largest difference beside the times.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import torch
import torch.nn.functional as F

from nodelm_lib.nn.losses import linear_cross_entropy


def timed(fn, repeats: int, device: str) -> float:
    """Median seconds of ``repeats`` calls after one warm-up (synchronised on a GPU)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def padded_cross_entropy(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, multiple: int = 64) -> torch.Tensor:
    """``F.cross_entropy(h @ w.T, y)`` over logits padded to a multiple of ``multiple`` columns:
    zero rows appended to w and a -inf bias on them, so the pad adds exp(-inf) = 0 to every sum."""
    vocab = w.shape[0]
    pad = -vocab % multiple
    bias = torch.zeros(vocab + pad, device=w.device, dtype=w.dtype)
    bias[vocab:] = float("-inf")
    return F.cross_entropy(F.linear(h, F.pad(w, (0, 0, 0, pad)), bias), y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32 * 64)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.manual_seed(0)
    h = torch.randn(a.rows, a.dim, device=a.device, requires_grad=True)
    w = (0.02 * torch.randn(a.vocab, a.dim, device=a.device)).requires_grad_()
    y = torch.randint(0, a.vocab, (a.rows,), device=a.device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if a.device == "cuda" else contextlib.nullcontext
    losses = {"full logits": lambda: F.cross_entropy(h @ w.t(), y), "library": lambda: linear_cross_entropy(h, w, y)}
    if a.device == "cuda":
        losses["padded"] = lambda: padded_cross_entropy(h, w, y)

    def step(loss_fn):
        with autocast():
            loss = loss_fn()
        loss.backward()
        return loss

    results = {}
    for name, loss_fn in losses.items():
        h.grad = w.grad = None
        loss = step(loss_fn)
        results[name] = (loss.item(), h.grad.clone(), w.grad.clone())
    seconds = {name: timed(lambda f=f: step(f), a.repeats, a.device) for name, f in losses.items()}
    ref = seconds["full logits"]
    print(f"N={a.rows} D={a.dim} V={a.vocab} on {a.device} (median of {a.repeats}, forward + backward):")
    for name, s in seconds.items():
        loss, gh, gw = results[name]
        base = results["library"]
        diff = max(abs(loss - base[0]), (gh - base[1]).abs().max().item(), (gw - base[2]).abs().max().item())
        print(f"  {name:12s} {1000 * s:8.2f} ms  speed-up over full logits x{ref / s:.2f}  "
              f"largest difference from the library's loss and gradients {diff:.2e}")


if __name__ == "__main__":
    main()
