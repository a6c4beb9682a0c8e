"""Runs x seeds with a results store: ``nl.run(tc)`` and ``nl.sweep(base, arms, seeds)``.

The store is a folder of run records, one JSON file per run named by its config hash
(``results/runs/<profile>/<hash>.json``). The hash covers every field that changes the numbers
a run produces (seed included), so

- a run whose completed record exists is read back, never rerun;
- an interrupted run (killed process, Ctrl-C, a crash) resumes from its last checkpoint under
  ``checkpoints/runs/<hash>/`` to the same numbers an uninterrupted run gives;
- records are written atomically (temp file + rename): a kill never leaves half a record.

A run that stops with a non-finite loss is a result too (status ``"failed"``) and is stored.

**The comparison protocol** (``check_protocol``, enforced by ``sweep``): the arms of a sweep
may differ in their model only, and in their learning rate only where a recorded selection
(``select_lr``: each arm's best rate of a small grid, on validation, on a seed that is not
reported) chose it. Optimiser, schedule, weight decay, batch size, sequence
length, step budget (hence tokens), evaluation batches and data are shared, and every arm runs
the same seeds. The seed fixes the training batch order independently of the model
(``train.py``), so arm A and arm B of seed s see the same batches in the same order and are
scored on the same validation and test batches: differences between arms are paired by seed.
Validation picks nothing: every run trains for the fixed step budget, and its test loss is
computed once, at the end.

With ``isolate=True`` (sweep's default) each run trains in a fresh Python process: its peak
memory (resident set size on CPU) and its speed are its own, not inflated by earlier runs in
the same process, and a crash takes down only that run.

Several workers may share one store (two notebooks, a sweep on a cluster: ``launch.py``, whose
``launcher=`` every sweep takes): a worker claims a hash with an atomic lock file before training it
(``claims.py``), so no run is trained by two workers at once; one that finds a run claimed waits
for its record.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch
from tqdm import tqdm

from . import claims
from .config import TONG_HYPERNETWORK, ModelConfig, TrainConfig, for_arch, from_dict, to_dict, with_values
from .distributed import launch_context
from .files import atomic_write_text
from .train import (CHECKPOINT_NAME, RECORD_NAME, RunRecord, train,
                    with_tokenizer_vocab)

# the environment variable through which a sweep tells an isolated run how many threads to use
THREADS_ENV = "NODELM_NUM_THREADS"
# the pid of the sweep that started an isolated run: the run stops when that process is gone
PARENT_ENV = "NODELM_PARENT_PID"

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `import nodelm_lib` stays light (child processes)

DEFAULT_STORE = "results/runs"
DEFAULT_CHECKPOINTS = "checkpoints/runs"
# the TrainConfig fields arms may not change: everything but the model and the seed (and the
# learning rate, which check_protocol allows to differ only through a recorded selection)
PROTOCOL_EXEMPT = frozenset({"model", "seed", "out_dir", "checkpoint_interval", "resume", "log_dir", "progress",
                             "data_dir", "device", "lr"})


def record_path(store: str | Path, config_hash: str) -> Path:
    return Path(store) / f"{config_hash}.json"


def stored_record(tc: TrainConfig, store: str | Path = DEFAULT_STORE) -> RunRecord | None:
    """The finished (completed or failed) record of ``tc`` in ``store``, or None."""
    path = record_path(store, with_tokenizer_vocab(tc).config_hash())
    if not path.exists():
        return None
    record = RunRecord.from_json(path)
    return record if record.status in ("completed", "failed") else None


def checkpoint_path(config_hash: str, checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> Path:
    """Where ``run`` keeps the checkpoint (and, at the end, the final model) of a run."""
    return Path(checkpoints) / config_hash / CHECKPOINT_NAME


def finished_record(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                    need_checkpoint: bool = False) -> RunRecord | None:
    """``stored_record``, or None where ``need_checkpoint`` asks for a final model that is not on disk."""
    done = stored_record(tc, store)
    if done is None or (need_checkpoint and not checkpoint_path(done.config_hash, checkpoints).exists()):
        return None
    return done


def run(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
        isolate: bool = False, need_checkpoint: bool = False, threads: int | None = None) -> RunRecord:
    """Train ``tc`` once, or read its record back from ``store`` if it was trained before.

    The run checkpoints every ``tc.checkpoint_interval`` steps (default: every evaluation)
    under ``checkpoints/<hash>/`` and resumes from there when restarted; its final model stays
    there (``record.checkpoint``, loadable with ``nl.load_model``). ``isolate=True`` trains in
    a subprocess (see the module docstring), with ``threads`` torch threads if given. ``need_checkpoint=True`` retrains a stored run
    whose final model is not on disk (records are committed, checkpoints are not); training is
    deterministic, so the record it writes again holds the same numbers. Returns the stored
    record; an in-process run also carries the trained model as ``record.model``. While another
    worker holds the run's claim (``claims.py``), this waits for it and reads its record.
    """
    tc = with_tokenizer_vocab(tc)
    done = finished_record(tc, store, checkpoints, need_checkpoint)
    if done is not None:
        return done
    with claims.wait_for_claim(store, tc.config_hash()):
        done = finished_record(tc, store, checkpoints, need_checkpoint)  # the worker waited for may have stored it
        if done is not None:
            return done
        return train_into_store(tc, store, checkpoints, isolate, threads)


def train_into_store(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                     isolate: bool = False, threads: int | None = None) -> RunRecord:
    """Train ``tc`` (resuming its checkpoint) and write its finished record to ``store``; the
    caller holds the run's claim. ``run`` without the look-up and the claim."""
    tc = with_tokenizer_vocab(tc)
    config_hash = tc.config_hash()
    out_dir = Path(checkpoints) / config_hash
    tc = dataclasses.replace(tc, out_dir=str(out_dir), resume=True,
                             checkpoint_interval=tc.checkpoint_interval or tc.eval_interval)
    if isolate:
        record = _train_in_subprocess(tc, out_dir, threads)
    else:
        try:
            record = train(tc)
        except Exception as err:
            record = getattr(err, "record", None)
            if record is None or record.status != "failed":
                raise  # a bug or an interruption: nothing to store, the checkpoint resumes it
    if record.status in ("completed", "failed") and launch_context().is_main:  # rank 0 of a data-parallel run
        record.to_json(record_path(store, config_hash))
    return record


def _train_in_subprocess(tc: TrainConfig, out_dir: Path, threads: int | None = None) -> RunRecord:
    """``train(tc)`` in a fresh interpreter (with ``threads`` torch threads, if given); its
    output goes to ``out_dir/train.log``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.json"
    atomic_write_text(config_file, json.dumps(to_dict(dataclasses.replace(tc, progress=False))))
    log = out_dir / "train.log"
    (out_dir / RECORD_NAME).unlink(missing_ok=True)  # what we read back must be this child's
    env = os.environ.copy()
    env[PARENT_ENV] = str(os.getpid())
    if threads is not None:
        env.update({THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads)})
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-m", "nodelm_lib.experiment", str(config_file)],
                                 stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            code = child.wait()
        except BaseException:  # the sweep was interrupted: stop the child too; its checkpoint stays
            child.terminate()
            child.wait()
            raise
    record_file = out_dir / RECORD_NAME
    record = RunRecord.from_json(record_file) if record_file.exists() else None
    if code != 0 and (record is None or record.status != "failed"):
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"run {tc.config_hash()} ({tc.model.arch}, seed {tc.seed}) exited with code {code}; "
                           f"the last lines of {log}:\n{tail}")
    return record


# --------------------------------------------------------------------------- sweeps


# Control arms (``architecture_arms(controls=...)``): each isolates one difference between gpt
# and the continuous-depth models.
#   gpt_parallel: gpt with the parallel block x + Attn(LN_1 x) + MLP(LN_2 x) of node / ti_*
#   ssm:          a discrete transformer with ti_ssm's selective SSM in the MLP's place, in the
#                 same parallel form and without time dependence
CONTROLS = {
    "gpt_parallel": lambda model: dataclasses.replace(for_arch(model, "gpt"), parallel=True),
    "ssm": lambda model: dataclasses.replace(for_arch(model, "ssm"), parallel=True),
}
# Named presets of arch-specific options (``architecture_arms(presets=...)``)
ARCH_PRESETS = {"tong": TONG_HYPERNETWORK}


def architecture_arms(model: ModelConfig, archs: Iterable[str], match_to: str | None = None,
                      match_by: str = "d_model", controls: Iterable[str] = (),
                      presets: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Arms comparing architectures at one shape: ``{arch: {"model": for_arch(model, arch)}}``.

    With ``match_to`` (an arch), a ``gpt_matched`` arm is added: a ``gpt`` whose non-embedding
    parameter count is the closest to that arch's (``match_params``, by ``match_by``), so
    that "fewer parameters" and "better loss" can be told apart. ``controls`` adds arms of
    ``CONTROLS`` by name. ``presets`` maps an arch to a preset of ``ARCH_PRESETS`` applied to
    that arch's arm (``{"node": "tong"}``: Tong et al.'s hypernetwork sizes).
    """
    from .models import count_params, match_params

    presets = dict(presets or {})
    for arch, name in presets.items():
        if name not in ARCH_PRESETS:
            raise ValueError(f"preset {name!r} (for {arch!r}) is not valid; choose one of {', '.join(map(repr, ARCH_PRESETS))}")

    def arm_model(arch: str) -> ModelConfig:
        cfg = for_arch(model, arch)
        return dataclasses.replace(cfg, **ARCH_PRESETS[presets[arch]]) if arch in presets else cfg

    archs = list(archs)
    arms = {arch: {"model": arm_model(arch)} for arch in archs}
    if match_to is not None:
        target = count_params(arm_model(match_to))["non_embedding"]
        arms["gpt_matched"] = {"model": match_params(for_arch(model, "gpt"), target, by=match_by)}
    for name in controls:
        if name not in CONTROLS:
            raise ValueError(f"control {name!r} is not valid; choose one of {', '.join(map(repr, CONTROLS))}")
        arms[name] = {"model": CONTROLS[name](model)}
    return arms


def arm_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int]) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) for every arm and seed: ``arms`` maps a name to dotted-key overrides
    of ``base`` (``{"node": {"model.arch": "node"}}``, or ``{"wide": {"model": ModelConfig(...)}}``)."""
    seeds = list(seeds)
    if not arms:
        raise ValueError("arms is empty: give at least one {name: overrides}")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    return [(name, seed, with_values(base, {**overrides, "seed": seed})) for name, overrides in arms.items()
            for seed in seeds]


def check_protocol(configs: list[tuple[str, int, TrainConfig]], lr_selection: Mapping[str, float] | None = None) -> None:
    """Raise unless every arm shares the training protocol and the seeds (module docstring).

    Learning rates may differ between arms only as ``lr_selection`` (arm -> selected rate,
    from ``select_lr``) says: with it every arm must run at its selected rate, without it
    every arm at the same rate.
    """
    reference_name, _, reference = configs[0]
    for name, _, tc in configs:
        if lr_selection is not None:
            if name not in lr_selection:
                raise ValueError(f"arm {name!r} has no recorded learning-rate selection; the selection covers "
                                 f"{', '.join(map(repr, lr_selection))}: run select_lr over every arm")
            if not math.isclose(tc.lr, lr_selection[name], rel_tol=1e-12):
                raise ValueError(f"arm {name!r} runs at lr={tc.lr!r} but its recorded selection chose "
                                 f"lr={lr_selection[name]!r}")
        elif tc.lr != reference.lr:
            raise ValueError(f"arm {name!r} changes the learning rate (lr={tc.lr!r}, arm {reference_name!r} "
                             f"lr={reference.lr!r}) without a recorded selection; choose per-arm rates with "
                             "select_lr and pass its table to sweep(lr_selection=...)")
    shared = {k: v for k, v in to_dict(reference).items() if k not in PROTOCOL_EXEMPT}
    for name, _, tc in configs[1:]:
        other = {k: v for k, v in to_dict(tc).items() if k not in PROTOCOL_EXEMPT}
        differ = sorted(k for k in shared if shared[k] != other[k])
        if differ:
            raise ValueError(f"arm {name!r} changes the training protocol ({', '.join(differ)}) relative to arm "
                             f"{reference_name!r}; arms of a comparison may differ only in their model")
    seeds_of: dict[str, set] = {}
    for name, seed, _ in configs:
        seeds_of.setdefault(name, set()).add(seed)
    first = next(iter(seeds_of.values()))
    for name, seeds in seeds_of.items():
        if seeds != first:
            raise ValueError(f"arm {name!r} runs seeds {sorted(seeds)}, others {sorted(first)}: pairing needs the same seeds")


def sweep(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], store: str | Path = DEFAULT_STORE,
          checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
          need_checkpoint: bool = False, lr_selection=None, workers: int = 1, launcher=None,
          wait: bool = True) -> pd.DataFrame:
    """Run every arm with every seed (stored runs are read back) and return one row per run
    (``record_row``), in arm-major order. Stops at the first run that raises; rerunning the
    sweep continues from there, including the interrupted run's checkpoint.

    ``lr_selection`` (``select_lr``'s table, or a mapping arm -> rate) runs each arm at its
    selected learning rate; ``check_protocol`` refuses any other difference in rate.
    ``workers > 1`` trains that many isolated runs at once, each with an equal share of the
    CPU's threads (their timings then describe that sharing, the same for every arm).

    ``launcher`` (a ``launch.Launcher``, or "slurm" / "local" / "auto") submits every run the store
    lacks as its own submitit job and waits for their records (``launch.py``); with ``wait=False``
    it returns at once with ``launch.collect``'s table (finished runs, and the others' status).
    """
    import pandas as pd

    configs, selected = _selected_arm_configs(base, arms, seeds, lr_selection)
    check_protocol(configs, selected)
    records = _run_all([tc for _, _, tc in configs], store, checkpoints, isolate, need_checkpoint, workers,
                       progress, labels=[f"{name} seed {seed}" for name, seed, _ in configs], launcher=launcher,
                       wait=wait)
    if not wait:
        from .launch import collect

        return collect(base, arms, seeds, store, lr_selection)
    return pd.DataFrame([record_row(record, arm=name) for (name, _, _), record in zip(configs, records)])


def _run_all(configs: list[TrainConfig], store, checkpoints, isolate: bool, need_checkpoint: bool, workers: int,
             progress: bool, labels: list[str], launcher=None, wait: bool = True) -> list[RunRecord]:
    """``run`` every config (one at a time, ``workers`` isolated runs at once, or as jobs of a
    ``launcher``); records in the order of ``configs``. A config listed twice is trained once."""
    if launcher is not None:
        from .launch import run_all

        return run_all(configs, store, checkpoints, launcher, need_checkpoint, progress, labels, wait)
    if not wait:
        raise ValueError("wait=False needs a launcher: without one the sweep trains in this process")
    if workers < 1:
        raise ValueError(f"workers={workers!r} is not valid; it must be >= 1")
    if workers > 1 and not isolate:
        raise ValueError("workers > 1 needs isolate=True: runs in one process would share its threads and memory")
    bar = tqdm(total=len(configs), disable=not progress, desc="sweep", unit="run")
    if workers == 1:
        records = []
        for tc, label in zip(configs, labels):
            bar.set_postfix_str(label)
            records.append(run(tc, store, checkpoints, isolate=isolate, need_checkpoint=need_checkpoint))
            bar.update(1)
        bar.close()
        return records
    threads = max(1, (os.cpu_count() or 1) // workers)
    hashes = [with_tokenizer_vocab(tc).config_hash() for tc in configs]
    unique = dict(zip(hashes, configs))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {h: pool.submit(run, tc, store, checkpoints, True, need_checkpoint, threads) for h, tc in unique.items()}
        try:
            for future in concurrent.futures.as_completed(futures.values()):
                future.result()  # the first failure stops the sweep (its children are stopped by run)
                bar.update(1)
        except BaseException:
            for future in futures.values():
                future.cancel()
            raise
        finally:
            bar.close()
    return [futures[h].result() for h in hashes]


# --------------------------------------------------------------------------- learning rates


def select_lr(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs: Iterable[float], seed: int,
              max_steps: int | None = None, store: str | Path = DEFAULT_STORE,
              checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
              workers: int = 1, reported_seeds: Iterable[int] = (), launcher=None) -> pd.DataFrame:
    """Each arm's learning rate, chosen on validation: every arm trained once per rate of
    ``lrs`` with ``seed``, which must not be one of the ``reported_seeds`` (a rate picked on
    the seeds it is then reported on would favour it). ``max_steps`` shortens the runs (the
    schedule is the same shape, ending at ``max_steps``); every run ends with its validation
    loss, and no test loss is looked at.

    Returns one row per (arm, lr): arm, lr, seed, steps, val_loss, config_hash and
    ``selected`` (True for the arm's lowest validation loss; a run that failed is never
    selected). Pass the table to ``sweep(lr_selection=...)``. ``launcher`` as in ``sweep``.
    """
    import pandas as pd

    lrs = sorted(set(float(lr) for lr in lrs))
    if not lrs:
        raise ValueError("lrs is empty: give the learning rates to choose from")
    if seed in set(reported_seeds):
        raise ValueError(f"seed={seed} is one of the reported seeds {sorted(set(reported_seeds))}: select learning "
                         "rates on a seed whose runs are not reported")
    short = with_values(base, {"max_steps": max_steps}) if max_steps is not None else base
    configs = [(name, lr, with_values(short, {**overrides, "lr": lr, "seed": seed}))
               for name, overrides in arms.items() for lr in lrs]
    records = _run_all([tc for _, _, tc in configs], store, checkpoints, isolate, False, workers, progress,
                       labels=[f"{name} lr {lr:g}" for name, lr, _ in configs], launcher=launcher)
    table = pd.DataFrame([{"arm": name, "lr": lr, "seed": seed, "steps": tc.max_steps,
                           "val_loss": record.final.get("val_loss", math.nan) if record.status == "completed" else math.nan,
                           "status": record.status, "config_hash": record.config_hash}
                          for (name, lr, tc), record in zip(configs, records)])
    best = table.assign(rank=table["val_loss"].fillna(math.inf)).groupby("arm", sort=False)["rank"].idxmin()
    table["selected"] = table.index.isin(best.values) & table["val_loss"].notna()
    return table


def _selected_arm_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection
                          ) -> tuple[list[tuple[str, int, TrainConfig]], dict[str, float] | None]:
    """``arm_configs`` with each arm at its selected learning rate (``base.lr`` where the
    selection has none, which ``check_protocol`` then refuses), and the selection as a mapping;
    without a selection, the arms as given and None."""
    if lr_selection is None:
        return arm_configs(base, arms, seeds), None
    selected = selected_lrs(lr_selection)
    arms = {name: {**overrides, "lr": selected.get(name, base.lr)} for name, overrides in arms.items()}
    return arm_configs(base, arms, seeds), selected


def selected_lrs(selection) -> dict[str, float]:
    """arm -> selected learning rate, from ``select_lr``'s table (or a mapping, returned as is)."""
    if isinstance(selection, Mapping):
        return {str(k): float(v) for k, v in selection.items()}
    missing = {"arm", "lr", "selected"} - set(selection.columns)
    if missing:
        raise ValueError(f"the learning-rate selection lacks column(s) {sorted(missing)}; pass select_lr's table")
    chosen = selection[selection["selected"].astype(bool)]
    counts = chosen["arm"].value_counts()
    if (counts > 1).any():
        raise ValueError(f"the selection chose several rates for arm(s) {sorted(counts[counts > 1].index)}")
    return {str(arm): float(lr) for arm, lr in zip(chosen["arm"], chosen["lr"])}


# --------------------------------------------------------------------------- records as tables

# training FLOPs per forward FLOP: the backward pass costs about twice the forward (Kaplan et al.)
TRAIN_FLOPS_PER_FORWARD_FLOP = 3


def record_row(record: RunRecord, arm: str | None = None) -> dict:
    """One flat row of a record: identity, final losses (with perplexity and bits per token),
    parameters, FLOPs and cost."""
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
        "train_flops": TRAIN_FLOPS_PER_FORWARD_FLOP * record.flops_per_token * steps * tc.batch_size * tc.seq_len,
    }
    for split in ("val", "test"):
        loss = row[f"{split}_loss"]
        row[f"{split}_ppl"] = math.exp(loss) if math.isfinite(loss) else math.nan
        row[f"{split}_bits_per_token"] = loss / math.log(2)
    return row


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


def load_records(store: str | Path = DEFAULT_STORE) -> list[RunRecord]:
    """Every record in ``store``, sorted by file name."""
    return [RunRecord.from_json(p) for p in sorted(Path(store).glob("*.json"))]


def curves(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int],
           store: str | Path = DEFAULT_STORE, lr_selection=None) -> pd.DataFrame:
    """Validation curves of a finished sweep, long format: arm, seed, step, tokens,
    train_flops (cumulative training FLOPs: 3x the forward FLOPs per token, for forward and
    backward, times the tokens so far), train_time_s, val_loss (one row per evaluation).
    ``lr_selection`` as given to ``sweep``. Missing runs raise."""
    import pandas as pd

    rows = []
    for name, seed, tc in _selected_arm_configs(base, arms, seeds, lr_selection)[0]:
        record = stored_record(tc, store)
        if record is None:
            raise FileNotFoundError(f"no finished record of arm {name!r} seed {seed} in {store}; run the sweep first")
        tokens_per_step = tc.batch_size * tc.seq_len
        rows += [{"arm": name, "seed": seed, "step": e["step"], "tokens": e["step"] * tokens_per_step,
                  "train_flops": TRAIN_FLOPS_PER_FORWARD_FLOP * record.flops_per_token * e["step"] * tokens_per_step,
                  "train_time_s": e.get("train_time_s", math.nan), "val_loss": e["val_loss"]} for e in record.evals]
    return pd.DataFrame(rows)


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


def stop_when_parent_dies(parent_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM once ``parent_pid`` is no longer its parent.

    An isolated run whose sweep was killed (SIGKILL, a restarted notebook kernel) would otherwise
    train on, orphaned: the sweep's claim names the dead sweep, so a restarted sweep takes it over
    as stale and trains the same hash a second time beside it. The run stops at once instead and
    its last checkpoint resumes it. A daemon thread polls ``os.getppid()`` (an orphan is adopted
    by init or a subreaper), which works on every POSIX system, unlike Linux's PR_SET_PDEATHSIG
    (which also fires when the parent *thread* that started the child exits)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        print(f"the sweep that started this run (pid {parent_pid}) is gone: stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-when-parent-dies", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    """``python -m nodelm_lib.experiment CONFIG.json``: one training run (``run(isolate=True)``'s child)."""
    (config_file,) = argv if argv is not None else sys.argv[1:]
    if os.environ.get(PARENT_ENV):
        stop_when_parent_dies(int(os.environ[PARENT_ENV]))
    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    tc = from_dict(TrainConfig, json.loads(Path(config_file).read_text()))
    try:
        train(tc)
    except Exception as err:  # a failed run wrote its record (status "failed"); the parent reads it
        if getattr(err, "record", None) is None:
            raise
        print(f"run failed: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
