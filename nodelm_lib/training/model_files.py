"""Model files: the weights with the config that rebuilds them, loaded without running pickle code.

    nl.save_model(model, "model.pt", tokenizer="char")
    model = nl.load_model("model.pt")            # also reads a training run's checkpoint.pt

A file holds only plain containers, numbers, strings and tensors, so ``torch.load`` runs with
``weights_only=True``: a crafted file cannot execute code when loaded, it is refused.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch

from nodelm_lib.config import ModelConfig, from_dict, to_dict
from nodelm_lib.files import atomic_write
from nodelm_lib.models import CausalLM, build_model
from nodelm_lib.nn.lora import merged_state_dict

from .integrity import CheckpointError

FORMAT = "nodelm-model-1"


def model_state(model: CausalLM, **metadata) -> dict:
    """What a model file holds: config, weights and ``metadata`` (e.g. the tokenizer name)."""
    return {"format": FORMAT, "model_config": to_dict(model.cfg), "model": model.state_dict(), **metadata}


def save_model(model: CausalLM, path: str | Path, **metadata) -> Path:
    """Write ``model`` (config + weights + ``metadata``, values plain Python or tensors) to
    ``path`` atomically: a crash mid-write leaves the previous file intact."""
    state = model_state(model, **metadata)
    return atomic_write(path, lambda f: torch.save(state, f))


# torch.save writes a zip archive; files of torch < 1.6 are a bare pickle (protocol 2 opens with 0x80)
ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


def load_torch_file(path: str | Path, what: str = "model file") -> object:
    """``torch.load(path, weights_only=True)`` on the CPU, with an error naming ``path`` and the
    way out where the file is empty, cut short or corrupt (``integrity.CheckpointError``), is not
    a PyTorch file at all, or holds objects that would run code when unpickled (refused)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4)
    way_out = (f"delete it or move it aside (a training run then starts again from step 0; "
               f"`python -m nodelm_lib store quarantine --checkpoints {path.parent}` moves it aside)" if what == "checkpoint" else "save the model again")
    if not head:
        raise CheckpointError(f"{what} {path} is empty (a write that did not finish, or a full disk); {way_out}")
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        raise CheckpointError(f"{what} {path} is not a PyTorch file (it starts with {head!r}, not a zip archive "
                              f"as torch.save writes); give the path of a .pt file written by nodelm")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refusing to load {path}: it holds objects other than tensors and plain data, "
                         f"which would run code when unpickled ({str(err).splitlines()[0]})") from None
    except (RuntimeError, EOFError, OSError, KeyError) as err:  # zip reader / unpickler on a damaged file
        raise CheckpointError(f"{what} {path} cannot be read: it was cut short or is corrupt "
                              f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}); "
                              f"{way_out}") from None


class NonFiniteWeightsWarning(UserWarning):
    """A model file whose weights hold NaN or inf: every output of the model will be NaN."""


def warn_non_finite(weights: dict[str, torch.Tensor], path: str | Path) -> None:
    """Warn, naming ``path`` and the tensors, where ``weights`` hold NaN or inf values. A legal file
    (a run that diverged may be saved), but surely not one meant to be used."""
    bad = {name: int((~torch.isfinite(w)).sum()) for name, w in weights.items()
           if w.is_floating_point() and not torch.isfinite(w).all()}
    if bad:
        shown = ", ".join(f"{name} ({n})" for name, n in list(bad.items())[:3]) + (", ..." if len(bad) > 3 else "")
        warnings.warn(f"model file {path} holds {sum(bad.values())} non-finite weight(s) (NaN or inf) in "
                      f"{len(bad)} tensor(s): {shown}; the model's outputs will be NaN (a run that diverged, "
                      f"or a damaged file)", NonFiniteWeightsWarning, stacklevel=3)


def read_checkpoint(path: str | Path) -> dict:
    """The contents of a model file or training checkpoint, loaded with ``weights_only=True``
    (``load_torch_file``)."""
    path = Path(path)
    if path.is_dir():  # a run directory: its checkpoint
        path = path / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = load_torch_file(path)
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise ValueError(f"{path} is not a nodelm model file or training checkpoint "
                         "(expected the keys 'model' and 'model_config')")
    return state


def load_model(path: str | Path, device: str | torch.device = "cpu") -> CausalLM:
    """Rebuild the model saved at ``path`` (``save_model``'s file, a training run's
    ``checkpoint.pt``, or the run directory holding it), in eval mode on ``device``.
    ``model.checkpoint_metadata`` keeps the file's other entries (tokenizer, step, ...)."""
    state = read_checkpoint(path)
    cfg = from_dict(ModelConfig, state["model_config"])
    model = build_model(cfg)
    try:
        model.load_state_dict(merged_state_dict(state["model"]))  # a LoRA run's adapters folded in
    except RuntimeError as err:  # torch lists every mismatch, one per line: the first says enough
        first = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), str(err))
        raise ValueError(f"the weights in {path} do not fit the model config stored with them (model.arch="
                         f"{cfg.arch!r}, d_model={cfg.d_model}, n_layers={cfg.n_layers}): the config was edited, "
                         f"or the weights come from another model; {first}") from None
    warn_non_finite(state["model"], path)
    model.checkpoint_metadata = {k: v for k, v in state.items() if k not in ("model", "model_config", "optimizer")}
    return model.to(device).eval()
