"""Model families, one file each; ``build_model(cfg)`` picks one by ``cfg.arch``."""

from __future__ import annotations

from ..config import ARCHS, ModelConfig
from .common import CausalLM
from .gpt import GPT
from .hybrid import HybridODETransformer

_REGISTRY = {"gpt": GPT, "hybrid": HybridODETransformer}
assert set(_REGISTRY) == set(ARCHS), "config.ARCHS and the model registry disagree"


def build_model(cfg: ModelConfig) -> CausalLM:
    """Build the model that ``cfg.arch`` names (randomly initialised, on the CPU)."""
    if cfg.arch not in _REGISTRY:
        raise ValueError(f"model.arch={cfg.arch!r} is not valid; choose one of {', '.join(map(repr, _REGISTRY))}")
    return _REGISTRY[cfg.arch](cfg)


__all__ = ["build_model", "CausalLM", "GPT", "HybridODETransformer"]
