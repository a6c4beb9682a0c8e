"""Autoregressive decoding for every arch, with a KV cache for discrete and ODE blocks alike.

For a causal model integrated on a fixed grid, every solver stage at position i depends
only on positions <= i, so the keys and values of each (step, stage) evaluation of the field
can be cached exactly like those of a discrete layer; so can ti_ssm's recurrent state and
the time-dependent weights of node / ti_* (they depend on t alone).
``decode_cache.DecodeCache`` holds one slot per call site; a new token then costs one pass over
one position. For a model that says how it freezes (``fast_decode.supports``: the library's
own do) that pass runs through ``fast_decode.FastDecoder`` (each call site's weights frozen on the
first pass, plain functions after); for any other through its modules (``model(idx, cache=cache)``).

The context is a window of the last ``window`` tokens (default ``max_seq_len``): when the
sequence outgrows it, the context is cropped to the last ``window`` tokens and the cache is
rebuilt from them, at positions 0 .. window - 1: every later token costs a full pass over the
window, exactly as without a cache, and the tokens are the same either way. With learned
positions the window cannot exceed ``max_seq_len`` (the table ends there). With rope it may
(``generate(..., window=4 * max_seq_len)``): nothing is indexed by position, though a model
trained on ``max_seq_len`` tokens is not promised to use a longer context well, so the default
stays the context it was trained at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from typing import Callable

import torch

from nodelm_lib.models.common import CausalLM, ODEBlock, check_token_ids
from nodelm_lib.nn.decode_cache import DecodeCache
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS

from . import fast_decode


def cache_unsupported_reason(model: CausalLM) -> str | None:
    """Why ``model`` cannot decode with a cache (an ODE block on an adaptive method), or None."""
    for name, module in model.named_modules():
        ode = getattr(module, "ode", None)
        if ode is not None and getattr(ode, "method", None) not in FIXED_STEP_METHODS:
            return (f"{name} is solved with the adaptive method {ode.method!r}, whose steps depend on the input: "
                    f"cached states of earlier passes would sit on another grid. Use use_cache=False, or a "
                    f"fixed-step method (model.set_ode(method='rk4', n_steps=...); one of "
                    f"{', '.join(FIXED_STEP_METHODS)})")
    return None


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from ``logits`` (B, V): greedy at ``temperature=0``, else softmax of
    logits / temperature restricted to the ``top_k`` largest and/or the smallest set whose
    probability reaches ``top_p`` (nucleus; the most likely token is always kept)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens before it already reach top_p
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def decoding_window(model: CausalLM, window: int | None) -> int:
    """The number of tokens ``generate`` keeps as context: ``window``, by default ``max_seq_len``;
    a ValueError if it is not a positive integer, or if it exceeds what learned positions allow."""
    if window is None:
        return model.cfg.max_seq_len
    if not _is_int(window) or window < 1:
        raise ValueError(f"window={window!r} is not valid; it must be an integer >= 1 (or None: max_seq_len)")
    limit = model.context_limit
    if limit is not None and window > limit:
        raise ValueError(f"window={window} exceeds max_seq_len={limit}: a model with model.position='learned' "
                         f"has no position embedding past it (a model with position='rope' has no such limit)")
    return window


def _check_args(model, idx, max_new_tokens, temperature, top_k, top_p) -> None:
    if not isinstance(model, CausalLM):
        raise TypeError(f"model must be a nodelm CausalLM (from nl.build_model), got {type(model).__name__}")
    if not isinstance(idx, torch.Tensor) or idx.ndim != 2 or idx.dtype != torch.long or idx.shape[1] == 0:
        what = f"shape {tuple(idx.shape)} {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"idx must be a non-empty (B, T) int64 tensor, got {what}")
    check_token_ids(idx, model.cfg.vocab_size)
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not valid; it must be an integer >= 0")
    if not _is_real(temperature) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature={temperature!r} is not valid; it must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} is not valid; it must be an integer >= 1 (or None)")
    if top_p is not None and (not _is_real(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p={top_p!r} is not valid; it must be in (0, 1] (or None)")


@torch.inference_mode()  # lighter than no_grad: no version counters on the many small decode tensors
def generate(model: CausalLM, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None, return_logits: bool = False,
             on_token: Callable[[torch.Tensor], None] | None = None, window: int | None = None,
             ode: dict | None = None, **model_kwargs):
    """Extend ``idx`` (B, T) by ``max_new_tokens`` tokens; returns (B, T + max_new_tokens).

    ``temperature=0`` is greedy decoding; ``top_k`` / ``top_p`` restrict sampling;
    ``generator`` makes sampling reproducible. ``use_cache=False`` recomputes the whole
    window for every token (the reference the cache is tested against). ``return_logits``
    also returns the logits each new token was drawn from, (B, max_new_tokens, V).
    ``on_token``, if given, is called with each new (B, 1) token as soon as it is drawn: for
    streaming output, or timing every token (``bench/decode.py``).
    ``window``: how many of the last tokens each new one sees (default ``max_seq_len``; longer
    only with ``position="rope"``; module docstring).
    ``ode``: how the model's ODE blocks are solved for this call (``CausalLM.set_ode``'s changes,
    restored afterwards): depth as a decoding setting, e.g. ``{"n_steps": 2}`` to decode cheaply or
    ``{"method": "dopri5", "rtol": 1e-4}`` (adaptive: with ``use_cache=False``).
    ``model_kwargs`` go to every forward (e.g. the hybrid's ``control``). The model is put in
    eval mode for the call and restored afterwards.
    """
    _check_args(model, idx, max_new_tokens, temperature, top_k, top_p)
    with solved_as(model, ode):
        return _generate(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator, return_logits,
                         on_token, window, model_kwargs)


@contextlib.contextmanager
def solved_as(model: CausalLM, ode: dict | None):
    """``model`` with its ODE blocks solved with the changes ``ode`` (none: as they are), restored after."""
    if not ode:
        yield model
        return
    if not isinstance(ode, dict):
        raise ValueError(f"ode={ode!r} is not valid; it must be a dict of ODEConfig changes, e.g. {{'n_steps': 2}}")
    blocks = [m for m in model.modules() if isinstance(m, ODEBlock)]
    if not blocks:
        model.set_ode(**ode)  # refuses with the reason: no ODE block to solve otherwise
    before = [block.ode for block in blocks]
    # training-only options (random grids, regularisers) do not apply here; a bad value is refused
    # before any block changes
    changed = [dataclasses.replace(block.ode.for_inference(), **ode) for block in blocks]
    for block, config in zip(blocks, changed):
        block.ode = config
    try:
        yield model
    finally:
        for block, config in zip(blocks, before):
            block.ode = config


def _generate(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator, return_logits, on_token,
              window, model_kwargs):
    if use_cache and (reason := cache_unsupported_reason(model)):
        raise ValueError(f"cannot decode with a cache: {reason}")
    window = decoding_window(model, window)
    was_training = model.training
    model.eval()
    fast = use_cache and fast_decode.supports(model, model_kwargs)
    out, cache, steps_logits = idx, None, []
    try:
        for _ in range(max_new_tokens):
            if not use_cache:
                last = model(out[:, -window:], **model_kwargs)[0][:, -1]
            elif fast:  # frozen weights, plain functions (fast_decode)
                if cache is None or cache.length == window:  # first pass, or the window is full: rebuild
                    cache = fast_decode.FastDecoder(model, window, **model_kwargs)
                    last = cache(out[:, -window:])
                else:
                    last = cache(out[:, -1:])
            elif cache is None or cache.length == window:
                cache = DecodeCache(window)
                last = model(out[:, -window:], cache=cache, **model_kwargs)[0][:, -1]
            else:
                last = model(out[:, -1:], cache=cache, **model_kwargs)[0][:, -1]
            steps_logits.append(last)
            token = sample_next(last, temperature, top_k, top_p, generator)
            out = torch.cat([out, token], dim=1)
            if on_token is not None:
                on_token(token)
    finally:
        model.train(was_training)
    if return_logits:
        empty = idx.new_zeros(idx.shape[0], 0, model.cfg.vocab_size, dtype=torch.float32)
        return out, torch.stack(steps_logits, dim=1) if steps_logits else empty
    return out
