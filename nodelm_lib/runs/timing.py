"""Seconds per training step of a config, from the per-step times of finished records: what a
sweep's time estimate (``experiments.sweep_time``) and a time budget (``runs.budget``) go by.

A config's seconds per step come from the records of the same run shape ("measured"), else from the
nearest width of the same model, or of ``gpt``, or of any model run at the same batch, sequence length,
device and dtype, scaled by forward FLOPs with the share of a step that does not grow with them
(``fixed_share``); a run costs its steps times that plus ``STARTUP_S``.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

from nodelm_lib.config import TrainConfig, to_dict
from nodelm_lib.training.evaluation import with_tokenizer_vocab
from nodelm_lib.training.record import RunRecord

# process start-up of an isolated run, which its record does not time (the interpreter, torch and the
# tokenised data): a rounded-up allowance, measured on the docs' Benchmarks page
STARTUP_S = 3.0


def _run_key(config: dict, width: bool = True) -> str:
    model = {k: v for k, v in config["model"].items() if width or k != "d_model"}
    return repr([model, *_shape(config)])


def _shape(config: dict) -> list:
    return [config["batch_size"], config["seq_len"], config["device"], config["dtype"]]


def _shape_key(config: dict) -> str:
    return repr(_shape(config))


def _flops(tc: TrainConfig, cache: dict) -> float:
    """Forward FLOPs per token of ``tc`` (counted once per model and shape)."""
    from nodelm_lib.training.flops import forward_flops

    key = _run_key(to_dict(with_tokenizer_vocab(tc)))
    if key not in cache:
        cache[key] = forward_flops(tc)
    return cache[key]


def _timings(records: Iterable[RunRecord], cache: dict) -> pd.DataFrame:
    """One row per completed record: exact and width-free keys, arch, width, CPU, seconds per
    step with its evaluations (wall time / steps) and forward FLOPs per token."""
    rows = []
    for r in records:
        steps, c = len(r.metrics), r.config
        if r.status != "completed" or not steps or r.wall_time_s < r.train_time_s or r.train_time_s <= 0:
            continue  # a resumed run's wall time covers its last part only
        rows.append({"key": _run_key(c), "family": _run_key(c, width=False), "shape": _shape_key(c),
                     "arch": c["model"]["arch"],
                     "reference": c["model"]["arch"] == "gpt" and not c["model"]["parallel"],
                     "width": c["model"]["d_model"], "cpu": r.environment.get("cpu_capability", "?"),
                     "s_per_step": r.wall_time_s / steps, "flops": _flops(r.train_config, cache)})
    return pd.DataFrame(rows, columns=["key", "family", "shape", "arch", "reference", "width", "cpu", "s_per_step",
                                       "flops"])


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


def _nearest(timings: pd.DataFrame, flops: float):
    """The index of the row of ``timings`` nearest to ``flops`` in log FLOPs."""
    return (np.log(timings["flops"]) - math.log(flops)).abs().idxmin()


def step_seconds(configs: list[TrainConfig], records: Iterable[RunRecord]) -> pd.DataFrame:
    """Seconds per training step (evaluations included) of each config, from ``records`` (a
    store's, ``load_records``): the median of the records of the same model, batch, sequence length, device
    and dtype ("measured"); else of the same model at the nearest width in FLOPs, or, for an arm
    with no record at all, of ``gpt`` (sequential blocks) at the nearest width, and without gpt, of
    the model nearest in FLOPs among those run at the same batch, sequence length, device and dtype
    (a GPU sweep in chunks meets arms before gpt's records come home), scaled as
    ``s (share + (1 - share) F / F_measured)`` with ``fixed_share`` ("scaled"); NaN without any."""
    cache: dict = {}
    timings = _timings(records, cache)
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
        flops = _flops(tc, cache)
        if same.empty:
            same, whose = timings[timings["shape"] == _shape_key(c)], None
            if same.empty:
                rows.append({"s_per_step": math.nan, "source": "no record of this arm or of gpt"})
                continue
        near = same.loc[_nearest(same, flops)]
        if whose is None:
            whose = f"no record of this arm or of gpt: {near['arch']}'s"
        scale = share + (1 - share) * flops / float(near["flops"])
        rows.append({"s_per_step": float(same.loc[same["key"] == near["key"], "s_per_step"].median()) * scale,
                     "source": f"{whose} at d={int(near['width'])} scaled by FLOPs (fixed share {share:.2f})"})
    return pd.DataFrame(rows)
