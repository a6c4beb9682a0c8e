"""nodelm_lib: continuous-depth (Neural ODE) transformer language models.

    import nodelm_lib as nl
    cfg = nl.ModelConfig(arch="hybrid", vocab_size=256)
    model = nl.build_model(cfg)
    logits, loss = model(idx, targets)
    rec = nl.train(nl.TrainConfig(model=cfg, max_steps=200))
"""

import warnings

from .version import __version__  # noqa: F401  (nl.__version__)
from .config import PRESETS, ModelConfig, ODEConfig, TrainConfig, apply_overrides, load_yaml, model_preset, save_yaml
from .models import build_model, count_params, match_params
from . import nn  # noqa: F401  (nl.nn: the layers)
from .ode import (Backsolve, Checkpoint, Direct, GradientMethod, Interpolating, Quadrature, Reversible, SolverCounters,
                  SolveStats, odeint)
from .generation.sampling import generate
from .training.model_files import load_model, save_model
from .training.record import NonFiniteError, RunRecord
from .training.device import resolve_device
from .training.loop import train
from .experiments.sweeps import sweep
from .runs.store import run
from .experiments.estimate import estimate_time
from .workspace import Workspace, workspace
from .experiments import profiles  # noqa: F401  (nl.profiles: a notebook's parameter profiles by name, and check_injected)


def __getattr__(name: str):
    # nl.save_checkpoint was this function's name until 0.2.0 (beside the gradient method
    # nl.Checkpoint, which it has nothing to do with); code outside the repository typed it.
    if name == "save_checkpoint":
        warnings.warn("nl.save_checkpoint is now nl.save_model", DeprecationWarning, stacklevel=2)
        return save_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ModelConfig", "ODEConfig", "TrainConfig", "apply_overrides", "load_yaml", "save_yaml",
    "PRESETS", "model_preset", "build_model", "count_params", "match_params", "generate", "save_model", "load_model", "odeint", "SolverCounters", "SolveStats",
    "GradientMethod", "Direct", "Checkpoint", "Backsolve", "Interpolating", "Quadrature", "Reversible", "train", "RunRecord", "NonFiniteError", "resolve_device",
    "run", "sweep", "estimate_time", "Workspace", "workspace",
]
