"""Atomic file writes: a reader, or a crash mid-write, sees the old file or the new one, never
half of one. Used for run records, checkpoints, model files, token caches, tables and the docs pages."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import IO, Callable

# free bytes below which a failed write is put down to a full disk: writers such as torch.save
# report a short write in their own words ("unexpected pos 9536 vs 9430"), without ENOSPC
NEARLY_FULL_BYTES = 1 << 20


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Create ``path`` through ``write(f)`` on a binary file: written to a temporary file beside
    it, then renamed over it (``os.replace``, atomic on one file system); the temporary file is
    removed if anything fails. Its name is unique per process and call, so concurrent writers
    never share one, and it gets the default permissions (not ``mkstemp``'s 0600, which would
    hide a shared cache or results from other users). Missing parent folders are created.
    A write that fails on a full disk is reported as ``OSError(ENOSPC)`` naming ``path``, whatever
    words ``write`` used for it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as err:
        full = isinstance(err, Exception) and disk_full(err, path.parent)
        tmp.unlink(missing_ok=True)
        if full:
            raise OSError(errno.ENOSPC, f"No space left on the disk of {path.parent} while writing {path.name} "
                                        f"({type(err).__name__}: {str(err).strip() or 'no detail'}); nothing was "
                                        f"replaced (a previous {path.name}, if any, is intact): free some space and "
                                        f"run again", str(path)) from err
        raise
    return path


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether the write that raised ``err`` into ``folder`` failed for want of space: ENOSPC (or
    EDQUOT, a quota) in the error, or almost nothing left free on the folder's file system."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``atomic_write`` of ``text`` in UTF-8, newlines as given."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def check_folder(key: str, path: str | Path | None) -> None:
    """ValueError naming ``key`` where ``path`` is an existing file: a setting that names a folder to
    write into (made if missing) must not point at a file."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"{key}={str(path)!r} is not valid: it is a file; it must be a folder (or a path "
                         "not yet made, which is created)")
