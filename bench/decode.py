"""Decoding speed with the KV cache against recomputing the window, per arch, in one run.

    python bench/decode.py                        # 512 new tokens after 16, batch 1, d=256, 6 layers / 6 steps, char vocab
    python bench/decode.py --archs gpt node ti_ssm --new-tokens 128

The models are untrained (speed does not depend on the weights); greedy decoding, so both
paths produce the same tokens, which the script checks. ``hybrid`` uses rk4 on its ODE
block, the continuous archs Euler, as in the project's benchmark spec (``--method`` changes
both).

Two speed-ups are printed. *wall* is new tokens over wall-clock seconds, cached against
uncached. *best* is the same ratio at the machine's undisturbed speed: each path's per-token
latencies are cut into bins of ``--bin`` consecutive positions, and every token of a bin is
charged the bin's fastest token (the cost of a token changes little over 32 positions; a
slower one was interfered with, which is timeit's reasoning for taking the minimum). Why: the
project's 2-core VM runs in intermittent slow periods of 0.1-1 s in which everything, user
time included, takes ~10x longer (gpt d=256: a cached token 1.45 ms or 10-30 ms, a 256-token
forward 17-28 ms or 165-366 ms, alternating between 32-token blocks; no page faults or system
time behind it), and the first pass at a new window length can cost a one-off ~1 s (seen in
the uncached path, which meets a new length at every token). Where these fall decides the
*wall* ratio of a run; *slow* is the share of tokens that took over twice their bin's best.
A bin of cached tokens spans only 50-300 ms and can lie wholly inside a slow period, so *best*
errs against the cache; the one way it errs for it is the first cached token, which carries the
prompt's prefill and is charged its bin's fastest (one short forward in 512 tokens).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import nodelm_lib as nl
from nodelm_lib.config import ARCHS, CONTINUOUS_ARCHS


def config(arch: str, a: argparse.Namespace) -> nl.ModelConfig:
    n = a.layers
    method = a.method or ("rk4" if arch == "hybrid" else "euler")
    extra = {"ode_start": n // 3, "ode_end": n - n // 3} if arch == "hybrid" else {}
    return nl.ModelConfig(arch=arch, vocab_size=256, d_model=a.dim, n_heads=a.heads, n_layers=n,
                          max_seq_len=a.prompt + a.new_tokens, ode=nl.ODEConfig(method=method, n_steps=n), **extra)


def timed_generate(model, prompt, new_tokens: int, use_cache: bool) -> tuple[torch.Tensor, np.ndarray]:
    """Greedy ``nl.generate`` and the seconds each new token took (the first includes the prefill)."""
    stamps: list[float] = []
    start = time.perf_counter()
    out = nl.generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache,
                      on_token=lambda _: stamps.append(time.perf_counter()))
    return out, np.diff([start, *stamps])


def bin_best(latencies: np.ndarray, bin_size: int) -> np.ndarray:
    """Each token's latency replaced by the fastest one in its bin of ``bin_size`` positions."""
    bins = np.split(latencies, range(bin_size, len(latencies), bin_size))
    return np.concatenate([np.full(len(b), b.min()) for b in bins])


def best_case_seconds(latencies: np.ndarray, bin_size: int) -> float:
    """Every token charged its bin's fastest token: sum over bins of len(bin) * min(bin)."""
    return float(bin_best(latencies, bin_size).sum())


def slow_share(latencies: np.ndarray, bin_size: int) -> float:
    """Share of tokens that took over twice their bin's fastest token."""
    return float((latencies > 2 * bin_best(latencies, bin_size)).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", nargs="+", default=["gpt", "hybrid", "node"], choices=ARCHS)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--method", default=None, help="solver of every ODE block (default: rk4 hybrid, euler others)")
    p.add_argument("--bin", type=int, default=32, help="positions per bin of the best-case estimate")
    a = p.parse_args()
    if a.bin < 1:
        p.error(f"--bin {a.bin} is not valid; it must be a positive number of positions")
    torch.manual_seed(0)
    prompt = torch.randint(0, 256, (1, a.prompt))
    print(f"{a.new_tokens} new tokens after {a.prompt}, batch 1, d={a.dim}, {a.layers} layers / steps, char vocab, "
          f"{torch.get_num_threads()} threads")
    print(f"{'arch':8} {'method':7} {'cached tok/s':>13} {'uncached tok/s':>15} {'wall':>7} "
          f"{'best cached':>12} {'best uncached':>14} {'best':>7} {'slow (cached/uncached)':>23}")
    for arch in a.archs:
        cfg = config(arch, a)
        model = nl.build_model(cfg).eval()
        nl.generate(model, prompt, 4, temperature=0)  # warm-up
        out_fast, lat_fast = timed_generate(model, prompt, a.new_tokens, use_cache=True)
        out_slow, lat_slow = timed_generate(model, prompt, a.new_tokens, use_cache=False)
        assert torch.equal(out_fast, out_slow), f"{arch}: cached and uncached greedy tokens differ"
        fast, slow = a.new_tokens / lat_fast.sum(), a.new_tokens / lat_slow.sum()
        best_fast = a.new_tokens / best_case_seconds(lat_fast, a.bin)
        best_slow = a.new_tokens / best_case_seconds(lat_slow, a.bin)
        method = cfg.ode.method if arch in CONTINUOUS_ARCHS or arch == "hybrid" else "-"
        shares = f"{slow_share(lat_fast, a.bin):.0%} / {slow_share(lat_slow, a.bin):.0%}"
        print(f"{arch:8} {method:7} {fast:>13.1f} {slow:>15.1f} {fast / slow:>6.1f}x "
              f"{best_fast:>12.1f} {best_slow:>14.1f} {best_fast / best_slow:>6.1f}x {shares:>23}", flush=True)


if __name__ == "__main__":
    main()
