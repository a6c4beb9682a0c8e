"""Run records as table rows: losses, cost and FLOPs of each run, and comparisons over a sweep's tables."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from nodelm_lib.data.words import split_words, word_perplexity
from nodelm_lib.training.flops import forward_flops, training_flops
from nodelm_lib.training.record import RunRecord

if TYPE_CHECKING:
    import pandas as pd



def record_row(record: RunRecord, arm: str | None = None) -> dict:
    """One flat row of a record: identity, final losses (with perplexity, bits per token and, for
    a subword run scored on whole splits, perplexity per word), parameters, FLOPs and cost."""
    tc = record.train_config
    steps = len(record.metrics)
    final = record.final
    row = {
        "arm": arm if arm is not None else tc.model.arch, "seed": record.seed, "arch": tc.model.arch,
        "config_hash": record.config_hash, "status": record.status,
        "val_loss": final.get("val_loss", math.nan), "test_loss": final.get("test_loss", math.nan),
        "train_loss": final.get("train_loss", math.nan),
        "params_total": record.params.get("total"), "params_non_embedding": record.params.get("non_embedding"),
        "flops_per_token": record.flops_per_token,
        "ms_per_step": 1e3 * record.train_time_s / steps if steps else math.nan,
        "tokens_per_s": record.tokens_per_s, "peak_memory_mb": record.peak_memory_mb,
        "activation_mb": record.activation_mb, "lr": tc.lr,
        "val_tokens": final.get("val_tokens", math.nan), "test_tokens": final.get("test_tokens", math.nan),
        "train_time_s": record.train_time_s, "wall_time_s": record.wall_time_s, "steps": steps,
        "train_flops": training_flops(record.step_flops_per_token, steps * tc.batch_size * tc.seq_len),
        **record_provenance(record),
    }
    whole = tc.eval_on in ("whole_split", "whole_split_at_end")  # both score the final losses on whole splits
    for split in ("val", "test"):
        row.update(loss_units(split, row[f"{split}_loss"], row[f"{split}_tokens"], tc.dataset, tc.tokenizer, whole))
    return row


def loss_units(split: str, loss: float, tokens: float, dataset: str, tokenizer: str, whole_split: bool = True) -> dict:
    """A mean loss (nats per token over ``tokens`` tokens of ``split``, "val" or "test") in the other
    units tables give: ``<split>_ppl``, ``<split>_bits_per_token`` and ``<split>_word_ppl``,
    perplexity per word (``data.words``). The last is NaN for characters (a loss per character
    is the unit already), for a loss over sampled windows (``whole_split`` False: no word count)
    and for no loss. Trained runs (``record_row``) and the n-gram references share it, so that
    their rows of one table are in the same units."""
    finite = math.isfinite(loss)
    per_word = math.nan
    if tokenizer != "char" and whole_split and finite and tokens and tokens > 0:
        per_word = word_perplexity(loss, int(tokens), split_words(dataset, {"val": "validation"}.get(split, split)))
    return {f"{split}_ppl": math.exp(loss) if finite else math.nan, f"{split}_bits_per_token": loss / math.log(2),
            f"{split}_word_ppl": per_word}


def record_provenance(record: RunRecord) -> dict:
    """Which library version and which CPU made a record: ``git_commit`` ("unknown" outside a git
    checkout) and ``cpu`` (name and torch's capability; a run on a GPU names the GPU first, as in
    "NVIDIA H200 with Intel(R) Xeon(R) Processor (AVX512)"). Training is bit-for-bit deterministic
    on one CPU (or GPU) type but not across types, so a table states both."""
    env = record.environment
    cpu = f"{env.get('cpu_name', 'unknown CPU')} ({env.get('cpu_capability', '?')})"
    if str(env.get("device", "cpu")).startswith("cuda"):  # the GPU computed the run, the CPU only launched it
        cpu = f"{env.get('device_name', 'unknown GPU')} with {cpu}"
    return {"git_commit": env.get("git_commit", "unknown"), "cpu": cpu}


LIBRARY = Path(__file__).resolve().parents[1]  # nodelm_lib/, whose code makes a record's numbers


def same_library(commits: Iterable[str], library: Path = LIBRARY) -> bool:
    """True when git says that every one of ``commits`` holds the same ``library`` folder (the
    same code under another commit: the docs or results changed between them); False when they
    differ, or when git cannot tell (no checkout, or a commit it does not know)."""
    commits = sorted(set(commits))
    try:
        root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=library, capture_output=True, text=True)
    except OSError:  # no git installed
        return False
    if root.returncode != 0 or "unknown" in commits:
        return False
    top = Path(root.stdout.strip()).resolve()
    folder = library.resolve().relative_to(top).as_posix()  # a pathspec is read from the working directory
    return all(subprocess.run(["git", "diff", "--quiet", commits[0], other, "--", folder], cwd=top,
                              capture_output=True).returncode == 0 for other in commits[1:])


def check_provenance(runs: pd.DataFrame, allow_mixed: bool = False, library: Path = LIBRARY) -> str:
    """One line saying which library version and CPU made the runs of a table (``record_row``'s
    ``git_commit`` and ``cpu``). Runs of several commits whose ``nodelm_lib/`` is the same code
    (``same_library``: a sweep trained over several sessions, between which only docs or results
    changed) are one version. Runs of several versions or CPUs raise a ValueError listing each
    group and its arms, unless ``allow_mixed`` (then the line says MIXED, for the table's caption):
    a table's rows should differ in nothing but their arm."""
    missing = [c for c in ("git_commit", "cpu") if c not in runs.columns]
    if missing:
        raise ValueError(f"the runs lack column(s) {missing}: build them with record_row")
    cpus, commits = sorted(set(runs["cpu"])), sorted(set(runs["git_commit"]))
    if len(cpus) == 1 and len(commits) == 1:
        return f"all {len(runs)} runs by commit {commits[0]} on {cpus[0]}"
    if len(cpus) == 1 and same_library(commits, library):
        return f"all {len(runs)} runs by commits {', '.join(commits)} (the same nodelm_lib code) on {cpus[0]}"
    groups = runs.groupby(["git_commit", "cpu"], sort=True)
    parts = [f"commit {commit} on {cpu}: {len(g)} runs ({', '.join(map(str, dict.fromkeys(g['arm'])))})"
             for (commit, cpu), g in groups]
    if not allow_mixed:
        raise ValueError(f"the runs of this table come from {len(parts)} library versions or CPUs: " + "; ".join(parts) +
                         ". Retrain the minority at one commit on one kind of CPU, or pass allow_mixed=True and say so "
                         "with the table")
    return "MIXED provenance: " + "; ".join(parts)


def forward_batch(record: RunRecord) -> int:
    """Sequences per forward pass of a record's training steps: its batch, split over the ranks
    of a data-parallel run (as ``nl.train`` splits it)."""
    from nodelm_lib.training.distributed import check_batch_divides

    return check_batch_divides(record.train_config.batch_size, record.environment.get("world_size", 1))


def recount_flops(record: RunRecord) -> bool:
    """Count ``record.flops_per_token`` again, in place, where it was counted at another batch than
    its training steps' forward passes (``forward_batch``); True if it changed.

    Records written before the count took the batch have it at one sequence. That overstates a
    model whose weights are generated from t once per pass: ``node``'s hypernetwork at 02's cpu
    profile (batch 12) counted 3.36M FLOPs per token instead of the 1.90M its training did."""
    batch = forward_batch(record)
    if record.flops_per_token <= 0 or record.flops_batch_size == batch:
        return False
    record.flops_per_token = forward_flops(record.train_config, batch)
    record.flops_batch_size = batch
    return True


def pooled_loss(runs: pd.DataFrame, splits: Iterable[str] = ("val", "test")) -> pd.Series:
    """Per run, the loss over several whole splits together, each weighted by its tokens
    (``record_row``'s ``<split>_loss`` and ``<split>_tokens``). For tiny-shakespeare,
    validation + test is the last 10% of the text: nanoGPT's validation split."""
    splits = list(splits)
    tokens = sum(runs[f"{s}_tokens"] for s in splits)
    return sum(runs[f"{s}_loss"] * runs[f"{s}_tokens"] for s in splits) / tokens


def compare_lr_rankings(short: pd.DataFrame, full: pd.DataFrame) -> pd.DataFrame:
    """Does a short learning-rate search rank the rates as full-length runs do? One row per
    (arm, lr) present in both ``select_lr`` tables: both validation losses, both ranks (1 =
    best) and whether the arm's rankings agree (``same_ranking``) and its choice agrees
    (``same_choice``)."""
    both = short.merge(full, on=["arm", "lr"], suffixes=("_short", "_full"))
    if both.empty:
        raise ValueError("the two selections share no (arm, lr): run the full-length check on arms and rates "
                         "of the short search")
    for which in ("short", "full"):
        both[f"rank_{which}"] = both.groupby("arm")[f"val_loss_{which}"].rank(method="min")
    agree = both.groupby("arm").apply(lambda g: bool((g["rank_short"] == g["rank_full"]).all()),
                                      include_groups=False)
    choice = both.groupby("arm").apply(lambda g: bool((g["selected_short"] == g["selected_full"]).all()),
                                       include_groups=False)
    both["same_ranking"] = both["arm"].map(agree)
    both["same_choice"] = both["arm"].map(choice)
    return both[["arm", "lr", "steps_short", "val_loss_short", "rank_short", "steps_full", "val_loss_full",
                 "rank_full", "same_ranking", "same_choice"]]


def time_to_target(curves_df: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (arm, seed): training time and step of the first evaluation at or below validation
    loss ``target`` (NaN if never reached). Resolution is the evaluation interval."""
    import pandas as pd

    rows = []
    for (arm, seed), group in curves_df.groupby(["arm", "seed"], sort=False):
        hit = group[group["val_loss"] <= target]
        first = hit.iloc[0] if len(hit) else None
        rows.append({"arm": arm, "seed": seed, "target": target,
                     "step_to_target": first["step"] if first is not None else math.nan,
                     "time_to_target_s": first["train_time_s"] if first is not None else math.nan})
    return pd.DataFrame(rows)
