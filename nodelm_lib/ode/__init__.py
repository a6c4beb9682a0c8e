"""ODE integrators and gradient methods. Knows nothing of language models."""

from .solve import odeint, rk_step
from .tableaus import TABLEAUS, ButcherTableau

__all__ = ["odeint", "rk_step", "TABLEAUS", "ButcherTableau"]
