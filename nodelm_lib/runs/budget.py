"""A time budget for training: start a run only if it can finish before a deadline.

GPU time may come in short leases (minutes at a stretch, a few minutes per command), so a sweep
is trained in chunks: ``python -m nodelm_lib chunk`` runs a notebook with a deadline, and every
run the notebook asks for (``store.run``, hence ``nl.sweep`` and the notebooks) first checks that
it fits. The deadline travels in the environment (``DEADLINE_ENV``, seconds since the epoch), so
it reaches the notebook's kernel and the isolated workers a sweep starts.

A run is estimated from the records already in its store (``timing.run_times``: its steps times
the seconds per training step, plus the time it spends scoring for the tokens it scores; the same
shape measured, else scaled by FLOPs from another width or from ``gpt``), plus
``timing.STARTUP_S``, and starts only if ``ESTIMATE_MARGIN`` times that fits. A run with nothing to
estimate it by (the first of a store) is assumed to take ``UNKNOWN_ENV`` seconds
(``DEFAULT_UNKNOWN_RUN_S`` by default). A run that does not fit raises ``BudgetReached``: nothing
of it has started, so the sweep stops with every finished run stored and none half done.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Iterable

from nodelm_lib.config import TrainConfig
from nodelm_lib.runs.timing import STARTUP_S, run_times
from nodelm_lib.training.record import RunRecord

DEADLINE_ENV = "NODELM_DEADLINE"
UNKNOWN_ENV = "NODELM_UNKNOWN_RUN_S"
DEFAULT_UNKNOWN_RUN_S = 300.0
# an estimate from records is a median: a run may take longer. Over the WikiText-2 store, each run
# estimated from the others took at most 1.16x its estimate (docs' Benchmarks page,
# bench/time_estimate.py), so a run starts only if this multiple of its estimate fits
ESTIMATE_MARGIN = 1.2
# where each run that did not fit is reported (a line each), so that a caller (``chunks``) tells a
# stop at the budget from a failure whatever the notebook's runner prints
REPORT_ENV = "NODELM_BUDGET_REPORT"


class BudgetReached(RuntimeError):
    """The next run would not finish before the deadline; nothing of it was started."""


def deadline() -> float | None:
    """The deadline (seconds since the epoch) set in the environment, or None for no budget."""
    return _env_seconds(DEADLINE_ENV, None, -math.inf, "a finite time in seconds since the epoch")


def unknown_run_s() -> float:
    """Seconds assumed for a run that no stored record can time."""
    return _env_seconds(UNKNOWN_ENV, DEFAULT_UNKNOWN_RUN_S, 0.0, "a number of seconds >= 0")


def _env_seconds(name: str, default: float | None, minimum: float, meaning: str) -> float | None:
    """The finite number of seconds >= ``minimum`` in environment variable ``name``, or
    ``default`` where it is unset or empty; a ValueError naming the value otherwise."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= minimum):
        raise ValueError(f"{name}={value!r} is not valid: it must be {meaning}")
    return seconds


def estimate_run_s(tc: TrainConfig, records: Iterable[RunRecord]) -> tuple[float, str]:
    """Seconds ``tc`` would take to train, and how that was estimated."""
    run = run_times([tc], records).iloc[0]
    if not math.isfinite(run["seconds"]):
        return unknown_run_s(), f"assumed ({UNKNOWN_ENV}): {run['source']}"
    return run["seconds"] + STARTUP_S, str(run["source"])


def budgeted_run_s(tc: TrainConfig, records: Iterable[RunRecord]) -> tuple[float, str]:
    """The seconds of the budget a run of ``tc`` must find left to start: ``ESTIMATE_MARGIN`` x
    its estimate from ``records``, or the assumed seconds of a run nothing can time."""
    seconds, how = estimate_run_s(tc, records)
    if how.startswith("assumed"):
        return seconds, how
    return ESTIMATE_MARGIN * seconds, f"{ESTIMATE_MARGIN} x the {seconds:.0f} s estimated: {how}"


def check_budget(tc: TrainConfig, records: Callable[[], Iterable[RunRecord]]) -> None:
    """Raise ``BudgetReached`` unless ``tc`` can finish before the deadline (none set: always).
    ``records`` gives the finished records to estimate it by (called only under a deadline)."""
    until = deadline()
    if until is None:
        return
    left = until - time.time()
    need, how = budgeted_run_s(tc, records())
    if need > left:
        message = (f"run {tc.config_hash()} ({tc.model.arch}, seed {tc.seed}, {tc.max_steps} steps) needs about "
                   f"{need:.0f} s ({how}) and {max(left, 0):.0f} s of the budget are left")
        report = os.environ.get(REPORT_ENV)
        if report:
            with open(report, "a") as f:
                f.write(message.replace("\n", " ") + "\n")
        raise BudgetReached(message + ": not started")
