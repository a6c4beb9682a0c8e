"""nodelm_lib.reporting.tables: display strings and CSV / Markdown / LaTeX files of the statistics tables."""

import numpy as np
import pandas as pd

from nodelm_lib.reporting import tables as tb


def test_format_mean_ci_and_table():
    assert tb.format_mean_ci(1.23449, 0.01234) == "1.234 ± 0.012"
    assert tb.format_mean_ci(5.0, 0.25, digits=2) == "5.00 ± 0.25"
    assert tb.format_mean_ci(float("nan"), 0.1) == "–"
    assert tb.format_mean_ci(2.0, float("nan")) == "2.000 ± –"
    summary = pd.DataFrame(
        {"arm": ["a", "b"], "n": [5, 1], "loss_mean": [1.5, np.nan], "loss_ci": [0.05, np.nan], "loss_sd": [0.1, np.nan]}
    )
    shown = tb.format_table(summary, ["loss"], digits=2)
    assert list(shown.columns) == ["arm", "n", "loss"]
    assert list(shown["loss"]) == ["1.50 ± 0.05", "–"]


# --------------------------------------------------------------------------- export


def test_export_table_writes_three_files(tmp_path):
    df = pd.DataFrame(
        {"arm": ["ode_rk4", "base&50%"], "val_loss": [5.123456789, np.nan], "n": [5, 5], "tokens/s": [123456.7, 9.87654]}
    )
    paths = tb.export_table(df, tmp_path / "sub" / "table.v1")
    assert [p.name for p in paths] == ["table.v1.csv", "table.v1.md", "table.v1.tex"]
    assert all(p.exists() for p in paths)
    assert not [p for p in paths[0].parent.iterdir() if p.name.endswith(".tmp")]

    back = pd.read_csv(paths[0])
    assert back.loc[0, "val_loss"] == 5.123456789  # full precision in the CSV

    md = paths[1].read_text()
    assert md.splitlines()[0] == "| arm | val_loss | n | tokens/s |"
    assert md.splitlines()[1] == "|---|---:|---:|---:|"
    assert "| ode_rk4 | 5.123 | 5 | 123,457 |" in md
    assert "| base&50% | – | 5 | 9.877 |" in md

    tex = paths[2].read_text()
    assert r"\begin{tabular}{lrrr}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"arm & val\_loss & n & tokens/s \\" in tex
    assert r"ode\_rk4 & 5.123 & 5 & 123,457 \\" in tex
    assert r"base\&50\% & -- & 5 & 9.877 \\" in tex


def test_export_formatted_table_escapes_pm(tmp_path):
    shown = pd.DataFrame({"arm": ["a"], "loss": [tb.format_mean_ci(1.5, 0.05)]})
    _, md, tex = tb.export_table(shown, tmp_path / "t")
    assert "| a | 1.500 ± 0.050 |" in md.read_text()
    assert r"a & 1.500 $\pm$ 0.050 \\" in tex.read_text()


def test_export_table_overwrites(tmp_path):
    tb.export_table(pd.DataFrame({"x": [1.0]}), tmp_path / "t")
    tb.export_table(pd.DataFrame({"x": [2.0]}), tmp_path / "t")
    assert (tmp_path / "t.md").read_text() == "| x |\n|---:|\n| 2 |\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.md", "t.tex"]


def test_transfer_table_shows_each_variant_and_the_paired_difference_to_fine_tuning():
    summary = pd.DataFrame([
        {"arm": "node", "to_steps": 2, "variant": "evaluated", "n": 3, "mean": 2.5, "ci_low": 2.4, "ci_high": 2.6,
         "finetuned_minus": -0.4, "diff_ci_low": -0.5, "diff_ci_high": -0.3, "p_t": 0.0123},
        {"arm": "node", "to_steps": 2, "variant": "finetuned", "n": 3, "mean": 2.1, "ci_low": 2.05, "ci_high": 2.15,
         "finetuned_minus": np.nan, "diff_ci_low": np.nan, "diff_ci_high": np.nan, "p_t": np.nan},
    ])
    table = tb.transfer_table(summary, digits=2)
    assert list(table.columns) == ["arch", "m", "variant", "seeds", "test loss", "fine-tuned − this", "p (paired t)"]
    assert table["test loss"].tolist() == ["2.50 ± 0.10", "2.10 ± 0.05"]
    assert table["fine-tuned − this"].tolist() == ["-0.40 ± 0.10", "–"]
    assert table["p (paired t)"].tolist() == ["0.0123", "–"]
    assert "fine-tuned" in tb.markdown_table(table).splitlines()[0]
