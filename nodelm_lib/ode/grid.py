"""Time grids built with tensor operations only (no host synchronisation)."""

from __future__ import annotations

import torch


def check_times(t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.ndim != 1 or t.numel() < 2:
        raise ValueError(f"t must be a 1-D tensor of at least two output times, got {t!r}")


def step_times(t: torch.Tensor, steps_per_interval: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(t_m, dt_m)`` of every step of a fixed-step solve over the output times ``t``.

    Interval i is cut into k = ``steps_per_interval`` equal steps: dt_i = (t[i+1] - t[i]) / k
    and step j starts at t[i] + j dt_i. Every fixed-step solve steps on exactly these numbers
    (``Solver.step_times``), and so does anything that must reproduce one (a model's exported
    layers, the Lyapunov step maps, the spectra's depth grid).
    """
    check_times(t)
    grid = []
    for i in range(t.numel() - 1):
        dt = (t[i + 1] - t[i]) / steps_per_interval
        grid.extend((t[i] + j * dt, dt) for j in range(steps_per_interval))
    return grid


def refine(t: torch.Tensor, r: int) -> torch.Tensor:
    """``t`` with every interval split into ``r`` equal parts; ``refine(t, r)[::r]`` is ``t``."""
    if r == 1:
        return t
    frac = torch.arange(r, dtype=t.dtype, device=t.device) / r
    inner = t[:-1, None] + (t[1:] - t[:-1])[:, None] * frac
    return torch.cat([inner.reshape(-1), t[-1:]])
