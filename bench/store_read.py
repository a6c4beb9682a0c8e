"""How long reading a run store takes, against the floor of parsing its JSON: what every notebook
pays when it rebuilds its tables from a full store, and an estimate (``runs.timing``) pays per store.

    python bench/store_read.py                       # results/runs/cpu
    python bench/store_read.py results/runs/cpu_wikitext2 --repeat 3

Per record, the median over ``--repeat`` passes of:

- ``parse``: ``json.loads`` of the file's text alone, the floor of any reading that checks the text;
- ``parse + digest``: and its digest checked as ``parse_record`` checks it (``parsed_digest``);
- ``parse + digest (round trip)``: the digest as ``integrity.digest`` computes it for a record being
  written, through a JSON round trip (how reading checked it before);
- ``load_records``: the whole read (digest, config hash recomputed, config parsed, FLOP count checked);
- ``timing rows``: ``runs.timing.record_timings`` of the records read, FLOP counts forgotten first
  (each record's own count where it has one at its batch);
- ``FLOPs counted for every shape``: what the rows cost before they took the records' counts, each
  distinct shape counted by the flop counter (twice per estimate, before counts were kept).

The texts are read into memory first, so the file system is not timed (but ``load_records`` reads files).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nodelm_lib.runs import timing
from nodelm_lib.runs.store import load_records
from nodelm_lib.training import flops
from nodelm_lib.training.integrity import digest, parsed_digest


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", nargs="?", default="results/runs/cpu", help="a run store (default results/runs/cpu)")
    parser.add_argument("--repeat", type=int, default=3, help="passes, the median reported (default 3)")
    args = parser.parse_args()

    texts = [p.read_text() for p in sorted(Path(args.store).glob("*.json"))]
    if not texts:
        raise SystemExit(f"no records in {args.store}")
    records = load_records(args.store)

    def counted_rows():
        flops.forget_counts()
        for record in records:  # as before: every shape counted, none read from its record
            flops.forward_flops(record.train_config)

    def own_rows():
        flops.forget_counts()
        timing.record_timings(records)

    parts = {
        "parse": lambda: [json.loads(t) for t in texts],
        "parse + digest": lambda: [parsed_digest(json.loads(t)) for t in texts],
        "parse + digest (round trip)": lambda: [digest(json.loads(t)) for t in texts],
        "load_records": lambda: load_records(args.store),
        "timing rows": own_rows,
        "FLOPs counted for every shape": counted_rows,
    }
    times = {name: statistics.median(seconds(fn) for _ in range(args.repeat)) for name, fn in parts.items()}
    mb = sum(len(t) for t in texts) / 2**20
    print(f"{args.store}: {len(texts)} records, {mb:.0f} MiB of JSON; median of {args.repeat} passes")
    floor = times["parse"]
    for name, s in times.items():
        print(f"  {name:34s} {s:7.2f} s  {1e3 * s / len(texts):6.1f} ms/record  {s / floor:5.2f}x parse")


if __name__ == "__main__":
    main()
