"""Notebook 03's experiments on the time-indexed models: ablations, depth curves, and
fine-tuning at another depth.

- ``ablation_arms``: the arms of each ablation of a ``ti_mlp`` (modulation, integration,
  solver x steps, the ``ti_ssm`` state size), run with ``sweeps.sweep``;
- ``depth_curve``: a trained continuous-depth model solved with other numbers of steps and
  other solvers than it was trained with (each point kept beside the run's record, so that a
  clone without the weights reads it back: ``store.write_evaluations``);
- ``depth_transfer``: Tong et al.'s adaptive-depth experiment: a model trained at n steps is
  (a) evaluated at m steps, (b) fine-tuned at m steps for a short budget, and compared with
  (c) models trained from scratch at m steps for the same short budget and for the full one.

A continuous-depth model's weights do not depend on its number of solver steps (the depth is
the grid the flow is solved on), so "the same model at another depth" is well defined:
``at_depth``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch

from nodelm_lib import families
from nodelm_lib.config import ModelConfig, TrainConfig, for_arch, with_values
from nodelm_lib.runs.store import (DEFAULT_CHECKPOINTS, DEFAULT_STORE, checkpoint_path, evaluations_store,
                                   read_evaluations, run_hash, stored_record, write_evaluations)
from nodelm_lib.training.evaluation import evaluate, final_eval_batches
from nodelm_lib.training.flops import model_with_vocab
from nodelm_lib.training.record import RunRecord

from .protocol import selected_lrs, sweep_configs
from .sweeps import train_all, with_weights, with_weights_where_missing

if TYPE_CHECKING:
    import pandas as pd

def at_depth(model: ModelConfig, n_steps: int, method: str | None = None) -> ModelConfig:
    """``model`` solved with ``n_steps`` steps (of ``method``, default its own): its depth
    (``n_layers``) is the number of steps. The weights are the same for every depth."""
    if not families.get(model.arch).continuous:
        raise ValueError(f"at_depth needs a continuous-depth arch ({', '.join(families.names(continuous=True))}), "
                         f"got {model.arch!r}")
    ode = dataclasses.replace(model.ode, method=method or model.ode.method, n_steps=n_steps)
    return dataclasses.replace(model, n_layers=n_steps, ode=ode)


def _steps_of(steps: Iterable[int] | Mapping[str, Iterable[int]], solver: str) -> list[int]:
    return list(steps[solver]) if isinstance(steps, Mapping) else list(steps)


def ablation_arms(model: ModelConfig, steps: Iterable[int] | Mapping[str, Iterable[int]] = (2, 4, 8),
                  solvers: Iterable[str] = ("euler", "rk4"),
                  state_sizes: Iterable[int] = (16, 32, 64)) -> dict[str, tuple[str, dict[str, dict[str, Any]]]]:
    """The ablations of a time-indexed model ``model`` (a ``ti_mlp`` config), each as
    ``{ablation: (reference arm, arms)}``:

    - ``modulation``: weights modulated in t (``time``) vs shown t = 0 throughout (``constant``);
    - ``integration``: x + dt f(t, x) (``ode``) vs x + f(t, x) (``residual``);
    - ``steps_solver``: ``<solver> <n>`` for every solver and number of steps n (the depth);
      ``steps`` is one list for every solver or a mapping solver -> list;
    - ``state_size``: ``ti_ssm`` with state size ``N=<n>`` (the MLP replaced by the SSM).

    The references are ``model`` itself and ``ti_ssm`` at ``model.ssm_state_size`` (both must
    be among the arms), so arms shared between ablations, or with notebook 02's ``ti_mlp`` and
    ``ti_ssm`` arms of the same shape, are one run.
    """
    if model.arch != "ti_mlp":
        raise ValueError(f"the ablations are defined on model.arch='ti_mlp', got {model.arch!r}")
    base = {"model": model}
    solvers, state_sizes = list(solvers), list(state_sizes)
    depth = {f"{solver} {n}": {"model": at_depth(model, n, solver)} for solver in solvers
             for n in _steps_of(steps, solver)}
    ssm = for_arch(model, "ti_ssm")
    sizes = {f"N={n}": {"model": dataclasses.replace(ssm, ssm_state_size=n)} for n in state_sizes}
    reference_depth = f"{model.ode.method} {model.n_layers}"
    if reference_depth not in depth:
        raise ValueError(f"the model's own solver and depth ({reference_depth!r}) must be among the "
                         f"steps_solver arms {list(depth)}")
    reference_size = f"N={model.ssm_state_size}"
    if reference_size not in sizes:
        raise ValueError(f"the model's own state size ({reference_size!r}) must be among the state_size arms "
                         f"{list(sizes)}")
    return {
        "modulation": ("time", {"time": base, "constant": {"model": dataclasses.replace(model, modulation="constant")}}),
        "integration": ("ode", {"ode": base, "residual": {"model": dataclasses.replace(model, integration="residual")}}),
        "steps_solver": (reference_depth, depth),
        "state_size": (reference_size, sizes),
    }


def inherited_lrs(arms: Mapping[str, Mapping[str, Any]], selection) -> dict[str, float]:
    """arm -> learning rate: every arm at the rate selected for its architecture (``selection``:
    ``lr_selection.select_lr``'s table or a mapping arch -> rate), e.g. every ``ti_mlp`` variant
    at ``ti_mlp``'s rate. Pass it to ``sweep(lr_selection=...)``."""
    chosen = selected_lrs(selection)
    rates = {}
    for name, overrides in arms.items():
        arch = overrides["model"].arch
        if arch not in chosen:
            raise ValueError(f"arm {name!r} is a {arch!r}, for which the selection has no rate; it covers "
                             f"{', '.join(map(repr, chosen))}")
        rates[name] = chosen[arch]
    return rates


# --------------------------------------------------------------------------- depth curves


SPLIT_COLUMNS = {"validation": "val_loss", "test": "test_loss"}
TRANSFER_SPLITS = ("validation", "test")  # what depth_transfer's "evaluated" rows report


def depth_curve(record: RunRecord, eval_steps: Iterable[int], methods: Iterable[str] | None = None,
                checkpoints: str | Path = DEFAULT_CHECKPOINTS, device: str = "cpu",
                splits: Iterable[str] = ("validation",), max_batches: int | None = None,
                store: str | Path | None = None) -> "pd.DataFrame":
    """Loss of a trained continuous-depth run solved with other numbers of steps (and methods)
    than it was trained with, on the run's own fixed evaluation batches of each of ``splits``
    ("validation", "test"); ``max_batches`` keeps only the first batches of each (a cheaper
    curve, the same batches for every model).

    One row per (method, n_steps): the trained method and steps, ``nfe`` (field evaluations
    per forward pass) and ``val_loss`` / ``test_loss``. Needs the run's final model on disk
    (``run(..., need_checkpoint=True)``), except with ``store`` (the run's store) for the points
    evaluated before: each point is kept beside the record (``store.write_evaluations``), so a
    curve is recomputed from stored numbers where the weights are not on disk (a fresh clone).
    """
    import pandas as pd

    splits = list(splits)
    unknown = [s for s in splits if s not in SPLIT_COLUMNS]
    if unknown:
        raise ValueError(f"split(s) {unknown} not valid; choose from {list(SPLIT_COLUMNS)}")
    points = _curve_points(record, eval_steps, methods)
    if store is not None:
        store = evaluations_store(record, store, checkpoints)  # a retraining that ended elsewhere: its side store
    stored = read_evaluations(record, store) if store is not None else {}
    missing = _unstored(points, splits, max_batches, stored)
    if missing:
        stored = {**stored, **_evaluate_depths(record, missing, splits, max_batches, checkpoints, device)}
        if store is not None:
            write_evaluations(record, stored, store)
    trained = record.train_config.model.ode
    rows = []
    for method, n in points:
        values = {s: stored[depth_key(method, n, s, max_batches)] for s in splits}
        rows.append({"config_hash": record.config_hash, "seed": record.seed, "trained_method": trained.method,
                     "trained_steps": trained.n_steps, "method": method, "n_steps": n,
                     "nfe": values[splits[0]]["nfe"], **{SPLIT_COLUMNS[s]: v["loss"] for s, v in values.items()}})
    return pd.DataFrame(rows)


def depth_key(method: str, n_steps: int, split: str, max_batches: int | None) -> str:
    """The name of one depth-curve point among a run's stored evaluations."""
    return f"depth_curve {method} {n_steps} {split} " + ("all" if max_batches is None else f"first {max_batches}")


def _evaluate_depths(record: RunRecord, points, splits, max_batches, checkpoints, device) -> dict[str, dict]:
    """``{depth_key: {"loss", "nfe"}}`` of the run's final model at each (method, n_steps) of
    ``points``, loaded from ``checkpoints``."""
    from nodelm_lib.training.model_files import load_model

    path = checkpoint_path(record.config_hash, checkpoints)
    if not path.exists():
        raise FileNotFoundError(f"no final model of run {record.config_hash} at {path}, and no stored evaluation "
                                f"of it at {points[0][0]} {points[0][1]} steps; train it with "
                                "run(..., need_checkpoint=True)")
    model = load_model(path, device=device)
    tc = record.train_config
    batches = {s: final_eval_batches(tc, s)[:max_batches] for s in splits}  # the batches of the run's final losses
    out = {}
    for method, n in points:
        model.set_ode(method=method, n_steps=n)
        for s, b in batches.items():
            loss = evaluate(model, b, torch.device(device), contextlib.nullcontext)
            out[depth_key(method, n, s, max_batches)] = {"loss": loss, "nfe": model.ode_stats()["nfe"]}
    return out


def depth_curves(models: Iterable[tuple[str, RunRecord]], eval_steps: Iterable[int],
                 methods: Iterable[str] | None = None, splits: Iterable[str] = ("validation",),
                 max_batches: int | None = None, device: str = "cpu", store: str | Path = DEFAULT_STORE,
                 checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, workers: int = 1,
                 progress: bool = False, launcher=None) -> "pd.DataFrame":
    """``depth_curve`` of every (arm name, record) of ``models``, one table with an ``arm`` column.
    A run whose curve has points not yet stored and whose final model is not on disk is
    trained again first (``need_checkpoint``: deterministic, so on the same kind of CPU to the
    same numbers); the others are read from the stored evaluations or their weights."""
    import pandas as pd

    eval_steps, splits = list(eval_steps), list(splits)
    models = list(models)
    arms = [arm for arm, _ in models]
    records = with_weights_where_missing(
        models, lambda r: depth_curve_missing(r, eval_steps, methods, splits, max_batches, store),
        store, checkpoints, isolate, workers, progress, launcher)
    return pd.concat([depth_curve(record, eval_steps, methods, checkpoints, device, splits, max_batches, store)
                      .assign(arm=arm) for arm, record in zip(arms, records)], ignore_index=True)


def depth_curve_missing(record: RunRecord, eval_steps: Iterable[int], methods: Iterable[str] | None = None,
                        splits: Iterable[str] = ("validation",), max_batches: int | None = None,
                        store: str | Path = DEFAULT_STORE) -> bool:
    """Whether ``depth_curve(record, ..., store=store)`` needs the run's weights: some point
    has no stored evaluation."""
    points = _curve_points(record, eval_steps, methods)
    return bool(_unstored(points, list(splits), max_batches, read_evaluations(record, store)))


def _curve_points(record: RunRecord, eval_steps: Iterable[int], methods: Iterable[str] | None) -> list[tuple]:
    """The (method, n_steps) points of a depth curve; ``methods`` defaults to the trained one."""
    steps = list(eval_steps)  # read once per method
    return [(m, n) for m in (methods or [record.train_config.model.ode.method]) for n in steps]


def _unstored(points: list[tuple], splits: list[str], max_batches: int | None, stored: dict) -> list[tuple]:
    """The points with some split not among the ``stored`` evaluations."""
    return [p for p in points if any(depth_key(*p, s, max_batches) not in stored for s in splits)]


# --------------------------------------------------------------------------- fine-tuning at another depth


# what each row of depth_transfer's table is
VARIANTS = {
    "trained": "the model trained at n steps, evaluated at n",
    "evaluated": "(a) the model trained at n steps, evaluated at m without training",
    "finetuned": "(b) the model trained at n steps, fine-tuned at m steps for the short budget",
    "continued": "(d) the control: the model trained at n steps, trained on at n for the same short budget "
                 "(the extra training without the change of depth; the same run at every m)",
    "scratch_short": "(c) trained from scratch at m steps for the short budget",
    "scratch_full": "(c) trained from scratch at m steps for the full budget",
}
def short_budget(tc: TrainConfig, fraction: float) -> TrainConfig:
    """``tc`` with its step budget and warmup scaled by ``fraction`` (the same schedule shape)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"budget fraction={fraction!r} is not valid; it must be in (0, 1]")
    steps = max(1, round(tc.max_steps * fraction))
    return with_values(tc, {"max_steps": steps, "warmup_steps": round(tc.warmup_steps * fraction),
                            "eval_interval": min(tc.eval_interval, steps)})


def finetune_config(parent: TrainConfig, n_steps: int, fraction: float, lr_scale: float,
                    lora_rank: int = 0) -> TrainConfig:
    """The run that fine-tunes ``parent``'s final model at ``n_steps`` solver steps: the same
    seed (batch order), data and evaluation; ``short_budget(fraction)``; peak learning rate
    ``parent.lr * lr_scale`` (``lr_scale=min_lr_ratio``: the rate the parent's schedule ended at).
    ``lora_rank`` > 0: only low-rank adapters of that rank train (``TrainConfig.lora_rank``)."""
    if lr_scale <= 0:
        raise ValueError(f"lr_scale={lr_scale!r} is not valid; it must be > 0")
    parent_hash = run_hash(parent)  # the parent's run, whether ``parent`` is finished or not
    short = short_budget(parent, fraction)
    return with_values(short, {"model": at_depth(model_with_vocab(parent), n_steps), "lr": parent.lr * lr_scale,
                               "init_from": parent_hash, "lora_rank": lora_rank})


def transfer_configs(parent: TrainConfig, to_steps: Iterable[int], fraction: float, lr_scale: float,
                     full_at: Iterable[int] | None = None) -> list[tuple[str, int, TrainConfig]]:
    """(variant, m, config) of every run ``depth_transfer`` trains for one parent run:
    ``finetuned``, ``continued`` (the control: fine-tuning at the parent's own depth, one run listed
    under every m) and ``scratch_short`` at each m of ``to_steps``, ``scratch_full`` at each m of
    ``full_at`` (default: every m; the full budget is the expensive one, so a time-bound profile
    may train it at some depths only). Scratch runs keep the parent's seed and learning rate;
    every run keeps its seed, so each variant is paired with its parent (and with the other
    variants) by seed."""
    to_steps = list(to_steps)
    full_at = set(to_steps if full_at is None else full_at)
    if not full_at <= set(to_steps):
        raise ValueError(f"full-budget depths {sorted(full_at - set(to_steps))} are not among "
                         f"the transfer depths {to_steps}")
    configs = []
    continued = finetune_config(parent, parent.model.ode.n_steps, fraction, lr_scale)  # one run, every m's control
    for m in to_steps:
        scratch = with_values(parent, {"model": at_depth(parent.model, m)})
        configs += [("finetuned", m, finetune_config(parent, m, fraction, lr_scale)),
                    ("continued", m, continued),
                    ("scratch_short", m, short_budget(scratch, fraction))]
        if m in full_at:
            configs.append(("scratch_full", m, scratch))
    return configs


def depth_transfer_configs(base: TrainConfig, arms: Mapping[str, Mapping[str, Any]], seeds: Iterable[int],
                           to_steps: Iterable[int], fraction: float = 0.1, lr_scale: float = 0.1, lr_selection=None,
                           full_budget: Mapping[str, Iterable[int]] | None = None) -> tuple[list, list]:
    """The runs of ``depth_transfer`` (same arguments): the parents, (arm, seed, config), and
    the jobs, (arm, seed, parent config, variant, m, config)."""
    seeds, to_steps = list(seeds), list(to_steps)
    full_budget = dict(full_budget or {})
    if unknown := set(full_budget) - set(arms):
        raise ValueError(f"full_budget names arms {sorted(unknown)} that are not transfer arms {list(arms)}")
    parents = sweep_configs(base, dict(arms), seeds, lr_selection)
    jobs = [(name, seed, parent_tc, variant, m, tc) for name, seed, parent_tc in parents
            for variant, m, tc in transfer_configs(parent_tc, to_steps, fraction, lr_scale, full_budget.get(name))]
    return parents, jobs


def depth_transfer(base: TrainConfig, arms: Mapping[str, Mapping[str, Any]], seeds: Iterable[int],
                   to_steps: Iterable[int], fraction: float = 0.1, lr_scale: float = 0.1, lr_selection=None,
                   full_budget: Mapping[str, Iterable[int]] | None = None,
                   store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                   isolate: bool = True, workers: int = 1, progress: bool = True,
                   device: str = "cpu") -> "pd.DataFrame":
    """Fine-tuning at another depth (Tong et al., ICLR 2025), paired over seeds.

    Every arm (a continuous-depth model trained at n = its ``ode.n_steps``; ``lr_selection`` as
    for ``sweep``) is trained with each seed (or read from the store: with the arms and
    protocol of notebook 02 these are its runs), then for every m of ``to_steps``:
    (a) evaluated at m steps, (b) fine-tuned at m for ``fraction`` of the budget at
    ``lr_scale`` times its rate (``finetune_config``), (c) trained from scratch at m for the same
    short budget and for the full one (only at the m's that ``full_budget[arm]`` lists, where
    given: an arm it does not name gets every m). Returns one row per (arm, seed, m, variant) with
    ``VARIANTS``' names: val_loss, test_loss, steps (training steps of that row's model, the
    parent's for ``evaluated``), train_time_s, config_hash and parent_hash; the parent itself
    is the ``trained`` row with m = n.
    """
    import pandas as pd

    from nodelm_lib.runs.records import record_row

    parents, jobs = depth_transfer_configs(base, arms, seeds, to_steps, fraction, lr_scale, lr_selection, full_budget)
    parent_records = train_transfer_parents(parents, jobs, to_steps, store, checkpoints, isolate, workers, progress)
    records = train_all([tc for *_, tc in jobs], store, checkpoints, isolate, False, workers, progress,
                        labels=[f"{name} seed {seed} {variant} m={m}" for name, seed, _, variant, m, _ in jobs])
    rows, parent_of = [], {}
    for (name, seed, parent_tc), parent in zip(parents, parent_records):
        n = parent_tc.model.ode.n_steps
        parent_of[name, seed] = {"arm": name, "seed": seed, "trained_steps": n, "parent_hash": parent.config_hash}
        rows.append({**parent_of[name, seed], "to_steps": n, "variant": "trained", **_losses(record_row(parent))})
        curve = depth_curve(parent, to_steps, checkpoints=checkpoints, device=device, splits=TRANSFER_SPLITS,
                            store=store)
        for _, point in curve.iterrows():
            rows.append({**parent_of[name, seed], "to_steps": int(point["n_steps"]), "variant": "evaluated",
                         "val_loss": point["val_loss"], "test_loss": point["test_loss"],
                         "steps": len(parent.metrics), "train_time_s": 0.0, "config_hash": parent.config_hash})
    for (name, seed, _, variant, m, _), record in zip(jobs, records):
        rows.append({**parent_of[name, seed], "to_steps": m, "variant": variant, **_losses(record_row(record))})
    return pd.DataFrame(rows)


def train_transfer_parents(parents: list, jobs: list, to_steps: Iterable[int], store: str | Path = DEFAULT_STORE,
                           checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, workers: int = 1,
                           progress: bool = True, launcher=None) -> list[RunRecord]:
    """Train (or read back) ``depth_transfer``'s parents (``depth_transfer_configs``' lists), with
    their final models on disk where something still needs the weights: a fine-tuning run of
    ``jobs`` (fine-tuned or continued) not yet in the store, or a point of the parent's depth curve at ``to_steps`` not yet
    evaluated (``depth_curve_missing``). Only those parents are retrained when their checkpoint
    is gone; with every job and evaluation stored (a fresh clone of the committed results)
    none is. Records in the order of ``parents``."""
    configs = [tc for _, _, tc in parents]
    labels = [f"{name} seed {seed}" for name, seed, _ in parents]
    records = train_all(configs, store, checkpoints, isolate, False, workers, progress, launcher, labels=labels)
    unstored = {(name, seed) for name, seed, _, variant, _, tc in jobs  # runs that start from the parent's weights
                if tc.init_from is not None and stored_record(tc, store) is None}
    needy = [i for i, ((name, seed, _), record) in enumerate(zip(parents, records))
             if (name, seed) in unstored or depth_curve_missing(record, to_steps, splits=TRANSFER_SPLITS, store=store)]
    return with_weights(records, needy, configs, labels, store, checkpoints, isolate, workers, progress, launcher)


def _losses(row: dict) -> dict:
    return {k: row[k] for k in ("val_loss", "test_loss", "steps", "train_time_s", "config_hash")}


def transfer_summary(table: "pd.DataFrame", metric: str = "test_loss", confidence: float = 0.95) -> "pd.DataFrame":
    """``depth_transfer``'s table as one row per (arm, m, variant): mean ± CI of ``metric`` over
    seeds, and the paired difference (fine-tuned - this variant, by seed) with its CI and paired
    t p-value; ``n`` the seeds. Rows: arms in order, m ascending, variants in ``VARIANTS``' order."""
    import pandas as pd

    from nodelm_lib.reporting.stats import mean_ci, paired_test

    rows = []
    order = {v: i for i, v in enumerate(VARIANTS)}
    for (arm, m), group in table.groupby(["arm", "to_steps"], sort=False):
        by_variant = {v: g.set_index("seed")[metric] for v, g in group.groupby("variant")}
        tuned = by_variant.get("finetuned")
        for variant in sorted(by_variant, key=order.__getitem__):
            values = by_variant[variant]
            ci = mean_ci(values.to_numpy(), confidence)
            row = {"arm": arm, "to_steps": m, "variant": variant, "n": ci["n"], "mean": ci["mean"],
                   "ci_low": ci["ci_low"], "ci_high": ci["ci_high"]}
            if tuned is not None and variant != "finetuned":
                seeds = sorted(set(tuned.index) & set(values.index))
                test = paired_test(tuned.loc[seeds].to_numpy(), values.loc[seeds].to_numpy(), confidence)
                row.update({"finetuned_minus": test["mean_diff"], "diff_ci_low": test["ci_low"],
                            "diff_ci_high": test["ci_high"], "p_t": test["p_t"]})
            rows.append(row)
    out = pd.DataFrame(rows)
    out["_arm"] = out["arm"].map({a: i for i, a in enumerate(table["arm"].drop_duplicates())})
    out["_v"] = out["variant"].map(order)
    return out.sort_values(["_arm", "to_steps", "_v"], kind="stable").drop(columns=["_arm", "_v"]).reset_index(drop=True)


def transfer_tests(summary: "pd.DataFrame") -> "pd.DataFrame":
    """``transfer_summary``'s paired comparisons (fine-tuned at m minus each other variant) as rows
    of ``comparisons.compare_arms``' shape (arm "<arch> fine-tuned m=<m>", reference the variant), so that
    ``comparisons.holm_family`` can adjust them together with a notebook's other comparisons. The
    Wilcoxon p is not computed for them (NaN: Holm leaves it out)."""
    import pandas as pd

    rows = summary[summary["finetuned_minus"].notna()] if "finetuned_minus" in summary.columns else summary.iloc[:0]
    return pd.DataFrame({"arm": [f"{a} fine-tuned m={m}" for a, m in zip(rows["arm"], rows["to_steps"])],
                         "reference": rows["variant"].to_numpy(), "n": rows["n"].to_numpy(),
                         "mean_diff": rows["finetuned_minus"].to_numpy(), "ci_low": rows["diff_ci_low"].to_numpy(),
                         "ci_high": rows["diff_ci_high"].to_numpy(), "p_t": rows["p_t"].to_numpy(),
                         "p_wilcoxon": float("nan")})
