"""README tables generated from result files, never typed by hand.

A README section between

    <!-- table: results/gradient_flow_cpu.csv -->
    <!-- /table -->

is replaced by that CSV rendered as a Markdown table (``make tables``, with
``tables.markdown_table``: the same rendering as the tables the notebooks export). The path is
relative to the README's folder; a marker whose CSV does not exist yet is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .files import atomic_write_text
from .tables import markdown_table

MARKER = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


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
