"""Old home of the solver counters: ``SolveStats`` is ``counters.SolverCounters``."""

from .counters import SolveStats, SolverCounters

__all__ = ["SolveStats", "SolverCounters"]
