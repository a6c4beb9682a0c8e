"""Tables of a results section: display strings and ``.csv`` / ``.md`` / ``.tex`` files.

The numbers come from :mod:`nodelm_lib.reporting.stats`; this module only turns them into text, so
that a change of presentation (digits, separators, escaping) never touches a statistic.

* :func:`format_mean_ci`, :func:`format_table` -- ``"mean ± ci"`` display strings.
* :func:`report_table`, :func:`append_reference_rows` -- the table a paper shows: per arm
  ``mean ± CI`` of each metric, the paired comparison with a reference arm, and rows for
  reference models (n-gram counts) below the arms.
* :func:`markdown_table`, :func:`latex_table`, :func:`export_table` -- GitHub Markdown,
  booktabs LaTeX, and all three files (CSV at full precision) written atomically. The
  docs' generated tables (``make tables``, ``pages.py``) use :func:`markdown_table` too.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from nodelm_lib.files import atomic_write_text

from .comparisons import compare_arms, require_columns, summary_table


# --------------------------------------------------------------------------- display strings


def format_mean_ci(mean: float, half: float, digits: int = 3) -> str:
    """``"1.234 ± 0.012"``; a NaN mean is ``"–"``, a NaN half width ``"1.234 ± –"``."""
    if mean is None or pd.isna(mean):
        return "–"
    half_text = "–" if half is None or pd.isna(half) else f"{half:.{digits}f}"
    return f"{mean:.{digits}f} ± {half_text}"


def format_table(summary: pd.DataFrame, metrics: Sequence[str], digits: int = 3) -> pd.DataFrame:
    """Display copy of a :func:`summary_table`: one ``"mean ± ci"`` column per metric.

    Non-metric columns that are not ``<metric>_*`` (the arm column, ``n``) are kept.
    """
    if isinstance(metrics, str):
        metrics = [metrics]
    require_columns(summary, [c for m in metrics for c in (f"{m}_mean", f"{m}_ci")])
    derived = {f"{m}_{s}" for m in metrics for s in ("mean", "ci", "sd", "n")}
    out = summary[[c for c in summary.columns if c not in derived]].copy()
    for m in metrics:
        out[m] = [format_mean_ci(mu, h, digits) for mu, h in zip(summary[f"{m}_mean"], summary[f"{m}_ci"])]
    return out


def _mean_ci_text(mean: float, half: float, digits: int) -> str:
    """``mean ± half`` with thousands separators; a metric that is the same for every seed
    (parameters, FLOPs: half width 0) is shown as its value alone."""
    if pd.isna(mean):
        return "–"
    if half == 0:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± " + ("–" if pd.isna(half) else f"{half:,.{digits}f}")


# --------------------------------------------------------------------------- paper tables


def report_table(
    runs: pd.DataFrame,
    columns: dict[str, tuple[str, int]],
    reference,
    test_metric: str,
    order: Sequence | None = None,
    higher_is_better: bool = False,
    confidence: float = 0.95,
    tests: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The table a paper shows: per arm, ``mean ± CI half width`` of each metric, then the
    paired comparison of ``test_metric`` with ``reference`` (difference ± CI, Holm-adjusted
    paired t and Wilcoxon p over the arms of this table, paired effect size d_z).

    ``columns`` maps a metric of ``runs`` to (its label, decimals). Cells are strings; the
    numbers behind them are :func:`summary_table` and :func:`compare_arms` of the same runs.
    ``tests`` replaces that ``compare_arms`` with comparisons made elsewhere (its rows against
    ``reference`` are used), e.g. Holm-adjusted over a larger family (``comparisons.holm_family``) or
    with an equivalence margin; where they carry a TOST p the table adds the ``verdict`` column.
    """
    summary = summary_table(runs, list(columns), order=order, confidence=confidence)
    if tests is None:
        tests = compare_arms(runs, test_metric, reference, higher_is_better=higher_is_better, confidence=confidence)
    tests = tests[tests["reference"] == reference].set_index("arm")
    out = pd.DataFrame({"arm": summary["arm"], "seeds": summary["n"]})
    for metric, (label, digits) in columns.items():
        out[label] = [_mean_ci_text(m, h, digits)
                      for m, h in zip(summary[f"{metric}_mean"], summary[f"{metric}_ci"])]
    label, _ = columns.get(test_metric, (test_metric, 3))
    in_tests = [name in tests.index for name in out["arm"]]

    def column(fn):
        return [fn(tests.loc[name]) if hit else "–" for name, hit in zip(out["arm"], in_tests)]

    # differences can be far smaller than the metric: significant digits, not the metric's decimals
    out[f"Δ {label} vs {reference}"] = column(
        lambda r: f"{r['mean_diff']:+.3g} ± {(r['ci_high'] - r['ci_low']) / 2:.2g}")
    out["p (paired t, Holm)"] = column(lambda r: f"{r['p_t_holm']:.3g}")
    out["p (Wilcoxon, Holm)"] = column(lambda r: f"{r['p_wilcoxon_holm']:.3g}")
    out["d_z"] = column(lambda r: f"{r['d_z']:+.2f}")
    if "p_tost" in tests.columns:
        out["p (TOST, Holm)"] = column(lambda r: f"{r['p_tost_holm']:.3g}")
        out["verdict"] = column(lambda r: r["verdict"])
    return out


def claims_table(runs: pd.DataFrame, published: dict, order: Sequence, confidence: float = 0.95) -> pd.DataFrame:
    """A published table beside our runs of the same arms: ``published`` holds ``source``,
    ``setup`` (what differs), ``metric`` (our column compared, e.g. "val_loss") and ``rows``
    (arm -> the published cell as printed, e.g. "2.147 ± 0.124"). One row per published arm, in
    ``order``: the claim, its rank among the published arms, our mean ± CI and our rank. The
    published numbers are claims to test, not results: they are quoted, never computed here."""
    missing = [k for k in ("source", "setup", "metric", "rows") if k not in published]
    if missing:
        raise ValueError(f"published lacks {missing}; give source, setup, metric and rows (arm -> value as printed)")
    metric, rows = published["metric"], published["rows"]
    unknown = [a for a in rows if a not in set(runs["arm"])]
    if unknown:
        raise ValueError(f"published arm(s) {unknown} have no runs; the runs' arms are {sorted(set(runs['arm']))}")
    arms = [a for a in order if a in rows]
    ours = summary_table(runs, [metric], order=arms, confidence=confidence).set_index("arm")
    claimed = {a: float(str(rows[a]).split()[0]) for a in arms}
    claim_rank = pd.Series(claimed).rank(method="min").astype(int)
    our_rank = ours[f"{metric}_mean"].rank(method="min").astype(int)
    return pd.DataFrame({
        "arm": arms,
        f"published {metric.replace('_', ' ')}": [str(rows[a]) for a in arms],
        "published rank": [int(claim_rank[a]) for a in arms],
        f"ours {metric.replace('_', ' ')}": [_mean_ci_text(ours.loc[a, f"{metric}_mean"], ours.loc[a, f"{metric}_ci"], 3)
                                             for a in arms],
        "our rank": [int(our_rank[a]) for a in arms],
    })


def append_reference_rows(table: pd.DataFrame, references: pd.DataFrame, columns: dict[str, str | tuple[str, int]],
                          name: str = "model", digits: int = 3) -> pd.DataFrame:
    """``table`` (``report_table``'s) with a row per reference model below the arms: the
    reference's name in the ``arm`` column, ``columns`` mapping a column of ``references`` to
    the table column it fills, as a label (``{"test_loss": "test loss"}``, ``digits`` decimals) or,
    like ``report_table``'s ``columns``, as (label, decimals); "–" everywhere else and for a NaN.
    Reference points (n-gram count models, say) put the arms' numbers in context; they are
    not arms and take part in no test."""
    columns = {source: (spec, digits) if isinstance(spec, str) else spec for source, spec in columns.items()}
    for source, (label, _) in columns.items():
        if label not in table.columns:
            raise ValueError(f"column {label!r} is not in the table; its columns are {list(table.columns)}")
        if source not in references.columns:
            raise ValueError(f"the references have no column {source!r}; theirs are {list(references.columns)}")
    rows = []
    for _, ref in references.iterrows():
        row = {col: "–" for col in table.columns}
        row["arm"] = str(ref[name])
        for source, (label, places) in columns.items():
            row[label] = _mean_ci_text(float(ref[source]), 0, places)  # its value alone, as the arms' columns print it
        rows.append(row)
    return pd.concat([table, pd.DataFrame(rows, columns=table.columns)], ignore_index=True)


# --------------------------------------------------------------------------- export


def _cell(value) -> str:
    """A table cell: floats to 4 significant digits; numbers from 1e4 up with thousands separated,
    floats from 1e9 up (FLOP counts, read back from a CSV) in scientific notation to 3 digits."""
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if abs(value) >= 1e9:  # thirteen digits with separators hide the exponent a reader wants
            return f"{value:.3g}"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    if value is None or value is pd.NA:
        return "–"
    return str(value)


def _is_numeric(col: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)


def markdown_table(df: pd.DataFrame) -> str:
    """GitHub Markdown table of ``df`` (numeric columns right-aligned, 4 significant digits)."""
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(esc(str(c)) for c in df.columns) + " |"
    rule = "|" + "|".join("---:" if _is_numeric(df[c]) else "---" for c in df.columns) + "|"
    rows = [
        "| " + " | ".join(esc(_cell(v)) for v in row) + " |"
        for row in df.astype(object).itertuples(index=False)
    ]
    return "\n".join([header, rule, *rows]) + "\n"


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "±": r"$\pm$", "–": "--", "∞": r"$\infty$",
}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX_SPECIAL))


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters (``\\ & % $ # _ { } ~ ^``); ``±`` becomes ``$\\pm$``."""
    return _LATEX_RE.sub(lambda m: _LATEX_SPECIAL[m.group(0)], text)


def latex_table(df: pd.DataFrame) -> str:
    """A booktabs ``tabular`` of ``df`` (needs ``\\usepackage{booktabs}``)."""
    spec = "".join("r" if _is_numeric(df[c]) else "l" for c in df.columns)
    lines = [
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(str(c)) for c in df.columns) + r" \\",
        r"\midrule",
        *(
            " & ".join(latex_escape(_cell(v)) for v in row) + r" \\"
            for row in df.astype(object).itertuples(index=False)
        ),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


def export_table(df: pd.DataFrame, path_stem) -> list[Path]:
    """Write ``df`` to ``<stem>.csv``, ``<stem>.md`` and ``<stem>.tex``; return the paths.

    The CSV keeps full precision; Markdown (GitHub) and LaTeX (booktabs) show floats to
    4 significant digits. A non-default index is written as leading column(s). Parent
    folders are created and each file is replaced atomically (temp file + ``os.replace``).
    """
    stem = Path(path_stem)
    if not stem.name:
        raise ValueError(f"path_stem needs a file name, got {str(path_stem)!r}")
    if not isinstance(df.index, pd.RangeIndex):
        df = df.reset_index()
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{stem}.csv"), Path(f"{stem}.md"), Path(f"{stem}.tex")]
    texts = [df.to_csv(index=False), markdown_table(df), latex_table(df)]
    for path, text in zip(paths, texts):
        atomic_write_text(path, text)
    return paths


def transfer_table(summary: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Display copy of ``ablations.transfer_summary``: one row per (arch, m, variant) with the
    test loss as ``mean ± CI``, the paired difference fine-tuned − variant as ``mean ± CI``
    and its paired-t p (``–`` on the fine-tuned rows themselves and where there is none)."""
    require_columns(summary, ["arm", "to_steps", "variant", "n", "mean", "ci_low", "ci_high"])
    out = pd.DataFrame({"arch": summary["arm"], "m": summary["to_steps"], "variant": summary["variant"],
                        "seeds": summary["n"]})
    out["test loss"] = [format_mean_ci(mu, hi - mu, digits)
                        for mu, hi in zip(summary["mean"], summary["ci_high"])]
    diff = summary.get("finetuned_minus", pd.Series(float("nan"), index=summary.index))
    high = summary.get("diff_ci_high", pd.Series(float("nan"), index=summary.index))
    p = summary.get("p_t", pd.Series(float("nan"), index=summary.index))
    out["fine-tuned − this"] = [format_mean_ci(d, h - d, digits) for d, h in zip(diff, high)]
    out["p (paired t)"] = ["–" if pd.isna(v) else f"{v:.3g}" for v in p]
    return out
