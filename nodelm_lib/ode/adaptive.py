"""Adaptive step sizes with an embedded Runge-Kutta pair, and dense output between steps.

Each step of size h from (t, x) computes the stages k_i of the tableau and two solutions,

    x_new = x + h * sum_i b_i k_i        (propagated, order p = tableau.order)
    x_low = x + h * sum_i b_low_i k_i    (embedded, lower order)

whose difference err = x_new - x_low estimates the local error. It is measured against the
tolerance elementwise and averaged (an RMS norm, as in Hairer, Norsett & Wanner):

    ratio = sqrt(mean((err / (atol + rtol * max(|x|, |x_new|)))^2))

The step is accepted when ratio <= 1. Either way the next step size follows from the local
error behaving like C h^p: h_next = h * clamp(0.9 * ratio^(-1/p), 0.2, 10), the 0.9 a safety
margin so that the next step is likely accepted.

Steps are placed where the error control wants them, not at the requested output times;
values at those times come from an interpolant over the accepted step that contains them
(the tableau's own continuous extension where it has one, ``dense_d``: dopri5's 4th-order one;
a cubic Hermite interpolant otherwise). Only the last step is shortened, to end exactly on t[-1].

The step-size decisions are host-side Python floats computed without gradient tracking, so
backpropagation goes through the operations of the accepted steps only (the "direct"
gradient of the discrete solve, with its step sequence held fixed).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .counters import SolverCounters
from .runge_kutta import rk_stages, weighted_sum
from .tableaus import ButcherTableau

Field = Callable[[Tensor, Tensor], Tensor]

SAFETY = 0.9  # aim a little below the step size that would just meet the tolerance
MIN_FACTOR = 0.2  # shrink a step by at most 5x at once ...
MAX_FACTOR = 10.0  # ... and grow it by at most 10x: the error model C h^p is only local


class Step(NamedTuple):
    """One attempted step from (t0, x0) to (t1, x1); ``k`` are its stages, k[0] = f(t0, x0), and
    ``error`` the embedded estimate of its local error."""

    t0: float
    t1: float
    x0: Tensor
    x1: Tensor
    k: list[Tensor]
    error: Tensor


def solve_adaptive(field: Field, x0: Tensor, t: Tensor, tableau: ButcherTableau, rtol: float, atol: float,
                   max_num_steps: int, counters: SolverCounters | None = None,
                   trajectory: list | None = None, stats: SolverCounters | None = None) -> Tensor:
    """Integrate dx/dt = field(t, x) from x(t[0]) = x0 with adaptive steps; x at every time in ``t``.

    Returns a tensor of shape ``(len(t), *x0.shape)``; row 0 is x0 itself. ``t`` must be strictly
    increasing or strictly decreasing (a decreasing ``t`` integrates backwards with negative steps).
    ``max_num_steps`` bounds the attempted steps, accepted and rejected; going past it raises
    ``RuntimeError``. ``counters`` (if given; ``stats`` is its old name) gain the field evaluations
    and accepted / rejected steps. ``trajectory`` (if a list is given) gains ``(t_j, x_j, f(t_j, x_j))`` at the start and
    after every accepted step, in integration order.
    """
    if tableau.b_low is None:
        raise ValueError(f"{tableau.name} has no embedded solution (b_low); adaptive steps need one")
    if rtol < 0 or atol < 0 or rtol + atol == 0:
        raise ValueError(f"rtol and atol must be non-negative and not both zero, got rtol={rtol}, atol={atol}")
    if max_num_steps < 1:
        raise ValueError(f"max_num_steps must be at least 1, got {max_num_steps}")
    counters = counters if counters is not None else stats
    times = _output_times(t)  # one host sync for all of them
    direction = 1.0 if times[-1] > times[0] else -1.0
    t_start, t_end = times[0], times[-1]

    n_evals = 0

    def f(s: Tensor, x: Tensor) -> Tensor:
        nonlocal n_evals
        n_evals += 1
        return field(s, x)

    n_accepted = n_rejected = 0
    try:
        f0 = f(_time(t_start, x0), x0)
        h = direction * _initial_step(f, t_start, t_end, x0, f0, tableau.order, rtol, atol)
        if trajectory is not None:
            trajectory.append((_time(t_start, x0), x0, f0))
        outputs = [x0]
        t_now, x, fx = t_start, x0, f0
        last_rejected = False
        h_tried = 0.0  # the size of the last attempted step, for the error message
        while len(outputs) < len(times):
            if n_accepted + n_rejected >= max_num_steps:
                raise RuntimeError(
                    f"{tableau.name} exceeded max_num_steps={max_num_steps} at t={t_now:.6g} of "
                    f"[{t_start:.6g}, {t_end:.6g}] (last step size {abs(h_tried):.2g}); "
                    f"loosen rtol/atol or raise max_num_steps")
            t_next = _step_end(t_now, h, t_end, direction)
            step = _attempt(f, tableau, t_now, t_next, x, fx)
            h_tried = t_next - t_now
            ratio = _error_ratio(step, rtol, atol)
            accepted = ratio <= 1.0  # False for a NaN ratio too
            h = h_tried * _step_factor(ratio, tableau.order, grow=accepted and not last_rejected)
            last_rejected = not accepted
            if not accepted:
                n_rejected += 1  # the step's tensors are dropped here: nothing of it reaches the result
                continue
            n_accepted += 1
            # FSAL: the last stage was evaluated at (t_next, x1) already. Otherwise evaluate it
            # once; it serves the interpolant, the trajectory and the next step's first stage.
            f1 = step.k[-1] if tableau.fsal else f(_time(t_next, x0), step.x1)
            outputs += _dense_outputs(step, f1, tableau, times[len(outputs):], direction)
            t_now, x, fx = t_next, step.x1, f1
            if trajectory is not None:
                trajectory.append((_time(t_now, x0), x, fx))
    finally:
        if counters is not None:
            counters.nfe += n_evals
            counters.n_accepted += n_accepted
            counters.n_rejected += n_rejected
    return torch.stack(outputs)


def _output_times(t: Tensor) -> list[float]:
    if not isinstance(t, Tensor) or t.ndim != 1 or t.numel() < 2:
        raise ValueError(f"t must be a 1-D tensor of at least two output times, got {t!r}")
    times = t.detach().tolist()
    steps = [b - a for a, b in zip(times, times[1:])]
    if not (all(d > 0 for d in steps) or all(d < 0 for d in steps)):
        raise ValueError(f"t must be strictly increasing or strictly decreasing, got {times}")
    return times


def _time(value: float, like: Tensor) -> Tensor:
    """A time as a 0-d tensor in ``like``'s dtype, for the field.

    torch.full fills on the device (no host-to-device copy). The step-size arithmetic itself
    stays in Python floats, so that steps land exactly on the output times.
    """
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _rms(x: Tensor) -> float:
    """sqrt(mean(x^2)) over all elements, as a host float."""
    return x.pow(2).mean().sqrt().item()


@torch.no_grad()
def _initial_step(f, t0: float, t_end: float, x0: Tensor, f0: Tensor, order: int, rtol: float, atol: float) -> float:
    """A first step size |h| (Hairer, Norsett & Wanner, Solving ODEs I, II.4), one evaluation of f.

    With sc = atol + rtol |x0|, d0 = ||x0 / sc|| and d1 = ||f0 / sc||: h0 = 0.01 d0 / d1 makes the
    Euler increment h0 f0 about 1% of x0. One explicit Euler step of h0 estimates the second
    derivative, d2 = ||(f(t0 + h0, x0 + h0 f0) - f0) / sc|| / h0, and h1 = (0.01 / max(d1, d2))^(1/(p+1))
    makes the local error C h^(p+1) about 0.01. The step is min(100 h0, h1), no longer than the interval.
    """
    span = abs(t_end - t0)
    direction = math.copysign(1.0, t_end - t0)
    scale = atol + rtol * x0.abs()
    d0, d1 = _rms(x0 / scale), _rms(f0 / scale)
    h0 = 1e-6 if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    h0 = min(h0, span)  # do not probe the field beyond the interval
    f1 = f(_time(t0 + direction * h0, x0), x0 + (direction * h0) * f0)
    d2 = _rms((f1 - f0) / scale) / h0
    if max(d1, d2) <= 1e-15:  # f is (numerically) zero and constant: any step is fine
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / max(d1, d2)) ** (1.0 / (order + 1))
    return min(100 * h0, h1, span)


def _step_end(t_now: float, h: float, t_end: float, direction: float) -> float:
    """Where a step of size h from t_now ends: t_end exactly if it would reach (or nearly reach) it.

    Stretching by up to 1% (as DOPRI5 does) avoids following a full step with a sliver of one.
    """
    t_next = t_now + h
    if (t_now + 1.01 * h - t_end) * direction >= 0:
        return t_end
    if t_next == t_now:
        raise RuntimeError(f"step size underflow at t={t_now:.6g} (step size {abs(h):.2g}); "
                           f"the problem may be stiff or singular there")
    return t_next


def _attempt(f, tableau: ButcherTableau, t0: float, t1: float, x0: Tensor, f0: Tensor) -> Step:
    """One step from (t0, x0) to t1 (``runge_kutta.rk_stages``); k[0] = f0 is reused, and
    stages with c_i = 1 are evaluated at t1 itself."""
    s = rk_stages(f, tableau, _time(t0, x0), _time(t1 - t0, x0), x0, k1=f0, t1=_time(t1, x0), error=True)
    return Step(t0, t1, x0, s.x1, s.k, s.error)


@torch.no_grad()
def _error_ratio(step: Step, rtol: float, atol: float) -> float:
    """RMS of err / (atol + rtol max(|x0|, |x1|)), err = h sum_i (b_i - b_low_i) k_i."""
    scale = atol + rtol * torch.maximum(step.x0.abs(), step.x1.abs())
    return _rms(step.error / scale)


def _step_factor(ratio: float, order: int, grow: bool) -> float:
    """h_next / h = clamp(0.9 ratio^(-1/p), 0.2, 10); at most 1 when ``grow`` is False.

    ``grow`` is False for a rejected step and for the step after one: having just failed, do
    not trust the error model to grow the step again at once (Hairer's DOPRI5 does the same).
    """
    if not math.isfinite(ratio):  # NaN / inf in the error estimate: shrink as much as allowed
        return MIN_FACTOR
    factor = MAX_FACTOR if ratio == 0.0 else SAFETY * ratio ** (-1.0 / order)
    factor = min(MAX_FACTOR, max(MIN_FACTOR, factor))
    return factor if grow else min(factor, 1.0)


def _dense_outputs(step: Step, f1: Tensor, tableau: ButcherTableau, pending: list[float],
                   direction: float) -> list[Tensor]:
    """x at the pending output times that fall within the accepted step (t0, t1]."""
    out: list[Tensor] = []
    terms = None
    for t_out in pending:
        if (t_out - step.t1) * direction > 0:
            break
        if t_out == step.t1:
            out.append(step.x1)  # exact step point: no interpolation error
            continue
        if terms is None:  # only build the interpolant for steps that need it
            terms = _interpolant_terms(step, f1, tableau)
        out.append(_interpolate(step.x0, terms, (t_out - step.t0) / (step.t1 - step.t0)))
    return out


def _interpolant_terms(step: Step, f1: Tensor, tableau: ButcherTableau) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The coefficients of x(t0 + theta h), written (as in Hairer's DOPRI5) as

        x0 + theta (dx + (1 - theta) (B + theta (C + (1 - theta) D)))
        dx = x1 - x0,  B = h f0 - dx,  C = dx - h f1 - B.

    Without D this is the cubic Hermite interpolant: it matches x and f at both ends
    (the theta-derivative is h f0 at 0 and h f1 at 1). A tableau with a continuous extension
    (``dense_d``: dopri5's of 4th order) adds D = h sum_i d_i k_i, which keeps those four conditions.
    """
    h = step.t1 - step.t0
    dx = step.x1 - step.x0
    B = h * step.k[0] - dx
    C = dx - h * f1 - B
    D = None if tableau.dense_d is None else h * weighted_sum(tableau.dense_d, step.k, fused=False)
    return dx, B, C, D


def _interpolate(x0: Tensor, terms, theta: float) -> Tensor:
    dx, B, C, D = terms
    inner = C if D is None else C + (1 - theta) * D
    return x0 + theta * (dx + (1 - theta) * (B + theta * inner))
