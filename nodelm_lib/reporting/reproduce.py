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
Every notebook that trains does so through the run store ``results/runs/<profile>/`` and reads
a run already there back instead of training it; ``new_stored_runs`` counts the records a step
added there, so a total with 0 of them timed reading, not training. Only a reproduce that starts
with that folder empty times the whole experiment. (01, 04 and 06 analyse final weights, which
are kept under ``checkpoints/`` and not committed: from a fresh clone they train their runs
again and rewrite their records (the same numbers on the same kind of CPU).)

A reproduce from an empty store outlasts a working session, so it resumes: run it again at the
same commit and it continues the record it finds (one that is not ``done``) instead of starting a
new one. Notebooks recorded ``done`` are skipped; the one that was running when the process died
keeps its time so far (the record is rewritten every ``HEARTBEAT_S`` seconds while a notebook runs)
as a ``killed`` step, and runs again as a new step, which reads back from the store what the
killed one trained. Each session adds its own CPU probes and its machine to ``sessions``, so the
record shows every part and where it ran; the total is the sum of the parts.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import threading
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
    sessions: list[dict] = field(default_factory=list)  # each start or resume: when, and on what machine

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
    (``run(nb, variant)`` runs it with another profile: a variant, see ``variants``; ``env``
    adds environment variables)."""
    def run(notebook: str, variant: str | None = None, env: dict[str, str] | None = None) -> int:
        return subprocess.run([make, "--no-print-directory", notebook, f"PROFILE={variant or profile}"],
                              cwd=root, env={**os.environ, **(env or {})}).returncode
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


HEARTBEAT_S = 60.0  # how often a running notebook's time so far is written to the record


def _timed(name: str, fn: Callable[[], str], counts: Callable[[], int] | None = None) -> Step:
    before = counts() if counts else None
    started, t0 = _utc("%H:%M"), time.perf_counter()
    status = fn()
    runs = counts() - before if counts else None
    return Step(name, started, time.perf_counter() - t0, status, runs)


def _timed_live(step: Step, fn: Callable[[], str], counts: Callable[[], int], save: Callable[[], None],
                every_s: float) -> None:
    """Run ``fn`` as ``step`` (already in the record, status ``running``), writing its time and new
    runs so far every ``every_s`` seconds: a process killed meanwhile leaves them on disk."""
    before, t0, stop = counts(), time.perf_counter(), threading.Event()

    def progress() -> None:
        step.seconds, step.new_stored_runs = time.perf_counter() - t0, counts() - before

    def beat() -> None:
        while not stop.wait(every_s):
            progress()
            save()

    thread = threading.Thread(target=beat, daemon=True, name=f"reproduce {step.name}")
    thread.start()
    try:
        step.status = fn()
    finally:
        stop.set()
        thread.join()
        progress()


def other_cpu(path: Path, here: dict) -> str | None:
    """A line to print where the record at ``path`` (the committed one, which this reproduce replaces
    or resumes) was timed on another kind of CPU than ``here``: its times then say little about
    how long this machine takes (the docs' "Timing on shared machines"). None where it was not."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    before = data.get("machine") or {}
    if not before or all(before.get(k) == here.get(k) for k in ("cpu_name", "cpu_capability")):
        return None  # (a record without its machine says nothing either way)
    return (f">> {path.name} ({data.get('started')}) was timed on {before.get('cpu_name')} "
            f"({before.get('cpu_capability')}), this machine is {here.get('cpu_name')} ({here.get('cpu_capability')}): "
            "its times are not this machine's")


def resumable(path: Path, profile: str, commit: str | None) -> ReproduceRecord | None:
    """The unfinished record at ``path`` that a reproduce of ``profile`` at ``commit`` continues, or
    None: none there, finished, another profile, or another commit (its times measured other code;
    a ``-dirty`` commit names no code at all)."""
    if commit is None or commit.endswith("-dirty") or not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("status") == "done" or data.get("commit") != commit or data.get("profile") != profile:
        return None
    steps = [Step(**s) for s in data.pop("steps")]
    for step in steps:
        if step.status == "running":  # its process died: the heartbeat kept its time so far
            step.status = "killed"
    return ReproduceRecord(**{**data, "steps": steps})


def reproduce(notebooks: list[str], profile: str, root: str | Path = ".",
              run_notebook: Callable[[str], int] | None = None,
              cpu_probe: Callable[[], str] = probe, log: Callable[[str], None] = print,
              resume: bool = True, heartbeat_s: float = HEARTBEAT_S) -> ReproduceRecord:
    """Run ``notebooks`` in order (stop at the first that fails), between two CPU probes, writing
    ``results/reproduce_<profile>.{json,csv}`` after every step (and every ``heartbeat_s`` during
    one). With ``resume``, an unfinished record of the same commit is continued (module
    docstring). Returns the record; its status is ``done``, ``failed at <nb>`` or, after Ctrl-C
    (re-raised), ``interrupted at <nb>``."""
    if not notebooks:
        raise ValueError("no notebooks to run")
    root = Path(root)
    run_notebook = run_notebook or make_notebook("make", profile, root)
    stem = root / "results" / f"reproduce_{profile}"
    runs_dir = root / "results" / "runs" / profile
    commit, here = _git_commit(root), {"started": _utc(), **machine()}
    warning = other_cpu(Path(f"{stem}.json"), here)
    if warning:
        log(warning)
    record = resumable(Path(f"{stem}.json"), profile, commit) if resume else None
    if record is None:
        record = ReproduceRecord(profile=profile, started=here["started"], commit=commit,
                                 machine={k: v for k, v in here.items() if k != "started"})
    else:
        log(f">> resuming the reproduce of {record.started} at commit {commit}: "
            f"{sum(s.seconds for s in record.steps) / 60:.1f} min recorded")
    done = {s.name for s in record.steps if s.status == "done"}
    earlier_s = sum(s.seconds for s in record.steps)
    record.status, record.total_s = "running", None
    record.sessions.append(here)
    lock = threading.Lock()

    def save() -> None:
        with lock:
            atomic_write_text(Path(f"{stem}.json"), json.dumps(asdict(record), indent=2) + "\n")
            atomic_write_text(Path(f"{stem}.csv"), record.table().to_csv(index=False))

    t0 = time.perf_counter()
    log(f">> {here['cpu_name']} ({here['cpu_count']} cores, {here['cpu_capability']}), torch {here['torch']}")
    record.steps.append(_timed("cpu probe before", cpu_probe))
    log(f">> before: {record.steps[-1].status}")
    save()
    steps = [step for nb in notebooks for step in [(nb, None)] + [(nb, v) for v in variants(nb, profile, root)]]
    for nb, variant in steps:
        name = nb if variant is None else f"{nb} [{variant}]"
        if name in done:
            log(f">> {name}: done in an earlier session")
            continue
        store = runs_dir if variant is None else root / "results" / "runs" / variant
        run = (lambda: run_notebook(nb)) if variant is None else (lambda: run_notebook(nb, variant))
        step = Step(name, _utc("%H:%M"), 0.0, "running", 0)
        record.steps.append(step)
        save()
        try:
            _timed_live(step, lambda: "done" if run() == 0 else "failed", lambda: _stored_runs(store), save,
                        heartbeat_s)
        except KeyboardInterrupt:
            step.status = "interrupted"
            record.status = f"interrupted at {name}"
            record.total_s = earlier_s + time.perf_counter() - t0
            save()
            raise
        log(f">> {nb} [{variant or profile}]: {step.status} in {step.seconds:.0f} s "
            f"({step.new_stored_runs} new stored runs)")
        save()
        if step.status != "done":
            record.status = f"failed at {name}"
            break
    record.steps.append(_timed("cpu probe after", cpu_probe))
    log(f">> after: {record.steps[-1].status}")
    record.total_s = earlier_s + time.perf_counter() - t0
    if record.status == "running":
        record.status = "done"
    save()
    secs = round(record.total_s)
    log(f">> reproduce [{profile}]: {record.status} after {secs // 3600}h{secs % 3600 // 60:02d}m{secs % 60:02d}s "
        f"({secs} s); timings in {stem}.json")
    return record
