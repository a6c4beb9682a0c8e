r"""Continuous adjoints: the gradients of an ODE solve from another ODE solved backwards.

For dx/dt = f(t, x; θ) and a loss L with ∂L/∂x(t_i) = g_i at the output times, the adjoint
a(t) = ∂L/∂x(t) obeys, between output times,

    da/dt = -a^T ∂f/∂x (t, x(t)),        a(t_N) = g_N,    a jumps by g_i at t_i,

and dL/dθ = ∫ a(t)^T ∂f/∂θ (t, x(t)) dt, dL/dx0 = a(t_0). Each product a^T ∂f/∂(x, θ) is one
vector-Jacobian product of the field. The three methods differ in where x(t) comes from
while a is solved backwards, and in how the parameter integral is formed:

- ``backsolve`` (Chen et al. 2018, torchdiffeq's ``odeint_adjoint``): integrates the augmented
  state (x, a, g) backwards with g' = -a^T ∂f/∂θ; x is re-integrated backwards from the
  forward's value at each output time. Memory is flat in the number of steps, but where the
  flow is unstable backwards x drifts from the forward trajectory and the gradients with it.
- ``interpolating``: never integrates x backwards. The forward pass keeps checkpoints (x at
  about 2 sqrt(n) points of an n-step grid; at the output times for adaptive methods); backward
  re-integrates each segment forward from its checkpoint, recording (t_j, x_j, f_j), and
  reads x(t) from the cubic Hermite interpolant through those points while it integrates
  (a, g) back. Memory grows like 4 sqrt(n) states, and no activations are kept.
- ``quadrature``: the forward pass keeps its whole solution (t_j, x_j, f_j); backward
  integrates a alone, then forms dL/dθ by 3-point Gauss-Legendre quadrature of a^T ∂f/∂θ over
  each forward step, with a and x read from their Hermite interpolants.

Backward solves use the forward's solver (method, steps, tolerances). These are gradients of
the continuous problem: they differ from ``direct`` (the exact gradient of the discrete solve)
by the discretisation error, O(h^p). Backward runs the field again, so it must be
deterministic (no dropout in training).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from .counters import SolverCounters
from .gradients import GradientMethod, check_params_found, differentiable
from .grid import refine

# 3-point Gauss-Legendre rule on [0, 1]: exact for polynomials of degree 5
GAUSS_LEGENDRE_3 = ((0.5 - math.sqrt(15) / 10, 5 / 18), (0.5, 8 / 18), (0.5 + math.sqrt(15) / 10, 5 / 18))


class Hermite:
    r"""Piecewise cubic Hermite interpolant through points (t_j, x_j, f_j = dx/dt(t_j)).

    On [t_j, t_{j+1}] with h = t_{j+1} - t_j and u = (s - t_j) / h:

        x(s) = (2u³ - 3u² + 1) x_j + (u³ - 2u² + u) h f_j + (3u² - 2u³) x_{j+1} + (u³ - u²) h f_{j+1}

    Fourth-order accurate, like the solvers it interpolates; evaluation uses tensor ops only.
    """

    def __init__(self, points: list):
        if len(points) < 2:
            raise ValueError("a Hermite interpolant needs at least two points")
        if bool(points[-1][0] < points[0][0]):  # a backward solve: store in increasing time
            points = points[::-1]
        self.t = torch.stack([p[0] for p in points])
        self.x = torch.stack([p[1] for p in points])
        self.f = torch.stack([p[2] for p in points])

    def __call__(self, s: torch.Tensor) -> torch.Tensor:
        j = (torch.searchsorted(self.t, s.reshape(1), right=True) - 1).clamp(0, self.t.numel() - 2)
        t0, t1 = self.t[j][0], self.t[j + 1][0]
        h = t1 - t0
        u = (s - t0) / h
        u2, u3 = u * u, u * u * u
        return ((2 * u3 - 3 * u2 + 1) * self.x[j][0] + (u3 - 2 * u2 + u) * h * self.f[j][0]
                + (3 * u2 - 2 * u3) * self.x[j + 1][0] + (u3 - u2) * h * self.f[j + 1][0])


def segment_steps(k: int) -> int:
    """Steps per checkpoint segment for ``interpolating``: the largest divisor m of k with m <= sqrt(k)/2.

    Backward holds the k/m checkpoints plus one re-integrated segment: m + 1 points of (x, f),
    and their stacked copy in the interpolant, about 4m states. k/m + 4m is least at m = sqrt(k)/2,
    where it is about 4 sqrt(k) states.
    """
    limit = max(1, math.isqrt(k) // 2)
    return max(m for m in range(1, limit + 1) if k % m == 0)


def _flat(tensors, like: torch.Tensor) -> torch.Tensor:
    if not tensors:
        return like.new_zeros(0)
    return torch.cat([t.reshape(-1).to(like.dtype) for t in tensors])


def _unflat(vector: torch.Tensor, likes) -> list[torch.Tensor]:
    out, offset = [], 0
    for p in likes:
        out.append(vector[offset: offset + p.numel()].view_as(p).to(p.dtype))
        offset += p.numel()
    return out


class Adjoint:
    """One adjoint solve: the field, solver, parameters and counters its two passes share."""

    def __init__(self, field, solver, params, counters: SolverCounters | None, check: str | None = None):
        self.field, self.solver, self.params, self.counters = field, solver, params, counters
        self.check = check  # the method's name where params were found, not given: checked once (vjp)

    def vjp(self, s, x, a, wrt_params: bool = True):
        """f(s, x) and a^T ∂f/∂x, a^T ∂f/∂θ (zeros where f does not depend on them)."""
        if self.counters is not None:
            self.counters.nfe_backward += 1
        inputs = [x.detach().requires_grad_()] + (list(self.params) if wrt_params else [])
        with torch.enable_grad():
            f = self.field(s, inputs[0])
            if self.check is not None:
                method, self.check = self.check, None
                check_params_found(f, [inputs[0], *self.params], method)
            grads = torch.autograd.grad(f, inputs, a, allow_unused=True) if f.requires_grad else [None] * len(inputs)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, inputs)]
        return f.detach(), grads[0], grads[1:]

    def reintegrate(self, solver, x0, t) -> Hermite:
        """Forward re-integration over ``t`` from x0, as an interpolant of x(t)."""
        counted = SolverCounters()
        with torch.no_grad():
            points = solver.trajectory(self.field, x0, t, counted)[1]
        if self.counters is not None:
            self.counters.nfe_backward += counted.nfe
        return Hermite(points)


@dataclass(frozen=True)
class ContinuousAdjoint(GradientMethod):
    """Base of the continuous adjoints: ``forward`` solves and returns what backward keeps,
    ``backward`` turns the loss's gradients at ``t`` into those of x0 and the parameters."""

    reevaluates_field: ClassVar[bool] = True

    def solve(self, solver, field, x0, t, params=None, counters=None):
        check = self.name if params is None else None  # found, not given: backward checks nothing was missed
        params = differentiable(field, params)
        return _AdjointSolve.apply(self, Adjoint(field, solver, params, counters, check), t, x0, *params)

    @abstractmethod
    def forward(self, adj: Adjoint, x0: torch.Tensor, t: torch.Tensor):
        """(x at every time in ``t``, what backward needs), without a graph."""

    @abstractmethod
    def backward(self, adj: Adjoint, kept, t: torch.Tensor, grad_ys: torch.Tensor):
        """(dL/dx0, [dL/dθ for θ in adj.params]) from the loss's gradients ``grad_ys`` at ``t``."""


@dataclass(frozen=True)
class Backsolve(ContinuousAdjoint):
    """Re-integrate x backwards alongside the adjoint (module docstring); memory flat in the steps."""

    name: ClassVar[str] = "backsolve"

    def forward(self, adj, x0, t):
        ys = adj.solver.integrate(adj.field, x0, t, adj.counters)
        return ys, ys

    def backward(self, adj, ys, t, grad_ys):
        shape, n = grad_ys.shape[1:], grad_ys[0].numel()

        def augmented(s, z):  # z = [x, a, g]
            f, a_fx, a_fp = adj.vjp(s, z[:n].view(shape), z[n: 2 * n].view(shape))
            return torch.cat([f.reshape(-1), -a_fx.reshape(-1), -_flat(a_fp, z)])

        a, g = grad_ys[-1], _flat([torch.zeros_like(p) for p in adj.params], grad_ys)
        for i in reversed(range(t.numel() - 1)):
            z = torch.cat([ys[i + 1].reshape(-1), a.reshape(-1), g])  # x restarts from the forward's value
            z = adj.solver.integrate(augmented, z, torch.stack([t[i + 1], t[i]]))[-1]
            a, g = z[n: 2 * n].view(shape) + grad_ys[i], z[2 * n:]
        return a, _unflat(g, adj.params)


@dataclass(frozen=True)
class Interpolating(ContinuousAdjoint):
    """Read x(t) from forward re-integrations of checkpointed segments (module docstring)."""

    name: ClassVar[str] = "interpolating"

    def forward(self, adj, x0, t):
        k = adj.solver.steps_per_interval if adj.solver.fixed_step else 1
        segment_solver = adj.solver.with_steps(segment_steps(k))
        per_interval = k // segment_solver.steps_per_interval
        grid = refine(t, per_interval)
        checkpoints = segment_solver.integrate(adj.field, x0, grid, adj.counters)
        return checkpoints[::per_interval], (segment_solver, per_interval, grid, checkpoints)

    def backward(self, adj, kept, t, grad_ys):
        segment_solver, r, grid, checkpoints = kept
        shape, n, x_at = grad_ys.shape[1:], grad_ys[0].numel(), None

        def augmented(s, z):  # z = [a, g]
            _, a_fx, a_fp = adj.vjp(s, x_at(s), z[:n].view(shape))
            return torch.cat([-a_fx.reshape(-1), -_flat(a_fp, z)])

        a, g = grad_ys[-1], _flat([torch.zeros_like(p) for p in adj.params], grad_ys)
        for q in reversed(range(grid.numel() - 1)):
            x_at = adj.reintegrate(segment_solver, checkpoints[q], grid[q: q + 2])
            z = segment_solver.integrate(augmented, torch.cat([a.reshape(-1), g]), torch.stack([grid[q + 1], grid[q]]))[-1]
            a, g = z[:n].view(shape), z[n:]
            if q % r == 0:
                a = a + grad_ys[q // r]
        return a, _unflat(g, adj.params)


@dataclass(frozen=True)
class Quadrature(ContinuousAdjoint):
    """Integrate the adjoint alone; parameter gradients by quadrature over the stored forward solution."""

    name: ClassVar[str] = "quadrature"

    def forward(self, adj, x0, t):
        ys, points = adj.solver.trajectory(adj.field, x0, t, adj.counters)
        return ys, Hermite(points)

    def backward(self, adj, x_at, t, grad_ys):
        step_times = x_at.t.tolist()  # backward may synchronise: it is not the hot path

        def adjoint_field(s, a):
            return -adj.vjp(s, x_at(s), a, wrt_params=False)[1]

        a = grad_ys[-1]
        grads = [torch.zeros_like(p) for p in adj.params]
        for i in reversed(range(t.numel() - 1)):
            a_end, points = adj.solver.trajectory(adjoint_field, a, torch.stack([t[i + 1], t[i]]))
            self._quadrature(adj, x_at, Hermite(points), t[i].item(), t[i + 1].item(), step_times, grads)
            a = a_end[-1] + grad_ys[i]
        return a, grads

    @staticmethod
    def _quadrature(adj: Adjoint, x_at: Hermite, a_at: Hermite, lo: float, hi: float, step_times: list[float],
                    grads: list) -> None:
        """grads += ∫_lo^hi a^T ∂f/∂θ dt, by Gauss-Legendre on each forward step inside [lo, hi]."""
        if not adj.params:
            return
        lo, hi = min(lo, hi), max(lo, hi)
        breaks = [lo] + [s for s in step_times if lo < s < hi] + [hi]
        like = a_at.x
        for u0, u1 in zip(breaks[:-1], breaks[1:]):
            with torch.enable_grad():
                total = 0.0
                for node, weight in GAUSS_LEGENDRE_3:
                    s = torch.tensor(u0 + node * (u1 - u0), dtype=like.dtype, device=like.device)
                    f = adj.field(s, x_at(s))
                    total = total + weight * (u1 - u0) * (a_at(s) * f).sum()
                if adj.counters is not None:
                    adj.counters.nfe_backward += len(GAUSS_LEGENDRE_3)
                if not total.requires_grad:
                    continue
                parts = torch.autograd.grad(total, adj.params, allow_unused=True)
            for acc, part in zip(grads, parts):
                if part is not None:
                    acc.add_(part)


class _AdjointSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, method: ContinuousAdjoint, adj: Adjoint, t, x0, *params):
        with torch.no_grad():
            ys, ctx.kept = method.forward(adj, x0, t)
        ctx.method, ctx.adj = method, adj
        ctx.save_for_backward(t)
        return ys

    @staticmethod
    def backward(ctx, grad_ys):
        (t,) = ctx.saved_tensors
        with torch.no_grad():
            grad_x0, grad_params = ctx.method.backward(ctx.adj, ctx.kept, t, grad_ys.contiguous())
        return (None, None, None, grad_x0, *grad_params)
