"""Forward + backward time of our fixed-step solver against ``torchdiffeq.odeint``.

    python bench/odeint_vs_torchdiffeq.py                 # the hybrid's field, d=256, B=32 x T=64
    python bench/odeint_vs_torchdiffeq.py --compile       # also both under torch.compile

Same field, same grid, same tableau: our ``euler`` against theirs, and our ``rk38`` against
their ``rk4`` (torchdiffeq's fixed-step rk4 uses the 3/8 rule). Runs are interleaved and the
median of ``--repeats`` is reported; the ratio is ours / torchdiffeq (target <= 0.8).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchdiffeq

import nodelm_lib as nl
from nodelm_lib.models.hybrid import HybridField

PAIRS = (("euler", "euler"), ("rk38", "rk4"))  # (ours, torchdiffeq's name for the same tableau)


def timed(fn, x0) -> float:
    start = time.perf_counter()
    y = fn(x0)
    y[-1].square().mean().backward()
    if x0.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(d_model: int = 256, batch: int = 32, seq: int = 64, steps: int = 4, repeats: int = 5,
            compile: bool = False) -> list[dict]:
    """Median forward + backward seconds of each solver pair (``PAIRS``) on the hybrid's field:
    one dict per pair, ``{"ours", "theirs", "seconds": {variant: median}}``."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    field = HybridField(nl.ModelConfig(arch="hybrid", d_model=d_model, n_heads=4, control_dim=0)).to(device)
    x0 = torch.randn(batch, seq, d_model, device=device, requires_grad=True)
    t = torch.linspace(0, 1, steps + 1, device=device)
    results = []
    for ours, theirs in PAIRS:
        variants = {
            "nodelm": lambda x, m=ours: nl.odeint(field, x, t, method=m),
            "torchdiffeq": lambda x, m=theirs: torchdiffeq.odeint(field, x, t, method=m),
        }
        if compile:
            variants["nodelm compiled"] = torch.compile(variants["nodelm"])
            variants["torchdiffeq compiled"] = torch.compile(variants["torchdiffeq"])
        for fn in variants.values():  # warm-up (and compilation)
            timed(fn, x0)
        times = {name: [] for name in variants}
        for _ in range(repeats):  # interleaved, so that a slow spell of the machine hits every variant
            for name, fn in variants.items():
                times[name].append(timed(fn, x0))
        results.append({"ours": ours, "theirs": theirs,
                        "seconds": {name: statistics.median(ts) for name, ts in times.items()}})
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time both solvers under torch.compile")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"hybrid field d={a.d_model}, x0 ({a.batch}, {a.seq}, {a.d_model}), {a.steps} steps on {device}; "
          f"forward + backward, median of {a.repeats}")
    for r in measure(a.d_model, a.batch, a.seq, a.steps, a.repeats, a.compile):
        med = r["seconds"]
        line = f"{r['ours']:>5} vs torchdiffeq {r['theirs']:<6} nodelm {med['nodelm'] * 1e3:8.1f} ms  " \
               f"torchdiffeq {med['torchdiffeq'] * 1e3:8.1f} ms  ratio {med['nodelm'] / med['torchdiffeq']:.3f}"
        if a.compile:
            line += f"  | compiled: nodelm {med['nodelm compiled'] * 1e3:8.1f} ms  torchdiffeq " \
                    f"{med['torchdiffeq compiled'] * 1e3:8.1f} ms  ratio " \
                    f"{med['nodelm compiled'] / med['torchdiffeq compiled']:.3f}  (nodelm compiled / torchdiffeq eager " \
                    f"{med['nodelm compiled'] / med['torchdiffeq']:.3f})"
        print(line)


if __name__ == "__main__":
    main()
