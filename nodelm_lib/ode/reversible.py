r"""Reversible Heun (Kidger et al., 2021, "Efficient and Accurate Gradients for Neural SDEs").

The solver carries two states, y (the solution) and z (where the field is evaluated),
both starting at x0. One step of size h from t to t + h, with f_n = f(t, z_n) known:

    z_{n+1} = 2 y_n - z_n + h f_n
    f_{n+1} = f(t + h, z_{n+1})
    y_{n+1} = y_n + h/2 (f_n + f_{n+1})

It is second order for ODEs, costs one field evaluation per step, and is algebraically
reversible: from (y_{n+1}, z_{n+1}, f_{n+1}) the previous state is recovered exactly,

    z_n = 2 y_{n+1} - z_{n+1} - h f_{n+1},   f_n = f(t, z_n),   y_n = y_{n+1} - h/2 (f_n + f_{n+1}),

which is what lets a backward pass rebuild the trajectory instead of storing it (the
``reversible`` sensitivity).
"""

from __future__ import annotations

import torch

from .grid import refine

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


def reversible_heun_solve(field, x0: torch.Tensor, t: torch.Tensor, step=reversible_heun_step, every: int = 1):
    """Integrate over the grid ``t``; returns (y at every ``every``-th time of ``t``, the final (y, z, f)).

    ``step`` defaults to ``reversible_heun_step``; callers may wrap it (e.g. in a checkpoint).
    Only the states returned are kept, so ``every > 1`` keeps memory from growing with the steps.
    """
    y, z, f = x0, x0, field(t[0], x0)
    states = [y]
    for i in range(t.numel() - 1):
        y, z, f = step(field, t[i], t[i + 1], y, z, f)
        if (i + 1) % every == 0:
            states.append(y)
    return states, (y, z, f)


class _ReversibleHeunSolve(torch.autograd.Function):
    """Reversible Heun over the grid ``t`` with exact discrete gradients in O(1) memory.

    Forward keeps no graph, only the states asked for (y at each time in ``t``) and the final
    triple (y, z, f). Backward walks the grid in reverse: ``reversible_heun_unstep``
    reconstructs each step's input, the step is recomputed with a graph, and the adjoints
    are pulled through it, so memory does not grow with the number of steps.
    """

    @staticmethod
    def forward(ctx, field, t, every, stats, x0, *params):
        with torch.no_grad():
            states, (y, z, f) = reversible_heun_solve(field, x0, t, every=every)
        ctx.field, ctx.every, ctx.stats = field, every, stats
        ctx.save_for_backward(t, y, z, f, *params)
        return torch.stack(states)

    @staticmethod
    def backward(ctx, grad_states):
        t, y, z, f, *params = ctx.saved_tensors
        field, every = ctx.field, ctx.every
        if ctx.stats is not None:  # one unstep and one recomputed step per step, plus f(t0, x0)
            ctx.stats.nfe_backward += 2 * (t.numel() - 1) + 1

        def grad_at(i: int) -> torch.Tensor | float:  # the loss's gradient w.r.t. y at fine-grid point i
            return grad_states[i // every] if i % every == 0 else 0.0

        grad_params = [torch.zeros_like(p) for p in params]
        a_y, a_z, a_f = grad_states[-1].clone(), torch.zeros_like(z), torch.zeros_like(f)
        for i in reversed(range(t.numel() - 1)):
            with torch.no_grad():
                y, z, f = reversible_heun_unstep(field, t[i], t[i + 1], y, z, f)
            with torch.enable_grad():
                inputs = [y.detach().requires_grad_(), z.detach().requires_grad_(), f.detach().requires_grad_()]
                outputs = reversible_heun_step(field, t[i], t[i + 1], *inputs)
                grads = torch.autograd.grad(outputs, inputs + list(params), (a_y, a_z, a_f), allow_unused=True)
            a_y, a_z, a_f = grads[0] + grad_at(i), grads[1], grads[2]
            grad_params = [acc if g is None else acc + g for acc, g in zip(grad_params, grads[3:])]
        # the initial triple is (x0, x0, field(t0, x0))
        with torch.enable_grad():
            x = y.detach().requires_grad_()
            f0 = field(t[0], x)
            grads = torch.autograd.grad(f0, [x] + list(params), a_f, allow_unused=True)
        grad_x0 = a_y + a_z + grads[0]
        grad_params = [acc if g is None else acc + g for acc, g in zip(grad_params, grads[1:])]
        return (None, None, None, None, grad_x0, *grad_params)


def odeint_reversible(field, x0: torch.Tensor, t: torch.Tensor, params, steps_per_interval: int = 1,
                      stats=None) -> torch.Tensor:
    """Reversible Heun solve whose backward pass rebuilds the trajectory (see above).

    Takes ``steps_per_interval`` steps per interval of ``t`` and returns x at ``t`` only, so
    neither the states kept nor the output grow with the number of steps.

    ``params`` are the tensors the field depends on that need gradients (its parameters,
    and any conditioning it captures in a closure); gradients reach no other tensor.
    """
    params = tuple(p for p in params if p.requires_grad)
    n_steps = (t.numel() - 1) * steps_per_interval
    if stats is not None:
        stats.nfe += n_steps + 1
        stats.n_accepted += n_steps
    return _ReversibleHeunSolve.apply(field, refine(t, steps_per_interval), steps_per_interval, stats, x0, *params)
