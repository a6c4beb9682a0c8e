"""Atomic writes: the old file or the new one, never half of one, and no temporary left behind."""

import os

import pytest

from nodelm_lib.files import atomic_write, atomic_write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "record.json"
    atomic_write_text(path, "old")

    def half_then_crash(f):
        f.write(b"new but only ha")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        atomic_write(path, half_then_crash)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_writes_text_as_utf8_into_new_folders_with_default_permissions(tmp_path):
    path = atomic_write_text(tmp_path / "a" / "b" / "table.md", "λ ± 0.1\r\n")
    assert path.read_bytes() == "λ ± 0.1\r\n".encode("utf-8")  # newlines untouched
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
