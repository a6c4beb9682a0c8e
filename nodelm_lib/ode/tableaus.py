"""Butcher tableaus of explicit Runge-Kutta methods.

A method with s stages advances x by one step of size h from time t:

    k_i = f(t + c_i h, x + h * sum_{j<i} a_ij k_j),    x_next = x + h * sum_i b_i k_i

Only the tableau differs between methods; ``runge_kutta.rk_stages`` is the one step function.

An embedded pair adds a second set of weights ``b_low`` of lower order over the same stages,
giving a second solution for free. Their difference

    err = h * sum_i (b_i - b_low_i) k_i

estimates the local error of the step; ``adaptive.solve_adaptive`` sizes steps with it. A pair
may also carry the weights ``dense_d`` of a continuous extension, which dense output between its
steps then uses (dopri5); without them dense output is a cubic Hermite interpolant.
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
    b_low: tuple[float, ...] | None = None  # embedded lower-order weights (adaptive methods only)
    # weights d_i of the stages in the dense-output term that a cubic Hermite interpolant lacks
    # (``adaptive._interpolant_terms``); a method without them interpolates by cubic Hermite
    dense_d: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        s = len(self.b)
        assert len(self.c) == s and len(self.a) == s, f"{self.name}: ragged tableau"
        assert all(len(row) == i for i, row in enumerate(self.a)), f"{self.name}: a must be strictly lower-triangular"
        assert abs(sum(self.b) - 1.0) < 1e-12, f"{self.name}: weights b must sum to 1"
        if self.b_low is not None:
            assert len(self.b_low) == s, f"{self.name}: b_low must have one weight per stage"
            assert abs(sum(self.b_low) - 1.0) < 1e-12, f"{self.name}: weights b_low must sum to 1"
        if self.dense_d is not None:
            assert len(self.dense_d) == s, f"{self.name}: dense_d must have one weight per stage"

    @property
    def n_stages(self) -> int:
        return len(self.b)

    @property
    def fsal(self) -> bool:
        """First Same As Last: the last stage is f(t + h, x_next).

        True when the last row of ``a`` is ``b`` (so the last stage is evaluated at x_next,
        which it does not itself contribute to: b_s = 0) and c_s = 1. The next step's first
        stage is then already known, saving one evaluation per step.
        """
        return (self.n_stages > 1 and self.c[-1] == 1.0 and self.b[-1] == 0.0
                and tuple(self.a[-1]) == tuple(self.b[:-1]))


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


# Embedded pairs for adaptive step sizes. ``order`` is that of the propagated solution ``b``;
# the error estimate is of order ``order`` in h as well for these pairs, which is why the
# step-size controller uses the exponent 1 / order.

DOPRI5 = ButcherTableau(
    "dopri5", 5,
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0),
    a=(
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
        (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
    ),
    b=(35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0),
    b_low=(5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40),
    # Dormand-Prince's 4th-order continuous extension (Hairer, Norsett & Wanner, Solving ODEs I,
    # II.6; the ``contd5`` of their DOPRI5 code)
    dense_d=(-12715105075 / 11282082432, 0.0, 87487479700 / 32700410799, -10690763975 / 1880347072,
             701980252875 / 199316789632, -1453857185 / 822651844, 69997945 / 29380423),
)

BOSH3 = ButcherTableau(
    "bosh3", 3,
    c=(0.0, 1 / 2, 3 / 4, 1.0),
    a=((), (1 / 2,), (0.0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
    b=(2 / 9, 1 / 3, 4 / 9, 0.0),
    b_low=(7 / 24, 1 / 4, 1 / 3, 1 / 8),
)

# Heun's method with explicit Euler embedded.
ADAPTIVE_HEUN = ButcherTableau(
    "adaptive_heun", 2,
    c=(0.0, 1.0),
    a=((), (1.0,)),
    b=(1 / 2, 1 / 2),
    b_low=(1.0, 0.0),
)

# Runge-Kutta-Fehlberg 1(2). Fehlberg propagates the 1st-order solution (then the pair is FSAL);
# like torchdiffeq we propagate the 2nd-order one and use the 1st-order one for the estimate.
FEHLBERG2 = ButcherTableau(
    "fehlberg2", 2,
    c=(0.0, 1 / 2, 1.0),
    a=((), (1 / 2,), (1 / 256, 255 / 256)),
    b=(1 / 512, 255 / 256, 1 / 512),
    b_low=(1 / 256, 255 / 256, 0.0),
)

ADAPTIVE_TABLEAUS = {tab.name: tab for tab in (DOPRI5, BOSH3, ADAPTIVE_HEUN, FEHLBERG2)}
