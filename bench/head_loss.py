"""Output head + cross-entropy, forward and backward: chunked (``losses.linear_cross_entropy``)
against the reference ``F.cross_entropy(h @ W.T, y)`` that holds all logits, in one run.

    python bench/head_loss.py                 # the seed's gpu config: N = 32*64 rows, D=256, V=50257
    python bench/head_loss.py --rows 4096 --vocab 256
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from nodelm_lib.losses import linear_cross_entropy


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32 * 64)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    h = torch.randn(a.rows, a.dim, requires_grad=True)
    w = (0.02 * torch.randn(a.vocab, a.dim)).requires_grad_()
    y = torch.randint(0, a.vocab, (a.rows,))

    def full():
        F.cross_entropy(h @ w.t(), y).backward()

    def chunked():
        linear_cross_entropy(h, w, y).backward()

    ref, new = timed(full, a.repeats), timed(chunked, a.repeats)
    print(f"N={a.rows} D={a.dim} V={a.vocab}: full logits {1000 * ref:.0f} ms, chunked {1000 * new:.0f} ms "
          f"(median of {a.repeats}); speed-up x{ref / new:.2f}")


if __name__ == "__main__":
    main()
