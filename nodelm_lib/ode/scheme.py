"""The fixed-step scheme, declared: what ``Solver.march`` steps and the gradient methods rely on.

A scheme is a one-step method with a state of its own, as in torchdiffeq a tableau plus a small
step function: ``init`` the state from x0, ``step`` it over (t_m, dt_m), read x back with
``value``. Runge-Kutta's state is x itself (``solvers.RungeKutta``), reversible Heun's is
(y, z, f(t, z)) (``reversible.ReversibleHeun``). ``Solver.march``, ``Solver.trajectory`` and the
gradient methods use only what is declared here, so a new scheme needs nothing else of them.

Every method is called inside the fixed-step loop, which compiles to one graph under
``torch.compile``: plain tensor operations, no host synchronisation (``.item()``) and no side
effects such as counting (``nfe`` counts instead).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from torch import Tensor

Field = Callable[[Tensor, Tensor], Tensor]
State = Any  # whatever the scheme carries from step to step: x itself, or a tuple of tensors


class Scheme(ABC):
    """A fixed-step method; ``name`` selects it (``Solver(method=name)``, ``solvers.SCHEMES``)."""

    name: str

    @abstractmethod
    def nfe(self, n_steps: int) -> int:
        """Field evaluations of ``init`` and ``n_steps`` steps (``Solver.march`` adds them to the counters)."""

    @abstractmethod
    def init(self, field: Field, t0: Tensor, x0: Tensor) -> State:
        """The state at the start ``(t0, x0)``, from which the first step starts."""

    @abstractmethod
    def step(self, field: Field, t0: Tensor, dt: Tensor, state: State, f0: Tensor | None = None) -> State:
        """The state after one step of size ``dt`` (a 0-d tensor, negative backwards) from time ``t0``.

        ``f0 = field(t0, value(state))``, when the caller already has it (``Solver.trajectory``),
        may stand in for that evaluation; a scheme that evaluates the field elsewhere ignores it.
        """

    @abstractmethod
    def value(self, state: State) -> Tensor:
        """x, the solution, read from a state."""


class ReversibleScheme(Scheme):
    """A scheme whose step can be inverted algebraically, so that ``Reversible`` (``gradients.py``)
    rebuilds the trajectory in backward instead of storing it. Its state is a tuple of tensors,
    the first of them x (``Reversible`` saves them and differentiates a step with respect to each)."""

    @abstractmethod
    def unstep(self, field: Field, t0: Tensor, dt: Tensor, state: State) -> State:
        """The state ``s`` that ``step(field, t0, dt, s)`` took to ``state``, exact up to rounding."""
