"""Incremental decoding's cache: one slot of state per layer call, in call order.

``DecodeCache`` holds what a forward pass leaves for the next one (attention keys and values,
an SSM's recurrent state, weights that depend on t alone); the model activates it for one pass
(``DecodeCache.step``) and layers find it through ``active_cache()``, a context variable, so
that no layer signature carries it.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import torch


class DecodeCache:
    r"""What incremental decoding keeps between forward passes: one slot per call site.

    A causal model evaluated on a fixed grid makes the same sequence of layer calls in every
    forward pass (blocks in order; for an ODE block, steps x stages of the field in the
    solver's order), and the call at a given place in that sequence computes, at position i,
    a value that depends on positions <= i only. So the k-th call of a pass can keep its
    state (attention keys and values, an SSM's last recurrent state, time-dependent weights
    that depend on t alone) in slot k and the next pass, fed only the new tokens, continues
    from it. ``length`` is the number of positions already processed.

    The model's ``forward(idx, cache=cache)`` activates the cache (``active_cache()``) for the
    duration of the pass and checks that the pass used every slot: a solver whose steps
    depend on the data (adaptive methods) would break the correspondence, and is refused
    before that by ``generate``.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity  # positions the K/V buffers hold (generate's window, max_seq_len by default)
        self.length = 0
        self._slots: list[dict] = []
        self._cursor = 0

    def slot(self) -> dict:
        """The next call site's state (a dict the layer owns)."""
        if self._cursor == len(self._slots):
            if self.length:
                raise RuntimeError("this forward pass made more layer calls than the one that filled the cache; "
                                   "incremental decoding needs a fixed call sequence (a fixed-step solver)")
            self._slots.append({})
        self._cursor += 1
        return self._slots[self._cursor - 1]

    @contextlib.contextmanager
    def step(self, n_new: int):
        """Activate the cache for one forward pass over ``n_new`` new positions."""
        if self.length + n_new > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.length} are used and "
                             f"{n_new} more were given: crop the context and start a new cache")
        self._cursor = 0
        token = _ACTIVE_CACHE.set(self)
        try:
            yield self
        finally:
            _ACTIVE_CACHE.reset(token)
        if self._cursor != len(self._slots):
            raise RuntimeError(f"this forward pass made {self._cursor} layer calls, the cache holds "
                               f"{len(self._slots)}: the call sequence changed between passes")
        self.length += n_new


_ACTIVE_CACHE: contextvars.ContextVar[DecodeCache | None] = contextvars.ContextVar("nodelm_decode_cache", default=None)


def compiling() -> bool:
    """True while ``torch.compile`` traces the code. The context variables here and in
    ``time_grid`` are invisible to it (reading one breaks the graph), and neither a decode cache
    nor a time grid is open in a compiled training step: each field evaluation then forms its
    own weights, which the compiler fuses, and the model compiles to one graph."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)  # torch >= 2.3
    return bool(is_compiling is not None and is_compiling())


def active_cache() -> DecodeCache | None:
    """The cache of the forward pass in progress, or None outside incremental decoding (and
    while compiling: ``compiling``)."""
    return None if compiling() else _ACTIVE_CACHE.get()


def cached_per_call(compute: Callable[[], object]) -> object:
    """``compute()``, or while decoding with a cache, its value from the first pass at this
    call site: for weights that depend on t alone, the same at a call site in every pass."""
    cache = active_cache()
    if cache is None:
        return compute()
    slot = cache.slot()
    if "value" not in slot:
        slot["value"] = compute()
    return slot["value"]

