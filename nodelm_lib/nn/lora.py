r"""LoRA: low-rank adaptation of a trained model's weights (Hu et al., ICLR 2022).

Fine-tune a model at a new depth or grid while training only a few parameters::

    trained = add_lora(model, rank=8)          # base weights frozen, returns the LoRA factors
    opt = torch.optim.AdamW(trained, lr=1e-3)
    ...                                        # train as usual
    count_lora_parameters(model)               # the parameters trained
    merge_lora(model)                          # a plain model again, same state_dict keys

Each adapted weight becomes, through ``torch.nn.utils.parametrize``,

.. math::
    W \;\to\; W + \frac{\alpha}{r}\, B A, \qquad A \in \mathbb{R}^{r \times \mathrm{in}},\;
    B \in \mathbb{R}^{\mathrm{out} \times r},

with A Kaiming-uniform (as ``nn.Linear`` and the reference LoRA code) and B zero, so the
adapted model starts equal to the base model bit for bit (W + 0 is W for finite W).

Why a parametrization and not a wrapper layer: the models here use ``nn.Linear`` and
time-dependent layers (``HyperLinear``, ``ModulatedLinear``) that all read a 2-D parameter
called ``weight``; a parametrization changes what ``module.weight`` returns without touching
the layer's code, so every family (and fast decoding, which reads ``weight`` too) gets LoRA
the same way. For a time-dependent layer the base ``weight`` is one term of W(t):

- ``HyperLinear`` (node): W(t) = B + sum_k e_k(t) A_k, so the adapter shifts W(t) by the same
  low-rank delta at every t;
- ``ModulatedLinear`` (ti_mlp, ti_ssm): W_eff(t) = W_base * sigmoid(g(t)), so the delta is on
  W_base and reaches W_eff(t) gated, (delta * sigmoid(g(t))), the same gate as the base.

The time machinery itself (hypernetwork coefficients, gates, time embeddings) is not adapted
by default; name it in ``targets`` to adapt it too.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Callable, Iterable

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

# The projections of attention, the MLP and the SSM mixer in every family here (the leaf names
# of their modules). Embeddings, the tied head and the time machinery are not among them.
DEFAULT_TARGETS = ("c_attn", "c_proj", "c_fc", "in_proj", "x_proj", "out_proj")

_SAVED_FLAGS = "_lora_saved_requires_grad"  # where add_lora keeps the flags merge_lora restores


class LoRA(nn.Module):
    """The parametrization ``W -> W + (alpha / rank) B @ A`` of one (out, in) weight."""

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float):
        super().__init__()
        out_features, in_features = weight.shape
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        factory = dict(device=weight.device, dtype=weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, **factory))  # zero: start at W
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init, as in the LoRA paper's code

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        # one expression for the adapted forward and for merge_lora, so merging is exact
        return weight + self.scale * (self.lora_B @ self.lora_A)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def add_lora(model: nn.Module, rank: int = 8, alpha: float | None = None,
             targets: Iterable[str] | Callable[[str, nn.Module], bool] = DEFAULT_TARGETS) -> list[nn.Parameter]:
    """Adapt ``model`` in place with LoRA factors; freeze everything else; return the factors.

    ``rank``: r, at most min(out, in) of every adapted weight. ``alpha``: the scale is
    alpha / r; None means alpha = r (scale 1). ``targets``: which modules' ``weight`` to adapt,
    among the modules with a 2-D parameter called ``weight`` (``nn.Linear`` and the
    time-dependent linear layers; never embeddings): either fnmatch patterns, each matched
    against a module's qualified name (``"blocks.*.attn.c_attn"``) or, without a dot, its last
    name (``"c_proj"``), or a predicate ``(name, module) -> bool``. The default adapts the
    attention, MLP and SSM projections. A weight shared by two modules (the head tied to the
    token embedding) is never adapted: selecting one is an error.

    Every parameter of ``model`` gets ``requires_grad=False`` except the returned factors;
    ``merge_lora`` restores the flags. Returns the trainable parameters (give them to the
    optimiser). While adapted, the state_dict holds ``...parametrizations.weight.original`` and
    the factors instead of ``...weight``: merge before ``save_model``.
    """
    rank, alpha = _check_rank_alpha(rank, alpha)
    if any(parametrize.is_parametrized(m) for m in model.modules()):
        raise ValueError("model already has parametrized weights (add_lora twice?); merge_lora(model) first")
    chosen = _select(model, targets)
    for name, module in chosen:
        out_features, in_features = module.weight.shape
        if rank > min(out_features, in_features):
            raise ValueError(f"rank={rank} is not valid for {name}.weight of shape {tuple(module.weight.shape)}: "
                             f"choose 1 <= rank <= {min(out_features, in_features)}")
    # freeze the base model first, so that only the factors created below train
    setattr(model, _SAVED_FLAGS, [(p, p.requires_grad) for p in model.parameters()])
    for p in model.parameters():
        p.requires_grad_(False)
    trained: list[nn.Parameter] = []
    for _, module in chosen:
        lora = LoRA(module.weight, rank, alpha)
        lora.parameter_order = list(module._parameters)  # merge_lora puts ``weight`` back in its place
        parametrize.register_parametrization(module, "weight", lora)
        trained += [lora.lora_A, lora.lora_B]
    return trained


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The LoRA factors of ``model`` (A then B of each adapted weight), in module order."""
    return [p for m in _lora_modules(model) for p in (m.lora_A, m.lora_B)]


def count_lora_parameters(model: nn.Module) -> int:
    """The number of parameters LoRA trains: rank * (in + out) summed over the adapted weights."""
    return sum(p.numel() for p in lora_parameters(model))


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight, in place, and return ``model``.

    Each weight becomes W + (alpha / r) B A computed once (the same expression as the adapted
    forward, so the merged model's outputs equal the adapted model's), the parametrizations
    and factors go, and the state_dict keys are the base model's again (``load_state_dict``
    into a fresh ``build_model`` works). The ``requires_grad`` flags ``add_lora`` saved are
    restored.
    """
    adapted = [(m, name) for m in model.modules() if parametrize.is_parametrized(m)
               for name, plist in m.parametrizations.items() if any(isinstance(p, LoRA) for p in plist)]
    if not adapted:
        raise ValueError("model has no LoRA adapters to merge: call add_lora(model) first")
    for module, name in adapted:
        # writes the adapted value into the original Parameter (the same object, so references held
        # elsewhere, e.g. by a tied module or an optimiser, stay valid)
        order = next(p.parameter_order for p in module.parametrizations[name] if isinstance(p, LoRA))
        parametrize.remove_parametrizations(module, name, leave_parametrized=True)
        _reorder_parameters(module, order)
    for p, flag in getattr(model, _SAVED_FLAGS, []):
        p.requires_grad_(flag)
    if hasattr(model, _SAVED_FLAGS):
        delattr(model, _SAVED_FLAGS)
    return model


PARAMETRIZED = ".parametrizations."  # what torch's parametrize puts in an adapted weight's state_dict keys


def merged_state_dict(state: dict[str, torch.Tensor], scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A state_dict of an adapted model (``add_lora``'s keys: ``<m>.parametrizations.weight.original``
    and ``.0.lora_A`` / ``.0.lora_B``) as the plain model's, each weight W + scale B A computed as the
    adapted forward computes it; a plain state_dict is returned as it is. ``scale`` is alpha / r: 1
    for the library's LoRA runs (``TrainConfig.lora_rank``, alpha = r). Loads a LoRA run's
    checkpoint into ``build_model`` without adding adapters first."""
    if not any(PARAMETRIZED in key for key in state):
        return state
    merged = {}
    for key, value in state.items():
        if PARAMETRIZED not in key:
            merged[key] = value
        elif key.endswith(".original"):
            module, name = key[: key.index(PARAMETRIZED)], key.split(PARAMETRIZED)[1].split(".")[0]
            prefix = f"{module}{PARAMETRIZED}{name}.0."
            merged[f"{module}.{name}"] = value + scale * (state[prefix + "lora_B"] @ state[prefix + "lora_A"])
    return merged


def _reorder_parameters(module: nn.Module, order: list[str]) -> None:
    """Put ``module``'s parameters back in ``order``: removing a parametrization registers the
    weight last, and the state_dict would list ``bias`` before ``weight``, unlike the base model's."""
    params = module._parameters
    moved = [(k, params.pop(k)) for k in order if k in params]
    params.update(moved)


def _check_rank_alpha(rank, alpha) -> tuple[int, float]:
    """rank an integer >= 1, alpha finite and > 0 (None: alpha = rank)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r} is not valid: choose an integer >= 1 (and <= min(out, in) of each weight)")
    if alpha is None:
        return rank, float(rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha={alpha!r} is not valid: choose a finite number > 0, or None for alpha = rank")
    return rank, float(alpha)


def _select(model: nn.Module, targets) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs whose ``weight`` add_lora adapts, checked."""
    if isinstance(targets, str):  # one pattern: a bare string would otherwise be iterated by character
        targets = (targets,)
    if callable(targets):
        wanted = targets
    else:
        patterns = list(targets)
        if not patterns or not all(isinstance(p, str) for p in patterns):
            raise ValueError(f"targets={targets!r} is not valid: choose name patterns (e.g. {DEFAULT_TARGETS}) "
                             "or a predicate (name, module) -> bool")
        wanted = lambda name, module: any(_matches(name, p) for p in patterns)  # noqa: E731
    shared = _shared_parameters(model)
    chosen = []
    for name, module in model.named_modules():
        if not _linear_like(module) or not wanted(name, module):
            continue
        if id(module.weight) in shared:
            raise ValueError(f"{name}.weight is shared with {', '.join(shared[id(module.weight)] - {name + '.weight'})} "
                             "(a tied head?): LoRA does not adapt shared weights; leave it out of targets")
        chosen.append((name, module))
    if not chosen:
        candidates = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if _linear_like(m)})
        raise ValueError(f"targets={targets!r} selects no weight of this {type(model).__name__}: choose among "
                         f"the linear layers' names {candidates} (patterns), or pass a predicate")
    return chosen


def _matches(name: str, pattern: str) -> bool:
    """fnmatch on the qualified name, or on the last name for a pattern without a dot."""
    return fnmatch.fnmatchcase(name, pattern) or ("." not in pattern and fnmatch.fnmatchcase(name.rsplit(".", 1)[-1], pattern))


def _linear_like(module: nn.Module) -> bool:
    """A module holding its own 2-D parameter ``weight`` that is not an embedding table."""
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2 and not isinstance(module, nn.Embedding)


def _shared_parameters(model: nn.Module) -> dict[int, set[str]]:
    """id -> names of each parameter registered under more than one name (tied weights)."""
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    return {k: v for k, v in names.items() if len(v) > 1}


def _lora_modules(model: nn.Module) -> list[LoRA]:
    return [m for m in model.modules() if isinstance(m, LoRA)]
