"""Random solver grids for training: a model that is trained on one grid learns that grid's map
(a 4-step Euler model is a 4-layer network), one trained on grids drawn afresh each step must work
on all of them, which is what makes its depth a solver setting at inference.

A grid is drawn from a ``GridDistribution``: the number of steps uniform in
``[min_steps, max_steps]``; optionally the end time uniform in ``[1 - end_jitter, 1 + end_jitter]``
(STEER, Ghosh et al. 2020: a random end time regularises the flow); optionally the interior step
points placed at sorted uniform random times instead of evenly. The draw depends only on the
generator given, so a run draws step k's grid from (run seed, k) and resumes bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

PLACEMENTS = ("uniform", "random")


@dataclass(frozen=True)
class GridDistribution:
    """Where training grids come from (see the module docstring). ``min_steps = max_steps`` with
    no jitter and uniform placement is one fixed grid."""

    min_steps: int
    max_steps: int
    end_jitter: float = 0.0
    placement: str = "uniform"

    def __post_init__(self) -> None:
        if not (isinstance(self.min_steps, int) and 1 <= self.min_steps <= self.max_steps):
            raise ValueError(f"min_steps={self.min_steps!r}, max_steps={self.max_steps!r} is not a valid range of "
                             "step counts; need 1 <= min_steps <= max_steps")
        if not 0.0 <= self.end_jitter < 1.0:
            raise ValueError(f"end_jitter={self.end_jitter!r} is not valid; it must be in [0, 1) (the end time "
                             "is drawn from [1 - end_jitter, 1 + end_jitter])")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r} is not valid; choose one of {', '.join(map(repr, PLACEMENTS))}")

    def draw(self, generator: torch.Generator, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """One grid: the times ``t_0 = 0 < t_1 < ... < t_n = T`` of an n-step solve, with n, T and
        the interior points drawn from ``generator`` (on the CPU, so the same on every device)."""
        n = int(torch.randint(self.min_steps, self.max_steps + 1, (1,), generator=generator))
        end = 1.0 + self.end_jitter * (2.0 * float(torch.rand((), generator=generator, dtype=torch.float64)) - 1.0)
        if self.placement == "uniform" or n == 1:
            grid = torch.linspace(0.0, end, n + 1, dtype=torch.float64)
        else:  # sorted uniform interior points: a step may be short or long, never of length zero
            inner = torch.sort(torch.rand(n - 1, generator=generator, dtype=torch.float64)).values * end
            grid = torch.cat([torch.zeros(1, dtype=torch.float64), inner, torch.tensor([end], dtype=torch.float64)])
            if not bool((grid.diff() > 0).all()):  # ties have probability ~0 but would be steps of length 0
                grid = torch.linspace(0.0, end, n + 1, dtype=torch.float64)
        return grid.to(dtype=dtype, device=device)

    @property
    def mean_steps(self) -> float:
        return (self.min_steps + self.max_steps) / 2


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A generator for the grid of training step ``step`` of a run with seed ``seed`` (``stream``
    tells apart several ODE blocks of one model): a function of the three numbers only, so a
    resumed run, and every rank of a data-parallel one, draws the same grids."""
    (derived,) = np.random.SeedSequence([seed, step, stream, 0x6772_6964]).generate_state(1)  # 'grid'
    return torch.Generator().manual_seed(int(derived))
