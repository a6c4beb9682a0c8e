"""Learning-rate selection that checks itself: what ``lr_selection``'s table says about each arm's
choice, read seed by seed, and what it then asks for.

- ``arm_checks``: per arm, the selection margin (runner-up minus best), its spread over the selection
  seeds (the SD of the paired per-seed difference, and the t confidence interval of its mean),
  ``margin_inside_spread``, and ``unstable_neighbour``: the next rate up has a selection seed
  ``unstable_gap`` nats or more worse than the chosen rate's same seed, or a failed or diverged run.
- ``select_lr_checked``: ``select_lr_refined``, then a half-step (the geometric mean) between each
  chosen rate and its unstable neighbour, searched as new selection runs.
- ``full_length_configs`` / ``full_length_check`` / ``decided_selection``: every arm whose margin
  is not shown outside its spread trains its chosen rate and its runner-up at the reported runs'
  length on the selection seeds, and that full-length result decides.
- ``apply_divergence``: a reported run that diverged under the declared ``divergence.DivergenceRule``
  (``divergence_rule`` reads it from the params) is rerun once at the next lower rate, or kept and
  reported, and the table says so.
- ``missing_full_length_runs`` / ``plan_full_length_check``: the full-length runs a profile's
  store lacks, with their expected training time (``python -m nodelm_lib.experiments.lr_checks``).

Every run goes through the run store as ``select_lr``'s do: the same configs hash the same, and a
stored run is read back, not trained again.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from nodelm_lib.config import TrainConfig, to_dict, with_values
from nodelm_lib.runs.store import DEFAULT_STORE, load_records, read_record, record_path, run_hash
from nodelm_lib.reporting.stats import mean_ci

from .divergence import DivergenceRule, divergence_reasons, divergence_rule
from .lr_selection import LRSelectionWarning, arm_grids, lr_search_configs, select_lr, select_lr_refined, selection_grids
from .protocol import selected_lrs

if TYPE_CHECKING:
    import pandas as pd

UNSTABLE_GAP = 0.1  # nats: a neighbour seed this much worse than the chosen rate's marks an unstable neighbour
HALF_STEP_MIN_RATIO = 1.9  # a half-step goes between rates at least this far apart (so a grid is refined once)
CHECK_COLUMNS = ["arm", "lr", "runner_up", "n_seeds", "margin", "spread", "diff_ci_low", "diff_ci_high",
                 "margin_inside_spread", "next_up", "unstable_neighbour", "unstable_reason"]


def _by_arm(selection: pd.DataFrame) -> pd.DataFrame:
    """``selection`` with its arms in ``arm``: 07's written table (``scaling.with_cells``) names them
    in ``cell`` (its ``arm`` there is the cell's arm without its width)."""
    if "cell" not in selection.columns:
        return selection
    return selection.drop(columns=["arm"]).rename(columns={"cell": "arm"})


def selection_seed_losses(selection: pd.DataFrame, store: str | Path = DEFAULT_STORE) -> pd.DataFrame:
    """One row per selection run of ``select_lr``'s table (or its CSV): arm, lr, seed, val_loss
    (NaN for a run that did not complete), status and config_hash, read from the records in ``store``
    that the table's ``config_hashes`` name."""
    import pandas as pd

    rows = []
    for _, row in _by_arm(selection).iterrows():
        for seed, h in zip(str(row["seeds"]).split(), str(row["config_hashes"]).split()):
            path = record_path(store, h)
            if not path.exists():
                raise FileNotFoundError(f"the selection run {h} ({row['arm']} lr {row['lr']:g} seed {seed}) is not in "
                                        f"{store}: read the selection with the store that made it")
            record = read_record(path)
            loss = record.final.get("val_loss", math.nan) if record.status == "completed" else math.nan
            rows.append({"arm": str(row["arm"]), "lr": float(row["lr"]), "seed": int(seed), "val_loss": float(loss),
                         "status": record.status, "config_hash": h})
    return pd.DataFrame(rows, columns=["arm", "lr", "seed", "val_loss", "status", "config_hash"])


def paired_margin(runner_up: pd.Series, best: pd.Series, confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(margin, spread, ci_low, ci_high) of the per-seed differences ``runner_up - best`` (both
    indexed by seed): their mean, sample SD, and the t confidence interval of the mean. NaN where
    a seed's loss is missing; spread and interval NaN with one seed."""
    diff = (runner_up - best).to_numpy(float)
    if len(diff) == 0 or not np.isfinite(diff).all():
        return math.nan, math.nan, math.nan, math.nan
    ci = mean_ci(diff, confidence)  # sd and interval NaN with one seed
    return ci["mean"], ci["sd"], ci["ci_low"], ci["ci_high"]


def neighbour_instability(best: pd.Series, neighbour: pd.Series, gap: float,
                          diverged_above: float | None = None) -> str:
    """Why the ``neighbour`` rate is unstable beside the ``best`` one, seed by seed (both indexed by
    seed): a seed that did not complete (NaN), one ``gap`` or more nats worse than the best rate's
    same seed, or one above ``diverged_above``. "" when it is stable."""
    reasons = []
    for seed, loss in best.items():
        other = float(neighbour.get(seed, math.nan))
        if not math.isfinite(other):
            reasons.append(f"seed {seed} failed")
        elif diverged_above is not None and other > diverged_above:
            reasons.append(f"seed {seed} diverged ({other:.4f} > {diverged_above:.4f})")
        elif other - float(loss) >= gap:
            reasons.append(f"seed {seed} {other - float(loss):+.4f} worse")
    return "; ".join(reasons)


def arm_checks(selection: pd.DataFrame, seed_losses: pd.DataFrame, unstable_gap: float | None = UNSTABLE_GAP,
               diverged_above: float | None = None, confidence: float = 0.95) -> pd.DataFrame:
    """One row per arm of ``select_lr``'s table, from its runs seed by seed (``selection_seed_losses``):
    lr (the chosen rate), runner_up (the second-lowest mean), n_seeds, ``margin`` (the runner-up's
    loss minus the chosen rate's, mean over the seeds), ``spread`` (the sample SD of that difference
    over the seeds), ``diff_ci_low`` / ``diff_ci_high`` (its t interval at ``confidence``),
    ``margin_inside_spread`` (margin <= spread: the seeds cannot tell the two apart; None with one
    seed), next_up (the next rate up in the arm's grid), ``unstable_neighbour`` (next_up has a seed
    ``unstable_gap`` or more nats worse than the chosen rate's same seed, a failed run, or one above
    ``diverged_above``; None when ``unstable_gap`` is None or there is no rate above) and
    ``unstable_reason``. An arm with no completed rate has NaN and None throughout."""
    import pandas as pd

    if unstable_gap is not None and not (math.isfinite(unstable_gap) and unstable_gap > 0):
        raise ValueError(f"unstable_gap={unstable_gap!r} is not valid; give a loss gap in nats > 0 (e.g. "
                         f"{UNSTABLE_GAP}), or None to leave neighbours unchecked")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is not valid; it must lie strictly between 0 and 1")
    selection = _by_arm(selection)
    chosen, rows = selected_lrs(selection), []
    for arm, group in selection.groupby("arm", sort=False):
        arm = str(arm)
        rates = sorted(float(r) for r in group["lr"])
        row = dict.fromkeys(CHECK_COLUMNS, math.nan) | {"arm": arm, "margin_inside_spread": None,
                                                          "unstable_neighbour": None, "unstable_reason": ""}
        if arm in chosen:
            row.update(_check_arm(group, seed_losses[seed_losses["arm"] == arm], chosen[arm], rates,
                                  unstable_gap, diverged_above, confidence))
        rows.append(row)
    checks = pd.DataFrame(rows, columns=CHECK_COLUMNS)
    for flag in ("margin_inside_spread", "unstable_neighbour"):  # True / False / None, as Python objects
        checks[flag] = pd.Series([None if v is None else bool(v) for v in checks[flag]], index=checks.index, dtype=object)
    return checks


def _check_arm(group, runs, best_lr, rates, unstable_gap, diverged_above, confidence) -> dict[str, Any]:
    def losses(lr: float) -> pd.Series:
        return runs[np.isclose(runs["lr"], lr, rtol=1e-9)].set_index("seed")["val_loss"]

    done = group[group["val_loss"].notna()].sort_values("val_loss", kind="stable")
    best = losses(best_lr)
    row: dict[str, Any] = {"lr": best_lr, "n_seeds": len(best)}
    if len(done) > 1:
        row["runner_up"] = float(done["lr"].iloc[1])
        margin, spread, low, high = paired_margin(losses(row["runner_up"]), best, confidence)
        row.update(margin=margin, spread=spread, diff_ci_low=low, diff_ci_high=high,
                   margin_inside_spread=bool(margin <= spread) if math.isfinite(spread) else None)
    above = [r for r in rates if r > best_lr * (1 + 1e-9)]
    if above:
        row["next_up"] = above[0]
        if unstable_gap is not None:
            reason = neighbour_instability(best, losses(above[0]), unstable_gap, diverged_above)
            row.update(unstable_neighbour=bool(reason), unstable_reason=reason)
    return row


def half_step_rates(checks: pd.DataFrame, grids: Mapping[str, Iterable[float]],
                    min_ratio: float = HALF_STEP_MIN_RATIO) -> dict[str, list[float]]:
    """arm -> the rate to add to its grid: the geometric mean of its chosen rate and its unstable
    neighbour (``arm_checks``), where the two are ``min_ratio`` or more apart and the grid (``grids``:
    arm -> its rates) lacks it. Empty when no arm has an unstable neighbour left to split."""
    add = {}
    for row in checks.itertuples():
        if row.unstable_neighbour is not True or not row.next_up / row.lr >= min_ratio:
            continue
        rate = float(f"{math.sqrt(row.lr * row.next_up):.6g}")
        if not np.isclose(list(grids[row.arm]), rate, rtol=1e-6).any():
            add[row.arm] = [rate]
    return add


def select_lr_checked(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed, max_refinements: int = 0,
                      cliff_loss: float | None = None, unstable_gap: float | None = UNSTABLE_GAP,
                      diverged_above: float | None = None, max_half_steps: int = 2,
                      store: str | Path = DEFAULT_STORE, **options) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``lr_selection.select_lr_refined`` (``options`` go to it, and on to ``select_lr``), then
    for ``max_half_steps`` rounds at most: each arm whose chosen rate has an unstable neighbour
    (``arm_checks``) gets the half-step between the two as new selection runs, and the selection
    is made again. Returns (selection table, ``arm_checks`` of it). ``unstable_gap=None`` checks
    no neighbour (``select_lr_refined`` alone, with its margins)."""
    if max_half_steps < 0:
        raise ValueError(f"max_half_steps={max_half_steps!r} is not valid; it must be >= 0")
    grids = arm_grids(arms, lrs)
    for round_ in range(max_half_steps + 1):
        with warnings.catch_warnings():
            if round_ < max_half_steps and unstable_gap is not None:  # the last table warns
                warnings.simplefilter("ignore", LRSelectionWarning)
            selection = select_lr_refined(base, arms, grids, seed, max_refinements=max_refinements,
                                          cliff_loss=cliff_loss, store=store, **options)
        checks = arm_checks(selection, selection_seed_losses(selection, store), unstable_gap, diverged_above)
        grids = selection_grids(selection)
        extra = half_step_rates(checks, grids) if unstable_gap is not None else {}
        if not extra or round_ == max_half_steps:
            break
        grids = {arm: sorted(set(grid) | set(extra.get(arm, ()))) for arm, grid in grids.items()}
    return selection, checks


def full_length_arms(checks: pd.DataFrame) -> list[str]:
    """The arms whose selection margin is not shown outside its spread (``margin_inside_spread``
    True, or None: one seed gives no spread) and that have a runner-up to check against."""
    return [row.arm for row in checks.itertuples()
            if row.margin_inside_spread is not False and isinstance(row.runner_up, float) and math.isfinite(row.runner_up)]


def _check_grids(checks: pd.DataFrame, todo: Iterable[str]) -> dict[str, list[float]]:
    rows = checks.set_index("arm")
    return {arm: sorted([float(rows.loc[arm, "lr"]), float(rows.loc[arm, "runner_up"])]) for arm in todo}


def full_length_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], checks: pd.DataFrame, seed,
                        score_test: bool = True, eval_on: str | None = None) -> list[tuple[str, float, int, TrainConfig]]:
    """(arm, lr, seed, config) of every run the full-length check trains: each arm of
    ``full_length_arms(checks)`` at its chosen rate and its runner-up, on the selection seeds
    ``seed``, at ``base``'s max_steps (the reported runs'), scored as the selection scored
    (``score_test``, ``eval_on`` as given to ``select_lr``). ``sweeps.train_all`` can train them
    together with another step's runs."""
    todo = full_length_arms(checks)
    return lr_search_configs(base, {a: arms[a] for a in todo}, _check_grids(checks, todo), seed,
                             None, score_test, eval_on)


def full_length_check(base: TrainConfig, arms: dict[str, dict[str, Any]], checks: pd.DataFrame, seed,
                      **options) -> pd.DataFrame:
    """Train (or read back) ``full_length_configs``' runs through the store, as ``select_lr``
    (``options`` go to it: store, reported_seeds, score_test, eval_on, ...), and return what they
    decide (``check_decisions``); an empty table when no arm needs the check."""
    import pandas as pd

    todo = full_length_arms(checks)
    if not todo:
        return pd.DataFrame(columns=DECISION_COLUMNS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LRSelectionWarning)  # the decision table reports its own margins
        full = select_lr(base, {a: arms[a] for a in todo}, _check_grids(checks, todo), seed, max_steps=None, **options)
    return check_decisions(checks, full)


DECISION_COLUMNS = ["arm", "short_lr", "runner_up", "steps", "n_seeds", "full_val_loss", "full_val_loss_runner_up",
                    "full_margin", "full_margin_sd", "full_lr", "changed"]


def check_decisions(checks: pd.DataFrame, full: pd.DataFrame) -> pd.DataFrame:
    """One row per arm of the full-length selection table ``full`` (``select_lr`` over each checked
    arm's chosen rate and runner-up): the short runs' choice (short_lr) and runner-up, the full-length
    runs' steps, seeds and mean validation losses of both, their margin (the other rate's loss minus
    the winner's) and its SD over seeds, ``full_lr`` (the full-length winner, which decides; the short
    choice where both failed) and ``changed``."""
    import pandas as pd

    short = checks.set_index("arm")
    rows = []
    for arm, group in full.groupby("arm", sort=False):
        short_lr, runner = float(short.loc[arm, "lr"]), float(short.loc[arm, "runner_up"])
        loss = {float(r.lr): float(r.val_loss) for r in group.itertuples()}
        won = group[group["selected"]]
        full_lr = float(won["lr"].iloc[0]) if len(won) else short_lr
        rows.append({"arm": arm, "short_lr": short_lr, "runner_up": runner, "steps": int(group["steps"].iloc[0]),
                     "n_seeds": int(group["n_seeds"].iloc[0]), "full_val_loss": loss.get(short_lr, math.nan),
                     "full_val_loss_runner_up": loss.get(runner, math.nan), "full_margin": float(group["margin"].iloc[0]),
                     "full_margin_sd": float(group["margin_sd"].iloc[0]), "full_lr": full_lr,
                     "changed": not math.isclose(full_lr, short_lr, rel_tol=1e-9)})
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def decided_selection(selection: pd.DataFrame, decisions: pd.DataFrame) -> pd.DataFrame:
    """``select_lr``'s table with each checked arm's ``selected`` rate the full-length check's
    (``decisions``' full_lr) and a ``decided_by`` column ("full-length check" on a checked arm's
    rows, "selection" elsewhere). ``sweeps.sweep(lr_selection=...)`` then runs those rates.
    ``selection`` itself when nothing was checked (its columns unchanged)."""
    if decisions.empty:
        return selection
    out = selection.copy()
    out["decided_by"] = "selection"
    for row in decisions.itertuples():
        rows = out["arm"] == row.arm
        out.loc[rows, "selected"] = np.isclose(out.loc[rows, "lr"].to_numpy(float), row.full_lr, rtol=1e-9)
        out.loc[rows, "decided_by"] = "full-length check"
    return out


def select_lr_with_checks(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed, unstable_gap: float | None = None,
                          full_length: bool = False, diverged_above: float | None = None, max_steps: int | None = None,
                          max_refinements: int = 0,
                          cliff_loss: float | None = None, reported_seeds: Iterable[int] = (), score_test: bool = True,
                          eval_on: str | None = None, **options) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """What a notebook's selection cell calls: ``select_lr_checked`` (half-steps beside unstable
    neighbours when ``unstable_gap`` is set), then, with ``full_length``, ``full_length_check`` of
    every arm whose margin is inside its spread (``max_steps``: the selection runs'; the check's are
    ``base``'s). Returns (selection with the full-length decisions
    applied, ``arm_checks``, the decisions). With ``unstable_gap=None`` and ``full_length=False``
    the selection is ``select_lr_refined``'s, unchanged. ``options`` (store, checkpoints, ...) go
    to ``select_lr``."""
    import pandas as pd

    shared = dict(reported_seeds=reported_seeds, score_test=score_test, eval_on=eval_on, **options)
    selection, checks = select_lr_checked(base, arms, lrs, seed, max_refinements=max_refinements, cliff_loss=cliff_loss,
                                          unstable_gap=unstable_gap, diverged_above=diverged_above,
                                          max_steps=max_steps, **shared)
    decisions = (full_length_check(base, arms, checks, seed, **shared) if full_length
                 else pd.DataFrame(columns=DECISION_COLUMNS))
    return decided_selection(selection, decisions), checks, decisions


# ---------------------------------------------------------------------------------------------- divergence

def next_lower_rate(grid: Iterable[float], lr: float) -> float:
    """The rate of ``grid`` next below ``lr``; half of ``lr`` when the grid has none below it."""
    lower = [float(r) for r in grid if float(r) < lr * (1 - 1e-9)]
    return max(lower) if lower else lr / 2


def apply_divergence(runs: pd.DataFrame, rule: DivergenceRule | None, references: Mapping[str, float] | None,
                     grids: Mapping[str, Iterable[float]], rerun: Callable[[str, int, float], Mapping[str, Any]]
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, report): a sweep's table (one row per arm and seed: arm, seed, lr, status, val_loss)
    with ``rule`` applied (every criterion of it, an arm's seeds being the group of its seed
    margin), and one report row per diverged run. ``"rerun_lower"``: a diverged run's row is
    replaced by ``rerun(arm, seed, lower)``'s (a row of the same columns; ``next_lower_rate`` of
    ``grids[arm]``, the arm's selection grid), once, whatever the rerun gives; ``"report"``: the
    row stays. Either way the table gains ``diverged_at_lr`` (the rate that diverged; NaN elsewhere)
    and ``divergence`` (what happened, "" elsewhere). ``rule`` None: both unchanged and empty."""
    import pandas as pd

    report_columns = ["arm", "seed", "lr", "val_loss", "threshold", "action", "rerun_lr", "rerun_val_loss",
                      "rerun_diverged"]
    if rule is None:
        return runs, pd.DataFrame(columns=report_columns)
    limit, out, report = rule.threshold(references), runs.copy(), []
    out["diverged_at_lr"], out["divergence"] = math.nan, ""
    losses = runs.assign(val_loss=[float(v) if s == "completed" else math.nan
                                   for v, s in zip(runs["val_loss"], runs["status"])])
    reasons = divergence_reasons(losses, rule, references or {}, group="arm")
    for i, row in runs.iterrows():
        if not reasons[i]:
            continue
        loss, lr = float(losses.at[i, "val_loss"]), float(row["lr"])
        note = (f"diverged at lr {lr:g} (val {loss:.4f} > {limit:.4f})" if not math.isfinite(loss) or loss > limit
                else f"diverged at lr {lr:g} ({reasons[i]})")
        entry = {"arm": row["arm"], "seed": int(row["seed"]), "lr": lr, "val_loss": loss, "threshold": limit,
                 "action": rule.action, "rerun_lr": math.nan, "rerun_val_loss": math.nan, "rerun_diverged": None}
        if rule.action == "rerun_lower":
            lower = next_lower_rate(grids.get(row["arm"], [lr]), lr)
            new = rerun(str(row["arm"]), int(row["seed"]), lower)
            for column, value in new.items():
                if column in out.columns and column != "arm":
                    out.at[i, column] = value
            new_loss = float(new["val_loss"]) if new.get("status") == "completed" else math.nan
            others = losses.loc[(losses["arm"] == row["arm"]) & (losses.index != i), "val_loss"].to_numpy()
            entry.update(rerun_lr=lower, rerun_val_loss=new_loss,
                         rerun_diverged=rule.diverged(new_loss, references, others))
            note = f"rerun at lr {lower:g}: {note}" + ("; the rerun diverged too" if entry["rerun_diverged"] else "")
        out.at[i, "diverged_at_lr"], out.at[i, "divergence"] = lr, note
        report.append(entry)
    return out, pd.DataFrame(report, columns=report_columns)


def sweep_rerun(base: TrainConfig, arms: dict[str, dict[str, Any]], **options) -> Callable[[str, int, float], dict]:
    """``apply_divergence``'s ``rerun`` for a sweep of ``arms`` over ``base``: one arm, one seed,
    at the given rate, through ``sweeps.sweep`` and the store (``options`` go to it)."""
    from .sweeps import sweep

    def rerun(arm: str, seed: int, lr: float) -> dict:
        return sweep(base, {arm: arms[arm]}, [seed], lr_selection={arm: lr}, **{"progress": False, **options}).iloc[0].to_dict()

    return rerun


# ------------------------------------------------------------------------------------------------ planning

def _shape_key(tc: TrainConfig, drop: Iterable[str] = ("lr", "seed")) -> str:
    d = to_dict(tc)
    for key in drop:
        d.pop(key, None)
    return json.dumps(d, sort_keys=True, default=str)


def missing_full_length_runs(selection: pd.DataFrame, store: str | Path, max_steps: int,
                             unstable_gap: float | None = UNSTABLE_GAP) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(checks, runs): ``arm_checks`` of ``selection``, and the runs a full-length check of ``selection`` (``select_lr``'s table or CSV; its runs in
    ``store``) would train, one row per run: arm, role (chosen / runner_up), lr, seed, steps,
    config_hash, ``stored`` (the store has its finished record) and ``est_train_time_s``: the mean
    ``train_time_s`` of the stored records of its config but for rate and seed, else of its
    config at another length scaled by steps (NaN where the store has neither). Each run's config
    is its selection run's with ``max_steps`` (the reported runs') in place of the selection's: the
    config ``full_length_configs`` builds. The arms are ``full_length_arms``'."""
    import pandas as pd

    losses = selection_seed_losses(selection, store)
    checks = arm_checks(selection, losses, unstable_gap)
    records = {r.config_hash: r for r in load_records(store, cached=True)}
    timings: dict[str, list[float]] = {}
    scaled: dict[str, list[float]] = {}
    for r in records.values():
        if r.status == "completed" and r.train_time_s > 0:
            tc = r.train_config
            timings.setdefault(_shape_key(tc), []).append(r.train_time_s)
            scaled.setdefault(_shape_key(tc, ("lr", "seed", "max_steps")), []).append(r.train_time_s / tc.max_steps)
    rows = []
    for arm in full_length_arms(checks):
        check = checks.set_index("arm").loc[arm]
        for role, lr in (("chosen", check["lr"]), ("runner_up", check["runner_up"])):
            for run in losses[(losses["arm"] == arm) & np.isclose(losses["lr"], lr, rtol=1e-9)].itertuples():
                tc = with_values(records[run.config_hash].train_config, {"max_steps": int(max_steps)})
                h = run_hash(tc)
                known = timings.get(_shape_key(tc))
                per_step = scaled.get(_shape_key(tc, ("lr", "seed", "max_steps")))
                estimate = (float(np.mean(known)) if known else float(np.mean(per_step)) * max_steps if per_step
                            else math.nan)
                stored = h in records and records[h].status in ("completed", "failed")
                rows.append({"arm": arm, "role": role, "lr": float(lr), "seed": int(run.seed), "steps": int(max_steps),
                             "config_hash": h, "stored": stored, "est_train_time_s": estimate})
    return checks, pd.DataFrame(rows, columns=["arm", "role", "lr", "seed", "steps", "config_hash", "stored",
                                               "est_train_time_s"])


# the selection table each notebook writes, by its results' stem (03's is its variants')
SELECTION_FILES = {"02_seed_comparison": "seed_comparison_{profile}_lr_selection.csv",
                   "03_ablations": "ablation_lr_selection_{profile}.csv",
                   "07_scaling": "scaling_{profile}_lr_selection.csv",
                   "08_long_context": "long_context_{profile}_lr_selection.csv",
                   "09_compute_on_demand": "compute_on_demand_{profile}_lr_selection.csv"}


def plan_full_length_check(notebook: str, profile: str, work_dir: str | Path = ".",
                           unstable_gap: float | None = UNSTABLE_GAP) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``missing_full_length_runs`` of ``notebook``'s committed selection for ``profile``: its
    ``results/`` selection table, its run store (``profiles.notebook_store``) and its max_steps."""
    import pandas as pd

    from . import profiles

    if notebook not in SELECTION_FILES:
        raise ValueError(f"notebook {notebook!r} selects no learning rates; choose one of {', '.join(SELECTION_FILES)}")
    values = profiles.load_profile(notebook, profile)
    path = Path(work_dir) / "results" / SELECTION_FILES[notebook].format(profile=profile)
    if not path.is_file():
        raise FileNotFoundError(f"no selection table {path}: run {notebook} with profile {profile!r} first")
    return missing_full_length_runs(pd.read_csv(path), profiles.notebook_store(notebook, profile, work_dir),
                                    int(values["max_steps"]), unstable_gap)


def format_plan(checks: pd.DataFrame, plan: pd.DataFrame) -> str:
    """``missing_full_length_runs``' answer as text: the checks per arm, then the runs the store
    lacks and their expected training time."""
    lines = [checks.drop(columns=["diff_ci_low", "diff_ci_high"]).round(4).to_string(index=False)]
    missing = plan[~plan["stored"]]
    lines.append(f"full-length runs: {len(plan)} needed, {len(missing)} missing from the store, about "
                 f"{missing['est_train_time_s'].sum() / 3600:.2f} h of training (one at a time)")
    if len(missing):
        lines.append(missing.drop(columns=["stored"]).round({"est_train_time_s": 0}).to_string(index=False))
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m nodelm_lib.experiments.lr_checks <notebook> <profile> [work_dir]")
    print(format_plan(*plan_full_length_check(*sys.argv[1:])))
