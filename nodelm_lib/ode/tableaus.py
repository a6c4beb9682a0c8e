"""Butcher tableaus of explicit Runge-Kutta methods.

A method with s stages advances x by one step of size h from time t:

    k_i = f(t + c_i h, x + h * sum_{j<i} a_ij k_j),    x_next = x + h * sum_i b_i k_i

Only the tableau differs between methods; ``solve.rk_step`` is the one step function.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ButcherTableau:
    name: str
    order: int
    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]  # row i holds a_i0 .. a_i(i-1)
    b: tuple[float, ...]

    def __post_init__(self) -> None:
        s = len(self.b)
        assert len(self.c) == s and len(self.a) == s, f"{self.name}: ragged tableau"
        assert all(len(row) == i for i, row in enumerate(self.a)), f"{self.name}: a must be strictly lower-triangular"
        assert abs(sum(self.b) - 1.0) < 1e-12, f"{self.name}: weights b must sum to 1"

    @property
    def n_stages(self) -> int:
        return len(self.b)


EULER = ButcherTableau("euler", 1, c=(0.0,), a=((),), b=(1.0,))
MIDPOINT = ButcherTableau("midpoint", 2, c=(0.0, 0.5), a=((), (0.5,)), b=(0.0, 1.0))
HEUN = ButcherTableau("heun", 2, c=(0.0, 1.0), a=((), (1.0,)), b=(0.5, 0.5))
RK4 = ButcherTableau(
    "rk4", 4,
    c=(0.0, 0.5, 0.5, 1.0),
    a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
)
RK38 = ButcherTableau(
    "rk38", 4,
    c=(0.0, 1 / 3, 2 / 3, 1.0),
    a=((), (1 / 3,), (-1 / 3, 1.0), (1.0, -1.0, 1.0)),
    b=(1 / 8, 3 / 8, 3 / 8, 1 / 8),
)

TABLEAUS = {tab.name: tab for tab in (EULER, MIDPOINT, HEUN, RK4, RK38)}
