"""The generated parts of the docs site: tables rendered from result files, never typed by hand,
and the provenance cell of each notebook page.

A Markdown page section between

    <!-- table: results/gradient_flow_cpu.csv -->
    <!-- /table -->

is replaced by that CSV rendered as a Markdown table (``make tables``, with
``tables.markdown_table``: the same rendering as the tables the notebooks export). The path is
relative to the repository root; a marker whose CSV does not exist yet is left alone.
:func:`write_tables` rewrites every such section of the docs pages (``docs/**/*.md``) and of
``README.md``, so the pages that show results change only when the files under ``results/`` do.

:func:`notebook_page` turns a notebook (papermill's executed copy, or a committed notebook) into a
docs page whose first cell says which profile its outputs come from: the committed notebooks carry
the smoke profile's outputs (for nbval), which are not results.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from nodelm_lib.files import atomic_write_text

from .tables import markdown_table

MARKER = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
DOCS_DIR = "docs"
README = "README.md"
NOTE_ID = "nodelm-docs-profile-note"


def update_page_tables(page: Path, root: Path) -> list[str]:
    """Rewrite every table marker in ``page`` whose CSV (a path relative to ``root``) exists;
    returns the CSVs used. The file is written only when a table changed."""
    text = page.read_text()
    used: list[str] = []

    def render(match: re.Match) -> str:
        csv = root / match["path"]
        if not csv.exists():
            return match.group(0)
        used.append(match["path"])
        table = markdown_table(pd.read_csv(csv))
        return f"{match.group(1)}{table}{match.group(4)}"

    new = MARKER.sub(render, text)
    if new != text:
        atomic_write_text(page, new)
    return used


def table_pages(root: Path) -> list[Path]:
    """The pages that may hold table markers: every Markdown page of the docs, then the README."""
    pages = sorted((root / DOCS_DIR).rglob("*.md"))
    readme = root / README
    return pages + ([readme] if readme.exists() else [])


def write_tables(root: str | Path = ".") -> dict[str, list[str]]:
    """Rewrite the generated tables of every page under ``root`` (the repository); returns, per
    page with at least one marker whose CSV exists, the CSVs rendered into it."""
    root = Path(root)
    written = {}
    for page in table_pages(root):
        used = update_page_tables(page, root)
        if used:
            written[page.relative_to(root).as_posix()] = used
    return written


# --------------------------------------------------------------------------- notebook pages


def profile_note(profile: str, notebook: str, machine: str | None = None, commit: str | None = None) -> str:
    """The first cell of a notebook page executed with ``profile``: where its outputs come from."""
    where = (f" at commit {commit}" if commit else "") + (f" on {machine}" if machine else "")
    return (f"> **Outputs on this page: the `{profile}` profile** (`params/{notebook}/{profile}.yaml`), "
            f"executed by papermill (`make docs-notebooks`){where}. The notebook in `notebooks/` "
            "carries the `smoke` profile's outputs, which only check that it runs (nbval).")


def pending_note(profile: str) -> str:
    """The first cell of a notebook page not yet executed with ``profile``: the committed notebook,
    whose outputs must not be read as results."""
    return (f"> **Outputs on this page: the `smoke` profile**, the committed notebook's, which only check "
            f"that it runs (nbval); they are not results. Its `{profile}` outputs come later "
            f"(`make docs-notebooks` makes this page from a `{profile}` run); the `{profile}` results "
            f"are on the Results pages.")


def notebook_page(source: str | Path, dest: str | Path, note: str) -> Path:
    """Write ``source`` to ``dest`` with ``note`` as a new first markdown cell, replacing the one a
    previous call put there (the cell's id, ``NOTE_ID``, marks it)."""
    import nbformat

    nb = nbformat.read(str(source), as_version=4)
    nb.cells = [cell for cell in nb.cells if cell.get("id") != NOTE_ID]
    cell = nbformat.v4.new_markdown_cell(note)
    cell.id = NOTE_ID  # a fixed id: the same inputs write the same file
    nb.cells.insert(0, cell)
    dest = Path(dest)
    atomic_write_text(dest, nbformat.writes(nb) + "\n")
    return dest


def _machine() -> str:
    """This CPU's model and torch's capability on it, e.g. ``AMD EPYC (AVX512), torch 2.13.0``."""
    from .reproduce import machine

    info = machine()
    return f"{info['cpu_name']} ({info['cpu_capability']}), torch {info['torch']}"


def main(argv: list[str] | None = None) -> int:
    """``python -m nodelm_lib.reporting.pages notebook SOURCE DEST --profile cpu [--commit C] [--pending]``."""
    parser = argparse.ArgumentParser(prog="python -m nodelm_lib.reporting.pages")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("notebook", help="a notebook as a docs page, its first cell naming its outputs' profile")
    p.add_argument("source", help="papermill's executed copy (or, with --pending, the committed notebook)")
    p.add_argument("dest", help="docs/notebooks/<notebook>.ipynb: its name names the params file")
    p.add_argument("--profile", required=True, help="the profile its outputs come from (this machine is named)")
    p.add_argument("--pending", action="store_true", help="not executed with --profile yet: say its outputs come later")
    p.add_argument("--commit", help="the commit the notebook ran at, named in the note")
    args = parser.parse_args(argv)
    note = (pending_note(args.profile) if args.pending else
            profile_note(args.profile, Path(args.dest).stem, _machine(), args.commit))
    print(notebook_page(args.source, args.dest, note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
