"""Runs x seeds with a results store: ``nl.run(tc)`` and ``nl.sweep(base, arms, seeds)``.

The store is a folder of run records, one JSON file per run named by its config hash
(``results/runs/<profile>/<hash>.json``). The hash covers every field that changes the numbers
a run produces (seed included), so

- a run whose completed record exists is read back, never rerun;
- an interrupted run (killed process, Ctrl-C, a crash) resumes from its last checkpoint under
  ``checkpoints/runs/<hash>/`` to the same numbers an uninterrupted run gives;
- records are written atomically (temp file + rename): a kill never leaves half a record.

A run that stops with a non-finite loss is a result too (status ``"failed"``) and is stored.

**The comparison protocol** (``check_protocol``, enforced by ``sweep``): the arms of a sweep
may differ in their model only. Optimiser, schedule, weight decay, batch size, sequence
length, step budget (hence tokens), evaluation batches and data are shared, and every arm runs
the same seeds. The seed fixes the training batch order independently of the model
(``train.py``), so arm A and arm B of seed s see the same batches in the same order and are
scored on the same validation and test batches: differences between arms are paired by seed.
Validation picks nothing: every run trains for the fixed step budget, and its test loss is
computed once, at the end.

With ``isolate=True`` (sweep's default) each run trains in a fresh Python process: its peak
memory (resident set size on CPU) and its speed are its own, not inflated by earlier runs in
the same process, and a crash takes down only that run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch
from tqdm import tqdm

from .config import ModelConfig, TrainConfig, for_arch, from_dict, to_dict, with_values
from .files import atomic_write_text
from .train import (CHECKPOINT_NAME, RECORD_NAME, RunRecord, eval_batches, evaluate, train,
                    with_tokenizer_vocab)

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `import nodelm_lib` stays light (child processes)

DEFAULT_STORE = "results/runs"
DEFAULT_CHECKPOINTS = "checkpoints/runs"
# the TrainConfig fields arms may not change: everything but the model and the seed
PROTOCOL_EXEMPT = frozenset({"model", "seed", "out_dir", "checkpoint_interval", "resume", "log_dir", "progress",
                             "data_dir", "device"})


def record_path(store: str | Path, config_hash: str) -> Path:
    return Path(store) / f"{config_hash}.json"


def stored_record(tc: TrainConfig, store: str | Path = DEFAULT_STORE) -> RunRecord | None:
    """The finished (completed or failed) record of ``tc`` in ``store``, or None."""
    path = record_path(store, with_tokenizer_vocab(tc).config_hash())
    if not path.exists():
        return None
    record = RunRecord.from_json(path)
    return record if record.status in ("completed", "failed") else None


def checkpoint_path(config_hash: str, checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> Path:
    """Where ``run`` keeps the checkpoint (and, at the end, the final model) of a run."""
    return Path(checkpoints) / config_hash / CHECKPOINT_NAME


def run(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
        isolate: bool = False, need_checkpoint: bool = False) -> RunRecord:
    """Train ``tc`` once, or read its record back from ``store`` if it was trained before.

    The run checkpoints every ``tc.checkpoint_interval`` steps (default: every evaluation)
    under ``checkpoints/<hash>/`` and resumes from there when restarted; its final model stays
    there (``record.checkpoint``, loadable with ``nl.load_model``). ``isolate=True`` trains in
    a subprocess (see the module docstring). ``need_checkpoint=True`` retrains a stored run
    whose final model is not on disk (records are committed, checkpoints are not); training is
    deterministic, so the record it writes again holds the same numbers. Returns the stored
    record; an in-process run also carries the trained model as ``record.model``.
    """
    tc = with_tokenizer_vocab(tc)
    config_hash = tc.config_hash()
    done = stored_record(tc, store)
    if done is not None and (not need_checkpoint or checkpoint_path(config_hash, checkpoints).exists()):
        return done
    out_dir = Path(checkpoints) / config_hash
    tc = dataclasses.replace(tc, out_dir=str(out_dir), resume=True,
                             checkpoint_interval=tc.checkpoint_interval or tc.eval_interval)
    if isolate:
        record = _train_in_subprocess(tc, out_dir)
    else:
        try:
            record = train(tc)
        except Exception as err:
            record = getattr(err, "record", None)
            if record is None or record.status != "failed":
                raise  # a bug or an interruption: nothing to store, the checkpoint resumes it
    if record.status in ("completed", "failed"):
        record.to_json(record_path(store, config_hash))
    return record


def _train_in_subprocess(tc: TrainConfig, out_dir: Path) -> RunRecord:
    """``train(tc)`` in a fresh interpreter; its output goes to ``out_dir/train.log``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.json"
    atomic_write_text(config_file, json.dumps(to_dict(dataclasses.replace(tc, progress=False))))
    log = out_dir / "train.log"
    (out_dir / RECORD_NAME).unlink(missing_ok=True)  # what we read back must be this child's
    with open(log, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-m", "nodelm_lib.experiment", str(config_file)],
                                 stdout=log_file, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            code = child.wait()
        except BaseException:  # the sweep was interrupted: stop the child too; its checkpoint stays
            child.terminate()
            child.wait()
            raise
    record_file = out_dir / RECORD_NAME
    record = RunRecord.from_json(record_file) if record_file.exists() else None
    if code != 0 and (record is None or record.status != "failed"):
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"run {tc.config_hash()} ({tc.model.arch}, seed {tc.seed}) exited with code {code}; "
                           f"the last lines of {log}:\n{tail}")
    return record


# --------------------------------------------------------------------------- sweeps


def architecture_arms(model: ModelConfig, archs: Iterable[str], match_to: str | None = None,
                      match_by: str = "d_model") -> dict[str, dict[str, Any]]:
    """Arms comparing architectures at one shape: ``{arch: {"model": for_arch(model, arch)}}``.

    With ``match_to`` (an arch), a ``gpt_matched`` arm is added: a ``gpt`` whose non-embedding
    parameter count is the closest to that arch's (``match_params``, by ``match_by``), so
    that "fewer parameters" and "better loss" can be told apart.
    """
    from .models import count_params, match_params

    archs = list(archs)
    arms = {arch: {"model": for_arch(model, arch)} for arch in archs}
    if match_to is not None:
        target = count_params(for_arch(model, match_to))["non_embedding"]
        arms["gpt_matched"] = {"model": match_params(for_arch(model, "gpt"), target, by=match_by)}
    return arms


def arm_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int]) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) for every arm and seed: ``arms`` maps a name to dotted-key overrides
    of ``base`` (``{"node": {"model.arch": "node"}}``, or ``{"wide": {"model": ModelConfig(...)}}``)."""
    seeds = list(seeds)
    if not arms:
        raise ValueError("arms is empty: give at least one {name: overrides}")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    return [(name, seed, with_values(base, {**overrides, "seed": seed})) for name, overrides in arms.items()
            for seed in seeds]


def check_protocol(configs: list[tuple[str, int, TrainConfig]]) -> None:
    """Raise unless every arm shares the training protocol and the seeds (module docstring)."""
    reference_name, _, reference = configs[0]
    shared = {k: v for k, v in to_dict(reference).items() if k not in PROTOCOL_EXEMPT}
    for name, _, tc in configs[1:]:
        other = {k: v for k, v in to_dict(tc).items() if k not in PROTOCOL_EXEMPT}
        differ = sorted(k for k in shared if shared[k] != other[k])
        if differ:
            raise ValueError(f"arm {name!r} changes the training protocol ({', '.join(differ)}) relative to arm "
                             f"{reference_name!r}; arms of a comparison may differ only in their model")
    seeds_of: dict[str, set] = {}
    for name, seed, _ in configs:
        seeds_of.setdefault(name, set()).add(seed)
    first = next(iter(seeds_of.values()))
    for name, seeds in seeds_of.items():
        if seeds != first:
            raise ValueError(f"arm {name!r} runs seeds {sorted(seeds)}, others {sorted(first)}: pairing needs the same seeds")


def sweep(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], store: str | Path = DEFAULT_STORE,
          checkpoints: str | Path = DEFAULT_CHECKPOINTS, isolate: bool = True, progress: bool = True,
          need_checkpoint: bool = False) -> pd.DataFrame:
    """Run every arm with every seed (stored runs are read back) and return one row per run
    (``record_row``), in arm-major order. Stops at the first run that raises; rerunning the
    sweep continues from there, including the interrupted run's checkpoint."""
    import pandas as pd

    configs = arm_configs(base, arms, seeds)
    check_protocol(configs)
    rows = []
    bar = tqdm(configs, disable=not progress, desc="sweep", unit="run")
    for name, seed, tc in bar:
        bar.set_postfix_str(f"{name} seed {seed}")
        record = run(tc, store, checkpoints, isolate=isolate, need_checkpoint=need_checkpoint)
        rows.append(record_row(record, arm=name))
    bar.close()
    return pd.DataFrame(rows)


def ablation_arms(model: ModelConfig, steps: Iterable[int] = (2, 4, 8), solvers: Iterable[str] = ("euler", "rk4"),
                  state_sizes: Iterable[int] = (16, 32, 64)) -> dict[str, tuple[str, dict[str, dict[str, Any]]]]:
    """The ablations of a time-indexed model ``model`` (a ``ti_mlp`` config), each as
    ``{ablation: (reference arm, arms)}``:

    - ``modulation``: weights modulated in t (``time``) vs shown t = 0 throughout (``constant``);
    - ``integration``: x + dt f(t, x) (``ode``) vs x + f(t, x) (``residual``);
    - ``steps_solver``: ``<solver> <n>`` for every solver and number of steps n (the depth);
    - ``state_size``: ``ti_ssm`` with state size ``N=<n>`` (the MLP replaced by the SSM).

    The references are ``model`` itself (and ``ti_ssm`` at the first state size), so arms
    shared between ablations are one run.
    """
    if model.arch != "ti_mlp":
        raise ValueError(f"the ablations are defined on model.arch='ti_mlp', got {model.arch!r}")
    base = {"model": model}
    steps, solvers, state_sizes = list(steps), list(solvers), list(state_sizes)
    depth = {f"{solver} {n}": {"model": dataclasses.replace(model, n_layers=n, ode=dataclasses.replace(
        model.ode, method=solver, n_steps=n))} for solver in solvers for n in steps}
    ssm = for_arch(model, "ti_ssm")
    sizes = {f"N={n}": {"model": dataclasses.replace(ssm, ssm_state_size=n)} for n in state_sizes}
    reference_depth = f"{model.ode.method} {model.n_layers}"
    if reference_depth not in depth:
        raise ValueError(f"the model's own solver and depth ({reference_depth!r}) must be among the "
                         f"steps_solver arms {list(depth)}")
    return {
        "modulation": ("time", {"time": base, "constant": {"model": dataclasses.replace(model, modulation="constant")}}),
        "integration": ("ode", {"ode": base, "residual": {"model": dataclasses.replace(model, integration="residual")}}),
        "steps_solver": (reference_depth, depth),
        "state_size": (f"N={state_sizes[0]}", sizes),
    }


def depth_curve(record: RunRecord, eval_steps: Iterable[int], methods: Iterable[str] | None = None,
                checkpoints: str | Path = DEFAULT_CHECKPOINTS, device: str = "cpu") -> "pd.DataFrame":
    """Validation loss of a trained continuous-depth run solved with other numbers of steps
    (and methods) than it was trained with, on the run's own fixed validation batches.

    One row per (method, n_steps): the trained method and steps, ``nfe`` (field evaluations
    per forward pass) and ``val_loss``. Needs the run's final model on disk (``run(...,
    need_checkpoint=True)``).
    """
    import pandas as pd

    from .checkpoints import load_model

    path = checkpoint_path(record.config_hash, checkpoints)
    if not path.exists():
        raise FileNotFoundError(f"no final model of run {record.config_hash} at {path}; "
                                "train it with run(..., need_checkpoint=True)")
    tc = record.train_config
    model = load_model(path, device=device)
    trained = model.cfg.ode
    batches = eval_batches(tc, "validation")  # the batches the run's own evaluations used
    rows = []
    for method in methods or [trained.method]:
        for n in eval_steps:
            model.set_ode(method=method, n_steps=n)
            loss = evaluate(model, batches, torch.device(device), contextlib.nullcontext)
            rows.append({"config_hash": record.config_hash, "seed": record.seed, "trained_method": trained.method,
                         "trained_steps": trained.n_steps, "method": method, "n_steps": n,
                         "nfe": model.ode_stats()["nfe"], "val_loss": loss})
    model.set_ode(trained)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- records as tables


def record_row(record: RunRecord, arm: str | None = None) -> dict:
    """One flat row of a record: identity, final losses (with perplexity and bits per token),
    parameters, FLOPs and cost."""
    tc = record.train_config
    steps = len(record.metrics)
    final = record.final
    row = {
        "arm": arm if arm is not None else tc.model.arch, "seed": record.seed, "arch": tc.model.arch,
        "config_hash": record.config_hash, "status": record.status,
        "val_loss": final.get("val_loss", math.nan), "test_loss": final.get("test_loss", math.nan),
        "train_loss": final.get("train_loss", math.nan),
        "params_total": record.params.get("total"), "params_non_embedding": record.params.get("non_embedding"),
        "flops_per_token": record.flops_per_token,
        "ms_per_step": 1e3 * record.train_time_s / steps if steps else math.nan,
        "tokens_per_s": record.tokens_per_s, "peak_memory_mb": record.peak_memory_mb,
        "train_time_s": record.train_time_s, "wall_time_s": record.wall_time_s, "steps": steps,
    }
    for split in ("val", "test"):
        loss = row[f"{split}_loss"]
        row[f"{split}_ppl"] = math.exp(loss) if math.isfinite(loss) else math.nan
        row[f"{split}_bits_per_token"] = loss / math.log(2)
    return row


def load_records(store: str | Path = DEFAULT_STORE) -> list[RunRecord]:
    """Every record in ``store``, sorted by file name."""
    return [RunRecord.from_json(p) for p in sorted(Path(store).glob("*.json"))]


def curves(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int],
           store: str | Path = DEFAULT_STORE) -> pd.DataFrame:
    """Validation curves of a finished sweep, long format: arm, seed, step, tokens,
    train_time_s, val_loss (one row per evaluation). Missing runs raise."""
    import pandas as pd

    rows = []
    for name, seed, tc in arm_configs(base, arms, seeds):
        record = stored_record(tc, store)
        if record is None:
            raise FileNotFoundError(f"no finished record of arm {name!r} seed {seed} in {store}; run the sweep first")
        tokens_per_step = tc.batch_size * tc.seq_len
        rows += [{"arm": name, "seed": seed, "step": e["step"], "tokens": e["step"] * tokens_per_step,
                  "train_time_s": e.get("train_time_s", math.nan), "val_loss": e["val_loss"]} for e in record.evals]
    return pd.DataFrame(rows)


def time_to_target(curves_df: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (arm, seed): training time and step of the first evaluation at or below validation
    loss ``target`` (NaN if never reached). Resolution is the evaluation interval."""
    import pandas as pd

    rows = []
    for (arm, seed), group in curves_df.groupby(["arm", "seed"], sort=False):
        hit = group[group["val_loss"] <= target]
        first = hit.iloc[0] if len(hit) else None
        rows.append({"arm": arm, "seed": seed, "target": target,
                     "step_to_target": first["step"] if first is not None else math.nan,
                     "time_to_target_s": first["train_time_s"] if first is not None else math.nan})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m nodelm_lib.experiment CONFIG.json``: one training run (``run(isolate=True)``'s child)."""
    (config_file,) = argv if argv is not None else sys.argv[1:]
    tc = from_dict(TrainConfig, json.loads(Path(config_file).read_text()))
    try:
        train(tc)
    except Exception as err:  # a failed run wrote its record (status "failed"); the parent reads it
        if getattr(err, "record", None) is None:
            raise
        print(f"run failed: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
