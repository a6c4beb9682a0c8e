"""How much a learning-rate selection loses by judging its runs on the validation curve's fixed
batches instead of the whole validation split (``select_lr(eval_on="batches")``).

    python bench/selection_subset.py                          # gpt, 4e-3 against 8e-3 (about 4 min on 2 cores)
    python bench/selection_subset.py --arch ti_ssm            # the arm whose margin was smallest

Trains one arm at two rates as a selection run of 02's ``cpu_wikitext2`` profile does (500 steps,
seed 100, d=128, depth 4, batch 12 x 64 WikiText-2 characters), scores both models window by
window over the whole validation split, and prints the difference between the two rates over
the whole split, over the curve's fixed batches (``eval_batches`` random windows, the same for
every run), and over every k-th window (the spread over the k offsets). What matters is the
error of the *difference*: every run is scored on the same windows, so most of a subset's
sampling error cancels. The docs' Experiments guide quotes this script's output.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.data import split_windows
from nodelm_lib.training.evaluation import eval_batches, split_tokens


def selection_config(arch: str, lr: float, steps: int, seed: int) -> nl.TrainConfig:
    """A selection run of 02's cpu_wikitext2 profile (params/02_seed_comparison/cpu_wikitext2.yaml)."""
    model = nl.ModelConfig(arch=arch, d_model=128, n_heads=4, n_layers=4, max_seq_len=64, ssm_state_size=16)
    return nl.TrainConfig(model=model, dataset="wikitext2", tokenizer="char", batch_size=12, seq_len=64,
                          max_steps=steps, warmup_steps=100, min_lr_ratio=0.1, beta2=0.99, lr=lr, seed=seed,
                          eval_interval=400, eval_on="whole_split_at_end", eval_batches=50, score_test=False,
                          progress=False)


@torch.no_grad()
def window_losses(model, batches) -> np.ndarray:
    """Mean loss of each window (row) of ``batches``."""
    model.eval()
    out = []
    for x, y in batches:
        logits, _ = model(x, y)
        out.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").mean(1).double().numpy())
    return np.concatenate(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="gpt")
    p.add_argument("--lrs", type=float, nargs=2, default=[4e-3, 8e-3])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--seed", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)  # as a sweep's worker
    whole, fixed = [], []
    for lr in args.lrs:
        tc = selection_config(args.arch, lr, args.steps, args.seed)
        record = nl.train(tc)
        whole.append(window_losses(record.model, split_windows(split_tokens(tc, "validation"), tc.batch_size, tc.seq_len)))
        fixed.append(window_losses(record.model, eval_batches(tc, "validation")))
        print(f"{args.arch} lr {lr:g}: whole split {whole[-1].mean():.5f} (record {record.final['val_loss']:.5f}), "
              f"fixed batches {fixed[-1].mean():.5f} (curve {record.evals[-1]['val_loss']:.5f})", flush=True)
    d = whole[1] - whole[0]
    print(f"difference ({args.lrs[1]:g} minus {args.lrs[0]:g}), over {len(d)} windows of {tc.seq_len}:")
    print(f"  whole split     {d.mean():+.5f}")
    print(f"  fixed batches   {(fixed[1] - fixed[0]).mean():+.5f}   ({len(fixed[0])} windows; "
          f"SE of a random subset that size {d.std(ddof=1) / np.sqrt(len(fixed[0])):.5f})")
    for k in (2, 4, 8, 16):
        subs = [d[o::k].mean() for o in range(k)]
        print(f"  one window in {k:2d}  {min(subs):+.5f} .. {max(subs):+.5f}  (SD over the {k} offsets {np.std(subs, ddof=1):.5f})")


if __name__ == "__main__":
    main()
