"""Every arch at one shape: total and non-embedding parameters, and forward + backward time
per training step, with each arch's time as a ratio to ``gpt`` measured in the same run.

    python bench/model_zoo.py                  # the seed's gpu shape: d=256, 6 layers, GPT-2 vocab, B=8 x T=64
    python bench/model_zoo.py --preset small --batch 32 --device cuda
    python bench/model_zoo.py --vocab 256 --dim 64 --layers 4

The step is what training runs: ``model(idx, targets, return_logits=False)`` (the chunked
head + cross-entropy) and ``loss.backward()``, median of ``--repeats`` after a warm-up.
Continuous archs take ``ode.n_steps = layers`` Euler steps with direct backprop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import nodelm_lib as nl
from nodelm_lib.config import ARCHS, CONTINUOUS_ARCHS


def step_ms(model: torch.nn.Module, idx: torch.Tensor, repeats: int, device: str) -> float:
    def step():
        model.zero_grad(set_to_none=True)
        _, loss = model(idx, idx, return_logits=False)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def config(arch: str, a: argparse.Namespace) -> nl.ModelConfig:
    ode = nl.ODEConfig(method="euler", n_steps=a.layers)
    extra = {"ode_start": a.layers // 3, "ode_end": a.layers - a.layers // 3} if arch == "hybrid" else {}
    return nl.ModelConfig(arch=arch, vocab_size=a.vocab, d_model=a.dim, n_heads=a.heads, n_layers=a.layers,
                          max_seq_len=max(a.seq, 64), ode=ode, **extra)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    a = p.parse_args()
    torch.manual_seed(0)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    print(f"d={a.dim}, {a.layers} layers, vocab {a.vocab}, B={a.batch} x T={a.seq} on {a.device} "
          f"({torch.get_num_threads()} threads); fwd+bwd median of {a.repeats}")
    print(f"{'arch':8} {'total':>12} {'non-embed':>12} {'ms/step':>9} {'x gpt':>7}")
    reference = None
    for arch in ["gpt"] + [x for x in a.archs if x != "gpt"]:
        model = nl.build_model(config(arch, a)).to(a.device).train()
        ms = step_ms(model, idx, a.repeats, a.device)
        reference = reference or ms
        note = "  (Euler, direct)" if arch in CONTINUOUS_ARCHS else ""
        print(f"{arch:8} {model.num_params():>12,} {model.num_params(non_embedding=True):>12,} "
              f"{ms:>9.1f} {ms / reference:>7.2f}{note}")


if __name__ == "__main__":
    main()
