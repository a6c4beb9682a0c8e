"""nodelm_lib: continuous-depth (Neural ODE) transformer language models.

    import nodelm_lib as nl
    cfg = nl.ModelConfig(arch="hybrid", vocab_size=256)
    model = nl.build_model(cfg)
    logits, loss = model(idx, targets)
    rec = nl.train(nl.TrainConfig(model=cfg, max_steps=200))
"""

__version__ = "0.1.0"  # set before the imports below: train.py records it

import sys

from .config import PRESETS, ModelConfig, ODEConfig, TrainConfig, apply_overrides, load_yaml, model_preset, save_yaml
from .models import build_model, count_params, match_params
from . import nn  # noqa: F401  (nl.nn: every layer under one name; they live in layers.py, time_layers.py, ...)
from .ode import (Backsolve, Checkpoint, Direct, GradientMethod, Interpolating, Quadrature, Reversible,
                  SolverCounters, SolveStats, odeint)
from . import generation
from .generation import generate
# Decoding lives in nodelm_lib.generation: under its old name nodelm_lib.generate the module was
# hidden by the function nl.generate (`import nodelm_lib.generate as m` gives the function). The old
# path stays importable for `from nodelm_lib.generate import ...` as the same module object, with no
# file that the import system could load a second time and bind over the function.
sys.modules[f"{__name__}.generate"] = generation
from .checkpoints import load_model, save_checkpoint
# nl.train is the function, which hides its module nodelm_lib.train: reach the module with
# `from nodelm_lib.train import ...` or importlib.import_module, not `import nodelm_lib.train as m`.
# (It keeps its name: the function's qualified name nodelm_lib.train.train is relied on.)
from .train import NonFiniteError, RunRecord, resolve_device, train  # noqa: E402  (rebinds nl.train to the function)
from .experiment import sweep  # noqa: E402
from .store import run  # noqa: E402
from .estimate import estimate_time  # noqa: E402
from .workspace import Workspace, workspace  # noqa: E402
from . import profiles  # noqa: E402,F401  (nl.profiles: a notebook's parameter profiles by name, and check_injected)


__all__ = [
    "ModelConfig", "ODEConfig", "TrainConfig", "apply_overrides", "load_yaml", "save_yaml",
    "PRESETS", "model_preset", "build_model", "count_params", "match_params", "generate", "save_checkpoint", "load_model", "odeint", "SolverCounters", "SolveStats",
    "GradientMethod", "Direct", "Checkpoint", "Backsolve", "Interpolating", "Quadrature", "Reversible", "train", "RunRecord", "NonFiniteError", "resolve_device",
    "run", "sweep", "estimate_time", "Workspace", "workspace",
]
