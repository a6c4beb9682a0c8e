"""README tables generated from result files, never typed by hand.

A README section between

    <!-- table: results/gradient_flow_cpu.csv -->
    <!-- /table -->

is replaced by that CSV rendered as a Markdown table (``make tables``). The path is
relative to the README's folder; a marker whose CSV does not exist yet is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .files import atomic_write_text

MARKER = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def format_value(value) -> str:
    if isinstance(value, float) and value != value:  # NaN: not applicable to this row
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``df`` (numbers to 4 significant digits)."""
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(format_value(v) for v in row) + " |" for row in df.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def update_readme_tables(readme: Path) -> list[str]:
    """Rewrite every table marker in ``readme`` whose CSV exists; returns the CSVs used."""
    text = readme.read_text()
    used: list[str] = []

    def render(match: re.Match) -> str:
        csv = readme.parent / match["path"]
        if not csv.exists():
            return match.group(0)
        used.append(match["path"])
        table = markdown_table(pd.read_csv(csv))
        return f"{match.group(1)}{table}{match.group(4)}"

    new = MARKER.sub(render, text)
    if new != text:
        atomic_write_text(readme, new)
    return used
