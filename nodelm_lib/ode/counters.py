"""What a solve cost: function evaluations and accepted / rejected steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SolverCounters:
    """Counters filled in by ``odeint(..., counters=SolverCounters())``.

    ``nfe`` counts forward evaluations of the field; ``nfe_backward`` those made by a
    gradient method during backward (recomputation, adjoint solves, quadrature).
    Fixed-step solves count without touching the field (no Python side effects, so the
    solver still compiles to one graph). Counts are added to, never reset, by a solve.
    """

    nfe: int = 0
    n_accepted: int = 0
    n_rejected: int = 0
    nfe_backward: int = 0

    def reset(self) -> None:
        self.nfe = self.n_accepted = self.n_rejected = self.nfe_backward = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


SolveStats = SolverCounters  # the old name: "stats" in this project means multi-seed statistics (reporting/stats.py)
