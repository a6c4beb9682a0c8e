"""How long a run of a config takes, from the times of finished records: what a sweep's time
estimate (``experiments.sweep_time``), a time budget (``runs.budget``) and the order of a sweep's
runs (``experiments.sweeps.expected_seconds``) go by.

A run's time has two parts that grow with different things. Training grows with its steps;
scoring (its validation curve and its final losses) grows with the tokens it scores
(``training.evaluation.scored_tokens``): a 500-step selection run that scores a whole validation
split spends most of its time scoring, so it cannot be priced at a 2000-step run's seconds per step.
Each finished record gives its seconds per training step (``train_time_s`` / steps) and the rest of
its wall time with the tokens it scored. A config takes both from the records of the same run shape
("measured"), else from the nearest width of the same model, or of ``gpt``, or of any model run at
the same batch, sequence length, device and dtype, scaled by forward FLOPs with the share of a step
that does not grow with them (``fixed_share``). A run costs steps x seconds per step + its scoring,
plus ``STARTUP_S``.

Records are keyed by their config as this version reads it (``RunRecord.train_config``), so that a
record written before a config field existed matches the configs that now carry its default. Where a
store holds records of one run shape from several machines (CPUs differ 2-3x at the same steps), the
records of this machine are used if there are any (``this_machine``).
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np
import pandas as pd

from nodelm_lib.config import TrainConfig, to_dict
from nodelm_lib.families import BASELINE
from nodelm_lib.training.evaluation import scored_tokens
from nodelm_lib.training.flops import forward_flops, model_with_vocab
from nodelm_lib.training.record import RunRecord

# process start-up of an isolated run, which its record does not time (the interpreter, torch and the
# tokenised data): a rounded-up allowance, measured on the docs' Benchmarks page
STARTUP_S = 3.0

COLUMNS = ["s_per_step", "scoring_s", "seconds", "source"]


def _run_key(config: dict, width: bool = True) -> str:
    model = {k: v for k, v in config["model"].items() if width or k != "d_model"}
    return repr([model, *_shape(config)])


def _shape(config: dict) -> list:
    return [config["batch_size"], config["seq_len"], config["device"], config["dtype"]]


def _shape_key(config: dict) -> str:
    return repr(_shape(config))


def as_recorded(tc: TrainConfig) -> dict:
    """``tc`` as its run's record stores it, with the model's vocabulary filled in
    (``flops.model_with_vocab``), finished or not: what a key that matches configs against
    records is built from."""
    return {**to_dict(tc), "model": to_dict(model_with_vocab(tc))}


def machine_of(environment: dict) -> str:
    """The kind of machine a record's environment names: its GPU, else its CPU and torch's capability."""
    if environment.get("device_name"):
        return str(environment["device_name"])
    return f"{environment.get('cpu_name', 'unknown CPU')} ({environment.get('cpu_capability', '?')})"


@functools.lru_cache(maxsize=8)
def this_machine(device: str) -> str:
    """The kind of machine a run on ``device`` (a config's ``device``) would run on here."""
    import torch

    from nodelm_lib.training.profiling import cpu_description

    if device in ("auto", "cuda") or device.startswith("cuda:"):
        if torch.cuda.is_available():
            return machine_of({"device_name": torch.cuda.get_device_name(0 if device == "auto" else device)})
    return machine_of(cpu_description())


def recorded_scored_tokens(record: RunRecord, tc: TrainConfig | None = None) -> int:
    """Tokens ``record``'s run scored besides training: its curve's evaluations and its final
    scores, counted from the record (``scored_tokens`` of its config where the record lacks a count).
    ``tc``: the record's config as this version reads it, when the caller has it already."""
    tc = record.train_config if tc is None else tc  # defaults filled in for fields an older record lacks
    final = record.final
    if tc.eval_on == "whole_split":
        curve = final.get("val_tokens")
    else:
        curve = tc.eval_batches * tc.batch_size * tc.seq_len
    extra = final.get("val_tokens") if tc.eval_on == "whole_split_at_end" else 0
    test = final.get("test_tokens", 0 if "test_loss" not in final else None)
    if curve is None or extra is None or test is None:
        return scored_tokens(tc)
    return len(record.evals) * curve + extra + test


def record_timings(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per completed record: exact and width-free keys, arch, width, CPU, seconds per
    training step, the seconds of its wall time spent outside training steps (scoring, setting up)
    with the tokens it scored, and forward FLOPs per token."""
    rows = []
    for r in records:
        steps = len(r.metrics)
        if r.status != "completed" or not steps or r.wall_time_s < r.train_time_s or r.train_time_s <= 0:
            continue  # a resumed run's wall time covers its last part only
        tc = r.train_config
        c = as_recorded(tc)
        rows.append({"key": _run_key(c), "family": _run_key(c, width=False), "shape": _shape_key(c),
                     "arch": c["model"]["arch"],
                     "reference": c["model"]["arch"] == BASELINE and not c["model"]["parallel"],
                     "width": c["model"]["d_model"], "cpu": r.environment.get("cpu_capability", "?"),
                     "machine": machine_of(r.environment),
                     "s_per_step": r.train_time_s / steps, "other_s": r.wall_time_s - r.train_time_s,
                     "scored": recorded_scored_tokens(r, tc), "flops": _record_flops(r, tc)})
    return pd.DataFrame(rows, columns=["key", "family", "shape", "arch", "reference", "width", "cpu", "machine",
                                       "s_per_step", "other_s", "scored", "flops"])


def _record_flops(record: RunRecord, tc: TrainConfig) -> float:
    """Forward FLOPs per token of a record's run at its whole batch, as ``forward_flops`` counts a
    config's: the record's own count where it was made at that batch (``store.read_record`` counts
    again any made at another), else counted (a data-parallel record's is per rank)."""
    if record.flops_batch_size == tc.batch_size and record.flops_per_token > 0:
        return record.flops_per_token
    return forward_flops(tc)


def fixed_share(timings: pd.DataFrame) -> float:
    """The share of a training step that does not grow with its FLOPs (optimizer and per-operator
    overheads), at the larger width, from the arms measured at two or more widths on one CPU type:
    per (arm, CPU), s/step = a + b FLOPs fitted through the medians; the median share a / s over
    them (0 where no arm was measured at two widths: time then scales with FLOPs alone)."""
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


def _priced(tc: TrainConfig, rows: pd.DataFrame, scale: float, source: str, machine: str | None) -> dict:
    """``tc``'s time from the records ``rows`` of one run shape (those of ``machine``, by default
    ``this_machine``, where there are any): the median seconds per training step, and the median of each record's time
    outside training scaled to the tokens ``tc`` scores (as is, for a record that scored nothing),
    both times ``scale``."""
    here = rows[rows["machine"] == (machine or this_machine(tc.device))]
    if not here.empty:
        rows = here
    elif source == "measured":
        source = f"measured on another machine: {', '.join(sorted(set(rows['machine'])))}"
    s_per_step = float(rows["s_per_step"].median()) * scale
    tokens = scored_tokens(tc)
    per_record = np.where(rows["scored"] > 0, rows["other_s"] * tokens / rows["scored"].clip(lower=1), rows["other_s"])
    scoring_s = float(np.median(per_record)) * scale
    return {"s_per_step": s_per_step, "scoring_s": scoring_s, "seconds": tc.max_steps * s_per_step + scoring_s,
            "source": source}


def run_times(configs: list[TrainConfig], records: Iterable[RunRecord]) -> pd.DataFrame:
    """Per config, from ``records`` (a store's, ``load_records``): its seconds per training step,
    its seconds of scoring (and setting up) and the run's seconds (``max_steps`` x seconds per step
    + scoring; ``STARTUP_S`` is not included), with their source: the records of the same model,
    batch, sequence length, device and dtype ("measured"); else of the same model at the nearest
    width in FLOPs, or, for an arm with no record at all, of ``gpt`` (sequential blocks) at the
    nearest width, and without gpt, of the model nearest in FLOPs among those run at the same batch,
    sequence length, device and dtype (a GPU sweep in chunks meets arms before gpt's records come
    home), scaled as ``share + (1 - share) F / F_measured`` with ``fixed_share`` ("scaled"); NaN
    without any."""
    return times_from(configs, record_timings(records))


def times_from(configs: list[TrainConfig], timings: pd.DataFrame, machine: str | None = None) -> pd.DataFrame:
    """``run_times`` from the rows ``record_timings`` made of the records, as on ``machine``
    (``machine_of`` a record's environment; by default ``this_machine``)."""
    share = fixed_share(timings)
    rows = []
    for tc in configs:
        c = as_recorded(tc)
        exact = timings[timings["key"] == _run_key(c)]
        if not exact.empty:
            rows.append(_priced(tc, exact, 1.0, "measured", machine))
            continue
        same, whose = timings[timings["family"] == _run_key(c, width=False)], "its own"
        if same.empty:
            same, whose = timings[timings["reference"]], "no record of this arm: gpt's"
        flops = forward_flops(tc)
        if same.empty:
            same, whose = timings[timings["shape"] == _shape_key(c)], None
            if same.empty:
                rows.append({"s_per_step": math.nan, "scoring_s": math.nan, "seconds": math.nan,
                             "source": "no record of this arm or of gpt"})
                continue
        near = same.loc[_nearest(same, flops)]
        if whose is None:
            whose = f"no record of this arm or of gpt: {near['arch']}'s"
        scale = share + (1 - share) * flops / float(near["flops"])
        rows.append(_priced(tc, same[same["key"] == near["key"]], scale,
                            f"{whose} at d={int(near['width'])} scaled by FLOPs (fixed share {share:.2f})", machine))
    return pd.DataFrame(rows, columns=COLUMNS)
