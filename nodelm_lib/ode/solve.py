"""``odeint``: integrate dx/dt = field(t, x) and return the states at the times ``t``.

Two choices are separate, as in diffrax: the *solver* (``method`` and its step options,
a ``Solver``) and the *gradient method* (``sensitivity``).

Solvers. Fixed-step methods (euler, midpoint, heun, rk4, rk38 from Butcher tableaus, and
reversible_heun) take ``steps_per_interval`` equal steps per interval of ``t`` (default 1:
``t = torch.linspace(0, 1, n + 1)`` is n steps, as in torchdiffeq; ``t = [0, 1]`` with
``steps_per_interval=n`` is the same n steps but returns only the end points). The loop is
plain Python over tensors: no grid construction, no host synchronisation (``.item()``), so
it compiles to one graph under ``torch.compile``. Adaptive methods (dopri5, bosh3,
adaptive_heun, fehlberg2) choose their own steps to meet ``rtol``/``atol`` and give the
output times by dense output (``adaptive.py``).

Gradient methods (``sensitivity``):

- ``"direct"`` backpropagates through the solver's operations (memory grows with the
  number of steps times the number of stages);
- ``"checkpoint"`` keeps only the state at each step and recomputes that step's stages
  during backward (the same gradients as ``direct``, one extra forward pass of compute).
  Fixed-step methods only.
- ``"backsolve"``, ``"interpolating"``, ``"quadrature"``: continuous adjoints (``adjoint.py``).
- ``"reversible"`` (``method="reversible_heun"`` only) stores no trajectory: backward
  reconstructs each step by inverting it algebraically (``reversible.py``).

The gradient methods that do not backpropagate through the solve (the adjoints and
``reversible``) differentiate with respect to x0 and ``params``: by default the parameters of
``field`` (if it is an ``nn.Module``) and the modules and tensors requiring gradients that a
closure ``field`` captures (``find_params``). Pass ``params`` explicitly for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .adaptive import solve_adaptive
from .grid import refine
from .reversible import odeint_reversible, reversible_heun_solve, reversible_heun_step
from .stats import SolveStats
from .tableaus import ADAPTIVE_TABLEAUS, TABLEAUS, ButcherTableau

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

FIXED_STEP_METHODS = tuple(TABLEAUS) + ("reversible_heun",)
ADAPTIVE_METHODS = tuple(ADAPTIVE_TABLEAUS)
METHODS = FIXED_STEP_METHODS + ADAPTIVE_METHODS
ADJOINT_SENSITIVITIES = ("backsolve", "interpolating", "quadrature")
SENSITIVITIES = ("direct", "checkpoint") + ADJOINT_SENSITIVITIES + ("reversible",)


def rk_step(field: Field, tableau: ButcherTableau, t0: torch.Tensor, dt: torch.Tensor, x: torch.Tensor,
            k1: torch.Tensor | None = None) -> torch.Tensor:
    """One explicit Runge-Kutta step of size ``dt`` from ``(t0, x)``.

    ``k1 = field(t0, x)`` may be passed when the caller already has it (every tableau here
    has c_1 = 0). Each stage input is one fused ``x + (a_ij dt) k_j`` kernel per nonzero a_ij;
    nothing else is allocated per step.
    """
    stages: list[torch.Tensor] = []
    for i, (c_i, a_i) in enumerate(zip(tableau.c, tableau.a)):
        if i == 0 and k1 is not None:
            stages.append(k1)
            continue
        x_i = x
        for a_ij, k_j in zip(a_i, stages):
            if a_ij != 0.0:
                x_i = torch.addcmul(x_i, k_j, dt, value=a_ij)
        stages.append(field(t0 + c_i * dt, x_i))
    update = None
    for b_i, k_i in zip(tableau.b, stages):
        if b_i != 0.0:  # one buffer accumulates the weighted stages (in place: autograd saves none of it)
            update = k_i * b_i if update is None else update.add_(k_i, alpha=b_i)
    return torch.addcmul(x, update, dt)


@dataclass(frozen=True)
class Solver:
    """A method and its step options; ``integrate`` is the plain (``direct``) solve.

    ``trajectory``, if a list, receives ``(t_j, x_j, f_j = field(t_j, x_j))`` at every step
    point (the start included), which the adjoint methods interpolate.
    """

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

    @property
    def fixed_step(self) -> bool:
        return self.method in FIXED_STEP_METHODS

    def with_steps(self, steps_per_interval: int) -> "Solver":
        return Solver(self.method, steps_per_interval, self.rtol, self.atol, self.max_num_steps)

    def integrate(self, field: Field, x0: torch.Tensor, t: torch.Tensor, stats: SolveStats | None = None,
                  trajectory: list | None = None, recompute: bool = False) -> torch.Tensor:
        if self.method in ADAPTIVE_METHODS:
            return solve_adaptive(field, x0, t, ADAPTIVE_TABLEAUS[self.method], self.rtol, self.atol,
                                  self.max_num_steps, stats=stats, trajectory=trajectory)
        k = self.steps_per_interval
        n_steps = (t.numel() - 1) * k
        if self.method == "reversible_heun":
            ys = self._reversible_heun(field, x0, t, recompute, trajectory)
            nfe = n_steps + 1 + (n_steps if trajectory is not None else 0)  # a trajectory needs f at every y
        else:
            ys = self._runge_kutta(field, x0, t, TABLEAUS[self.method], recompute, trajectory)
            nfe = n_steps * TABLEAUS[self.method].n_stages
        if stats is not None:  # counted, not observed: no side effect inside the field
            stats.nfe += nfe + (1 if trajectory is not None else 0)
            stats.n_accepted += n_steps
        return ys

    def _runge_kutta(self, field, x0, t, tableau, recompute, trajectory):
        step = _recomputed(rk_step) if recompute and torch.is_grad_enabled() else rk_step
        k = self.steps_per_interval
        x, states = x0, [x0]
        for i in range(t.numel() - 1):
            dt = (t[i + 1] - t[i]) / k
            for j in range(k):
                s = t[i] + j * dt
                if trajectory is None:
                    x = step(field, tableau, s, dt, x)
                else:
                    f = field(s, x)
                    trajectory.append((s, x, f))
                    x = step(field, tableau, s, dt, x, f)
            states.append(x)
        if trajectory is not None:
            trajectory.append((t[-1], x, field(t[-1], x)))
        return torch.stack(states)

    def _reversible_heun(self, field, x0, t, recompute, trajectory):
        step = _recomputed(reversible_heun_step) if recompute and torch.is_grad_enabled() else reversible_heun_step
        fine, k = refine(t, self.steps_per_interval), self.steps_per_interval
        if trajectory is None:
            return torch.stack(reversible_heun_solve(field, x0, fine, step, every=k)[0])
        ys = reversible_heun_solve(field, x0, fine, step)[0]
        # the solver evaluates f at z, not at y: evaluate it at y for the trajectory
        trajectory.extend((fine[j], y, field(fine[j], y)) for j, y in enumerate(ys))
        return torch.stack(ys[::k])


def _recomputed(step: Callable) -> Callable:
    """``step`` wrapped so that backward recomputes it instead of storing its internals.

    Non-reentrant checkpointing also differentiates tensors the field captures in a closure
    (e.g. the hybrid's control vector), and replays dropout's random masks.
    """
    return lambda *args: checkpoint(step, *args, use_reentrant=False)


def find_params(field) -> tuple[torch.Tensor, ...]:
    """Tensors requiring gradients that ``field`` depends on, as far as can be seen.

    The parameters of an ``nn.Module`` field; for a function (e.g. a lambda), the modules'
    parameters and the tensors requiring gradients in its closure, and those of the object a
    bound method belongs to. Anything reached another way must be passed as ``params``.
    """
    found: list[torch.Tensor] = []

    def add(obj) -> None:
        if isinstance(obj, torch.nn.Module):
            found.extend(obj.parameters())
        elif isinstance(obj, torch.Tensor) and obj.requires_grad:
            found.append(obj)

    add(field)
    add(getattr(field, "__self__", None))
    for cell in getattr(field, "__closure__", None) or ():
        try:
            add(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    unique = {id(p): p for p in found}
    return tuple(p for p in unique.values() if p.requires_grad)


def _check_times(t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.ndim != 1 or t.numel() < 2:
        raise ValueError(f"t must be a 1-D tensor of at least two output times, got {t!r}")


def odeint(
    field: Field,
    x0: torch.Tensor,
    t: torch.Tensor,
    method: str = "rk4",
    sensitivity: str = "direct",
    rtol: float = 1e-3,
    atol: float = 1e-4,
    max_num_steps: int = 1000,
    params=None,
    steps_per_interval: int = 1,
    stats: SolveStats | None = None,
) -> torch.Tensor:
    """Solve the initial value problem x(t[0]) = x0, dx/dt = field(t, x).

    Returns a tensor of shape ``(len(t), *x0.shape)`` holding x at each time in ``t``.
    ``rtol``, ``atol`` and ``max_num_steps`` apply to adaptive methods; ``steps_per_interval``
    to fixed-step ones. ``params``: see the module docstring. ``stats``, if given, is
    incremented with the evaluations and steps of this solve (and of its backward pass).
    """
    _check_times(t)
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"sensitivity={sensitivity!r} is not valid; choose one of {', '.join(map(repr, SENSITIVITIES))}")
    solver = Solver(method, steps_per_interval, rtol, atol, max_num_steps)
    t = t.to(device=x0.device, dtype=x0.dtype if x0.is_floating_point() else torch.float32)
    if sensitivity == "direct":
        return solver.integrate(field, x0, t, stats)
    if sensitivity == "checkpoint":
        if not solver.fixed_step:
            raise ValueError(f"sensitivity='checkpoint' needs a fixed-step method ({', '.join(FIXED_STEP_METHODS)}), "
                             f"not method={method!r}")
        return solver.integrate(field, x0, t, stats, recompute=True)
    params = find_params(field) if params is None else tuple(params)
    if sensitivity == "reversible":
        if method != "reversible_heun":
            raise ValueError(f"sensitivity='reversible' needs method='reversible_heun', not method={method!r}")
        return odeint_reversible(field, x0, t, params, steps_per_interval, stats)
    from .adjoint import odeint_adjoint  # adjoint.py builds on Solver

    return odeint_adjoint(field, x0, t, solver, sensitivity, params, stats)
