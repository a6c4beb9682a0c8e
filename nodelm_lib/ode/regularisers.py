r"""Flow regularisers (RNODE: Finlay et al. 2020, "How to train your neural ODE").

Along the solution x(t) of dx/dt = f(t, x) over [t_0, t_1], two penalties keep the flow
simple, and so cheap to solve:

    kinetic energy       E = \int ||f(t, x(t))||^2 dt
    Jacobian Frobenius   J = \int ||\partial f / \partial x (t, x(t))||_F^2 dt

The second is estimated with Hutchinson's trick: for noise e with E[e e^T] = I (Rademacher
or Gaussian),

    ||A||_F^2 = tr(A^T A) = E_e[ ||e^T A||^2 ],

one vector-Jacobian product e^T (\partial f / \partial x) per sample, which backpropagation
gives at about twice the cost of evaluating f.

**Reduction.** For a state of shape ``(..., D)`` (a model's ``(B, T, D)``) every quantity is
summed over the last dimension and averaged over the N = numel / D vectors: ||f||^2 is
``f.pow(2).sum(-1).mean()``, and the Jacobian norm is that of the whole map x -> f (attention
couples positions, so it includes the cross-position blocks) divided by the same N. This is
the scale of a mean cross-entropy, so ``loss + penalty`` weighs them as the weights say.

**Along a solve.** RNODE integrates E and J as extra state. On a fixed grid this module uses
the cheaper left-Riemann sum over the solver's step points,

    E ~ sum_m dt_m ||f(t_m, x_m)||^2,

whose integrand is the first stage ``k_1 = f(t_m, x_m)`` of every Runge-Kutta step: the kinetic
term costs no extra field evaluation, and the Jacobian term one vjp per sample per step
(``FlowRegulariser.wrap``). The sum is first order in dt whatever the solver's order; it is a
penalty, not a measurement, so that is enough.
"""

from __future__ import annotations

import math
import numbers

from dataclasses import dataclass
from typing import Callable

import torch

from .solvers import Solver
from .tableaus import TABLEAUS

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

NOISES = ("rademacher", "gaussian")


# --- the two integrands ------------------------------------------------------------------------

def kinetic_energy(f_value: torch.Tensor) -> torch.Tensor:
    r"""||f||^2 of a field's value, summed over the last dimension and averaged over the rest.

    For ``f_value`` of shape ``(B, T, D)``: (1 / (B T)) sum_{b,t,d} f_{btd}^2, a 0-d tensor
    carrying ``f_value``'s graph (so it can be added to a training loss).
    """
    return f_value.pow(2).sum() / _n_vectors(f_value)


def jacobian_frobenius(f: Field, t: torch.Tensor, x: torch.Tensor, n_samples: int = 1,
                       generator: torch.Generator | None = None, noise: str = "rademacher",
                       create_graph: bool = True) -> torch.Tensor:
    r"""Hutchinson estimate of ||\partial f(t, x) / \partial x||_F^2, reduced as ``kinetic_energy``.

        ||J||_F^2 ~ (1 / S) sum_{s=1}^S ||e_s^T J||^2,    e_s ~ Rademacher or N(0, I), S = ``n_samples``

    Unbiased for both noises. Rademacher has the smaller variance, 2 (||A||_F^2 - sum_i A_ii^2)
    per sample with A = J J^T, against Gaussian's 2 ||A||_F^2; it is exact when J is diagonal.
    One vjp per sample. ``create_graph=True`` keeps the graph so the estimate can be a training
    loss (its gradient reaches the field's parameters); ``generator`` makes the noise
    reproducible. Works under ``torch.no_grad`` too (it enables grad for the vjp).
    """
    _check_estimator(n_samples, noise)
    with torch.enable_grad():
        x_in = x if x.requires_grad else x.detach().requires_grad_()
        out = f(t, x_in)
        return _hutchinson(out, x_in, n_samples, noise, generator, create_graph)


def jacobian_frobenius_exact(f: Field, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """||\\partial f(t, x) / \\partial x||_F^2 from the full Jacobian, reduced as ``kinetic_energy``.

    Builds the ``numel(x) x numel(x)`` Jacobian (one backward pass per output element): for
    small problems, tests and diagnostics only. No graph is kept.
    """
    jac = torch.autograd.functional.jacobian(lambda y: f(t, y), x.detach())
    return jac.pow(2).sum() / _n_vectors(x)


def _hutchinson(out: torch.Tensor, x: torch.Tensor, n_samples: int, noise: str,
                generator: torch.Generator | None, create_graph: bool) -> torch.Tensor:
    """The estimate for ``out = f(t, x)`` already computed (``x`` requires grad)."""
    if not out.requires_grad:  # f does not depend on x (nor on anything differentiable): J = 0
        return out.new_zeros(())
    total = out.new_zeros(())
    for _ in range(n_samples):
        e = _noise(out, noise, generator)
        # retain_graph: the next sample, and the solve's own backward, need f's graph again
        (vjp,) = torch.autograd.grad(out, x, e, create_graph=create_graph, retain_graph=True, allow_unused=True)
        if vjp is not None:  # None: f ignores x
            total = total + vjp.pow(2).sum()
    return total / (n_samples * _n_vectors(x))


def _noise(like: torch.Tensor, noise: str, generator: torch.Generator | None) -> torch.Tensor:
    """Noise of ``like``'s shape with E[e e^T] = I. Drawn on the generator's device (a CPU
    generator cannot draw on CUDA), then moved, so a seed gives the same noise everywhere."""
    device = like.device if generator is None else generator.device
    if noise == "gaussian":
        e = torch.randn(like.shape, generator=generator, device=device, dtype=like.dtype)
    else:
        e = torch.randint(0, 2, like.shape, generator=generator, device=device, dtype=like.dtype).mul_(2).sub_(1)
    return e.to(like.device)


def _n_vectors(x: torch.Tensor) -> int:
    """N = numel / D, the number of D-vectors a state holds (1 for a 0-d or 1-d state)."""
    return max(x.numel() // x.shape[-1], 1) if x.ndim else 1


# --- the accumulator along a solve -------------------------------------------------------------

@dataclass(frozen=True)
class FlowRegulariser:
    """The weights of the two penalties and the Hutchinson options; ``wrap`` applies them to a solve.

    penalty = ``kinetic`` * E + ``jacobian`` * J (module docstring). A weight of 0 skips that
    term's work (``jacobian=0``: no vjp at all).
    """

    kinetic: float = 0.0
    jacobian: float = 0.0
    n_samples: int = 1
    noise: str = "rademacher"

    def __post_init__(self) -> None:
        for key in ("kinetic", "jacobian"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                raise ValueError(f"{key}={value!r} is not valid; a regulariser weight must be a finite number >= 0")
        _check_estimator(self.n_samples, self.noise)

    @property
    def active(self) -> bool:
        return self.kinetic > 0 or self.jacobian > 0

    def wrap(self, field: Field, t: torch.Tensor, method: str = "euler", steps_per_interval: int = 1,
             generator: torch.Generator | None = None) -> "RegularisedField":
        """``field`` made to accumulate the penalty along a fixed-step solve of ``method`` over ``t``.

        Pass the wrapped field to ``odeint`` with the same ``t``, ``method`` and
        ``steps_per_interval``, then add ``penalty()`` to the loss (``RegularisedField``).
        """
        return RegularisedField(field, self, t, method, steps_per_interval, generator)


class RegularisedField(torch.nn.Module):
    r"""A field that adds the penalty at every step point of the solve it is called by.

    An explicit Runge-Kutta solve calls the field s times per step, in order, the first at
    ``(t_m, x_m)`` (``rk_stages``): call i is stage i mod s of step i // s. At each first stage
    this field adds ``dt_m (w_E ||f||^2 + w_J ||df/dx||_F^2)`` to the penalty: the
    left-Riemann sum over the grid, with ``dt_m`` from the same grid the solver steps on. Counting
    calls, rather than matching times, keeps the bookkeeping exact whatever the stages' times.

    - ``sensitivity="direct"`` only: it calls the field exactly once per stage, with a graph.
      ``checkpoint`` recomputes steps in backward (that call raises, rather than counting it as
      the next solve's); the adjoints and ``reversible`` solve forward without a graph, so
      nothing would accumulate. Fixed-step RK methods only (``reversible_heun`` evaluates the
      field at its auxiliary state z, not at x).
    - Under ``torch.no_grad`` (evaluation) it accumulates nothing and skips the vjp: the field
      costs what the plain field does. Calls are still counted, so the stages stay aligned.
    - Several solves between ``reset()`` calls add up (e.g. one per layer of a model sharing
      the field); ``reset()`` before each training step's forward pass.

    ``penalty()`` is the weighted sum; ``integrals()`` the unweighted E and J, detached, to log.
    """

    def __init__(self, field: Field, regulariser: FlowRegulariser, t: torch.Tensor, method: str = "euler",
                 steps_per_interval: int = 1, generator: torch.Generator | None = None):
        super().__init__()
        solver = Solver(method, steps_per_interval)  # ValueError for an unknown method, a bad step count
        if method not in TABLEAUS:
            raise ValueError(f"method={method!r} is not valid for a regularised field; choose a fixed-step "
                             f"Runge-Kutta method, one of {', '.join(map(repr, TABLEAUS))}")
        self.field = field  # a submodule if it is an nn.Module: its parameters are this one's
        self.regulariser = regulariser
        self.generator = generator
        self.method = method
        self.stages = TABLEAUS[method].n_stages
        self.dts = [dt for _, dt in solver.step_times(t)]
        self.reset()

    def reset(self) -> None:
        """Forget the accumulated penalty and start counting at the first stage of a solve."""
        self.calls = 0
        self.n_points = 0  # step points accumulated (with a graph) since the last reset
        self._kinetic: torch.Tensor | float = 0.0
        self._jacobian: torch.Tensor | float = 0.0

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        index = self.calls % (len(self.dts) * self.stages)
        self.calls += 1
        reg = self.regulariser
        if index % self.stages or not reg.active or not torch.is_grad_enabled():
            return self.field(t, x)
        _refuse_backward_recomputation()
        want_jacobian = reg.jacobian > 0
        if want_jacobian and not x.requires_grad:  # x0 without a graph: the vjp needs one
            x = x.detach().requires_grad_()
        f = self.field(t, x)
        dt = self.dts[index // self.stages].to(device=f.device, dtype=f.dtype)
        if reg.kinetic > 0:
            self._kinetic = self._kinetic + dt * kinetic_energy(f)
        if want_jacobian:
            self._jacobian = self._jacobian + dt * _hutchinson(f, x, reg.n_samples, reg.noise, self.generator,
                                                               create_graph=True)
        self.n_points += 1
        return f

    def penalty(self) -> torch.Tensor:
        """``kinetic`` * E + ``jacobian`` * J accumulated since ``reset()``: add it to the loss.
        A 0-d zero if nothing accumulated (no solve yet, or only under ``torch.no_grad``)."""
        reg = self.regulariser
        return torch.as_tensor(reg.kinetic * self._kinetic + reg.jacobian * self._jacobian)

    def integrals(self) -> dict[str, float]:
        """The unweighted integrals E (``kinetic``) and J (``jacobian``) since ``reset()``, to log."""
        return {name: float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
                for name, value in (("kinetic", self._kinetic), ("jacobian", self._jacobian))}


def _refuse_backward_recomputation() -> None:
    """RuntimeError if called inside a backward pass (``checkpoint`` recomputing a step): the
    accumulation is a side effect, and repeating it would misalign the stage count."""
    # no public API says "inside backward"; the graph task id is -1 outside one (torch >= 1.13)
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    if task_id is not None and task_id() != -1:
        raise RuntimeError("a RegularisedField was called during a backward pass (sensitivity='checkpoint' "
                           "recomputes steps there); the flow regularisers need sensitivity='direct'")


def _check_estimator(n_samples, noise) -> None:
    if isinstance(n_samples, bool) or not isinstance(n_samples, numbers.Integral) or n_samples < 1:
        raise ValueError(f"n_samples={n_samples!r} is not valid; it must be an integer >= 1 (vjps per estimate)")
    if noise not in NOISES:
        raise ValueError(f"noise={noise!r} is not valid; choose one of {', '.join(map(repr, NOISES))}")


# --- cost ----------------------------------------------------------------------------------------

def regulariser_flops(field_flops: float, n_samples: int = 1, kinetic: bool = True, jacobian: bool = True,
                      numel: int = 0) -> float:
    r"""Extra forward FLOPs per step point (per first stage) of a regularised solve.

    - Jacobian term: ``n_samples`` vjps, each about twice the field's forward FLOPs
      (``field_flops``, e.g. from ``torch.utils.flop_counter``), as a backward pass is:
      2 S F.
    - Kinetic term: no field evaluation (``f(t_m, x_m)`` is the step's first stage anyway); only
      the elementwise square-and-sum, 2 ``numel``.
    - Each vjp's result is squared and summed: 2 ``numel`` per sample.

    ``numel`` (elements of the state) defaults to 0: elementwise work is left out, as
    ``training/flops.py`` leaves it out. A solve adds this times its number of steps. In training
    the backward through the penalty (double backward through the vjp) costs about twice its
    forward again, so the usual 3x rule applies to these FLOPs as to the field's.
    """
    _check_estimator(n_samples, "rademacher")
    total = 0.0
    if kinetic:
        total += 2 * numel
    if jacobian:
        total += n_samples * (2 * field_flops + 2 * numel)
    return total
