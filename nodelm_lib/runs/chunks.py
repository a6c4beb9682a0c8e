"""Sweeps in chunks: train what fits in a time budget, carry the records home, import them.

GPU time may come in short leases, each command limited to minutes and only a few files brought
back. A notebook's profile is then trained chunk by chunk:

    python -m nodelm_lib chunk 02_seed_comparison --profile gpu --budget 480 --archive $OUT/chunk.tar.gz
    python -m nodelm_lib import-runs chunk.tar.gz --store results/runs/gpu      # at home

``run_chunk`` runs the notebook with a deadline (``budget``): every run it asks for starts only
if it can finish in time, and the runs that do not fit are left for the next chunk, so no run is
cut off half done. It then packs the records (and stored evaluations) that the chunk added or
changed into one ``.tar.gz``, never checkpoints, whatever the notebook's outcome. Once a chunk
completes the notebook, rerunning it at home builds its tables and figures from the store.

``import_archive`` checks every record of an archive as a store checks it on read (its name,
its hash and its digest agree), then writes those the store lacks. A record whose hash the
store already holds with other results is refused, with the archive unchanged in the store:
the same config trained twice must give the same numbers, so a difference means different code
or data, which a reviewer must see rather than have one version silently win.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from nodelm_lib.files import atomic_write_text
from nodelm_lib.runs.budget import DEADLINE_ENV, REPORT_ENV, UNKNOWN_ENV
from nodelm_lib.runs.store import training_outcome
from nodelm_lib.runs.store_checks import check_file
from nodelm_lib.training.integrity import RecordError

# how the outcome of a chunk maps to the command's exit status
EXIT_COMPLETE, EXIT_FAILED, EXIT_MORE = 0, 1, 3


def store_snapshot(store: str | Path) -> dict[str, str]:
    """``{path relative to the store: sha256}`` of every record and evaluations file of ``store``."""
    root = Path(store)
    files = sorted(root.glob("*.json")) + sorted((root / "evaluations").glob("*.json"))
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def pack(store: str | Path, before: dict[str, str], archive: str | Path) -> list[str]:
    """Write the files of ``store`` that are new or changed since ``before`` (``store_snapshot``)
    into the gzipped tar ``archive`` (written whole or not at all); returns their names."""
    root = Path(store)
    now = store_snapshot(root) if root.is_dir() else {}
    changed = [name for name, digest in now.items() if before.get(name) != digest]
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in changed:
            tar.add(root / name, arcname=name, recursive=False)
    os.replace(tmp, archive)
    return changed


@dataclass
class ChunkResult:
    """What a chunk did: its outcome (``complete``, ``budget`` or ``failed``), the files packed,
    the budget stops the notebook reported, and its seconds."""

    outcome: str
    packed: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return {"complete": EXIT_COMPLETE, "budget": EXIT_MORE}.get(self.outcome, EXIT_FAILED)


def run_chunk(run_notebook: Callable[[dict], int], store: str | Path, archive: str | Path, budget_s: float,
              unknown_run_s: float | None = None) -> ChunkResult:
    """Run a notebook (``run_notebook(env)`` returns its exit status) with runs allowed to start
    only while they can finish within ``budget_s`` seconds from now, then pack what it stored."""
    if not budget_s > 0:
        raise ValueError(f"budget_s={budget_s!r} is not valid: it must be a number of seconds > 0")
    if unknown_run_s is not None and not unknown_run_s >= 0:
        raise ValueError(f"unknown_run_s={unknown_run_s!r} is not valid: it must be a number of seconds >= 0")
    started = time.time()
    before = store_snapshot(store) if Path(store).is_dir() else {}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "budget_stops.txt"
        env = {DEADLINE_ENV: repr(started + budget_s), REPORT_ENV: str(report)}
        if unknown_run_s is not None:
            env[UNKNOWN_ENV] = repr(float(unknown_run_s))
        try:
            code = run_notebook(env)
        finally:  # whatever happened, what was stored goes home
            packed = pack(store, before, archive)
        stops = report.read_text().splitlines() if report.exists() else []
    outcome = "complete" if code == 0 else "budget" if stops else "failed"
    return ChunkResult(outcome, packed, stops, time.time() - started)


def _members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """The archive's files, each a record ``<hash>.json`` or ``evaluations/<hash>.json``: nothing
    else (no links, no absolute paths, no ``..``) is imported."""
    members = []
    for m in tar.getmembers():
        parts = PurePosixPath(m.name).parts
        ok = m.isfile() and m.name.endswith(".json") and ".." not in parts and not m.name.startswith("/") and (
            len(parts) == 1 or (len(parts) == 2 and parts[0] == "evaluations"))
        if not ok:
            raise RecordError(f"{archive}: {m.name!r} is not a run record or stored evaluations file; an archive of "
                              f"`python -m nodelm_lib chunk` holds only <hash>.json and evaluations/<hash>.json")
        members.append(m)
    return members


def _results(path: Path) -> object:
    """What must agree for two copies of a stored file to be the same run: a record's
    ``training_outcome``; an evaluations file whole."""
    data = json.loads(path.read_text())
    return data if path.parent.name == "evaluations" else training_outcome(data)


def import_archive(archive: str | Path, store: str | Path) -> dict[str, list[str]]:
    """Import a chunk's archive into ``store``: ``{"added": [...], "same": [...]}`` (files already
    there with the same results are left as they are). Every file is checked first; a bad one, or
    one whose run the store holds with other results, raises ``RecordError`` and nothing is written."""
    archive, store = Path(archive), Path(store)
    if not archive.is_file():
        raise FileNotFoundError(f"no archive {archive}")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive, "r:gz") as tar:
        members = _members(tar, archive)
        for m in members:
            target = Path(tmp) / m.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(m).read())
        added, same, problems = [], [], []
        for m in members:
            incoming, existing = Path(tmp) / m.name, store / m.name
            problem = check_file(incoming)
            if problem is not None:
                problems.append(f"{m.name}: {problem}")
            elif not existing.exists():
                added.append(m.name)
            elif _results(incoming) == _results(existing):
                same.append(m.name)
            else:
                problems.append(f"{m.name}: the store holds this run with other results ({existing}); the same "
                                f"config must give the same numbers, so one of them was trained by other code or "
                                f"data: compare their git_commit and environment, and move the wrong one aside "
                                f"before importing")
        if problems:
            raise RecordError(f"{archive}: nothing imported; " + "; ".join(problems))
        for name in added:
            atomic_write_text(store / name, (Path(tmp) / name).read_text())
    return {"added": added, "same": same}


def describe(result: ChunkResult, archive: str | Path) -> str:
    """One paragraph on a chunk, for the command line."""
    runs = sum(1 for name in result.packed if "/" not in name)
    head = {"complete": "the notebook completed", "budget": "stopped at the budget: rerun for the next chunk",
            "failed": "the notebook FAILED (see its output above)"}[result.outcome]
    lines = [f"chunk: {head}; {runs} new run record(s) and {len(result.packed) - runs} evaluations file(s) packed "
             f"into {archive} in {result.seconds:.0f} s"]
    lines += [f"  not started: {stop}" for stop in result.stops[:5]]
    if len(result.stops) > 5:
        lines.append(f"  ... and {len(result.stops) - 5} more")
    return "\n".join(lines)
