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

import torch

from .grid import refine
from .stats import SolveStats

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


class _Method:
    """What the forward pass keeps and how backward uses it; one subclass per sensitivity."""

    def __init__(self, field, solver, params, stats: SolveStats | None):
        self.field, self.solver, self.params = field, solver, params
        self.stats = stats

    def vjp(self, s, x, a, wrt_params: bool = True):
        """f(s, x) and a^T ∂f/∂x, a^T ∂f/∂θ (zeros where f does not depend on them)."""
        if self.stats is not None:
            self.stats.nfe_backward += 1
        inputs = [x.detach().requires_grad_()] + (list(self.params) if wrt_params else [])
        with torch.enable_grad():
            f = self.field(s, inputs[0])
            grads = torch.autograd.grad(f, inputs, a, allow_unused=True) if f.requires_grad else [None] * len(inputs)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, inputs)]
        return f.detach(), grads[0], grads[1:]

    def reintegrate(self, solver, x0, t) -> Hermite:
        """Forward re-integration over ``t`` from x0, as an interpolant of x(t)."""
        points: list = []
        counted = SolveStats()
        with torch.no_grad():
            solver.integrate(self.field, x0, t, counted, trajectory=points)
        if self.stats is not None:
            self.stats.nfe_backward += counted.nfe
        return Hermite(points)


class _Backsolve(_Method):
    def forward(self, x0, t):
        self.ys = self.solver.integrate(self.field, x0, t, self.stats)
        return self.ys

    def backward(self, t, grad_ys):
        ys, shape, n = self.ys, grad_ys.shape[1:], grad_ys[0].numel()

        def augmented(s, z):  # z = [x, a, g]
            f, a_fx, a_fp = self.vjp(s, z[:n].view(shape), z[n: 2 * n].view(shape))
            return torch.cat([f.reshape(-1), -a_fx.reshape(-1), -_flat(a_fp, z)])

        a, g = grad_ys[-1], _flat([torch.zeros_like(p) for p in self.params], grad_ys)
        for i in reversed(range(t.numel() - 1)):
            z = torch.cat([ys[i + 1].reshape(-1), a.reshape(-1), g])  # x restarts from the forward's value
            z = self.solver.integrate(augmented, z, torch.stack([t[i + 1], t[i]]))[-1]
            a, g = z[n: 2 * n].view(shape) + grad_ys[i], z[2 * n:]
        return a, _unflat(g, self.params)


class _Interpolating(_Method):
    def forward(self, x0, t):
        k = self.solver.steps_per_interval if self.solver.fixed_step else 1
        self.segment_solver = self.solver.with_steps(segment_steps(k))
        self.per_interval = k // self.segment_solver.steps_per_interval
        self.grid = refine(t, self.per_interval)
        self.checkpoints = self.segment_solver.integrate(self.field, x0, self.grid, self.stats)
        return self.checkpoints[:: self.per_interval]

    def backward(self, t, grad_ys):
        shape, n, x_at = grad_ys.shape[1:], grad_ys[0].numel(), None

        def augmented(s, z):  # z = [a, g]
            _, a_fx, a_fp = self.vjp(s, x_at(s), z[:n].view(shape))
            return torch.cat([-a_fx.reshape(-1), -_flat(a_fp, z)])

        a, g = grad_ys[-1], _flat([torch.zeros_like(p) for p in self.params], grad_ys)
        grid, r = self.grid, self.per_interval
        for q in reversed(range(grid.numel() - 1)):
            x_at = self.reintegrate(self.segment_solver, self.checkpoints[q], grid[q: q + 2])
            z = self.segment_solver.integrate(augmented, torch.cat([a.reshape(-1), g]), torch.stack([grid[q + 1], grid[q]]))[-1]
            a, g = z[:n].view(shape), z[n:]
            if q % r == 0:
                a = a + grad_ys[q // r]
        return a, _unflat(g, self.params)


class _Quadrature(_Method):
    def forward(self, x0, t):
        points: list = []
        ys = self.solver.integrate(self.field, x0, t, self.stats, trajectory=points)
        self.x_at = Hermite(points)
        return ys

    def backward(self, t, grad_ys):
        x_at, step_times = self.x_at, self.x_at.t.tolist()  # backward may synchronise: it is not the hot path

        def adjoint_field(s, a):
            return -self.vjp(s, x_at(s), a, wrt_params=False)[1]

        a = grad_ys[-1]
        grads = [torch.zeros_like(p) for p in self.params]
        for i in reversed(range(t.numel() - 1)):
            points: list = []
            a_end = self.solver.integrate(adjoint_field, a, torch.stack([t[i + 1], t[i]]), trajectory=points)[-1]
            self._quadrature(Hermite(points), t[i].item(), t[i + 1].item(), step_times, grads)
            a = a_end + grad_ys[i]
        return a, grads

    def _quadrature(self, a_at: Hermite, lo: float, hi: float, step_times: list[float], grads: list) -> None:
        """grads += ∫_lo^hi a^T ∂f/∂θ dt, by Gauss-Legendre on each forward step inside [lo, hi]."""
        if not self.params:
            return
        lo, hi = min(lo, hi), max(lo, hi)
        breaks = [lo] + [s for s in step_times if lo < s < hi] + [hi]
        like = a_at.x
        for u0, u1 in zip(breaks[:-1], breaks[1:]):
            with torch.enable_grad():
                total = 0.0
                for node, weight in GAUSS_LEGENDRE_3:
                    s = torch.tensor(u0 + node * (u1 - u0), dtype=like.dtype, device=like.device)
                    f = self.field(s, self.x_at(s))
                    total = total + weight * (u1 - u0) * (a_at(s) * f).sum()
                if self.stats is not None:
                    self.stats.nfe_backward += len(GAUSS_LEGENDRE_3)
                if not total.requires_grad:
                    continue
                parts = torch.autograd.grad(total, self.params, allow_unused=True)
            for acc, part in zip(grads, parts):
                if part is not None:
                    acc.add_(part)


_METHODS = {"backsolve": _Backsolve, "interpolating": _Interpolating, "quadrature": _Quadrature}


class _AdjointSolve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, method: _Method, t, x0, *params):
        with torch.no_grad():
            ys = method.forward(x0, t)
        ctx.method = method
        ctx.save_for_backward(t)
        return ys

    @staticmethod
    def backward(ctx, grad_ys):
        (t,) = ctx.saved_tensors
        with torch.no_grad():
            grad_x0, grad_params = ctx.method.backward(t, grad_ys.contiguous())
        return (None, None, grad_x0, *grad_params)


def odeint_adjoint(field, x0: torch.Tensor, t: torch.Tensor, solver, sensitivity: str, params,
                   stats: SolveStats | None = None) -> torch.Tensor:
    """Solve with ``solver``; gradients w.r.t. x0 and ``params`` by the continuous adjoint ``sensitivity``."""
    params = tuple(p for p in params if p.requires_grad)
    method = _METHODS[sensitivity](field, solver, params, stats)
    return _AdjointSolve.apply(method, t, x0, *params)
