"""Command line: ``python -m nodelm_lib train --set model.arch=hybrid --set max_steps=500``
(or ``train --preset small --set model.arch=node``).

Subcommands:
  train    train one run from a YAML config and/or ``--set key=value`` overrides
  tables   rewrite the README's generated tables from results/
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from .config import PRESETS, TrainConfig, apply_overrides, load_yaml, model_preset


def _train(args: argparse.Namespace) -> int:
    from .train import train

    tc = load_yaml(args.config) if args.config else TrainConfig()
    if args.preset:
        # the preset depends on the arch (ODE steps, hybrid span): read it from --set first
        arch = next((item.split("=", 1)[1].strip() for item in args.set
                     if item.split("=", 1)[0].strip() == "model.arch"), tc.model.arch)
        tc = dataclasses.replace(tc, model=model_preset(args.preset, arch, vocab_size=tc.model.vocab_size,
                                                        dropout=tc.model.dropout))
    tc = apply_overrides(tc, args.set)
    rec = train(tc)
    if args.record:
        rec.to_json(args.record)
    final = ", ".join(f"{k}={v:.4f}" for k, v in rec.final.items())
    print(f"{tc.model.arch} seed {tc.seed} ({rec.config_hash}): {final}; "
          f"{rec.tokens_per_s:.0f} tokens/s, {rec.wall_time_s:.1f} s")
    return 0


def _tables(args: argparse.Namespace) -> int:
    from .report import update_readme_tables

    changed = update_readme_tables(Path(args.readme))
    print(f"{args.readme}: {len(changed)} table(s) rewritten" + (f" ({', '.join(changed)})" if changed else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nodelm_lib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train one run")
    p.add_argument("--config", help="YAML file with TrainConfig fields")
    p.add_argument("--preset", choices=tuple(PRESETS), help="model size preset (applied before --set)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. model.arch=hybrid (repeatable)")
    p.add_argument("--record", help="write the run record JSON here")
    p.set_defaults(func=_train)

    p = sub.add_parser("tables", help="rewrite README tables from results/")
    p.add_argument("--readme", default="README.md")
    p.set_defaults(func=_tables)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except ValueError as err:  # configuration errors: say what is wrong, no traceback
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
