"""The families' model classes, by name: ``register_family`` adds one, ``build_model`` builds one.

Each family's file in ``models/`` ends with ``register_family(FAMILY, ModelClass)``; the
declaration (``nodelm_lib.families.Family``) goes to the torch-free registry the config reads,
the class here.
"""

from __future__ import annotations

import dataclasses

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from nodelm_lib.families import Family

from .common import CausalLM, ContinuousDepthLM

_CLASSES: dict[str, type[CausalLM]] = {}


def register_family(family: Family, cls: type[CausalLM]) -> type[CausalLM]:
    """Make ``family`` a valid ``ModelConfig.arch``, built by ``cls(cfg)``; returns ``cls``.

    Checks the declaration against the class and the config, so that a family that says it is
    continuous is a ``ContinuousDepthLM`` (and the reverse), and its options are ``ModelConfig``
    fields with the defaults it declares.
    """
    if not (isinstance(cls, type) and issubclass(cls, CausalLM)):
        raise TypeError(f"family {family.name!r}: its model class must subclass models.CausalLM, got {cls!r}")
    if family.continuous != issubclass(cls, ContinuousDepthLM):
        raise TypeError(f"family {family.name!r} declares continuous={family.continuous}, but {cls.__name__} "
                        f"{'is not' if family.continuous else 'is'} a ContinuousDepthLM")
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for option in family.options:
        if option.name not in defaults or defaults[option.name] != option.default:
            raise ValueError(f"family {family.name!r}: option {option.name}={option.default!r} must be a "
                             f"ModelConfig field with that default (add the field to config.py first)")
    families.register(family)
    _CLASSES[family.name] = cls
    return cls


def unregister_family(name: str) -> None:
    """Remove family ``name`` (a test's family, at teardown)."""
    families.unregister(name)
    _CLASSES.pop(name, None)


def model_class(arch: str) -> type[CausalLM]:
    """The class that builds family ``arch``; a ValueError listing the families otherwise."""
    families.get(arch)
    return _CLASSES[arch]
