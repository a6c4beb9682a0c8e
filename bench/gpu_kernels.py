"""What bounds a GPU training step: its wall time against the GPU's busy time, and the kernels
that fill it, for arms of 02's gpu profile.

    python bench/gpu_kernels.py --out results/bench_cuda_kernels                    # on a GPU
    python bench/gpu_kernels.py --tiny --modes eager --steps 2 --out /tmp/kernels   # a CPU check

Each arm's step (``bench/record.py``'s: loss under bf16 autocast, backward, clipping, fused
AdamW) is timed with CUDA events, then run under ``torch.profiler`` for the same number of steps.
Per step, the record keeps:

* ``wall_ms``: the step as the GPU's clock sees it, without the profiler;
* ``busy_ms``: the union of the intervals in which a kernel, copy or fill ran on the GPU;
* ``kernels``: how many ran, and ``mean_kernel_us`` their mean length;
* ``top``: the kernels that took the most time, by name.

Reading it: wall far above busy means the GPU waits for the host to launch (or, under CUDA
graphs, for the graph's nodes to start one after another: many short kernels); busy close to
wall means the kernels themselves are the bound, and ``top`` says which. Under CUDA graphs the
profiler may see the graph launch and not its kernels (``kernels`` 0): the compiled mode without
graphs, same kernels launched one by one, says how many the graph holds. ``--tiny`` runs a
narrow character model of each arm on the CPU, where there is no GPU time to see (``busy_ms``
0), to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nodelm_lib as nl  # noqa: E402
from nodelm_lib.training.device import enable_tf32  # noqa: E402
from record import cuda_seconds, gpu_02_arms, machine, our_training_step, scan_case, with_scan_chunk  # noqa: E402

MODES = {"eager": lambda m: m, "compiled": torch.compile,
         "cudagraphs": lambda m: torch.compile(m, mode="reduce-overhead")}


@dataclasses.dataclass(frozen=True)
class DeviceEvent:
    """One kernel, copy or fill on the GPU: its name and its interval in microseconds."""

    name: str
    start_us: float
    end_us: float


def busy_us(events: list[DeviceEvent]) -> float:
    """Microseconds in which at least one event ran: the union of their intervals (kernels of
    several streams may overlap, and an overlap is counted once)."""
    total, end = 0.0, -float("inf")
    for e in sorted(events, key=lambda e: e.start_us):
        if e.end_us > end:
            total += e.end_us - max(e.start_us, end)
            end = e.end_us
    return total


def kernel_summary(events: list[DeviceEvent], steps: int, top: int = 10) -> dict:
    """Per step: the GPU's busy milliseconds, the number of events and their mean length, and the
    ``top`` names by time (milliseconds and calls per step, share of the summed event time)."""
    if steps < 1:
        raise ValueError(f"steps={steps!r} is not valid; it must be at least 1")
    seconds, calls = defaultdict(float), defaultdict(int)
    for e in events:
        seconds[e.name] += e.end_us - e.start_us
        calls[e.name] += 1
    summed = sum(seconds.values())
    ranked = sorted(seconds, key=seconds.get, reverse=True)[:top]
    return dict(busy_ms=busy_us(events) / 1000 / steps, kernels=len(events) / steps,
                mean_kernel_us=summed / len(events) if events else 0.0,
                top=[dict(name=name, ms=seconds[name] / 1000 / steps, calls=calls[name] / steps,
                          share=seconds[name] / summed) for name in ranked])


def device_events(profile: torch.profiler.profile) -> list[DeviceEvent]:
    """The profile's GPU-side events (kernels, copies, fills), as ``DeviceEvent``s."""
    return [DeviceEvent(e.name, e.time_range.start, e.time_range.end)
            for e in profile.events() if e.device_type == DeviceType.CUDA]


def tiny_arms() -> tuple[nl.TrainConfig, dict[str, nl.ModelConfig]]:
    """02 gpu's arms cut to width 32 over characters (their depth kept: the hybrids' ODE span
    needs it): a CPU check of the script."""
    base, arms = gpu_02_arms()
    arms = {name: dataclasses.replace(cfg, vocab_size=65, d_model=32, n_heads=2) for name, cfg in arms.items()}
    return dataclasses.replace(base, batch_size=2, seq_len=16), arms


def profile_arm(base: nl.TrainConfig, cfg: nl.ModelConfig, mode: str, steps: int, top: int,
                chunk: int | str | None, device: str) -> dict:
    """One arm in one mode: warm-up (compilation), ``steps`` timed steps, ``steps`` profiled."""
    torch.manual_seed(0)
    model = with_scan_chunk(nl.build_model(cfg), chunk).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
    autocast = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")  # noqa: E731
    train_step = our_training_step(model, optimizer, MODES[mode](model), autocast)
    x = torch.randint(0, cfg.vocab_size, (base.batch_size, base.seq_len), device=device)
    step = lambda: train_step(x, torch.roll(x, -1, 1))  # noqa: E731
    cuda_seconds(step, 3)  # compiles, and records the graphs in the cudagraphs mode
    wall = float(np.median(cuda_seconds(step, steps)))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    return dict(wall_ms=1000 * wall, **kernel_summary(device_events(profile), steps, top))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", nargs="+", default=["gpt", "ti_ssm", "ssm"], help="arms of 02's gpu profile")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["compiled", "cudagraphs"])
    p.add_argument("--scan-chunk", type=int, default=None, metavar="L",
                   help="also profile each scan arm on the chunked scan of chunk size L")
    p.add_argument("--scan-triton", action="store_true",
                   help="also profile each scan arm on the Triton kernels (models/scan_triton.py)")
    p.add_argument("--steps", type=int, default=10, help="timed and profiled steps per arm and mode")
    p.add_argument("--top", type=int, default=10, help="kernels listed per arm and mode")
    p.add_argument("--tiny", action="store_true", help="narrow character arms on the CPU (a check of the script)")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.txt")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    if device == "cpu" and a.scan_triton:
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter, read when Triton is first imported
    if device == "cuda":
        enable_tf32()  # as nl.train on CUDA
    base, arms = tiny_arms() if a.tiny else gpu_02_arms()
    unknown = [name for name in a.archs if name not in arms]
    if unknown:
        p.error(f"--archs {' '.join(unknown)}: not arms of 02's gpu profile; choose from {', '.join(arms)}")
    cases = [(name, None) for name in a.archs]
    if a.scan_chunk is not None:
        cases += [(name, a.scan_chunk) for name in a.archs if arms[name].arch in ("ti_ssm", "ssm")]
    if a.scan_triton:
        cases += [(name, "triton") for name in a.archs if arms[name].arch in ("ti_ssm", "ssm")]
    rows, lines = [], []
    for mode in a.modes:
        for name, chunk in cases:
            case = scan_case(name, chunk)
            row = dict(mode=mode, case=case, **profile_arm(base, arms[name], mode, a.steps, a.top, chunk, device))
            rows.append(row)
            lines.append(f"{mode:10s} {case:22s} wall {row['wall_ms']:7.2f} ms  GPU busy {row['busy_ms']:7.2f} ms  "
                         f"{row['kernels']:6.0f} kernels of {row['mean_kernel_us']:6.1f} us on average")
            lines += [f"    {k['ms']:7.3f} ms {k['calls']:5.0f} calls {k['share']:5.1%}  {k['name'][:110]}" for k in row["top"]]
            print("\n".join(lines[-1 - len(row["top"]):]), flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)  # written after each case: a time limit keeps the rest
            a.out.with_suffix(".json").write_text(json.dumps(dict(machine=machine(1), steps=a.steps, rows=rows), indent=1) + "\n")
            a.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
