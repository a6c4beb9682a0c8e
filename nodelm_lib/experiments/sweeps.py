"""Runs x seeds under one comparison protocol (``protocol.py``): ``nl.sweep(base, arms, seeds)``,
the final models of a sweep, its validation curves, and training many configs at once
(``train_all``). Each run goes through the run store (``runs/store.py``: read back if stored,
resumed if interrupted).

A sweep trains its runs one after another, ``workers`` isolated runs at once, or as jobs of a
cluster launcher (``runs/launch.py``, whose ``launcher=`` every sweep takes).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
from tqdm import tqdm

from nodelm_lib.config import TrainConfig
from nodelm_lib.runs import claims
from nodelm_lib.runs.budget import BudgetReached
from nodelm_lib.runs.final_weights import FinalWeights
from nodelm_lib.runs.records import record_row
from nodelm_lib.runs.store import (DEFAULT_CHECKPOINTS, DEFAULT_STORE, checkpoint_path, finished_record, load_records,
                                   run, run_hash, stored_record)
from nodelm_lib.runs.timing import as_recorded, run_times
from nodelm_lib.training.flops import forward_flops, training_flops
from nodelm_lib.training.record import RunRecord

from .protocol import check_protocol, selected_arm_configs

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `import nodelm_lib` stays light (child processes)

log = logging.getLogger(__name__)


def sweep(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], store: str | Path = DEFAULT_STORE,
          checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
          need_checkpoint: bool = False, lr_selection=None, workers: int | str = 1, launcher=None,
          wait: bool = True) -> pd.DataFrame:
    """Run every arm with every seed (stored runs are read back) and return one row per run
    (``record_row``), in arm-major order. Stops at the first run that raises; rerunning the
    sweep continues from there, including the interrupted run's checkpoint.

    ``lr_selection`` (``lr_selection.select_lr``'s table, or a mapping arm -> rate) runs each arm
    at its selected learning rate; ``check_protocol`` refuses any other difference in rate.
    ``workers > 1`` trains that many isolated runs at once, each with an equal share of the
    CPU's threads (their timings then describe that sharing, the same for every arm); on a GPU
    they share the device (``workers="auto"``: as many as its free memory holds, ``auto_workers``).

    ``launcher`` (a ``launch.Launcher``, or "slurm" / "local" / "auto") submits every run the store
    lacks as its own submitit job and waits for their records (``launch.py``); with ``wait=False``
    it returns at once with ``collect``'s table (finished runs, and the others' status).
    """
    import pandas as pd

    configs, selected = selected_arm_configs(base, arms, seeds, lr_selection)
    check_protocol(configs, selected)
    records = train_all([tc for _, _, tc in configs], store, checkpoints, isolate, need_checkpoint, workers, progress,
                        launcher, labels=[f"{name} seed {seed}" for name, seed, _ in configs], wait=wait)
    if not wait:
        return collect(base, arms, seeds, store, lr_selection)
    return pd.DataFrame([record_row(record, arm=name) for (name, _, _), record in zip(configs, records)])


def with_weights(records: list[RunRecord], needy: list[int], configs: list[TrainConfig], labels: list[str],
                  store, checkpoints, isolate, workers, progress, launcher) -> list[RunRecord]:
    """``records`` with those at the indices ``needy`` run again with ``need_checkpoint``: read
    back where the final model is on disk, else trained again. Each becomes the record of the
    weights on disk: the stored one, or, where a retraining ended elsewhere (another kind of CPU),
    that retraining's, kept in the side store (``store.evaluations_store`` says where evaluations of
    it belong). For evaluations of final models (depth curves, loss by position) in a clone without
    the weights."""
    if not needy:
        return records
    retrained = train_all([configs[i] for i in needy], store, checkpoints, isolate, True, workers, progress, launcher,
                          labels=[labels[i] for i in needy])
    records = list(records)
    for i, record in zip(needy, retrained):
        records[i] = record
    return records


def with_weights_where_missing(models: Iterable[tuple[str, RunRecord]], missing: Callable[[RunRecord], bool],
                               store, checkpoints, isolate, workers, progress, launcher) -> list[RunRecord]:
    """The records of ``models`` ((arm name, record) pairs), each run whose evaluation is not
    stored (``missing(record)``) and whose final model is not on disk first run again
    (``with_weights``): what an evaluation of final models needs in a clone without the weights."""
    arms, records = zip(*models)
    needy = [i for i, record in enumerate(records)
             if missing(record) and not checkpoint_path(record.config_hash, checkpoints).exists()]
    return with_weights(list(records), needy, [r.train_config for r in records],
                        [f"{arm} seed {r.seed}" for arm, r in zip(arms, records)], store, checkpoints, isolate,
                        workers, progress, launcher)


def final_weights(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection=None,
                  store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True,
                  workers: int | str = 1, progress: bool = True, device: str = "cpu",
                  needs: Callable[[str, int], Iterable[str]] | None = None) -> tuple[pd.DataFrame, dict]:
    """``sweep(base, arms, seeds, lr_selection=...)``'s table and ``{(arm, seed): FinalWeights}``:
    each run's final weights and where evaluations of them are kept (``runs/final_weights.py``),
    for analyses of final weights (notebook 04 reads notebook 02's runs this way).

    ``needs(arm, seed)`` names the evaluations (keys) an analysis will ask of the run: a run whose
    store keeps them all needs no weights, and a clone rebuilds the analysis from them, training
    nothing. Without ``needs`` every run's weights are on disk when this returns.

    The same arguments give the same configs, hence the same stored runs: a missing run is
    trained (into ``store``). A stored run whose weights are needed but not on disk (records are
    committed, checkpoints are not) is trained again for its weights alone, its record kept in a
    side store under ``checkpoints`` (``store.weights_store``) where it ends elsewhere; the table comes from
    ``store``'s record, which stays as it is. On the same kind of CPU the retraining reproduces it;
    on another it ends elsewhere (up to ~0.01 nats after 2000 steps), and replacing the stored
    record would leave every table that reads the run (02's, 07's) with records of two CPUs, which
    they refuse (``check_provenance``). A warning names the runs whose weights are not the stored
    training."""
    runs = sweep(base, arms, seeds, store=store, checkpoints=checkpoints, isolate=isolate, progress=progress,
                 lr_selection=lr_selection, workers=workers)
    configs, _ = selected_arm_configs(base, arms, seeds, lr_selection)
    stored = [stored_record(tc, store) for _, _, tc in configs]

    def where(i: int) -> FinalWeights | None:
        arm, seed, _ = configs[i]
        return FinalWeights.of(stored[i], store, checkpoints, device, needs(arm, seed) if needs else ())

    found = [where(i) for i in range(len(configs))]
    needy = [i for i, weights in enumerate(found) if weights is None]
    if needy:
        train_all([configs[i][2] for i in needy], store, checkpoints, isolate, True, workers, progress,
                  labels=[f"{configs[i][0]} seed {configs[i][1]} (weights)" for i in needy])
        found = [weights if weights is not None else where(i) for i, weights in enumerate(found)]
    moved = [f"{arm} seed {seed}: {weights.record.final.get('val_loss'):.4f} against {record.final.get('val_loss'):.4f}"
             for (arm, seed, _), weights, record in zip(configs, found, stored)
             if weights.store != Path(store)]  # the side store: a retraining that ended elsewhere
    if moved:
        log.warning("runs trained again for their weights ended elsewhere than their stored records (another kind "
                    "of CPU?); the tables keep the stored records, the analyses use these weights (final "
                    "validation loss, retrained against stored): %s", "; ".join(moved))
    return runs, {(arm, seed): weights for (arm, seed, _), weights in zip(configs, found)}


def final_models(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection=None,
                 store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True,
                 workers: int | str = 1, progress: bool = True, device: str = "cpu") -> tuple[pd.DataFrame, dict]:
    """``final_weights`` without ``needs``, every model loaded: ``sweep``'s table and
    ``{(arm, seed): model}``, each model on ``device`` in eval mode."""
    runs, weights = final_weights(base, arms, seeds, lr_selection, store, checkpoints, isolate, workers, progress,
                                  device)
    return runs, {run: w.model() for run, w in weights.items()}


def train_all(configs: Iterable[TrainConfig], store: str | Path = DEFAULT_STORE,
              checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, need_checkpoint: bool = False,
              workers: int | str = 1, progress: bool = True, launcher=None, labels: Iterable[str] | None = None,
              wait: bool = True) -> list[RunRecord]:
    """Train every config the store lacks (``run``: each once, in any order) and return the
    records in the order given: one run at a time, ``workers`` isolated runs at once (longest
    first, ``expected_seconds``), or as jobs of a ``launcher`` (``launch.run_all``; with
    ``wait=False`` it returns at once, None for each run not finished yet). A config listed
    twice is trained once. ``labels`` name the runs on the progress bar (default: arch, seed
    and steps). Every sweep of ``experiments`` trains its runs here.

    Why a caller outside a sweep uses it: a notebook whose steps each train a set of runs (a
    learning-rate search and its full-length check; ablations and fine-tuning) leaves a worker
    idle at the end of every step while the last run finishes. Passing the union of the
    independent steps' configs here first trains them in one pool; the steps then read their
    runs back."""
    configs = list(configs)
    labels = (list(labels) if labels is not None
              else [f"{tc.model.arch} seed {tc.seed}, {tc.max_steps} steps" for tc in configs])
    if launcher is not None:
        from nodelm_lib.runs.launch import run_all

        return run_all(configs, store, checkpoints, launcher, need_checkpoint, progress, labels, wait)
    if not wait:
        raise ValueError("wait=False needs a launcher: without one the sweep trains in this process")
    workers = resolve_workers(workers, configs, store)
    if workers > 1 and not isolate:
        raise ValueError("workers > 1 needs isolate=True: runs in one process would share its threads and memory")
    bar = tqdm(total=len(configs), disable=not progress, desc="sweep", unit="run")
    not_started: list[str] = []  # runs that did not fit in a time budget (budget.py)

    def run_if_it_fits(*args) -> RunRecord | None:
        try:
            return run(*args)
        except BudgetReached as err:  # a later, shorter run may still fit: go on, then say what was left
            not_started.append(str(err))
            return None

    if workers == 1:
        records = []
        for tc, label in zip(configs, labels):
            bar.set_postfix_str(label)
            records.append(run_if_it_fits(tc, store, checkpoints, isolate, need_checkpoint))
            bar.update(1)
        bar.close()
        _stop_if_not_started(not_started)
        return records
    threads = max(1, (os.cpu_count() or 1) // workers)
    hashes = [run_hash(tc) for tc in configs]
    unique = dict(zip(hashes, configs))
    to_train = {h: tc for h, tc in unique.items() if finished_record(tc, store, checkpoints, need_checkpoint) is None}
    cost = dict(zip(to_train, expected_seconds(list(to_train.values()), store))) if to_train else {}
    longest_first = sorted(unique, key=lambda h: -cost.get(h, 0.0))  # stored runs (cost 0) return at once
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {h: pool.submit(run_if_it_fits, unique[h], store, checkpoints, True, need_checkpoint, threads)
                   for h in longest_first}
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
    _stop_if_not_started(not_started)
    return [futures[h].result() for h in hashes]


def _stop_if_not_started(not_started: list[str]) -> None:
    """Raise ``BudgetReached`` naming the runs left for the next chunk, after the ones that fit."""
    if not_started:
        raise BudgetReached(f"{len(not_started)} run(s) did not fit in the time budget and were not started (the "
                            f"next chunk trains them); the first: {not_started[0]}")


MAX_AUTO_WORKERS = 8  # past this, runs sharing one device gain little and contend for its host's cores
RUN_MEMORY_HEADROOM = 1.25  # a run's measured peak is its allocations; the allocator's cache adds to them
UNMEASURED_RUN_MB = 4096.0  # a CUDA run no stored record has measured is assumed to take this much


def resolve_workers(workers: int | str, configs: list[TrainConfig], store: str | Path = DEFAULT_STORE) -> int:
    """``workers`` as a count: an integer >= 1 as it is, "auto" as ``auto_workers`` sizes it for
    ``configs``; anything else is a ValueError naming the valid choices."""
    if workers == "auto":
        return auto_workers(configs, store)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is not valid; it must be an integer >= 1 or 'auto'")
    return workers


def auto_workers(configs: list[TrainConfig], store: str | Path = DEFAULT_STORE, free_mb: float | None = None) -> int:
    """How many runs of ``configs`` to train at once: on CUDA, as many as fit in the device's free
    memory (``free_mb``, default: now), each taking the largest peak that the store's records
    measured for a config of the same model, batch and shape (``UNMEASURED_RUN_MB`` if none), times
    ``RUN_MEMORY_HEADROOM``; on a CPU, one per core (each run one thread). Between 1 and
    ``MAX_AUTO_WORKERS``. Why several on one GPU: runs of this project's sizes are bound by kernel
    launches, leaving most of the device idle, so runs side by side add throughput."""
    import torch

    devices = {tc.device for tc in configs}
    if not any(d.startswith("cuda") or (d == "auto" and torch.cuda.is_available()) for d in devices):
        return max(1, min(MAX_AUTO_WORKERS, os.cpu_count() or 1))
    if free_mb is None:
        free_mb = torch.cuda.mem_get_info()[0] / 2**20
    peaks: dict[str, float] = {}
    for record in load_records(store):
        if record.peak_memory_mb and record.status == "completed":
            key = _memory_key(record.config)
            peaks[key] = max(peaks.get(key, 0.0), record.peak_memory_mb)
    per_run = max(peaks.get(_memory_key(as_recorded(tc)), UNMEASURED_RUN_MB) for tc in configs)
    return int(max(1, min(MAX_AUTO_WORKERS, free_mb // (per_run * RUN_MEMORY_HEADROOM))))


def _memory_key(config: dict) -> str:
    return repr([config["model"], config["batch_size"], config["seq_len"], config["dtype"]])


def expected_seconds(configs: list[TrainConfig], store: str | Path = DEFAULT_STORE) -> list[float]:
    """A guess at each config's run time, good enough to order runs by: its steps times its seconds
    per step plus its scoring, as ``runs.timing.run_times`` reads them from the store's records (the
    same model measured, else scaled by FLOPs from another width or from ``gpt``). A config with
    neither is priced by its training FLOPs at the median seconds per FLOP of the others (FLOPs
    alone, in arbitrary units, where none has a record)."""
    if not configs:
        return []
    seconds = run_times(configs, load_records(store, cached=True))["seconds"].to_numpy(float)
    known = np.isfinite(seconds)
    if not known.all():
        flops = np.array([forward_flops(tc) * tc.batch_size * tc.seq_len * tc.max_steps for tc in configs])
        rate = float(np.median(seconds[known] / flops[known])) if known.any() else 1.0
        seconds = np.where(known, seconds, rate * flops)
    return [float(s) for s in seconds]


def curves(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int],
           store: str | Path = DEFAULT_STORE, lr_selection=None) -> pd.DataFrame:
    """Validation curves of a finished sweep, long format: arm, seed, step, tokens,
    train_flops (cumulative training FLOPs: 3x the forward FLOPs per token, for forward and
    backward, times the tokens so far), train_time_s, val_loss (one row per evaluation).
    ``lr_selection`` as given to ``sweep``. Missing runs raise."""
    import pandas as pd

    rows = []
    for name, seed, tc in selected_arm_configs(base, arms, seeds, lr_selection)[0]:
        record = stored_record(tc, store)
        if record is None:
            raise FileNotFoundError(f"no finished record of arm {name!r} seed {seed} in {store}; run the sweep first")
        tokens_per_step = tc.batch_size * tc.seq_len
        rows += [{"arm": name, "seed": seed, "step": e["step"], "tokens": e["step"] * tokens_per_step,
                  "train_flops": training_flops(record.step_flops_per_token, e["step"] * tokens_per_step),
                  "train_time_s": e.get("train_time_s", math.nan), "val_loss": e["val_loss"]} for e in record.evals]
    return pd.DataFrame(rows)


def collect(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], store: str | Path,
            lr_selection=None) -> pd.DataFrame:
    """The sweep's table as the store holds it now, while its jobs may still run: ``record_row``
    for every finished run, and for the others a row with status "running" (``claimed_by`` names
    the worker) or "missing". Logs which runs are not finished."""
    import pandas as pd

    rows, waiting = [], []
    for name, seed, tc in selected_arm_configs(base, arms, seeds, lr_selection)[0]:
        record = stored_record(tc, store)
        if record is not None:
            rows.append(record_row(record, arm=name))
            continue
        config_hash = run_hash(tc)
        holder = claims.read_claim(store, config_hash)
        live = holder is not None and not claims.is_stale(holder)
        rows.append({"arm": name, "seed": seed, "arch": tc.model.arch, "config_hash": config_hash,
                     "status": "running" if live else "missing",
                     "claimed_by": claims.describe(holder) if live else None})
        waiting.append(f"{name} seed {seed} ({rows[-1]['status']}" + (f" on {rows[-1]['claimed_by']})" if live else ")"))
    if waiting:
        log.info("%d of %d runs finished; not yet: %s", len(rows) - len(waiting), len(rows), "; ".join(waiting))
    return pd.DataFrame(rows)
