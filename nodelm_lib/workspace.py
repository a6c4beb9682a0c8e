"""Where a notebook's outputs go: one work folder holding ``results/`` (tables and the run
store), ``figures/`` and ``checkpoints/``.

Notebooks take a single ``work_dir`` parameter and never use the current directory, so they run
the same from Jupyter, papermill (``make``), pytest and Colab. On Colab, pointing ``work_dir`` at
a mounted Google Drive folder keeps the run store across a runtime reset: rerunning the notebook
then reads the finished runs instead of training them again.

The default, in order: the ``NODELM_WORK_DIR`` environment variable; the repository root when
nodelm is imported from a checkout (an editable install, as ``make setup`` makes); otherwise
``~/nodelm``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "NODELM_WORK_DIR"


def repository_root() -> Path | None:
    """The checkout nodelm is imported from, or None for an installed package (a wheel in
    site-packages has no notebooks beside it)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


@dataclass(frozen=True)
class Workspace:
    """The output folders under ``root``. Paths are absolute; ``rel`` names them for printing,
    so that a notebook's printed output does not depend on where the work folder is."""

    root: Path

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def runs(self, profile: str) -> Path:
        """The run store of one profile: one JSON record per finished run, named by config hash.
        ``profile`` is a name, not a path: a store outside ``results/runs`` would escape the work folder."""
        if not profile or profile in (".", "..") or any(sep in profile for sep in ("/", "\\", "\0")):
            raise ValueError(f"run store name {profile!r} is not valid; it is a profile's name (e.g. 'cpu'), "
                             "a single folder name under results/runs")
        return self.results / "runs" / profile

    def rel(self, path: str | Path) -> str:
        """``path`` relative to the work folder when it lies inside it, else as given."""
        path = Path(path)
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


def workspace(work_dir: str | Path | None = None) -> Workspace:
    """The work folder ``work_dir`` with its ``results/``, ``figures/`` and ``checkpoints/``
    (created if missing: a notebook may write straight into them, and on Colab the folder is
    often new), or the default described in the module docstring when it is None or empty.
    ``~`` is expanded; relative paths are refused, because they would depend on the current
    directory, which differs between Jupyter, papermill and Colab."""
    if not work_dir:
        work_dir = os.environ.get(ENV_VAR) or repository_root() or Path.home() / "nodelm"
    root = Path(work_dir).expanduser()
    if not root.is_absolute():
        raise ValueError(f"work_dir must be an absolute path (or None for the default), got {str(work_dir)!r}: "
                         "a relative one would depend on the current directory")
    ws = Workspace(root.resolve())
    for folder in (ws.results, ws.figures, ws.checkpoints):
        folder.mkdir(parents=True, exist_ok=True)
    return ws
