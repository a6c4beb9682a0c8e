"""Learning-rate selection: each arm's rate, chosen on validation on seeds that are not reported
(``select_lr``), its grids grown where the choice is not safe (``refine_lr_grids``,
``select_lr_refined``), and what a selection table says (``selection_grids``,
``rates_at_grid_edge``; ``protocol.selected_lrs`` reads the chosen rates). ``sweeps.sweep`` runs each
arm at its selected rate (``lr_selection=``), and the protocol allows no other difference in rate.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from nodelm_lib.config import TrainConfig, with_values
from nodelm_lib.runs.store import DEFAULT_CHECKPOINTS, DEFAULT_STORE
from nodelm_lib.training.record import RunRecord

from .protocol import selected_lrs
from .sweeps import train_all

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `import nodelm_lib` stays light (child processes)


class LRSelectionWarning(UserWarning):
    """A learning-rate choice that its own selection runs cannot tell from the runner-up."""


def select_lr(base: TrainConfig, arms: dict[str, dict[str, Any]], lrs, seed: int | Iterable[int],
              max_steps: int | None = None, store: str | Path = DEFAULT_STORE,
              checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
              workers: int = 1, reported_seeds: Iterable[int] = (), launcher=None,
              score_test: bool = True, eval_on: str | None = None) -> pd.DataFrame:
    """Each arm's learning rate, chosen on validation: every arm trained once per rate of
    ``lrs`` (one grid for every arm, or a mapping arm -> its own grid) and per selection seed
    (``seed``: one seed or several, none of them one of the ``reported_seeds``: a rate picked on
    the seeds it is then reported on would favour it). ``max_steps`` shortens the runs (the
    schedule is the same shape, ending at ``max_steps``); every run ends with its validation
    loss, and no test loss is looked at (``score_test=False``: none is computed either, which on
    a large corpus halves the cost of a short run's final scoring; it changes the runs' hashes).
    ``eval_on`` replaces the base config's (``TrainConfig.eval_on``) in the selection runs:
    ``"batches"`` judges a rate by the validation curve's fixed batches instead of the whole
    split that a ``"whole_split_at_end"`` base scores at the end (the docs' Experiments guide
    measures the subset's error); that error is part of each seed's difference, so
    ``margin_sd`` below includes it.

    Returns one row per (arm, lr): arm, lr, seed (the first selection seed), seeds (all of
    them, space-separated), n_seeds, steps, val_loss (the mean over the selection seeds; NaN
    if any of its runs failed), val_loss_sd (their sample SD), status, config_hash (the first
    seed's run), config_hashes (every seed's), ``selected`` (True for the arm's lowest mean
    validation loss; a failed rate is never selected) and, the same on every row of an arm,
    its selection margin: ``margin`` (the runner-up's mean minus the best's), ``margin_sd`` (the
    sample SD over seeds of that difference, seed by seed) and ``within_noise`` (margin <=
    margin_sd: the seeds cannot tell the two rates apart; ``LRSelectionWarning`` names such
    arms). Pass the table to ``sweeps.sweep(lr_selection=...)``. ``launcher`` as in ``sweep``.
    """
    seeds = _selection_seeds(seed, reported_seeds)
    configs = lr_search_configs(base, arms, lrs, seeds, max_steps, score_test, eval_on)
    records = train_all([tc for *_, tc in configs], store, checkpoints, isolate, False, workers, progress,
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
                      max_steps: int | None = None, score_test: bool = True,
                      eval_on: str | None = None) -> list[tuple[str, float, int, TrainConfig]]:
    """(arm, lr, seed, config) of every run ``select_lr`` trains (``sweeps.train_all`` can train
    them together with another step's runs). ``lrs``: one grid, or a mapping arm -> grid."""
    seeds = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
    short = with_values(base, {"max_steps": max_steps}) if max_steps is not None else base
    if not score_test:
        short = with_values(short, {"score_test": False})
    if eval_on is not None:
        short = with_values(short, {"eval_on": eval_on})
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
