"""Does a table's provenance survive refactoring? Retrain a seeded sample of its records with the
code at HEAD and compare what they recorded with what the retraining gives.

A record names the commit and the CPU that made it (``records.record_provenance``). Training is
bit-for-bit deterministic on one kind of CPU, so a record retrained on its own CPU type must come
back exactly (every final loss, every step's training loss, every evaluation); on another type
rounding grows over training, and it must come back within a measured tolerance
(``CROSS_CPU_TOLERANCE``). A record made by an older commit whose training code differs may
legitimately come back elsewhere even on its own CPU: the table says which commit made it and
whether its ``nodelm_lib/`` is HEAD's (``same_code``), so that a reader can tell the two apart.

Retraining goes to a temporary store and checkpoints folder (``work_dir``), never to the store
the records came from, and never over an existing record.

    python -m nodelm_lib.runs.reproducibility results/seed_comparison_cpu_runs.csv --sample 2
    python -m nodelm_lib.runs.reproducibility results/runs/cpu --sample 3 --seed 1 --tolerance 0.05
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import pandas as pd
import torch
from tqdm import tqdm  # text bar everywhere: tqdm.auto warns without ipywidgets

from nodelm_lib.training.record import RunRecord

from . import store as run_store
from .records import LIBRARY, record_provenance, same_library

# Final and validation losses (nats per token) of a record retrained on another kind of CPU: rounding
# differs between instruction sets and grows over training, so the bound must cover the largest gap the
# project has measured for its longest CPU runs (the measurements: docs/reproducing.md, "Checking that
# records retrain at HEAD"). A GPU record retrained elsewhere is not covered: never measured.
CROSS_CPU_TOLERANCE = 0.02

# One step's training loss (one batch, no average) of a record retrained on another kind of CPU: a
# single batch does not average rounding away, so its bound is looser than the final losses' (the
# measurement it covers: docs/reproducing.md, same section).
CROSS_CPU_STEP_TOLERANCE = 0.05

SAME_CPU_RULE = "same CPU: exact"
OTHER_CPU_RULE = "other CPU: within tol"

COLUMNS = ["config_hash", "arm", "arch", "seed", "record_cpu", "this_cpu", "record_commit", "head_commit",
           "same_code", "metric", "step", "recorded", "retrained", "diff", "tolerance", "match", "rule"]


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """What a retraining on another kind of CPU may differ by: ``loss`` for final and validation
    losses, ``step`` for one training step's loss."""

    loss: float = CROSS_CPU_TOLERANCE
    step: float = CROSS_CPU_STEP_TOLERANCE


# ----------------------------------------------------------------------------- choosing records


def records_of_store(store: str | Path) -> list[RunRecord]:
    """Every record of a run store (``store.load_records``); a missing folder is a ValueError."""
    if not Path(store).is_dir():
        raise ValueError(f"run store {str(store)!r} is not a folder: give a store (results/runs/<profile>) or a "
                         f"runs table (a .csv with a config_hash column)")
    return run_store.load_records(store)


def records_of_table(table: str | Path, store: str | Path | None = None) -> tuple[list[RunRecord], dict[str, str]]:
    """The records a runs table names in its ``config_hash`` column, and their arms (its ``arm``
    column; a record's arch where it has none). ``store``: where the records are; by default the
    one store under ``<table's folder>/runs/`` that holds each hash (tables live in ``results/``,
    their records in ``results/runs/<profile>/``)."""
    rows = pd.read_csv(table)
    if "config_hash" not in rows.columns:
        raise ValueError(f"{table} has no config_hash column (its columns: {', '.join(rows.columns)}): give a runs "
                         f"table, such as results/<notebook>_<profile>_runs.csv")
    hashes = list(dict.fromkeys(rows["config_hash"].astype(str)))
    arms = dict(zip(rows["config_hash"].astype(str), rows["arm"].astype(str))) if "arm" in rows.columns else {}
    stores = [Path(store)] if store is not None else sorted(p for p in (Path(table).parent / "runs").glob("*")
                                                            if p.is_dir())
    return [run_store.read_record(find_record(h, stores)) for h in hashes], arms


def find_record(config_hash: str, stores: list[Path]) -> Path:
    """The one record file of ``config_hash`` among ``stores``; a ValueError naming the hash and the
    stores where none, or more than one, holds it."""
    found = [run_store.record_path(s, config_hash) for s in stores if run_store.record_path(s, config_hash).exists()]
    where = ", ".join(map(str, stores)) or "(no store found)"
    if not found:
        raise ValueError(f"record {config_hash} not found in {where}: pass the store that holds it (--store)")
    if len(found) > 1:
        raise ValueError(f"record {config_hash} is in more than one store ({', '.join(map(str, found))}): pass the "
                         f"one the table was built from (--store)")
    return found[0]


def why_not_retrainable(record: RunRecord) -> str | None:
    """Why ``record`` cannot be retrained and compared, or None: only a completed run that starts
    from scratch can (a fine-tuned run needs its parent's weights, which a store does not keep)."""
    if record.status != "completed":
        return f"did not complete (status {record.status!r})"
    if record.config.get("init_from"):
        return f"starts from run {record.config['init_from']}'s weights (init_from)"
    return None


def sample_records(records: Iterable[RunRecord], n: int, seed: int = 0) -> list[RunRecord]:
    """``n`` of ``records`` drawn at random with ``seed``, the same draw whatever their order
    (they are sorted by config hash first). Records that cannot be retrained (``why_not_retrainable``)
    are not drawn; ``n`` above the number that can is a ValueError saying how many there are."""
    records = sorted(records, key=lambda r: r.config_hash)
    if n < 1:
        raise ValueError(f"sample size n={n} is not valid: it must be >= 1")
    pool = [r for r in records if why_not_retrainable(r) is None]
    if n > len(pool):
        left_out = len(records) - len(pool)
        raise ValueError(f"sample size n={n} is larger than the {len(pool)} records that can be retrained (of "
                         f"{len(records)}; {left_out} did not complete or start from another run): choose n in "
                         f"1..{len(pool)}" if pool else f"none of the {len(records)} records can be retrained")
    return random.Random(seed).sample(pool, n)


# ----------------------------------------------------------------------------- retraining


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` torch threads (None: as set), then set them back: a record's
    threads are part of how it was computed."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def retrain_config(record: RunRecord):
    """``record``'s TrainConfig as this code reads it, with what says only where a run happens
    reset (``config.NON_SEMANTIC_KEYS``: no progress bar, no TensorBoard log, the data found as
    usual unless the recorded folder exists here); ``run`` sets its checkpoint folder."""
    tc = record.train_config
    data_dir = tc.data_dir if tc.data_dir and Path(tc.data_dir).is_dir() else None
    return dataclasses.replace(tc, progress=False, log_dir=None, out_dir=None, resume=False,
                               checkpoint_interval=0, data_dir=data_dir)


def retrain(record: RunRecord, work_dir: str | Path) -> RunRecord:
    """Train ``record``'s config again, with the code here and the record's torch threads, into
    ``work_dir/store`` (checkpoints in ``work_dir/checkpoints``), and read the new record back as
    a store reads it. A store there that already holds the run is refused: it would be read back
    instead of retrained."""
    work_dir = Path(work_dir)
    store, checkpoints = work_dir / "store", work_dir / "checkpoints"
    if run_store.record_path(store, record.config_hash).exists():
        raise ValueError(f"{run_store.record_path(store, record.config_hash)} exists: the retraining's store must "
                         f"not hold the run already (give an empty work folder)")
    tc = retrain_config(record)
    if run_store.run_hash(tc) != record.config_hash:
        raise ValueError(f"record {record.config_hash}'s config hashes to {run_store.run_hash(tc)} at this code: "
                         f"it cannot be retrained under its name")
    with torch_threads(record.environment.get("torch_threads")):
        run_store.run(tc, store=store, checkpoints=checkpoints)
    return run_store.read_record(run_store.record_path(store, record.config_hash))


# ----------------------------------------------------------------------------- comparing


def equal(a: float, b: float) -> bool:
    """Exactly equal, a NaN equal to a NaN (a failed run's loss)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def within(a: float, b: float, tolerance: float, exact: bool) -> bool:
    """``equal`` under the exact rule, else ``|a - b| <= tolerance`` (NaN only against NaN)."""
    return equal(a, b) or (not exact and abs(a - b) <= tolerance)


def metric_rows(recorded: RunRecord, retrained: RunRecord, exact: bool, tolerances: Tolerances) -> list[dict]:
    """One row per compared quantity: each final loss the record keeps, and the validation and
    training curves as their worst point (its step, both values there)."""
    rows = []
    for key in ("train_loss", "val_loss", "test_loss"):
        if key in recorded.final:
            rows.append(_row(f"final {key}", math.nan, recorded.final[key], retrained.final.get(key, math.nan),
                             tolerances.loss, exact))
    rows.append(_curve_row("val_loss curve", recorded.evals, retrained.evals, "val_loss", tolerances.loss, exact))
    rows.append(_curve_row("train loss per step", recorded.metrics, retrained.metrics, "loss", tolerances.step, exact))
    return rows


def _row(metric: str, step: float, recorded: float, retrained: float, tolerance: float, exact: bool) -> dict:
    recorded, retrained = float(recorded), float(retrained)
    return {"metric": metric, "step": step, "recorded": recorded, "retrained": retrained,
            "diff": retrained - recorded, "tolerance": 0.0 if exact else tolerance,
            "match": within(recorded, retrained, tolerance, exact)}


def _curve_row(metric: str, recorded: list[dict], retrained: list[dict], key: str, tolerance: float,
               exact: bool) -> dict:
    """A curve as its worst point (the last where every point is equal); curves of different
    lengths (or steps) as a mismatch of their point counts."""
    steps = [p["step"] for p in recorded]
    if steps != [p["step"] for p in retrained]:
        return {**_row(f"{metric}: points", math.nan, len(recorded), len(retrained), tolerance, exact), "match": False}
    if not steps:
        return _row(metric, math.nan, math.nan, math.nan, tolerance, exact)
    pairs = [(float(a[key]), float(b[key])) for a, b in zip(recorded, retrained)]
    worst = max(range(len(pairs)), key=lambda i: (_gap(*pairs[i]), i))
    row = _row(metric, steps[worst], *pairs[worst], tolerance, exact)
    return {**row, "match": all(within(a, b, tolerance, exact) for a, b in pairs)}


def _gap(a: float, b: float) -> float:
    """How far apart two values are: 0 when ``equal``, infinite when one is NaN."""
    if equal(a, b):
        return 0.0
    return math.inf if math.isnan(a) or math.isnan(b) else abs(b - a)


def compare(recorded: RunRecord, retrained: RunRecord, arm: str | None = None,
            tolerances: Tolerances = Tolerances(), head: str | None = None) -> pd.DataFrame:
    """The rows of ``check_reproducibility``'s table for one record and its retraining: exact
    when the retraining ran on the record's kind of CPU (``records.record_provenance``), within
    ``tolerances`` otherwise."""
    was, now = record_provenance(recorded), record_provenance(retrained)
    exact = was["cpu"] == now["cpu"]
    head = head or now["git_commit"]
    identity = {"config_hash": recorded.config_hash, "arm": arm or recorded.train_config.model.arch,
                "arch": recorded.train_config.model.arch, "seed": recorded.seed, "record_cpu": was["cpu"],
                "this_cpu": now["cpu"], "record_commit": was["git_commit"], "head_commit": head,
                "same_code": same_library([was["git_commit"], now["git_commit"]]),
                "rule": SAME_CPU_RULE if exact else OTHER_CPU_RULE}
    rows = [{**identity, **row} for row in metric_rows(recorded, retrained, exact, tolerances)]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"step": "Int64"})  # a final loss has no step


def head_commit(library: Path = LIBRARY) -> str:
    """The commit the code here is at, as records name it, with "+changes" where ``nodelm_lib/``
    differs from it (the retraining then ran code no commit holds); "unknown" outside a checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=library, capture_output=True, text=True)

    try:
        commit = git("rev-parse", "--short", "HEAD")
        if commit.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".").stdout.strip()
    except OSError:
        return "unknown"
    return commit.stdout.strip() + ("+changes" if dirty else "")


def check_reproducibility(records: Iterable[RunRecord], n: int, seed: int = 0, tolerance: float | None = None,
                          step_tolerance: float | None = None, arms: dict[str, str] | None = None,
                          work_dir: str | Path | None = None, progress: bool = True) -> pd.DataFrame:
    """Retrain ``n`` of ``records`` (``sample_records`` with ``seed``) with the code here and
    compare each with its record (``compare``): a tidy table of one row per record and quantity
    (``COLUMNS``), whose ``match`` is False where a retraining did not reproduce its record.

    ``tolerance`` / ``step_tolerance`` replace ``CROSS_CPU_TOLERANCE`` / ``CROSS_CPU_STEP_TOLERANCE``
    for records of another kind of CPU; ``arms`` names records' arms by config hash (a runs table's
    ``arm`` column). The retrainings go to ``work_dir`` (by default a temporary folder, removed
    after), which must not already hold them."""
    tolerances = Tolerances(CROSS_CPU_TOLERANCE if tolerance is None else tolerance,
                            CROSS_CPU_STEP_TOLERANCE if step_tolerance is None else step_tolerance)
    sample = sample_records(records, n, seed)
    head = head_commit()
    with contextlib.ExitStack() as stack:
        folder = Path(work_dir) if work_dir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="nodelm-retrain-")))
        tables = []
        for record in tqdm(sample, disable=not progress, desc="retrain", unit="run"):
            retrained = retrain(record, folder)
            tables.append(compare(record, retrained, (arms or {}).get(record.config_hash), tolerances, head))
    return pd.concat(tables, ignore_index=True)


def summary(table: pd.DataFrame) -> str:
    """One line: how many records and comparisons matched, under which rules."""
    records = table.groupby("config_hash", sort=False)["match"].all()
    rules = ", ".join(f"{count} {rule}" for rule, count in
                      table.drop_duplicates("config_hash")["rule"].value_counts().sort_index().items())
    bad = [h for h, ok in records.items() if not ok]
    verdict = "all match" if not bad else f"{len(bad)} do not match ({', '.join(bad)})"
    return f"{len(records)} records retrained ({rules}), {len(table)} comparisons: {verdict}"


# ----------------------------------------------------------------------------- command line


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text} is not valid: it must be a finite number > 0")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nodelm_lib.runs.reproducibility",
                                     description="Retrain a seeded sample of a table's (or a store's) records with "
                                                 "the code here and compare them with what they recorded; exits 1 "
                                                 "on any mismatch.")
    parser.add_argument("source", help="a runs table (.csv with a config_hash column) or a run store folder")
    parser.add_argument("--sample", type=_positive(int), required=True, metavar="N", help="records to retrain")
    parser.add_argument("--seed", type=int, default=0, help="the draw of the sample (default 0)")
    parser.add_argument("--store", help="for a table: the store holding its records (default: the one under "
                                        "<table folder>/runs/ that has them)")
    parser.add_argument("--tolerance", type=_positive(float), metavar="T",
                        help=f"final and validation losses, another kind of CPU (default {CROSS_CPU_TOLERANCE})")
    parser.add_argument("--step-tolerance", type=_positive(float), metavar="T",
                        help=f"one step's training loss, another kind of CPU (default {CROSS_CPU_STEP_TOLERANCE})")
    parser.add_argument("--work-dir", help="where the retrainings go (default: a temporary folder, removed after)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring): prints the table and a summary; 0 when every
    record matched, 1 when one did not, 2 on a bad argument or source."""
    args = build_parser().parse_args(argv)
    source = Path(args.source)
    try:
        if source.suffix == ".csv":
            records, arms = records_of_table(source, args.store)
        else:
            records, arms = records_of_store(source), {}
        skipped = {r.config_hash: why_not_retrainable(r) for r in records if why_not_retrainable(r)}
        if skipped:
            print(f"not drawn ({len(skipped)} of {len(records)}): " +
                  "; ".join(f"{h} {why}" for h, why in skipped.items()), file=sys.stderr)
        table = check_reproducibility(records, args.sample, args.seed, args.tolerance, args.step_tolerance, arms,
                                      args.work_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 40):
        print(table.to_string(index=False))
    print(summary(table))
    return 0 if table["match"].all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
