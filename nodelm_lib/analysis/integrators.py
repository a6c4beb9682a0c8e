"""Solver and gradient-method study (notebook 05): accuracy per evaluation, cost per sensitivity.

Two test problems: a linear ODE dx/dt = A x with the exact solution ``matrix_exp(A t) x0``,
and the hybrid model's ODE-block field (attention + MLP) on random activations, whose
reference is rk4 at many steps. Three measurements:

- ``error_vs_nfe``: relative error at t = 1 against the number of field evaluations, for each
  fixed-step method over a range of step counts and each adaptive method over tolerances;
- ``sensitivity_costs``: forward + backward time, peak memory and the gradient's relative
  error against ``direct`` (through the same solve) per sensitivity and number of steps;
- ``summary``: the docs' table, one row per sensitivity at the largest step count.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator
import pandas as pd
import torch

from nodelm_lib.config import ModelConfig
from nodelm_lib.models.common import ODEBlock
from nodelm_lib.models.hybrid import FAMILY as HYBRID, HybridField
from nodelm_lib.ode import ADAPTIVE_METHODS, SolverCounters, odeint
from nodelm_lib.reporting.style import use_style
from nodelm_lib.training.profiling import peak_memory_mb


@dataclass
class Problem:
    """An initial value problem on t in [0, 1]: field, x0, the field's parameters, x(1) if known."""

    name: str
    field: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    x0: torch.Tensor
    params: tuple[torch.Tensor, ...]
    exact_final: torch.Tensor | None = None


def linear_problem(dim: int = 8, seed: int = 0) -> Problem:
    """dx/dt = A x in float64, A with entries N(0, 1/dim) (eigenvalues of order one)."""
    g = torch.Generator().manual_seed(seed)
    A = (torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)).requires_grad_()
    x0 = torch.randn(dim, generator=g, dtype=torch.float64)
    exact = torch.linalg.matrix_exp(A.detach()) @ x0
    return Problem("linear", lambda t, x: A @ x, x0, (A,), exact)


def hybrid_problem(d_model: int = 64, n_heads: int = 4, batch: int = 4, seq_len: int = 32, seed: int = 0,
                   dtype: torch.dtype = torch.float32, scale: float = 1.0, device: str = "cpu") -> Problem:
    """The hybrid's ODE-block field on random activations (B, T, D).

    ``scale`` sets the field's output scale alpha; the model starts at 0.1, where the flow is
    nearly the identity and every method is accurate. 1.0 gives dynamics worth measuring.
    """
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=256, d_model=d_model, n_heads=n_heads, control_dim=0, ode_scale_init=scale)
    field = HybridField(cfg).to(device=device, dtype=dtype)
    x0 = torch.randn(batch, seq_len, d_model, dtype=dtype).to(device)
    return Problem(HYBRID.name, field, x0, tuple(field.parameters()))


def _unit_interval(x: torch.Tensor) -> torch.Tensor:
    return ODEBlock.times(x.dtype, x.device)  # [0, 1], as the models' ODE blocks solve


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def error_vs_nfe(problem: Problem, fixed_methods, step_counts, adaptive_methods=(), tolerances=(),
                 reference_steps: int = 512) -> pd.DataFrame:
    """Relative error of x(1) and the field evaluations it took, per method and setting."""
    t = _unit_interval(problem.x0)
    with torch.no_grad():
        ref = problem.exact_final
        if ref is None:
            ref = odeint(problem.field, problem.x0, t, method="rk4", steps_per_interval=reference_steps)[-1]
        rows = []
        for method in fixed_methods:
            for n in step_counts:
                counters = SolverCounters()
                y = odeint(problem.field, problem.x0, t, method=method, steps_per_interval=n, counters=counters)[-1]
                rows.append({"problem": problem.name, "method": method, "kind": "fixed", "n_steps": n,
                             "tolerance": math.nan, "nfe": counters.nfe, "error": _relative(y, ref)})
        for method in adaptive_methods:
            for tol in tolerances:
                counters = SolverCounters()
                y = odeint(problem.field, problem.x0, t, method=method, rtol=tol, atol=tol, max_num_steps=100_000,
                           counters=counters)[-1]
                rows.append({"problem": problem.name, "method": method, "kind": "adaptive", "n_steps": counters.n_accepted,
                             "tolerance": tol, "nfe": counters.nfe, "error": _relative(y, ref)})
    return pd.DataFrame(rows)


def observed_orders(accuracy: pd.DataFrame) -> pd.DataFrame:
    """Per problem and fixed-step method: the slope -d log(error) / d log(NFE) between its two
    finest settings (the order p for a method of order p) and the finest error reached."""
    rows = []
    fixed = accuracy[accuracy.kind == "fixed"]
    for (problem, method), g in fixed.groupby(["problem", "method"], sort=False):
        g = g.sort_values("nfe")
        (n0, e0), (n1, e1) = g[["nfe", "error"]].iloc[-2], g[["nfe", "error"]].iloc[-1]
        rows.append({"problem": problem, "method": method, "observed_order": math.log(e0 / e1) / math.log(n1 / n0),
                     "nfe": int(n1), "error": e1})
    return pd.DataFrame(rows)


def _forward_backward(problem: Problem, method: str, sensitivity: str, n: int, counters: SolverCounters | None = None):
    x0 = problem.x0.detach().requires_grad_()
    y = odeint(problem.field, x0, _unit_interval(x0), method=method, sensitivity=sensitivity, steps_per_interval=n,
               params=problem.params, counters=counters)
    loss = y[-1].square().mean()
    grads = torch.autograd.grad(loss, (x0, *problem.params))
    return torch.cat([g.reshape(-1) for g in grads])


def method_for(sensitivity: str, method: str) -> str:
    """``reversible`` needs reversible Heun; every other sensitivity uses ``method``."""
    return "reversible_heun" if sensitivity == "reversible" else method


def sensitivity_costs(problem: Problem, sensitivities, step_counts, method: str = "rk4", repeats: int = 3,
                      progress: Callable = lambda it, **kw: it) -> pd.DataFrame:
    """Per sensitivity and number of steps: fwd+bwd seconds (median of ``repeats``), peak memory
    above the starting level (MiB), evaluations, and the gradient's relative error against
    ``direct`` through the same solve (same method and steps)."""
    cases = [(sens, n) for n in step_counts for sens in sensitivities]
    rows = []
    reference: dict[tuple[str, int], torch.Tensor] = {}
    # time everything first: measuring peak memory changes the allocator's settings (see profiling)
    for sens, n in progress(cases, desc=f"{problem.name}: time"):
        m = method_for(sens, method)
        if (m, n) not in reference:
            reference[(m, n)] = _forward_backward(problem, m, "direct", n)
        counters = SolverCounters()
        grad = _forward_backward(problem, m, sens, n, counters)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            _forward_backward(problem, m, sens, n)
            seconds.append(time.perf_counter() - start)
        rows.append({"problem": problem.name, "sensitivity": sens, "method": m, "n_steps": n,
                     "time_s": statistics.median(seconds), "nfe": counters.nfe, "nfe_backward": counters.nfe_backward,
                     "grad_rel_error": _relative(grad, reference[(m, n)])})
    device = problem.x0.device
    for row in progress(rows, desc=f"{problem.name}: memory"):
        row["peak_mb"] = peak_memory_mb(lambda: _forward_backward(problem, row["method"], row["sensitivity"],
                                                                   row["n_steps"]), device)[0]
    return pd.DataFrame(rows)


def summary(costs: pd.DataFrame, problem: str = "hybrid") -> pd.DataFrame:
    """One row per sensitivity at the largest step count, with peak memory relative to the smallest."""
    df = costs[costs.problem == problem]
    lo, hi = df.n_steps.min(), df.n_steps.max()
    rows = []
    for sens, g in df.groupby("sensitivity", sort=False):
        first, last = g[g.n_steps == lo].iloc[0], g[g.n_steps == hi].iloc[0]
        # below 1 MiB the measurement is mostly page granularity: no ratio
        ratio = last.peak_mb / first.peak_mb if first.peak_mb >= 1.0 else math.nan
        rows.append({"sensitivity": sens, "method": last.method, "n_steps": int(hi),
                     "fwd_bwd_s": round(float(last.time_s), 4), "peak_mb": round(float(last.peak_mb), 1),
                     f"peak_ratio_{hi}_over_{lo}": round(float(ratio), 3),
                     "nfe": int(last.nfe), "nfe_backward": int(last.nfe_backward),
                     "grad_rel_error": float(f"{last.grad_rel_error:.3g}")})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ figures


def plot_error_vs_nfe(accuracy: pd.DataFrame) -> plt.Figure:
    use_style()
    problems = list(dict.fromkeys(accuracy.problem))
    fig, axes = plt.subplots(1, len(problems), figsize=(5.5 * len(problems), 4), squeeze=False)
    for ax, name in zip(axes[0], problems):
        for method, g in accuracy[accuracy.problem == name].groupby("method", sort=False):
            g = g.sort_values("nfe")
            style = "--" if method in ADAPTIVE_METHODS else "-"
            ax.loglog(g.nfe, g.error.clip(lower=1e-17), style, marker="o", ms=3, label=method)
        ax.set(title=f"{name}: error at t = 1", xlabel="field evaluations", ylabel="relative error")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_costs(costs: pd.DataFrame, problem: str = "hybrid") -> plt.Figure:
    use_style()
    df = costs[costs.problem == problem]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for sens, g in df.groupby("sensitivity", sort=False):
        g = g.sort_values("n_steps")
        ax_t.loglog(g.n_steps, g.time_s, marker="o", ms=3, label=sens)
        ax_m.semilogx(g.n_steps, g.peak_mb, marker="o", ms=3, label=sens)
    ax_t.set(title=f"{problem}: forward + backward time", xlabel="steps", ylabel="seconds")
    ax_m.set(title=f"{problem}: peak memory above start", xlabel="steps", ylabel="MiB")
    steps = sorted(df.n_steps.unique())
    for ax in (ax_t, ax_m):
        ax.xaxis.set_minor_locator(NullLocator())  # log-axis minor labels would collide with the step counts
        ax.set_xticks(steps, labels=[str(n) for n in steps])
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_gradient_error(costs: pd.DataFrame) -> plt.Figure:
    use_style()
    problems = list(dict.fromkeys(costs.problem))
    fig, axes = plt.subplots(1, len(problems), figsize=(5.5 * len(problems), 4), squeeze=False)
    for ax, name in zip(axes[0], problems):
        df = costs[(costs.problem == name) & (costs.sensitivity != "direct")]
        for sens, g in df.groupby("sensitivity", sort=False):
            g = g.sort_values("n_steps")
            ax.loglog(g.n_steps, g.grad_rel_error.clip(lower=1e-17), marker="o", ms=3, label=sens)
        ax.set(title=f"{name}: gradient vs direct (floored at 1e-17)", xlabel="steps", ylabel="relative error")
        steps = sorted(df.n_steps.unique())
        ax.xaxis.set_minor_locator(NullLocator())  # log-axis minor labels collided with the step counts
        ax.set_xticks(steps, labels=[str(n) for n in steps])
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
