r"""Reversible Heun (Kidger et al., 2021, "Efficient and Accurate Gradients for Neural SDEs").

The solver carries two states, y (the solution) and z (where the field is evaluated),
both starting at x0. One step of size h from t to t + h, with f_n = f(t, z_n) known:

    z_{n+1} = 2 y_n - z_n + h f_n
    f_{n+1} = f(t + h, z_{n+1})
    y_{n+1} = y_n + h/2 (f_n + f_{n+1})

It is second order for ODEs, costs one field evaluation per step, and is algebraically
reversible: from (y_{n+1}, z_{n+1}, f_{n+1}) the previous state is recovered exactly,

    z_n = 2 y_{n+1} - z_{n+1} - h f_{n+1},   f_n = f(t, z_n),   y_n = y_{n+1} - h/2 (f_n + f_{n+1}),

which is what lets the ``Reversible`` gradient method (``gradients.py``) rebuild the trajectory
in backward instead of storing it.
"""

from __future__ import annotations

import torch

from .scheme import ReversibleScheme

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (y, z, f(t, z))


def reversible_heun_step(field, t0: torch.Tensor, t1: torch.Tensor, y, z, f) -> State:
    h = t1 - t0
    z1 = 2 * y - z + h * f
    f1 = field(t1, z1)
    return y + 0.5 * h * (f + f1), z1, f1


def reversible_heun_unstep(field, t0: torch.Tensor, t1: torch.Tensor, y1, z1, f1) -> State:
    """The exact inverse of ``reversible_heun_step`` (up to floating-point rounding)."""
    h = t1 - t0
    z = 2 * y1 - z1 - h * f1
    f = field(t0, z)
    return y1 - 0.5 * h * (f + f1), z, f


class ReversibleHeun(ReversibleScheme):
    """Reversible Heun as a fixed-step scheme (``solvers.Solver``): the state is (y, z, f(t, z)).

    ``unstep`` makes it reversible: ``unstep(field, t0, dt, step(field, t0, dt, s)) == s`` up to
    rounding, whichever way the state was reached.
    """

    name = "reversible_heun"

    @staticmethod
    def nfe(n_steps: int) -> int:
        return n_steps + 1  # f(t0, x0), then one evaluation per step

    @staticmethod
    def init(field, t0: torch.Tensor, x0: torch.Tensor) -> State:
        return x0, x0, field(t0, x0)

    @staticmethod
    def step(field, t0: torch.Tensor, dt: torch.Tensor, state: State, f0: torch.Tensor | None = None) -> State:
        """One step; ``f0 = f(t0, y)`` is of no use to it (it evaluates the field at z)."""
        return reversible_heun_step(field, t0, t0 + dt, *state)

    @staticmethod
    def unstep(field, t0: torch.Tensor, dt: torch.Tensor, state: State) -> State:
        return reversible_heun_unstep(field, t0, t0 + dt, *state)

    @staticmethod
    def value(state: State) -> torch.Tensor:
        return state[0]
