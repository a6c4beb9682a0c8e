"""How long runs would take on a GPU, from their FLOPs: ``print(nl.estimate_time(configs))``.

For each run, training FLOPs = 3 x forward FLOPs per token x tokens (``train_flops``; the
backward pass costs about twice the forward), and

    time = train FLOPs / (peak dense throughput x MFU),   at least ``min_step_s`` per step.

The peaks (``GPUS``) are dense tensor-core throughputs from NVIDIA's datasheets (sparsity
figures halved), for the arithmetic the trainer uses with each ``dtype``: bf16 autocast for
``"bfloat16"``, TF32 tensor cores for ``"float32"`` (``training.device.enable_tf32``):

- T4 (Turing): FP32 8.1 TFLOP/s; FP16 tensor cores 65 TFLOP/s (mixed precision), but no
  bf16 and no TF32. The trainer autocasts to bf16, never fp16, so both dtypes are estimated
  at the FP32 peak; bf16 runs there are emulated and will likely be slower still.
- L4 (Ada): TF32 tensor 120 TFLOP/s with sparsity (60 dense), BF16 242 with sparsity (121 dense).
- A100 (SXM and PCIe alike): TF32 156, BF16 312 (dense).
- H100 SXM: TF32 989 with sparsity (495 dense), BF16 1979 with sparsity (989 dense). (An
  H100 PCIe peaks lower: 378 / 756.)
- H200: the H100 SXM's peaks, with more and faster memory. Known by name (``gpus=["H200"]``),
  but not one of the default columns (``TABLE_GPUS``): at these sizes it prices as an H100.

MFU, the model FLOP utilisation (share of the peak a run achieves), is an assumption, 0.3 by
default: large, well-shaped transformer training reaches 0.3-0.5; the small models of this
project reach less, and an ODE block's many small kernels less again. Below a certain size a
step is bound by the host launching kernels, not by the GPU's arithmetic (several ms per step
in eager PyTorch whatever the GPU): ``min_step_s`` adds that floor. Evaluation, compilation
and data loading are not counted. Read the result as an order of magnitude.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union


from nodelm_lib.config import DTYPES, TrainConfig, check_choice, to_dict
from nodelm_lib.models import count_params
from nodelm_lib.training.flops import forward_flops, model_with_vocab, training_flops
from nodelm_lib.training.record import RunRecord

DEFAULT_MFU = 0.3  # an assumption, not a measurement: see the module docstring


@dataclass(frozen=True)
class GPU:
    """A GPU class: ``tflops[dtype]`` is the dense peak (TFLOP/s) of the arithmetic the trainer
    runs for that ``dtype`` on it."""

    name: str
    tflops: Mapping[str, float]
    note: str = ""


GPUS = {
    "T4": GPU("T4", {"float32": 8.1, "bfloat16": 8.1},
              "T4: no bf16 or TF32 tensor cores (its 65 TFLOP/s are fp16, which the trainer does not use); "
              "estimated at the FP32 peak, 8.1 TFLOP/s, and bf16 runs are emulated there: likely slower still"),
    "L4": GPU("L4", {"float32": 60.0, "bfloat16": 121.0}),
    "A100": GPU("A100", {"float32": 156.0, "bfloat16": 312.0}),
    "H100": GPU("H100", {"float32": 495.0, "bfloat16": 989.0}, "H100: the SXM part (a PCIe H100 peaks at 378 / 756)"),
    "H200": GPU("H200", {"float32": 495.0, "bfloat16": 989.0}, "H200: the H100 SXM's peaks, with more, faster memory"),
}
TABLE_GPUS = ("T4", "L4", "A100", "H100")  # an estimate's columns unless ``gpus`` names others

Run = Union[TrainConfig, RunRecord]


def get_gpu(gpu: str | GPU) -> GPU:
    """``GPUS[gpu]`` (names are case-insensitive), or ``gpu`` itself when it is a ``GPU``."""
    if isinstance(gpu, GPU):
        return gpu
    for name, known in GPUS.items():
        if name.upper() == str(gpu).upper():
            return known
    raise ValueError(f"gpu={gpu!r} is not valid; choose one of {', '.join(map(repr, GPUS))}, "
                     "or pass a GPU(name, tflops={'bfloat16': ..., 'float32': ...})")


def train_flops(run: Run, flops_per_token: float | None = None) -> float:
    """Training FLOPs of a run (a ``TrainConfig``, or a ``RunRecord`` with its measured
    ``flops_per_token``) over its ``max_steps``: 3 x forward FLOPs per token x tokens."""
    tc = run.train_config if isinstance(run, RunRecord) else run
    if flops_per_token is None:
        flops_per_token = run.step_flops_per_token if isinstance(run, RunRecord) else forward_flops(tc)
    return training_flops(flops_per_token, tc.max_steps * tc.batch_size * tc.seq_len)


def gpu_seconds(flops: float, gpu: str | GPU, dtype: str = "bfloat16", mfu: float = DEFAULT_MFU,
                steps: int = 0, min_step_s: float = 0.0) -> float:
    """Seconds to compute ``flops`` on ``gpu`` at its ``dtype`` peak times ``mfu``; with ``steps``
    and ``min_step_s``, at least ``min_step_s`` per step (the floor of a launch-bound step)."""
    check_choice("dtype", dtype, DTYPES)
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu={mfu!r} is not valid; it must be in (0, 1]")
    compute = flops / (get_gpu(gpu).tflops[dtype] * 1e12 * mfu)
    return max(compute, steps * min_step_s)


@dataclass
class TimeEstimate:
    """``estimate_time``'s answer; ``str()`` of it is a table to print.

    ``rows``: one per distinct run (seeds of one config pooled): label, runs, dtype, params,
    steps, train_flops (of one run) and ``seconds`` (all its runs) per GPU. ``total``: seconds
    per GPU over every row."""

    rows: list[dict]
    gpus: list[GPU]
    mfu: float
    min_step_s: float = 0.0
    total: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        head = ["run", "runs", "dtype", "params", "steps", "FLOPs/run"] + [g.name for g in self.gpus]
        body = [[r["label"], str(r["runs"]), r["dtype"], _si(r["params"]), str(r["steps"]), f"{r['train_flops']:.1e}"]
                + [format_seconds(r["seconds"][g.name]) for g in self.gpus] for r in self.rows]
        runs = sum(r["runs"] for r in self.rows)
        body.append(["total", str(runs), "", "", "", ""] + [format_seconds(self.total[g.name]) for g in self.gpus])
        widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
        fmt = lambda line: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                     for i, (c, w) in enumerate(zip(line, widths))).rstrip()
        floor = f", at least {self.min_step_s * 1e3:g} ms/step" if self.min_step_s else ""
        lines = [f"Estimated training time: FLOPs / (dense peak x MFU {self.mfu:g}, an assumption){floor}; "
                 "evaluation and compilation not counted",
                 fmt(head), *map(fmt, body),
                 "peaks (TFLOP/s, bfloat16 / float32 as TF32): "
                 + ", ".join(f"{g.name} {g.tflops['bfloat16']:g} / {g.tflops['float32']:g}" for g in self.gpus)]
        lines += [g.note for g in self.gpus if g.note]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def estimate_time(runs: Run | Iterable[Run | tuple[str, Run]] | Mapping[str, Run], gpus: Iterable[str | GPU] = TABLE_GPUS,
                  mfu: float = DEFAULT_MFU, dtype: str | None = None, min_step_s: float = 0.0) -> TimeEstimate:
    """Expected training time of ``runs`` on each of ``gpus``: ``print(nl.estimate_time(configs))``.

    ``runs``: one ``TrainConfig`` or ``RunRecord``, a list of them (a sweep) or of ``(label, run)``
    pairs, or a mapping ``{label: config}``; configs that differ only in their seed or learning
    rate (and share a label) share a row: a rate changes no FLOPs. ``dtype``
    overrides each config's own (e.g. ``"bfloat16"`` to plan GPU runs from CPU configs).
    ``mfu`` and ``min_step_s`` as in the module docstring. Each distinct model is built once
    (on the meta device) to count its FLOPs.
    """
    if isinstance(runs, (TrainConfig, RunRecord)):
        runs = [runs]
    labelled = list(runs.items()) if isinstance(runs, Mapping) else [r if isinstance(r, tuple) else (None, r)
                                                                     for r in runs]
    gpus = [get_gpu(g) for g in gpus]
    if not labelled:
        raise ValueError("no runs to estimate")
    rows: dict[tuple, dict] = {}
    flops_cache: dict[str, float] = {}
    for label, run in labelled:
        tc = run.train_config if isinstance(run, RunRecord) else run
        run_dtype = dtype or tc.dtype
        key = (label or tc.model.arch, run_dtype, _json({k: v for k, v in to_dict(tc).items() if k not in ("seed", "lr")}))
        if key in rows:
            rows[key]["runs"] += 1
            continue
        if isinstance(run, RunRecord):
            per_token, params = run.flops_per_token, run.params.get("total", 0)
        else:
            model_key = _json([to_dict(tc.model), tc.seq_len, tc.tokenizer])
            if model_key not in flops_cache:
                flops_cache[model_key] = forward_flops(tc)
            per_token = flops_cache[model_key]
            params = _count_params(tc)
        rows[key] = {"label": key[0], "runs": 1, "dtype": run_dtype, "params": params, "steps": tc.max_steps,
                     "train_flops": train_flops(tc, per_token)}
    for row in rows.values():
        row["seconds"] = {g.name: row["runs"] * gpu_seconds(row["train_flops"], g, row["dtype"], mfu, row["steps"],
                                                            min_step_s) for g in gpus}
    total = {g.name: sum(r["seconds"][g.name] for r in rows.values()) for g in gpus}
    return TimeEstimate(list(rows.values()), gpus, mfu, min_step_s, total)


def format_seconds(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.4 h``, ``2.1 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.2g} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _count_params(tc: TrainConfig) -> int:
    return count_params(model_with_vocab(tc))["total"]


def _si(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:g}"


def _json(value) -> str:
    return json.dumps(value, sort_keys=True)
