"""Atomic file writes: a reader, or a crash mid-write, sees the old file or the new one, never
half of one. Used for run records, checkpoints, model files, token caches, tables and the docs pages."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import IO, Callable


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Create ``path`` through ``write(f)`` on a binary file: written to a temporary file beside
    it, then renamed over it (``os.replace``, atomic on one file system); the temporary file is
    removed if anything fails. Its name is unique per process and call, so concurrent writers
    never share one, and it gets the default permissions (not ``mkstemp``'s 0600, which would
    hide a shared cache or results from other users). Missing parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``atomic_write`` of ``text`` in UTF-8, newlines as given."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))
