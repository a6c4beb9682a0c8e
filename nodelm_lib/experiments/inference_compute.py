"""Notebook 09's experiment: loss against inference compute. Can a continuous-depth model trade
compute for loss at inference, as a stack of layers cannot?

A continuous-depth model's depth is a solver setting: the same weights solved with fewer steps
when cheap is enough, more steps or an adaptive solver when accuracy matters. A model trained on
one grid learns that grid's map (03's depth transfer: solved at another step count it loses
0.3-0.4 nats); one trained on grids drawn afresh each step (``ODEConfig.grid_*``) must work on all
of them. This module builds the arms, evaluates every trained run at every solver setting (each
point kept beside the run's record, so a clone without the weights reads the curves back), and
compares the curves:

- ``compute_arms``: each continuous arch trained on its fixed grid (the arm of notebook 02: same
  config, same stored runs) and on random grids, one arch also with the flow regularisers;
- ``anytime_curves``: loss, NFE per token and ms per token of every run at every setting;
- ``curve_table`` / ``budget_tests`` / ``area_tests``: the curves with 95% CIs over seeds, paired
  tests at each NFE budget against a reference arm (and against ``gpt`` at its own depth), and the
  area under each run's loss-vs-NFE curve, Holm-corrected together by the notebook.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import torch

from nodelm_lib import families
from nodelm_lib.config import ModelConfig, with_values
from nodelm_lib.reporting.stats import mean_ci, paired_test
from nodelm_lib.runs.store import (DEFAULT_CHECKPOINTS, DEFAULT_STORE, checkpoint_path, evaluations_store,
                                   read_evaluations, write_evaluations)
from nodelm_lib.training.device import resolve_device
from nodelm_lib.training.evaluation import final_eval_batches
from nodelm_lib.training.record import RunRecord

from .anytime import SolveSetting, anytime_area, anytime_profile, evaluate_settings, score_as_trained
from .sweeps import with_weights_where_missing

RANDOM, REGULARISED = "random", "reg"  # the suffixes of the arms trained on random grids, and regularised


def compute_arms(fixed: Mapping[str, Mapping[str, Any]], random_steps: tuple[int, int] | None = None,
                 regularised: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, dict[str, Any]]:
    """The arms of notebook 09 from ``fixed`` (arms as ``protocol.architecture_arms`` gives them:
    ``{name: {"model": ModelConfig}}``): each arm as it is (trained on its own grid: a notebook
    02 arm keeps its config and so its stored runs), and, for every arm with an ODE block, the same
    model trained on random grids of ``random_steps`` = (min, max) steps, named ``"<arm> random"``.
    ``regularised`` maps an arm to flow-regulariser weights (``{"node": {"kinetic_weight": 0.01,
    "jacobian_weight": 0.01}}``) for a ``"<arm> reg"`` arm: random grids plus the regularisers."""
    arms = {name: dict(arm) for name, arm in fixed.items()}
    for name, arm in fixed.items():
        model: ModelConfig = arm["model"]
        if random_steps is not None and _has_ode_block(model):
            arms[f"{name} {RANDOM}"] = {**arm, "model": _on_random_grids(model, random_steps)}
    for name, weights in (regularised or {}).items():
        if name not in fixed:
            raise ValueError(f"regularised arm {name!r} is none of the arms {', '.join(map(repr, fixed))}")
        if random_steps is None:
            raise ValueError("a regularised arm trains on random grids: give random_steps")
        model = _on_random_grids(fixed[name]["model"], random_steps)
        regularised_model = with_values(model, {f"ode.{k}": v for k, v in weights.items()})
        arms[f"{name} {REGULARISED}"] = {**fixed[name], "model": regularised_model}
    return arms


def _has_ode_block(model: ModelConfig) -> bool:
    from nodelm_lib.models import build_model
    from nodelm_lib.models.common import ODEBlock

    with torch.device("meta"):
        built = build_model(dataclasses.replace(model, vocab_size=model.vocab_size or 1))  # no memory on meta
    return any(isinstance(m, ODEBlock) for m in built.modules())


def _on_random_grids(model: ModelConfig, steps: tuple[int, int]) -> ModelConfig:
    low, high = steps
    return with_values(model, {"ode.grid_min_steps": low, "ode.grid_max_steps": high})


# --------------------------------------------------------------------------- evaluation at every setting


# the setting of a model solved as it was trained; for a stack of layers, the only one it has
AS_TRAINED = "as trained"


def point_key(setting: SolveSetting | str, split: str, max_batches: int | None, stride: int = 1) -> str:
    """The name of one curve point among a run's stored evaluations (a point scored on every k-th
    position, ``stride`` k > 1, says so)."""
    label = setting if isinstance(setting, str) else setting.label
    return (f"anytime {label} {split} " + ("all" if max_batches is None else f"first {max_batches}")
            + (f" every {stride}" if stride != 1 else ""))


def applicable(model: ModelConfig, setting: SolveSetting) -> bool:
    """Whether a model of config ``model`` can be solved as ``setting`` says: the config at that
    setting is valid (a loop, or a residual stack, takes Euler grids only)."""
    # a family whose depth rule is its solver steps (continuous, looped) takes the steps as its depth too
    steps_are_depth = "ode.n_steps" in families.get(model.arch).depth_values(1)
    depth = {} if setting.adaptive else {"ode.n_steps": setting.n_steps,
                                         **({"n_layers": setting.n_steps} if steps_are_depth else {})}
    try:
        with_values(dataclasses.replace(model, ode=model.ode.for_inference()), {"ode.method": setting.method, **depth})
    except ValueError:
        return False
    return True


def anytime_curve(record: RunRecord, settings: Iterable[SolveSetting], split: str = "test",
                  max_batches: int | None = None, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                  store: str | Path | None = None, device: str = "cpu", stride: int = 1) -> pd.DataFrame:
    """One row per setting the run's model can be solved at (``applicable``): ``loss`` of the run's
    final model over its own fixed evaluation batches of ``split`` (the first ``max_batches``),
    ``nfe`` and ``ms_per_token`` (every setting scores every ``stride``-th position:
    ``anytime.evaluate_settings``). Points stored beside the record (``store``) are read back; the
    others need the final model on disk and are stored."""
    by_key = {point_key(s, split, max_batches, stride): s for s in settings
              if applicable(record.train_config.model, s)}

    def evaluate(model, keys: list[str]) -> dict[str, dict]:
        batches = _batches(record, split, max_batches)
        table = evaluate_settings(model, batches, [by_key[k] for k in keys], _device_of(model), stride)
        return {k: {c: float(row[c]) for c in ("loss", "nfe", "ms_per_token")}
                for k, (_, row) in zip(keys, table.iterrows())}

    stored = _kept_evaluations(record, list(by_key), evaluate, store, checkpoints, device)
    return pd.DataFrame([{"config_hash": record.config_hash, "seed": record.seed, "setting": s.label,
                          "method": s.method, "n_steps": s.n_steps, "rtol": s.rtol, "adaptive": s.adaptive, **stored[key]}
                         for key, s in by_key.items()])


def _kept_evaluations(record: RunRecord, keys: list[str], evaluate, store, checkpoints, device: str) -> dict[str, dict]:
    """``record``'s stored evaluations, those of ``keys`` not stored yet computed by
    ``evaluate(model, missing keys)`` from the run's final model and kept beside the record
    (``store``; None: computed, not kept). The final model is needed only for a missing key."""
    if store is not None:
        store = evaluations_store(record, store, checkpoints)
    stored = read_evaluations(record, store) if store is not None else {}
    missing = [k for k in keys if k not in stored]
    if missing:
        stored = {**stored, **evaluate(_final_model(record, checkpoints, device, missing[0]), missing)}
        if store is not None:
            write_evaluations(record, stored, store)
    return stored


def _final_model(record: RunRecord, checkpoints, device: str, wanted: str):
    """The run's final model from ``checkpoints``, in eval mode on ``device``; a FileNotFoundError
    naming the evaluation ``wanted`` where it is not on disk."""
    from nodelm_lib.training.model_files import load_model

    path = checkpoint_path(record.config_hash, checkpoints)
    if not path.exists():
        raise FileNotFoundError(f"no final model of run {record.config_hash} at {path}, and no stored evaluation "
                                f"{wanted!r} of it; train it with run(..., need_checkpoint=True)")
    return load_model(path, device=resolve_device(device))


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _batches(record: RunRecord, split: str, max_batches: int | None) -> list:
    """The first ``max_batches`` of the run's own fixed evaluation batches of ``split``."""
    return final_eval_batches(record.train_config, split)[:max_batches]


def curve_missing(record: RunRecord, settings: Iterable[SolveSetting], split: str = "test",
                  max_batches: int | None = None, store: str | Path = DEFAULT_STORE, stride: int = 1) -> bool:
    """Whether ``anytime_curve`` of ``record`` needs the run's weights: some point is not stored."""
    stored = read_evaluations(record, store)
    return any(point_key(s, split, max_batches, stride) not in stored for s in settings
               if applicable(record.train_config.model, s))


def trained_points(models: Iterable[tuple[str, RunRecord]], split: str = "test", max_batches: int | None = None,
                   device: str = "cpu", store: str | Path = DEFAULT_STORE,
                   checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, workers: int = 1,
                   progress: bool = False, launcher=None, stride: int = 1) -> pd.DataFrame:
    """Every run of ``models`` at the one setting a stack of layers has, as it was trained: ``loss``
    on the same batches and positions (``stride``) as the curves, ``nfe`` = its blocks per token
    (``n_layers``, one field evaluation's worth each) and ``ms_per_token``: the fixed-depth points
    the curves are read against (``gpt`` at its compute). Stored beside each record as the curves are."""
    models = list(models)
    key = point_key(AS_TRAINED, split, max_batches, stride)
    records = with_weights_where_missing(models, lambda r: key not in read_evaluations(r, store), store,
                                         checkpoints, isolate, workers, progress, launcher)

    def evaluate(record: RunRecord):
        return lambda model, keys: {key: score_as_trained(model, _batches(record, split, max_batches),
                                                          _device_of(model), stride)}

    return pd.DataFrame([{"arm": arm, "config_hash": record.config_hash, "seed": record.seed, "setting": AS_TRAINED,
                          **_kept_evaluations(record, [key], evaluate(record), store, checkpoints, device)[key]}
                         for (arm, _), record in zip(models, records)])


def anytime_curves(models: Iterable[tuple[str, RunRecord]], settings: Iterable[SolveSetting], split: str = "test",
                   max_batches: int | None = None, device: str = "cpu", store: str | Path = DEFAULT_STORE,
                   checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, workers: int = 1,
                   progress: bool = False, launcher=None, stride: int = 1) -> pd.DataFrame:
    """``anytime_curve`` of every (arm, record) of ``models``, one table with an ``arm`` column. A run
    whose curve is not all stored and whose final model is not on disk is trained again first
    (deterministic: on the same kind of CPU, to the same numbers). Every setting scores every
    ``stride``-th position (``anytime.evaluate_settings``)."""
    models, settings = list(models), list(settings)
    records = with_weights_where_missing(
        models, lambda r: curve_missing(r, settings, split, max_batches, store, stride),
        store, checkpoints, isolate, workers, progress, launcher)
    return pd.concat([anytime_curve(record, settings, split, max_batches, checkpoints, store, device,
                                    stride).assign(arm=arm)
                      for (arm, _), record in zip(models, records)], ignore_index=True)


# --------------------------------------------------------------------------- tables and tests


def curve_table(curves: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per arm and setting: the mean loss over seeds with its ``confidence`` CI (t), the mean NFE
    per token and ms per token, and the number of seeds."""
    rows = []
    for (arm, setting), group in curves.groupby(["arm", "setting"], sort=False):
        ci = mean_ci(group["loss"].to_numpy(), confidence)
        rows.append({"arm": arm, "setting": setting, "adaptive": bool(group["adaptive"].iloc[0]),
                     "nfe": group["nfe"].mean(), "loss": ci["mean"], "ci_low": ci["ci_low"], "ci_high": ci["ci_high"],
                     "ms_per_token": group["ms_per_token"].mean(), "n_seeds": len(group)})
    return pd.DataFrame(rows)


def curve_grid(table: pd.DataFrame, arms: Iterable[str], settings: Iterable[SolveSetting | str]) -> pd.DataFrame:
    """``curve_table``'s mean losses as one row per arm (in the order of ``arms``) and one column
    per setting (in the order of ``settings``; a setting an arm cannot be solved at is left empty):
    the loss-vs-NFE curves at a glance, for the docs and the README."""
    labels = [s.label if isinstance(s, SolveSetting) else s for s in settings]
    wide = table.pivot(index="arm", columns="setting", values="loss")
    arms = [a for a in arms if a in wide.index]
    return wide.reindex(index=arms, columns=labels).rename_axis(index="arm", columns=None).reset_index()


def profiles(curves: pd.DataFrame, budgets: Iterable[float]) -> pd.DataFrame:
    """Every run's anytime profile (the best loss within each NFE budget, ``anytime_profile``): one
    row per (arm, seed, budget)."""
    budgets = list(budgets)
    rows = []
    for (arm, seed), run in curves.groupby(["arm", "seed"], sort=False):
        for budget, loss in anytime_profile(run, budgets).items():
            rows.append({"arm": arm, "seed": seed, "budget": budget, "loss": loss})
    return pd.DataFrame(rows, columns=["arm", "seed", "budget", "loss"])


def budget_tests(curves: pd.DataFrame, budgets: Iterable[float], reference: str,
                 points: pd.DataFrame | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """Paired tests (by seed) of every arm's anytime loss at each NFE budget against ``reference``'s
    (an arm of ``curves``, e.g. the weight-tied loop), and, given ``points`` (one row per seed of a
    fixed-depth model: ``arm``, ``seed``, ``loss``, ``nfe``), against each such model at its own
    depth (a budget equal to its NFE). ``mean_diff`` < 0: the arm is better. p values uncorrected:
    ``comparisons.holm_family`` corrects over the notebook's family."""
    table = profiles(curves, budgets)
    rows = []
    for budget, at_budget in table.groupby("budget"):
        losses = at_budget.pivot(index="seed", columns="arm", values="loss")
        for arm in losses.columns:
            if arm != reference and reference in losses:
                rows.append(_test(arm, reference, budget, losses[arm], losses[reference], confidence))
    for name, point in (points.groupby("arm", sort=False) if points is not None else []):
        budget = float(point["nfe"].iloc[0])
        at_budget = profiles(curves, [budget]).pivot(index="seed", columns="arm", values="loss")
        reference_losses = point.set_index("seed")["loss"]
        for arm in at_budget.columns:
            rows.append(_test(arm, name, budget, at_budget[arm], reference_losses, confidence))
    return pd.DataFrame(rows)


def area_tests(curves: pd.DataFrame, low: float, high: float, reference: str, confidence: float = 0.95) -> pd.DataFrame:
    """Each run's area under its loss-vs-NFE curve from ``low`` to ``high`` NFE (``anytime_area``:
    the mean loss over that range in log2 NFE), compared by seed with ``reference``'s."""
    areas = (curves.groupby(["arm", "seed"], sort=False)
             .apply(lambda run: anytime_area(run, low, high), include_groups=False).unstack("arm"))
    return pd.DataFrame([_test(arm, reference, f"area {low:g}-{high:g}", areas[arm], areas[reference], confidence)
                         for arm in areas.columns if arm != reference])


def _test(arm: str, reference: str, budget, a: pd.Series, b: pd.Series, confidence: float) -> dict:
    """A paired test of ``a`` against ``b`` over the seeds both have (a budget below an arm's
    cheapest setting leaves it NaN: no test)."""
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    base = {"arm": arm, "reference": reference, "budget": budget, "n": len(both)}
    if len(both) < 2:
        return {**base, **{k: math.nan for k in TEST_COLUMNS}}
    test = paired_test(both["a"].to_numpy(), both["b"].to_numpy(), confidence)
    return {**base, **{k: test[k] for k in TEST_COLUMNS}}


TEST_COLUMNS = ("mean_diff", "ci_low", "ci_high", "p_t", "p_wilcoxon")


# --------------------------------------------------------------------------- adapting to a new depth


def lora_recovery(parents: Iterable[tuple[str, RunRecord]], to_steps: Iterable[int], ranks: Iterable[int],
                  fraction: float = 0.1, lr_scale: float = 1.0, split: str = "test", max_batches: int | None = None,
                  store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                  isolate: bool = True, workers: int = 1, progress: bool = False, device: str = "cpu") -> pd.DataFrame:
    """What low-rank fine-tuning recovers at a new depth, beside full fine-tuning (03's): every run of
    ``parents`` solved at each m of ``to_steps`` as it is (``evaluated``), fine-tuned there for
    ``fraction`` of its budget in full (``finetuned``) and with LoRA adapters of each rank
    (``lora r<rank>``; ``ablations.finetune_config``). One row per (arm, seed, m, variant): ``loss`` on
    the curves' batches (``split``, first ``max_batches``), ``trained`` parameters, and ``recovered``,
    the share of the gap from ``evaluated`` to ``finetuned`` that the variant closes (1: all of it).
    Every loss is kept beside its run's record, so a clone without the weights reads the table back."""
    from nodelm_lib.runs.store import stored_record

    from .ablations import finetune_config
    from .sweeps import train_all, with_weights

    parents, to_steps, ranks = list(parents), list(to_steps), list(ranks)
    settings = [SolveSetting("euler", n_steps=m) for m in to_steps]
    jobs = [(arm, parent, m, variant, finetune_config(parent.train_config, m, fraction, lr_scale, rank))
            for arm, parent in parents for m in to_steps
            for variant, rank in [("finetuned", 0), *((f"lora r{r}", r) for r in ranks)]]
    labels = [f"{arm} seed {parent.seed}" for arm, parent in parents]
    # a parent's weights are needed for a fine-tuning run not yet stored, or an evaluation not yet kept
    needy = [i for i, (_, parent) in enumerate(parents)
             if (curve_missing(parent, settings, split, max_batches, store)
                 or any(p is parent and stored_record(tc, store) is None for _, p, _, _, tc in jobs))
             and not checkpoint_path(parent.config_hash, checkpoints).exists()]
    records = with_weights([p for _, p in parents], needy, [p.train_config for _, p in parents], labels, store,
                           checkpoints, isolate, workers, progress, None)
    parents = [(arm, record) for (arm, _), record in zip(parents, records)]
    finetuned = train_all([tc for *_, tc in jobs], store, checkpoints, isolate, False, workers, progress,
                          labels=[f"{arm} seed {p.seed} {variant} m={m}" for arm, p, m, variant, _ in jobs])
    finetuned = with_weights_where_missing(
        [(f"{arm} {variant} m={m}", r) for (arm, _, m, variant, _), r in zip(jobs, finetuned)],
        lambda r: curve_missing(r, [SolveSetting("euler", n_steps=r.train_config.model.ode.n_steps)], split,
                                max_batches, store), store, checkpoints, isolate, workers, progress, None)
    rows = []
    for (arm, parent, m, variant, _), record in zip(jobs, finetuned):
        point = anytime_curve(record, [SolveSetting("euler", n_steps=m)], split, max_batches, checkpoints, store,
                              device)
        rows.append({"arm": arm, "seed": parent.seed, "to_steps": m, "variant": variant, "loss": point["loss"].iloc[0],
                     "trained": record.params.get("trained", record.params.get("total"))})
    for arm, parent in parents:
        curve = anytime_curve(parent, settings, split, max_batches, checkpoints, store, device)
        rows += [{"arm": arm, "seed": parent.seed, "to_steps": int(point["n_steps"]), "variant": "evaluated",
                  "loss": point["loss"], "trained": 0} for _, point in curve.iterrows()]
    table = pd.DataFrame(rows)
    key = ["arm", "seed", "to_steps"]
    ends = table.pivot_table(index=key, columns="variant", values="loss")
    reference = pd.DataFrame({"evaluated_loss": ends["evaluated"], "gap": ends["evaluated"] - ends["finetuned"]})
    table = table.join(reference, on=key)
    table["recovered"] = (table["evaluated_loss"] - table["loss"]) / table["gap"]
    return table.drop(columns=["gap", "evaluated_loss"])
