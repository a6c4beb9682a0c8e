"""ODE integrators and gradient methods. Knows nothing of language models."""

from .solve import ADAPTIVE_METHODS, FIXED_STEP_METHODS, METHODS, SENSITIVITIES, Solver, find_params, odeint, rk_step
from .stats import SolveStats
from .tableaus import TABLEAUS, ButcherTableau

__all__ = ["odeint", "rk_step", "Solver", "SolveStats", "find_params", "TABLEAUS", "ButcherTableau",
           "FIXED_STEP_METHODS", "ADAPTIVE_METHODS", "METHODS", "SENSITIVITIES"]
