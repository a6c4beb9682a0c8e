"""Loss against inference compute: a trained model with an ODE block solved at any cost.

Depth is a solver setting for a continuous-depth model (and the weight-tied loop's number of loops
one for ``looped``): the same weights can be solved on a fixed
grid of any number of steps, or by an adaptive solver at a tolerance. The cost of a setting is its
number of field evaluations (NFE) per token: every position passes through each evaluation of the
one time-dependent block, as it passes through each layer of a stack, so NFE is the depth the
setting pays for (a fixed-step method of s stages pays s per step).

- ``evaluate_settings``: loss, NFE per token and wall time of a model at each solver setting;
- ``per_sequence_nfe``: an adaptive solver's NFE for each sequence solved alone (which inputs
  need more compute);
- ``anytime_profile`` / ``anytime_area``: the best loss affordable within each NFE budget, and its
  mean over a range of budgets (the area under the loss-vs-NFE curve, per unit of log2 NFE).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from nodelm_lib.models import CausalLM
from nodelm_lib.generation.sampling import generate, solved_as
from nodelm_lib.models.common import ODEBlock
from nodelm_lib.ode import ADAPTIVE_METHODS
from nodelm_lib.ode.tableaus import TABLEAUS


@dataclass(frozen=True)
class SolveSetting:
    """One way to solve a model's ODE block at inference: ``n_steps`` fixed steps of ``method``,
    or an adaptive ``method`` at tolerance ``rtol`` (``atol = rtol * atol_ratio``)."""

    method: str
    n_steps: int | None = None
    rtol: float | None = None
    atol_ratio: float = 0.1

    def __post_init__(self) -> None:
        valid = (*TABLEAUS, *ADAPTIVE_METHODS)
        if self.method not in valid:
            raise ValueError(f"method={self.method!r} is not valid; choose one of {', '.join(map(repr, valid))}")
        adaptive = self.method in ADAPTIVE_METHODS
        if adaptive and not (self.rtol is not None and math.isfinite(self.rtol) and self.rtol > 0):
            raise ValueError(f"an adaptive method ({self.method!r}) needs rtol, a finite number > 0; got {self.rtol!r}")
        if not adaptive and not (isinstance(self.n_steps, int) and self.n_steps >= 1):
            raise ValueError(f"a fixed-step method ({self.method!r}) needs n_steps, an integer >= 1; "
                             f"got {self.n_steps!r}")

    @property
    def adaptive(self) -> bool:
        return self.method in ADAPTIVE_METHODS

    def ode_changes(self) -> dict:
        """What ``CausalLM.set_ode`` is given for this setting."""
        if self.adaptive:
            return dict(method=self.method, rtol=self.rtol, atol=self.rtol * self.atol_ratio)
        return dict(method=self.method, n_steps=self.n_steps)

    @property
    def label(self) -> str:
        return f"{self.method} rtol={self.rtol:g}" if self.adaptive else f"{self.method} {self.n_steps}"


def fixed_grid_settings(nfe_budgets: Iterable[int], method: str = "euler") -> list[SolveSetting]:
    """The fixed grids of ``method`` whose NFE per token is each budget (a budget that is not a
    multiple of the method's stages is left out: no grid of that method costs exactly it)."""
    if method not in TABLEAUS:
        raise ValueError(f"method={method!r} is not valid; choose one of {', '.join(map(repr, TABLEAUS))}")
    stages = TABLEAUS[method].n_stages
    return [SolveSetting(method, n_steps=b // stages) for b in nfe_budgets if b >= stages and b % stages == 0]


def solved_with(model: CausalLM, setting: SolveSetting):
    """``model`` with its ODE blocks solved as ``setting`` says, restored afterwards (a context)."""
    return solved_as(model, setting.ode_changes())


@torch.no_grad()
def _scored(model: CausalLM, batches: Sequence, device: torch.device, by_prefix: bool,
            stride: int = 1) -> tuple[pd.DataFrame, float, int]:
    """One row per scored token of ``batches`` (``batch``, ``row``, ``position``, ``loss``, ``nfe``
    of the solve its logits came from), the forward passes' total seconds and the number of
    tokens they computed (what the time is per), in eval mode.

    ``by_prefix``: every position's logits from a solve of its own sequence's prefix alone, as
    decoding one sequence without a cache computes them. An adaptive solver needs this: its step
    sizes come from an error norm over the whole tensor it is given, so over a whole batch later
    tokens (and other sequences) would steer the steps taken for earlier positions, a leak past
    the causal mask. A fixed grid steps the same whatever the input: one solve per batch.
    ``stride`` k: only every k-th position is scored (positions k-1, 2k-1, ...): by prefix about
    1/k of the solves (a prefix's cost grows with its length, spread evenly); on a fixed grid the
    batch is solved whole and the same positions are kept, so that every setting scores the same
    tokens."""
    _check_stride(stride)
    was_training = model.training
    model.eval()
    rows, seconds, computed = [], 0.0, 0
    try:
        for b, (x, y) in enumerate(batches):
            x, y = x.to(device), y.to(device)
            if not by_prefix:
                start = time.perf_counter()
                logits, _ = model(x)
                seconds += time.perf_counter() - start
                losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view_as(y)
                nfe = model.ode_stats().get("nfe", 0)
                rows += [(b, i, s, float(losses[i, s]), nfe) for i in range(y.shape[0])
                         for s in range(stride - 1, y.shape[1], stride)]
                computed += y.numel()
                continue
            for i in range(x.shape[0]):
                for s in range(stride - 1, x.shape[1], stride):
                    start = time.perf_counter()
                    logits, _ = model(x[i:i + 1, :s + 1])
                    seconds += time.perf_counter() - start
                    loss = F.cross_entropy(logits[0, -1:].float(), y[i, s:s + 1])
                    rows.append((b, i, s, float(loss), model.ode_stats()["nfe"]))
                    computed += 1  # the solve of a prefix is the cost of its last token
    finally:
        model.train(was_training)
    return pd.DataFrame(rows, columns=["batch", "row", "position", "loss", "nfe"]), seconds, computed


def _check_stride(stride: int) -> None:
    if not (isinstance(stride, int) and not isinstance(stride, bool) and stride >= 1):
        raise ValueError(f"stride={stride!r} is not valid; it must be an integer >= 1 (1: every position is scored)")


def evaluate_settings(model: CausalLM, batches: Sequence, settings: Iterable[SolveSetting],
                      device: str | torch.device = "cpu", stride: int = 1) -> pd.DataFrame:
    """One row per setting: ``loss`` (mean per token over ``batches``), ``nfe`` (field evaluations
    per token, averaged over the tokens), ``ms_per_token`` (the forward passes' wall time over the
    tokens they computed) and the setting. A fixed grid solves each batch once; an adaptive setting
    each prefix of each sequence alone (``_scored``: a batch-wide adaptive solve is not causal),
    which costs about T times as many solves. ``stride`` k scores every k-th position at every
    setting (the row's ``tokens`` says how many), the same tokens for all: about 1/k of an adaptive
    setting's cost."""
    _check_stride(stride)
    device = torch.device(device)
    batches = list(batches)
    if not batches:
        raise ValueError("batches is empty: nothing to score")
    rows = []
    for setting in settings:
        with solved_with(model, setting):
            tokens, seconds, computed = _scored(model, batches, device, by_prefix=setting.adaptive, stride=stride)
        rows.append({"setting": setting.label, "method": setting.method, "n_steps": setting.n_steps,
                     "rtol": setting.rtol, "adaptive": setting.adaptive, "nfe": tokens["nfe"].mean(),
                     "loss": tokens["loss"].mean(), "ms_per_token": 1e3 * seconds / computed, "tokens": len(tokens)})
    return pd.DataFrame(rows)


def score_as_trained(model: CausalLM, batches: Sequence, device: str | torch.device = "cpu",
                     stride: int = 1) -> dict[str, float]:
    """``loss``, ``nfe`` and ``ms_per_token`` of ``model`` as it was trained (one solve per batch;
    every ``stride``-th position scored, as ``evaluate_settings``): for a stack of layers, whose
    only setting this is, ``nfe`` is its depth in blocks (``cfg.n_layers``), each costing about
    one field evaluation of the same width."""
    tokens, seconds, computed = _scored(model, list(batches), torch.device(device), by_prefix=False, stride=stride)
    has_ode = any(isinstance(m, ODEBlock) for m in model.modules())
    nfe = tokens["nfe"].mean() if has_ode else float(model.cfg.n_layers)
    return {"loss": float(tokens["loss"].mean()), "nfe": float(nfe), "ms_per_token": 1e3 * seconds / computed}


def per_sequence_nfe(model: CausalLM, batches: Sequence, setting: SolveSetting,
                     device: str | torch.device = "cpu", stride: int = 1) -> pd.DataFrame:
    """An adaptive ``setting``'s cost for each sequence: one row per sequence of ``batches`` with
    its mean ``nfe`` per token (each prefix solved alone, as ``evaluate_settings`` does), the
    ``max_nfe`` of its positions and its ``loss``: which inputs need more compute (over every
    ``stride``-th position, as ``evaluate_settings`` scores them)."""
    if not setting.adaptive:
        raise ValueError(f"per_sequence_nfe needs an adaptive setting (one of {', '.join(ADAPTIVE_METHODS)}); "
                         f"a fixed grid ({setting.label}) costs every sequence the same")
    with solved_with(model, setting):
        tokens, _, _ = _scored(model, list(batches), torch.device(device), by_prefix=True, stride=stride)
    return (tokens.groupby(["batch", "row"])
            .agg(nfe=("nfe", "mean"), max_nfe=("nfe", "max"), loss=("loss", "mean")).reset_index())


def decode_speed(model: CausalLM, prompt: torch.Tensor, settings: Iterable[SolveSetting], max_new_tokens: int = 32,
                 rounds: int = 3) -> pd.DataFrame:
    """Greedy decoding of ``max_new_tokens`` after ``prompt`` (B, T) at each setting: ``tokens_per_s``
    (the fastest of ``rounds``, after an untimed warm-up) against ``nfe`` per token, with the KV cache
    on a fixed grid (``cached``) and without it for an adaptive solver (whose steps move with the
    input). A fixed grid costs its steps times its stages per token; an adaptive solve's NFE is
    counted over the decoding passes."""
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds={rounds!r} is not valid; it must be an integer >= 1")
    rows = []
    for setting in settings:
        cached = not setting.adaptive
        counted: list[int] = []
        decode = lambda on_token=None: generate(model, prompt, max_new_tokens, temperature=0.0, use_cache=cached,  # noqa: E731
                                                ode=setting.ode_changes(), on_token=on_token)
        decode()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            decode(lambda token: counted.append(model.ode_stats()["nfe"]))
            times.append(time.perf_counter() - start)
        nfe = (setting.n_steps * TABLEAUS[setting.method].n_stages if cached
               else sum(counted) / len(counted))
        rows.append({"setting": setting.label, "method": setting.method, "n_steps": setting.n_steps,
                     "rtol": setting.rtol, "cached": cached, "nfe": nfe,
                     "tokens_per_s": prompt.shape[0] * max_new_tokens / min(times)})
    return pd.DataFrame(rows)


def anytime_profile(curve: pd.DataFrame, budgets: Iterable[float], nfe: str = "nfe", loss: str = "loss") -> pd.Series:
    """The best ``loss`` among the rows of ``curve`` whose ``nfe`` is within each budget: what the
    model achieves when it may spend at most that much (NaN for a budget below every row's NFE).
    Non-increasing in the budget by construction."""
    points = curve[[nfe, loss]].dropna().sort_values(nfe)
    best = points[loss].cummin().to_numpy()
    costs = points[nfe].to_numpy()
    values = {}
    for budget in budgets:
        within = np.searchsorted(costs, budget, side="right")
        values[budget] = best[within - 1] if within else math.nan
    return pd.Series(values, name=loss).rename_axis("budget")


def anytime_area(curve: pd.DataFrame, low: float, high: float, nfe: str = "nfe", loss: str = "loss") -> float:
    """The mean of ``anytime_profile`` over budgets from ``low`` to ``high``, uniform in log2 NFE:
    the area under the loss-vs-NFE curve divided by its width (lower is better; comparable across
    models evaluated over the same range). The profile is a step function, integrated exactly."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low!r}, high={high!r}")
    points = curve[[nfe, loss]].dropna().sort_values(nfe)
    if points.empty or points[nfe].iloc[0] > low:
        cheapest = points[nfe].iloc[0].item() if not points.empty else None
        raise ValueError(f"the curve has no point within the lowest budget {low!r} (its cheapest costs {cheapest!r}): "
                         "its area from there is not defined")
    edges = sorted({low, high, *(c for c in points[nfe] if low < c < high)})
    profile = anytime_profile(points, edges[:-1], nfe, loss)  # the value on each [edge, next edge)
    widths = np.diff(np.log2(edges))
    return float(np.dot(profile.to_numpy(), widths) / math.log2(high / low))


__all__ = ["SolveSetting", "fixed_grid_settings", "solved_with", "evaluate_settings", "per_sequence_nfe",
           "decode_speed", "anytime_profile", "anytime_area"]

