"""Bytes kept for backward by an ODE solve, per sensitivity and number of steps.

    python bench/ode_memory.py            # the hybrid's field at d=256, B=8 x T=64

Counts every tensor autograd saves for the backward pass (``saved_tensors_hooks``), so the
number is deterministic and device-independent; ``direct`` is the reference in the same run.
Wall time of forward + backward is printed too.
"""

from __future__ import annotations

import argparse
import time

import torch

import nodelm_lib as nl
from nodelm_lib.models.hybrid import HybridField
from nodelm_lib.profiling import saved_tensor_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", default="4,8,16,32,64")
    a = p.parse_args()
    torch.manual_seed(0)
    field = HybridField(nl.ModelConfig(arch="hybrid", d_model=a.d_model, n_heads=4, control_dim=0))
    x0 = torch.randn(a.batch, a.seq, a.d_model, requires_grad=True)
    print(f"hybrid field d={a.d_model}, x0 {tuple(x0.shape)}; MB saved for backward (ratio to direct), fwd+bwd s")
    for n in map(int, a.steps.split(",")):
        t = torch.linspace(0, 1, n + 1)
        row, ref = [], None
        for sens in ("direct", "checkpoint", "reversible"):
            start = time.perf_counter()
            nbytes, y = saved_tensor_bytes(lambda: nl.odeint(field, x0, t, method="reversible_heun", sensitivity=sens))
            y[-1].sum().backward()
            seconds = time.perf_counter() - start
            ref = ref or nbytes
            row.append(f"{sens} {nbytes / 2**20:8.1f} MB (x{nbytes / ref:.3f}) {seconds:.2f} s")
        print(f"n_steps={n:3d}  " + " | ".join(row))


if __name__ == "__main__":
    main()
