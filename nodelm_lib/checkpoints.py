"""Model files: the weights with the config that rebuilds them, loaded without running pickle code.

    nl.save_checkpoint(model, "model.pt", tokenizer="char")
    model = nl.load_model("model.pt")            # also reads a training run's checkpoint.pt

A file holds only plain containers, numbers, strings and tensors, so ``torch.load`` runs with
``weights_only=True``: a crafted file cannot execute code when loaded, it is refused.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from .config import ModelConfig, from_dict, to_dict
from .files import atomic_write
from .models import CausalLM, build_model

FORMAT = "nodelm-model-1"


def model_state(model: CausalLM, **metadata) -> dict:
    """What a model file holds: config, weights and ``metadata`` (e.g. the tokenizer name)."""
    return {"format": FORMAT, "model_config": to_dict(model.cfg), "model": model.state_dict(), **metadata}


def save_checkpoint(model: CausalLM, path: str | Path, **metadata) -> Path:
    """Write ``model`` (config + weights + ``metadata``, values plain Python or tensors) to
    ``path`` atomically: a crash mid-write leaves the previous file intact."""
    state = model_state(model, **metadata)
    return atomic_write(path, lambda f: torch.save(state, f))


def read_checkpoint(path: str | Path) -> dict:
    """The contents of a model file or training checkpoint, loaded with ``weights_only=True``."""
    path = Path(path)
    if path.is_dir():  # a run directory: its checkpoint
        path = path / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refusing to load {path}: it holds objects other than tensors and plain data, "
                         f"which would run code when unpickled ({str(err).splitlines()[0]})") from None
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise ValueError(f"{path} is not a nodelm model file or training checkpoint "
                         "(expected the keys 'model' and 'model_config')")
    return state


def load_model(path: str | Path, device: str | torch.device = "cpu") -> CausalLM:
    """Rebuild the model saved at ``path`` (``save_checkpoint``'s file, a training run's
    ``checkpoint.pt``, or the run directory holding it), in eval mode on ``device``.
    ``model.checkpoint_metadata`` keeps the file's other entries (tokenizer, step, ...)."""
    state = read_checkpoint(path)
    cfg = from_dict(ModelConfig, state["model_config"])
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    model.checkpoint_metadata = {k: v for k, v in state.items() if k not in ("model", "model_config", "optimizer")}
    return model.to(device).eval()
