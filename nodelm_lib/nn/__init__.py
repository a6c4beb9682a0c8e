"""The layers, by job (``from nodelm_lib.nn import Block``):

    decode_cache.py   DecodeCache, active_cache, cached_per_call   (incremental decoding)
    time_grid.py      TimeGrid, GridPoint, time_grid, active_grid, time_dependent
    layers.py         CausalSelfAttention, causal_attention, MLP, Block, mlp_hidden, rotary positions
    time_layers.py    time codes, TimeEmbedding, HyperLinear, TimeLayerNorm, TimeModulation,
                      ModulatedLinear, StaticLinear, TimeAttention, TimeMLP
    losses.py         linear_cross_entropy (chunked cross-entropy of the tied head)
    lora.py           add_lora, merge_lora, lora_parameters, count_lora_parameters (low-rank fine-tuning)

Library code imports from those modules (patch a name there, not here).
"""

from .decode_cache import DecodeCache, active_cache, cached_per_call
from .layers import MLP, Block, CausalSelfAttention, causal_attention, mlp_hidden
from .lora import add_lora, count_lora_parameters, lora_parameters, merge_lora
from .losses import CHUNK_LOGITS, linear_cross_entropy
from .time_grid import GridPoint, TimeGrid, active_grid, time_dependent, time_grid
from .time_layers import (HyperLinear, ModulatedLinear, StaticLinear, TimeAttention, TimeEmbedding, TimeLayerNorm, TimeMLP, TimeModulation, sinusoidal_features, time_code, time_codes)

__all__ = [
    "DecodeCache", "active_cache", "cached_per_call",
    "TimeGrid", "GridPoint", "active_grid", "time_grid", "time_dependent",
    "CausalSelfAttention", "causal_attention", "MLP", "Block", "mlp_hidden",
    "sinusoidal_features", "time_code", "time_codes", "TimeEmbedding", "HyperLinear", "TimeLayerNorm",
    "TimeModulation", "ModulatedLinear", "StaticLinear", "TimeAttention", "TimeMLP",
    "CHUNK_LOGITS", "linear_cross_entropy",
    "add_lora", "merge_lora", "lora_parameters", "count_lora_parameters",
]
