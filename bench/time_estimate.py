"""How well a store's records predict each other's run time (``runs.timing.run_times``): what a
time budget (``runs.budget``: a run that cannot finish is never started), 07's time table and a
sweep's run order go by.

    python bench/time_estimate.py results/runs/cpu_wikitext2          # each record from all the others
    python bench/time_estimate.py results/runs/cpu_wikitext2 --across-steps
    python bench/time_estimate.py results/runs/cpu --old              # the same for the per-step estimate
    python bench/time_estimate.py results/runs/cpu_wikitext2 --replay --set eval_on=batches --set score_test=false

Each completed record's wall time is estimated from the other records of the store as on the
machine that ran it, and the ratio estimate / measured (start-up allowance included) is printed by
step count and machine, then by arch. ``--across-steps`` estimates each record only from the
records of other step counts (a 500-step selection run from the 2000-step runs, and back) on its
own machine: the case a budget meets when a phase it has not timed comes next. ``--old`` prices a
run as its steps times its records' wall time per step, keyed by the raw stored config, as the
estimate did before scoring was priced per token (for comparison in the same run).

``--replay`` prices the store's completed runs again, as from an empty store on each machine that
ran some of them, on ``--workers`` lanes: the selection runs (seeds >= 100, as 02's selection
seeds are) with ``--set key=value`` applied (what a profile change would make them), then the
reported runs; a machine's own records first, another's where it has none of a run shape. Reads
records only; the docs' Benchmarks page quotes its output.
"""

from __future__ import annotations

import argparse

import pandas as pd
import yaml

from nodelm_lib.config import with_values
from nodelm_lib.experiments.sweep_time import makespan
from nodelm_lib.runs import timing
from nodelm_lib.runs.store import load_records

SELECTION_SEEDS_FROM = 100  # 02's selection seeds (lr_seeds) are 100 and up, its reported seeds 0-4


def per_step_estimate(rows: pd.DataFrame, i: int, steps: int) -> float:
    """The former estimate: steps x the median wall time per step of the other records whose raw
    stored config has the same model and shape (NaN where none has)."""
    same = rows[(rows["raw_key"] == rows.loc[i, "raw_key"]) & (rows.index != i)]
    return steps * float(same["wall_per_step"].median()) + timing.STARTUP_S if len(same) else float("nan")


def replay(records, rows: pd.DataFrame, changes: dict, workers: int) -> None:
    """Minutes to train the store's runs again from an empty store, per machine: selection runs
    (with ``changes``), then reported runs, each phase packed on ``workers`` lanes."""
    print(f"the store's {len(records)} runs again from an empty store, {workers} at a time"
          + (f"; selection runs with {changes}" if changes else ""))
    for machine in sorted(set(rows["machine"])):
        minutes, sources = {}, set()
        for phase in ("selection", "reported"):
            chosen = [r for r in records if (r.seed >= SELECTION_SEEDS_FROM) == (phase == "selection")]
            configs = [with_values(r.train_config, changes) if phase == "selection" else r.train_config for r in chosen]
            est = timing.times_from(configs, rows, machine=machine)
            sources |= {"this machine's" if s == "measured" else "another machine's" if s.startswith("measured on")
                        else "scaled" for s in est["source"]}
            minutes[phase] = makespan(est["seconds"] + timing.STARTUP_S, workers) / 60
        print(f"  {machine}: " + ", ".join(f"{p} {m:.0f} min" for p, m in minutes.items())
              + f", total {sum(minutes.values()):.0f} min (from {' and '.join(sorted(sources))} records)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", help="a run store, e.g. results/runs/cpu_wikitext2")
    parser.add_argument("--across-steps", action="store_true",
                        help="estimate each record only from records of other step counts on its machine")
    parser.add_argument("--old", action="store_true", help="also the former per-step estimate")
    parser.add_argument("--replay", action="store_true", help="the store's runs again from an empty store, per machine")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --replay: a config change for the selection runs (YAML value)")
    parser.add_argument("--workers", type=int, default=2, help="with --replay: runs at a time (default 2)")
    args = parser.parse_args()

    records = [r for r in load_records(args.store)
               if r.status == "completed" and r.metrics and r.wall_time_s >= r.train_time_s > 0]
    rows = timing.record_timings(records).reset_index(drop=True)
    if args.replay:
        changes = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"--set {item!r} is not KEY=VALUE")
            changes[key] = yaml.safe_load(value)
        replay(records, rows, changes, args.workers)
        return
    rows["steps"] = [r.config["max_steps"] for r in records]
    rows["raw_key"] = [timing._run_key(r.config) for r in records]
    rows["wall_per_step"] = [r.wall_time_s / len(r.metrics) for r in records]
    out = []
    for i, r in enumerate(records):
        if args.across_steps:
            others = rows[(rows["steps"] != rows.loc[i, "steps"]) & (rows["machine"] == rows.loc[i, "machine"])]
        else:
            others = rows.drop(index=i)
        if others.empty:
            continue
        est = timing.times_from([r.train_config], others, machine=rows.loc[i, "machine"]).iloc[0]
        out.append({"steps": rows.loc[i, "steps"], "machine": rows.loc[i, "machine"], "arch": rows.loc[i, "arch"],
                    "ratio": (est["seconds"] + timing.STARTUP_S) / r.wall_time_s,
                    "old_ratio": per_step_estimate(rows, i, r.config["max_steps"]) / r.wall_time_s,
                    "source": str(est["source"]).split(" at d=")[0]})
    table = pd.DataFrame(out)
    pd.set_option("display.width", 160)
    print(f"{args.store}: {len(records)} completed records, {len(table)} estimated"
          + (" from other step counts on their machine" if args.across_steps else " from all the others"))
    columns = ["ratio", "old_ratio"] if args.old else ["ratio"]
    for column in columns:
        print(f"\n{column}: estimate / measured wall time, by step count and machine")
        print(table.groupby(["steps", "machine"])[column].describe()[["count", "50%", "min", "max"]].round(2))
    print("\nmedian ratio by arch and step count")
    print(table.pivot_table(index="arch", columns="steps", values=columns, aggfunc="median").round(2))
    print("\nsources:", table["source"].value_counts().to_dict())


if __name__ == "__main__":
    main()
