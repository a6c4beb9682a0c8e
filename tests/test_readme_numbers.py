"""Every number in the README's results bullets is a number of a committed table, at its printed
precision.

The bullets of README.md's "What the experiments find" quote results. Each number must be found in
a table that the bullet's results page presents: the CSVs under results/ that the docs/results/*.md
pages it links render or link. A number that is not found that way is declared below with its
source: a protocol constant (CONSTANTS, checked against params/), its own cell of a table (PINNED),
a derivation from table entries (DERIVED, computed here), or, for the few that are none of these,
an allow-list entry saying why it needs no table (ALLOWED).

How a printed number matches a table value:
- precision: the value rounds to the printed number at its printed decimals;
- sign: a signed number (+0.158, −0.011) matches a value of that sign; an unsigned one is a
  magnitude ("0.055 nats better", "0.050 [0.043, 0.057] steeper") and matches |value|;
- "a ± b" and "a [lo, hi]" match together, in one row of one table; both ends of a range "a-b"
  in one column of one table;
- a match is evidence only where it discriminates: if the numbers one printed step either side
  would be found too (a page's tables hold hundreds of values near 0.02), the number must be
  pinned to its cell in PINNED instead;
- "p = x" matches a p-value column: a Holm-adjusted one after "Holm", an unadjusted one before
  "alone". A bound "p < b" or "p ≤ b" summarises several tests: the largest p of those tests
  (PINNED names them) must lie below it and within one printed step of it, so that a bound gone
  stale either way fails; a bound not pinned needs some p-value tightly below it in its tables;
- "15.5x" and "2.3M" are read as printed; a commit hash must be a commit of runs in
  results/*_provenance.txt; two-digit 02, 07 are notebook numbers (a params/NN_* folder must exist);
- a bare count (5 seeds, 21 comparisons, "four widths") must be declared: small integers occur in
  every table, so finding one there would prove nothing.
Failure messages name the number, its bullet (by its first words) and the nearest table values.

Run as a script (python tests/test_readme_numbers.py) it lists where each number was found.
"""

from __future__ import annotations

import json
import re
import subprocess
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
SECTION = "## What the experiments find"

# --------------------------------------------------------------------------- printed numbers

NUM = r"[+\-−]?\d+(?:\.\d+)?"  # README numbers: ASCII or Unicode minus (U+2212), or a plus
UNUM = r"\d+(?:\.\d+)?"
START = r"(?<![\w.+\-−±])"  # not inside a name (AVX512, float32, WikiText-2) or another number
END = r"(?![\w])"
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
         "ten": 10, "eleven": 11, "twelve": 12}
TOKEN = re.compile("|".join([
    r"(?P<hash>\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b)",
    rf"(?P<bound>(?:(?P<bholm>Holm) )?\bp (?P<op>[<≤]) {UNUM})",
    rf"(?P<p>(?:(?P<pholm>Holm) )?\bp = {UNUM}(?P<alone> alone)?)",
    rf"(?P<pm>{START}{NUM} ± {UNUM})",
    rf"(?P<ci>{START}{NUM} \[{NUM}, {NUM}\])",
    rf"(?P<range>{START}{UNUM}-{UNUM}[xM]?){END}",
    rf"(?P<single>{START}±?{NUM}[xM]?){END}",
    r"(?P<word>\b(?:" + "|".join(WORDS) + r")\b)",
]))
SCALE = {"x": 1.0, "M": 1e6, "": 1.0}


@dataclass(frozen=True)
class Num:
    """One printed number: its value (times its M scale), its decimals, and whether it has a sign."""

    text: str
    value: float
    decimals: int
    signed: bool
    scale: float = 1.0

    def distance(self, v: float) -> float:
        """How far table value ``v`` is from this number (a magnitude is compared with |v|)."""
        return abs((v if self.signed else abs(v)) - self.value)

    def matches(self, v: float) -> bool:
        """``v`` rounds to this number at its printed precision (either rule for a tie)."""
        half_step = 0.5 * 10 ** -self.decimals * self.scale
        return self.distance(v) <= half_step * (1 + 1e-9) + 1e-12


def number(text: str, scale: float = 1.0) -> Num:
    """A Num from its printed text: "+0.158", "−0.95", "±0.02", "15.5x", "2.3" (with scale 1e6)."""
    digits = text.lstrip("+-−±").rstrip("xM")
    sign = -1.0 if text[0] in "-−" else 1.0
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return Num(text, sign * float(digits) * scale, decimals, text[0] in "+-−", scale)


@dataclass(frozen=True)
class Claim:
    """A printed quantity: one number, or numbers that belong together (a ± b, a [lo, hi], a-b).

    kind: value, p (after "p ="), bound (p < b), compound (a ± b, a [lo, hi]), range (a-b),
    count (a bare integer or a number word), section (02, 07: a notebook), hash (a commit)."""

    kind: str
    text: str
    start: int
    end: int
    nums: tuple[Num, ...] = ()
    holm: bool = False  # a p-value or bound said of Holm-adjusted p-values
    alone: bool = False  # a p-value said of the unadjusted test ("p = 0.009 alone")
    op: str = ""  # a bound's < or ≤


def claims(text: str) -> list[Claim]:
    """The printed quantities of a bullet's plain text, in order."""
    found = []
    for m in TOKEN.finditer(text):
        s, span = m.group(0), (m.start(), m.end())
        scale = SCALE[s[-1] if s[-1] in "xM" else ""]
        if m.group("hash"):
            claim = Claim("hash", s, *span)
        elif m.group("bound"):
            claim = Claim("bound", s, *span, (number(s.split()[-1]),), holm=bool(m.group("bholm")), op=m.group("op"))
        elif m.group("p"):
            value = number(s.split("=")[1].split()[0])
            claim = Claim("p", s, *span, (value,), holm=bool(m.group("pholm")), alone=bool(m.group("alone")))
        elif m.group("pm") or m.group("ci"):
            claim = Claim("compound", s, *span, tuple(number(t) for t in re.findall(NUM, s)))
        elif m.group("range"):
            claim = Claim("range", s, *span, tuple(number(t, scale) for t in s.rstrip("xM").split("-")))
        elif m.group("word"):
            claim = Claim("count", s, *span, (Num(s, float(WORDS[s]), 0, False),))
        else:
            kind = "section" if re.fullmatch(r"0\d", s) else "count" if re.fullmatch(r"\d+", s) else "value"
            claim = Claim(kind, s, *span, (number(s, scale),))
        found.append(claim)
    return found


# --------------------------------------------------------------------------- the README's bullets


@dataclass(frozen=True)
class Bullet:
    title: str  # the bold lead, which names the bullet in messages
    text: str  # the bullet as plain text: link targets, code marks and emphasis removed
    pages: tuple[str, ...]  # the docs/results pages it links

    @property
    def name(self) -> str:
        words = self.title.split()
        return " ".join(words[:6]) + (" …" if len(words) > 6 else "")


def bullet(markdown: str) -> Bullet:
    """One results bullet ("- **lead** text [02 →](docs/results/page.md)") as plain text."""
    pages = tuple(dict.fromkeys(re.findall(r"\]\((docs/results/[^)#]+)", markdown)))
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)  # a link's text, not its target
    text = " ".join(text.replace("`", "").replace("*", "").split())
    title = re.match(r"- \*\*(.+?)\*\*", markdown).group(1).replace("`", "")
    return Bullet(title, text[2:], pages)


def results_bullets(readme: str) -> list[Bullet]:
    """The bullets of the README's results section, those that start with a bold lead."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^- .*?(?=^- |\Z)", section, re.M | re.S)
    return [bullet(" ".join(item.split())) for item in items if item.startswith("- **")]


# --------------------------------------------------------------------------- committed tables

FLOAT = r"[+\-−]?(?:\d+\.?\d*|\.\d+)(?:[eE][+\-]?\d+)?"
CELL = re.compile(rf"({FLOAT})(?: ± ({FLOAT})| \[({FLOAT}), ({FLOAT})\])?")


@dataclass(frozen=True)
class Cell:
    table: str
    row: int
    column: str
    values: tuple[float, ...]

    def where(self) -> str:
        return f"{self.table} row {self.row}, {self.column!r}"


def cell_values(text: str) -> tuple[float, ...]:
    """The numbers of a numeric cell ("1.823 ± 0.017", "-0.050 [-0.057, -0.043]", "2,256,720",
    "2.26e+12"); () for a cell of words ("not resolved at 3 seeds", "[0, 256)", "–")."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text.strip())  # thousands separators
    m = CELL.fullmatch(text)
    return tuple(float(g.replace("−", "-")) for g in m.groups() if g) if m else ()


@lru_cache(maxsize=None)
def table_rows(path: Path) -> tuple[tuple[Cell, ...], ...]:
    """Every row of a CSV as its numeric cells."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return tuple(
        tuple(Cell(path.name, i, col, v) for col, s in zip(df.columns, record) if (v := cell_values(s)))
        for i, record in enumerate(df.itertuples(index=False, name=None))
    )


def page_tables(page: str, results: Path) -> tuple[Path, ...]:
    """The CSVs of ``results`` that a results page renders (<!-- table: results/x.csv -->) or links."""
    names = re.findall(r"([\w.-]+\.csv)\b", (REPO / page).read_text())
    return tuple(sorted({results / n for n in names if (results / n).is_file()}))


def bullet_tables(b: Bullet, results: Path) -> tuple[Path, ...]:
    """The tables a bullet's numbers must be in: those of the results pages it links."""
    return tuple(sorted({t for page in b.pages for t in page_tables(page, results)}))


def scope_rows(tables) -> list[tuple[Cell, ...]]:
    """The rows of all ``tables``, one after the other."""
    return [row for path in tables for row in table_rows(path)]


# --------------------------------------------------------------------------- matching a claim


def is_p_column(column: str, holm: bool, alone: bool) -> bool:
    """A p-value column ("p", "p_t_holm", "p (paired t, Holm)"); Holm-adjusted ones where the README
    says Holm, unadjusted ones where it says "alone"."""
    col = column.lower()
    if not re.search(r"(?:^|[^a-z])p(?:[^a-z]|$)", col):
        return False
    return ("holm" in col) if holm else ("holm" not in col) if alone else True


def find(claim: Claim, rows) -> list[Cell] | None:
    """The cells where ``claim`` is found in ``rows`` (one per number, or the row's cells for a
    compound), or None."""
    cells = [c for row in rows for c in row]
    if claim.kind == "compound":
        for row in rows:
            hits = [next((c for c in row if any(n.matches(v) for v in c.values)), None) for n in claim.nums]
            if all(hits):
                return hits
        return None
    if claim.kind == "bound":
        return bound_witness(claim, cells)
    if claim.kind == "range":
        return range_witness(claim, cells)
    if claim.kind == "p":
        cells = [c for c in cells if is_p_column(c.column, claim.holm, claim.alone)]
    hits = [next((c for c in cells if any(n.matches(v) for v in c.values)), None) for n in claim.nums]
    return hits if all(hits) else None


def range_witness(claim: Claim, cells) -> list[Cell] | None:
    """Both ends of a range in one column of one table (2.147-2.367: two published losses)."""
    columns: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        columns.setdefault((c.table, c.column), []).append(c)
    for column in columns.values():
        hits = [next((c for c in column if any(n.matches(v) for v in c.values)), None) for n in claim.nums]
        if all(hits):
            return hits
    return None


def neighbours(claim: Claim) -> list[Claim]:
    """``claim`` with every number one printed step lower, and one higher."""
    def shifted(k: int) -> Claim:
        nums = tuple(replace(n, text=f"{n.value / n.scale + k * 10.0 ** -n.decimals:.{n.decimals}f}",
                             value=n.value + k * 10.0 ** -n.decimals * n.scale) for n in claim.nums)
        return replace(claim, nums=nums, text=" ".join(n.text for n in nums))
    return [shifted(-1), shifted(1)]


def tightly_below(claim: Claim, p: float) -> bool:
    """``p`` is under the bound ("p < 0.002": below it; "p ≤ 0.021": rounds to at most it) and
    within one printed step of it: the bound is the printed step just above ``p``."""
    bound = claim.nums[0]
    step = 10.0 ** -bound.decimals
    below = p < bound.value if claim.op == "<" else p <= bound.value + step / 2
    return below and p >= bound.value - step


def bound_witness(claim: Claim, cells) -> list[Cell] | None:
    """A p-value tightly below the bound in a p-value column (Holm-adjusted after "Holm"). Which
    tests a bound summarises is not read from the text: the README's bounds are pinned in PINNED to
    the largest p of those tests; this keeps any other bound from being vacuous."""
    for c in cells:
        if is_p_column(c.column, claim.holm, False) and any(tightly_below(claim, v) for v in c.values):
            return [c]
    return None


def nearest(num: Num, rows, k: int = 3) -> str:
    """The ``k`` table values nearest to ``num``, with where they are."""
    ranked = sorted((num.distance(v), v, c.where()) for row in rows for c in row for v in c.values)
    return "; ".join(f"{v:.6g} ({where})" for _, v, where in ranked[:k]) or "no numeric cells"


HOW = {"compound": " (all its numbers in one row)", "range": " (both ends in one column)",
       "p": " (in a p-value column)", "bound": " (a p-value within one printed step below it)"}


def not_found(claim: Claim, b: Bullet, tables, results: Path) -> str:
    """The failure message for a claim found in none of the bullet's tables: the number, the
    bullet, where it was looked for, the nearest values there, and any other table holding it."""
    near = " | ".join(f"nearest to {n.text}: {nearest(n, scope_rows(tables))}" for n in claim.nums)
    others = [p for p in sorted(results.glob("*.csv")) if p not in tables]
    elsewhere = sorted({c.table for c in find(claim, scope_rows(others)) or []})
    also = f"; it is in {', '.join(elsewhere)}, which the page does not name" if elsewhere else ""
    return (f"README bullet '{b.name}': {claim.text!r} is in none of the {len(tables)} tables of "
            f"{', '.join(b.pages)}{HOW.get(claim.kind, '')}{also}; {near}")


# --------------------------------------------------------------------------- declared numbers


def params(name: str) -> dict:
    """params/<notebook>/<profile>.yaml, e.g. params("02_seed_comparison/cpu")."""
    return yaml.safe_load((REPO / "params" / f"{name}.yaml").read_text())


def csv(name: str) -> pd.DataFrame:
    return pd.read_csv(RESULTS / name)


def thousands(text) -> float:
    return float(str(text).replace(",", ""))


def cell_numbers(table: str, column: str, **row: str) -> tuple[float, ...]:
    """Every number of one cell of results/<table> ("1.811 ± 0.011": the estimate and its half-width);
    ``row`` gives the values of other columns that pick its row, and exactly one row must fit them."""
    df = pd.read_csv(RESULTS / table, dtype=str, keep_default_na=False)
    fits = df[(df[list(row)] == pd.Series(row)).all(axis=1)]
    assert len(fits) == 1, f"results/{table}: {len(fits)} rows have {row}"
    return cell_values(fits.iloc[0][column])


def cell(table: str, column: str, **row: str) -> float:
    """The estimate (the first number) of one cell of results/<table> (``cell_numbers``)."""
    return cell_numbers(table, column, **row)[0]


def holm_max(table: str, **within: tuple[str, ...]) -> float:
    """The largest Holm-adjusted p (p_t_holm) of the rows of a tests table whose columns take the
    given values."""
    rows = csv(table)
    for column, values in within.items():
        rows = rows[rows[column].isin(values)]
    return rows.p_t_holm.max()


def survivors() -> list[float]:
    """The Holm p of 03's tests that survive Holm at the 5% level (03's verdicts' level)."""
    holm = csv("ablation_tests_cpu.csv").p_t_holm
    return list(holm[holm < 0.05])


def arm_ratio(table: str, column: str, arm: str, reference: str = "gpt") -> float:
    """``arm``'s ``column`` over ``reference``'s, in a results table with one row per arm."""
    rows = csv(table).set_index("arm")[column]
    return thousands(rows[arm]) / thousands(rows[reference])


def n_arms(profile: str) -> int:
    """02's arms: its architectures, its controls and gpt_matched (gpt sized to ``match_to``)."""
    p = params(profile)
    return len(p["archs"]) + len(p["controls"]) + (p.get("match_to") is not None)


def trigram_margin() -> float:
    """WikiText-2: the add-k trigram's test loss minus the worst arm's mean test loss (the smallest
    margin by which every arm is below the trigram)."""
    trigram = csv("seed_comparison_cpu_wikitext2_ngram.csv").set_index("model").loc["trigram", "test_loss"]
    return trigram - csv("seed_comparison_cpu_wikitext2_runs.csv").groupby("arm").test_loss.mean().max()


def commits_between() -> int | None:
    """Commits between the tiny-shakespeare runs' commit and the WikiText-2 runs' (their provenance
    files), whichever came first; None where this checkout has no git history to count them in."""
    commit = {p: re.search(r"by commit (\w+)", (RESULTS / f"{p}_provenance.txt").read_text()).group(1)
              for p in ("seed_comparison_cpu_wikitext2", "seed_comparison_cpu")}
    # a...b: the commits on either side but not both, the distance when one descends from the other
    span = f"{commit['seed_comparison_cpu']}...{commit['seed_comparison_cpu_wikitext2']}"
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-list", "--count", span],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out.stdout) if out.returncode == 0 else None


def selection_cpu_types() -> int:
    """CPU types that ran the WikiText-2 learning-rate selection: its runs' records under
    results/runs/cpu_wikitext2 (the selection table names their hashes)."""
    selection = csv("seed_comparison_cpu_wikitext2_lr_selection.csv")
    hashes = {h for cell in selection.config_hashes for h in cell.split()}
    records = [json.loads((RESULTS / "runs" / "cpu_wikitext2" / f"{h}.json").read_text()) for h in hashes]
    return len({r["environment"]["cpu_name"] for r in records})


def transfer_means() -> pd.Series:
    """Mean test loss of 03's depth-transfer runs by (arch, solver steps, variant)."""
    runs = csv("depth_transfer_cpu_runs.csv").drop_duplicates(["arm", "seed", "to_steps", "variant"])
    return runs.groupby(["arm", "to_steps", "variant"]).test_loss.mean()


def loss_at_other_depths() -> tuple[float, float]:
    """How much a model trained at 4 steps loses solved at 2 or 8 (evaluated − trained), its least
    and its most over 03's two architectures and two depths."""
    m = transfer_means()
    losses = [m[(arm, steps, "evaluated")] - m[(arm, 4, "trained")]
              for arm in ("node", "ti_mlp") for steps in (2, 8)]
    return min(losses), max(losses)


def continued_gains() -> tuple[float, ...]:
    """What the parent gains from 200 more steps at its own depth (trained − continued), per arch."""
    m = transfer_means()
    return tuple(m[(arm, 4, "trained")] - m[(arm, 2, "continued")] for arm in ("node", "ti_mlp"))


def iso_flops_gaps(arm: str) -> tuple[float, float]:
    """The least and most of ``arm`` − gpt at gpt's training FLOPs over the widths ``arm`` reached
    (the rows not extrapolated), results/scaling_cpu_wide_iso.csv."""
    iso = csv("scaling_cpu_wide_iso.csv")
    gaps = [cell_values(v)[0] for v in iso[(iso["at"] == "gpt's training FLOPs") & (iso.arm == arm)
                                           & (iso.extrapolated == "no")]["minus gpt's"]]
    return min(gaps), max(gaps)


def changed_widths(*arms: str) -> list[int]:
    """The width of each arm's cell whose full-length check changed its learning rate (one cell per
    arm), results/scaling_cpu_wide_lr_full_length.csv, whose cells are named "<arm> d=<width>"."""
    checks = csv("scaling_cpu_wide_lr_full_length.csv")
    changed = [cell.split() for cell in checks[checks.changed].arm]
    widths = []
    for arm in arms:
        found = [int(d.removeprefix("d=")) for a, d in changed if a == arm]
        assert len(found) == 1, f"{arm}: {len(found)} changed cells in scaling_cpu_wide_lr_full_length.csv"
        widths += found
    return widths


def last_band_wins() -> int:
    """Seeds in which ti_ssm's loss at positions 2048-4096 is below gpt's (08's bands, window 4096)."""
    bands = csv("long_context_cpu_bands.csv")
    last = bands[(bands.window == bands.window.max()) & (bands.hi == bands.window.max())]
    by_seed = last.pivot(index="seed", columns="arm", values="loss")
    return int((by_seed.ti_ssm < by_seed.gpt).sum())


@dataclass(frozen=True)
class Declared:
    """Numbers of one bullet that are not table entries. ``pattern`` is a regex over the bullet's
    plain text whose groups are those numbers; ``expected`` gives what each must round to (a tuple:
    every value of it must), or is None for an allow-listed number; ``why`` says where it comes from."""

    bullet: str  # the bullet's lead starts with this
    pattern: str
    expected: Callable[[], list] | None
    why: str


# the profiles the bullets report (07's is the four-width variant), and the bullets by their leads
S02, S03, S04, S05, S06, S07, S08, S09 = (
    "02_seed_comparison/cpu", "03_ablations/cpu", "04_spectral_lyapunov/cpu", "05_integrators/cpu",
    "06_generation/cpu", "07_scaling/cpu_wide", "08_long_context/cpu", "09_compute_on_demand/cpu")
B1, B2, B3, B4, B5, B6, B7, B8, B9 = (
    "No continuous-depth arm", "On WikiText-2 characters", "Across four small widths",
    "Depth-dependent weights", "Tong et al.", "Past the training context", "Gradients flow",
    "No arm trades inference compute", "Decoding with a KV cache")

# The patterns below find a number by the words around it and capture whatever number is printed
# there (N: a number, W: a number word), so that a changed number is compared with its source
# rather than silently escaping its entry.
N = r"([+\-−±]?\d+(?:\.\d+)?)"
W = r"(" + "|".join(WORDS) + r"|\d+)"

# protocol constants: checked against the profile the bullet reports
CONSTANTS = [
    Declared(B1, rf"\({N} arms x {N} seeds", lambda: [n_arms(S02), len(params(S02)["seeds"])],
             f"the arms and seeds of params/{S02}.yaml"),
    Declared(B1, rf"resolved at {N} seeds", lambda: [len(params(S02)["seeds"])], f"the seeds of params/{S02}.yaml"),
    Declared(B1, rf"within {N} nats", lambda: [params(S02)["equivalence_margin"]],
             f"the TOST margin of params/{S02}.yaml"),
    Declared(B1, rf"the {N}-step selection", lambda: [params(S02)["lr_steps"]], f"lr_steps of params/{S02}.yaml"),
    Declared(B3, rf"Across {W} small widths", lambda: [len(params(S07)["widths"])], f"the widths of params/{S07}.yaml"),
    Declared(B3, rf"{W} widths at a fixed", lambda: [len(params(S07)["widths"])], f"the widths of params/{S07}.yaml"),
    Declared(B3, rf"at {N} seeds", lambda: [len(params(S07)["seeds"])], f"the seeds of params/{S07}.yaml"),
    Declared(B3, rf"from d = {N} to {N}", lambda: [params(S07)["widths"][0], params(S07)["widths"][-1]],
             f"the narrowest and widest width of params/{S07}.yaml"),
    Declared(B3, rf"\(extrapolated, d = {N}\) to", lambda: [params(S07)["widths"][0]],
             f"the narrowest width of params/{S07}.yaml"),
    Declared(B3, rf"\(extrapolated, d = {N}\), while", lambda: [params(S07)["widths"][-1]],
             f"the widest width of params/{S07}.yaml"),
    Declared(B3, rf"same {N} steps", lambda: [params(S07)["max_steps"]], f"max_steps of params/{S07}.yaml"),
    Declared(B3, rf"whose {N}-step choice", lambda: [params(S07)["lr_steps"]], f"lr_steps of params/{S07}.yaml"),
    Declared(B4, rf"at {N} seeds", lambda: [len(params(S03)["seeds"])], f"the seeds of params/{S03}.yaml"),
    Declared(B4, rf"within {N}", lambda: [params(S03)["equivalence_margin"]], f"the TOST margin of params/{S03}.yaml"),
    Declared(B4, rf"trained at {N} steps", lambda: [params(S03)["base_steps"]], f"base_steps of params/{S03}.yaml"),
    Declared(B4, rf"solved at {N} or {N}", lambda: params(S03)["transfer_steps"],
             f"transfer_steps of params/{S03}.yaml"),
    # fine-tuning, the short scratch runs and the continued parent all train this fraction of the budget
    Declared(B4, rf"{N} (?:steps of fine-tuning|steps from scratch|more steps)",
             lambda: [params(S03)["transfer_fraction"] * params(S03)["max_steps"]],
             f"transfer_fraction x max_steps of params/{S03}.yaml"),
    Declared(B5, rf"of {N} seeds", lambda: [len(params(S04)["seeds"])], f"the seeds of params/{S04}.yaml"),
    Declared(B6, rf"on {N} characters", lambda: [params(S08)["seq_len"]], f"seq_len of params/{S08}.yaml"),
    Declared(B6, rf"scored to {N}", lambda: [max(params(S08)["windows"])], f"the longest window of params/{S08}.yaml"),
    # the last band of positions runs from half the longest window to the longest window
    Declared(B6, rf"positions {N}-{N}", lambda: [max(params(S08)["windows"]) // 2, max(params(S08)["windows"])],
             f"the last band of params/{S08}.yaml's longest window"),
    Declared(B6, rf"{N} seeds", lambda: [len(params(S08)["seeds"])], f"the seeds of params/{S08}.yaml"),
    Declared(B7, rf"from {N} to {N} steps", lambda: [params(S05)["cost_steps"][0], params(S05)["cost_steps"][-1]],
             f"the first and last cost_steps of params/{S05}.yaml"),
    Declared(B9, rf"{N} new tokens", lambda: [params(S06)["bench_new_tokens"]],
             f"bench_new_tokens of params/{S06}.yaml"),
    Declared(B8, rf"\({N} steps, {N} seeds, scored at {N} to {N} Euler steps",
             lambda: [params(S09)["max_steps"], len(params(S09)["seeds"]), min(params(S09)["nfe_budgets"]),
                      max(params(S09)["nfe_budgets"])],
             f"max_steps, the seeds and the least and most nfe_budgets of params/{S09}.yaml"),
    Declared(B8, rf"fixed {N}-step grid is best at {N} steps", lambda: [params(S09)["n_layers"]] * 2,
             f"n_layers (the fixed grid's steps) of params/{S09}.yaml"),
]

# numbers of one cell each, where the page's tables hold values one printed step either side too;
# the tests CSVs give differences and p-values at full precision
T02, W02T, ISO, FITS = ("seed_comparison_cpu_tests.csv", "seed_comparison_cpu_wikitext2_tests.csv",
                        "scaling_cpu_wide_iso.csv", "scaling_cpu_wide_fits.csv")
FLOPS, PARAMS_X = "gpt's training FLOPs", "non-embedding parameters"
LAST_CHANGE = "change [2048, 4096) - [0, 256)"
PINNED = [
    Declared(B1, rf"ti_mlp \({N}\)", lambda: [cell(T02, "mean_diff", family="vs gpt", arm="ti_mlp")],
             f"ti_mlp − gpt in results/{T02}"),
    Declared(B1, rf"test loss gpt {N} ± {N}", lambda: list(cell_numbers("seed_comparison_cpu.csv", "test loss", arm="gpt")),
             "gpt's test loss and its 95% CI half-width in results/seed_comparison_cpu.csv"),
    Declared(B1, rf"the hybrid \({N}, at", lambda: [cell(T02, "mean_diff", family="vs gpt", arm="hybrid")],
             f"hybrid − gpt in results/{T02}"),
    Declared(B1, rf"node \({N}, with", lambda: [cell(T02, "mean_diff", family="vs gpt", arm="node")],
             f"node − gpt in results/{T02}"),
    # a bound is pinned to the largest p of the tests it summarises
    Declared(B1, rf"Holm p < {N}", lambda: [holm_max(T02, arm=("ti_mlp", "ti_ssm"))],
             f"the largest Holm p of ti_mlp's and ti_ssm's tests (vs gpt and vs their controls), results/{T02}"),
    Declared(B1, rf"ti_ssm \({N}\)", lambda: [cell(T02, "mean_diff", family="vs gpt", arm="ti_ssm")],
             f"ti_ssm − gpt in results/{T02}"),
    Declared(B2, rf"node \({N}\)", lambda: [cell(W02T, "mean_diff", family="vs gpt", arm="node")],
             f"node − gpt in results/{W02T}"),
    Declared(B2, rf"beats gpt there \({N}\)", lambda: [cell(W02T, "mean_diff", family="vs gpt", arm="ssm")],
             f"ssm − gpt in results/{W02T}"),
    Declared(B2, rf"\(test {N}\)", lambda: [cell("seed_comparison_cpu_wikitext2.csv", "test loss", arm="gpt")],
             "gpt's test loss in results/seed_comparison_cpu_wikitext2.csv"),
    Declared(B2, rf"ti_ssm \({N}\)", lambda: [cell(W02T, "mean_diff", family="vs gpt", arm="ti_ssm")],
             f"ti_ssm − gpt in results/{W02T}"),
    Declared(B2, rf"each Holm p < {N}",
             lambda: [holm_max(W02T, family=("vs gpt",), arm=("node", "ti_ssm", "ti_mlp"))],
             f"the largest Holm p of node, ti_ssm and ti_mlp vs gpt, results/{W02T}"),
    Declared(B2, rf"hybrid \({N}, at", lambda: [cell(W02T, "mean_diff", family="vs gpt", arm="hybrid")],
             f"hybrid − gpt in results/{W02T}"),
    Declared(B2, rf"costs ti_ssm {N} nats against ssm",
             lambda: [cell(W02T, "mean_diff", family="ti_ssm vs ssm")], f"ti_ssm − ssm in results/{W02T}"),
    Declared(B3, rf"by {N} for gpt against {N} for node and {N} for ti_ssm",
             lambda: [cell(FITS, "per doubling", x=PARAMS_X, arm=arm) for arm in ("gpt", "node", "ti_ssm")],
             f"the loss per doubling of parameters in results/{FITS}"),
    # the README's "(extrapolated, d = ...)" is checked too: the row must say so
    Declared(B3, rf"node goes from {N} \(extrapolated, d = \d+\) to {N}",
             lambda: [cell(ISO, "minus gpt's", at=FLOPS, arm="node", extrapolated="yes", **{"gpt width": "64"}),
                      cell(ISO, "minus gpt's", at=FLOPS, arm="node", extrapolated="no", **{"gpt width": "192"})],
             f"node − gpt at gpt's training FLOPs, d = 64 (extrapolated) and 192, in results/{ISO}"),
    Declared(B3, rf"ti_ssm from {N} to {N} \(extrapolated, d = \d+\)",
             lambda: [cell(ISO, "minus gpt's", at=FLOPS, arm="ti_ssm", extrapolated="no", **{"gpt width": "64"}),
                      cell(ISO, "minus gpt's", at=FLOPS, arm="ti_ssm", extrapolated="yes", **{"gpt width": "192"})],
             f"ti_ssm − gpt at gpt's training FLOPs, d = 64 and 192 (extrapolated), in results/{ISO}"),
    Declared(B4, rf"is {N} nats better than time modulation",
             lambda: [abs(cell("ablation_tests_cpu.csv", "mean_diff", family="modulation"))],
             "constant − time in results/ablation_tests_cpu.csv (a magnitude: 'better')"),
    Declared(B4, rf"p = {N} alone", lambda: [cell("ablation_tests_cpu.csv", "p_t", family="modulation")],
             "the unadjusted p of constant vs time in results/ablation_tests_cpu.csv"),
    Declared(B4, rf"survive Holm, p ≤ {N}", lambda: [max(survivors(), default=float("nan"))],
             "the largest Holm p of 03's tests that survive Holm, results/ablation_tests_cpu.csv"),
    Declared(B5, rf"p = {N} alone, {N} after Holm",
             lambda: [cell("spectral_cpu_trend.csv", p, model="ti_mlp", kind="qk") for p in ("p", "p_holm")],
             "ti_mlp's QK slope test in results/spectral_cpu_trend.csv"),
    Declared(B6, rf"ssm {N}, ti_ssm {N} nats against gpt {N}",
             lambda: [cell("long_context_cpu.csv", "mean", arm=arm, band=LAST_CHANGE)
                      for arm in ("ssm", "ti_ssm", "gpt")],
             "each arm's loss change from the first band to the last in results/long_context_cpu.csv"),
    Declared(B7, rf"grows {N}x \(direct\) down to {N}x \(reversible\)",
             lambda: [cell("integrators_cpu_summary.csv", "peak_ratio_64_over_4", sensitivity=m)
                      for m in ("direct", "reversible")],
             "the peak memory at 64 steps over that at 4 in results/integrators_cpu_summary.csv"),
]

BY_SETTING = "compute_on_demand_cpu_by_setting.csv"


def at_settings(arm: str, *settings: str) -> list[float]:
    """``arm``'s mean loss at each setting of 09's table by setting, with the steps of each Euler
    setting between them as the README prints them ("1.839 at 4, 2.608 at 16, 3.199 at dopri5")."""
    values = []
    for setting in settings:
        values.append(cell(BY_SETTING, setting, arm=arm))
        if setting.startswith("euler "):
            values.append(int(setting.split()[1]))
    return values


PINNED += [
    Declared(B8, rf"ti_mlp {N} at {N}, {N} at {N}, {N} at dopri5",
             lambda: at_settings("ti_mlp", "euler 4", "euler 16", "dopri5 rtol=0.01"),
             f"ti_mlp at 4 and 16 Euler steps and dopri5 rtol 0.01, results/{BY_SETTING}"),
    Declared(B8, rf"trained on {N}-{N} steps scores {N} at {N} and {N} at {N}, yet {N} solved accurately",
             lambda: params(S09)["random_steps"] + at_settings("ti_ssm random", "euler 4", "euler 16",
                                                              "dopri5 rtol=0.01"),
             f"random_steps of params/{S09}.yaml; ti_ssm random at 4, 16 and dopri5 rtol 0.01, results/{BY_SETTING}"),
    Declared(B8, rf"is a flow \({N} at {N} steps, {N} at dopri5\)",
             lambda: at_settings("ti_mlp reg", "euler 16", "dopri5 rtol=0.01"),
             f"ti_mlp reg at 16 Euler steps and dopri5 rtol 0.01, results/{BY_SETTING}"),
]

# derivations: numbers the README computes from table entries, computed here from the same entries
DERIVED = [
    Declared(B1, rf"with {N}x the parameters", lambda: [arm_ratio("seed_comparison_cpu.csv", "params", "node")],
             "node's parameters over gpt's, results/seed_comparison_cpu.csv"),
    Declared(B1, rf"at {N}x the FLOPs", lambda: [arm_ratio("seed_comparison_cpu.csv", "FLOPs/token", "hybrid")],
             "the hybrid's FLOPs/token over gpt's, results/seed_comparison_cpu.csv"),
    Declared(B2, rf"at {N}x the FLOPs",
             lambda: [arm_ratio("seed_comparison_cpu_wikitext2.csv", "FLOPs/token", "hybrid")],
             "the hybrid's FLOPs/token over gpt's, results/seed_comparison_cpu_wikitext2.csv"),
    Declared(B2, rf"by {N} nats of test loss", lambda: [trigram_margin()],
             "the trigram's test loss (…_wikitext2_ngram.csv) minus the worst arm's mean (…_wikitext2_runs.csv)"),
    Declared(B2, rf"{N} commits (?:before|after)", lambda: [commits_between()],
             "the git history between the commits of results/seed_comparison_cpu{_wikitext2,}_provenance.txt"),
    Declared(B2, rf"a {N}-step selection", lambda: [params("02_seed_comparison/cpu_wikitext2")["lr_steps"]],
             "lr_steps of params/02_seed_comparison/cpu_wikitext2.yaml"),
    Declared(B2, rf"{W} arms' learning rates changed",
             lambda: [int(csv("seed_comparison_cpu_wikitext2_lr_full_length.csv").changed.sum())],
             "the arms whose full-length check changed the rate, results/seed_comparison_cpu_wikitext2_lr_full_length.csv"),
    Declared(B2, rf"selected on {W} CPU types", lambda: [selection_cpu_types()],
             "the CPUs in the records of the runs results/seed_comparison_cpu_wikitext2_lr_selection.csv lists"),
    Declared(B3, rf"None of the {N} iso", lambda: [int((csv(ISO).extrapolated == "no").sum())],
             f"the rows of results/{ISO} that are tested (not extrapolated)"),
    Declared(B3, rf"ti_mlp stays {N}-{N} behind", lambda: list(iso_flops_gaps("ti_mlp")),
             f"ti_mlp − gpt at gpt's training FLOPs, least and most where not extrapolated, results/{ISO}"),
    Declared(B3, rf"\(gpt d = {N} and ti_mlp d = {N} moved\)", lambda: changed_widths("gpt", "ti_mlp"),
             "the widths whose full-length check changed gpt's and ti_mlp's rate, results/scaling_cpu_wide_lr_full_length.csv"),
    Declared(B4, rf"over 03's {N} comparisons", lambda: [len(csv("ablation_tests_cpu.csv"))],
             "the rows of results/ablation_tests_cpu.csv, 03's Holm family"),
    Declared(B4, rf"loses {N}-{N} nats", lambda: list(loss_at_other_depths()),
             "evaluated − trained test loss in results/depth_transfer_cpu_runs.csv, least and most"),
    Declared(B4, rf"only {W} tests that survive Holm", lambda: [len(survivors())],
             "the rows of results/ablation_tests_cpu.csv with a Holm p below 0.05"),
    Declared(B4, rf"gains only {N}", lambda: [continued_gains()],
             "trained − continued test loss, each arch, results/depth_transfer_cpu_runs.csv"),
    Declared(B5, rf"Holm over {W}", lambda: [len(csv("spectral_cpu_trend.csv"))],
             "the rows of results/spectral_cpu_trend.csv, 04's Holm family"),
    Declared(B6, rf"08's {W} claims", lambda: [len(csv("long_context_cpu_tests.csv"))],
             "the rows of results/long_context_cpu_tests.csv, 08's Holm family"),
    Declared(B6, rf"in all {W} seeds", lambda: [last_band_wins()],
             "the seeds with ti_ssm below gpt in the last band of results/long_context_cpu_bands.csv"),
    Declared(B8, rf"Holm over {N} tests", lambda: [len(csv("compute_on_demand_cpu_tests.csv"))],
             "the rows of results/compute_on_demand_cpu_tests.csv, 09's Holm family"),
]

# neither a table entry nor a checked constant
ALLOWED = [
    Declared(B4, rf"fixing t = {N}", None,
             "defines the constant arm (its weights at time 0): a design, not a measurement"),
    Declared(B9, rf"on {W} cores", None, "the machine the benchmark ran on, a description of the setting"),
]

DECLARED = CONSTANTS + PINNED + DERIVED + ALLOWED


def declared_claims(b: Bullet, found: list[Claim]) -> dict[Claim, list[tuple[Declared, str]]]:
    """The claims of ``b`` that a declared entry covers, each with its entries and printed texts."""
    covered: dict[Claim, list[tuple[Declared, str]]] = {}
    for entry in (e for e in DECLARED if b.title.startswith(e.bullet)):
        for m in re.finditer(entry.pattern, b.text):
            for g in range(1, (m.lastindex or 0) + 1):
                claim = next((c for c in found if c.start <= m.start(g) < c.end), None)
                if claim is not None:
                    covered.setdefault(claim, []).append((entry, m.group(g)))
    return covered


def check_declared(b: Bullet, found: list[Claim]) -> list[str]:
    """Each declared number equals its source at its printed precision (a bound: its source, the
    largest p it summarises, lies tightly below it)."""
    problems = []
    for entry in (e for e in DECLARED if b.title.startswith(e.bullet)):
        if not re.search(entry.pattern, b.text):  # stale: the wording changed, or the number left
            problems.append(f"README bullet '{b.name}': the declared {entry.pattern!r} ({entry.why}) matches nothing")
        for m in re.finditer(entry.pattern, b.text) if entry.expected is not None else ():
            groups = range(1, (m.lastindex or 0) + 1)
            for g, want in zip(groups, entry.expected(), strict=True):
                text = m.group(g)
                if want is None:  # a source this checkout cannot read (no git history)
                    warnings.warn(f"README bullet '{b.name}': {text} not checked here ({entry.why})")
                    continue
                claim = next((c for c in found if c.start <= m.start(g) < c.end), Claim("value", text, 0, 0))
                num = Num(text, float(WORDS[text]), 0, False) if text in WORDS else number(text)
                wants = want if isinstance(want, tuple) else (want,)
                holds = (lambda w: tightly_below(claim, w)) if claim.kind == "bound" else num.matches
                if not all(holds(w) for w in wants):
                    problems.append(f"README bullet '{b.name}': {claim.text!r} does not fit {entry.why} "
                                    f"({', '.join(f'{w:.6g}' for w in wants)})")
    return problems


# --------------------------------------------------------------------------- the check


def check_bullet(b: Bullet, results: Path = RESULTS) -> list[str]:
    """Every printed number of ``b`` found in the tables of ``results`` its pages name, or declared;
    the problems, one line each."""
    found = claims(b.text)
    covered = declared_claims(b, found)
    tables = bullet_tables(b, results)
    rows = scope_rows(tables)
    problems = check_declared(b, found)
    for claim in found:
        if claim in covered:
            continue
        if claim.kind == "section":
            if not list((REPO / "params").glob(f"{claim.text}_*")):
                problems.append(f"README bullet '{b.name}': {claim.text} names no notebook (params/{claim.text}_*)")
        elif claim.kind == "hash":
            provenance = " ".join(p.read_text() for p in results.glob("*_provenance.txt"))
            if claim.text not in provenance:
                problems.append(f"README bullet '{b.name}': commit {claim.text} is in no results/*_provenance.txt")
        elif claim.kind == "count":
            problems.append(f"README bullet '{b.name}': the count {claim.text!r} has no declared source "
                            "(a params constant, a derivation or an allow-list entry)")
        elif find(claim, rows) is None:
            problems.append(not_found(claim, b, tables, results))
        elif claim.kind != "bound" and (also := [n.text for n in neighbours(claim) if find(n, rows)]):
            problems.append(f"README bullet '{b.name}': {claim.text!r} is in its tables, but so would be "
                            f"{' and '.join(repr(a) for a in also)}, one printed step off: the match proves "
                            "nothing; pin the number to its cell in PINNED")
    return problems


def readme_bullets() -> list[Bullet]:
    return results_bullets((REPO / "README.md").read_text())


@pytest.mark.parametrize("b", readme_bullets(), ids=lambda b: b.title.split()[0] + "_" + b.title.split()[1])
def test_every_number_of_a_results_bullet_is_in_its_tables(b):
    problems = check_bullet(b)
    assert not problems, "\n".join(problems)


def test_the_results_section_has_its_bullets_and_each_links_its_page():
    bullets = readme_bullets()
    assert len(bullets) >= 9
    assert all(b.pages for b in bullets), [b.name for b in bullets if not b.pages]
    assert sum(len(claims(b.text)) for b in bullets) > 100  # the parser sees the numbers


def test_every_declared_entry_names_a_bullet():
    # each bullet's check reports its own stale entries; this catches a bullet renamed or removed
    titles = [b.title for b in readme_bullets()]
    orphans = [(e.bullet, e.pattern) for e in DECLARED if not any(t.startswith(e.bullet) for t in titles)]
    assert not orphans, orphans


# --------------------------------------------------------------------------- the checker itself


def test_the_parser_reads_every_form_of_printed_number():
    text = ("gpt 1.823 ± 0.017; ti_mlp (+0.158), Holm p < 0.002; node (−0.011, 15.5x the parameters), "
            "p = 0.009 alone, all Holm p = 0.27, p ≤ 0.021; 0.3-0.4 nats, 0.1-2.3M; "
            "−0.95 [−1.88, −0.02]; within ±0.02; on WikiText-2, AVX512, float32, commit 300a38e; "
            "8 arms, four widths; [02 →]")
    got = [(c.kind, c.text) for c in claims(text)]
    assert got == [
        ("compound", "1.823 ± 0.017"), ("value", "+0.158"), ("bound", "Holm p < 0.002"),
        ("value", "−0.011"), ("value", "15.5x"), ("p", "p = 0.009 alone"), ("p", "Holm p = 0.27"),
        ("bound", "p ≤ 0.021"), ("range", "0.3-0.4"), ("range", "0.1-2.3M"),
        ("compound", "−0.95 [−1.88, −0.02]"), ("value", "±0.02"), ("hash", "300a38e"),
        ("count", "8"), ("count", "four"), ("section", "02"),
    ]
    by_text = {c.text: c for c in claims(text)}
    assert [n.value for n in by_text["−0.95 [−1.88, −0.02]"].nums] == [-0.95, -1.88, -0.02]
    assert [n.value for n in by_text["0.1-2.3M"].nums] == [100_000.0, 2_300_000.0]
    assert by_text["Holm p = 0.27"].holm and by_text["p = 0.009 alone"].alone
    assert by_text["+0.158"].nums[0].signed and not by_text["±0.02"].nums[0].signed


def test_matching_keeps_precision_sign_rows_and_bounds():
    assert number("1.823").matches(1.82349) and not number("1.823").matches(1.8236)
    assert number("0.055").matches(-0.0548)  # a magnitude: "0.055 nats better"
    assert not number("+0.055").matches(-0.0548)  # a signed difference must keep its sign
    assert number("13x").matches(13.104) and number("2.3", 1e6).matches(2_256_720)
    assert cell_values("2,256,720") == (2256720.0,) and cell_values("not resolved at 3 seeds") == ()
    assert cell_values("-0.050 [-0.057, -0.043]") == (-0.05, -0.057, -0.043)
    rows = [
        (Cell("t.csv", 0, "est", (0.5,)), Cell("t.csv", 0, "p_t_holm", (0.0013,))),
        (Cell("t.csv", 1, "est", (1.823, 0.017)), Cell("t.csv", 1, "p_t", (0.04,))),
        (Cell("t.csv", 2, "est", (0.019,)),),
    ]
    assert find(claims("1.823 ± 0.017")[0], rows)  # both numbers in one row
    assert find(claims("0.5 ± 0.017")[0], rows) is None  # each is in the table, not in one row
    assert find(claims("Holm p < 0.002")[0], rows)
    assert find(claims("Holm p < 0.02")[0], rows) is None  # true, but not a bound any p sits under
    assert find(claims("Holm p = 0.04")[0], rows) is None  # 0.04 is an unadjusted p
    assert find(claims("p = 0.04 alone")[0], rows)


def test_a_number_missing_from_the_tables_is_reported_with_its_bullet_and_the_nearest_values(tmp_path):
    (tmp_path / "toy.csv").write_text("arm,test loss,Δ vs gpt\n"
                                      "gpt,1.823 ± 0.017,–\n"
                                      "node,1.831 ± 0.010,+0.00833 ± 0.025\n")
    page = tmp_path / "page.md"
    page.write_text("<!-- table: results/toy.csv -->\n")
    b = Bullet("A toy finding", "A toy finding: gpt 1.823 ± 0.017, node +0.008 and +0.012.", (str(page),))
    problems = check_bullet(b, results=tmp_path)
    assert len(problems) == 1, problems  # 1.823 ± 0.017 and +0.008 are found
    assert problems[0].startswith(f"README bullet 'A toy finding': '+0.012' is in none of the 1 tables of {page}")
    assert "nearest to +0.012: " in problems[0] and "0.00833 (toy.csv row 1, 'Δ vs gpt')" in problems[0]


def test_an_undeclared_count_and_a_match_its_neighbours_share_are_reported(tmp_path):
    (tmp_path / "toy.csv").write_text("arm,slope\na,0.020\nb,0.021\nc,0.022\n")
    page = tmp_path / "page.md"
    page.write_text("[the slopes](toy.csv)\n")
    b = Bullet("Slopes", "Slopes: 0.021 at 3 seeds.", (str(page),))
    assert check_bullet(b, results=tmp_path) == [
        "README bullet 'Slopes': '0.021' is in its tables, but so would be '0.020' and '0.022', one printed "
        "step off: the match proves nothing; pin the number to its cell in PINNED",
        "README bullet 'Slopes': the count '3' has no declared source (a params constant, a derivation "
        "or an allow-list entry)",
    ]


# --------------------------------------------------------------------------- a listing for a reader


def where_found(b: Bullet) -> list[str]:
    """One line per printed number of ``b``: where it was found, or which source declares it."""
    found = claims(b.text)
    covered = declared_claims(b, found)
    rows = scope_rows(bullet_tables(b, RESULTS))
    lines = []
    for claim in found:
        if claim in covered:
            source = "; ".join(sorted({e.why if e.expected else f"allowed: {e.why}" for e, _ in covered[claim]}))
        elif claim.kind in ("section", "hash", "count"):
            source = claim.kind
        else:
            cells = find(claim, rows)
            source = ", ".join(dict.fromkeys(c.where() for c in cells)) if cells else "NOT FOUND"
        lines.append(f"  {claim.text:<24} {source}")
    return lines


if __name__ == "__main__":
    for b in readme_bullets():
        print(b.name)
        print("\n".join(where_found(b)))
