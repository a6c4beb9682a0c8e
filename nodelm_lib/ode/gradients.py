r"""Gradient methods: how gradients flow through a solve, separate from the solver (as diffrax's
``adjoint=``). Each is a small object that owns its forward and backward pass:

    odeint(field, x0, t, method="rk4", sensitivity=Checkpoint())   # or sensitivity="checkpoint"

- ``Direct`` backpropagates through the solver's operations (memory grows with the number of
  steps times the number of stages);
- ``Checkpoint`` keeps only the state at each step and recomputes that step's stages during
  backward (the same gradients as ``Direct``, one extra forward pass of compute). Fixed-step
  methods only;
- ``Reversible`` (an algebraically reversible method: ``reversible_heun``) stores no trajectory:
  backward rebuilds each step by inverting it, exact discrete gradients in memory flat in the
  number of steps;
- ``Backsolve``, ``Interpolating``, ``Quadrature``: continuous adjoints (``adjoint.py``).

The methods that do not backpropagate through the solve (``Reversible`` and the adjoints)
differentiate with respect to x0 and ``params`` only (``solve.find_params`` by default), and
evaluate the field again in backward, outside the forward's graph: the field must then be
deterministic (``reevaluates_field``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.utils.checkpoint import checkpoint

from .counters import SolverCounters
from .scheme import ReversibleScheme
from .solvers import FIXED_STEP_METHODS, SCHEMES, Solver


@dataclass(frozen=True)
class GradientMethod(ABC):
    """How gradients flow through a solve, declared: a method is a frozen dataclass that
    subclasses this one, gives its ``name`` (the string that selects it: ``odeint(sensitivity=name)``,
    configs) and implements ``solve``; ``check`` refuses the solvers it cannot differentiate.
    Without ``solve`` it cannot be instantiated (``TypeError``)."""

    name: ClassVar[str]
    reevaluates_field: ClassVar[bool] = False  # backward calls the field again, outside the forward's graph

    def check(self, solver: Solver) -> None:
        """Raise ``ValueError`` if this method cannot differentiate ``solver``'s solves."""

    @abstractmethod
    def solve(self, solver: Solver, field, x0: torch.Tensor, t: torch.Tensor, params=None,
              counters: SolverCounters | None = None) -> torch.Tensor:
        """x at every time in ``t`` (shape ``(len(t), *x0.shape)``), differentiable this method's way.

        ``params``: the tensors besides x0 that a method with a backward of its own differentiates
        (default ``find_params(field)``); backpropagating methods reach whatever the graph does.
        """


def differentiable(field, params) -> tuple[torch.Tensor, ...]:
    """``params`` (default ``find_params(field)``) that require gradients."""
    return tuple(p for p in (find_params(field) if params is None else params) if p.requires_grad)


def check_params_found(output: torch.Tensor, given, method: str) -> None:
    """ValueError where ``output``, a field's value computed with a graph, depends on tensors
    requiring gradients other than ``given`` (its inputs and the parameters a method
    differentiates): a method with a backward of its own would return no gradient for them,
    silently. Walks ``output``'s graph back to its leaves, stopping at ``given``; a method calls
    it once, on its first evaluation of the field in backward, where ``params`` were not given."""
    known = {id(g) for g in given} | {id(g.grad_fn) for g in given if g.grad_fn is not None}
    seen, stack, missed = set(), [output.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or id(node) in known:
            continue
        seen.add(id(node))
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf requiring gradients
        if leaf is not None and id(leaf) not in known:
            missed[id(leaf)] = leaf
        stack.extend(next_node for next_node, _ in node.next_functions)
    if missed:
        shapes = ", ".join(str(tuple(p.shape)) for p in list(missed.values())[:5])
        raise ValueError(
            f"sensitivity={method!r} differentiates x0 and the field's parameters only, but the field depends on "
            f"{len(missed)} more tensor(s) requiring gradients (shapes {shapes}{', ...' if len(missed) > 5 else ''}) "
            "that it could not find: they would get no gradient. Make the field an nn.Module that owns them, "
            "capture them in the field's closure (not as module-level globals), or pass them: "
            "odeint(..., params=list(module.parameters()))")


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


@dataclass(frozen=True)
class Direct(GradientMethod):
    """Backpropagation through the solver's own operations: the exact gradient of the discrete solve."""

    name: ClassVar[str] = "direct"

    def solve(self, solver, field, x0, t, params=None, counters=None):
        return solver.integrate(field, x0, t, counters)


@dataclass(frozen=True)
class Checkpoint(GradientMethod):
    """Gradient checkpointing per step: backward recomputes each step's stages from its input.

    The same gradients as ``Direct``. Non-reentrant checkpointing also differentiates tensors
    the field captures in a closure (e.g. the hybrid's control vector), and replays dropout's
    random masks, so the field need not be deterministic.
    """

    name: ClassVar[str] = "checkpoint"

    def check(self, solver):
        if not solver.fixed_step:
            raise ValueError(f"sensitivity={self.name!r} needs a fixed-step method ({', '.join(FIXED_STEP_METHODS)}), "
                             f"not method={solver.method!r}")

    def solve(self, solver, field, x0, t, params=None, counters=None):
        step = solver.scheme.step
        if torch.is_grad_enabled():
            step = _recomputed(step)
        return torch.stack(solver.march(field, x0, t, counters, step=step)[0])


def _recomputed(step):
    """``step`` wrapped so that backward recomputes it instead of storing its internals."""
    return lambda *args: checkpoint(step, *args, use_reentrant=False)


REVERSIBLE_METHODS = tuple(name for name, scheme in SCHEMES.items() if isinstance(scheme, ReversibleScheme))


@dataclass(frozen=True)
class Reversible(GradientMethod):
    """Exact gradients of the discrete solve in O(1) memory, for algebraically reversible schemes.

    Forward keeps no graph, only the states asked for (x at each time in ``t``) and the final
    state. Backward walks the grid in reverse: ``unstep`` reconstructs each step's input, the
    step is recomputed with a graph, and the adjoints are pulled through it, so memory does
    not grow with the number of steps.
    """

    name: ClassVar[str] = "reversible"
    reevaluates_field: ClassVar[bool] = True

    def check(self, solver):
        if solver.method not in REVERSIBLE_METHODS:
            raise ValueError(f"sensitivity={self.name!r} needs method={' or '.join(map(repr, REVERSIBLE_METHODS))}, "
                             f"not method={solver.method!r}")

    def solve(self, solver, field, x0, t, params=None, counters=None):
        check = params is None  # found, not given: backward checks that nothing was missed
        params = differentiable(field, params)
        return _ReversibleSolve.apply(solver, field, t, counters, check, x0, *params)


class _ReversibleSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, solver, field, t, counters, check, x0, *params):
        with torch.no_grad():
            xs, state = solver.march(field, x0, t, counters)
        ctx.solver, ctx.field, ctx.counters, ctx.n_state = solver, field, counters, len(state)
        ctx.check = check
        ctx.save_for_backward(t, *state, *params)
        return torch.stack(xs)

    @staticmethod
    def backward(ctx, grad_xs):
        t, *saved = ctx.saved_tensors
        state, params = tuple(saved[:ctx.n_state]), saved[ctx.n_state:]
        solver, field, scheme, every = ctx.solver, ctx.field, ctx.solver.scheme, ctx.solver.steps_per_interval
        grid = solver.step_times(t)
        if ctx.counters is not None:  # one unstep and one recomputed step per step, plus the initial state
            ctx.counters.nfe_backward += 2 * len(grid) + 1

        grad_params = [torch.zeros_like(p) for p in params]
        adjoint = (grad_xs[-1].clone(), *(torch.zeros_like(s) for s in state[1:]))  # d loss / d state
        for m in reversed(range(len(grid))):
            s, dt = grid[m]
            with torch.no_grad():
                state = scheme.unstep(field, s, dt, state)
            inputs = [v.detach().requires_grad_() for v in state]
            with torch.enable_grad():
                outputs = scheme.step(field, s, dt, tuple(inputs))
                if ctx.check:
                    ctx.check = False
                    check_params_found(outputs[0], inputs + list(params), Reversible.name)
                grads = torch.autograd.grad(outputs, inputs + list(params), adjoint, allow_unused=True)
            adjoint = tuple(grads[:len(inputs)])
            if m % every == 0:  # the state at an output time: the loss's own gradient joins
                adjoint = (adjoint[0] + grad_xs[m // every], *adjoint[1:])
            grad_params = [acc if g is None else acc + g for acc, g in zip(grad_params, grads[len(inputs):])]
        # and through the initial state, scheme.init(field, t0, x0)
        with torch.enable_grad():
            x = scheme.value(state).detach().requires_grad_()
            initial = scheme.init(field, t[0], x)
            grads = torch.autograd.grad(initial, [x] + list(params), adjoint, allow_unused=True)
        grad_params = [acc if g is None else acc + g for acc, g in zip(grad_params, grads[1:])]
        return (None, None, None, None, None, grads[0], *grad_params)
