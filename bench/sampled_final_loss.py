"""What scoring the final losses on fixed batches instead of whole splits would cost: the cut
that would bring 02's ``cpu_wikitext2`` profile closest to its time budget on a slow CPU.

    python bench/sampled_final_loss.py results/runs/cpu_wikitext2

Reads a store of runs that scored both (``eval_on="whole_split_at_end"``: the validation curve's
last point is the loss on the ``eval_batches`` fixed batches at the final step, ``final["val_loss"]``
the loss over the whole validation split) and prints, per arm of the profile, the mean of each and
their offset, then each arm's mean paired difference to the reference arm measured both ways: the
level a sample gives, and how far it moves the comparisons a table reports. Reads records only.
"""

from __future__ import annotations

import argparse

import pandas as pd

from nodelm_lib.experiments import protocol
from nodelm_lib.experiments.profiles import load_profile
from nodelm_lib.runs.store import load_records


def profile_arms(notebook: str, profile: str) -> dict:
    """The arms of a 02 profile (name -> ModelConfig), built as the notebook builds them."""
    _, arms = protocol.comparison_setup(load_profile(notebook, profile))
    return {name: arm["model"] for name, arm in arms.items()}


def both_scores(store: str, arms: dict, reported_below: int = 100) -> pd.DataFrame:
    """One row per reported run (seed < ``reported_below``) of a known arm: its whole-split validation
    and test losses and its fixed-batch validation loss at the final step."""
    rows = []
    for record in load_records(store):
        if record.status != "completed" or record.seed >= reported_below or not record.evals:
            continue
        name = next((n for n, m in arms.items() if m == record.train_config.model), None)
        last = record.evals[-1]
        if name is None or last.get("step") != record.train_config.max_steps or "val_tokens" not in record.final:
            continue
        rows.append({"arm": name, "seed": record.seed, "val_whole": record.final["val_loss"],
                     "val_batches": last["val_loss"], "test_whole": record.final.get("test_loss")})
    if not rows:
        raise SystemExit(f"{store}: no completed reported run scored both whole splits and fixed batches "
                         "(eval_on='whole_split_at_end' at the final step)")
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", help="a store of eval_on='whole_split_at_end' runs")
    parser.add_argument("--profile", default="cpu_wikitext2", help="the 02 profile whose arms the runs are")
    parser.add_argument("--reference", default="gpt", help="the arm the paired differences are to")
    args = parser.parse_args()

    runs = both_scores(args.store, profile_arms("02_seed_comparison", args.profile))
    levels = runs.groupby("arm")[["val_whole", "val_batches", "test_whole"]].mean()
    levels["offset"] = levels["val_batches"] - levels["val_whole"]
    pd.set_option("display.width", 160)
    print(f"{args.store}: {len(runs)} reported runs, {runs['seed'].nunique()} seeds")
    print("\nmean final loss (nats/char); offset = fixed batches - whole split")
    print(levels.round(4).to_string())
    offset = runs["val_batches"] - runs["val_whole"]
    print(f"\nper run: offset {offset.mean():+.4f}, SD {offset.std():.4f}, range {offset.min():+.4f}..{offset.max():+.4f}")

    wide = runs.pivot(index="seed", columns="arm")
    paired = pd.DataFrame({metric: (wide[metric].sub(wide[metric][args.reference], axis=0)).mean()
                           for metric in ("val_whole", "val_batches", "test_whole")}).drop(index=args.reference)
    paired["batches - whole"] = paired["val_batches"] - paired["val_whole"]
    print(f"\nmean paired difference to {args.reference} (nats/char)")
    print(paired.round(4).to_string())
    print(f"\nlargest move of a paired difference: {paired['batches - whole'].abs().max():.4f}; for scale, "
          f"validation and test (both whole) differ by up to {(paired['test_whole'] - paired['val_whole']).abs().max():.4f}")


if __name__ == "__main__":
    main()
