"""The divergence rule: which finished runs count as failed trainings, decided the same way in
every notebook that declares it in its params.

A run *diverged* when its final validation loss

1. is not finite (NaN or infinite: a failed or exploded run), or
2. lies above the validation loss of a declared n-gram model (``ceiling``, the bigram by default):
   a trained model that ends worse than counting pairs of tokens has not learned, or
3. lies more than ``seed_margin`` nats above the median of the other seeds' final validation
   losses in its group (an arm, or an arm at one width: a *cell*), where the group has at least
   ``MIN_OTHER_SEEDS`` other seeds. Seeds of one group differ in their initialisation and data
   order only, so a run far above its siblings stalled or blew up where they did not (a run that
   stays near the bigram level for half of its steps can still end below the bigram, which
   criterion 2 misses). The median of the others is used because one failed run cannot move it.

Only the validation loss decides, never the test loss. ``divergence_reasons`` says which criterion
flagged each run; ``without_diverged`` blanks the losses of flagged runs, so that every fit and
test that leaves out failed runs (NaN losses) leaves them out too.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

#: the relative criterion needs this many other seeds in the group (with one other seed, the
#: higher of two runs would be flagged whichever of them failed)
MIN_OTHER_SEEDS = 2


@dataclass(frozen=True)
class DivergenceRule:
    """A declared divergence rule (module docstring): ``ceiling`` names the n-gram model whose
    validation loss no trained run may end above (None: no ceiling); ``seed_margin`` is the
    most a run may end above the median of its group's other seeds, in nats (None: no such
    criterion)."""

    ceiling: str | None = "bigram"
    seed_margin: float | None = 0.1

    def __post_init__(self):
        if self.ceiling is not None and not (isinstance(self.ceiling, str) and self.ceiling):
            raise ValueError(f"divergence ceiling={self.ceiling!r} is not valid; name an n-gram model "
                             "(e.g. 'bigram') or give None")
        margin = self.seed_margin
        if margin is not None and not (isinstance(margin, numbers.Real) and not isinstance(margin, bool)
                                       and math.isfinite(margin) and margin > 0):
            raise ValueError(f"divergence seed_margin={margin!r} is not valid; give a finite number of nats > 0 "
                             "or None")

    def describe(self, references: Mapping[str, float] | None = None) -> str:
        """The rule in words, with the ceiling's value where ``references`` has it."""
        parts = ["its final validation loss is not finite"]
        if self.ceiling is not None:
            value = (references or {}).get(self.ceiling)
            parts.append(f"above the {self.ceiling}'s" + (f" ({value:.3f})" if value is not None else ""))
        if self.seed_margin is not None:
            parts.append(f"more than {self.seed_margin:g} nats above the median of its group's other seeds "
                         f"(with at least {MIN_OTHER_SEEDS} of them)")
        return "a run diverged where " + ", or ".join(parts)


def _ceiling_value(rule: DivergenceRule, references: Mapping[str, float]) -> float:
    if rule.ceiling is None:
        return math.inf
    if rule.ceiling not in references:
        raise ValueError(f"divergence ceiling {rule.ceiling!r} is not among the reference models "
                         f"{sorted(references)}; choose one of them")
    return float(references[rule.ceiling])


def divergence_reasons(runs: pd.DataFrame, rule: DivergenceRule, references: Mapping[str, float],
                       group: str = "arm", metric: str = "val_loss") -> pd.Series:
    """Per run (``runs``' index), why it diverged under ``rule``: "" where it did not, else the
    criterion with its numbers. ``references`` maps n-gram model names to their validation
    losses (the ceiling's is read there); ``group`` is the column whose runs are one
    experiment's seeds (``arm``, or ``cell`` in a width sweep)."""
    missing = [c for c in (group, metric) if c not in runs.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the runs table (it has {list(runs.columns)})")
    ceiling = _ceiling_value(rule, references)
    loss = runs[metric].astype(float)
    reasons = pd.Series("", index=runs.index, dtype=object)
    for _, g in runs.groupby(group, sort=False):
        for i in g.index:
            reasons[i] = _reason(loss[i], loss[g.index.drop(i)].to_numpy(), ceiling, rule)
    return reasons


def _reason(value: float, others: np.ndarray, ceiling: float, rule: DivergenceRule) -> str:
    """Why one run diverged ("" if it did not), given its group's other runs' losses."""
    if not math.isfinite(value):
        return "final validation loss not finite"
    if value > ceiling:
        return f"final validation loss {value:.3f} above the {rule.ceiling}'s {ceiling:.3f}"
    others = others[np.isfinite(others)]
    if rule.seed_margin is not None and others.size >= MIN_OTHER_SEEDS:
        median = float(np.median(others))
        if value - median > rule.seed_margin:
            return (f"final validation loss {value:.3f}, {value - median:.3f} above the median {median:.3f} of its "
                    f"other seeds (margin {rule.seed_margin:g})")
    return ""


def diverged(runs: pd.DataFrame, rule: DivergenceRule, references: Mapping[str, float], group: str = "arm",
             metric: str = "val_loss") -> pd.Series:
    """Per run, whether it diverged under ``rule`` (``divergence_reasons`` is not empty)."""
    return divergence_reasons(runs, rule, references, group, metric) != ""


def without_diverged(runs: pd.DataFrame, flags: pd.Series,
                     metrics: tuple[str, ...] = ("val_loss", "test_loss")) -> pd.DataFrame:
    """``runs`` with ``metrics`` set to NaN where ``flags`` (a boolean Series on ``runs``' index)
    is True: a diverged run is then left out wherever a failed run is."""
    if not flags.index.equals(runs.index):
        raise ValueError("flags must be indexed as the runs table (from diverged(runs, ...))")
    out = runs.copy()
    for metric in metrics:
        if metric in out.columns:
            out.loc[flags.to_numpy(bool), metric] = math.nan
    return out
