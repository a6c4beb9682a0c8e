"""The divergence rule: which finished runs count as failed trainings, decided the same way in
every notebook that declares it in its params.

A run *diverged* when its final validation loss

1. is not finite (NaN or infinite: a failed or exploded run), or
2. lies above a declared level (``above``): the validation loss of an n-gram model (the bigram by
   default; a trained model that ends worse than counting pairs of tokens has not learned) or a
   loss in nats, or
3. lies more than ``seed_margin`` nats above the median of the other seeds' final validation
   losses in its group (an arm, or an arm at one width: a *cell*), where the group has at least
   ``MIN_OTHER_SEEDS`` other seeds. Seeds of one group differ in their initialisation and data
   order only, so a run far above its siblings stalled or blew up where they did not (a run that
   stays near the bigram level for half of its steps can still end below the bigram, which
   criterion 2 misses). The median of the others is used because one failed run cannot move it.

Only the validation loss decides, never the test loss. ``divergence_reasons`` says which criterion
flagged each run; ``without_diverged`` blanks the losses of flagged runs, so that every fit and
test that leaves out failed runs (NaN losses) leaves them out too. The rule's ``action`` says
what a sweep does with a diverged run: rerun it once at the next lower rate, or keep and report
it (``lr_checks.apply_divergence`` applies either, with every criterion).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

#: the relative criterion needs this many other seeds in the group (with one other seed, the
#: higher of two runs would be flagged whichever of them failed)
MIN_OTHER_SEEDS = 2
DIVERGENCE_LEVELS = ("unigram", "bigram", "trigram")  # the n-gram references a rule may name (experiments.ngram)
DIVERGENCE_ACTIONS = ("rerun_lower", "report")


@dataclass(frozen=True)
class DivergenceRule:
    """A declared divergence rule (module docstring), the one every notebook applies.

    ``above``: the level no trained run may end above, one of the n-gram references
    (``DIVERGENCE_LEVELS``, the notebook's add-k count models on the same split) or a loss in
    nats (None: no level). ``seed_margin``: the most a run may end above the median of its
    group's other seeds, in nats (None: no such criterion). ``action``: what a sweep does with a
    diverged run (``lr_checks.apply_divergence``): ``"rerun_lower"`` reruns it once at the next
    lower rate of its arm's grid and reports it as such, ``"report"`` keeps it and says so (an
    analysis may then leave it out: ``without_diverged``). Declared in the params before any run,
    e.g. ``divergence: {above: bigram, action: rerun_lower}``."""

    above: str | float | None = "bigram"
    action: str = "rerun_lower"
    seed_margin: float | None = None

    def __post_init__(self):
        level = self.above
        number = isinstance(level, numbers.Real) and not isinstance(level, bool)
        if not (level is None or (number and math.isfinite(level) and level > 0)
                or (isinstance(level, str) and level in DIVERGENCE_LEVELS)):
            raise ValueError(f"divergence: above={level!r} is not valid; name a reference model "
                             f"({', '.join(DIVERGENCE_LEVELS)}), give a loss in nats (a finite number > 0) or None")
        if self.action not in DIVERGENCE_ACTIONS:
            raise ValueError(f"divergence: action={self.action!r} is not valid; choose one of "
                             f"{', '.join(DIVERGENCE_ACTIONS)}")
        margin = self.seed_margin
        if margin is not None and not (isinstance(margin, numbers.Real) and not isinstance(margin, bool)
                                       and math.isfinite(margin) and margin > 0):
            raise ValueError(f"divergence: seed_margin={margin!r} is not valid; give a finite number of nats > 0 "
                             "or None")

    def threshold(self, references: Mapping[str, float] | None = None) -> float:
        """The loss above which a run diverged: ``above`` itself, the named reference's validation
        loss in ``references`` (model -> loss, e.g. the notebook's n-gram table), or inf (no level)."""
        if self.above is None:
            return math.inf
        if not isinstance(self.above, str):
            return float(self.above)
        if not references or self.above not in references:
            raise ValueError(f"divergence: above={self.above!r} needs that reference's validation loss; the "
                             f"references given are {sorted(references or {})}")
        return float(references[self.above])

    def reason(self, value: float, others: np.ndarray | None = None,
               references: Mapping[str, float] | None = None) -> str:
        """Why a run whose final validation loss is ``value`` (NaN: failed) diverged ("" if it did
        not), given its group's ``others`` final validation losses (NaN ones are left out)."""
        if not math.isfinite(value):
            return "final validation loss not finite"
        ceiling = self.threshold(references)
        if value > ceiling:
            level = f"the {self.above}'s {ceiling:.3f}" if isinstance(self.above, str) else f"{ceiling:g}"
            return f"final validation loss {value:.3f} above {level}"
        others = np.asarray([] if others is None else others, dtype=float)
        others = others[np.isfinite(others)]
        if self.seed_margin is not None and others.size >= MIN_OTHER_SEEDS:
            median = float(np.median(others))
            if value - median > self.seed_margin:
                return (f"final validation loss {value:.3f}, {value - median:.3f} above the median {median:.3f} of "
                        f"its other seeds (margin {self.seed_margin:g})")
        return ""

    def diverged(self, val_loss: float, references: Mapping[str, float] | None = None,
                 others: np.ndarray | None = None) -> bool:
        """Whether a run whose final validation loss is ``val_loss`` (NaN: failed) diverged (its
        group's ``others`` losses for the seed margin)."""
        return self.reason(val_loss, others, references) != ""

    def describe(self, references: Mapping[str, float] | None = None) -> str:
        """The rule in words, with the level's value where ``references`` has it."""
        parts = ["its final validation loss is not finite"]
        if isinstance(self.above, str):
            value = (references or {}).get(self.above)
            parts.append(f"above the {self.above}'s" + (f" ({value:.3f})" if value is not None else ""))
        elif self.above is not None:
            parts.append(f"above {self.above:g}")
        if self.seed_margin is not None:
            parts.append(f"more than {self.seed_margin:g} nats above the median of its group's other seeds "
                         f"(with at least {MIN_OTHER_SEEDS} of them)")
        # a reported run stays where it is: only a rerun changes the table, and says so
        then = "; it is rerun once at the next lower rate" if self.action == "rerun_lower" else ""
        return "a run diverged where " + ", or ".join(parts) + then


def divergence_rule(value: Any) -> DivergenceRule | None:
    """The rule a notebook's ``divergence`` parameter declares: None (or False) for none, a
    ``DivergenceRule``, or a mapping with ``above`` (required), ``action`` and ``seed_margin``."""
    if value is None or value is False:
        return None
    if isinstance(value, DivergenceRule):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"divergence={value!r} is not valid; give None or a mapping such as "
                         "{'above': 'bigram', 'action': 'rerun_lower'}")
    keys = ("above", "action", "seed_margin")
    unknown = sorted(set(value) - set(keys))
    if unknown or "above" not in value:
        raise ValueError(f"divergence={dict(value)!r} is not valid: "
                         + (f"unknown key(s) {unknown}; " if unknown else "'above' is missing; ")
                         + "its keys are 'above' (required), 'action' and 'seed_margin'")
    return DivergenceRule(**value)


def divergence_reasons(runs: pd.DataFrame, rule: DivergenceRule, references: Mapping[str, float],
                       group: str = "arm", metric: str = "val_loss") -> pd.Series:
    """Per run (``runs``' index), why it diverged under ``rule``: "" where it did not, else the
    criterion with its numbers. ``references`` maps n-gram model names to their validation
    losses (the ceiling's is read there); ``group`` is the column whose runs are one
    experiment's seeds (``arm``, or ``cell`` in a width sweep)."""
    missing = [c for c in (group, metric) if c not in runs.columns]
    if missing:
        raise ValueError(f"columns {missing} not in the runs table (it has {list(runs.columns)})")
    rule.threshold(references)  # a level missing from the references is an error even where no run reaches it
    loss = runs[metric].astype(float)
    reasons = pd.Series("", index=runs.index, dtype=object)
    for _, g in runs.groupby(group, sort=False):
        for i in g.index:
            reasons[i] = rule.reason(loss[i], loss[g.index.drop(i)].to_numpy(), references)
    return reasons


def flagged_runs(runs: pd.DataFrame, rule: DivergenceRule | None, references: Mapping[str, float],
                 group: str = "arm", metric: str = "val_loss") -> pd.Series:
    """``divergence_reasons`` under a notebook's declared rule, whatever its action (a sweep has
    applied it already; this flags the runs that still diverge, reruns included): all "" where
    the params declare no rule (``divergence: null``)."""
    if rule is None:
        return pd.Series("", index=runs.index, dtype=object)
    return divergence_reasons(runs, rule, references, group, metric)


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
