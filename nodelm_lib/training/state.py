"""What a killed run resumes from (model, optimiser, random states and the record so far, in one
file) and the parent weights a depth-transfer run starts from."""

from __future__ import annotations

from pathlib import Path

import torch

from nodelm_lib.config import TrainConfig, to_dict
from nodelm_lib.files import atomic_write
from nodelm_lib.models import CausalLM
from nodelm_lib.nn.lora import merged_state_dict

from . import distributed
from .distributed import SINGLE, Context
from .model_files import load_torch_file, model_state, read_checkpoint
from .record import CHECKPOINT_NAME, RunRecord


def save_training_state(path: Path, model, optimizer, step: int, batch_gen: torch.Generator, record: RunRecord,
                        rank_rng: list[dict] | None = None) -> None:
    """Everything an exact resume needs; also a model file ``nl.load_model`` reads (it holds
    the model's config, the tokenizer and the dataset next to the weights). ``rank_rng``: every
    rank's random state in a data-parallel run (``distributed.gather_rng_states``)."""
    config = record.config
    state = model_state(  # the model file's layout, with what a resume needs beside it
        model,
        step=step,
        tokenizer=config["tokenizer"],
        dataset=config["dataset"],
        optimizer=optimizer.state_dict(),
        batch_generator=batch_gen.get_state(),
        torch_rng=torch.get_rng_state(),
        cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        config_hash=record.config_hash,
        metrics=record.metrics,
        evals=record.evals,
        train_time_s=record.train_time_s,
    )
    if rank_rng is not None:
        state["rank_rng"] = rank_rng
    atomic_write(path, lambda f: torch.save(state, f))


def load_training_state(path: Path, model, optimizer, batch_gen: torch.Generator, record: RunRecord,
                        ctx: Context = SINGLE, device: torch.device | None = None) -> int:
    """Restore a run from ``path``, written by any number of processes; returns the number of
    steps already done. In a data-parallel run (``ctx``) every rank reads the same replicated
    state, and rank r > 0 its own random state (``distributed.restore_rng_state``)."""
    state = load_torch_file(path, "checkpoint")
    if state["config_hash"] != record.config_hash:
        raise ValueError(
            f"checkpoint {path} belongs to config {state['config_hash']}, not {record.config_hash}; "
            "use another out_dir or resume=False"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    batch_gen.set_state(state["batch_generator"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    record.metrics, record.evals = list(state["metrics"]), list(state["evals"])
    record.train_time_s = float(state.get("train_time_s", 0.0))
    distributed.restore_rng_state(ctx, state.get("rank_rng"), record.seed, int(state["step"]), device)
    return int(state["step"])


def parent_checkpoint(tc: TrainConfig) -> Path:
    """Where the final model of ``tc.init_from`` lies: beside ``tc``'s own checkpoint folder."""
    if not tc.out_dir:
        raise ValueError(f"init_from={tc.init_from!r} needs out_dir: the parent run's checkpoint is looked up "
                         "beside the run's own, <out_dir>/../<init_from>/checkpoint.pt")
    return Path(tc.out_dir).parent / tc.init_from / CHECKPOINT_NAME


# the model fields a fine-tuning run may change relative to its parent: the depth
DEPTH_FIELDS = ("n_layers", "ode")


def load_parent_weights(model: CausalLM, tc: TrainConfig) -> None:
    """Copy the parent run's final weights (``tc.init_from``) into ``model``, exactly.

    The parent's model config must equal ``tc.model`` in everything but the depth
    (``DEPTH_FIELDS``): a continuous-depth model's weights do not depend on its number of
    solver steps, so the same flow is then solved on another grid.
    """
    path = parent_checkpoint(tc)
    if not path.exists():
        raise FileNotFoundError(f"no final model of parent run {tc.init_from} at {path}; train it first "
                                "(nl.run(..., need_checkpoint=True))")
    state = read_checkpoint(path)  # the checks of a model file (tensors and plain data only)
    parent = state["model_config"]
    child = to_dict(tc.model) | {"vocab_size": model.cfg.vocab_size}
    differ = sorted(k for k in child if k not in DEPTH_FIELDS and parent.get(k) != child[k])
    if differ:
        raise ValueError(f"the model of parent run {tc.init_from} differs from this run's in {', '.join(differ)}; "
                         f"a fine-tuning run may change only {', '.join(DEPTH_FIELDS)}")
    model.load_state_dict(merged_state_dict(state["model"]))  # a LoRA parent's adapters folded in

