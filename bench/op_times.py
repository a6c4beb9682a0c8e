"""Where a training step's time goes, per operator, timed in place: every aten operator of a few
steps wrapped in ``perf_counter`` by a dispatch mode, summed by operator (and input shapes).

    python bench/op_times.py node                 # an arm of 02's cpu profile, 1 thread
    python bench/op_times.py seed-gpt --threads 2 # the seed config (bench/record.py's)
    python bench/op_times.py node --shapes --top 15
    python bench/op_times.py seed-gpt --threads 2 --bf16  # under bf16 autocast (native-bf16 CPUs)

Why not ``torch.profiler``: on these CPUs it overstated memory-bound products. node's basis
gradient, a (64 x 4) @ (4 x 65536) product, read 6.6-8.8 ms per call in a profile and 2.7 ms
timed in place (here, and by ``perf_counter`` around the call alone); for the large products of
a gpt step both agree (products 0.82 of the step in a profile, 0.85 here). The mode adds a
little Python per operator outside the timed calls: the printed "plain step" is timed without
it, and the operators' sum is what the step would cost with no Python at all.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nodelm_lib as nl  # noqa: E402
from nodelm_lib.training.profiling import cpu_description, keep_freed_memory  # noqa: E402
from record import SEED_VOCAB, cpu_02_arms, our_training_step, seed_config_models  # noqa: E402

PRODUCTS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._scaled_dot_product_flash_attention")


class OperatorTimes(TorchDispatchMode):
    """Seconds and calls per operator (``str(func)``, with the tensor arguments' shapes if ``shapes``)."""

    def __init__(self, shapes: bool = False):
        super().__init__()
        self.shapes = shapes
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        key = str(func)
        if self.shapes:
            key += " " + str([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
        self.seconds[key] += seconds
        self.calls[key] += 1
        return out


def training_step(arm: str, bf16: bool = False):
    """(step, batch) for an arm of 02's cpu profile or ``seed-gpt`` / ``seed-hybrid``, under bf16
    autocast if ``bf16``."""
    torch.manual_seed(0)
    arms = {**cpu_02_arms(), **{f"seed-{name}": cfg for name, cfg in seed_config_models().items()}}
    if arm not in arms:
        raise SystemExit(f"arm {arm!r} is not valid; choose one of {sorted(arms)}")
    cfg = arms[arm]
    x = torch.randint(0, SEED_VOCAB, (32, 64)) if arm.startswith("seed-") else torch.randint(0, 256, (12, 64))
    model = nl.build_model(cfg).train()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    step = our_training_step(model, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True), autocast=autocast)
    return step, (x, torch.roll(x, -1, 1))


def operator_times(step, batch, steps: int = 3, warmup: int = 3, shapes: bool = False) -> tuple[float, OperatorTimes]:
    """(median seconds of a plain step, the operators' times summed over ``steps`` timed steps)."""
    for _ in range(warmup):
        step(*batch)
    plain = []
    for _ in range(steps):
        start = time.perf_counter()
        step(*batch)
        plain.append(time.perf_counter() - start)
    timed = OperatorTimes(shapes)
    with timed:
        for _ in range(steps):
            step(*batch)
    return sorted(plain)[len(plain) // 2], timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arm", help="an arm of 02's cpu profile (gpt, node, ...) or seed-gpt / seed-hybrid")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--shapes", action="store_true", help="one line per operator and input shapes")
    parser.add_argument("--bf16", action="store_true", help="under bf16 autocast (where the CPU computes it natively)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as nl.train does on a CPU
    step, batch = training_step(args.arm, args.bf16)
    plain, timed = operator_times(step, batch, args.steps, shapes=args.shapes)
    per_step = {key: seconds / args.steps for key, seconds in timed.seconds.items()}
    total = sum(per_step.values())
    products = sum(s for key, s in per_step.items() if key.startswith(PRODUCTS))
    print(cpu_description(), f"threads {args.threads}, torch {torch.__version__}")
    print(f"{args.arm}: plain step {1e3 * plain:.1f} ms; operators {1e3 * total:.1f} ms, of which matrix "
          f"products and attention {1e3 * products:.1f} ms ({products / plain:.2f} of the plain step)")
    for key, seconds in sorted(per_step.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{1e3 * seconds:9.2f} ms {timed.calls[key] // args.steps:6d}x  {key}")


if __name__ == "__main__":
    main()
