"""How much a learning-rate selection loses by judging its runs on the validation curve's fixed
batches instead of the whole validation split (``select_lr(eval_on="batches")``).

    python bench/selection_subset.py                          # gpt, 4e-3 against 8e-3 (about 4 min on 2 cores)
    python bench/selection_subset.py --arch ti_ssm            # the arm whose margin was smallest
    python bench/selection_subset.py --from-selection results/seed_comparison_cpu_wikitext2_lr_selection.csv

The last form trains nothing: a ``whole_split_at_end`` selection run's record holds both losses
(the curve's last point on the fixed batches, and the whole split's), so it selects again from
a committed selection's records by the fixed batches, and prints each arm's choice and margin
both ways.

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
import copy
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.data import split_windows
from nodelm_lib.experiments.lr_selection import LRSelectionWarning, selection_table
from nodelm_lib.experiments.profiles import load_profile
from nodelm_lib.runs.store import record_path
from nodelm_lib.training.evaluation import eval_batches, split_tokens


def selection_config(arch: str, lr: float, steps: int, seed: int) -> nl.TrainConfig:
    """A selection run of 02's cpu_wikitext2 profile, its shape read from
    params/02_seed_comparison/cpu_wikitext2.yaml (the whole split scored at the end, test not)."""
    p = load_profile("02_seed_comparison", "cpu_wikitext2")
    model = nl.ModelConfig(arch=arch, **{k: p[k] for k in ("d_model", "n_heads", "n_layers", "max_seq_len",
                                                           "ssm_state_size")})
    shape = {k: p[k] for k in ("dataset", "tokenizer", "batch_size", "seq_len", "warmup_steps", "min_lr_ratio",
                               "beta2", "eval_interval", "eval_on", "eval_batches")}
    return nl.TrainConfig(model=model, **shape, max_steps=steps, lr=lr, seed=seed, score_test=False, progress=False)


@torch.no_grad()
def window_losses(model, batches) -> np.ndarray:
    """Mean loss of each window (row) of ``batches``."""
    model.eval()
    out = []
    for x, y in batches:
        logits, _ = model(x, y)
        out.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").mean(1).double().numpy())
    return np.concatenate(out)


def on_fixed_batches(record: nl.RunRecord) -> nl.RunRecord:
    """``record`` with its final validation loss replaced by its curve's last point."""
    if record.evals[-1]["step"] != record.train_config.max_steps:
        raise ValueError(f"run {record.config_hash}'s curve ends at step {record.evals[-1]['step']}, "
                         f"not at its last step {record.train_config.max_steps}")
    record = copy.copy(record)
    record.final = {**record.final, "val_loss": record.evals[-1]["val_loss"]}
    return record


def reselect(selection_csv: Path, store: Path) -> None:
    """Each arm's choice and margin by the whole split (as committed) and by the fixed batches."""
    import pandas as pd

    committed = pd.read_csv(selection_csv)
    records = [(row, nl.RunRecord.from_json(record_path(store, h)))
               for row in committed.itertuples() for h in row.config_hashes.split()]
    runs = [(row.arm, row.lr, record.seed, int(row.steps), record) for row, record in records]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)
        whole = selection_table(runs)
        fixed = selection_table([(*run[:4], on_fixed_batches(run[4])) for run in runs])
    for arm in whole["arm"].unique():
        w, f = whole[whole["arm"] == arm], fixed[fixed["arm"] == arm]
        choice_w, choice_f = float(w.loc[w["selected"], "lr"].iloc[0]), float(f.loc[f["selected"], "lr"].iloc[0])
        print(f"{arm:13s} whole split: {choice_w:g} (margin {w['margin'].iloc[0]:.4f} ± {w['margin_sd'].iloc[0]:.4f})   "
              f"fixed batches: {choice_f:g} (margin {f['margin'].iloc[0]:.4f} ± {f['margin_sd'].iloc[0]:.4f})"
              f"{'' if choice_w == choice_f else '   DIFFERENT'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="gpt")
    p.add_argument("--lrs", type=float, nargs=2, default=[4e-3, 8e-3])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--from-selection", type=Path, help="a committed selection table (CSV): select again from its records")
    p.add_argument("--store", type=Path, help="the run store of --from-selection (default: results/runs/<profile>)")
    args = p.parse_args()
    if args.from_selection is not None:
        profile = args.from_selection.name.removeprefix("seed_comparison_").removesuffix("_lr_selection.csv")
        return reselect(args.from_selection, args.store or Path("results/runs") / profile)
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
