"""README tables are rendered from CSV files between markers, never typed."""

import math

import pandas as pd

from nodelm_lib.report import markdown_table, update_readme_tables


def test_markdown_table_formats_numbers_and_missing_values():
    """The README's tables render like the notebooks' exported ones (stats.markdown_table)."""
    df = pd.DataFrame({"model": ["a", "b"], "params": [1239040, 12], "loss": [2.118760251, math.nan],
                       "tokens/s": [123456.7, 9999.0]})
    assert markdown_table(df).splitlines() == [
        "| model | params | loss | tokens/s |",
        "|---|---:|---:|---:|",
        "| a | 1,239,040 | 2.119 | 123,457 |",
        "| b | 12 | – | 9999 |",
    ]


def test_update_rewrites_only_marked_tables_whose_csv_exists(tmp_path):
    (tmp_path / "results").mkdir()
    pd.DataFrame({"x": [1], "y": [0.5]}).to_csv(tmp_path / "results" / "t.csv", index=False)
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- table: results/t.csv -->\nstale\n<!-- /table -->\n"
        "<!-- table: results/missing.csv -->\nkept\n<!-- /table -->\nend\n"
    )
    assert update_readme_tables(readme) == ["results/t.csv"]
    text = readme.read_text()
    assert "| x | y |\n|---:|---:|\n| 1 | 0.5 |\n<!-- /table -->" in text and "stale" not in text
    assert "kept" in text and text.startswith("intro\n") and text.endswith("end\n")
    assert update_readme_tables(readme) == ["results/t.csv"] and readme.read_text() == text  # idempotent
