"""Dataclass configs with strict validation, YAML round-trips and ``key=value`` overrides.

Three configs nest: ``TrainConfig.model`` is a ``ModelConfig`` and ``ModelConfig.ode`` an
``ODEConfig``. Every config validates itself on construction, so an invalid value fails
where it is written, not hundreds of steps into a run. Errors name the key, the bad value
and the valid choices.

One module although it is longer than the others: the three configs, their checks, the hash
(``config_hash``: which fields it covers and which it leaves out) and the dict / YAML form that
the hash is computed from are what makes a stored run's name, and a reader checks them together.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union

import numpy as np
import yaml

from nodelm_lib.ode.solve import SENSITIVITIES
from nodelm_lib.ode.random_grid import PLACEMENTS, GridDistribution
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS, METHODS
from nodelm_lib.ode.tableaus import TABLEAUS

from . import families
from .data import CORPORA, TOKENIZERS


def __getattr__(name: str) -> tuple[str, ...]:
    # ARCHS and CONTINUOUS_ARCHS are read from the registered families when asked for: the model
    # files register theirs after this module is imported (and a test may register one more).
    if name == "ARCHS":
        return families.names()
    if name == "CONTINUOUS_ARCHS":  # one time-dependent block over t in [0, 1]: depth = solver steps
        return families.names(continuous=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# how a model knows where a token is: a learned table added to the token embeddings, or rotary
# embeddings (q and k rotated by their position in every attention layer, nothing learned)
POSITIONS = ("learned", "rope")
DTYPES = ("float32", "bfloat16")
# what validation and test losses are computed over: `eval_batches` random windows drawn with
# `eval_seed`, the whole split cut into consecutive windows (every token scored once), or the
# windows during training and the whole split for the final validation and test losses (a
# corpus whose validation split is too long to score at every evaluation)
EVAL_ON = ("batches", "whole_split", "whole_split_at_end")
DEVICES = ("auto", "cpu", "cuda", "mps")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    """ValueError naming the config key, its bad value and the valid choices."""
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of {', '.join(map(repr, choices))}")


def _kind(tp: Any) -> str:
    """How an error names the values of field type ``tp``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_kind(inner)} or None"
    if _is_config(tp):
        return f"{'an' if tp.__name__[0] in 'AEIOU' else 'a'} {tp.__name__} (nl.{tp.__name__}(...))"
    return {bool: "True or False", int: "an integer", float: "a finite number", str: "a string"}.get(tp, str(tp))


def _checked_value(key: str, value: Any, tp: Any) -> Any:
    """``value`` if it is of field type ``tp`` (as ``from_dict`` would have made it), else a
    ValueError naming ``key``, the value and its type. A numpy integer, float or bool becomes
    the Python number (it could not be stored as JSON otherwise), a path a string; floats must
    be finite. Nothing else is converted: ``"64"`` for an int is refused, not read as 64 (that is
    ``from_dict``'s job, for text from YAML or ``--set``)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        if inner is str and isinstance(value, os.PathLike):
            return os.fspath(value)
        try:
            return _checked_value(key, value, inner)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not valid: it must be {_kind(tp)} "
                             f"(got {type(value).__name__})") from None
    ok = {bool: isinstance(value, (bool, np.bool_)),
          int: isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)),
          float: isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)),
          str: isinstance(value, str)}.get(tp, isinstance(value, tp) if isinstance(tp, type) else True)
    if not ok:
        raise ValueError(f"{key}={value!r} is not valid: it must be {_kind(tp)} (got {type(value).__name__})")
    if tp is float and not math.isfinite(value):
        raise ValueError(f"{key}={value!r} is not valid: it must be a finite number")
    if tp in (bool, int, float) and type(value).__module__ == "numpy":
        return {bool: bool, int: int, float: float}[tp](value)
    return value


def _check_types(cfg: Any, prefix: str = "") -> None:
    """Every field of the config ``cfg`` holds a value of its declared type (``_checked_value``),
    whether it was built from Python or from YAML / ``--set`` (``from_dict`` converts text first)."""
    for f, tp in _field_types(type(cfg)):
        value = getattr(cfg, f)
        checked = _checked_value(prefix + f, value, tp)
        if checked is not value:
            object.__setattr__(cfg, f, checked)


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def _check_positive(key: str, value: Any, allow_zero: bool = False) -> None:
    bad = value < 0 if allow_zero else value <= 0
    if bad:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{key}={value!r} is not valid; it must be {bound}")


# The largest size a model dimension may have: a tensor dimension beyond it is no model that could
# be allocated, and torch would report an overflow deep inside ("Storage size calculation
# overflowed") instead of naming the field.
MAX_SIZE = 2**31 - 1
# what a seed may be: torch's generators take unsigned 64-bit seeds, numpy's SeedSequence
# (a data-parallel rank's stream) non-negative ones
MAX_SEED = 2**64 - 1


def _check_at_most(key: str, value: Any, bound: int, what: str) -> None:
    if value > bound:
        raise ValueError(f"{key}={value!r} is not valid; it must be at most {bound} ({what})")


class UnknownKeyError(TypeError, ValueError):
    """A config built with a keyword that is none of its fields. A TypeError, as for any function
    given an unexpected keyword, and a ValueError, as for every other bad config value."""


def _named_fields_only(cls: type) -> type:
    """Make the dataclass ``cls``'s constructor (and so ``dataclasses.replace``) refuse an unknown
    keyword with an error that lists the valid ones, instead of Python's bare "unexpected keyword"."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = [f.name for f in fields(cls)]
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise UnknownKeyError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))}; "
                                  f"valid keys: {', '.join(names)}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@_named_fields_only
@dataclass
class ODEConfig:
    """How a continuous-depth block is integrated over t in [0, 1].

    ``n_steps`` is the number of fixed steps (the grid is ``linspace(0, 1, n_steps + 1)``);
    adaptive methods use ``rtol`` / ``atol`` / ``max_num_steps`` instead.

    Training on random grids (``ode.random_grid.GridDistribution``; evaluation keeps the
    ``n_steps`` grid): each training step draws its number of steps uniformly from
    ``[grid_min_steps, grid_max_steps]`` (both 0: ``n_steps`` every time), its end time from
    ``[1 - grid_end_jitter, 1 + grid_end_jitter]``, and with ``grid_placement="random"`` its step
    points at sorted uniform times. The draw comes from the run seed and the step, so it is
    reproducible; a fixed-step method only.

    Flow regularisers (``ode.regularisers``, RNODE): training adds ``kinetic_weight`` times the
    kinetic energy and ``jacobian_weight`` times the (Hutchinson-estimated) squared Frobenius norm
    of the field's Jacobian, integrated along the solution, to the loss it minimises; the loss it
    logs stays the cross-entropy. A fixed-step Runge-Kutta method and ``sensitivity="direct"``.
    """

    method: str = "euler"
    n_steps: int = 4
    sensitivity: str = "direct"
    rtol: float = 1e-3
    atol: float = 1e-4
    max_num_steps: int = 1000
    grid_min_steps: int = 0
    grid_max_steps: int = 0
    grid_end_jitter: float = 0.0
    grid_placement: str = "uniform"
    kinetic_weight: float = 0.0
    jacobian_weight: float = 0.0

    def __post_init__(self) -> None:
        _check_types(self, "ode.")
        check_choice("ode.method", self.method, METHODS)
        check_choice("ode.sensitivity", self.sensitivity, SENSITIVITIES)
        _check_positive("ode.n_steps", self.n_steps)
        _check_positive("ode.rtol", self.rtol)
        _check_positive("ode.atol", self.atol)
        _check_positive("ode.max_num_steps", self.max_num_steps)
        check_choice("ode.grid_placement", self.grid_placement, PLACEMENTS)
        if (self.grid_min_steps, self.grid_max_steps) != (0, 0) and not 1 <= self.grid_min_steps <= self.grid_max_steps:
            raise ValueError(f"ode.grid_min_steps={self.grid_min_steps!r}, ode.grid_max_steps={self.grid_max_steps!r} "
                             "is not a valid range of step counts; need 1 <= grid_min_steps <= grid_max_steps (or "
                             "both 0: n_steps at every training step)")
        if not 0.0 <= self.grid_end_jitter < 1.0:
            raise ValueError(f"ode.grid_end_jitter={self.grid_end_jitter!r} is not valid; it must be in [0, 1)")
        if self.random_grid and self.method not in FIXED_STEP_METHODS:
            raise ValueError(f"random training grids need a fixed-step method ({', '.join(FIXED_STEP_METHODS)}); "
                             f"ode.method={self.method!r} chooses its own steps")
        _check_positive("ode.kinetic_weight", self.kinetic_weight, allow_zero=True)
        _check_positive("ode.jacobian_weight", self.jacobian_weight, allow_zero=True)
        if self.regularised and (self.sensitivity != "direct" or self.method not in TABLEAUS):
            raise ValueError(f"the flow regularisers (ode.kinetic_weight, ode.jacobian_weight) accumulate along a "
                             f"fixed-step Runge-Kutta solve backpropagated directly: they need ode.sensitivity="
                             f"'direct' and ode.method one of {', '.join(map(repr, TABLEAUS))}; got "
                             f"sensitivity={self.sensitivity!r}, method={self.method!r}")
        if self.max_num_steps > MAX_SIZE or self.n_steps > MAX_SIZE:
            raise ValueError(f"ode.n_steps={self.n_steps!r} / ode.max_num_steps={self.max_num_steps!r}: "
                             f"each must be at most {MAX_SIZE} (2**31 - 1)")

    def for_inference(self) -> "ODEConfig":
        """This config without what only training reads (random grids, flow regularisers): the base
        for solving a trained model at another setting (``generate(..., ode=...)``)."""
        return dataclasses.replace(self, grid_min_steps=0, grid_max_steps=0, grid_end_jitter=0.0,
                                   grid_placement="uniform", kinetic_weight=0.0, jacobian_weight=0.0)

    @property
    def regularised(self) -> bool:
        """Whether training adds a flow regulariser to its loss."""
        return self.kinetic_weight > 0 or self.jacobian_weight > 0

    @property
    def random_grid(self) -> bool:
        """Whether training draws a new grid at every step."""
        return self.grid_max_steps > 0 or self.grid_end_jitter > 0 or self.grid_placement != "uniform"

    def training_grids(self) -> GridDistribution | None:
        """The distribution training grids are drawn from, or None for the fixed ``n_steps`` grid."""
        if not self.random_grid:
            return None
        low, high = (self.grid_min_steps, self.grid_max_steps) if self.grid_max_steps else (self.n_steps, self.n_steps)
        return GridDistribution(low, high, self.grid_end_jitter, self.grid_placement)


@_named_fields_only
@dataclass
class ModelConfig:
    """Architecture of a causal language model; ``arch`` selects the family.

    ``vocab_size=None`` means "take it from the tokenizer" (``nl.train`` fills it in).

    - ``gpt`` / ``hybrid`` / ``ssm``: ``parallel=True`` makes the discrete blocks parallel
      (x + Attn(LN(x)) + MLP(LN'(x))); ``ssm`` is the discrete control of ``ti_ssm``, its
      selective state-space layer (``ssm_state_size`` states per channel) in the MLP's place. Hybrid: layers ``[ode_start, ode_end)`` of the
      ``n_layers`` stack are replaced by one ODE block; ``control_dim`` is the size of the
      optional control vector u (0 disables it).
    - ``node`` / ``ti_mlp`` / ``ti_ssm``: one time-dependent block integrated over
      t in [0, 1]. Their depth is the number of solver steps, so with a fixed-step method
      ``n_layers`` must equal ``ode.n_steps``. ``time_features`` is the size of the
      sinusoidal embedding of t and ``time_hidden`` the width of the networks reading it.
      ``hyper_dim`` (node) is E, the number of basis matrices each weight mixes.
      ``modulation="constant"`` shows every weight the fixed t = 0 (the ablation: is depth
      dependence needed?); ``integration="residual"`` steps x + f(t_k, x) instead of
      x + dt f(t_k, x) (needs ``ode.method="euler"``). ``ssm_state_size`` is N, the state
      size per channel of ti_ssm's state-space layer.
    - ``position``: ``"learned"`` (the default) adds a learned table of ``max_seq_len``
      position embeddings to the token embeddings; ``"rope"`` has no table and instead rotates
      every attention layer's queries and keys by angles proportional to their absolute
      positions (rotary embeddings, RoFormer), so that attention scores depend on relative
      positions only. It applies to every arch, through its attention layers (``ssm`` and
      ``ti_ssm`` have attention too; their scan is positional by construction and unchanged). A
      rope model evaluates sequences of any length: ``max_seq_len`` is then its training
      context (``TrainConfig.seq_len`` is still capped by it) and ``generate``'s default window,
      not a limit. Rope rotates pairs of each head's dimensions, so ``d_model / n_heads`` must
      be even.
    """

    arch: str = "gpt"
    vocab_size: Union[int, None] = None
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    max_seq_len: int = 128
    dropout: float = 0.0
    mlp_ratio: float = 4.0
    bias: bool = True
    parallel: bool = False
    ode: ODEConfig = field(default_factory=ODEConfig)
    ode_start: int = 2
    ode_end: int = 4
    control_dim: int = 4
    ode_scale_init: float = 0.1
    time_features: int = 32
    time_hidden: int = 64
    hyper_dim: int = 4
    modulation: str = "time"
    integration: str = "ode"
    ssm_state_size: int = 16
    position: str = "learned"

    def __post_init__(self) -> None:
        _check_types(self, "model.")
        family = families.get(self.arch)  # a ValueError listing the families
        check_choice("model.position", self.position, POSITIONS)
        if self.vocab_size is not None:
            _check_positive("model.vocab_size", self.vocab_size)
        for key in ("d_model", "n_heads", "n_layers", "max_seq_len", "mlp_ratio"):
            _check_positive(f"model.{key}", getattr(self, key))
        for option in families.all_options().values():  # the families' own fields, whatever the arch
            option.validate(getattr(self, option.name))
        for key in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len", "time_features", "time_hidden",
                    "hyper_dim", "ssm_state_size", "control_dim"):
            if getattr(self, key) is not None:
                _check_at_most(f"model.{key}", getattr(self, key), MAX_SIZE, "2**31 - 1")
        if self.mlp_ratio * self.d_model < 1 - 1e-9:  # below one hidden unit: nn.mlp_hidden would round it up to 1
            raise ValueError(f"model.mlp_ratio={self.mlp_ratio!r} is not valid: with model.d_model={self.d_model} the "
                             f"MLP's hidden width mlp_ratio * d_model = {self.mlp_ratio * self.d_model:g} is below one "
                             f"unit; it must be at least 1 (mlp_ratio >= 1 / d_model = {1 / self.d_model:g})")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}"
            )
        if self.position == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model.position='rope' rotates pairs of each head's dimensions, but "
                             f"model.d_model / model.n_heads = {self.d_model // self.n_heads} is odd; "
                             f"choose d_model and n_heads with an even quotient")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout!r} is not valid; it must be in [0, 1)")
        self._check_family(family)

    def _check_family(self, family: families.Family) -> None:
        """What ``arch``'s declaration asks of the config: its own check, no other family's
        exclusive option away from its default, and for a continuous family depth = solver steps."""
        if family.check is not None:
            family.check(self)
        for name, option in families.exclusive_options().items():
            value = getattr(self, name)
            if not family.has_option(name) and value != option.default:
                raise ValueError(option.refusal(value, self.arch, families.with_option(name)))
        if not family.continuous:
            return
        if self.ode.method in FIXED_STEP_METHODS and self.n_layers != self.ode.n_steps:
            raise ValueError(
                f"model.n_layers={self.n_layers} but model.ode.n_steps={self.ode.n_steps}: for "
                f"model.arch={self.arch!r} the depth is the number of solver steps; set both to the same value"
            )
        if self.integration == "residual" and self.ode.method != "euler":
            raise ValueError(f"model.integration='residual' steps x + f(t_k, x), a discrete stack: "
                             f"it needs model.ode.method='euler', got {self.ode.method!r}")
        if self.integration == "residual" and (self.ode.grid_end_jitter > 0 or self.ode.grid_placement != "uniform"):
            raise ValueError("model.integration='residual' adds f(t_k, x) whatever the step's length: its random "
                             "training grids may vary the number of steps only (ode.grid_end_jitter=0, "
                             "ode.grid_placement='uniform')")


# Tong et al.'s hypernetwork sizes (their qkvflow code's TemporalLinear): 32 sinusoidal
# frequencies (a 2 * 32 + 1 time code), and a time-embedding MLP of width 64 whose output is
# the 64 coefficients of the basis matrices, W(t) = B + sum_k e_k(t) A_k. At d_model 256 and
# 6 layers this is the ~51.5M-parameter model the seed extension compared against.
TONG_HYPERNETWORK = dict(time_features=64, time_hidden=64, hyper_dim=64)

# Shapes of the seed's presets (the 002 guide: small is its 6 x 256 gpu config). Continuous
# archs take ode.n_steps = n_layers, the hybrid replaces the middle third of its layers.
PRESETS = {
    "small": dict(d_model=256, n_heads=4, n_layers=6, max_seq_len=256),
    "medium": dict(d_model=768, n_heads=12, n_layers=12, max_seq_len=1024),
    "large": dict(d_model=1024, n_heads=16, n_layers=24, max_seq_len=1024),
}


def model_preset(name: str, arch: str = "gpt", **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` of preset size ``name`` (small / medium / large) for ``arch``.

    ``model_preset("small", "node", vocab_size=50257)``; ``overrides`` are ModelConfig
    fields and win over the preset.
    """
    check_choice("preset", name, tuple(PRESETS))
    base = dataclasses.replace(ModelConfig(), **{k: v for k, v in PRESETS[name].items()})
    return dataclasses.replace(for_arch(base, arch), **overrides)


def for_arch(cfg: ModelConfig, arch: str) -> ModelConfig:
    """``cfg``'s width, depth and options for another ``arch``, with that arch's depth rule
    (``Family.depth``): continuous archs take ``ode.n_steps = n_layers`` (same ODE method
    otherwise), the hybrid replaces the middle third of its ``n_layers``. Exclusive options of
    other archs (parallel, modulation, integration) go back to their defaults where ``arch``
    does not have them."""
    family = families.get(arch)
    values: dict[str, Any] = {"arch": arch}
    for name, option in families.exclusive_options().items():
        if not family.has_option(name):
            values[name] = option.default
    ode_values = {}
    for key, value in family.depth_values(cfg.n_layers).items():
        section, _, leaf = key.rpartition(".")
        (ode_values if section == "ode" else values)[leaf] = value
    if ode_values:
        values["ode"] = dataclasses.replace(cfg.ode, **ode_values)
    return dataclasses.replace(cfg, **values)


@_named_fields_only
@dataclass
class TrainConfig:
    """One training run: model, data, optimisation, evaluation, checkpoints and logging.

    The optimiser is AdamW (weight decay on matrices only) with linear warmup for
    ``warmup_steps`` and cosine decay to ``lr * min_lr_ratio`` at ``max_steps``.
    Evaluation uses ``eval_batches`` fixed validation batches drawn with ``eval_seed``, the
    same for every run seed so that runs can be compared pairwise; with
    ``eval_on="whole_split"`` every validation evaluation and the final test loss score each
    token of the split once instead (consecutive windows of ``seq_len``; ``eval_batches`` is
    then unused). ``eval_on="whole_split_at_end"`` evaluates on the fixed batches during
    training (the validation curve) and scores the whole validation and test splits once, at
    the end (``final["val_loss"]``, ``final["test_loss"]``): for a corpus such as WikiText-2,
    whose 1.1M-character validation split would cost more than training if scored at every
    evaluation. ``score_test=False`` leaves the test split unscored (no ``final["test_loss"]``):
    for a learning-rate selection run, which is chosen on validation and never reported on test,
    and on WikiText-2 would spend as long scoring the 1.3M-character test split as training 500
    steps.

    ``dtype="bfloat16"`` trains under bf16 autocast: on CUDA, and on CPUs that compute bf16
    natively (AMX or AVX512-BF16; elsewhere ``nl.train`` refuses, see
    ``training.device.check_dtype_supported``). On CUDA, float32 matmuls use TF32 tensor cores.
    ``compile=True`` trains through ``torch.compile(model)`` (evaluation, checkpoints and
    decoding use the eager module, which shares its weights); its losses differ from eager ones
    in the last bits (with dropout, its masks differ too: inductor draws them with its own
    generator), so it is part of the config hash.

    ``init_from`` (a config hash) starts the run from the final model of that run instead of a
    random initialisation: fine-tuning, e.g. at another number of solver steps
    (``ablations.depth_transfer``). The parent's checkpoint is looked up beside the run's own,
    ``<out_dir>/../<init_from>/checkpoint.pt`` (``store.run`` keeps every run of a store
    there); its model may differ from ``model`` only in depth (``n_layers``, ``ode``). With
    ``lora_rank`` > 0 only low-rank adapters of that rank train (``nn.lora``, alpha = rank), the
    parent's weights frozen: LoRA fine-tuning, e.g. to a new depth; the run's model files hold the
    adapted weights, merged when loaded (``nn.lora.merged_state_dict``).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: str = "tinyshakespeare"
    tokenizer: str = "char"
    data_dir: Union[str, None] = None
    batch_size: int = 12
    seq_len: int = 64
    max_steps: int = 2000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_batches: int = 20
    eval_seed: int = 1234
    eval_on: str = "batches"
    score_test: bool = True
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    compile: bool = False
    out_dir: Union[str, None] = None
    checkpoint_interval: int = 0
    resume: bool = False
    log_dir: Union[str, None] = None
    progress: bool = True
    init_from: Union[str, None] = None
    lora_rank: int = 0

    def __post_init__(self) -> None:
        _check_types(self)
        check_choice("dataset", self.dataset, CORPORA)
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("device", self.device, DEVICES)
        check_choice("eval_on", self.eval_on, EVAL_ON)
        for key in ("batch_size", "seq_len", "max_steps", "lr", "eval_interval", "eval_batches"):
            _check_positive(key, getattr(self, key))
        for key in ("warmup_steps", "weight_decay", "grad_clip", "checkpoint_interval"):
            _check_positive(key, getattr(self, key), allow_zero=True)
        for key in ("seed", "eval_seed"):
            _check_positive(key, getattr(self, key), allow_zero=True)
            _check_at_most(key, getattr(self, key), MAX_SEED, "2**64 - 1: torch's generators take 64-bit seeds")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio!r} is not valid; it must be in [0, 1]")
        for key in ("beta1", "beta2"):  # AdamW's averages: a beta of 1 would never move
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{key}={getattr(self, key)!r} is not valid; it must be in [0, 1)")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"seq_len={self.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}"
            )
        if self.compile and self.model.ode.regularised:
            raise ValueError("compile=True with the flow regularisers (model.ode.kinetic_weight, jacobian_weight) "
                             "is not supported: the penalty is gathered as a side effect of the solve; set compile=False")
        _check_positive("lora_rank", self.lora_rank, allow_zero=True)
        if self.lora_rank and self.init_from is None:
            raise ValueError(f"lora_rank={self.lora_rank} adapts a trained model with low-rank adapters: give the run "
                             "to adapt as init_from (its config hash)")
        if (self.resume or self.checkpoint_interval) and not self.out_dir:
            raise ValueError("resume/checkpoint_interval need out_dir (where checkpoints live)")

    def config_hash(self) -> str:
        """Short sha256 over the fields that change the numbers a run produces."""
        return config_hash(self)


# Fields that say where or how visibly a run happens, not what it computes.
NON_SEMANTIC_KEYS = frozenset({"out_dir", "checkpoint_interval", "resume", "log_dir", "progress", "data_dir"})


# Fields added after runs were stored, with the value those runs had: left out of the hash
# while they hold it, so that every stored record keeps its name. A nested field is named by
# its dotted path from TrainConfig ("model.position").
HASHED_ONLY_IF_CHANGED = {"eval_on": "batches", "compile": False, "init_from": None, "model.position": "learned",
                          "score_test": True, "model.ode.grid_min_steps": 0, "model.ode.grid_max_steps": 0,
                          "model.ode.grid_end_jitter": 0.0, "model.ode.grid_placement": "uniform",
                          "model.ode.kinetic_weight": 0.0, "model.ode.jacobian_weight": 0.0, "lora_rank": 0}


def config_hash(cfg: TrainConfig) -> str:
    d = {k: v for k, v in to_dict(cfg).items() if k not in NON_SEMANTIC_KEYS}
    _drop_defaults(d, HASHED_ONLY_IF_CHANGED)
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _drop_defaults(d: dict, defaults: dict[str, Any]) -> None:
    """Remove from the nested dict ``d``, in place, every (dotted) key of ``defaults`` that holds
    its value there."""
    for key, default in defaults.items():
        *parents, leaf = key.split(".")
        node = d
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == default:
            del node[leaf]


# --------------------------------------------------------------------------- dict / YAML


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` to the field type ``tp`` or raise a ValueError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner)
    if _is_config(tp):
        if isinstance(tp, type) and isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-3" as a string
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ValueError(f"{key}={value!r} is not a valid {getattr(tp, '__name__', tp)}")


def from_dict(cls: type, d: dict, prefix: str = "") -> Any:
    """Build config ``cls`` from a (possibly nested) dict; unknown keys are errors."""
    if not isinstance(d, dict):
        raise ValueError(f"{prefix.rstrip('.') or cls.__name__} must be a mapping of {cls.__name__} fields, got {d!r}")
    hints = dict(_field_types(cls))
    names = list(hints)
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(names)}"
        )
    return cls(**{k: _coerce(prefix + k, v, hints[k]) for k, v in d.items()})


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a mapping setting one key twice (plain YAML keeps the last
    value silently). Configs and notebook profiles are read with it."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
    if twice:
        raise ValueError(f"{node.start_mark.name}: sets {twice} twice")
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(path: str | Path, cls: type = None) -> Any:
    """Load a config from YAML; ``cls`` defaults to TrainConfig. Errors name the file; a key set
    twice is refused."""
    cls = cls or TrainConfig
    if Path(path).is_dir():
        raise ValueError(f"{path} is a folder; a config is a YAML file of {cls.__name__} fields (key: value lines)")
    try:
        with open(path) as f:  # the file, not its text: the loader's errors then name it
            data = yaml.load(f, Loader=UniqueKeyLoader) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of {cls.__name__} fields (key: value lines), "
                         f"not a YAML {type(data).__name__}")
    try:
        return from_dict(cls, data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """Return a copy of ``cfg`` with ``"a.b=value"`` overrides applied (values parsed as YAML)."""
    values = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. model.arch=hybrid")
        key, raw = item.split("=", 1)
        values[key.strip()] = yaml.safe_load(raw)
    return with_values(cfg, values)


def with_values(cfg: Any, values: dict[str, Any]) -> Any:
    """A copy of ``cfg`` with dotted keys set: ``with_values(tc, {"model.arch": "node", "seed": 1})``.

    A value may be a whole config (``{"model": ModelConfig(...)}``); the result is validated
    like any new config, so an invalid combination fails here.
    """
    d = to_dict(cfg)
    for key, value in values.items():
        node = d
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"unknown key {key!r}: {part!r} is not a config section")
            node = node[part]
        if parts[-1] not in node:
            raise ValueError(f"unknown key {key!r}; valid keys here: {', '.join(node)}")
        node[parts[-1]] = to_dict(value) if dataclasses.is_dataclass(value) else value
    return from_dict(type(cfg), d)
