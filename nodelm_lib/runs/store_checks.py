"""Whole-store checks: every stored file of a run store (records, stored evaluations) and of a
checkpoints tree checked as it would be read (``check_store``), and the bad ones moved aside under
``quarantine/`` (``quarantine``), so that the runs they stood for train again. What the CLI's
``store check`` / ``store quarantine`` and a chunk's merge (``chunks.py``) run; the check of one
file as it is read is ``training.integrity``'s."""

from __future__ import annotations

import time
from pathlib import Path

from nodelm_lib.training.integrity import CheckpointError, RecordError, read_evaluations_file, verify_record
from nodelm_lib.training.model_files import load_torch_file
from nodelm_lib.training.record import RunRecord

QUARANTINE = "quarantine"


def _store_files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.rglob(pattern) if QUARANTINE not in p.relative_to(root).parts)


def check_file(path: Path) -> str | None:
    """What is wrong with the stored file ``path`` (a record, an evaluations file or a
    checkpoint), or None if nothing is."""
    try:
        if path.suffix == ".pt":
            load_torch_file(path, "checkpoint")
        elif path.parent.name == "evaluations":
            read_evaluations_file(path)
        else:
            verify_record(RunRecord.from_json(path), path)
    except (RecordError, CheckpointError) as err:
        return str(err)
    return None


def _roots(store: str | Path | None, checkpoints: str | Path | None) -> list[tuple[Path, str]]:
    roots = [(Path(p), pattern) for p, pattern in ((store, "*.json"), (checkpoints, "*.pt")) if p is not None]
    if not roots:
        raise ValueError("give a store (the folder of run records) and/or --checkpoints (a folder of checkpoints)")
    for root, _ in roots:
        if not root.is_dir():
            raise FileNotFoundError(f"no folder {root}")
    return roots


def store_files(store: str | Path | None, checkpoints: str | Path | None = None) -> list[tuple[Path, Path]]:
    """(tree, file) for every file ``check_store`` checks: the records and evaluations of
    ``store`` (in sub-folders too) and every ``*.pt`` below ``checkpoints``; ``quarantine/``
    folders are left out."""
    return [(root, path) for root, pattern in _roots(store, checkpoints) for path in _store_files(root, pattern)]


def check_store(store: str | Path | None, checkpoints: str | Path | None = None) -> list[tuple[Path, str]]:
    """Every bad file of ``store_files``, as (path, what is wrong)."""
    return [(path, problem) for _, path in store_files(store, checkpoints) if (problem := check_file(path)) is not None]


def quarantine_path(path: Path, root: Path) -> Path:
    """Where ``quarantine`` moves ``path`` of the tree ``root``: ``root/quarantine/<same
    relative path>``, with a time stamp where that name is taken."""
    target = root / QUARANTINE / path.relative_to(root)
    if target.exists():
        target = target.with_name(f"{target.stem}.{time.strftime('%Y%m%d-%H%M%S')}{target.suffix}")
    return target


def quarantine(store: str | Path | None, checkpoints: str | Path | None = None) -> list[tuple[Path, Path, str]]:
    """Move every bad file of ``check_store`` aside, under ``quarantine/`` in its own tree, so
    that the runs they stood for train again; returns (from, to, what was wrong) per file."""
    moved = []
    for root, path in store_files(store, checkpoints):
        problem = check_file(path)
        if problem is None:
            continue
        target = quarantine_path(path, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)
        moved.append((path, target, problem))
    return moved
