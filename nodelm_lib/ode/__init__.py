"""ODE integrators and gradient methods. Knows nothing of language models.

    solvers.py      Solver: a method and its step options (step_times, march, integrate, trajectory)
    scheme.py       Scheme, ReversibleScheme: the fixed-step scheme, declared (init, step, value, nfe; unstep)
    tableaus.py     Butcher tableaus;  runge_kutta.py  the one RK stage function
    adaptive.py     step-size control and dense output;  reversible.py  reversible Heun
    gradients.py    GradientMethod, Direct, Checkpoint, Reversible;  adjoint.py  the continuous adjoints
    solve.py        odeint(field, x0, t, method=..., sensitivity=...)
"""

from .adjoint import Backsolve, Interpolating, Quadrature
from .counters import SolverCounters, SolveStats
from .gradients import Checkpoint, Direct, GradientMethod, Reversible
from .runge_kutta import rk_stages, rk_step
from .scheme import ReversibleScheme, Scheme
from .gradients import find_params
from .solve import GRADIENT_METHODS, SENSITIVITIES, gradient_method, odeint
from .solvers import ADAPTIVE_METHODS, FIXED_STEP_METHODS, METHODS, Solver
from .tableaus import TABLEAUS, ButcherTableau

__all__ = ["odeint", "Solver", "Scheme", "ReversibleScheme", "rk_step", "rk_stages", "SolverCounters", "SolveStats",
           "find_params",
           "GradientMethod", "Direct", "Checkpoint", "Backsolve", "Interpolating", "Quadrature", "Reversible",
           "gradient_method", "GRADIENT_METHODS", "SENSITIVITIES", "TABLEAUS", "ButcherTableau",
           "FIXED_STEP_METHODS", "ADAPTIVE_METHODS", "METHODS"]
