"""Runs x seeds under one comparison protocol: ``nl.sweep(base, arms, seeds)``, learning-rate selection
and the validation curves of a sweep. Each run goes through the run store (``store.py``: read back
if stored, resumed if interrupted).

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

A sweep trains its runs one after another, ``workers`` isolated runs at once, or as jobs of a
cluster launcher (``launch.py``, whose ``launcher=`` every sweep takes).
"""

from __future__ import annotations

import concurrent.futures
import logging
import dataclasses
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
from tqdm import tqdm

from nodelm_lib.config import TONG_HYPERNETWORK, ModelConfig, TrainConfig, for_arch, to_dict, with_values
from nodelm_lib.runs import claims
from nodelm_lib.runs.records import record_row
from nodelm_lib.training.flops import training_flops
from nodelm_lib.runs.store import (DEFAULT_CHECKPOINTS, DEFAULT_STORE, checkpoint_path, finished_record, load_records, run, stored_record)
from nodelm_lib.training.record import RunRecord
from nodelm_lib.training.evaluation import with_tokenizer_vocab

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `import nodelm_lib` stays light (child processes)

log = logging.getLogger(__name__)

# the TrainConfig fields arms may not change: everything but the model and the seed (and the
# learning rate, which check_protocol allows to differ only through a recorded selection)
PROTOCOL_EXEMPT = frozenset({"model", "seed", "out_dir", "checkpoint_interval", "resume", "log_dir", "progress",
                             "data_dir", "device", "lr"})


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
    from nodelm_lib.models import count_params, match_params

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
    it returns at once with ``collect``'s table (finished runs, and the others' status).
    """
    import pandas as pd

    configs, selected = _selected_arm_configs(base, arms, seeds, lr_selection)
    check_protocol(configs, selected)
    records = _run_all([tc for _, _, tc in configs], store, checkpoints, isolate, need_checkpoint, workers,
                       progress, labels=[f"{name} seed {seed}" for name, seed, _ in configs], launcher=launcher,
                       wait=wait)
    if not wait:
        return collect(base, arms, seeds, store, lr_selection)
    return pd.DataFrame([record_row(record, arm=name) for (name, _, _), record in zip(configs, records)])


def with_weights(records: list[RunRecord], needy: list[int], configs: list[TrainConfig], labels: list[str],
                  store, checkpoints, isolate, workers, progress, launcher) -> list[RunRecord]:
    """``records`` with those at the indices ``needy`` run again with ``need_checkpoint``: read
    back where the final model is on disk, else trained again (which rewrites the record). For
    evaluations of final models (depth curves, loss by position) in a clone without the weights."""
    if not needy:
        return records
    retrained = _run_all([configs[i] for i in needy], store, checkpoints, isolate, True, workers, progress,
                         [labels[i] for i in needy], launcher)
    records = list(records)
    for i, record in zip(needy, retrained):
        records[i] = record
    return records


def final_models(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection=None,
                 store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True,
                 workers: int = 1, progress: bool = True, device: str = "cpu") -> tuple[pd.DataFrame, dict]:
    """The trained models of ``sweep(base, arms, seeds, lr_selection=...)``, for analyses of final
    weights (notebook 04 reads notebook 02's runs this way): ``sweep``'s table and
    ``{(arm, seed): model}``, each model loaded from its run's checkpoint on ``device`` in eval mode.

    The same arguments give the same configs, hence the same stored runs: a run whose record and
    weights are on disk is read, one whose weights are not (records are committed, checkpoints
    are not) is trained again (``need_checkpoint``; deterministic, so on the same kind of CPU its
    record keeps its numbers), and a missing run is trained."""
    from nodelm_lib.training.model_files import load_model

    runs = sweep(base, arms, seeds, store=store, checkpoints=checkpoints, isolate=isolate, progress=progress,
                 need_checkpoint=True, lr_selection=lr_selection, workers=workers)
    models = {(row.arm, int(row.seed)): load_model(checkpoint_path(row.config_hash, checkpoints), device=device)
              for row in runs.itertuples()}
    return runs, models


def _run_all(configs: list[TrainConfig], store, checkpoints, isolate: bool, need_checkpoint: bool, workers: int,
             progress: bool, labels: list[str], launcher=None, wait: bool = True) -> list[RunRecord]:
    """``run`` every config (one at a time, ``workers`` isolated runs at once, or as jobs of a
    ``launcher``); records in the order of ``configs``. A config listed twice is trained once."""
    if launcher is not None:
        from nodelm_lib.runs.launch import run_all

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
    to_train = {h: tc for h, tc in unique.items() if finished_record(tc, store, checkpoints, need_checkpoint) is None}
    cost = dict(zip(to_train, expected_seconds(list(to_train.values()), store))) if to_train else {}
    longest_first = sorted(unique, key=lambda h: -cost.get(h, 0.0))  # stored runs (cost 0) return at once
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {h: pool.submit(run, unique[h], store, checkpoints, True, need_checkpoint, threads)
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
    return [futures[h].result() for h in hashes]


def train_all(configs: Iterable[TrainConfig], store: str | Path = DEFAULT_STORE,
              checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, need_checkpoint: bool = False,
              workers: int = 1, progress: bool = True, launcher=None) -> list[RunRecord]:
    """Train every config the store lacks (``run``: each once, in any order) and return the
    records in the order given. With ``workers > 1`` the runs go longest first
    (``expected_seconds``).

    Why it exists: a notebook whose steps each train a set of runs (a learning-rate search
    and its full-length check; ablations and fine-tuning) leaves a worker idle at the end of
    every step while the last run finishes. Passing the union of the independent steps'
    configs here first trains them in one pool; the steps then read their runs back."""
    configs = list(configs)
    return _run_all(configs, store, checkpoints, isolate, need_checkpoint, workers, progress,
                    labels=[f"{tc.model.arch} seed {tc.seed}, {tc.max_steps} steps" for tc in configs], launcher=launcher)


def expected_seconds(configs: list[TrainConfig], store: str | Path = DEFAULT_STORE) -> list[float]:
    """A guess at each config's training time, good enough to order runs by: its steps times
    the seconds per step that the store's records measured for the same model, batch and device
    (a learning-rate search trains every arm of a sweep first), or else its training FLOPs at
    the median seconds per FLOP of those records (FLOPs alone, in arbitrary units, if none)."""
    from nodelm_lib.training.flops import forward_flops

    def key(config: dict) -> str:
        return repr([config["model"], config["batch_size"], config["seq_len"], config["device"], config["dtype"]])

    per_step: dict[str, list[float]] = {}
    per_flop = []
    for record in load_records(store):
        steps, c = len(record.metrics), record.config
        if record.status == "completed" and steps and record.train_time_s > 0 and record.flops_per_token > 0:
            per_step.setdefault(key(c), []).append(record.train_time_s / steps)
            per_flop.append(record.train_time_s / steps / (record.flops_per_token * c["batch_size"] * c["seq_len"]))
    rate = float(np.median(per_flop)) if per_flop else 1.0
    guesses = []
    for tc in configs:
        tc = with_tokenizer_vocab(tc)
        measured = per_step.get(key(to_dict(tc)))
        step = float(np.median(measured)) if measured else rate * forward_flops(tc) * tc.batch_size * tc.seq_len
        guesses.append(tc.max_steps * step)
    return guesses


# --------------------------------------------------------------------------- learning rates


class LRSelectionWarning(UserWarning):
    """A learning-rate choice that its own selection runs cannot tell from the runner-up."""


def select_lr(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed: int | Iterable[int],
              max_steps: int | None = None, store: str | Path = DEFAULT_STORE,
              checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
              workers: int = 1, reported_seeds: Iterable[int] = (), launcher=None) -> pd.DataFrame:
    """Each arm's learning rate, chosen on validation: every arm trained once per rate of
    ``lrs`` (one grid for every arm, or a mapping arm -> its own grid) and per selection seed
    (``seed``: one seed or several, none of them one of the ``reported_seeds``: a rate picked on
    the seeds it is then reported on would favour it). ``max_steps`` shortens the runs (the
    schedule is the same shape, ending at ``max_steps``); every run ends with its validation
    loss, and no test loss is looked at.

    Returns one row per (arm, lr): arm, lr, seed (the first selection seed), seeds (all of
    them, space-separated), n_seeds, steps, val_loss (the mean over the selection seeds; NaN
    if any of its runs failed), val_loss_sd (their sample SD), status, config_hash (the first
    seed's run), config_hashes (every seed's), ``selected`` (True for the arm's lowest mean
    validation loss; a failed rate is never selected) and, the same on every row of an arm,
    its selection margin: ``margin`` (the runner-up's mean minus the best's), ``margin_sd`` (the
    sample SD over seeds of that difference, seed by seed) and ``within_noise`` (margin <=
    margin_sd: the seeds cannot tell the two rates apart; ``LRSelectionWarning`` names such
    arms). Pass the table to ``sweep(lr_selection=...)``. ``launcher`` as in ``sweep``.
    """
    seeds = _selection_seeds(seed, reported_seeds)
    configs = lr_search_configs(base, arms, lrs, seeds, max_steps)
    records = _run_all([tc for *_, tc in configs], store, checkpoints, isolate, False, workers, progress,
                       labels=[f"{name} lr {lr:g} seed {s}" for name, lr, s, _ in configs], launcher=launcher)
    return selection_table([(name, lr, s, tc.max_steps, record) for (name, lr, s, tc), record in zip(configs, records)])


def _selection_seeds(seed, reported_seeds) -> list[int]:
    seeds = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
    if not seeds:
        raise ValueError("seed is empty: give the selection seed(s)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"selection seeds {seeds} repeat a seed")
    clash = sorted(set(seeds) & set(reported_seeds))
    if clash:
        raise ValueError(f"seed={clash[0]} is one of the reported seeds {sorted(set(reported_seeds))}: select learning "
                         "rates on a seed whose runs are not reported")
    return seeds


def selection_table(runs: Iterable[tuple[str, float, int, int, RunRecord]]) -> pd.DataFrame:
    """``select_lr``'s table from its runs: (arm, lr, seed, steps, record) of each."""
    import pandas as pd

    long = pd.DataFrame([{"arm": name, "lr": lr, "seed": s, "steps": steps, "status": record.status,
                          "val_loss": record.final.get("val_loss", math.nan) if record.status == "completed" else math.nan,
                          "config_hash": record.config_hash} for name, lr, s, steps, record in runs])
    rows = []
    for (arm, lr), group in long.groupby(["arm", "lr"], sort=False):
        losses = group["val_loss"].to_numpy(float)
        rows.append({"arm": arm, "lr": lr, "seed": int(group["seed"].iloc[0]),
                     "seeds": " ".join(str(int(s)) for s in group["seed"]), "n_seeds": len(group),
                     "steps": int(group["steps"].iloc[0]), "val_loss": float(np.mean(losses)),
                     "val_loss_sd": float(np.std(losses, ddof=1)) if len(losses) > 1 else math.nan,
                     "status": "completed" if (group["status"] == "completed").all() else
                     next(s for s in group["status"] if s != "completed"),
                     "config_hash": group["config_hash"].iloc[0], "config_hashes": " ".join(group["config_hash"])})
    table = pd.DataFrame(rows)
    best = table.assign(rank=table["val_loss"].fillna(math.inf)).groupby("arm", sort=False)["rank"].idxmin()
    table["selected"] = table.index.isin(best.values) & table["val_loss"].notna()
    margins = {arm: _selection_margin(long[long["arm"] == arm], group) for arm, group in table.groupby("arm", sort=False)}
    for i, key in enumerate(("margin", "margin_sd", "within_noise")):
        table[key] = table["arm"].map({arm: m[i] for arm, m in margins.items()})
    noisy = {arm: m for arm, m in margins.items() if m[2] is True}
    if noisy:
        warnings.warn(LRSelectionWarning(
            "the learning-rate selection cannot tell the best rate from the runner-up for " +
            "; ".join(f"{arm} (margin {m[0]:.4f} <= seed SD {m[1]:.4f})" for arm, m in noisy.items()) +
            ": add selection seeds or longer selection runs, or report the choice as uncertain"), stacklevel=3)
    return table


def _selection_margin(long: pd.DataFrame, table: pd.DataFrame) -> tuple[float, float, bool | None]:
    """(margin, margin_sd, within_noise) of one arm: the runner-up's mean validation loss minus
    the best's, the sample SD over seeds of that difference, and whether the margin is inside
    it (None with one seed, or fewer than two completed rates)."""
    done = table[table["val_loss"].notna()].sort_values("val_loss")
    if len(done) < 2:
        return math.nan, math.nan, None
    best, runner_up = (long[long["lr"] == lr].set_index("seed")["val_loss"] for lr in done["lr"].iloc[:2])
    margin = float(done["val_loss"].iloc[1] - done["val_loss"].iloc[0])
    if len(best) < 2:
        return margin, math.nan, None
    sd = float(np.std((runner_up - best).to_numpy(float), ddof=1))
    return margin, sd, bool(margin <= sd)


def lr_search_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed: int | Iterable[int],
                      max_steps: int | None = None) -> list[tuple[str, float, int, TrainConfig]]:
    """(arm, lr, seed, config) of every run ``select_lr`` trains (``train_all`` can train them
    together with another step's runs). ``lrs``: one grid, or a mapping arm -> grid."""
    seeds = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
    short = with_values(base, {"max_steps": max_steps}) if max_steps is not None else base
    grids = arm_grids(arms, lrs)
    return [(name, lr, s, with_values(short, {**overrides, "lr": lr, "seed": s}))
            for name, overrides in arms.items() for lr in grids[name] for s in seeds]


def arm_grids(arms: Iterable[str], lrs) -> dict[str, list[float]]:
    """arm -> its sorted learning-rate grid, from one grid for every arm or a mapping arm -> grid."""
    arms = list(arms)
    if isinstance(lrs, Mapping):
        missing = [a for a in arms if a not in lrs]
        if missing:
            raise ValueError(f"the learning-rate grids lack arm(s) {missing}; they cover {', '.join(map(repr, lrs))}")
        grids = {a: sorted(set(float(lr) for lr in lrs[a])) for a in arms}
    else:
        grid = sorted(set(float(lr) for lr in lrs))
        grids = {a: grid for a in arms}
    for arm, grid in grids.items():
        if not grid:
            raise ValueError(f"lrs is empty for arm {arm!r}: give the learning rates to choose from")
        bad = [lr for lr in grid if not (math.isfinite(lr) and lr > 0)]
        if bad:
            raise ValueError(f"learning rate(s) {bad} of arm {arm!r} are not valid; each must be finite and > 0")
    return grids


def selection_grids(selection: pd.DataFrame) -> dict[str, list[float]]:
    """arm -> the rates ``select_lr``'s table searched for it (its grid after any refinement)."""
    return {str(arm): sorted(float(lr) for lr in rates) for arm, rates in selection.groupby("arm", sort=False)["lr"]}


def refine_lr_grids(selection: pd.DataFrame, cliff_loss: float | None = None, cliff_margin: float = 0.05,
                    min_ratio: float = 1.9) -> dict[str, list[float]]:
    """arm -> rates to add to its grid, from ``select_lr``'s table (empty when no grid needs more):
    - a best rate at an edge of its grid gets the next rate outward (the grid's spacing);
    - a best rate whose next rate up is a *cliff* (a failed run, or a mean validation loss at or
      above ``cliff_loss - cliff_margin``, e.g. the bigram model's: the run learnt nothing past
      character pairs) gets the half-steps (geometric midpoints) to both neighbours, where those
      are still ``min_ratio`` or more apart (so a grid is refined once, not forever)."""
    add: dict[str, list[float]] = {}
    chosen = selected_lrs(selection)
    for arm, group in selection.groupby("arm", sort=False):
        if arm not in chosen:
            continue
        group = group.sort_values("lr")
        rates, best = group["lr"].to_numpy(float), chosen[arm]
        i = int(np.flatnonzero(np.isclose(rates, best, rtol=1e-9))[0])
        extra = []
        if len(rates) > 1 and i in (0, len(rates) - 1):
            step = rates[1] / rates[0] if i == 0 else rates[-1] / rates[-2]
            extra.append(best / step if i == 0 else best * step)
        if i + 1 < len(rates):
            above = group.iloc[i + 1]
            cliff = (above["status"] != "completed" or not math.isfinite(above["val_loss"])
                     or (cliff_loss is not None and above["val_loss"] >= cliff_loss - cliff_margin))
            if cliff:
                extra += [math.sqrt(best * r) for r in rates[[j for j in (i - 1, i + 1) if 0 <= j < len(rates)]]
                          if max(r, best) / min(r, best) >= min_ratio]
        extra = [float(f"{lr:.6g}") for lr in extra if not np.isclose(rates, lr, rtol=1e-6).any()]
        if extra:
            add[str(arm)] = sorted(extra)
    return add


def select_lr_refined(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed, max_refinements: int = 3,
                      cliff_loss: float | None = None, **options) -> pd.DataFrame:
    """``select_lr``, then its grids grown by ``refine_lr_grids`` (outward from an edge, half-steps
    beside a cliff) and searched again, until no grid needs more or ``max_refinements`` rounds
    ran (0: ``select_lr`` alone). Every round reads the runs it already has from the store.
    ``options`` go to ``select_lr``."""
    if max_refinements < 0:
        raise ValueError(f"max_refinements={max_refinements!r} is not valid; it must be >= 0")
    grids = arm_grids(arms, lrs)
    for _ in range(max_refinements):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LRSelectionWarning)  # the final table warns
            selection = select_lr(base, arms, grids, seed, **options)
        extra = refine_lr_grids(selection, cliff_loss=cliff_loss)
        if not extra:
            break
        grids = {arm: sorted(set(grid) | set(extra.get(arm, ()))) for arm, grid in grids.items()}
    return select_lr(base, arms, grids, seed, **options)


def sweep_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection=None
                  ) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) of every run ``sweep`` trains with these arguments."""
    return _selected_arm_configs(base, arms, seeds, lr_selection)[0]


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
    """arm -> selected learning rate, from ``select_lr``'s table, the path of its CSV file (a
    notebook's ``<stem>_lr_selection.csv``), or a mapping arm -> rate (returned as is)."""
    if isinstance(selection, Mapping):
        return {str(k): float(v) for k, v in selection.items()}
    if isinstance(selection, (str, Path)):
        import pandas as pd

        path = Path(selection)
        if not path.is_file():
            raise FileNotFoundError(f"no learning-rate selection at {path}: run the notebook that selects the rates "
                                    "(02) with this profile first, or give the rates as a mapping arm -> rate")
        selection = pd.read_csv(path)
    missing = {"arm", "lr", "selected"} - set(selection.columns)
    if missing:
        raise ValueError(f"the learning-rate selection lacks column(s) {sorted(missing)}; pass select_lr's table")
    chosen = selection[selection["selected"].astype(bool)]
    counts = chosen["arm"].value_counts()
    if (counts > 1).any():
        raise ValueError(f"the selection chose several rates for arm(s) {sorted(counts[counts > 1].index)}")
    return {str(arm): float(lr) for arm, lr in zip(chosen["arm"], chosen["lr"])}


def rates_at_grid_edge(selection) -> dict[str, float]:
    """arm -> selected rate, for every arm of ``select_lr``'s table whose selected rate is the lowest
    or the highest it was trained at (with more than one rate): its best may lie outside the grid,
    which should then be widened on that side. Empty when every choice is inside its grid."""
    chosen = selected_lrs(selection)
    edges = {}
    for arm, rates in selection.groupby("arm", sort=False)["lr"]:
        if arm in chosen and rates.nunique() > 1 and chosen[arm] in (rates.min(), rates.max()):
            edges[str(arm)] = chosen[arm]
    return edges


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
                  "train_flops": training_flops(record.flops_per_token, e["step"] * tokens_per_step),
                  "train_time_s": e.get("train_time_s", math.nan), "val_loss": e["val_loss"]} for e in record.evals]
    return pd.DataFrame(rows)


def collect(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], store: str | Path,
            lr_selection=None) -> pd.DataFrame:
    """The sweep's table as the store holds it now, while its jobs may still run: ``record_row``
    for every finished run, and for the others a row with status "running" (``claimed_by`` names
    the worker) or "missing". Logs which runs are not finished."""
    import pandas as pd

    rows, waiting = [], []
    for name, seed, tc in _selected_arm_configs(base, arms, seeds, lr_selection)[0]:
        record = stored_record(tc, store)
        if record is not None:
            rows.append(record_row(record, arm=name))
            continue
        config_hash = with_tokenizer_vocab(tc).config_hash()
        holder = claims.read_claim(store, config_hash)
        live = holder is not None and not claims.is_stale(holder)
        rows.append({"arm": name, "seed": seed, "arch": tc.model.arch, "config_hash": config_hash,
                     "status": "running" if live else "missing",
                     "claimed_by": claims.describe(holder) if live else None})
        waiting.append(f"{name} seed {seed} ({rows[-1]['status']}" + (f" on {rows[-1]['claimed_by']})" if live else ")"))
    if waiting:
        log.info("%d of %d runs finished; not yet: %s", len(rows) - len(waiting), len(rows), "; ".join(waiting))
    return pd.DataFrame(rows)
