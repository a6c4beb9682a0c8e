"""``odeint``: integrate dx/dt = field(t, x) and return the states at the times ``t``.

Fixed-step methods (euler, midpoint, heun, rk4, rk38, and reversible_heun) take one step per
interval of ``t``, so ``t = torch.linspace(0, 1, n + 1)`` is n steps, as in torchdiffeq.
The loop is plain Python over tensors: no grid construction, no host synchronisation, so it
compiles to one graph under ``torch.compile``. Adaptive methods are handed to torchdiffeq
for now. The gradient method is a separate argument (``sensitivity``):

- ``"direct"`` backpropagates through the solver's operations (memory grows with the
  number of steps times the number of stages);
- ``"checkpoint"`` keeps only the state at each step and recomputes that step's stages
  during backward (memory grows with the number of steps only; the gradients are the same
  numbers as ``direct``, one extra forward pass of compute). Fixed-step methods only.
- ``"reversible"`` (``method="reversible_heun"`` only) stores no trajectory: backward
  reconstructs each step by inverting it algebraically. Exact discrete gradients in memory
  that does not grow with the number of steps. The tensors needing gradients are passed as
  ``params`` (default: the parameters of ``field`` if it is an ``nn.Module``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .reversible import odeint_reversible, reversible_heun_solve, reversible_heun_step
from .tableaus import TABLEAUS, ButcherTableau

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

FIXED_STEP_METHODS = tuple(TABLEAUS) + ("reversible_heun",)
ADAPTIVE_METHODS = ("dopri5", "bosh3", "adaptive_heun", "dopri8", "fehlberg2")
SENSITIVITIES = ("direct", "checkpoint", "reversible")


def rk_step(field: Field, tableau: ButcherTableau, t0: torch.Tensor, dt: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One explicit Runge-Kutta step of size ``dt`` from ``(t0, x)``."""
    stages: list[torch.Tensor] = []
    for c_i, a_i in zip(tableau.c, tableau.a):
        x_i = x
        for a_ij, k_j in zip(a_i, stages):
            if a_ij != 0.0:
                x_i = x_i + (a_ij * dt) * k_j
        stages.append(field(t0 + c_i * dt, x_i))
    update = sum(b_i * k_i for b_i, k_i in zip(tableau.b, stages) if b_i != 0.0)
    return x + dt * update


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
) -> torch.Tensor:
    """Solve the initial value problem x(t[0]) = x0, dx/dt = field(t, x).

    Returns a tensor of shape ``(len(t), *x0.shape)`` holding x at each time in ``t``.
    ``rtol``, ``atol`` and ``max_num_steps`` apply to adaptive methods only. ``params`` is
    used by ``sensitivity="reversible"`` (see the module docstring).
    """
    _check_times(t)
    if sensitivity not in SENSITIVITIES:
        raise ValueError(f"sensitivity={sensitivity!r} is not valid; choose one of {', '.join(map(repr, SENSITIVITIES))}")
    t = t.to(device=x0.device, dtype=x0.dtype if x0.is_floating_point() else torch.float32)
    if sensitivity == "reversible":
        if method != "reversible_heun":
            raise ValueError(f"sensitivity='reversible' needs method='reversible_heun', not method={method!r}")
        if params is None:
            params = field.parameters() if isinstance(field, torch.nn.Module) else ()
        return odeint_reversible(field, x0, t, params)
    recompute = sensitivity == "checkpoint"
    if method in TABLEAUS:
        return _odeint_fixed(field, x0, t, TABLEAUS[method], recompute)
    if method == "reversible_heun":
        return _odeint_reversible_heun(field, x0, t, recompute)
    if method in ADAPTIVE_METHODS:
        if sensitivity != "direct":
            raise ValueError(f"sensitivity={sensitivity!r} needs a fixed-step method ({', '.join(FIXED_STEP_METHODS)}), "
                             f"not method={method!r}")
        return _odeint_torchdiffeq(field, x0, t, method, rtol, atol, max_num_steps)
    valid = FIXED_STEP_METHODS + ADAPTIVE_METHODS
    raise ValueError(f"method={method!r} is not valid; choose one of {', '.join(map(repr, valid))}")


def _recomputed(step: Callable) -> Callable:
    """``step`` wrapped so that backward recomputes it instead of storing its internals.

    Non-reentrant checkpointing also differentiates tensors the field captures in a closure
    (e.g. the hybrid's control vector), and replays dropout's random masks.
    """
    return lambda *args: checkpoint(step, *args, use_reentrant=False)


def _odeint_fixed(field: Field, x0: torch.Tensor, t: torch.Tensor, tableau: ButcherTableau,
                  recompute: bool = False) -> torch.Tensor:
    step = _recomputed(rk_step) if recompute and torch.is_grad_enabled() else rk_step
    states = [x0]
    x = x0
    for i in range(t.numel() - 1):
        x = step(field, tableau, t[i], t[i + 1] - t[i], x)
        states.append(x)
    return torch.stack(states)


def _odeint_reversible_heun(field: Field, x0: torch.Tensor, t: torch.Tensor, recompute: bool = False) -> torch.Tensor:
    step = _recomputed(reversible_heun_step) if recompute and torch.is_grad_enabled() else reversible_heun_step
    return torch.stack(reversible_heun_solve(field, x0, t, step)[0])


def _odeint_torchdiffeq(field, x0, t, method, rtol, atol, max_num_steps):
    import torchdiffeq  # imported lazily: only adaptive methods need it

    return torchdiffeq.odeint(
        field, x0, t, rtol=rtol, atol=atol, method=method, options={"max_num_steps": max_num_steps}
    )
