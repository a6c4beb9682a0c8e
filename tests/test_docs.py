"""The README stays a first screen and the docs site stays whole: every page in the navigation
exists, every table is the one its CSV renders to, every notebook has a page saying which profile
its outputs come from, and the API index names the whole public namespace."""

import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

import nodelm_lib as nl
from nodelm_lib.reporting.pages import MARKER, NOTE_ID, update_page_tables

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 200


def nav_files(nav) -> list[str]:
    """Every file named in mkdocs.yml's ``nav`` (nested sections flattened)."""
    files = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        files += nav_files(value) if isinstance(value, list) else [value]
    return files


def mkdocs_nav() -> list[str]:
    return nav_files(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])


def test_readme_is_a_first_screen():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_readme_links_point_at_files_of_the_repository():
    readme = (REPO / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert any(t.startswith("docs/results/") for t in targets)  # the findings link their pages
    missing = [t for t in targets if t and not (REPO / t).exists()]
    assert not missing, missing


def test_every_nav_entry_exists_and_every_page_is_in_the_nav():
    nav = mkdocs_nav()
    assert len(nav) == len(set(nav)), "a page appears twice in the nav"
    assert [f for f in nav if not (DOCS / f).is_file()] == []
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*") if p.suffix in (".md", ".ipynb")}
    assert pages - set(nav) == set(), "pages missing from mkdocs.yml's nav"


def pages_with_tables() -> list[Path]:
    return [p for p in sorted(DOCS.rglob("*.md")) if MARKER.search(p.read_text())]


@pytest.mark.parametrize("page", pages_with_tables(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_every_docs_table_is_what_its_csv_renders_to(page, tmp_path):
    """`make tables` has run since the CSVs changed, and no table was edited by hand."""
    copy = tmp_path / page.name
    shutil.copy(page, copy)
    used = update_page_tables(copy, REPO)
    assert used and all((REPO / csv).exists() for csv in used)
    assert copy.read_text() == page.read_text(), f"{page}: run `make tables`"


@pytest.mark.parametrize("notebook", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_notebook_has_a_page_whose_first_cell_names_its_profile(notebook):
    page = DOCS / "notebooks" / notebook.name
    assert page.is_file(), f"no docs page for {notebook.name}: make docs-notebooks"
    first = nbformat.read(str(page), as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.get("id") == NOTE_ID
    assert re.search(r"Outputs on this page: the `(smoke|cpu|colab|gpu)` profile", first.source), first.source
    committed = [c.source for c in nbformat.read(str(notebook), as_version=4).cells]
    # an executed page also holds papermill's cell of the profile's values (tagged injected-parameters)
    executed = [c.source for c in nbformat.read(str(page), as_version=4).cells[1:]
                if "injected-parameters" not in c.metadata.get("tags", [])]
    assert len(executed) == len(committed), "the page is not this notebook (cells added or removed)"


def test_every_notebook_page_is_the_cpu_profile_as_the_notebooks_index_says():
    """docs/notebooks/index.md says each page is an executed `cpu` copy: a page still showing
    another profile (a new notebook not yet executed) must change that sentence, not make it false."""
    claim = "Every page here is such a `cpu` copy."
    if claim not in (DOCS / "notebooks" / "index.md").read_text():
        pytest.skip("the notebooks index no longer claims every page is a cpu copy")
    other = [page.name for page in sorted((DOCS / "notebooks").glob("*.ipynb"))
             if "Outputs on this page: the `cpu` profile" not in nbformat.read(str(page), as_version=4).cells[0].source]
    assert not other, f"{other} are not executed with the cpu profile: `make docs-notebooks`, or say so in the index"


def test_the_api_index_names_every_public_name():
    index = (DOCS / "api" / "index.md").read_text()
    missing = [name for name in nl.__all__ if f"`nl.{name}`" not in index]
    assert not missing, missing


@pytest.mark.slow
def test_the_readme_quickstart_runs(tmp_path, monkeypatch, capsys):
    """The quickstart a newcomer pastes first: build, train briefly, odeint with a gradient
    method, generate. (docs/index.md shows the same block.)"""
    readme = (REPO / "README.md").read_text()
    code = re.search(r"## Quickstart\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert code in (DOCS / "index.md").read_text()
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    assert namespace["out"].shape == (1, 6 + 32) and namespace["x0"].grad is not None
    assert namespace["rec"].final["val_loss"] < 5.6  # below a uniform guess over 256 bytes (ln 256)
