"""Solvers: a method and its step options. They know how to step, not how gradients flow.

Fixed-step methods (euler, midpoint, heun, rk4, rk38 from Butcher tableaus, and
reversible_heun) take ``steps_per_interval`` equal steps per interval of the output times
``t`` (``grid.step_times``). Each is a *scheme* (``scheme.Scheme``), as in torchdiffeq a tableau
plus a small step function: ``init`` the state from x0, ``step`` it over (t_m, dt_m), read x back
with ``value``. The loop (``Solver.march``) is plain Python over tensors: no grid construction,
no host synchronisation (``.item()``), so it compiles to one graph under ``torch.compile``.

Adaptive methods (dopri5, bosh3, adaptive_heun, fehlberg2) choose their own steps to meet
``rtol``/``atol`` and give the output times by dense output (``adaptive.py``).

How gradients flow through a solve is the business of a gradient method (``gradients.py``,
``adjoint.py``), which builds on what a ``Solver`` offers: ``integrate`` (the solution at
``t``), ``trajectory`` (plus every step point with the field there), and for fixed-step methods
``march`` (the loop, with the step function to apply) and ``step_times`` (its grid).
"""

from __future__ import annotations

import math
import numbers

from dataclasses import dataclass, replace
from typing import Callable

import torch

from .adaptive import solve_adaptive
from .counters import SolverCounters
from .grid import step_times
from .reversible import ReversibleHeun
from .runge_kutta import rk_step
from .scheme import Scheme
from .tableaus import ADAPTIVE_TABLEAUS, TABLEAUS, ButcherTableau

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Point = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (t_j, x_j, field(t_j, x_j))


class RungeKutta(Scheme):
    """An explicit Runge-Kutta tableau as a fixed-step scheme; the state is x itself."""

    def __init__(self, tableau: ButcherTableau):
        self.tableau = tableau
        self.name = tableau.name

    def nfe(self, n_steps: int) -> int:
        return n_steps * self.tableau.n_stages

    @staticmethod
    def init(field: Field, t0: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        return x0

    def step(self, field: Field, t0: torch.Tensor, dt: torch.Tensor, x: torch.Tensor,
             f0: torch.Tensor | None = None) -> torch.Tensor:
        """One step; ``f0 = field(t0, x)``, if the caller has it, is the first stage."""
        return rk_step(field, self.tableau, t0, dt, x, f0)

    @staticmethod
    def value(x: torch.Tensor) -> torch.Tensor:
        return x


SCHEMES: dict[str, Scheme] = {**{name: RungeKutta(tab) for name, tab in TABLEAUS.items()},
                               ReversibleHeun.name: ReversibleHeun()}
FIXED_STEP_METHODS = tuple(SCHEMES)
ADAPTIVE_METHODS = tuple(ADAPTIVE_TABLEAUS)
METHODS = FIXED_STEP_METHODS + ADAPTIVE_METHODS


@dataclass(frozen=True)
class Solver:
    """A method and its step options. ``rtol``, ``atol`` and ``max_num_steps`` apply to adaptive
    methods, ``steps_per_interval`` to fixed-step ones."""

    method: str = "rk4"
    steps_per_interval: int = 1
    rtol: float = 1e-3
    atol: float = 1e-4
    max_num_steps: int = 1000

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not valid; choose one of {', '.join(map(repr, METHODS))}")
        if not (isinstance(self.steps_per_interval, int) and self.steps_per_interval >= 1):
            raise ValueError(f"steps_per_interval must be a positive integer, got {self.steps_per_interval!r}")
        for key in ("rtol", "atol"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
                raise ValueError(f"{key}={value!r} is not valid; it must be a finite number > 0")
        if isinstance(self.max_num_steps, bool) or not isinstance(self.max_num_steps, numbers.Integral) \
                or self.max_num_steps < 1:
            raise ValueError(f"max_num_steps={self.max_num_steps!r} is not valid; it must be an integer >= 1")

    @property
    def fixed_step(self) -> bool:
        return self.method in FIXED_STEP_METHODS

    @property
    def scheme(self) -> Scheme:
        """The fixed-step scheme (``init``, ``step``, ``value``, ``nfe``; ``unstep`` if reversible)."""
        self._require_fixed_step()
        return SCHEMES[self.method]

    def _require_fixed_step(self) -> None:
        if not self.fixed_step:
            raise ValueError(f"method={self.method!r} is adaptive: its steps depend on the solution; "
                             f"use a fixed-step method ({', '.join(FIXED_STEP_METHODS)})")

    def with_steps(self, steps_per_interval: int) -> "Solver":
        return replace(self, steps_per_interval=steps_per_interval)

    def step_times(self, t: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(t_m, dt_m)`` of every step over the output times ``t`` (``grid.step_times``)."""
        self._require_fixed_step()
        return step_times(t, self.steps_per_interval)

    def integrate(self, field: Field, x0: torch.Tensor, t: torch.Tensor,
                  counters: SolverCounters | None = None) -> torch.Tensor:
        """x at every time in ``t``, shape ``(len(t), *x0.shape)``; gradients by backpropagation."""
        if not self.fixed_step:
            return solve_adaptive(field, x0, t, ADAPTIVE_TABLEAUS[self.method], self.rtol, self.atol,
                                  self.max_num_steps, counters=counters)
        return torch.stack(self.march(field, x0, t, counters)[0])

    def march(self, field: Field, x0: torch.Tensor, t: torch.Tensor, counters: SolverCounters | None = None,
              step: Callable | None = None, grid: list | None = None) -> tuple[list[torch.Tensor], object]:
        """The fixed-step loop: (x at every time in ``t``, the scheme's state at the end).

        ``step`` replaces ``self.scheme.step`` (same signature), e.g. by one that is
        recomputed in backward. ``grid`` is ``self.step_times(t)`` when the caller already has
        it (a decoder solving the same grid once per token). Evaluations are counted, not
        observed: no side effect inside the field.
        """
        scheme, k = self.scheme, self.steps_per_interval
        state = scheme.init(field, t[0], x0)
        step = step or scheme.step
        xs = [x0]
        grid = self.step_times(t) if grid is None else grid
        for m, (s, dt) in enumerate(grid):
            state = step(field, s, dt, state)
            if (m + 1) % k == 0:
                xs.append(scheme.value(state))
        if counters is not None:
            counters.nfe += scheme.nfe(len(grid))
            counters.n_accepted += len(grid)
        return xs, state

    def trajectory(self, field: Field, x0: torch.Tensor, t: torch.Tensor,
                   counters: SolverCounters | None = None) -> tuple[torch.Tensor, list[Point]]:
        """``integrate``'s result and every step point ``(t_j, x_j, field(t_j, x_j))``, the start
        and the end included, in integration order: what a Hermite interpolant of x(t) needs.

        Runge-Kutta reuses field(t_j, x_j) as the step's first stage; reversible Heun evaluates
        the field at y once more per point (it steps on z).
        """
        points: list[Point] = []
        if not self.fixed_step:
            ys = solve_adaptive(field, x0, t, ADAPTIVE_TABLEAUS[self.method], self.rtol, self.atol,
                                self.max_num_steps, counters=counters, trajectory=points)
            return ys, points
        scheme = self.scheme
        field = _counted(field, counters)

        def recording_step(field, s, dt, state):
            x = scheme.value(state)
            f = field(s, x)
            points.append((s, x, f))
            return scheme.step(field, s, dt, state, f)

        xs, state = self.march(field, x0, t, step=recording_step)
        x = scheme.value(state)
        points.append((t[-1], x, field(t[-1], x)))
        if counters is not None:
            counters.n_accepted += len(points) - 1
        return torch.stack(xs), points


def _counted(field: Field, counters: SolverCounters | None) -> Field:
    """``field``, adding one to ``counters.nfe`` per call (for loops that never compile)."""
    if counters is None:
        return field

    def counted(s, x):
        counters.nfe += 1
        return field(s, x)

    return counted
