"""Causal attention's forward + backward on a CPU: torch's flash kernel against the explicit
products (``layers.explicit_attention``), in float32 and bf16, at this project's sizes.

    python bench/attention.py                  # 1 thread, median of 20 after 5 warm-ups
    python bench/attention.py --threads 2

Why it exists: ``layers.attend`` picks the kernel by device and dtype. In torch 2.13 the CPU
flash kernel is the faster one in float32 and the slower one, by 3-5x, in bf16, where it took
half of a bf16 training step at nanoGPT's baby config. Rerun this after a torch upgrade: if the
ratios flip, so should ``attend``'s choice. Both run in this process, taking turns per
repeat. Printed: milliseconds per call and explicit / flash (below 1: explicit is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodelm_lib.nn.layers import explicit_attention  # noqa: E402
from nodelm_lib.training.profiling import cpu_description  # noqa: E402

# (batch, heads, positions, head width): nanoGPT's baby config and notebook 02's cpu profile (the
# same shape), the seed config (without its dropout), and a longer context
SIZES = {"baby, 02 cpu": (12, 4, 64, 32), "seed": (32, 4, 64, 64), "context 256": (8, 4, 256, 64)}


def flash(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def explicit(q, k, v):
    T = q.shape[-2]
    return explicit_attention(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())


def time_call(fn, shape, dtype, gen) -> float:
    """Seconds of one forward + backward of ``fn`` on fresh random q, k, v."""
    q, k, v = (torch.randn(shape, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    start = time.perf_counter()
    fn(q, k, v).float().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cpu = cpu_description()
    print(f"CPU: {cpu['cpu_name']} ({cpu['cpu_capability']}), torch {torch.__version__}, {a.threads} thread(s); "
          f"median ms of forward + backward over {a.repeats} calls after 5 warm-ups\n")
    print(f"{'size (B, H, T, d_h)':30s} {'dtype':9s} {'flash ms':>9s} {'explicit ms':>12s} {'explicit / flash':>17s}")
    gen = torch.Generator().manual_seed(0)
    for name, shape in SIZES.items():
        for dtype in (torch.float32, torch.bfloat16):
            times = {"flash": [], "explicit": []}
            for i in range(a.repeats + 5):
                for kernel, fn in (("flash", flash), ("explicit", explicit))[:: 1 if i % 2 else -1]:
                    t = time_call(fn, shape, dtype, gen)
                    if i >= 5:
                        times[kernel].append(t)
            f, e = (statistics.median(times[k]) * 1e3 for k in ("flash", "explicit"))
            label = str(dtype).removeprefix("torch.")
            print(f"{name + ' ' + str(shape):30s} {label:9s} {f:9.2f} {e:12.2f} {e / f:17.2f}")


if __name__ == "__main__":
    main()
