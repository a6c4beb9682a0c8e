"""Loss against size and compute (notebook 07): a width sweep of every arm under notebook 02's
protocol, with fitted trends and iso-parameter / iso-FLOP comparisons to ``gpt``.

- **Cells.** An arm at a width is a *cell*, named ``"<arm> d=<width>"``; every cell is its own arm
  of one sweep (``nl.sweep`` checks that cells differ in their model alone). The depth and
  everything else is 02's config (``base_config`` builds it from 02's parameters as notebook 02
  does), so a cell at 02's width and learning rate *is* 02's run: same config hash, read back from
  the store, not trained again.
- **Arms** (``arm_model``): 02's ``gpt``, ``hybrid``, ``ti_mlp``, ``ti_ssm`` and the ``ssm``
  control; ``node`` with the library's default (small) hypernetwork, whose parameter count is near
  ``gpt``'s; ``node_tong``, ``node`` with Tong et al.'s hypernetwork sizes (02's ``node``).
- **Learning rates** (``lr_grids``): per cell, the arm's 02 choice x ``lr_factors`` (1/2, 1, 2),
  searched by ``lr_selection.select_lr_refined`` (grown at an edge or beside a cliff).
- **Trends** (``trends.py``): per arm, test loss against non-embedding parameters and against
  training FLOPs, a saturating power law or, where the points cannot carry it, a log-linear line;
  intervals from a bootstrap over seeds (``analyse``).
- **Iso comparisons** (``iso_table``): at every width, each arm's fitted loss at ``gpt``'s
  parameter count and at ``gpt``'s training FLOPs, minus ``gpt``'s. Read-offs outside an arm's
  fitted range are marked as extrapolations and get no test; the others are tested per seed
  (``stats.compare_arms`` with an equivalence margin fixed in the params file, Holm over all of
  them): "equivalent (±m)" only where TOST says so, else "not resolved at n seeds".
- **Time** (``time_estimate``): from the per-step times of a store's records.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from .lr_selection import rates_at_grid_edge, selection_grids
from .protocol import architecture_arms, selected_lrs, sweep_configs
from nodelm_lib.reporting import stats, trends
from nodelm_lib.config import ModelConfig, ODEConfig, TrainConfig, to_dict
from nodelm_lib.data import get_tokenizer
from nodelm_lib.runs.store import finished_record, load_records
from nodelm_lib.training.evaluation import with_tokenizer_vocab

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


def base_config(*, n_heads: int, n_layers: int, max_seq_len: int, ssm_state_size: int, ode_method: str,
                dataset: str, tokenizer: str, batch_size: int, seq_len: int, max_steps: int, warmup_steps: int,
                min_lr_ratio: float, beta2: float, eval_interval: int, eval_batches: int, eval_on: str,
                device: str = "auto", dtype: str = "float32", compile_model: bool = False,
                d_model: int = 128) -> TrainConfig:
    """Notebook 02's base config from 02's parameters (its third cell builds the same): at 02's
    width and learning rate a cell's config hash is 02's run's. ``lr`` is a placeholder: every
    run takes its cell's selected rate."""
    model = ModelConfig(vocab_size=get_tokenizer(tokenizer).vocab_size, d_model=d_model, n_heads=n_heads,
                        n_layers=n_layers, max_seq_len=max_seq_len, ssm_state_size=ssm_state_size,
                        ode=ODEConfig(method=ode_method, n_steps=n_layers))
    return TrainConfig(model=model, dataset=dataset, tokenizer=tokenizer, batch_size=batch_size, seq_len=seq_len,
                       max_steps=max_steps, lr=1e-3, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                       beta2=beta2, eval_interval=eval_interval, eval_batches=eval_batches, eval_on=eval_on,
                       device=device, dtype=dtype, compile=compile_model, progress=False)


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
    stats.require_columns(df, ["arm"])
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
        rows.append({"arm": name, "seed": seed, "config_hash": with_tokenizer_vocab(tc).config_hash(),
                     "stored": finished_record(tc, store) is not None})
    return with_cells(pd.DataFrame(rows))


def cells_table(points: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per cell (arm-major, widths ascending): seeds, lr, non-embedding parameters,
    training FLOPs, and the mean and t-based CI half width over seeds of the validation and test
    losses and ms/step."""
    stats.require_columns(points, ["cell", "arm", "width", "seed", "lr", "params_non_embedding", "train_flops",
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
    stats.require_columns(points, ["arm", "seed", metric] + [col for col, _ in AXES.values()])
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
    """Every number the bootstrap needs from one set of points, keyed (axis, arm, what, width):
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
    ``trends`` ((axis, arm) -> Trend) and ``boot`` (every bootstrapped number)."""

    fits: pd.DataFrame
    iso: pd.DataFrame
    tests: pd.DataFrame
    trends: dict
    boot: pd.DataFrame


def analyse(points: pd.DataFrame, reference: str = "gpt", equivalence_margin: float = 0.02,
            curvature_p: float = 0.05, n_boot: int = 2000, confidence: float = 0.95, rng: int = 0,
            metric: str = "test_loss") -> Analysis:
    """Trends, bootstrap intervals and iso comparisons of a width sweep's runs (``points``: the
    sweep's table ``with_cells``). Forms are chosen once on all seeds (``fit_trends``) and kept in
    every resample."""
    if not (isinstance(equivalence_margin, (int, float)) and equivalence_margin > 0):
        raise ValueError(f"equivalence_margin={equivalence_margin!r} is not valid; fix a margin > 0 (nats) beforehand")
    fitted = fit_trends(points, curvature_p, metric)
    targets = iso_targets(points, reference)
    forms = {k: t.form for k, t in fitted.items()}
    boot = trends.bootstrap(points, lambda p: _trend_values(p, forms, targets, reference, metric),
                            n_boot=n_boot, confidence=confidence, rng=rng)
    pseudo = trends.jackknife(points, lambda p: _trend_values(p, forms, targets, reference, metric))
    tests = _iso_tests(pseudo, fitted, targets, reference, equivalence_margin)
    return Analysis(_fits_table(fitted, boot), _iso_table(fitted, boot, targets, tests, reference),
                    tests, fitted, boot)


def _boot_row(boot: pd.DataFrame, key: tuple) -> dict:
    """The estimate and interval of one bootstrapped number as column suffixes ("", "_ci_low",
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
    """``stats.compare_arms`` (paired t, Wilcoxon, TOST at ``margin``) on the seeds' jackknife
    pseudo-values of every arm's read-off at each (axis, width), the arms whose read-off there
    extrapolates left out; Holm over every row of every table together (``stats.holm_family``)."""
    tables = {}
    for _, target in targets.iterrows():
        axis, w, x = target["axis"], int(target["width"]), target["x"]
        inside = [arm for (ax, arm), t in fitted.items() if ax == axis and not t.extrapolates(x)
                  and (axis, arm, "loss", w) in pseudo.columns]
        if reference not in inside or len(inside) < 2:
            continue
        long = pd.DataFrame([{"arm": arm, "seed": seed, "loss": v}
                             for arm in inside for seed, v in pseudo[(axis, arm, "loss", w)].items()])
        tables[f"{axis}{CELL_SEPARATOR}{w}"] = stats.compare_arms(long, "loss", reference,
                                                                  equivalence_margin=margin)
    if not tables:
        return pd.DataFrame(columns=["family", "arm", "axis", "width", "p_t_holm", "p_tost_holm", "verdict"])
    out = stats.holm_family(tables)
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


# --------------------------------------------------------------------------- time


# process start-up of an isolated run, which its record does not time (the interpreter, torch and the
# tokenised data): a rounded-up allowance, measured on the docs' Benchmarks page
STARTUP_S = 3.0


def _run_key(config: dict, width: bool = True) -> str:
    model = {k: v for k, v in config["model"].items() if width or k != "d_model"}
    return repr([model, config["batch_size"], config["seq_len"], config["device"], config["dtype"]])


def _flops(tc: TrainConfig, cache: dict) -> float:
    """Forward FLOPs per token of ``tc`` (counted once per model and shape)."""
    from nodelm_lib.training.flops import forward_flops

    key = _run_key(to_dict(with_tokenizer_vocab(tc)))
    if key not in cache:
        cache[key] = forward_flops(tc)
    return cache[key]


def _timings(timing_store, cache: dict) -> pd.DataFrame:
    """One row per completed record of ``timing_store``: exact and width-free keys, arch, width,
    CPU, seconds per step with its evaluations (wall time / steps) and forward FLOPs per token."""
    rows = []
    for r in load_records(timing_store):
        steps, c = len(r.metrics), r.config
        if r.status != "completed" or not steps or r.wall_time_s < r.train_time_s or r.train_time_s <= 0:
            continue  # a resumed run's wall time covers its last part only
        rows.append({"key": _run_key(c), "family": _run_key(c, width=False),
                     "reference": c["model"]["arch"] == "gpt" and not c["model"]["parallel"],
                     "width": c["model"]["d_model"], "cpu": r.environment.get("cpu_capability", "?"),
                     "s_per_step": r.wall_time_s / steps, "flops": _flops(r.train_config, cache)})
    return pd.DataFrame(rows, columns=["key", "family", "reference", "width", "cpu", "s_per_step", "flops"])


def fixed_share(timings: pd.DataFrame) -> float:
    """The share of a step that does not grow with its FLOPs (optimizer and per-operator overheads),
    at the larger width, from the arms measured at two or more widths on one CPU type: per
    (arm, CPU), s/step = a + b FLOPs fitted through the medians; the median share a / s over them
    (0 where no arm was measured at two widths: time then scales with FLOPs alone)."""
    shares = []
    for _, g in timings.groupby(["family", "cpu"]):
        med = g.groupby("flops")["s_per_step"].median()
        if len(med) >= 2:
            b, a = np.polyfit(med.index.to_numpy(float), med.to_numpy(float), 1)
            shares.append(float(np.clip(a / (a + b * med.index.max()), 0.0, 0.95)))
    return float(np.median(shares)) if shares else 0.0


def step_seconds(configs: list[TrainConfig], timing_store) -> pd.DataFrame:
    """Seconds per training step (evaluations included) of each config, from the records of
    ``timing_store``: the median of the records of the same model, batch, sequence length, device
    and dtype ("measured"); else of the same model at the nearest width in FLOPs, or, for an arm
    with no record at all, of ``gpt`` (sequential blocks) at the nearest width, scaled as
    ``s (share + (1 - share) F / F_measured)`` with ``fixed_share`` ("scaled"); NaN without any."""
    cache: dict = {}
    timings = _timings(timing_store, cache)
    share = fixed_share(timings)
    exact = timings.groupby("key")["s_per_step"].median()
    rows = []
    for tc in configs:
        c = to_dict(with_tokenizer_vocab(tc))
        if _run_key(c) in exact.index:
            rows.append({"s_per_step": float(exact[_run_key(c)]), "source": "measured"})
            continue
        same, whose = timings[timings["family"] == _run_key(c, width=False)], "its own"
        if same.empty:
            same, whose = timings[timings["reference"]], "no record of this arm: gpt's"
        if same.empty:
            rows.append({"s_per_step": math.nan, "source": "no record of this arm or of gpt"})
            continue
        flops = _flops(tc, cache)
        near = same.loc[(np.log(same["flops"]) - math.log(flops)).abs().idxmin()]
        scale = share + (1 - share) * flops / float(near["flops"])
        rows.append({"s_per_step": float(same.loc[same["key"] == near["key"], "s_per_step"].median()) * scale,
                     "source": f"{whose} at d={int(near['width'])} scaled by FLOPs (fixed share {share:.2f})"})
    return pd.DataFrame(rows)


def format_time_estimate(totals: pd.DataFrame, workers: int) -> str:
    """``time_estimate``'s totals as lines to print."""
    from .estimate import format_seconds

    def when(seconds: float) -> str:
        return "unknown (no record to time it by)" if not math.isfinite(seconds) else format_seconds(seconds)

    lines = [f"{row['phase']}: {row['runs']} runs, {when(row['empty_store_s'])} from an empty store; "
             f"{row['runs_to_train']} not in the store, {when(row['this_store_s'])}" for _, row in totals.iterrows()]
    # skipna=False: a phase that cannot be timed leaves the total unknown, not 0
    lines.append(f"total, {workers} run(s) at a time: {when(totals['empty_store_s'].sum(skipna=False))} from an "
                 f"empty store, {when(totals['this_store_s'].sum(skipna=False))} with this store's runs")
    return "\n".join(lines)


def makespan(seconds: Iterable[float], workers: int) -> float:
    """Wall time of runs taking ``seconds`` each on ``workers`` lanes, longest first, each to the
    lane that frees first (as ``sweeps.train_all`` orders them)."""
    if workers < 1:
        raise ValueError(f"workers={workers!r} is not valid; it must be >= 1")
    lanes = np.zeros(workers)
    for s in sorted(seconds, reverse=True):
        lanes[np.argmin(lanes)] += s
    return float(lanes.max())


def time_estimate(phases: Mapping[str, list[tuple[str, TrainConfig]]], timing_store, workers: int = 2, store=None,
                  startup_s: float = STARTUP_S) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The time the runs of each phase (``{phase: [(cell, config), ...]}``, in order: a phase
    starts when the one before ends) take on ``workers`` lanes. Returns per (phase, cell) its runs,
    steps, seconds per step and their source (``step_seconds``) and seconds; and per phase the
    total from an empty store and, with ``store``, for the runs it lacks. A run costs its steps x
    seconds per step + ``startup_s``."""
    rows = []
    for phase, labelled in phases.items():
        per_step = step_seconds([tc for _, tc in labelled], timing_store)
        for (cell, tc), (_, s) in zip(labelled, per_step.iterrows()):
            rows.append({"phase": phase, "cell": cell, "steps": tc.max_steps, "s_per_step": s["s_per_step"],
                         "source": s["source"], "seconds": tc.max_steps * s["s_per_step"] + startup_s,
                         "stored": store is not None and finished_record(tc, store) is not None})
    runs = pd.DataFrame(rows)
    table = (runs.groupby(["phase", "cell", "steps", "source"], sort=False)
             .agg(runs=("seconds", "size"), s_per_step=("s_per_step", "median"), seconds=("seconds", "sum"),
                  stored=("stored", "sum")).reset_index())
    totals = pd.DataFrame([{"phase": phase, "runs": len(g), "empty_store_s": makespan(g["seconds"], workers),
                            "runs_to_train": int((~g["stored"]).sum()),
                            "this_store_s": makespan(g.loc[~g["stored"], "seconds"], workers)}
                           for phase, g in runs.groupby("phase", sort=False)])
    return table, totals


# --------------------------------------------------------------------------- display tables


def _interval_text(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """``"1.234 [1.200, 1.268]"``; "–" where the estimate is NaN."""
    if pd.isna(estimate):
        return "–"
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def display_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``cells_table`` as strings for the paper: mean ± CI half width, counts with separators."""
    from nodelm_lib.reporting.tables import format_mean_ci

    return pd.DataFrame({
        "arm": table["arm"], "width": table["width"], "seeds": table["seeds"], "lr": table["lr"].map("{:g}".format),
        "non-emb params": table["params_non_embedding"].map("{:,}".format),
        "training FLOPs": table["train_flops"].map("{:.3g}".format),
        "val loss": [format_mean_ci(m, h) for m, h in zip(table["val_loss_mean"], table["val_loss_ci"])],
        "test loss": [format_mean_ci(m, h) for m, h in zip(table["test_loss_mean"], table["test_loss_ci"])],
        "ms/step": [format_mean_ci(m, h, 1) for m, h in zip(table["ms_per_step_mean"], table["ms_per_step_ci"])],
    })


def display_fits(fits: pd.DataFrame) -> pd.DataFrame:
    """``Analysis.fits`` as strings: estimate [95% CI] of E and alpha (power laws) and of the
    loss change per doubling of x at the middle of the arm's range (both forms)."""
    return pd.DataFrame({
        "x": fits["axis"], "arm": fits["arm"], "form": fits["form"], "sizes": fits["sizes"],
        "E": [_interval_text(*r) for r in fits[["E", "E_ci_low", "E_ci_high"]].to_numpy()],
        "alpha": [_interval_text(*r) for r in fits[["alpha", "alpha_ci_low", "alpha_ci_high"]].to_numpy()],
        "per doubling": [_interval_text(*r) for r in fits[["slope_per_doubling", "slope_per_doubling_ci_low",
                                                           "slope_per_doubling_ci_high"]].to_numpy()],
        "why this form": fits["why"],
    })


def display_iso(iso: pd.DataFrame, reference: str = "gpt") -> pd.DataFrame:
    """``Analysis.iso`` as strings, the reference's own rows left out (its loss is in every other
    row's difference)."""
    rows = iso[iso["arm"] != reference]
    ref = iso[iso["arm"] == reference].set_index(["axis", "width"])
    return pd.DataFrame({
        "at": rows["axis"].map(lambda a: f"{reference}'s {a}"), f"{reference} width": rows["width"],
        "x": rows["x"].map("{:.3g}".format), "arm": rows["arm"],
        f"{reference} loss": [_interval_text(*ref.loc[(a, w), ["loss", "loss_ci_low", "loss_ci_high"]])
                              for a, w in zip(rows["axis"], rows["width"])],
        "arm loss": [_interval_text(*r) for r in rows[["loss", "loss_ci_low", "loss_ci_high"]].to_numpy()],
        f"minus {reference}'s": [_interval_text(*r) for r in rows[["diff", "diff_ci_low", "diff_ci_high"]].to_numpy()],
        "extrapolated": rows["extrapolated"].map({True: "yes", False: "no"}),
        "p (t, Holm)": rows["p_t_holm"].map(lambda p: "–" if pd.isna(p) else f"{p:.3g}"),
        "p (TOST, Holm)": rows["p_tost_holm"].map(lambda p: "–" if pd.isna(p) else f"{p:.3g}"),
        "verdict": rows["verdict"],
    }).reset_index(drop=True)


def bootstrap_table(boot: pd.DataFrame) -> pd.DataFrame:
    """Every bootstrapped number at full precision: axis, arm, what, width (0: not per width),
    estimate, sd_boot, ci_low, ci_high, n_seeds, n_boot, exact."""
    out = boot.copy()
    out.index = out.index.set_names(["axis", "arm", "what", "width"])
    return out.reset_index()


# --------------------------------------------------------------------------- figures


def _colors(n: int) -> list:
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(n)]


def _reference_lines(ax, references: Mapping[str, float]) -> list[str]:
    """Dashed grey lines for the references inside the axes' y-range (labelled at the right end);
    returns the labels of those outside it (to name in a note)."""
    lo, hi = ax.get_ylim()
    outside = []
    for label, value in sorted(references.items(), key=lambda kv: kv[1]):
        if lo <= value <= hi:
            ax.axhline(value, color="grey", linestyle="--", linewidth=0.8, zorder=1)
            ax.annotate(f"{label} {value:.2f}", (0.99, value), xycoords=ax.get_yaxis_transform(), ha="right",
                        va="bottom", fontsize=7, color="dimgrey")
        else:
            outside.append(f"{label} {value:.2f}")
    return outside


def loss_figure(points: pd.DataFrame, fitted: dict, order: Iterable[str], references: Mapping[str, float] = (),
                loss_unit: str = "nats/token", confidence: float = 0.95, title: str | None = None):
    """Test loss against non-embedding parameters and against training FLOPs (log x): per arm and
    width the mean over seeds with its t-based CI, and the arm's fitted trend over its range.
    ``references`` (label -> loss: n-gram models, nanoGPT) are dashed lines where they fall inside
    the axes, and named in a note where they do not."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, axis in zip(axes, AXES):
        col, label = AXES[axis]
        for arm, color in zip(order, _colors(len(order))):
            cells = cells_table(points[points["arm"] == arm], confidence)
            ax.errorbar(cells[col], cells["test_loss_mean"], yerr=cells["test_loss_ci"].fillna(0), fmt="o",
                        color=color, capsize=3, markersize=4)
            trend = fitted[(axis, arm)]
            xs = np.geomspace(trend.x_min, trend.x_max, 100)
            ax.plot(xs, trend(xs), color=color, linewidth=1.2, label=f"{arm} ({trend.form})")
        ax.set_xscale("log")
        # 200k, 500k, 1M: matplotlib's default labels every minor tick of a short log range, overlapping
        ax.xaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(mpl.ticker.EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
        ax.set_xlabel(f"{label} (log scale)" + (" [FLOP]" if axis == "flops" else " [count]"))
    axes[0].set_ylabel(f"test loss ({loss_unit})")
    outside = []
    for ax in axes:
        ax.autoscale_view()
        outside = _reference_lines(ax, dict(references))
    n = int(points.groupby(["arm", "width"])["seed"].nunique().min())
    fig.suptitle(title or f"test loss against size and compute: mean ± {confidence:.0%} CI over {n} seeds (t); "
                          "lines: fitted trends")
    rows = 1 + (len(order) > 4)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=min(len(order), 4), frameon=False,
               bbox_to_anchor=(0.5, 0.03))
    if outside:  # below the legend
        fig.text(0.5, 0.005, "off the axes: " + ", ".join(outside), fontsize=7, color="dimgrey", ha="center")
    fig.tight_layout(rect=(0, 0.06 + 0.05 * rows, 1, 1))
    return fig


def iso_figure(iso: pd.DataFrame, order: Iterable[str], margin: float, reference: str = "gpt",
               loss_unit: str = "nats/token", confidence: float = 0.95, title: str | None = None):
    """Iso-parameter (left) and iso-FLOP (right) differences to ``reference`` across its widths:
    each arm's fitted loss at the reference's x minus the reference's, with the bootstrap CI;
    hollow markers are extrapolations. The shaded band is the equivalence margin."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    order = list(order)
    colors = dict(zip(order, _colors(len(order))))  # each arm the colour it has in loss_figure
    arms = [a for a in order if a != reference]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, axis in zip(axes, AXES):
        label = AXES[axis][1]
        rows = iso[(iso["axis"] == label) & (iso["arm"] != reference)]
        widths = sorted(rows["width"].unique())
        for i, arm in enumerate(arms):
            color = colors[arm]
            g = rows[rows["arm"] == arm].set_index("width").reindex(widths)
            pos = np.arange(len(widths)) + (i - (len(arms) - 1) / 2) * 0.1
            err = np.vstack([g["diff"] - g["diff_ci_low"], g["diff_ci_high"] - g["diff"]])
            for inside in (True, False):
                m = (~g["extrapolated"].astype(bool)).to_numpy() == inside
                ax.errorbar(pos[m], g["diff"][m], yerr=err[:, m], fmt="o", color=color, capsize=3, markersize=4,
                            markerfacecolor=color if inside else "none", label=arm if inside else None)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.axhspan(-margin, margin, color="grey", alpha=0.15, linewidth=0, label=f"equivalence margin ±{margin:g}")
        x_of, eng = rows.groupby("width")["x"].first(), mpl.ticker.EngFormatter(places=2, sep="")
        ax.set_xticks(range(len(widths)), [f"d={w}\n{eng(x_of[w])}" for w in widths])
        ax.set_xlabel(f"{reference}'s width and its {label}" + (" [FLOP]" if axis == "flops" else " [count]"))
        ax.set_title(f"at equal {label}", fontsize=10)
    axes[0].set_ylabel(f"loss − {reference}'s ({loss_unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    fig.legend(keep.values(), keep.keys(), loc="lower center", ncol=min(len(keep), 7), frameon=False)
    fig.suptitle(title or f"fitted test loss minus {reference}'s at {reference}'s size and compute: estimate and "
                          f"{confidence:.0%} CI (bootstrap over seeds); hollow: extrapolated")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
