"""Command line: ``python -m nodelm_lib train --set model.arch=hybrid --set max_steps=500``
(or ``train --preset small --set model.arch=node``).

Subcommands:
  train     train one run from a YAML config and/or ``--set key=value`` overrides; under
            ``torchrun --nproc_per_node=N -m nodelm_lib train ...`` data-parallel on N processes
            (``batch_size`` is the global batch; rank 0 writes and prints)
  generate  sample text from a saved model, printed as it is generated (``--checkpoint``: a model
            file or a run's checkpoint)
  eval      loss / perplexity of a saved model over a whole split, at a chosen context length
  tables    rewrite the generated tables of the docs pages (and README) from results/
  reproduce run notebooks in turn (``make <nb>``), timing each into results/reproduce_<profile>.json
            and .csv, between two CPU probes (``make reproduce``)
  store     check a run store: every record is what its name says (``store check DIR``); move bad
            files aside so that their runs train again (``store quarantine DIR``)
  cpu       how much of one core's speed this (shared) machine gives now; ``make reproduce``
            measures it before and after, to read its timings by
  chunk     run a notebook's profile within a time budget (runs that cannot finish in time are
            not started) and pack the records it added into one archive (``runs/chunks.py``)
  import-runs  check the records of chunk archives and add them to a run store
  check-params  check a parameters file for a notebook before papermill injects it as code
            (``make <nb>`` runs it first): every key a parameter of the notebook, each set once
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
from pathlib import Path

from .config import PRESETS, TrainConfig, apply_overrides, load_yaml, model_preset


def _train(args: argparse.Namespace) -> int:
    from nodelm_lib.training.distributed import launch_context
    from nodelm_lib.training.loop import train

    tc = load_yaml(args.config) if args.config else TrainConfig()
    if args.preset:
        # the preset depends on the arch (ODE steps, hybrid span): read it from --set first
        arch = next((item.split("=", 1)[1].strip() for item in args.set
                     if item.split("=", 1)[0].strip() == "model.arch"), tc.model.arch)
        tc = dataclasses.replace(tc, model=model_preset(args.preset, arch, vocab_size=tc.model.vocab_size,
                                                        dropout=tc.model.dropout))
    tc = apply_overrides(tc, args.set)
    if args.resume:
        tc = dataclasses.replace(tc, resume=True)
    check_out_dir(tc, args.overwrite)
    rec = train(tc)
    if not launch_context().is_main:  # the other ranks of a torchrun launch computed the same record
        return 0
    if args.record:
        rec.to_json(args.record)
    final = ", ".join(f"{k}={v:.4f}" for k, v in rec.final.items())
    print(f"{tc.model.arch} seed {tc.seed} ({rec.config_hash}): {final}; "
          f"{rec.tokens_per_s:.0f} tokens/s, {rec.wall_time_s:.1f} s")
    return 0


def check_out_dir(tc: TrainConfig, overwrite: bool) -> None:
    """Refuse to train into an ``out_dir`` that holds a checkpoint unless told what to do with
    it: continue it (``--resume``) or start again from step 0 over it (``--overwrite``)."""
    from nodelm_lib.training.record import CHECKPOINT_NAME

    if tc.out_dir is None or tc.resume or overwrite:
        return
    checkpoint = Path(tc.out_dir) / CHECKPOINT_NAME
    if checkpoint.exists():
        raise ValueError(f"out_dir {tc.out_dir} holds a checkpoint ({checkpoint}); training into it would start at "
                         "step 0 and overwrite it. Pass --resume (or --set resume=true) to continue that run, or "
                         "--overwrite to start again from step 0")


def _tokenizer_of(model, override: str | None, data_dir: str | None):
    from .data import get_tokenizer

    name = override or model.checkpoint_metadata.get("tokenizer")
    if name is None:
        raise ValueError("the checkpoint does not name its tokenizer; pass --tokenizer char|gpt2")
    tok = get_tokenizer(name, data_dir=data_dir)
    if tok.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"tokenizer {name!r} has {tok.vocab_size} tokens but the model's vocab_size is "
                         f"{model.cfg.vocab_size}; pass the tokenizer it was trained with")
    return name, tok


def _generate(args: argparse.Namespace) -> int:
    import torch

    from nodelm_lib.training.model_files import load_model
    from nodelm_lib.generation.sampling import generate
    from nodelm_lib.training.device import resolve_device

    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device=device)
    _, tok = _tokenizer_of(model, args.tokenizer, args.data_dir)
    ids = tok.encode(args.prompt)
    if not ids:
        raise ValueError("--prompt is empty after tokenisation; give at least one token")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    stream = TextStream(tok, ids)
    generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
             top_p=args.top_p, use_cache=not args.no_cache, generator=generator, window=args.window,
             on_token=lambda token: stream.add(token.item()))
    stream.close()
    return 0


class TextStream:
    """Prints decoded text as tokens arrive: the prompt first, then what each token adds.

    Tokens not yet printed are held while their text ends in U+FFFD: a BPE token can carry
    part of a UTF-8 character, which decodes only once the rest of it has arrived. Only the
    held tokens are decoded per call (both tokenizers decode by concatenation)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer, self.pending = tokenizer, list(prompt_ids)
        self._flush(final=False)

    def add(self, token_id: int) -> None:
        self.pending.append(token_id)
        self._flush(final=False)

    def close(self) -> None:
        self._flush(final=True)
        print(flush=True)

    def _flush(self, final: bool) -> None:
        text = self.tokenizer.decode(self.pending)
        if final or not text.endswith("\ufffd"):
            print(text, end="", flush=True)
            self.pending.clear()


def _eval(args: argparse.Namespace) -> int:
    from nodelm_lib.training.model_files import load_model
    from .data import load_tokens
    from nodelm_lib.training.evaluation import evaluate_split
    from nodelm_lib.training.device import resolve_device

    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device=device)
    name, _ = _tokenizer_of(model, args.tokenizer, args.data_dir)
    dataset = args.dataset or model.checkpoint_metadata.get("dataset") or "wikitext2"
    tokens = load_tokens(dataset, args.split, name, data_dir=args.data_dir)
    seq_len = args.seq_len or model.cfg.max_seq_len
    res = evaluate_split(model, tokens, seq_len, batch_size=args.batch_size, max_windows=args.max_windows,
                         device=device)
    print(f"{dataset}/{args.split} at seq_len {seq_len} ({res['tokens']} tokens): loss {res['loss']:.4f}, "
          f"perplexity {res['perplexity']:.2f}, {res['bits_per_token']:.4f} bits/token")
    return 0


def _tables(args: argparse.Namespace) -> int:
    from nodelm_lib.reporting.pages import write_tables

    for page, tables in write_tables(Path(args.root)).items():
        print(f"{page}: {len(tables)} table(s) from {', '.join(tables)}")
    return 0


def _cpu(args: argparse.Namespace) -> int:
    from nodelm_lib.training.profiling import cpu_availability

    res = cpu_availability(seconds=args.seconds)
    chunks = f"{res['chunks']} identical chunk" + ("s" if res["chunks"] != 1 else "")
    print(f"cpu availability {res['availability']:.2f} over {res['seconds']:.1f} s: {chunks}, "
          f"fastest {res['best_ms']:.1f} ms, median {res['median_ms']:.1f} ms (the loop took {1 / res['availability']:.1f}x "
          f"its fastest speed on average)")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from nodelm_lib.reporting.reproduce import make_notebook, probe, reproduce

    root = Path(args.root)
    record = reproduce(args.notebooks, args.profile, root, run_notebook=make_notebook(args.make, args.profile, root),
                       cpu_probe=lambda: probe(args.probe_seconds), resume=not args.fresh)
    return 0 if record.status == "done" else 1


def _store(args: argparse.Namespace) -> int:
    from nodelm_lib.runs.store_checks import check_store, quarantine, store_files

    checked = len(store_files(args.store, args.checkpoints))
    if args.action == "check":
        problems = check_store(args.store, args.checkpoints)
        for _, problem in problems:
            print(f"bad: {problem}")
        print(f"{checked} file(s) checked, {len(problems)} bad" +
              ("; `python -m nodelm_lib store quarantine` moves them aside" if problems else ""))
        return 1 if problems else 0
    moved = quarantine(args.store, args.checkpoints)
    for path, target, problem in moved:
        print(f"moved {path} -> {target}: {problem}")
    print(f"{checked} file(s) checked, {len(moved)} moved aside; the runs they stood for train again when next run")
    return 0


def _chunk(args: argparse.Namespace) -> int:
    import os
    from unittest import mock

    from nodelm_lib.experiments.notebook_here import run_notebook_here
    from nodelm_lib.experiments.profiles import notebook_store
    from nodelm_lib.reporting.reproduce import make_notebook
    from nodelm_lib.runs.chunks import describe, run_chunk
    from nodelm_lib.workspace import ENV_VAR as WORK_DIR_ENV

    root = Path(args.root)
    # the notebook is told its work folder, so that the store packed is the one it writes to
    work_dir = Path(args.work_dir or os.environ.get(WORK_DIR_ENV) or root).expanduser().resolve()
    store = notebook_store(args.notebook, args.profile, work_dir)
    if args.runner == "make":
        notebook = make_notebook(args.make, args.profile, root)
        run_in = lambda env: notebook(args.notebook, env=env)  # noqa: E731
    else:  # in this process: no papermill or Jupyter kernel needed (a lent GPU has PyTorch only)
        path = root / "notebooks" / f"{args.notebook}.ipynb"
        if not path.is_file():
            raise FileNotFoundError(f"no notebook {path}")

        def run_in(env: dict) -> int:
            with mock.patch.dict(os.environ, env):  # the deadline must not outlive the chunk in this process
                return run_notebook_here(path, args.profile, cwd=path.parent)
    print(f"chunk: {args.notebook} [{args.profile}], run store {store}", flush=True)
    result = run_chunk(lambda env: run_in({**env, WORK_DIR_ENV: str(work_dir)}), store, args.archive, args.budget,
                       args.unknown_run_s)
    print(describe(result, args.archive))
    return result.exit_code


def _check_params(args: argparse.Namespace) -> int:
    from nodelm_lib.experiments.profiles import check_parameters_file

    values = check_parameters_file(args.notebook, args.params)
    print(f"{args.params}: {len(values)} parameter(s) of {Path(args.notebook).name}")
    return 0


def _import_runs(args: argparse.Namespace) -> int:
    from nodelm_lib.runs.chunks import import_archive

    for archive in args.archives:
        done = import_archive(archive, args.store)
        print(f"{archive}: {len(done['added'])} file(s) added to {args.store}, {len(done['same'])} already there "
              f"with the same results")
    return 0


def count(minimum: int):
    """An argparse type: an integer >= ``minimum``, else an error naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not valid; it must be >= {minimum}")
        return value
    return parse


def number(low: float, high: float = math.inf, low_open: bool = False):
    """An argparse type: a finite number in [low, high] ((low, high] with ``low_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"{text} is not valid; it must be a finite number "
                                             f"{'in ' + bounds if math.isfinite(high) else bounds}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nodelm_lib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (also after the subcommand)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train one run")
    p.add_argument("--config", help="YAML file with TrainConfig fields")
    p.add_argument("--preset", choices=tuple(PRESETS), help="model size preset (applied before --set)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. model.arch=hybrid (repeatable)")
    p.add_argument("--record", help="write the run record JSON here")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--resume", action="store_true",
                      help="continue the run from the checkpoint in out_dir (as --set resume=true)")
    what.add_argument("--overwrite", action="store_true",
                      help="start again from step 0 even though out_dir holds a checkpoint (it is replaced)")
    p.set_defaults(func=_train)

    p = sub.add_parser("generate", help="sample text from a saved model, printed as it is generated")
    p.add_argument("--checkpoint", required=True, help="model file (nl.save_model) or a run's checkpoint.pt / out_dir")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=count(0), default=200)
    p.add_argument("--temperature", type=number(0.0), default=1.0, help="0 is greedy")
    p.add_argument("--top-k", type=count(1), default=None)
    p.add_argument("--top-p", type=number(0.0, 1.0, low_open=True), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context for every token")
    p.add_argument("--window", type=count(1), default=None,
                   help="context tokens each new token sees (default: max_seq_len; more only with model.position=rope)")
    p.add_argument("--tokenizer", choices=("char", "gpt2"), help="default: the one stored in the checkpoint")
    p.add_argument("--data-dir", default=None, help="where the offline data (tiktoken cache) lives")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_generate)

    p = sub.add_parser("eval", help="loss of a saved model over a whole split")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--split", default="test", choices=("train", "validation", "test"))
    p.add_argument("--seq-len", type=count(1), default=None, help="context length (default: the model's max_seq_len)")
    p.add_argument("--dataset", default=None, help="default: the one stored in the checkpoint, else wikitext2")
    p.add_argument("--batch-size", type=count(1), default=8)
    p.add_argument("--max-windows", type=count(1), default=None, help="score only the first N windows")
    p.add_argument("--tokenizer", choices=("char", "gpt2"))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_eval)

    p = sub.add_parser("tables", help="rewrite the docs pages' tables from results/")
    p.add_argument("--root", default=".", help="the repository: its docs/**/*.md and README.md")
    p.set_defaults(func=_tables)

    p = sub.add_parser("reproduce", help="run notebooks in turn (make <nb>), timing each into results/reproduce_<profile>.json")
    p.add_argument("notebooks", nargs="+", help="Makefile notebook targets, in order (e.g. 01_gradient_flow)")
    p.add_argument("--profile", default="cpu", help="params/<nb>/<profile>.yaml (default: cpu)")
    p.add_argument("--make", default="make", help="make command (the Makefile passes its own, via SUBMAKE)")
    p.add_argument("--root", default=".", help="repository root (Makefile, results/)")
    p.add_argument("--probe-seconds", type=float, default=10.0, help="length of each CPU probe")
    p.add_argument("--fresh", action="store_true",
                   help="start a new record even where an unfinished one of this commit could be resumed")
    p.set_defaults(func=_reproduce)

    p = sub.add_parser("chunk", help="run a notebook's profile within a time budget and pack its new records")
    p.add_argument("notebook", help="a Makefile notebook target, e.g. 02_seed_comparison")
    p.add_argument("--profile", required=True, help="params/<notebook>/<profile>.yaml, e.g. gpu")
    p.add_argument("--budget", type=number(0, low_open=True), required=True,
                   help="seconds from now within which every started run must finish (leave a minute for start-up "
                        "and packing below a command's time limit)")
    p.add_argument("--archive", required=True, help="the .tar.gz to write the new records into")
    p.add_argument("--unknown-run-s", type=number(0), default=None,
                   help="seconds to assume for a run that no stored record can time (default 300)")
    p.add_argument("--work-dir", default=None,
                   help="the notebook's work folder, whose results/runs/<profile> is the store it trains into and "
                        "the chunk packs (default: $NODELM_WORK_DIR, else --root)")
    p.add_argument("--runner", choices=("python", "make"), default="python",
                   help="python: the notebook's code in this process, no Jupyter needed (default); make: "
                        "`make <notebook> PROFILE=<profile>` through papermill")
    p.add_argument("--make", default="make", help="make command (--runner make)")
    p.add_argument("--root", default=".", help="repository root (Makefile, notebooks/)")
    p.set_defaults(func=_chunk)

    p = sub.add_parser("import-runs", help="check the records of chunk archives and add them to a run store")
    p.add_argument("archives", nargs="+", help="archives written by `chunk`")
    p.add_argument("--store", required=True, help="the run store to add them to, e.g. results/runs/gpu")
    p.set_defaults(func=_import_runs)

    p = sub.add_parser("check-params", help="check a parameters file for a notebook before papermill injects it")
    p.add_argument("notebook", help="the notebook file (.ipynb) whose parameters cell declares the names")
    p.add_argument("params", help="the YAML parameters file (papermill's -f)")
    p.set_defaults(func=_check_params)

    p = sub.add_parser("store", help="check a run store's records (and checkpoints); move bad ones aside")
    p.add_argument("action", choices=("check", "quarantine"),
                   help="check: list every bad file (exit 1 if any); quarantine: move them under quarantine/")
    p.add_argument("store", nargs="?", help="a folder of run records, e.g. results/runs/cpu (sub-folders too)")
    p.add_argument("--checkpoints", help="also check every *.pt below this folder (e.g. checkpoints/runs)")
    p.set_defaults(func=_store)

    p = sub.add_parser("cpu", help="how much of one core's speed this machine gives now (a shared VM reads < 1)")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to measure")
    p.set_defaults(func=_cpu)
    return parser


# errors that mean "the input is wrong" (exit status 2); anything else is reported in one line
# too (exit status 1), with the traceback under --debug
BAD_INPUT = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted before or after the subcommand
    args = parser.parse_args([a for a in argv if a != "--debug"])
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # one line that says what is wrong; the traceback only under --debug
        if debug:
            raise
        text = " ".join(str(err).split()) or "(no message)"
        if isinstance(err, BAD_INPUT):
            parser.exit(2, f"error: {text}\n")
        parser.exit(1, f"error: {type(err).__name__}: {text} (run with --debug for the traceback)\n")


if __name__ == "__main__":
    sys.exit(main())
