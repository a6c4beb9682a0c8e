"""``make reproduce``: every notebook of a profile in turn, timed, with a record of the timings.

The Makefile keeps the recipe for one notebook (papermill with ``params/<nb>/<profile>.yaml``);
``reproduce`` runs ``make <nb> PROFILE=<profile>`` for each and, after each one, rewrites

    results/reproduce_<profile>.json   started, commit, machine (CPU, torch), CPU probe readings,
                                       per-notebook seconds, new stored runs, total, status
    results/reproduce_<profile>.csv    the same as a table (``make tables`` renders it in the docs)

so that a reproduce stopped halfway keeps the times it measured, and a total quoted anywhere comes
from a record. A notebook with variants of the profile (``params/<nb>/<profile>_<name>.yaml``, e.g.
02's ``cpu_wikitext2``: a second corpus) runs once per variant too, each a step of its own. The CPU probe (``profiling.cpu_availability``) runs before and after: on a shared
VM the same profile takes very different wall times, and the reading says what kind of day it was.
Notebooks 02 and 03 read runs already in ``results/runs/<profile>/`` back instead of training
them; ``new_stored_runs`` counts the records a step added there, so a total with 0 of them timed
reading, not training. Only a reproduce that starts with that folder empty times the whole
experiment (01 and 04-06 always train: they do not use the run store).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from nodelm_lib.files import atomic_write_text


@dataclass
class Step:
    """One timed step: a notebook, or a CPU probe (whose result goes in ``status``)."""

    name: str
    started: str
    seconds: float
    status: str
    new_stored_runs: int | None = None


@dataclass
class ReproduceRecord:
    profile: str
    started: str
    commit: str | None
    machine: dict = field(default_factory=dict)  # CPU and torch: the same code runs at very different speeds
    steps: list[Step] = field(default_factory=list)
    total_s: float | None = None
    status: str = "running"

    def table(self) -> pd.DataFrame:
        """One row per step, then the total (the CSV that the docs render)."""
        rows = [{"step": s.name, "started (UTC)": s.started, "minutes": round(s.seconds / 60, 2),
                 "new stored runs": s.new_stored_runs, "status": s.status} for s in self.steps]
        total = self.total_s if self.total_s is not None else sum(s.seconds for s in self.steps)
        rows.append({"step": "total", "started (UTC)": self.started, "minutes": round(total / 60, 2),
                     "new stored runs": sum(s.new_stored_runs or 0 for s in self.steps), "status": self.status})
        return pd.DataFrame(rows).astype({"new stored runs": "Int64"})


def _utc(fmt: str = "%Y-%m-%d %H:%M") -> str:
    """The time now, in UTC (records are compared across machines and time zones)."""
    return dt.datetime.now(dt.timezone.utc).strftime(fmt)


# What a reproduce rewrites, and what a from-scratch one deletes first (results/runs/<profile>/):
# changes there say nothing about the code that ran.
OUTPUT_DIRS = ("results", "figures")


def _git_commit(root: Path) -> str | None:
    """The commit the notebooks run from, ``-dirty`` if tracked files outside ``OUTPUT_DIRS`` differ
    from it (the docs pages count: ``make tables`` rewrites only their marked sections)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){d}" for d in OUTPUT_DIRS))
    return f"{commit}-dirty" if changed else commit


def make_notebook(make: str, profile: str, root: Path) -> Callable[..., int]:
    """The default way to run one notebook: ``make --no-print-directory <nb> PROFILE=<profile>``
    (``run(nb, variant)`` runs it with another profile: a variant, see ``variants``)."""
    def run(notebook: str, variant: str | None = None) -> int:
        return subprocess.run([make, "--no-print-directory", notebook, f"PROFILE={variant or profile}"],
                              cwd=root).returncode
    return run


def variants(notebook: str, profile: str, root: Path) -> list[str]:
    """The other profiles a reproduce of ``profile`` runs for ``notebook``: every
    ``params/<notebook>/<profile>_<name>.yaml`` (e.g. ``cpu_wikitext2``: 02 on a second corpus at
    the cpu profile's scale), in name order."""
    return sorted(p.stem for p in (root / "params" / notebook).glob(f"{profile}_*.yaml"))


def machine() -> dict:
    """What the timings depend on besides the code: the CPU (``profiling.cpu_description``) and torch."""
    import torch

    from nodelm_lib.training.profiling import cpu_description

    return {**cpu_description(), "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def probe(seconds: float = 10.0) -> str:
    from nodelm_lib.training.profiling import cpu_availability

    return f"cpu availability {cpu_availability(seconds=seconds)['availability']:.2f}"


def _stored_runs(runs_dir: Path) -> int:
    return len(list(runs_dir.glob("*.json"))) if runs_dir.is_dir() else 0


def _timed(name: str, fn: Callable[[], str], counts: Callable[[], int] | None = None) -> Step:
    before = counts() if counts else None
    started, t0 = _utc("%H:%M"), time.perf_counter()
    status = fn()
    runs = counts() - before if counts else None
    return Step(name, started, time.perf_counter() - t0, status, runs)


def reproduce(notebooks: list[str], profile: str, root: str | Path = ".",
              run_notebook: Callable[[str], int] | None = None,
              cpu_probe: Callable[[], str] = probe, log: Callable[[str], None] = print) -> ReproduceRecord:
    """Run ``notebooks`` in order (stop at the first that fails), between two CPU probes, writing
    ``results/reproduce_<profile>.{json,csv}`` after every step. Returns the record; its status
    is ``done``, ``failed at <nb>`` or, after Ctrl-C (re-raised), ``interrupted at <nb>``."""
    if not notebooks:
        raise ValueError("no notebooks to run")
    root = Path(root)
    run_notebook = run_notebook or make_notebook("make", profile, root)
    record = ReproduceRecord(profile=profile, started=_utc(), commit=_git_commit(root), machine=machine())
    stem = root / "results" / f"reproduce_{profile}"
    runs_dir = root / "results" / "runs" / profile

    def save() -> None:
        atomic_write_text(Path(f"{stem}.json"), json.dumps(asdict(record), indent=2) + "\n")
        atomic_write_text(Path(f"{stem}.csv"), record.table().to_csv(index=False))

    t0 = time.perf_counter()
    log(f">> {record.machine['cpu_name']} ({record.machine['cpu_count']} cores, "
        f"{record.machine['cpu_capability']}), torch {record.machine['torch']}")
    record.steps.append(_timed("cpu probe before", cpu_probe))
    log(f">> before: {record.steps[-1].status}")
    save()
    steps = [step for nb in notebooks for step in [(nb, None)] + [(nb, v) for v in variants(nb, profile, root)]]
    for nb, variant in steps:
        name = nb if variant is None else f"{nb} [{variant}]"
        store = runs_dir if variant is None else root / "results" / "runs" / variant
        run = (lambda: run_notebook(nb)) if variant is None else (lambda: run_notebook(nb, variant))
        try:
            step = _timed(name, lambda: "done" if run() == 0 else "failed", lambda: _stored_runs(store))
        except KeyboardInterrupt:
            record.status = f"interrupted at {name}"
            record.total_s = time.perf_counter() - t0
            save()
            raise
        record.steps.append(step)
        log(f">> {nb} [{variant or profile}]: {step.status} in {step.seconds:.0f} s "
            f"({step.new_stored_runs} new stored runs)")
        save()
        if step.status != "done":
            record.status = f"failed at {name}"
            break
    record.steps.append(_timed("cpu probe after", cpu_probe))
    log(f">> after: {record.steps[-1].status}")
    record.total_s = time.perf_counter() - t0
    if record.status == "running":
        record.status = "done"
    save()
    secs = round(record.total_s)
    log(f">> reproduce [{profile}]: {record.status} after {secs // 3600}h{secs % 3600 // 60:02d}m{secs % 60:02d}s "
        f"({secs} s); timings in {stem}.json")
    return record
