"""Model families, declared: what the rest of the library may know about a family.

A family is declared once, by a ``Family`` value next to its model class in ``models/<file>.py``,
and registered with ``nodelm_lib.models.register_family(FAMILY, ModelClass)``. The declaration
holds the family's name, whether it is continuous, its depth rule, its options and checks, and
its capabilities. The config's checks (``ModelConfig``, ``for_arch``), the registry
(``build_model``), ``match_params``, the analyses and the experiments read it here instead of
branching on a family's name.

This module imports nothing but the standard library (no torch): the config, below the models,
looks families up at validation time. ``docs/guides/adding-a-family.md`` walks through adding one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# The discrete reference every comparison and timing is measured against (nanoGPT's model).
BASELINE = "gpt"


@dataclass(frozen=True)
class Option:
    """A ``ModelConfig`` field that only some families read.

    ``default`` is the field's default in ``ModelConfig`` (registration checks that they agree).
    ``check(value)`` says why a value is invalid (``None``: it is valid); every config is checked
    against every registered family's options, since the fields are there whatever the arch.
    An ``exclusive`` option is refused at any other value by the families that do not declare it,
    and ``for_arch`` sets it back to ``default`` when it moves a config to such a family: a
    setting that would be silently ignored there would make two different runs look different.
    ``why`` is the refusal's message after ``model.``, with ``{name}``, ``{value}``, ``{archs}``
    (the families that have the option) and ``{arch}`` filled in.
    """

    name: str
    default: Any
    check: Callable[[Any], str | None] | None = None
    exclusive: bool = False
    why: str = "{name}={value!r} applies to archs {archs} only, not model.arch={arch!r}"

    def validate(self, value: Any) -> None:
        reason = self.check(value) if self.check is not None else None
        if reason:
            raise ValueError(f"model.{self.name}={value!r} is not valid; {reason}")

    def refusal(self, value: Any, arch: str, archs: tuple[str, ...]) -> str:
        return "model." + self.why.format(name=self.name, value=value, arch=arch, archs=", ".join(archs))


@dataclass(frozen=True)
class Family:
    """One model family: the value ``ModelConfig.arch`` takes, and what the library reads about it.

    - ``continuous``: the whole body is one time-dependent block integrated over t in [0, 1]
      (a ``ContinuousDepthLM``); its depth is the number of solver steps, so with a fixed-step
      method ``n_layers`` must equal ``ode.n_steps``.
    - ``depth``: the depth rule, ``n_layers -> {dotted ModelConfig key: value}``, the other
      settings that depth ``n`` implies (``for_arch`` applies them; continuous families use
      ``solver_steps``). ``None``: ``n_layers`` alone.
    - ``options``: the family-specific ``ModelConfig`` fields it reads (``Option``).
    - ``check``: ``check(cfg)`` raises a ValueError for a config this family cannot build
      (beyond the checks every config gets); ``None``: nothing more to check.
    - capabilities: ``has_mlp`` (an MLP whose width ``match_params(by="mlp_ratio")`` can set),
      ``time_dependent_weights`` (the field's weights are functions of t: its field implements
      ``models.common.TimeDependentField.weights_at``, which the spectral analysis reads),
      ``forward_mode`` (``torch.func.jvp`` runs through it; a custom autograd.Function without
      ``setup_context`` does not).
    - ``summary``: one line for listings and error messages.
    """

    name: str
    continuous: bool = False
    depth: Callable[[int], dict[str, Any]] | None = None
    options: tuple[Option, ...] = ()
    check: Callable[[Any], None] | None = None
    has_mlp: bool = True
    time_dependent_weights: bool = False
    forward_mode: bool = True
    summary: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a family's name must be an identifier (it is a config value and a file name), "
                             f"got {self.name!r}")

    def has_option(self, name: str) -> bool:
        return any(option.name == name for option in self.options)

    def depth_values(self, n_layers: int) -> dict[str, Any]:
        """The settings depth ``n_layers`` implies for this family (``depth``), as dotted keys."""
        return dict(self.depth(n_layers)) if self.depth else {}


def solver_steps(n_layers: int) -> dict[str, Any]:
    """The depth rule of a continuous family: as many solver steps as layers."""
    return {"ode.n_steps": n_layers}


# What an option's ``check`` says about a value: the reason it is invalid, or None.
def positive(value: Any) -> str | None:
    return None if value > 0 else "it must be > 0"


def non_negative(value: Any) -> str | None:
    return None if value >= 0 else "it must be >= 0"


def even_at_least_2(value: Any) -> str | None:  # sin and cos of each frequency
    return None if value >= 2 and value % 2 == 0 else "it must be an even number >= 2"


def one_of(*choices: Any) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else f"choose one of {', '.join(map(repr, choices))}"


# Options several families share: declared once so that their defaults, checks and refusals agree.
PARALLEL = Option("parallel", False, exclusive=True,
                  why="{name} applies to the discrete blocks of {archs}; model.arch={arch!r} always uses the parallel form")
# modulation="constant": every weight sees t = 0 (is depth dependence needed?); integration=
# "residual": x + f instead of x + dt f (is the dt factor needed?)
MODULATION = Option("modulation", "time", one_of("time", "constant"), exclusive=True)
INTEGRATION = Option("integration", "ode", one_of("ode", "residual"), exclusive=True)
TIME_FEATURES = Option("time_features", 32, even_at_least_2)
TIME_HIDDEN = Option("time_hidden", 64, positive)
SSM_STATE_SIZE = Option("ssm_state_size", 16, positive)


# --------------------------------------------------------------------------- the registry

_FAMILIES: dict[str, Family] = {}  # in registration order: the order config.ARCHS lists them


def register(family: Family) -> Family:
    """Add ``family`` to the families the config accepts (``models.register_family`` calls this
    with the model class beside it). A name is registered once."""
    if family.name in _FAMILIES:
        raise ValueError(f"a family named {family.name!r} is already registered")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove the family ``name`` (a test's family, at teardown)."""
    _FAMILIES.pop(name, None)


def names(continuous: bool | None = None) -> tuple[str, ...]:
    """The registered families' names, in registration order; only the continuous (or only the
    discrete) ones with ``continuous=True`` (``False``)."""
    return tuple(name for name, f in _FAMILIES.items() if continuous is None or f.continuous == continuous)


def get(name: str) -> Family:
    """The declaration of family ``name``; a ValueError listing the valid names otherwise."""
    if name not in _FAMILIES:
        raise ValueError(f"model.arch={name!r} is not valid; choose one of {', '.join(map(repr, _FAMILIES))}")
    return _FAMILIES[name]


def all_families() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def all_options() -> dict[str, Option]:
    """Every registered family's options, by field name (a shared option once)."""
    return {o.name: o for f in _FAMILIES.values() for o in f.options}


def exclusive_options() -> dict[str, Option]:
    """Every registered family's exclusive options, by field name."""
    return {o.name: o for f in _FAMILIES.values() for o in f.options if o.exclusive}


def with_option(name: str) -> tuple[str, ...]:
    """The names of the families that declare option ``name``."""
    return tuple(f.name for f in _FAMILIES.values() if f.has_option(name))
