"""What one function evaluation (NFE) costs at inference, against one ``gpt`` block of the same width,
in one run: the ratio that lets a loss-vs-NFE curve (notebook 09) be read as loss against time.

    python bench/nfe_cost.py                          # 02's cpu shape: d=128, 4 heads, B=12 x T=64
    python bench/nfe_cost.py --steps 4 16 --rounds 30 --out results/bench_nfe_cpu

Each arm's ODE block is solved on random activations at ``--steps`` Euler steps (eval mode, no
gradient, as ``experiments.anytime`` evaluates), and the time divided by the steps is one NFE.
Weights generated from t (``node``'s hypernetwork, the time-indexed gates) are formed on the
untimed first solve and kept for the next ones (``ODEBlock.open_grid``), as at inference over many
batches. The reference is one ``gpt`` block (attention + MLP) on the same activations. The arms
take turns within each round (a slow period of the shared machine hits them alike); the median of
each is compared. Target: one NFE at most 1.15x one ``gpt`` block. Arms with a selective SSM
(``ti_ssm``) are timed with the library's scan and again with ``scan_cpu``'s compiled loop
(``--scan-kernels``; ``SelectiveSSM.kernel = "cpu"``), the same function to float32 accuracy.

Memory comes from the heap as in training (``keep_freed_memory``): otherwise glibc's history of
freed blocks decides which case page-faults on its large tensors. ``--clock cpu`` times the
calling thread's CPU time, not the wall: with one thread that is the compute, and on a machine
shared with other jobs it leaves out the time they ran.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import statistics
import time
from pathlib import Path

import torch

import nodelm_lib as nl
from nodelm_lib.models import scan_cpu
from nodelm_lib.models.ssm import use_scan_kernel
from nodelm_lib.nn.layers import Block
from nodelm_lib.reporting.reproduce import machine
from nodelm_lib.training.profiling import keep_freed_memory

TARGET = 1.15


def block_of(arch: str, a: argparse.Namespace) -> torch.nn.Module:
    cfg = nl.config.for_arch(nl.ModelConfig(vocab_size=256, d_model=a.dim, n_heads=a.heads, n_layers=4,
                                            max_seq_len=a.seq_len), arch)
    return nl.build_model(cfg).eval().ode_block


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def timed(fn, x, clock=time.perf_counter) -> float:
    start = clock()
    fn(x)
    return clock() - start


@torch.no_grad()
def measure(a: argparse.Namespace) -> list[dict]:
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    keep_freed_memory()
    clock = CLOCKS[a.clock]
    x = torch.randn(a.batch, a.seq_len, a.dim)
    gpt = Block(a.dim, a.heads).eval()
    cases = {"gpt block": (gpt, 1)}
    for arch in a.archs:
        block = block_of(arch, a)
        for kernel in a.scan_kernels:  # the same weights under each kernel
            variant = copy.deepcopy(block)
            if kernel != "library" and not use_scan_kernel(variant, kernel):
                continue  # no selective SSM in this arm: the kernel changes nothing
            suffix = "" if kernel == "library" else f", {kernel} scan kernel"
            for n in a.steps:  # a copy per setting: a block keeps the weights of its last grid only
                cases[f"{arch} {n} steps{suffix}"] = (_solver(copy.deepcopy(variant), n), n)
    times = {name: [] for name in cases}
    for name, (fn, _) in cases.items():  # warm-up: first calls allocate, pick kernels and form the kept weights
        fn(x)
    for _ in range(a.rounds):
        for name, (fn, _) in cases.items():
            times[name].append(timed(fn, x, clock))
    ref = statistics.median(times["gpt block"])
    rows = []
    for name, (_, n) in cases.items():
        per_nfe = statistics.median(times[name]) / n
        rows.append({"case": name, "nfe": n, "ms_per_nfe": 1e3 * per_nfe, "ratio_to_gpt_block": per_nfe / ref,
                     "target": "" if name == "gpt block" else TARGET})
    return rows


def _solver(block, n):
    """A solve of ``block`` at ``n`` Euler steps (the copies of one arm's block have its weights)."""
    ode = nl.ODEConfig(method="euler", n_steps=n)

    def solve(x):
        block.ode = ode
        return block(x)

    return solve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", nargs="+", default=["hybrid", "node", "ti_mlp", "ti_ssm"])
    p.add_argument("--steps", nargs="+", type=int, default=[4, 16])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--scan-kernels", nargs="+", choices=["library", "cpu"], default=["library", "cpu"],
                   help="the selective scan's kernels to time in arms that have one: the library's default, and "
                        "scan_cpu's compiled loop (needs a C++ compiler and ninja; left out with a note where absent)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="wall time, or the calling thread's CPU time (one thread only)")
    p.add_argument("--out", default=None, help="write <out>.csv and <out>.json (with the machine)")
    a = p.parse_args()
    if a.clock == "cpu" and a.threads != 1:
        p.error(f"--clock cpu counts the calling thread only: it needs --threads 1, got {a.threads}")
    if "cpu" in a.scan_kernels and not scan_cpu.available():
        print(f"the cpu scan kernel is left out: {scan_cpu.unavailable_reason()}")
        a.scan_kernels = [k for k in a.scan_kernels if k != "cpu"]
    rows = measure(a)
    for r in rows:
        flag = "" if r["target"] == "" else ("ok" if r["ratio_to_gpt_block"] <= TARGET else "ABOVE TARGET")
        print(f"{r['case']:>22}: {r['ms_per_nfe']:7.3f} ms per NFE, {r['ratio_to_gpt_block']:.2f}x a gpt block {flag}")
    where = machine()
    print(f"machine: {where}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(f"{a.out}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        Path(f"{a.out}.json").write_text(json.dumps({"machine": where, "args": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
