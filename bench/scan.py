"""The selective SSM's scan (``ti_ssm`` and ``ssm``), forward + backward, in one run: the library's
fused scan (``selective_scan``, blocks of 16 positions), the same with the whole sequence as one
block, the layer's chunked path (``linear_recurrence`` at several chunk lengths), and candidates
not yet in the library: a log-depth (Hillis-Steele) scan, and torch's ``associative_scan``
(its generic mode, a log-depth scan in Python; on CUDA also compiled in its pointwise mode, which
inductor turns into one Triton kernel per scan).

    python bench/scan.py                      # 02's cpu sizes: B 12, T 64, D 128, N 16, 1 thread
    python bench/scan.py --device cuda --batch 32 --seq 128 --channels 256   # 02's gpu sizes

Why: on an H100 ``ti_ssm`` and ``ssm`` cost 5.0x and 4.1x ``gpt``'s eager step at 0.92x its FLOPs
(results/bench_cuda.csv), ~60% of 02's gpu budget. The fused scan is tuned for a CPU: one small
in-place multiply-add per position (T kernel launches per pass on a GPU). The chunked path takes
about 2 L + T / L launches over (B, T, D, N) tensors; the log-depth scan log2(T) steps of a few
elementwise ops over them (more arithmetic and memory traffic, fewest launches). Which wins on a
GPU is a measurement this script makes; beside each time it prints the number of operators that
launch a kernel (``kernel_operators``: countable on a CPU too), the peak memory, and the largest
difference from the library's outputs and gradients, relative to the largest entry of each.
"""

from __future__ import annotations

import argparse
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from head_loss import timed  # median of repeats after a warm-up, synchronised on a GPU
from nodelm_lib.models import scan_triton
from nodelm_lib.models.scans import adjoint_recurrence, linear_recurrence, scan_in_float32, scan_with, selective_scan
from nodelm_lib.training.profiling import cpu_description, peak_memory_mb

# operators that launch no kernel: allocation and type queries (views are recognised by schema)
NO_KERNEL = {"empty", "empty_strided", "new_empty", "promote_types", "detach", "lift_fresh"}


@torch.no_grad()
def _level_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h with h_s = a_s h_{s-1} + b_s along dim 1 (h_{-1} = 0) in ceil(log2 T) steps: after the
    step of offset k, h_s sums the last 2k inputs and A_s is the product of the last 2k decays."""
    h, A = b.clone(), a.clone()
    k, T = 1, a.shape[1]
    while k < T:
        h[:, k:] = h[:, k:] + A[:, k:] * h[:, :-k]  # the right side is formed before the write
        if 2 * k < T:
            A[:, k:] = A[:, k:] * A[:, :-k]
        k *= 2
    return h


def level_recurrence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_s = a_s h_{s-1} + b_s (h_{-1} = 0) for a, b (B, T, ...), by a log-depth scan (candidate),
    with the library's adjoint scan as backward (as ``linear_recurrence``)."""
    return adjoint_recurrence(a, b, _level_scan)


def _combine(earlier, later):
    """Two consecutive steps h -> a h + b composed: first ``earlier``, then ``later``."""
    (a1, b1), (a2, b2) = earlier, later
    return a2 * a1, a2 * b1 + b2


def associative_recurrence(combine_mode: str):
    """h_s = a_s h_{s-1} + b_s along dim 1 by torch's ``associative_scan`` (torch >= 2.5; None
    where it is missing), differentiated by torch's own rule for it."""
    try:
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError:
        return None
    return lambda a, b: associative_scan(_combine, (a, b), dim=1, combine_mode=combine_mode)[1]


def candidates(T: int, device: str = "cpu") -> dict:
    """name -> scan(x, delta, A, B_s, C_s) returning (y, last state)."""
    scans = {"fused, blocks of 16 (library)": selective_scan,
             f"fused, one block of {T}": functools.partial(selective_scan, block=T)}
    for L in (8, 16, 32):
        if L < T:
            scans[f"chunked, L={L} (layer's chunk_size)"] = functools.partial(
                scan_in_float32, scan_with(functools.partial(linear_recurrence, chunk_size=L)))
    scans["log-depth (candidate)"] = functools.partial(scan_in_float32, scan_with(level_recurrence))
    generic = associative_recurrence("generic")
    if generic is not None:
        scans["associative_scan, generic (candidate)"] = functools.partial(scan_in_float32, scan_with(generic))
        if device == "cuda":  # the pointwise mode runs on CUDA only
            scans["associative_scan, compiled (candidate)"] = torch.compile(functools.partial(
                scan_in_float32, scan_with(associative_recurrence("pointwise"))))
    if device == "cuda" and scan_triton.available():  # on a CPU only Triton's (slow) interpreter runs it
        # channels per program (more programs hide more memory latency) and the loop's stages (loads
        # issued that many positions ahead, less one; 1: not pipelined)
        block, stages_ = scan_triton.BLOCK_D, scan_triton.STAGES  # the defaults
        for block_d, stages in dict.fromkeys([(16, stages_), (block, stages_), (64, stages_), (block, 1), (block, 6)]):
            pipelined = f"{stages} stages" if stages > 1 else "not pipelined"
            scans[f"Triton kernels, {block_d} channels a program, {pipelined} (candidate)"] = functools.partial(
                scan_in_float32, functools.partial(scan_triton.triton_selective_scan, block_d=block_d, stages=stages))
    return scans


def inputs(batch: int, seq: int, channels: int, states: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    """x, delta (softplus, > 0), A (< 0), B_s, C_s as a selective SSM layer forms them."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch, seq, channels, device=device, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(batch, seq, channels, device=device, generator=g) - 2)
    A = -torch.rand(channels, states, device=device, generator=g) * 4 - 0.1
    B_s, C_s = (torch.randn(batch, seq, states, device=device, generator=g) for _ in range(2))
    return [t.requires_grad_() for t in (x, delta, A, B_s, C_s)]


def forward_backward(scan, xs: list[torch.Tensor], grads: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    """y, the last state and the five input gradients of sum(y g_y) + sum(last g_last)."""
    y, last = scan(*xs)
    loss = (y * grads[0]).sum() + (last * grads[1]).sum()
    return [y.detach(), last.detach(), *torch.autograd.grad(loss, xs)]


# float32 scans of the same recurrence differ by rounding (~1e-6 here); beyond this a candidate
# computes something else (on an H100, torch 2.11's compiled associative_scan gave 1.0)
WRONG_ABOVE = 1e-3


class _OperatorCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__.split(".")[0] not in NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


def kernel_operators(fn) -> int | None:
    """How many operators ``fn()`` runs that are neither views nor allocations: on a GPU, about
    its kernel launches, which bound an eager step at these sizes (02's gpu profile: gpt 18.7 ms
    eager, 4.6 ms replayed as a CUDA graph, results/bench_cuda*.csv). Counted on any device;
    None where the count cannot be taken (a compiled higher-order operator such as
    ``associative_scan`` refuses dispatch modes)."""
    try:
        with _OperatorCount() as counter:
            fn()
    except NotImplementedError:
        return None
    return counter.count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--channels", type=int, default=128, help="D, the scan's channels (the layer's inner width)")
    p.add_argument("--states", type=int, default=16, help="N, the state size")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads on a CPU (default 1, as bench/record.py)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.set_num_threads(a.threads)
    xs = inputs(a.batch, a.seq, a.channels, a.states, a.device)
    g = torch.Generator(device=a.device).manual_seed(1)
    grads = (torch.randn(a.batch, a.seq, a.channels, device=a.device, generator=g),
             torch.randn(a.batch, a.channels, a.states, device=a.device, generator=g))
    scans = candidates(a.seq, a.device)
    library = forward_backward(selective_scan, xs, grads)
    cpu = cpu_description()
    where = (torch.cuda.get_device_name() if a.device == "cuda"
             else f"{cpu['cpu_name']} ({cpu['cpu_capability']}), {a.threads} thread(s)")
    print(f"B={a.batch} T={a.seq} D={a.channels} N={a.states} on {where}, torch {torch.__version__}; "
          f"forward + backward, median of {a.repeats}")
    reference = None
    for name, scan in scans.items():
        try:
            got = forward_backward(scan, xs, grads)  # a compiled candidate compiles here
        except Exception as error:  # a candidate that cannot run here is reported, not timed
            print(f"  {name:36s} failed: {type(error).__name__}: {str(error).splitlines()[0][:150]}")
            continue
        diff = max(float((u - v).abs().max() / v.abs().max()) for u, v in zip(got, library))
        seconds = timed(lambda scan=scan: forward_backward(scan, xs, grads), a.repeats, a.device)
        reference = reference or seconds
        memory, _ = peak_memory_mb(lambda scan=scan: forward_backward(scan, xs, grads), a.device)
        ops = kernel_operators(lambda scan=scan: forward_backward(scan, xs, grads))
        print(f"  {name:36s} {1000 * seconds:9.3f} ms  x{reference / seconds:5.2f} the library's speed  "
              f"{'?' if ops is None else ops:>5} operators  peak {memory:8.1f} MiB  largest relative difference {diff:.1e}"
              + ("  WRONG: not the library's outputs and gradients" if not diff <= WRONG_ABOVE else ""))


if __name__ == "__main__":
    main()
