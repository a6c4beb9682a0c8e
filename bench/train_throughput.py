"""Training throughput (tokens/s) of each arch at one config, against `gpt` in the same run.

    python bench/train_throughput.py                       # the seed's gpu config on this machine
    python bench/train_throughput.py --set model.d_model=128 --steps 20

Uses the real training loop (``nl.train``) on WikiText-2, so data loading, the optimiser,
gradient-norm logging and clipping are all included; evaluation is excluded from the timing.
The first ``--warmup`` steps are dropped (allocator and kernel warm-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

import nodelm_lib as nl
from nodelm_lib.config import CONTINUOUS_ARCHS, apply_overrides

SEED_GPU = [
    "dataset=wikitext2", "tokenizer=gpt2", "model.d_model=256", "model.n_layers=6", "model.n_heads=4",
    "model.max_seq_len=128", "model.dropout=0.1", "batch_size=32", "seq_len=64", "eval_batches=1",
    "progress=false",
]


def step_times(tc: nl.TrainConfig) -> list[float]:
    times, last = [], [time.perf_counter()]

    def tick(step, row, model):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    # evaluation happens only at the end (eval_interval = max_steps), after the last tick
    nl.train(dataclasses.replace(tc, eval_interval=tc.max_steps), callback=tick)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default="gpt,hybrid,node,ti_mlp,ti_ssm")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    base = apply_overrides(nl.TrainConfig(max_steps=args.steps + args.warmup), SEED_GPU + args.set)
    tokens = base.batch_size * base.seq_len
    print(f"d={base.model.d_model} layers={base.model.n_layers} {base.tokenizer} B={base.batch_size} "
          f"T={base.seq_len} dtype={base.dtype}; {args.steps} timed steps after {args.warmup} warm-up")
    reference = None
    for arch in args.archs.split(","):
        model = dataclasses.replace(base.model, arch=arch)
        if arch in CONTINUOUS_ARCHS:  # their depth is the number of solver steps
            model = dataclasses.replace(model, ode=dataclasses.replace(model.ode, n_steps=model.n_layers))
        tc = dataclasses.replace(base, model=model)
        times = np.array(step_times(tc)[args.warmup:])
        tps = tokens / np.median(times)
        reference = reference or tps
        print(f"{arch:8s} {1000 * np.median(times):8.1f} ms/step (median; IQR {1000 * np.percentile(times, 25):.0f}-"
              f"{1000 * np.percentile(times, 75):.0f})  {tps:9.0f} tokens/s  x{tps / reference:.2f} vs {args.archs.split(',')[0]}")


if __name__ == "__main__":
    main()
