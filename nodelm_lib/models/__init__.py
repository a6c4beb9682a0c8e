"""Model families, one file each; ``build_model(cfg)`` picks one by ``cfg.arch``.

Each family's file declares it (``nodelm_lib.families.Family``) and registers its class with
``register_family``; ``docs/guides/adding-a-family.md`` shows how.

``count_params(cfg)`` counts a config's parameters without allocating them, and
``match_params(cfg, target)`` resizes a config to a target non-embedding count so that two
architectures can be compared at equal size.
"""

from __future__ import annotations

import dataclasses

import torch

from nodelm_lib import families
from nodelm_lib.config import ModelConfig
from .common import CausalLM, ContinuousDepthLM, ODEBlock, TimeDependentField, continuous_block
from .registry import model_class, register_family, unregister_family
# The built-in families, each registered by its own file; the order of these imports is the
# order config.ARCHS lists them in (a new family's file goes at the end).
from .gpt import GPT
from .hybrid import HybridODETransformer
from .node import NeuralODETransformer, param_count_formula
from .time_indexed import TimeIndexedMLP, TimeIndexedSSM
from .discrete_ssm import SSMTransformer
from .looped import LoopedGPT

MATCH_BY = ("d_model", "mlp_ratio")


def build_model(cfg: ModelConfig) -> CausalLM:
    """Build the model that ``cfg.arch`` names (randomly initialised, on the CPU)."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"build_model takes a ModelConfig (nl.ModelConfig(arch=..., ...)), got "
                         f"{type(cfg).__name__}" + (": build one with nl.config.from_dict(nl.ModelConfig, d)"
                                                    if isinstance(cfg, dict) else ""))
    return model_class(cfg.arch)(cfg)


def count_params(cfg: ModelConfig) -> dict[str, int]:
    """``{"total": ..., "non_embedding": ...}`` for ``cfg``, built on the meta device (no
    memory, no initialisation cost), so large presets can be counted on a laptop."""
    if cfg.vocab_size is None:
        cfg = dataclasses.replace(cfg, vocab_size=1)  # the embeddings are not what is asked for
    with torch.device("meta"):
        model = build_model(cfg)
    return {"total": model.num_params(), "non_embedding": model.num_params(non_embedding=True)}


def match_params(cfg: ModelConfig, target_params: int, by: str = "d_model") -> ModelConfig:
    """A copy of ``cfg`` resized so that its non-embedding parameter count is as close as
    possible to ``target_params``.

    ``by="d_model"`` searches widths that are multiples of ``n_heads`` (of ``2 n_heads`` with
    ``position="rope"``, whose heads need an even width); ``by="mlp_ratio"``
    searches the MLP's hidden size (any integer, so the ratio may be fractional) and keeps
    the width. The count grows monotonically in both, so a bisection over the integers
    finds the closest. Use ``count_params`` on the result to report what was reached.
    """
    if by not in MATCH_BY:
        raise ValueError(f"by={by!r} is not valid; choose one of {', '.join(map(repr, MATCH_BY))}")
    if by == "mlp_ratio" and not families.get(cfg.arch).has_mlp:
        raise ValueError(f"{cfg.arch} has no MLP (another mixer replaces it): match it with by='d_model'")
    if target_params <= 0:
        raise ValueError(f"target_params={target_params!r} is not valid; it must be > 0")

    head_step = 2 if cfg.position == "rope" else 1  # rope rotates pairs of each head's dimensions

    def resized(k: int) -> ModelConfig:
        if by == "d_model":
            return dataclasses.replace(cfg, d_model=k * head_step * cfg.n_heads)
        return dataclasses.replace(cfg, mlp_ratio=k / cfg.d_model)

    def count(k: int) -> int:
        return count_params(resized(k))["non_embedding"]

    lo, hi = 1, 2
    while count(hi) < target_params:  # grow until the target is bracketed
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # count(lo) < target <= count(hi), or lo = 1
        mid = (lo + hi) // 2
        if count(mid) < target_params:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda k: abs(count(k) - target_params))
    return resized(best)


__all__ = ["build_model", "count_params", "match_params", "param_count_formula", "register_family",
           "unregister_family", "model_class", "CausalLM", "ContinuousDepthLM", "TimeDependentField", "ODEBlock",
           "continuous_block", "GPT", "HybridODETransformer", "NeuralODETransformer", "TimeIndexedMLP",
           "TimeIndexedSSM", "SSMTransformer", "LoopedGPT"]
