"""Gradient-flow validation of continuous-depth blocks (notebook 01).

Question: can an ODE block replace a span of transformer layers without damaging gradient
flow? Two runs with the same seed, data order and evaluation batches (a ``gpt`` baseline
and a ``hybrid``) are summarised per model and judged against explicit criteria.

A training step's gradient norm counts as *vanishing* below ``Criteria.vanishing`` and as
*exploding* above ``Criteria.exploding`` (norms are measured before clipping).

The one criterion read from the hybrid's final weights, the control vector's effect on the logits,
is kept beside its record (``stored_control_effect``: ``store.write_evaluations``), so that a clone
without the weights (checkpoints are not committed) rebuilds the verdict from stored numbers instead
of training the run again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from nodelm_lib.config import TrainConfig
from nodelm_lib.families import BASELINE
from nodelm_lib.data import fixed_batches
from nodelm_lib.reporting.style import arm_color, smooth, use_style
from nodelm_lib.runs.store import checkpoint_path, evaluations_store, read_evaluations, run, write_evaluations
from nodelm_lib.training.evaluation import split_tokens
from nodelm_lib.training.record import RunRecord

ODE_GROUP = "grad_norm/ode_block"


@dataclass(frozen=True)
class Criteria:
    """The pass/fail thresholds, stated once and printed by the notebook."""

    vanishing: float = 1e-6  # a step's ODE-block grad norm below this is vanishing
    exploding: float = 100.0  # ... above this is exploding
    max_val_loss_ratio: float = 1.10  # hybrid / baseline final validation loss
    min_mean_ode_grad: float = 1e-3  # the ODE block must actually be trained
    min_control_effect: float = 1e-6  # mean |delta logit| when the control vector is set


def _stats(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def summarize(name: str, record: RunRecord, criteria: Criteria = Criteria()) -> dict:
    """One results row: parameters, final losses, gradient-norm statistics and counts."""
    total = [row["grad_norm"] for row in record.metrics]
    ode = [row[ODE_GROUP] for row in record.metrics if ODE_GROUP in row]
    g_mean, g_std = _stats(total)
    row = {
        "model": name,
        "arch": record.config["model"]["arch"],
        "params_total": record.params["total"],
        "params_non_embedding": record.params["non_embedding"],
        "final_train_loss": record.final["train_loss"],
        "final_val_loss": record.final["val_loss"],
        "grad_norm_mean": g_mean,
        "grad_norm_std": g_std,
        "ode_grad_norm_mean": np.nan,
        "ode_grad_norm_std": np.nan,
        "vanishing_steps": int(sum(v < criteria.vanishing for v in total)),
        "exploding_steps": int(sum(v > criteria.exploding for v in total)),
        "ode_vanishing_steps": np.nan,
        "ode_exploding_steps": np.nan,
        "tokens_per_s": record.tokens_per_s,
    }
    if ode:
        row["ode_grad_norm_mean"], row["ode_grad_norm_std"] = _stats(ode)
        row["ode_vanishing_steps"] = int(sum(v < criteria.vanishing for v in ode))
        row["ode_exploding_steps"] = int(sum(v > criteria.exploding for v in ode))
    return row


def summary_table(records: dict[str, RunRecord], criteria: Criteria = Criteria()) -> pd.DataFrame:
    return pd.DataFrame([summarize(name, rec, criteria) for name, rec in records.items()])


@torch.no_grad()
def control_effect(model: torch.nn.Module, idx: torch.Tensor, n_draws: int = 8, seed: int = 0) -> float:
    """Mean |logits(u) - logits(no control)| over ``n_draws`` control vectors u ~ N(0, I)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    plain, _ = model(idx)
    k = model.cfg.control_dim
    diffs = []
    for _ in range(n_draws):
        u = torch.randn(idx.shape[0], k, generator=gen).to(idx.device)
        steered, _ = model(idx, control=u)
        diffs.append((steered - plain).abs().mean().item())
    return float(np.mean(diffs))


CONTROL_WINDOWS = 4  # validation windows the control effect is measured on (fixed: eval seed 0)


def control_effect_key(n_draws: int = 8, seed: int = 0) -> str:
    """The name of the stored control effect (``stored_control_effect``) of these settings."""
    return f"control effect: {CONTROL_WINDOWS} validation windows (seed 0), {n_draws} draws (seed {seed})"


def control_effect_stored(record: RunRecord, store, n_draws: int = 8, seed: int = 0) -> bool:
    """Whether ``store`` keeps the control effect of this training of the run."""
    return control_effect_key(n_draws, seed) in read_evaluations(record, store)


def with_control_weights(configs: dict[str, TrainConfig], store, checkpoints, hybrid: str = "hybrid",
                         **run_options) -> dict[str, RunRecord]:
    """The runs of ``configs`` (``{name: config}``) read from ``store`` or trained, and the
    ``hybrid``'s final weights on disk where its control effect is not stored: trained again for
    them (``run(..., need_checkpoint=True)``). On another kind of CPU that retraining ends elsewhere:
    the stored record stays, and the hybrid's record here is the retraining's (the weights' own),
    whose control effect is kept beside it in the side store (``store.evaluations_store``)."""
    records = {name: run(tc, store, checkpoints, **run_options) for name, tc in configs.items()}
    if not control_effect_stored(records[hybrid], store):
        records[hybrid] = run(configs[hybrid], store, checkpoints, need_checkpoint=True, **run_options)
    return records


def stored_control_effect(record: RunRecord, store, checkpoints, device: str = "cpu", n_draws: int = 8,
                          seed: int = 0) -> float:
    """``control_effect`` of the run's final model on ``CONTROL_WINDOWS`` fixed windows of its
    validation split: read back from ``store``, else computed from its checkpoint (see
    ``with_control_weights``) and kept there."""
    store = evaluations_store(record, store, checkpoints)  # a retraining that ended elsewhere: its side store
    stored = read_evaluations(record, store)
    key = control_effect_key(n_draws, seed)
    if key not in stored:
        from nodelm_lib.training.model_files import load_model

        path = checkpoint_path(record.config_hash, checkpoints)
        if not path.exists():
            raise FileNotFoundError(f"{path}: the final weights of run {record.config_hash} are needed for its "
                                    "control effect, which the store does not keep; with_control_weights trains them")
        tc = record.train_config
        model = load_model(path, device=device)
        val = torch.from_numpy(np.asarray(split_tokens(tc, "validation"), dtype=np.int64))
        (x, _), = fixed_batches(val, 1, CONTROL_WINDOWS, tc.seq_len, seed=0)
        stored = {**stored, key: {"mean_abs_delta_logit": control_effect(model, x.to(device), n_draws, seed)}}
        write_evaluations(record, stored, store)
    return float(stored[key]["mean_abs_delta_logit"])


def verdict(table: pd.DataFrame, baseline: str, hybrid: str, control: float,
            criteria: Criteria = Criteria()) -> pd.DataFrame:
    """Each criterion with its measured value, threshold and whether it passed."""
    base, hyb = table.set_index("model").loc[baseline], table.set_index("model").loc[hybrid]
    ratio = hyb["final_val_loss"] / base["final_val_loss"]
    checks = [
        ("no vanishing ODE-block gradient steps", hyb["ode_vanishing_steps"], "== 0", hyb["ode_vanishing_steps"] == 0),
        ("no exploding ODE-block gradient steps", hyb["ode_exploding_steps"], "== 0", hyb["ode_exploding_steps"] == 0),
        ("mean ODE-block gradient norm", hyb["ode_grad_norm_mean"], f">= {criteria.min_mean_ode_grad:g}",
         hyb["ode_grad_norm_mean"] >= criteria.min_mean_ode_grad),
        ("final val loss ratio hybrid / baseline", ratio, f"<= {criteria.max_val_loss_ratio:g}",
         ratio <= criteria.max_val_loss_ratio),
        ("control vector changes the logits", control, f">= {criteria.min_control_effect:g}",
         control >= criteria.min_control_effect),
    ]
    return pd.DataFrame(checks, columns=["criterion", "value", "threshold", "passed"]).astype({"passed": bool})


def plot_gradient_flow(records: dict[str, RunRecord], window: int = 10) -> plt.Figure:
    """Training and validation loss, total gradient norm, ODE-block gradient norm; each run in its
    arm's colour (``records`` keyed as ``paired_configs`` keys them: "baseline" is ``BASELINE``)."""
    use_style()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, rec in records.items():
        color = arm_color(BASELINE if name == "baseline" else name)
        steps = [r["step"] for r in rec.metrics]
        axes[0].plot(steps, smooth([r["loss"] for r in rec.metrics], window), color=color, label=f"{name} (train)")
        axes[0].plot([e["step"] for e in rec.evals], [e["val_loss"] for e in rec.evals], "o--",
                     color=color, ms=3, label=f"{name} (val)")
        axes[1].plot(steps, smooth([r["grad_norm"] for r in rec.metrics], window), color=color, label=name)
        if ODE_GROUP in rec.metrics[0]:
            axes[2].plot(steps, smooth([r[ODE_GROUP] for r in rec.metrics], window), color=color, label=name)
    axes[0].set(title="Loss", xlabel="step", ylabel="cross-entropy loss (nats/token)")
    axes[1].set(title="Total gradient norm (before clipping)", xlabel="step", ylabel="‖∇θ L‖₂ (log scale)", yscale="log")
    axes[2].set(title="ODE-block gradient norm", xlabel="step", ylabel="‖∇ L‖₂ of the ODE block (log scale)",
                yscale="log")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def paired_configs(hybrid: TrainConfig) -> dict[str, TrainConfig]:
    """The baseline (``families.BASELINE``) and the hybrid of one comparison, keyed "baseline" and by
    the hybrid's own arch: ``hybrid``, a hybrid's config, and the same config but for ``model.arch``.

    Same seed means the same batch order and the same evaluation batches (see ``train``),
    so the two loss curves differ only by the architecture.
    """
    return {"baseline": replace(hybrid, model=replace(hybrid.model, arch=BASELINE)), hybrid.model.arch: hybrid}
