"""The record of one run (``RunRecord``: config, hash, metrics, final losses, costs, environment),
its JSON form with a digest, what its final train loss is (``final_train_loss``) and what a
finished run is checked for (``check_learned``)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nodelm_lib.config import TrainConfig, from_dict
from nodelm_lib.files import atomic_write_text
from nodelm_lib.models import CausalLM

from . import integrity


CHECKPOINT_NAME = "checkpoint.pt"


RECORD_NAME = "record.json"


class NonFiniteError(RuntimeError):
    """Raised when the loss or gradient norm stops being finite; ``.record`` holds the run so far."""

    def __init__(self, message: str, record: "RunRecord"):
        super().__init__(message)
        self.record = record


def final_train_loss(metrics: list[dict]) -> float:
    """Mean training loss over the last 10% of steps (at least 1, at most 50): one step's
    loss is too noisy to compare runs by."""
    n = max(1, min(50, len(metrics) // 10))
    return float(np.mean([row["loss"] for row in metrics[-n:]]))


@dataclass
class RunRecord:
    """Everything one run produced; ``to_json`` / ``from_json`` round-trip it."""

    config: dict
    config_hash: str
    seed: int
    status: str = "running"  # running | completed | failed | interrupted
    metrics: list[dict] = field(default_factory=list)  # one row per optimisation step
    evals: list[dict] = field(default_factory=list)  # one row per evaluation (step, val_loss, train_time_s)
    final: dict = field(default_factory=dict)  # train_loss, val_loss, test_loss
    params: dict = field(default_factory=dict)  # total, non_embedding
    flops_per_token: float = 0.0  # forward pass, matmuls and attention (flops.forward_flops_per_token)
    # the sequences per forward pass that flops_per_token was counted at: this process's share of
    # the batch (records written before the count took a batch have 1, the count at one sequence)
    flops_batch_size: int = 1
    # forward FLOPs per token of a training step where it differs from flops_per_token (random
    # training grids, flow regularisers: flops.training_forward_flops_per_token); 0: the same
    train_flops_per_token: float = 0.0
    wall_time_s: float = 0.0
    train_time_s: float = 0.0
    tokens_per_s: float = 0.0
    peak_memory_mb: float = 0.0  # process_peak_memory_mb at the end of the run
    # compile=True: seconds of this process's first training step, which traces and compiles the
    # forward and backward graphs (one step's own compute included); 0 for an eager run
    compile_time_s: float = 0.0
    activation_mb: float = 0.0  # saved-for-backward tensors of one training step (activation_bytes)
    environment: dict = field(default_factory=dict)
    error: str | None = None
    checkpoint: str | None = None  # the final model's file, when the run kept one
    # what a finished run did that its numbers alone would not say (``check_learned``)
    warnings: list[str] = field(default_factory=list)
    # the trained model, returned by ``train`` in the process that trained it; not stored in the
    # JSON (None in a record read back: load ``checkpoint`` with ``nl.load_model``)
    model: CausalLM | None = field(default=None, repr=False, compare=False, metadata={"stored": False})

    @property
    def train_config(self) -> TrainConfig:
        return from_dict(TrainConfig, self.config)

    @property
    def step_flops_per_token(self) -> float:
        """Forward FLOPs per token of the run's training steps (its 3x is the training cost)."""
        return self.train_flops_per_token or self.flops_per_token

    def to_json(self, path: str | Path | None = None) -> str:
        """The record as JSON, with a digest of its contents (``integrity.digest``) that
        ``from_json`` checks; written atomically to ``path`` if given."""
        stored = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("stored", True)}
        text = json.dumps({**stored, integrity.DIGEST_KEY: integrity.digest(stored)}, indent=1)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "RunRecord":
        """The record in JSON text or a file; ``integrity.RecordError`` naming the file where it
        is not readable JSON, not a record, or changed since it was written (its digest)."""
        text, path = str(text_or_path), None
        if not text.lstrip().startswith("{"):
            path = Path(text_or_path)
            text = integrity.read_record_text(path)
        fields = [f for f in dataclasses.fields(cls) if f.metadata.get("stored", True)]
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        return cls(**integrity.parse_record(text, path, [f.name for f in fields], required))

    def curve_ends(self, eval_on: str) -> list[tuple[str, float, float]]:
        """(name, stored value, where its own curve ends) of each final loss that a curve defines:
        the train loss (``final_train_loss`` of the metrics) and, unless the final validation loss
        was scored on the whole split (``eval_on="whole_split_at_end"``), the last evaluation's.
        ``integrity.verify_record`` checks a completed record's against each other."""
        ends = []
        if self.metrics and "train_loss" in self.final:
            ends.append(("final train_loss", self.final["train_loss"], final_train_loss(self.metrics)))
        if self.evals and "val_loss" in self.final and eval_on != "whole_split_at_end":
            ends.append(("final val_loss", self.final["val_loss"], self.evals[-1]["val_loss"]))
        return ends


class AboveUniformWarning(UserWarning):
    """A run that finished worse than guessing every token uniformly: it learned nothing."""


def check_learned(record: RunRecord, vocab_size: int) -> None:
    """Flag ``record`` (in ``record.warnings``, and as an ``AboveUniformWarning``) where its final
    validation loss is above ln(vocab_size), the loss of a uniform guess over the vocabulary: a
    run that diverged without a non-finite loss (a learning rate far too high) would otherwise
    read as "completed". Its numbers are kept as they are."""
    uniform = math.log(vocab_size)
    loss = record.final.get("val_loss", math.nan)
    if loss > uniform:
        lr = record.config.get("lr")
        message = (f"final validation loss {loss:.4f} is above a uniform guess over the {vocab_size} tokens "
                   f"(ln {vocab_size} = {uniform:.4f}): the run learned nothing (lr={lr} too high, or too few "
                   f"steps?)")
        record.warnings.append(message)
        warnings.warn(f"{record.config['model']['arch']} seed {record.seed} ({record.config_hash}): {message}",
                      AboveUniformWarning, stacklevel=3)
