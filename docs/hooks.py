"""mkdocs hook: the committed result files and figures become part of the site.

The results pages link ``results/*.csv`` (and the provenance ``.txt`` files) and show
``figures/*.png`` from the repository root, so the site serves the same files the tables are
rendered from (``make tables``) instead of copies kept under ``docs/``. The run store
(``results/runs/``) and executed notebooks are left out.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
SHARED = {"results": ("*.csv", "*.md", "*.tex", "*.json", "*.txt"), "figures": ("*.png",)}


def shared_files() -> list[Path]:
    """The files of ``SHARED`` under the repository root, top level of each folder only."""
    return sorted(path for folder, patterns in SHARED.items() for pattern in patterns
                  for path in (ROOT / folder).glob(pattern))


def on_files(files: Files, config) -> Files:
    """Add every shared file at its path relative to the repository root (``results/x.csv``)."""
    for path in shared_files():
        files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    return files
