"""Loss against size and compute (notebook 07): a width sweep of every arm under notebook 02's
protocol, with fitted trends and iso-parameter / iso-FLOP comparisons to ``gpt``.

- **Cells.** An arm at a width is a *cell*, named ``"<arm> d=<width>"``; every cell is its own arm
  of one sweep (``nl.sweep`` checks that cells differ in their model alone). The depth and
  everything else is 02's config (``protocol.base_config``, through which notebook 02 builds
  its own), so a cell at 02's width and learning rate *is* 02's run: same config hash, read back from
  the store, not trained again.
- **Arms** (``arm_model``): 02's ``gpt``, ``hybrid``, ``ti_mlp``, ``ti_ssm`` and the ``ssm``
  control; ``node`` with the library's default (small) hypernetwork, whose parameter count is near
  ``gpt``'s; ``node_tong``, ``node`` with Tong et al.'s hypernetwork sizes (02's ``node``).
- **Learning rates** (``lr_grids``): per cell, the arm's 02 choice x ``lr_factors`` (1/2, 1, 2),
  searched by ``lr_selection.select_lr_refined`` (grown at an edge or beside a cliff).
- **Trends** (``trends.py``): per arm, test loss against non-embedding parameters and against
  training FLOPs, a saturating power law or, where the points cannot carry it, a log-linear line;
  t-intervals over seeds (``analyse``; for a log-linear trend, the t-interval of the per-seed fits).
- **Slopes** (``slope_tests``): each seed's own fit of an arm, its loss change per doubling, minus
  ``gpt``'s for the same seed: a paired test per arm and x axis, Holm over them all.
- **Iso comparisons** (``iso_table``): at every width, each arm's fitted loss at ``gpt``'s
  parameter count and at ``gpt``'s training FLOPs, minus ``gpt``'s. Read-offs outside an arm's
  fitted range are marked as extrapolations and get no test; the others are tested per seed
  (``comparisons.compare_arms`` with an equivalence margin fixed in the params file, Holm over all of
  them): "equivalent (±m)" only where TOST says so, else "not resolved at n seeds".

The sweep's time estimate is ``sweep_time.py``'s; its display tables and figures are
``nodelm_lib.reporting.scaling_tables`` and ``scaling_figures``, which take these tables as arguments.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from nodelm_lib.config import ModelConfig, TrainConfig
from nodelm_lib.reporting import comparisons, stats, trends
from nodelm_lib.runs.store import finished_record, run_hash

from .lr_selection import rates_at_grid_edge, selection_grids
from .protocol import architecture_arms, selected_lrs, sweep_configs

ARMS = ("gpt", "hybrid", "node", "node_tong", "ti_mlp", "ti_ssm", "ssm")
# how each arm is made by protocol.architecture_arms, as notebook 02 makes it: (archs, controls,
# presets, the name architecture_arms gives it)
_ARM_RECIPES = {
    "node_tong": (["node"], [], {"node": "tong"}, "node"),
    "ssm": ([], ["ssm"], {}, "ssm"),
}
# the arm of notebook 02 whose selected learning rate centres each arm's grid (the others: their own
# name). 02 has no node with the small hypernetwork: it starts from 02's node, and the selection
# grows its grid outward if its best rate lies beyond.
LR_CENTER_ARM_02 = {"node": "node", "node_tong": "node"}
# the x axes of the trends: column of the runs table, label with its unit
AXES = {"params": ("params_non_embedding", "non-embedding parameters"),
        "flops": ("train_flops", "training FLOPs")}
CELL_SEPARATOR = " d="


# --------------------------------------------------------------------------- configs


def arm_model(model: ModelConfig, arm: str) -> ModelConfig:
    """The model of ``arm`` (``ARMS``) at ``model``'s shape, made as notebook 02 makes its arms."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r} is not valid; choose one of {', '.join(map(repr, ARMS))}")
    archs, controls, presets, name = _ARM_RECIPES.get(arm, ([arm], [], {}, arm))
    return architecture_arms(model, archs, controls=controls, presets=presets)[name]["model"]


def cell_name(arm: str, width: int) -> str:
    return f"{arm}{CELL_SEPARATOR}{int(width)}"


def split_cell(name: str) -> tuple[str, int]:
    """(arm, width) of a cell's name."""
    arm, sep, width = str(name).rpartition(CELL_SEPARATOR)
    if not sep or not width.isdigit():
        raise ValueError(f"{name!r} is not a cell name like 'gpt{CELL_SEPARATOR}128'")
    return arm, int(width)


def width_cells(model: ModelConfig, arms: Iterable[str], widths: Iterable[int],
                arm_widths: Mapping[str, Iterable[int]] | None = None) -> dict[str, dict]:
    """The sweep's cells, ``{"<arm> d=<width>": {"model": ModelConfig}}``, arm-major, widths
    ascending: every arm at every width of ``widths``, or, for an arm in ``arm_widths``, at
    those of its widths (a subset of ``widths``: where it is affordable)."""
    arms, widths = list(arms), sorted(int(w) for w in widths)
    if not arms or not widths:
        raise ValueError("arms and widths must each name at least one")
    arm_widths = {a: sorted(int(w) for w in ws) for a, ws in (arm_widths or {}).items()}
    for arm, ws in arm_widths.items():
        if arm not in arms:
            raise ValueError(f"arm_widths names arm {arm!r}, which is not one of the arms {arms}")
        if not ws or not set(ws) <= set(widths):
            raise ValueError(f"arm_widths[{arm!r}] = {ws} must be a non-empty subset of widths {widths}")
    return {cell_name(arm, w): {"model": arm_model(dataclasses.replace(model, d_model=w), arm)}
            for arm in arms for w in arm_widths.get(arm, widths)}


# --------------------------------------------------------------------------- learning rates


def lr_centers(source, arms: Iterable[str]) -> dict[str, float]:
    """arm -> the rate its grid is centred on: ``source`` is a mapping arm -> rate, or the path of
    notebook 02's selection table (``seed_comparison_<profile>_lr_selection.csv``), whose chosen
    rates are read for each arm (``LR_CENTER_ARM_02`` names 02's arm for the two node arms)."""
    arms = list(arms)
    if isinstance(source, Mapping):
        chosen, names = {str(k): float(v) for k, v in source.items()}, {a: a for a in arms}
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run notebook 02 with the same profile first, or give "
                                    "lr_centers as a mapping arm -> rate")
        chosen = selected_lrs(pd.read_csv(path))
        names = {a: LR_CENTER_ARM_02.get(a, a) for a in arms}
    missing = sorted(a for a in arms if names[a] not in chosen)
    if missing:
        raise ValueError(f"no learning rate to centre the grid of arm(s) {missing} on; the source has {sorted(chosen)}")
    return {a: chosen[names[a]] for a in arms}


def lr_grids(centers: Mapping[str, float], cells: Iterable[str], factors: Iterable[float]) -> dict[str, list[float]]:
    """cell -> its arm's centre times each factor, rounded to 6 significant digits (so that 2 x 4e-3
    is 02's 8e-3 to the bit, and the run's hash is 02's)."""
    factors = sorted(float(f) for f in factors)
    if not factors or any(not (math.isfinite(f) and f > 0) for f in factors):
        raise ValueError(f"lr_factors={factors!r} is not valid; give finite factors > 0, e.g. [0.5, 1, 2]")
    grids = {}
    for cell in cells:
        arm, _ = split_cell(cell)
        if arm not in centers:
            raise ValueError(f"no learning-rate centre for arm {arm!r} (centres: {sorted(centers)})")
        grids[cell] = sorted({float(f"{centers[arm] * f:.6g}") for f in factors})
    return grids


def selection_summary(selection: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of ``select_lr``'s table: arm, width, the rates searched, the chosen rate,
    its mean validation loss over the selection seeds, the margin to the runner-up (with the SD of
    that difference over seeds, NaN with one seed) and whether the choice is an edge of its grid
    (its best may lie beyond: ``lr_refinements`` grows such grids)."""
    grids, edges = selection_grids(selection), rates_at_grid_edge(selection)
    chosen = selection[selection["selected"].astype(bool)]
    rows = [{"cell": row["arm"], "rates": " ".join(f"{lr:g}" for lr in grids[row["arm"]]), "lr": row["lr"],
             "val_loss": row["val_loss"], "margin": row.get("margin", math.nan),
             "margin_sd": row.get("margin_sd", math.nan), "at_edge": row["arm"] in edges}
            for _, row in chosen.iterrows()]
    out = pd.DataFrame(rows).rename(columns={"cell": "arm"})
    return with_cells(out).drop(columns="cell")


# --------------------------------------------------------------------------- runs


def with_cells(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (a sweep's or a selection's table, whose ``arm`` column holds cell names) with
    ``cell`` (the name), ``arm`` and ``width`` columns first."""
    comparisons.require_columns(df, ["arm"])
    split = [split_cell(c) for c in df["arm"]]
    out = df.rename(columns={"arm": "cell"})
    out.insert(1, "arm", [a for a, _ in split])
    out.insert(2, "width", [w for _, w in split])
    return out


def stored_runs(base: TrainConfig, cells: dict, seeds: Iterable[int], lr_selection, store) -> pd.DataFrame:
    """One row per run the sweep asks for: cell, arm, width, seed, config_hash and ``stored``
    (its finished record is in ``store`` already, so the sweep reads it instead of training it).
    Called before ``nl.sweep``, it says which runs 02 (or an earlier sweep) has already made."""
    rows = []
    for name, seed, tc in sweep_configs(base, cells, seeds, lr_selection):
        rows.append({"arm": name, "seed": seed, "config_hash": run_hash(tc),
                     "stored": finished_record(tc, store) is not None})
    return with_cells(pd.DataFrame(rows))


def cells_table(points: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per cell (arm-major, widths ascending): seeds, lr, non-embedding parameters,
    training FLOPs, and the mean and t-based CI half width over seeds of the validation and test
    losses and ms/step."""
    comparisons.require_columns(points, ["cell", "arm", "width", "seed", "lr", "params_non_embedding", "train_flops",
                                   "val_loss", "test_loss", "ms_per_step"])
    rows = []
    for (arm, width), g in points.groupby(["arm", "width"], sort=False):
        row = {"arm": arm, "width": int(width), "seeds": len(g), "lr": float(g["lr"].iloc[0]),
               "params_non_embedding": int(g["params_non_embedding"].iloc[0]),
               "train_flops": float(g["train_flops"].iloc[0])}
        for metric in ("val_loss", "test_loss", "ms_per_step"):
            ci = stats.mean_ci(g[metric].astype(float), confidence)
            row[f"{metric}_mean"], row[f"{metric}_ci"] = ci["mean"], ci["ci_half"]
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- trends and read-offs


def fit_trends(points: pd.DataFrame, curvature_p: float = 0.05, metric: str = "test_loss") -> dict:
    """(axis, arm) -> ``trends.Trend`` of ``metric`` against each of ``AXES``, fitted over every
    run of the arm (failed runs, with NaN losses, left out)."""
    comparisons.require_columns(points, ["arm", "seed", metric] + [col for col, _ in AXES.values()])
    out = {}
    for arm, g in points.groupby("arm", sort=False):
        g = g[np.isfinite(g[metric].astype(float))]
        for axis, (col, _) in AXES.items():
            out[(axis, arm)] = trends.fit_trend(g[col].astype(float), g[metric].astype(float), curvature_p)
    return out


def iso_targets(points: pd.DataFrame, reference: str = "gpt") -> pd.DataFrame:
    """The x of every iso read-off: for each axis and width of ``reference``, its x there (its
    non-embedding parameters, its training FLOPs: the same for every seed)."""
    ref = points[points["arm"] == reference]
    if ref.empty:
        raise ValueError(f"reference arm {reference!r} has no runs (arms: {sorted(points['arm'].unique())})")
    rows = [{"axis": axis, "width": int(w), "x": float(g[col].iloc[0])}
            for axis, (col, _) in AXES.items() for w, g in ref.groupby("width")]
    return pd.DataFrame(rows)


def _trend_values(points: pd.DataFrame, forms: dict, targets: pd.DataFrame, reference: str,
                  metric: str) -> pd.Series:
    """Every number the intervals need from one set of points, keyed (axis, arm, what, width):
    the trend's parameters and its slope per doubling at the middle of its own range (width 0), its
    loss at each target and the difference to ``reference``'s there."""
    values = {}
    for (axis, arm), form in forms.items():
        col = AXES[axis][0]
        g = points[(points["arm"] == arm) & np.isfinite(points[metric].astype(float))]
        if g[col].nunique() < 2:
            continue  # a resample whose seeds' runs at all but one width failed: no trend there
        t = trends.fit_form(g[col].astype(float), g[metric].astype(float), form)
        for key, v in t.params.items():
            values[(axis, arm, key, 0)] = v
        values[(axis, arm, "slope_per_doubling", 0)] = float(t.slope_per_doubling(math.sqrt(t.x_min * t.x_max)))
        xs = targets[targets["axis"] == axis]
        for w, x in zip(xs["width"], xs["x"]):
            values[(axis, arm, "loss", int(w))] = float(t(x))
    for (axis, arm, what, w), v in list(values.items()):
        if what == "loss" and (axis, reference, "loss", w) in values:
            values[(axis, arm, "diff", w)] = v - values[(axis, reference, "loss", w)]
    return pd.Series(values, dtype=float)


@dataclasses.dataclass
class Analysis:
    """``analyse``'s answer: ``fits`` (one row per arm and axis), ``iso`` (one row per axis,
    width and arm), ``tests`` (the paired tests of the interpolated read-offs on the seeds'
    jackknife pseudo-values, one Holm family; their ``mean_diff`` is the jackknife estimate),
    ``trends`` ((axis, arm) -> Trend) and ``intervals`` (every number with its t-interval over
    seeds, ``trends.seed_t_intervals``)."""

    fits: pd.DataFrame
    iso: pd.DataFrame
    tests: pd.DataFrame
    trends: dict
    intervals: pd.DataFrame


def analyse(points: pd.DataFrame, reference: str = "gpt", equivalence_margin: float = 0.02,
            curvature_p: float = 0.05, n_boot: int = 2000, confidence: float = 0.95, rng: int = 0,
            metric: str = "test_loss") -> Analysis:
    """Trends, t-intervals over seeds and iso comparisons of a width sweep's runs (``points``: the
    sweep's table ``with_cells``). Forms are chosen once on all seeds (``fit_trends``) and kept in
    every resample."""
    if not (isinstance(equivalence_margin, (int, float)) and equivalence_margin > 0):
        raise ValueError(f"equivalence_margin={equivalence_margin!r} is not valid; fix a margin > 0 (nats) beforehand")
    fitted = fit_trends(points, curvature_p, metric)
    targets = iso_targets(points, reference)
    forms = {k: t.form for k, t in fitted.items()}
    intervals = trends.seed_t_intervals(points, lambda p: _trend_values(p, forms, targets, reference, metric),
                                        n_boot=n_boot, confidence=confidence, rng=rng)
    pseudo = trends.jackknife(points, lambda p: _trend_values(p, forms, targets, reference, metric))
    tests = _iso_tests(pseudo, fitted, targets, reference, equivalence_margin)
    return Analysis(_fits_table(fitted, intervals), _iso_table(fitted, intervals, targets, tests, reference),
                    tests, fitted, intervals)


def _boot_row(boot: pd.DataFrame, key: tuple) -> dict:
    """The estimate and interval of one number of ``Analysis.intervals`` as column suffixes ("", "_ci_low",
    "_ci_high"); NaN where the number does not exist (E of a log-linear trend)."""
    if key not in boot.index:
        return {"": math.nan, "_ci_low": math.nan, "_ci_high": math.nan}
    b = boot.loc[key]
    return {"": b["estimate"], "_ci_low": b["ci_low"], "_ci_high": b["ci_high"]}


def _fits_table(fitted: dict, boot: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (axis, arm), t in fitted.items():
        row = {"axis": AXES[axis][1], "arm": arm, "form": t.form, "why": t.reason, "sizes": t.n_x,
               "runs": t.n_points, "x_min": t.x_min, "x_max": t.x_max}
        for what in ("E", "A", "alpha", "a", "b", "slope_per_doubling"):
            row.update({what + k: v for k, v in _boot_row(boot, (axis, arm, what, 0)).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _iso_tests(pseudo: pd.DataFrame, fitted: dict, targets: pd.DataFrame, reference: str,
               margin: float) -> pd.DataFrame:
    """``comparisons.compare_arms`` (paired t, Wilcoxon, TOST at ``margin``) on the seeds' jackknife
    pseudo-values of every arm's read-off at each (axis, width), the arms whose read-off there
    extrapolates left out; Holm over every row of every table together (``comparisons.holm_family``)."""
    tables = {}
    for _, target in targets.iterrows():
        axis, w, x = target["axis"], int(target["width"]), target["x"]
        inside = [arm for (ax, arm), t in fitted.items() if ax == axis and not t.extrapolates(x)
                  and (axis, arm, "loss", w) in pseudo.columns]
        if reference not in inside or len(inside) < 2:
            continue
        long = pd.DataFrame([{"arm": arm, "seed": seed, "loss": v}
                             for arm in inside for seed, v in pseudo[(axis, arm, "loss", w)].items()])
        tables[f"{axis}{CELL_SEPARATOR}{w}"] = comparisons.compare_arms(long, "loss", reference,
                                                                  equivalence_margin=margin)
    if not tables:
        return pd.DataFrame(columns=["family", "arm", "axis", "width", "p_t_holm", "p_tost_holm", "verdict"])
    out = comparisons.holm_family(tables)
    split = out["family"].str.rpartition(CELL_SEPARATOR)
    return out.assign(axis=split[0], width=split[2].astype(int))


def _iso_table(fitted, boot, targets, tests, reference) -> pd.DataFrame:
    rows = []
    keep = ["p_t_holm", "p_tost_holm", "verdict"]
    tested = {(r["axis"], int(r["width"]), r["arm"]): r for _, r in tests.iterrows()}
    for _, target in targets.iterrows():
        axis, w, x = target["axis"], int(target["width"]), target["x"]
        for (ax, arm), t in fitted.items():
            if ax != axis:
                continue
            row = {"axis": AXES[axis][1], "width": w, "x": x, "arm": arm, "extrapolated": bool(t.extrapolates(x))}
            row.update({"loss" + k: v for k, v in _boot_row(boot, (axis, arm, "loss", w)).items()})
            if arm != reference:
                row.update({"diff" + k: v for k, v in _boot_row(boot, (axis, arm, "diff", w)).items()})
                test = tested.get((axis, w, arm))
                row.update({k: test[k] for k in keep} if test is not None else
                           {"p_t_holm": math.nan, "p_tost_holm": math.nan,
                            "verdict": "extrapolated: not tested" if row["extrapolated"] else "not tested"})
            rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- slopes, paired by seed


def seed_slopes(points: pd.DataFrame, fitted: dict, metric: str = "test_loss") -> pd.DataFrame:
    """One row per (axis, arm, seed): ``slope``, the loss change per doubling of x of that seed's
    own fit (the form ``fitted`` chose on all seeds) at the middle of the arm's range (the
    geometric mean of ``fitted``'s x_min and x_max), over the seed's runs whose ``metric`` is
    finite; NaN where they span fewer than 2 sizes. ``fitted`` is ``fit_trends``' answer."""
    comparisons.require_columns(points, ["arm", "seed", metric] + [col for col, _ in AXES.values()])
    rows = []
    for (axis, arm), trend in fitted.items():
        col = AXES[axis][0]
        runs = points[(points["arm"] == arm) & np.isfinite(points[metric].astype(float))]
        middle = math.sqrt(trend.x_min * trend.x_max)
        for seed in pd.unique(points.loc[points["arm"] == arm, "seed"]):
            g = runs[runs["seed"] == seed]
            slope = math.nan
            if g[col].nunique() >= 2:
                own = trends.fit_form(g[col].astype(float), g[metric].astype(float), trend.form)
                slope = float(own.slope_per_doubling(middle))
            rows.append({"axis": axis, "arm": arm, "seed": seed, "slope": slope})
    return pd.DataFrame(rows, columns=["axis", "arm", "seed", "slope"])


def slope_tests(points: pd.DataFrame, fitted: dict, reference: str = "gpt", metric: str = "test_loss",
                confidence: float = 0.95) -> pd.DataFrame:
    """Each arm's loss change per doubling minus ``reference``'s, paired by seed (``seed_slopes``:
    every seed's own fit): ``comparisons.compare_arms`` per x axis (paired t, Wilcoxon), Holm over
    every arm and axis together (``comparisons.holm_family``; ``family`` is the axis). Beside the
    test, each arm's and the reference's mean slope with its t-interval over seeds
    (``slope``, ``slope_ci_low``, ``slope_ci_high``, ``reference_slope``...). A seed whose slope is
    NaN is left out of its pair (``n`` counts the pairs used)."""
    per_seed = seed_slopes(points, fitted, metric)
    tables = {}
    for axis, g in per_seed.groupby("axis", sort=False):
        if reference not in set(g["arm"]):
            raise ValueError(f"reference arm {reference!r} has no runs (arms: {sorted(g['arm'].unique())})")
        tables[axis] = comparisons.compare_arms(g, "slope", reference, allow_missing=True, confidence=confidence)
    out = comparisons.holm_family(tables).rename(columns={"family": "axis"})
    summary = {(axis, arm): stats.mean_ci(g["slope"], confidence)
               for (axis, arm), g in per_seed.groupby(["axis", "arm"], sort=False)}
    for prefix, key in (("", "arm"), ("reference_", "reference")):
        for what, column in (("slope", "mean"), ("slope_ci_low", "ci_low"), ("slope_ci_high", "ci_high")):
            out[prefix + what] = [summary[(axis, arm)][column] for axis, arm in zip(out["axis"], out[key])]
    return out


def slope_tests_with_and_without(points: pd.DataFrame, fitted: dict, flags: pd.Series, reference: str = "gpt",
                                 metric: str = "test_loss", confidence: float = 0.95) -> pd.DataFrame:
    """``slope_tests`` twice: on every run (``runs`` "all"), and with the runs that ``flags`` marks
    as diverged (``divergence.diverged``) left out ("diverged left out"), each its own Holm
    family: they are two analyses of the same comparisons, not more comparisons. ``n_left_out``
    counts the runs left out."""
    from .divergence import without_diverged

    kept = without_diverged(points, flags, (metric,))
    both = [slope_tests(points, fitted, reference, metric, confidence).assign(runs="all", n_left_out=0),
            slope_tests(kept, fitted, reference, metric, confidence).assign(runs="diverged left out",
                                                                            n_left_out=int(flags.sum()))]
    out = pd.concat(both, ignore_index=True)
    return out[["runs", "n_left_out", *[c for c in out.columns if c not in ("runs", "n_left_out")]]]
