"""How long a sweep's runs take, from the per-step times of a store's records (notebook 07's
estimate; any notebook with phases of ``(name, TrainConfig)`` runs can use it).

Each run costs its steps times its seconds per step plus its scoring (``runs.timing.times_from``)
plus ``STARTUP_S``, and the runs of a phase are packed onto ``workers`` lanes longest first
(``makespan``).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from nodelm_lib.config import TrainConfig
from nodelm_lib.runs.store import finished_record, load_records
from nodelm_lib.runs.timing import STARTUP_S, record_timings, times_from

from .sweeps import resolve_workers


def format_time_estimate(totals: pd.DataFrame, with_store: bool = True) -> str:
    """``time_estimate``'s totals as lines to print, with the lanes it packed the runs on (its
    ``workers`` column: "auto" was resolved there). ``with_store=False`` prints the times from an
    empty store alone (for runs whose configs are not yet final, e.g. before their rates are chosen,
    so that what the store holds of them says nothing)."""
    from .estimate import format_seconds

    def when(seconds: float) -> str:
        return "unknown (no record to time it by)" if not math.isfinite(seconds) else format_seconds(seconds)

    lines = []
    for _, row in totals.iterrows():
        line = f"{row['phase']}: {row['runs']} runs, {when(row['empty_store_s'])} from an empty store"
        if with_store:
            line += f"; {row['runs_to_train']} not in the store, {when(row['this_store_s'])}"
        lines.append(line)
    workers = int(totals["workers"].iloc[0]) if len(totals) else 1
    # skipna=False: a phase that cannot be timed leaves the total unknown, not 0
    total = f"total, {workers} run(s) at a time: {when(totals['empty_store_s'].sum(skipna=False))} from an empty store"
    if with_store:
        total += f", {when(totals['this_store_s'].sum(skipna=False))} with this store's runs"
    lines.append(total)
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


def time_estimate(phases: Mapping[str, list[tuple[str, TrainConfig]]], timing_store, workers: int | str = 2,
                  store=None, startup_s: float = STARTUP_S) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The time the runs of each phase (``{phase: [(cell, config), ...]}``, in order: a phase
    starts when the one before ends) take on ``workers`` lanes (a count, or "auto" as a sweep sizes
    it: ``sweeps.resolve_workers``). Returns per (phase, cell) its runs, steps, seconds per step and
    their source (``run_times``) and seconds; and per phase the lanes, the total from an empty
    store and, with ``store``, for the runs it lacks. A run costs its steps x seconds per step + its
    scoring + ``startup_s``."""
    workers = resolve_workers(workers, [tc for labelled in phases.values() for _, tc in labelled], timing_store)
    timings = record_timings(load_records(timing_store, cached=True))
    rows = []
    for phase, labelled in phases.items():
        times = times_from([tc for _, tc in labelled], timings)
        for (cell, tc), (_, s) in zip(labelled, times.iterrows()):
            rows.append({"phase": phase, "cell": cell, "steps": tc.max_steps, "s_per_step": s["s_per_step"],
                         "source": s["source"], "seconds": s["seconds"] + startup_s,
                         "stored": store is not None and finished_record(tc, store) is not None})
    runs = pd.DataFrame(rows)
    table = (runs.groupby(["phase", "cell", "steps", "source"], sort=False)
             .agg(runs=("seconds", "size"), s_per_step=("s_per_step", "median"), seconds=("seconds", "sum"),
                  stored=("stored", "sum")).reset_index())
    totals = pd.DataFrame([{"phase": phase, "runs": len(g), "workers": workers, "empty_store_s": makespan(g["seconds"], workers),
                            "runs_to_train": int((~g["stored"]).sum()),
                            "this_store_s": makespan(g.loc[~g["stored"], "seconds"], workers)}
                           for phase, g in runs.groupby("phase", sort=False)])
    return table, totals
