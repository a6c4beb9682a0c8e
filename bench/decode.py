"""Decoding speed with the KV cache against recomputing the window, per arch, in one run.

    python bench/decode.py                        # 512 new tokens after 16, batch 1, d=256, 6 layers / 6 steps, char vocab
    python bench/decode.py --archs gpt node ti_ssm --new-tokens 128

The models are untrained (speed does not depend on the weights); greedy decoding, so both
paths produce the same tokens, which the script checks. ``hybrid`` uses rk4 on its ODE
block, the continuous archs Euler, as in the project's benchmark spec (``--method`` changes
both).
"""

from __future__ import annotations

import argparse
import time

import torch

import nodelm_lib as nl
from nodelm_lib.config import ARCHS, CONTINUOUS_ARCHS


def config(arch: str, a: argparse.Namespace) -> nl.ModelConfig:
    n = a.layers
    method = a.method or ("rk4" if arch == "hybrid" else "euler")
    extra = {"ode_start": n // 3, "ode_end": n - n // 3} if arch == "hybrid" else {}
    return nl.ModelConfig(arch=arch, vocab_size=256, d_model=a.dim, n_heads=a.heads, n_layers=n,
                          max_seq_len=a.prompt + a.new_tokens, ode=nl.ODEConfig(method=method, n_steps=n), **extra)


def tokens_per_s(model, prompt, new_tokens: int, use_cache: bool) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    out = nl.generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache)
    return new_tokens / (time.perf_counter() - t0), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", nargs="+", default=["gpt", "hybrid", "node"], choices=ARCHS)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--method", default=None, help="solver of every ODE block (default: rk4 hybrid, euler others)")
    a = p.parse_args()
    torch.manual_seed(0)
    prompt = torch.randint(0, 256, (1, a.prompt))
    print(f"{a.new_tokens} new tokens after {a.prompt}, batch 1, d={a.dim}, {a.layers} layers / steps, char vocab, "
          f"{torch.get_num_threads()} threads")
    print(f"{'arch':8} {'method':7} {'cached tok/s':>13} {'uncached tok/s':>15} {'speed-up':>9}")
    for arch in a.archs:
        cfg = config(arch, a)
        model = nl.build_model(cfg).eval()
        nl.generate(model, prompt, 4, temperature=0)  # warm-up
        fast, out_fast = tokens_per_s(model, prompt, a.new_tokens, use_cache=True)
        slow, out_slow = tokens_per_s(model, prompt, a.new_tokens, use_cache=False)
        assert torch.equal(out_fast, out_slow), f"{arch}: cached and uncached greedy tokens differ"
        method = cfg.ode.method if arch in CONTINUOUS_ARCHS or arch == "hybrid" else "-"
        print(f"{arch:8} {method:7} {fast:>13.1f} {slow:>15.1f} {fast / slow:>8.1f}x")


if __name__ == "__main__":
    main()
