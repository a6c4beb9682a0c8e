"""The docs' generated parts: tables rendered from CSV files between markers, never typed, and
notebook pages whose first cell names the profile of their outputs."""

import math

import nbformat
import pandas as pd

from nodelm_lib.reporting.pages import NOTE_ID, markdown_table, notebook_page, update_page_tables, write_tables


def test_markdown_table_formats_numbers_and_missing_values():
    """The docs' tables render like the notebooks' exported ones (tables.markdown_table)."""
    df = pd.DataFrame({"model": ["a", "b"], "params": [1239040, 12], "loss": [2.118760251, math.nan],
                       "tokens/s": [123456.7, 9999.0]})
    assert markdown_table(df).splitlines() == [
        "| model | params | loss | tokens/s |",
        "|---|---:|---:|---:|",
        "| a | 1,239,040 | 2.119 | 123,457 |",
        "| b | 12 | – | 9999 |",
    ]


def test_markdown_table_writes_flop_counts_with_their_exponent():
    """A float from 1e9 up (07's training FLOPs, read back from its CSV) keeps 3 digits and its
    exponent instead of thirteen digits with separators; integers keep their separators."""
    df = pd.DataFrame({"FLOPs": [2.26e12, 999_999_999.0], "params": [1_779_840, 5]})
    assert markdown_table(df).splitlines()[2:] == ["| 2.26e+12 | 1,779,840 |", "| 999,999,999 | 5 |"]


def test_update_rewrites_only_marked_tables_whose_csv_exists(tmp_path):
    (tmp_path / "results").mkdir()
    pd.DataFrame({"x": [1], "y": [0.5]}).to_csv(tmp_path / "results" / "t.csv", index=False)
    page = tmp_path / "docs" / "results" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text(
        "intro\n<!-- table: results/t.csv -->\nstale\n<!-- /table -->\n"
        "<!-- table: results/missing.csv -->\nkept\n<!-- /table -->\nend\n"
    )
    assert update_page_tables(page, tmp_path) == ["results/t.csv"]  # paths relative to the root, not the page
    text = page.read_text()
    assert "| x | y |\n|---:|---:|\n| 1 | 0.5 |\n<!-- /table -->" in text and "stale" not in text
    assert "kept" in text and text.startswith("intro\n") and text.endswith("end\n")
    assert update_page_tables(page, tmp_path) == ["results/t.csv"] and page.read_text() == text  # idempotent


def test_write_tables_rewrites_the_docs_pages_and_the_readme(tmp_path):
    (tmp_path / "results").mkdir()
    pd.DataFrame({"x": [2]}).to_csv(tmp_path / "results" / "a.csv", index=False)
    marker = "<!-- table: results/a.csv -->\nold\n<!-- /table -->\n"
    pages = {"docs/results/one.md": marker, "docs/benchmarks.md": marker, "docs/plain.md": "no marker\n",
             "README.md": marker, "other/notes.md": marker}
    for name, text in pages.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    written = write_tables(tmp_path)
    assert written == {"docs/benchmarks.md": ["results/a.csv"], "docs/results/one.md": ["results/a.csv"],
                       "README.md": ["results/a.csv"]}
    for name in written:
        assert "| 2 |" in (tmp_path / name).read_text()
    assert (tmp_path / "other/notes.md").read_text() == marker  # only docs/ and the README are pages


def _notebook(path, cells):
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nbformat.write(nb, str(path))


def test_notebook_page_puts_one_note_first_and_keeps_the_rest(tmp_path):
    source, page = tmp_path / "executed.ipynb", tmp_path / "docs" / "nb.ipynb"
    _notebook(source, [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("1 + 1")])
    notebook_page(source, page, "first note")
    notebook_page(page, page, "second note")  # a page made again replaces its note
    nb = nbformat.read(str(page), as_version=4)
    assert [c.source for c in nb.cells] == ["second note", "# Title", "1 + 1"]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].id == NOTE_ID
    assert nb.metadata.kernelspec.name == "python3"
    nbformat.validate(nb)
    text = page.read_text()
    notebook_page(source, page, "second note")
    assert page.read_text() == text  # the same inputs write the same file
