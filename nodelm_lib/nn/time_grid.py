"""Weights on a time grid: every weight that depends on t alone, generated for all the times
of a fixed-step solve at once (``TimeGrid``, opened by ``time_grid`` for one solve; at inference
kept for the next solves by ``KeptGrid``), and ``time_dependent``, through which a
time-dependent layer gets its weights at one time.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import torch
import torch.nn as nn

from .decode_cache import cached_per_call, compiling
from .losses import autocast_dtype


class TimeGrid:
    r"""The times at which a fixed-step solve will evaluate its field, so that every weight that
    depends on t alone is generated for all of them at once: one batched call per layer per
    forward pass instead of one per field evaluation.

    Why: ``node``'s hypernetwork forms W(t) = B + sum_k e_k(t) A_k from E full-size basis
    matrices. Per evaluation that reads all E of them forward and writes (and accumulates) a
    full-size gradient for each backward; for S evaluations at once it is one (S x E) by
    (E x in*out) product each way. The time-indexed gates batch the same way, with S times
    fewer small kernels. Opened by ``ODEBlock`` for one solve (``time_grid``); a layer's
    batched weights are memoised on the grid, so they live as long as that pass's graph.
    """

    def __init__(self, times: torch.Tensor):
        self.times = times  # (S,)
        self._memo: dict[tuple, object] = {}
        self._positions: dict[float, int] = {}  # t -> its grid index, where reading t is free (``point``)

    def memo(self, owner: object, compute: Callable[[], object], *tag) -> object:
        """``compute()`` once per grid for ``owner`` (a layer) and ``tag``, then the stored value."""
        key = (id(owner), *tag)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def point(self, t: torch.Tensor, owner: object, inputs_at: Callable[[torch.Tensor], torch.Tensor]) -> "GridPoint":
        """t as a point of this grid, carrying ``inputs_at(times)`` (owner's batched time code
        or trunk output, (S, ...)). t is found as the nearest grid time on its device, without
        a host synchronisation. On a CPU without autograd, where reading t costs nothing, each time
        is looked up once per grid and the point carries its index as a Python int."""
        inputs = self.memo(owner, lambda: inputs_at(self.times))
        if not _free_to_read(self.times):
            return GridPoint(self, self._nearest(t), inputs)
        key = float(t)
        position = self._positions.get(key)
        if position is None:
            position = self._positions[key] = int(self._nearest(t))
        return GridPoint(self, None, inputs, position)

    def _nearest(self, t: torch.Tensor) -> torch.Tensor:
        return (self.times - t.to(self.times)).abs().argmin().reshape(1)


class GridPoint:
    """A field evaluation's time on a ``TimeGrid``: what time-dependent layers receive in place
    of the time code (node) or the trunk output h(t) (ti_*) while a grid is open."""

    def __init__(self, grid: TimeGrid, index: torch.Tensor | None, inputs: torch.Tensor,
                 position: int | None = None):
        # index: (1,) on the grid's device; position: the same index as a Python int, where it is
        # free to read (a CPU grid without autograd: ``TimeGrid.point``), else None
        self.grid, self.index, self.inputs, self.position = grid, index, inputs, position

    @property
    def value(self) -> torch.Tensor:
        """The input at this time alone (what the layer would get without a grid)."""
        return self._at(self.inputs)

    def once(self, owner: object, name: str, compute: Callable[[], object]) -> object:
        """``compute()``, a value of this time alone (from ``value``), kept per grid time for
        ``owner`` and ``name`` where the time's index is free to read (a CPU grid without
        autograd); elsewhere computed at every call, as without a grid."""
        if self.position is None:
            return compute()
        return self.grid.memo(owner, compute, name, self.position)

    def take(self, layer: nn.Module, weights_at: Callable[[torch.Tensor], tuple]) -> tuple:
        """``layer``'s weights at this time: ``weights_at(inputs)`` for every grid time, computed
        once per grid, indexed at this one (a tuple of (S, ...) tensors or None)."""
        batched = self.grid.memo(layer, lambda: weights_at(self.inputs))
        return tuple(None if w is None else self._at(w) for w in batched)

    def _at(self, batched: torch.Tensor) -> torch.Tensor:
        """``batched[i]`` for this point's grid index i. Where i is a Python int (a CPU grid
        without autograd), a view: the same numbers without copying a weight matrix per
        evaluation. Elsewhere read on the device with the index tensor: turning it into an int
        would be a host synchronisation per weight per field evaluation on a GPU (48 per node
        training step at d 128, 4 steps)."""
        if self.position is not None:
            return batched[self.position]
        return batched.index_select(0, self.index).squeeze(0)


def _free_to_read(times: torch.Tensor) -> bool:
    """Whether a grid's times can be read on the host for nothing: on a CPU, without autograd."""
    return times.device.type == "cpu" and not torch.is_grad_enabled()


class KeptGrid:
    """A ``TimeGrid`` kept from one inference solve to the next, so that the weights of every
    grid time are formed once for many forward passes instead of once per pass.

    At inference the weights at a time t are the same for every token, batch and pass: they
    change only with the parameters. ``grid(times, module)`` returns the grid of the last call
    (with everything memoised on it) while the times, the module's parameters (the same tensors,
    storage and in-place version: an optimizer step, ``load_state_dict`` or ``.to`` changes one)
    and the autocast dtype are those it was made for; otherwise a new grid. Only for passes
    without autograd (``ODEBlock`` asks for it in eval mode under ``no_grad``), whose memoised
    weights carry no graph. One grid is kept: evaluating setting after setting keeps the latest.
    """

    def __init__(self):
        self._key: tuple | None = None
        self._params: tuple = ()  # held, so that the ids in the key cannot be reused by new tensors
        self._grid: TimeGrid | None = None

    def grid(self, times: torch.Tensor, module: nn.Module) -> TimeGrid:
        params = tuple(module.parameters())
        key = (times.dtype, times.device, tuple(times.tolist()), autocast_dtype(times.device),
               tuple((id(p), p.data_ptr(), p._version) for p in params))
        if key != self._key:
            self._key, self._params, self._grid = key, params, TimeGrid(times)
        return self._grid

    def clear(self) -> None:
        """Forget the kept grid (its weights are formed again on the next call)."""
        self._key, self._params, self._grid = None, (), None


_ACTIVE_GRID: contextvars.ContextVar[TimeGrid | None] = contextvars.ContextVar("nodelm_time_grid", default=None)


def active_grid() -> TimeGrid | None:
    """The time grid of the solve in progress, or None (always while compiling: ``compiling``)."""
    return None if compiling() else _ACTIVE_GRID.get()


@contextlib.contextmanager
def time_grid(times: torch.Tensor | TimeGrid):
    """Open a ``TimeGrid`` over ``times`` (or ``times`` itself, a kept grid) for one solve."""
    token = _ACTIVE_GRID.set(times if isinstance(times, TimeGrid) else TimeGrid(times))
    try:
        yield
    finally:
        _ACTIVE_GRID.reset(token)


def time_dependent(value, layer: nn.Module, weights_at: Callable[[torch.Tensor], tuple]) -> tuple:
    """``layer``'s weights for ``value``: a ``GridPoint`` (batched over the grid's times) or a
    single time's code / trunk output (batched over one time; cached per call site while
    decoding). ``weights_at`` maps (S, ...) inputs to a tuple of (S, ...) weights."""
    if isinstance(value, GridPoint):
        return value.take(layer, weights_at)
    return cached_per_call(lambda: tuple(None if w is None else w[0] for w in weights_at(value[None])))
