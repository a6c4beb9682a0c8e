"""``odeint``: integrate dx/dt = field(t, x) and return the states at the times ``t``.

Two choices are separate, as in diffrax: the *solver* (``method`` and its step options, a
``Solver``: ``solvers.py``) and the *gradient method* (``sensitivity``: a ``GradientMethod``
from ``gradients.py`` or ``adjoint.py``, or its name).

On a fixed grid ``t`` holds the step points (``torch.linspace(0, 1, n + 1)`` is n steps, as in
torchdiffeq); ``t = [0, 1]`` with ``steps_per_interval=n`` is the same n steps but returns only
the end points.

The gradient methods with a backward of their own (``reversible`` and the adjoints)
differentiate with respect to x0 and ``params``: by default the parameters of ``field`` (if it
is an ``nn.Module``) and the modules and tensors requiring gradients that a closure ``field``
captures (``find_params``). Pass ``params`` explicitly for anything else.
"""

from __future__ import annotations

from typing import Callable

import torch

from .adjoint import Backsolve, Interpolating, Quadrature
from .counters import SolverCounters
from .gradients import Checkpoint, Direct, GradientMethod, Reversible
from .grid import check_times
from .solvers import Solver

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

GRADIENT_METHODS = {m.name: m for m in (Direct, Checkpoint, Backsolve, Interpolating, Quadrature, Reversible)}
SENSITIVITIES = tuple(GRADIENT_METHODS)  # the names a config or ``odeint(sensitivity=...)`` may give


def gradient_method(sensitivity: str | GradientMethod) -> GradientMethod:
    """The gradient method a name stands for (``"checkpoint"`` -> ``Checkpoint()``); an object is its own."""
    if isinstance(sensitivity, GradientMethod):
        return sensitivity
    if sensitivity not in GRADIENT_METHODS:
        raise ValueError(f"sensitivity={sensitivity!r} is not valid; choose one of {', '.join(map(repr, SENSITIVITIES))}")
    return GRADIENT_METHODS[sensitivity]()


def check_inputs(x0: torch.Tensor, t: torch.Tensor) -> None:
    """ValueError unless ``x0`` is a finite floating-point tensor and ``t`` finite and strictly
    monotone (increasing, or decreasing to integrate backwards): a repeated or out-of-order
    time would be a step of zero or negative length, and a NaN would fill the output with NaN
    (or an adaptive solve with rejected steps) instead of an error. Reads the values (one host
    synchronisation): ``odeint`` checks, a model's own solves (their grids are built) do not,
    and neither does a solve being traced by ``torch.compile`` (one graph, no host reads)."""
    if not isinstance(x0, torch.Tensor) or not x0.is_floating_point():
        raise ValueError(f"x0 must be a floating-point tensor, got {type(x0).__name__}"
                         f"{f' of dtype {x0.dtype}' if isinstance(x0, torch.Tensor) else ''}")
    if torch.compiler.is_compiling():
        return
    times = t.detach().double().cpu()
    if not torch.isfinite(times).all():
        raise ValueError(f"t must hold finite times, got {times.tolist()}")
    steps = times.diff()
    if not ((steps > 0).all() or (steps < 0).all()):
        bad = int(torch.nonzero(steps * steps[0].sign() <= 0)[0]) if steps[0] != 0 else 0
        raise ValueError(f"t must be strictly increasing (or strictly decreasing), without repeated times; "
                         f"got t[{bad}]={times[bad].item()!r}, t[{bad + 1}]={times[bad + 1].item()!r} in {times.tolist()}")
    if not torch.isfinite(x0).all():
        raise ValueError(f"x0 holds {int((~torch.isfinite(x0)).sum())} non-finite value(s) (NaN or inf) of "
                         f"{x0.numel()}: the solution would be NaN; check what produced x0")


def odeint(
    field: Field,
    x0: torch.Tensor,
    t: torch.Tensor,
    method: str = "rk4",
    sensitivity: str | GradientMethod = "direct",
    rtol: float = 1e-3,
    atol: float = 1e-4,
    max_num_steps: int = 1000,
    params=None,
    steps_per_interval: int = 1,
    counters: SolverCounters | None = None,
    stats: SolverCounters | None = None,
) -> torch.Tensor:
    """Solve the initial value problem x(t[0]) = x0, dx/dt = field(t, x).

    Returns a tensor of shape ``(len(t), *x0.shape)`` holding x at each time in ``t``.
    ``rtol``, ``atol`` and ``max_num_steps`` apply to adaptive methods; ``steps_per_interval``
    to fixed-step ones. ``sensitivity``: a ``GradientMethod`` (``Checkpoint()``) or its name
    (``"checkpoint"``). ``params``: see the module docstring. ``counters`` (``stats`` is its old
    name), if given, gain the evaluations and steps of this solve (and of its backward pass).
    """
    check_times(t)
    grad = gradient_method(sensitivity)
    solver = Solver(method, steps_per_interval, rtol, atol, max_num_steps)
    grad.check(solver)
    check_inputs(x0, t)
    check_params(params)
    t = t.to(device=x0.device, dtype=x0.dtype if x0.is_floating_point() else torch.float32)
    try:
        return grad.solve(solver, field, x0, t, params, counters if counters is not None else stats)
    except (TypeError, RuntimeError) as err:
        problem = field_problem(field, x0, t)
        if problem is None:
            raise
        raise ValueError(problem) from err


def check_params(params) -> None:
    """ValueError unless ``params`` is None or an iterable of tensors (what a gradient method
    differentiates besides x0)."""
    if params is None:
        return
    if isinstance(params, torch.Tensor) or not hasattr(params, "__iter__"):
        raise ValueError(f"params must be a list of tensors (e.g. list(module.parameters())), got {type(params).__name__}")
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"params[{i}]={p!r} is not valid: params must be tensors (e.g. list(module.parameters())), "
                             f"got {type(p).__name__}")


def field_problem(field: Field, x0: torch.Tensor, t: torch.Tensor) -> str | None:
    """What is wrong with ``field``'s output at (t[0], x0), or None if nothing is: asked only after
    a solve has failed, so that a field returning None or a tensor of another shape is named as the
    cause instead of the solver's arithmetic failing on it (an extra evaluation, but only then)."""
    try:
        with torch.no_grad():
            out = field(t[0], x0)
    except Exception:  # the field itself raises: its own error is the one to see
        return None
    if not isinstance(out, torch.Tensor):
        return (f"the field returned {type(out).__name__} at t={t[0].item():g}; it must return dx/dt, a tensor of "
                f"x0's shape {tuple(x0.shape)}")
    if out.shape != x0.shape:
        return (f"the field returned a tensor of shape {tuple(out.shape)} at t={t[0].item():g}; dx/dt must have "
                f"x0's shape {tuple(x0.shape)}")
    return None
