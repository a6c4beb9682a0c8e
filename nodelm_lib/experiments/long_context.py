"""Evaluation past the training context: the loss at each position of long windows.

A model trained on windows of T tokens is scored on windows of L >= T tokens: the split is cut
into consecutive, non-overlapping windows of L (``data.split_windows``) and the loss of each
position p = 0 .. L-1 is averaged over the windows, so position p is the loss with p tokens of
context. A model that uses context it never saw in training keeps lowering its loss past T; one
that breaks down raises it. Only models whose positions are not a learned table can go past
their ``max_seq_len`` (rotary positions, or none: an SSM); the others refuse with the model's
own error.

Evaluations of a run's final model are kept beside its record (``store.write_evaluations``), so
a table is rebuilt from stored numbers in a clone without the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from nodelm_lib.data import check_count, split_windows
from nodelm_lib.runs.store import (DEFAULT_CHECKPOINTS, DEFAULT_STORE, checkpoint_path, evaluations_store,
                                   read_evaluations, write_evaluations)
from nodelm_lib.training.device import resolve_device
from nodelm_lib.training.evaluation import split_tokens
from nodelm_lib.training.record import RunRecord

if TYPE_CHECKING:
    import pandas as pd

SPLITS = ("validation", "test")


@torch.no_grad()
def loss_by_position(model: torch.nn.Module, tokens, window: int, batch_size: int = 1,
                     max_windows: int | None = None, device: torch.device | str = "cpu") -> dict:
    """Mean loss (nats) at each position of consecutive, non-overlapping windows of ``window``
    tokens over ``tokens`` (a split), in eval mode: ``{"loss": array (window,), "windows": n}``.

    Entry p averages the loss of predicting token p + 1 of a window from its first p + 1 tokens
    over every window (the first ``max_windows`` only, if given); ``device`` may be "auto". The mean of the curve is the
    split's loss at that context (``evaluate_split``). Logits of one batch are (batch_size,
    window, vocab) floats: keep ``batch_size`` small for long windows and large vocabularies."""
    check_count("window", window)
    batches = split_windows(tokens, batch_size, window, max_windows)
    device = resolve_device(device) if isinstance(device, str) else device
    was_training = model.training
    model.eval()
    total = torch.zeros(window, dtype=torch.float64)
    count = 0
    try:
        for x, y in batches:
            logits, _ = model(x.to(device))
            losses = F.cross_entropy(logits.float().transpose(1, 2), y.to(device), reduction="none")
            total += losses.double().sum(0).cpu()
            count += x.shape[0]
    finally:
        model.train(was_training)
    return {"loss": (total / count).numpy(), "windows": count}


def position_key(split: str, window: int, max_windows: int | None) -> str:
    """The name of one loss-by-position curve among a run's stored evaluations."""
    return f"loss_by_position {split} {window} " + ("all" if max_windows is None else f"first {max_windows}")


def position_curves(record: RunRecord, windows: Iterable[int], split: str = "validation",
                    max_windows: int | None = None, store: str | Path | None = DEFAULT_STORE,
                    checkpoints: str | Path = DEFAULT_CHECKPOINTS, device: str = "cpu",
                    batch_size: int = 1) -> "pd.DataFrame":
    """``loss_by_position`` of a run's final model at each window length of ``windows``, on
    ``split`` of the run's corpus: one row per (window, position) with ``loss`` and ``windows``
    (how many windows were averaged). Curves not yet among the run's stored evaluations are
    computed from its final model (``run(..., need_checkpoint=True)`` puts it on disk) and kept
    beside the record when ``store`` is given; the others are read back."""
    import pandas as pd

    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; choose from {list(SPLITS)}")
    windows = [int(w) for w in windows]
    for w in windows:
        check_count("window", w)
    if store is not None:
        store = evaluations_store(record, store, checkpoints)  # a retraining that ended elsewhere: its side store
    stored = read_evaluations(record, store) if store is not None else {}
    missing = [w for w in windows if position_key(split, w, max_windows) not in stored]
    if missing:
        stored = {**stored, **_evaluate_positions(record, missing, split, max_windows, checkpoints, device,
                                                  batch_size)}
        if store is not None:
            write_evaluations(record, stored, store)
    frames = []
    for w in windows:
        value = stored[position_key(split, w, max_windows)]
        frames.append(pd.DataFrame({"config_hash": record.config_hash, "seed": record.seed, "window": w,
                                    "position": np.arange(w), "loss": value["loss"], "windows": value["windows"]}))
    return pd.concat(frames, ignore_index=True)


def arm_position_curves(models: Iterable[tuple[str, RunRecord]], windows: Iterable[int], split: str = "validation",
                        max_windows: int | None = None, device: str = "cpu", batch_size: int = 1,
                        store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                        isolate: bool = True, workers: int = 1, progress: bool = False, launcher=None) -> "pd.DataFrame":
    """``position_curves`` of every (arm name, record) of ``models``, one table with an ``arm``
    column. A run with a curve not yet stored and no final model on disk is trained again first
    (``need_checkpoint``: deterministic, so on the same kind of CPU to the same numbers)."""
    import pandas as pd

    from .sweeps import with_weights_where_missing

    windows = [int(w) for w in windows]
    models = list(models)
    arms = [arm for arm, _ in models]
    records = with_weights_where_missing(models, lambda r: positions_missing(r, windows, split, max_windows, store),
                                         store, checkpoints, isolate, workers, progress, launcher)
    return pd.concat([position_curves(record, windows, split, max_windows, store, checkpoints, device, batch_size)
                      .assign(arm=arm) for arm, record in zip(arms, records)], ignore_index=True)


def positions_missing(record: RunRecord, windows: Iterable[int], split: str = "validation",
                      max_windows: int | None = None, store: str | Path = DEFAULT_STORE) -> bool:
    """Whether ``position_curves`` needs the run's weights: some curve is not stored."""
    stored = read_evaluations(record, store)
    return any(position_key(split, int(w), max_windows) not in stored for w in windows)


def _evaluate_positions(record: RunRecord, windows: list[int], split: str, max_windows: int | None,
                        checkpoints, device: str, batch_size: int) -> dict[str, dict]:
    """``{position_key: {"loss": [...], "windows": n}}`` of the run's final model (from
    ``checkpoints``), rounded to 1e-6 nats so that the stored file stays small."""
    from nodelm_lib.training.model_files import load_model

    path = checkpoint_path(record.config_hash, checkpoints)
    if not path.exists():
        raise FileNotFoundError(f"no final model of run {record.config_hash} at {path}, and no stored "
                                f"loss-by-position curve of it at window {windows[0]}; train it with "
                                "run(..., need_checkpoint=True)")
    device = resolve_device(device)
    model = load_model(path, device=device)
    tokens = split_tokens(record.train_config, split)
    out = {}
    for w in windows:
        curve = loss_by_position(model, tokens, w, batch_size, max_windows, device)
        out[position_key(split, w, max_windows)] = {"loss": [round(float(v), 6) for v in curve["loss"]],
                                                    "windows": curve["windows"]}
    return out


# --------------------------------------------------------------------------- summaries


def context_bands(train_context: int, longest: int) -> list[tuple[int, int]]:
    """Position bands for a long-context table: [0, T), then doublings [T, 2T), [2T, 4T), ...
    up to ``longest`` (the last band ends there)."""
    check_count("train_context", train_context)
    check_count("longest", longest)
    bands, lo, hi = [(0, min(train_context, longest))], train_context, 2 * train_context
    while lo < longest:
        bands.append((lo, min(hi, longest)))
        lo, hi = hi, 2 * hi
    return bands


def band_label(lo: int, hi: int) -> str:
    return f"[{lo}, {hi})"


def band_losses(curves: "pd.DataFrame", train_context: int) -> "pd.DataFrame":
    """Per run (``config_hash``) and window, the mean loss over each ``context_bands`` band of
    positions: columns ``band`` (its label), ``lo``, ``hi``, ``loss``; other columns of
    ``curves`` that are constant per run (arm, seed, ...) are kept."""
    import pandas as pd

    keys = [c for c in curves.columns if c not in ("position", "loss", "windows")]
    rows = []
    for values, g in curves.groupby(keys, sort=False):
        g = g.sort_values("position")
        loss = g["loss"].to_numpy()
        for lo, hi in context_bands(train_context, len(loss)):
            rows.append({**dict(zip(keys, values)), "band": band_label(lo, hi), "lo": lo, "hi": hi,
                         "loss": float(loss[lo:hi].mean())})
    return pd.DataFrame(rows)


def long_context_table(curves: "pd.DataFrame", train_context: int, confidence: float = 0.95) -> "pd.DataFrame":
    """The long-context table: per arm and position band of the longest window, the mean loss
    over seeds with its t interval's half-width (``ci_half``) and ``n`` seeds; then, per arm, a
    row ``change`` with the paired difference (by seed) of the last band's loss minus the
    trained band's [0, T): negative means the model uses context past T. ``curves`` is
    ``position_curves``' rows with an ``arm`` column."""
    import pandas as pd

    longest = int(curves["window"].max())
    bands = band_losses(curves[curves["window"] == longest], train_context)
    spans = context_bands(train_context, longest)
    first, last = band_label(*spans[0]), band_label(*spans[-1])
    rows = []
    for arm, g in bands.groupby("arm", sort=False):
        for band, b in g.groupby("band", sort=False):
            rows.append({"arm": arm, "band": band, **_summary(b["loss"].to_numpy(), confidence)})
        by_seed = g.pivot_table(index="seed", columns="band", values="loss")
        rows.append({"arm": arm, "band": f"change {last} - {first}",
                     **_summary((by_seed[last] - by_seed[first]).to_numpy(), confidence)})
    return pd.DataFrame(rows)


def _summary(values: np.ndarray, confidence: float) -> dict:
    from nodelm_lib.reporting.stats import mean_ci

    s = mean_ci(values, confidence)
    return {"mean": s["mean"], "ci_half": s["ci_half"], "n": s["n"]}


# --------------------------------------------------------------------------- paired tests of the claims

#: the quantities a test compares, per run, on the longest window: the loss over the trained band
#: [0, T), over the last band, and the change from the one to the other (the degradation)
QUANTITIES = ("trained band", "last band", "change")


def seed_quantities(curves: "pd.DataFrame", train_context: int) -> "pd.DataFrame":
    """Per run (arm, seed) on the longest window: one row per quantity of ``QUANTITIES`` with its
    ``label`` (as in ``long_context_table``: the band, or "change <last> - <first>") and ``loss``."""
    import pandas as pd

    longest = int(curves["window"].max())
    bands = band_losses(curves[curves["window"] == longest], train_context)
    spans = context_bands(train_context, longest)
    first, last = band_label(*spans[0]), band_label(*spans[-1])
    labels = {"trained band": first, "last band": last, "change": f"change {last} - {first}"}
    rows = []
    for (arm, seed), g in bands.groupby(["arm", "seed"], sort=False):
        loss = g.set_index("band")["loss"]
        values = {"trained band": loss[first], "last band": loss[last], "change": loss[last] - loss[first]}
        rows += [{"arm": arm, "seed": seed, "quantity": q, "label": labels[q], "loss": float(values[q])}
                 for q in QUANTITIES]
    return pd.DataFrame(rows)


def claim_comparisons(arms, reference: str = "gpt") -> list[tuple[str, str, str]]:
    """08's claims as (quantity, arm, reference) comparisons: every arm's change against
    ``reference``'s (which degrades less), ``ti_ssm``'s change against ``ssm``'s (the mixer or the
    time index), and ``ti_ssm`` against ``reference`` in the last band (the SSM guide's claim: better
    on long sequences) and in the trained band; those naming an arm not in ``arms`` are left out."""
    arms = list(arms)
    if reference not in arms:
        raise ValueError(f"reference {reference!r} is not one of the arms {arms}")
    out = [("change", arm, reference) for arm in arms if arm != reference]
    if "ti_ssm" in arms and "ssm" in arms:
        out.append(("change", "ti_ssm", "ssm"))
    if "ti_ssm" in arms and reference != "ti_ssm":
        out += [("last band", "ti_ssm", reference), ("trained band", "ti_ssm", reference)]
    return out


def claim_tests(curves: "pd.DataFrame", train_context: int, comparisons, confidence: float = 0.95) -> "pd.DataFrame":
    """Paired tests by seed of ``comparisons`` ((quantity, arm, reference) of ``QUANTITIES``, e.g.
    ``claim_comparisons``) on ``seed_quantities``: ``comparisons.compare_arms`` (paired t, Wilcoxon;
    ``mean_diff`` is arm minus reference) per (quantity, reference), Holm over every comparison
    together (``comparisons.holm_family``). Columns ``quantity`` and ``label`` name what is compared."""
    import pandas as pd

    from nodelm_lib.reporting.comparisons import compare_arms, holm_family

    comparisons = list(comparisons)
    bad = [c for c in comparisons if c[0] not in QUANTITIES]
    if bad:
        raise ValueError(f"comparisons {bad} name an unknown quantity; choose from {list(QUANTITIES)}")
    per_run = seed_quantities(curves, train_context)
    groups: dict[tuple[str, str], list[str]] = {}
    for quantity, arm, reference in comparisons:
        groups.setdefault((quantity, reference), []).append(arm)
    tables = {}
    for (quantity, reference), arms in groups.items():
        rows = per_run[(per_run["quantity"] == quantity) & per_run["arm"].isin([reference, *arms])]
        tables[f"{quantity} vs {reference}"] = compare_arms(rows, "loss", reference, confidence=confidence)
    out = holm_family(tables)
    labels = per_run.drop_duplicates("quantity").set_index("quantity")["label"]
    quantity = out["family"].str.rpartition(" vs ")[0]
    order = {c: i for i, c in enumerate(comparisons)}
    out = out.assign(quantity=quantity, label=quantity.map(labels)).drop(columns="family")
    out = out.iloc[sorted(range(len(out)), key=lambda i: order[(out["quantity"].iloc[i], out["arm"].iloc[i],
                                                                out["reference"].iloc[i])])]
    return out[["quantity", "label", *[c for c in out.columns if c not in ("quantity", "label")]]].reset_index(drop=True)
