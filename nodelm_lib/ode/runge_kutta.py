r"""One explicit Runge-Kutta step, for every tableau: the stage loop of the whole package.

A method with s stages advances x by a step of size h from time t0 (``tableaus.py``):

    k_i = f(t0 + c_i h, x + h sum_{j<i} a_ij k_j),    x1 = x + h sum_i b_i k_i

An embedded pair adds weights b_low over the same stages; the difference of the two
solutions, err = h sum_i (b_i - b_low_i) k_i, estimates the local error (``adaptive.py``).
Fixed-step solves (``solvers.py``) and adaptive ones both step with ``rk_stages``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .tableaus import ButcherTableau

Field = Callable[[Tensor, Tensor], Tensor]


class RKStep(NamedTuple):
    """One step: the new state, the stages (k[0] = f(t0, x)), and the embedded error if asked for."""

    x1: Tensor
    k: list[Tensor]
    error: Tensor | None


def rk_stages(field: Field, tableau: ButcherTableau, t0: Tensor, dt: Tensor, x: Tensor, k1: Tensor | None = None,
              t1: Tensor | None = None, error: bool = False) -> RKStep:
    """One explicit Runge-Kutta step of size ``dt`` (a 0-d tensor) from ``(t0, x)``.

    ``k1 = field(t0, x)`` may be passed when the caller already has it (every tableau here has
    c_1 = 0). ``t1``, if given, is where the step ends exactly (an adaptive step ending on an
    output time): stages with c_i = 1 are evaluated there rather than at t0 + dt, which may be
    an ulp off. ``error=True`` adds the embedded error estimate (the tableau needs ``b_low``).

    Each stage input is one fused ``x + (a_ij dt) k_j`` kernel per nonzero a_ij. For a First
    Same As Last tableau the last stage's input is x1 itself, formed once, so that the last
    stage is exactly f(t1, x1), which the next step reuses.
    """
    k: list[Tensor] = []
    x1 = None
    last = tableau.n_stages - 1
    for i, (c_i, a_i) in enumerate(zip(tableau.c, tableau.a)):
        if i == 0 and k1 is not None:
            k.append(k1)
            continue
        if i == last and tableau.fsal:
            x1 = x_i = torch.addcmul(x, weighted_sum(tableau.b, k), dt)
        else:
            x_i = x
            for a_ij, k_j in zip(a_i, k):
                if a_ij != 0.0:
                    x_i = torch.addcmul(x_i, k_j, dt, value=a_ij)
        if t1 is not None and c_i == 1.0:
            t_i = t1
        else:  # t0 itself at c_i = 0 (t0 + 0 dt is t0: two tensor ops saved per step)
            t_i = t0 if c_i == 0.0 else t0 + c_i * dt
        k.append(field(t_i, x_i))
    if x1 is None:
        x1 = torch.addcmul(x, weighted_sum(tableau.b, k), dt)
    return RKStep(x1, k, _embedded_error(tableau, dt, k) if error else None)


def rk_step(field: Field, tableau: ButcherTableau, t0: Tensor, dt: Tensor, x: Tensor,
            k1: Tensor | None = None) -> Tensor:
    """x after one explicit Runge-Kutta step of size ``dt`` from ``(t0, x)`` (``rk_stages``)."""
    return rk_stages(field, tableau, t0, dt, x, k1).x1


def weighted_sum(weights, k: list[Tensor], fused: bool = True) -> Tensor:
    """sum_i w_i k_i, skipping zero weights (e.g. dopri5's b_2): the one weighted sum of stages.

    One buffer accumulates the weighted stages in place (autograd saves none of it). ``fused``
    adds each term as one ``add_(k_i, alpha=w_i)`` kernel, which may round w_i k_i + total once
    (a fused multiply-add); ``fused=False`` rounds w_i k_i first and then the sum. The two differ
    in the last bits: steps and error estimates sum fused, dense output (``adaptive.py``) unfused,
    each as it always has, so that solutions stay bit for bit what they were.

    A single weight of 1 (Euler's b, the midpoint rule's) returns its stage itself: k * 1 is k,
    bit for bit, and its copy would cost a pass over the state per step. Callers only read it.
    """
    terms = [(w_i, k_i) for w_i, k_i in zip(weights, k) if w_i != 0.0]
    if len(terms) == 1 and terms[0][0] == 1.0:
        return terms[0][1]
    total = None
    for w_i, k_i in terms:
        if total is None:
            total = k_i * w_i
        elif fused:
            total.add_(k_i, alpha=w_i)
        else:
            total.add_(k_i * w_i)
    return total


@torch.no_grad()
def _embedded_error(tableau: ButcherTableau, dt: Tensor, k: list[Tensor]) -> Tensor:
    """err = dt sum_i (b_i - b_low_i) k_i. It steers step sizes only, so it takes no gradient."""
    if tableau.b_low is None:
        raise ValueError(f"{tableau.name} has no embedded solution (b_low) to estimate the error with")
    return weighted_sum([b - b_low for b, b_low in zip(tableau.b, tableau.b_low)], k) * dt
