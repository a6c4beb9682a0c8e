"""Run a notebook's code in this process, without Jupyter: for machines that have PyTorch but no
papermill or kernel (a lent GPU, where nothing can be installed), and for ``chunk``.

    code = run_notebook_here("notebooks/02_seed_comparison.ipynb", "gpu")

The code cells run in order in one namespace, as a kernel would run them: the parameters cell
(tagged ``parameters``), then the profile's values as papermill injects them (a cell starting
``# Parameters``, so that ``nl.profiles.use_profile`` sees them as papermill's), then the rest.
IPython's ``In`` (the cells run so far) and ``display`` are stood in for; lines of IPython magics
(``%``, ``!``) are left out; figures go to matplotlib's Agg backend. Nothing is written but what
the notebook itself writes: there is no executed copy of the notebook.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

from .profiles import INJECTED_HEADER, SMOKE, check_parameter_names, declared_parameters, load_profile


def _source(cell: dict) -> str:
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))


def injected_cell(values: dict[str, Any]) -> str:
    """The cell papermill would inject for ``values``; names that are not identifiers are refused
    (each becomes the left side of a line of code)."""
    check_parameter_names(values)
    return INJECTED_HEADER + "\n" + "".join(f"{name} = {value!r}\n" for name, value in values.items())


def run_notebook_here(path: str | Path, profile: str = SMOKE, parameters: dict[str, Any] | None = None,
                      cwd: str | Path | None = None) -> int:
    """Run the notebook at ``path`` with ``profile``'s values (none for ``smoke``) and then
    ``parameters`` over them; returns 0, or 1 after printing the failing cell's traceback.
    Before any cell runs, every name in the profile and ``parameters`` must be a parameter the
    notebook's parameters cell declares (a ValueError otherwise): the values run as code."""
    path = Path(path)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    values = {**(load_profile(path.stem, profile) if profile != SMOKE else {}), **(parameters or {})}
    check_parameter_names(values, declared_parameters(path), source=f"{path.name} [{profile}]")
    history: list[str] = [""]  # IPython's In starts with an empty entry
    namespace: dict[str, Any] = {"__name__": "__main__", "In": history, "display": lambda *args, **kwargs: None}
    os.environ.setdefault("MPLBACKEND", "Agg")
    before = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        for i, cell in enumerate(cells):
            sources = [_source(cell)]
            if "parameters" in cell.get("metadata", {}).get("tags", []) and values:
                sources.append(injected_cell(values))
            for source in sources:
                history.append(source)
                try:
                    exec(compile(source, f"{path.name}, code cell {i}", "exec"), namespace)
                except Exception:
                    traceback.print_exc()
                    print(f"{path.name}: code cell {i} failed (above)")
                    return 1
    finally:
        os.chdir(before)
    return 0
