"""The benchmark record: every speed target of the project, each measured against its reference
in the same run, written with the machine it ran on.

    python bench/record.py                    # writes results/bench_cpu.{json,csv}; `make tables` puts the CSV in the docs
    python bench/record.py --rounds 3 --decode-tokens 64 --out /tmp/bench   # a quick look

What it measures (one thread unless ``--threads``; the 02 sweep trains two runs at a time with
one thread each):

* **02 cpu step**: one training step (forward, backward, gradient clipping, fused AdamW) of
  every arm of notebook 02's cpu profile (d=128, 4 heads, depth 4, batch 12 x 64 characters,
  node with Tong et al.'s hypernetwork sizes) against ``gpt``'s, with nl.train's allocator
  setting (``keep_freed_memory``) and its gradient norms and clipping. Each arm trains in a fresh
  process as in the sweep, the arms taking turns (``--rounds`` processes each, so a slow period
  of the machine hits them alike); the median step. Also the ratio of forward FLOPs per
  token at the step's batch (weights generated from t count once per pass): a ratio of times near
  the ratio of FLOPs means the arm costs what its arithmetic says. Also ``gpt`` and ``node`` at 48
  sequences, where a cost paid once per step (node's 13M hypernetwork parameters) weighs 4x less
  per token (no target).
* **seed config step**: ``gpt`` and ``hybrid`` at the seed's configuration (GPT-2 vocabulary,
  d=256, 6 layers, batch 32 x 64, dropout 0.1; the hybrid's ODE block over layers 2-4 with 4
  Euler steps) against ``bench/seed_reference.py``, a re-implementation of the seed's model and
  training step, in the same round robin. Where the CPU computes bf16 natively, both also under
  bf16 autocast (the same precision for ours and the reference; no target).
* **decode**: ``nl.generate`` of ``--decode-tokens`` greedy tokens after a 16-token prompt with
  the cache against without it, per arch, at notebook 06's cpu sizes (d=64, 4 heads, depth 4):
  after an untimed warm-up, the fastest of ``--rounds`` runs each, in alternating order (the
  ratio of the medians is in the JSON).
* **baby config**: ``gpt``'s training tokens/s at nanoGPT's CPU baby config (65 characters)
  against ``bench/nanogpt_reference.py`` (``nanogpt_vs_ours.py``'s turns, in this process); then
  the whole runs the target is about (``nanogpt_vs_ours.py --whole-run``: 2000 steps with
  nanoGPT's evaluations, taking turns per evaluation interval), nanoGPT in float32 as it runs on
  a CPU, ``gpt`` in float32 and, where the CPU computes bf16 natively, under bf16 autocast, with
  every model's validation loss on the same fixed windows (the target asks for >= 1.3x the
  reference's tokens/s at a validation loss <= the reference's).
* **odeint** (``--only odeint``, e.g. to ``results/bench_odeint_cpu``): ``odeint_vs_torchdiffeq.py``
  at its defaults, forward + backward through 4 fixed steps of the hybrid's field (d=256,
  B=32 x T=64), our ``euler`` and ``rk38`` against torchdiffeq's ``euler`` and ``rk4`` (the same
  tableaus), interleaved, medians; target ratio <= 0.8.
* **bounds** beside the CPU training rows: ``MFU``, the share of this CPU's float32 ceiling (the
  best 2048 x 2048 x 2048 product at the part's threads, measured in the same run) that the
  step's arithmetic ran at; for the seed and baby rows ``ratio at peak``, the speed-up over the
  reference of a step running at that ceiling, and ``ratio, products only``, the speed-up if
  every op but the matrix products and attention kernels were free (their share of our step's
  time, from a profile). A target above the latter cannot be met by removing overhead alone. For
  ``node``, whose products on activations are gpt's, ``ratio at memory floor``: gpt's step plus the
  time to move node's extra parameters as often as autograd, the gradient norms and AdamW must, at
  this CPU's memory bandwidth measured in the same run (``stream_gbps``, ``memory_floor_ratio``).
* **02 gpu step** (``--only gpu``, on CUDA; written to ``--out`` as any other part, e.g.
  ``results/bench_cuda``): one training step of every arm of notebook 02's gpu profile (GPT-2
  vocabulary, d=256, depth 6, batch 32 x 128, bf16 autocast) eager and under ``torch.compile``,
  against ``gpt``'s in the same mode, with the FLOPs ratio, the model FLOPs utilisation against
  a bf16 matrix product measured in the same run, and ``nl.estimate_time``'s planning guess.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # seed_reference, odeint_vs_torchdiffeq
import nodelm_lib as nl  # noqa: E402
from nodelm_lib.experiments.profiles import load_profile  # noqa: E402
from nodelm_lib.experiments.protocol import architecture_arms, comparison_setup  # noqa: E402
from nodelm_lib.models import count_params  # noqa: E402
from nodelm_lib.training.profiling import cpu_description, keep_freed_memory
from nodelm_lib.training.flops import forward_flops_per_token  # noqa: E402
from nodelm_lib.training.optim import clip_gradients, measure_gradients  # noqa: E402
from nodelm_lib.training.device import cpu_has_native_bf16, enable_tf32  # noqa: E402
from seed_reference import SeedLM, seed_training_step  # noqa: E402

TARGETS = {"ti_ssm": 1.5, "node": 1.2, "ti_mlp": 1.2, "hybrid": 1.2}  # max step-time ratio to gpt (issue 20)


def our_training_step(model, optimizer, step_model=None, autocast=contextlib.nullcontext):
    """nl.train's step without the data and the learning-rate schedule: loss (through
    ``step_model``, e.g. the compiled model, under ``autocast``), backward, the per-group
    gradient norms it logs, clipping to 1 from those norms, fused AdamW."""
    groups = model.param_groups()
    step_model = model if step_model is None else step_model

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            _, loss = step_model(x, y, return_logits=False)
        loss.backward()
        _, grads, norms = measure_gradients(model, groups)
        clip_gradients(grads, norms, 1.0)
        optimizer.step()

    return step


def round_robin(steps: dict, batch, rounds: int, block: int = 4) -> dict[str, float]:
    """Median seconds per call of each ``steps[name](*batch)``. The names take turns in blocks of
    ``block`` consecutive calls, of which the first is dropped (it pays for the switch: caches
    and allocator state left by another model), until each has ``rounds`` timed calls."""
    times = {name: [] for name in steps}
    while min(map(len, times.values())) < rounds:
        for name, step in steps.items():
            for i in range(block):
                start = time.perf_counter()
                step(*batch)
                if i:
                    times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def best_seconds(fn, threads: int, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn()`` at ``threads`` threads, after one untimed call
    (first touch, warm-up), the thread count restored after. The best, not the median: sharing the
    machine can only slow a call down."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fn()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return min(seconds)


def float32_matmul_gflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """This CPU's float32 ceiling at ``threads`` threads: GFLOP/s of the best of ``repeats`` n x n x n
    products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_seconds(lambda: a @ b, threads, repeats) / 1e9


def at_peak(step_flops: float, seconds: float, reference_seconds: float, peak_gflops: float) -> dict:
    """What a training step's time says against the matmul ceiling: ``mfu``, the fraction of it the
    step's arithmetic (3 x forward FLOPs: forward and backward) ran at, and ``ratio_at_peak``, the
    speed-up over the reference that a step running at the ceiling would have (no implementation of
    the same arithmetic on this machine can exceed it)."""
    ideal = step_flops / (peak_gflops * 1e9)
    return dict(mfu=ideal / seconds, ratio_at_peak=reference_seconds / ideal, matmul_gflops=peak_gflops)


# the kernels of matrix products and attention (forward and backward) in a CPU profile
PRODUCT_KERNELS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
                   "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def product_share(step, steps: int = 3) -> float:
    """The share of ``steps`` calls of ``step()``'s wall time spent inside matrix-product and
    attention kernels (the profiler's self time of ``PRODUCT_KERNELS``, over the same calls' wall
    time, so a slow period of a shared machine scales both). A step whose every other op (norms,
    activations, the loss's softmax, the optimiser, Python) were free would take this share of its
    time."""
    from torch.profiler import profile

    with profile() as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - start
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in PRODUCT_KERNELS) / 1e6 / wall


def stream_gbps(threads: int, mib: int = 256, repeats: int = 5) -> float:
    """This CPU's memory bandwidth at ``threads`` threads: GB/s read and written by the best of
    ``repeats`` in-place additions ``dst += src`` of two float32 tensors of ``mib`` MiB each, far
    larger than any cache (two reads and one write per element). In place, as AdamW updates its tensors: a copy into another buffer also
    reads every destination line before writing it, which a count of two accesses per element
    does not see: a copy so counted reads well below the rate fused AdamW itself reaches, and the
    floor built on it would be too high to be a floor."""
    src, dst = torch.ones(mib * 2**18), torch.zeros(mib * 2**18)
    return 3 * src.numel() * src.element_size() / best_seconds(lambda: dst.add_(src), threads, repeats) / 1e9


# Accesses to every float32 parameter that a training step with autograd, the logged gradient norms
# and AdamW cannot avoid: read to form the forward's weights and again for the backward's input
# gradient, the gradient written, read for its norm, and AdamW's reads of the parameter, gradient and
# both moments and its writes of the parameter and both moments.
PARAMETER_ACCESSES = 11

# Arms whose products on activations are gpt's, shape for shape (node: the same block applied four
# times, its weights generated from t): their step is gpt's plus the traffic of their extra parameters.
SAME_PRODUCTS_AS_GPT = ("node",)


def memory_floor_ratio(gpt_seconds: float, gpt_params: int, arm_params: int, gbps: float) -> float:
    """A lower bound on an arm's step time over gpt's, for an arm in ``SAME_PRODUCTS_AS_GPT``: gpt's
    step, less the time to move gpt's parameters ``PARAMETER_ACCESSES`` times at ``gbps``, plus the
    time to move the arm's. It counts no arithmetic for the extra parameters (node's weight generation
    does ~0.07x gpt's FLOPs at 12 sequences) and no cache reuse (node's 52 MB of hypernetwork
    parameters exceed any cache here): a target below it cannot be met by any code that keeps
    autograd, the logged gradient norms and AdamW."""
    traffic = lambda n: PARAMETER_ACCESSES * 4 * n / (gbps * 1e9)  # noqa: E731
    return (gpt_seconds - traffic(gpt_params) + traffic(arm_params)) / gpt_seconds


def cpu_02_arms() -> dict[str, nl.ModelConfig]:
    base = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=128, n_heads=4, n_layers=4, max_seq_len=64,
                          dropout=0.0, ssm_state_size=16, ode=nl.ODEConfig(method="euler", n_steps=4))
    arms = architecture_arms(base, ["gpt", "hybrid", "node", "ti_mlp", "ti_ssm"], match_to="ti_mlp",
                             controls=["gpt_parallel", "ssm"], presets={"node": "tong"})
    return {name: arm["model"] for name, arm in arms.items()}


def arm_step_seconds(name: str, steps: int, threads: int, batch: int = 12) -> list[float]:
    """Seconds of each of ``steps`` training steps of 02's arm ``name`` on ``batch`` sequences, in
    this process (with the allocator setting ``nl.train`` uses on a CPU)."""
    torch.set_num_threads(threads)
    keep_freed_memory()
    torch.manual_seed(0)
    model = nl.build_model(cpu_02_arms()[name])
    step = our_training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    x = torch.randint(0, 256, (batch, 64))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(x, torch.roll(x, -1, 1))
        times.append(time.perf_counter() - start)
    return times


# (arm, sequences per step) beyond 02's every arm at 12: node and gpt at 4x the batch, where a
# per-step cost (node moves its 13M hypernetwork parameters every step) weighs 4x less per token
AMORTISED = [("gpt", 48), ("node", 48)]


def bench_02_cpu(rounds: int, threads: int) -> list[dict]:
    """Each arm trains in a fresh process, as every run of the sweep does (its allocator and
    caches start empty, which decides a lot at these sizes); the arms take turns, ``rounds``
    processes each, 12 steps per process of which the first two are dropped; each round starts
    at the next arm, so no arm is always first after a pause. ``AMORTISED``'s cases take their
    turns with the others, at their larger batch."""
    arms = cpu_02_arms()
    cases = [(name, 12) for name in arms] + AMORTISED
    samples = {case: [] for case in cases}
    for r in range(rounds):
        for name, batch in cases[r % len(cases):] + cases[:r % len(cases)]:  # each round starts with another
            out = subprocess.run([sys.executable, __file__, "--child-arm", name, "--child-batch", str(batch),
                                  "--threads", str(threads)], check=True, capture_output=True, text=True).stdout
            samples[name, batch] += json.loads(out.strip().splitlines()[-1])[2:]
    median = {case: float(np.median(t)) for case, t in samples.items()}
    # at the step's batch: node generates its weights once per pass, for all of its sequences
    flops = {(name, batch): forward_flops_per_token(nl.build_model(arms[name]), 64, batch) for name, batch in cases}
    params = {name: count_params(arms[name])["total"] for name in arms}
    peak, gbps = float32_matmul_gflops(threads), stream_gbps(threads)
    rows = []
    for name, batch in cases:
        ratio = median[name, batch] / median["gpt", batch]
        target = TARGETS.get(name) if batch == 12 else None
        rows.append(dict(benchmark="02 cpu training step" + ("" if batch == 12 else f", {batch} sequences"),
                         case=name, value=1000 * median[name, batch], unit="ms/step", reference="gpt",
                         reference_value=1000 * median["gpt", batch], ratio=None if name == "gpt" else ratio,
                         flops_ratio=flops[name, batch] / flops["gpt", batch], target=target,
                         met=None if target is None else bool(ratio <= target),
                         mfu=3 * flops[name, batch] * batch * 64 / median[name, batch] / (peak * 1e9),
                         matmul_gflops=peak, stream_gbps=gbps,
                         ratio_memory_floor=memory_floor_ratio(median["gpt", batch], params["gpt"], params[name], gbps)
                         if name in SAME_PRODUCTS_AS_GPT else None))
    return rows


# the seed's configuration (its 002 guide's gpu config): GPT-2 vocabulary, d=256, 6 layers, dropout 0.1
SEED_VOCAB, SEED_SIZES = 50257, dict(d_model=256, n_heads=4, n_layers=6, max_seq_len=128, dropout=0.1)


def seed_config_models() -> dict[str, nl.ModelConfig]:
    """Our ``gpt`` and ``hybrid`` at the seed config (the hybrid's ODE block over layers 2-4, 4
    Euler steps), as ``bench/seed_reference.py`` builds the seed's."""
    return {"gpt": nl.ModelConfig(arch="gpt", vocab_size=SEED_VOCAB, **SEED_SIZES),
            "hybrid": nl.ModelConfig(arch="hybrid", vocab_size=SEED_VOCAB, ode_start=2, ode_end=4,
                                     ode=nl.ODEConfig(method="euler", n_steps=4), **SEED_SIZES)}


def bench_seed_config(rounds: int, threads: int) -> list[dict]:
    """At the seed's size one run has the machine to itself: ``threads`` (default: every core).
    With nl.train's allocator setting (``keep_freed_memory``), which the reference, in the same
    process, gets too. Where this CPU computes bf16 natively, both again under bf16 autocast
    (``nl.train(dtype="bfloat16")``), in the same round robin: rows without a target."""
    keep_freed_memory()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ours = seed_config_models()
    V, common = SEED_VOCAB, SEED_SIZES
    refs = {"gpt": SeedLM(V, **common), "hybrid": SeedLM(V, ode_start=2, ode_end=4, n_steps=4, **common)}
    precisions = {"": contextlib.nullcontext}
    if cpu_has_native_bf16():
        precisions[", bf16 autocast"] = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    steps = {}
    for name, cfg in ours.items():
        model = nl.build_model(cfg).train()
        ref = refs[name].train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        ref_optimizer = torch.optim.AdamW(ref.parameters(), lr=3e-4)
        for suffix, autocast in precisions.items():
            steps[name + suffix] = our_training_step(model, optimizer, autocast=autocast)
            steps["seed " + name + suffix] = functools.partial(seed_step, ref, ref_optimizer, autocast)
    x = torch.randint(0, V, (32, 64))
    median = round_robin(steps, (x, torch.roll(x, -1, 1)), rounds, block=2)
    share = {name: product_share(lambda: steps[name](x, torch.roll(x, -1, 1)), 2) for name in ours}
    torch.set_num_threads(previous)
    peak = float32_matmul_gflops(threads)
    flops = {name: 3 * forward_flops_per_token(nl.build_model(cfg), 64, len(x)) * x.numel()
             for name, cfg in ours.items()}
    rows = [dict(benchmark="seed config training step", case=name, value=1000 * median[name], unit="ms/step",
                 reference="seed " + name, reference_value=1000 * median["seed " + name],
                 ratio=median["seed " + name] / median[name], flops_ratio=None, target=1.5,
                 met=bool(median["seed " + name] / median[name] >= 1.5),
                 **at_peak(flops[name], median[name], median["seed " + name], peak),
                 product_share=share[name], ratio_products_only=median["seed " + name] / (share[name] * median[name]))
            for name in ours]
    for suffix in list(precisions)[1:]:
        rows += [dict(benchmark="seed config training step" + suffix, case=name, value=1000 * median[name + suffix],
                      unit="ms/step", reference="seed " + name, reference_value=1000 * median["seed " + name + suffix],
                      ratio=median["seed " + name + suffix] / median[name + suffix], flops_ratio=None, target=None,
                      met=None, speedup_over_float32=median[name] / median[name + suffix])
                 for name in ours]
    return rows


def seed_step(ref, optimizer, autocast, x, y) -> None:
    """``seed_training_step`` under ``autocast``."""
    with autocast():
        seed_training_step(ref, optimizer, x, y)


def bench_decode(new_tokens: int, rounds: int = 3) -> list[dict]:
    """Greedy decoding of ``new_tokens`` after a 16-token prompt, with the cache against without
    it, per arch. Each mode first decodes a few tokens untimed (the first call of a process pays
    one-time costs: lazy kernel set-up, first-touch allocations, which fell on whichever arch ran
    first), then ``rounds`` timed runs in alternating order. Reported: the fastest run of each
    mode (sharing the machine can only slow a run; a cached run lasts ~0.3 s, so a stall of a
    few seconds halves its speed),
    and in the JSON also the ratio of the medians."""
    rows = []
    for arch in ("gpt", "hybrid", "node", "ti_mlp", "ti_ssm"):
        extra = {"ode_start": 1, "ode_end": 3} if arch == "hybrid" else {}
        cfg = nl.ModelConfig(arch=arch, vocab_size=256, d_model=64, n_heads=4, n_layers=4, max_seq_len=16 + new_tokens,
                             ode=nl.ODEConfig(method="euler", n_steps=4), **extra)
        torch.manual_seed(0)
        model = nl.build_model(cfg).eval()
        prompt = torch.randint(0, 256, (1, 16))
        seconds = {True: [], False: []}
        for use_cache in seconds:  # warm-up
            nl.generate(model, prompt, 8, temperature=0, use_cache=use_cache)
        for r in range(rounds):
            for use_cache in ((True, False) if r % 2 == 0 else (False, True)):
                start = time.perf_counter()
                nl.generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache)
                seconds[use_cache].append(time.perf_counter() - start)
        cached, uncached = min(seconds[True]), min(seconds[False])
        ratio = uncached / cached
        rows.append(dict(benchmark=f"decode {new_tokens} tokens", case=arch, value=new_tokens / cached,
                         unit="tokens/s cached", reference="uncached", reference_value=new_tokens / uncached,
                         ratio=ratio, flops_ratio=None, target=10.0, met=bool(ratio >= 10.0),
                         ratio_of_medians=float(np.median(seconds[False]) / np.median(seconds[True]))))
    return rows


def bench_nanogpt(rounds: int, steps: int = 20) -> list[dict]:
    """``gpt`` trained by nl.train's own step against the nanoGPT reference at its CPU baby config
    (``nanogpt_vs_ours.py``: same process, turns in alternating order, first step of a turn not
    timed), with this library's allocator setting (``keep_freed_memory``, as nl.train on a CPU)."""
    from nanogpt_vs_ours import BABY, Ours, Reference, run_turn, training_ids

    keep_freed_memory()
    ids, _ = training_ids(65)
    cfg = dataclasses.replace(BABY, vocab_size=65, bias=False)
    runners = {"reference": Reference(cfg, ids), "ours": Ours(cfg, ids, bias=True)}
    times = {name: [] for name in runners}
    for r in range(rounds):
        for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            times[name] += run_turn(runners[name], steps)[0]
    ours, ref = (float(np.median(times[n])) for n in ("ours", "reference"))
    run_turn(runners["ours"], 2)  # back in the cache after the reference's turn
    share = product_share(runners["ours"].step, 10)
    tokens = cfg.batch_size * cfg.block_size
    flops = 3 * forward_flops_per_token(runners["ours"].model, cfg.block_size, cfg.batch_size) * tokens
    return [dict(benchmark="baby config step vs nanoGPT", case="gpt", value=tokens / ours, unit="tokens/s",
                 reference="nanoGPT", reference_value=tokens / ref, ratio=ref / ours, flops_ratio=None,
                 target=1.3, met=bool(ref / ours >= 1.3),
                 **at_peak(flops, ours, ref, float32_matmul_gflops(torch.get_num_threads())),
                 product_share=share, ratio_products_only=ref / (share * ours))]


def bench_nanogpt_whole_run() -> list[dict]:
    """Whole runs at nanoGPT's CPU baby config (``nanogpt_vs_ours.py --whole-run``): nanoGPT in
    float32, as its train.py runs on a CPU, against ``gpt`` in float32 and, where the CPU computes
    bf16 natively, under bf16 autocast; each run's tokens/s over its steps and evaluations, and
    the validation loss of each model on the same fixed windows. The target: >= 1.3x the
    reference's tokens/s at a validation loss <= the reference's."""
    from nanogpt_vs_ours import BABY, corpus_ids, whole_run_comparison

    keep_freed_memory()
    splits, _ = corpus_ids(65)
    cfg = dataclasses.replace(BABY, vocab_size=65, bias=False)
    runs = whole_run_comparison(cfg, splits)
    ref = runs.pop("reference")
    rows = []
    for dtype, run in runs.items():
        ratio = run["tokens_per_s"] / ref["tokens_per_s"]
        rows.append(dict(benchmark="baby config whole run vs nanoGPT", case=f"gpt, {dtype}", value=run["tokens_per_s"],
                         unit="tokens/s", reference="nanoGPT, float32", reference_value=ref["tokens_per_s"],
                         ratio=ratio, flops_ratio=None, target=1.3,
                         met=bool(ratio >= 1.3 and run["val_loss"] <= ref["val_loss"]),
                         val_loss=run["val_loss"], reference_val_loss=ref["val_loss"], last_val=run["last_val"],
                         reference_last_val=ref["last_val"], wall_s=run["wall_s"], reference_wall_s=ref["wall_s"]))
    return rows


def gpu_02_arms() -> tuple[nl.TrainConfig, dict[str, nl.ModelConfig]]:
    """Notebook 02's gpu profile (``params/02_seed_comparison/gpu.yaml``), built as the notebook
    builds it: the base run and every arm's model."""
    base, arms = comparison_setup(load_profile("02_seed_comparison", "gpu"))
    return base, {name: arm["model"] for name, arm in arms.items()}


def cuda_seconds(fn, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` on the GPU (CUDA events; the wall clock
    without CUDA, which lets the part be checked on a CPU)."""
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return times


def bf16_matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """Dense bf16 throughput of one n x n x n product on this GPU: the ceiling the MFU is taken against."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    cuda_seconds(lambda: a @ b, 3)
    return 2 * n**3 / float(np.median(cuda_seconds(lambda: a @ b, repeats))) / 1e12


def bench_odeint(repeats: int) -> list[dict]:
    """``odeint_vs_torchdiffeq.measure`` at its defaults (the hybrid's field, d=256, B=32 x T=64,
    4 steps, forward + backward): our fixed-step solver against torchdiffeq's on the same tableau."""
    from odeint_vs_torchdiffeq import measure

    rows = []
    for r in measure(repeats=repeats):
        ours, theirs = r["seconds"]["nodelm"], r["seconds"]["torchdiffeq"]
        rows.append(dict(benchmark="odeint fwd+bwd vs torchdiffeq", case=f"{r['ours']} vs {r['theirs']}",
                         value=ours * 1e3, unit="ms", reference="torchdiffeq", reference_value=theirs * 1e3,
                         ratio=ours / theirs, flops_ratio=None, target=0.8, met=bool(ours / theirs <= 0.8)))
    return rows


def bench_02_gpu(steps: int, modes: list[str], archs: list[str] | None = None, write_row=None,
                 scan_chunks: list[int] = ()) -> list[dict]:
    """Every arm of 02's gpu profile, one after another on the GPU (which nothing else shares):
    ``steps`` timed training steps after three untimed ones (the first of which compiles), per mode.
    ``scan_chunks``: each scan arm is also timed with every layer on the chunked scan of that
    chunk size (case "ti_ssm, chunked L=8"), the candidate ``bench/scan.py`` found fastest alone,
    or for "triton" on ``models/scan_triton.py``'s kernels (case "ti_ssm, Triton kernels")."""
    from nodelm_lib.experiments.estimate import estimate_time

    base, arms = gpu_02_arms()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    arms = {name: cfg for name, cfg in arms.items() if archs is None or name in archs or name == "gpt"}
    # the scan's arms last: the longest to compile, so a time limit cuts them and not the rest
    arms = dict(sorted(arms.items(), key=lambda item: item[1].arch in ("ti_ssm", "ssm")))
    chunk_of = {name: None for name in arms}
    for name, cfg in list(arms.items()):
        for L in scan_chunks if cfg.arch in ("ti_ssm", "ssm") else ():
            arms[scan_case(name, L)], chunk_of[scan_case(name, L)] = cfg, L
    if device == "cuda":
        enable_tf32()  # as nl.train on CUDA
    peak = bf16_matmul_tflops(*(() if device == "cuda" else (256, 2)))
    gpu = torch.cuda.get_device_name() if device == "cuda" else ""
    short = next((g for g in ("H200", "H100", "A100", "L4", "T4") if g in gpu), None)
    tokens = base.batch_size * base.seq_len
    flops = {name: forward_flops_per_token(nl.build_model(cfg), base.seq_len, base.batch_size)
             for name, cfg in arms.items()}
    # the library's FLOPs-based guess per step (MFU 0.3 of the datasheet peak, no floor)
    planned = {name: None if short is None else 1000 * estimate_time(
        dataclasses.replace(base, model=cfg, max_steps=1), gpus=[short]).rows[0]["seconds"][short]
        for name, cfg in arms.items()}
    compilers = {"eager": lambda m: m, "compiled": torch.compile,
                 "cudagraphs": lambda m: torch.compile(m, mode="reduce-overhead")}  # no launch per kernel
    autocast = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")  # noqa: E731
    x = torch.randint(0, base.model.vocab_size, (base.batch_size, base.seq_len), device=device)
    rows = []
    for mode in modes:
        median = {}
        for name, cfg in arms.items():
            torch.manual_seed(0)
            model = with_scan_chunk(nl.build_model(cfg), chunk_of[name]).to(device).train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            train_step = our_training_step(model, optimizer, compilers[mode](model), autocast)
            step = lambda: train_step(x, torch.roll(x, -1, 1))  # noqa: E731
            first = cuda_seconds(step, 1)[0]  # traces and compiles in the compiled modes
            cuda_seconds(step, 2)
            median[name] = float(np.median(cuda_seconds(step, steps)))
            mfu = 3 * flops[name] * tokens / median[name] / (peak * 1e12)
            row = dict(benchmark=f"02 gpu training step, {mode}", case=name, value=1000 * median[name],
                       unit="ms/step", reference="gpt", reference_value=1000 * median["gpt"],
                       ratio=None if name == "gpt" else median[name] / median["gpt"],
                       flops_ratio=flops[name] / flops["gpt"], target=None, met=None,
                       first_step_s=first, mfu=mfu, matmul_tflops=peak, estimate_ms=planned[name])
            rows.append(row)
            if write_row is not None:
                write_row(row)
            del model, optimizer, train_step, step
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def scan_case(arm: str, chunk_size: int | str | None) -> str:
    """A benchmark row's case: the arm, on the chunked scan of ``chunk_size`` or the Triton kernels."""
    if chunk_size is None:
        return arm
    return f"{arm}, Triton kernels" if chunk_size == "triton" else f"{arm}, chunked L={chunk_size}"


def with_scan_chunk(model: torch.nn.Module, chunk_size: int | str | None) -> torch.nn.Module:
    """``model`` with every selective SSM layer on the chunked scan of ``chunk_size``, or on the
    Triton kernels for "triton" (None: as built)."""
    from nodelm_lib.models.scans import check_chunk_size
    from nodelm_lib.models.ssm import SelectiveSSM

    if chunk_size is None:
        return model
    if chunk_size != "triton":
        check_chunk_size(chunk_size)
    for layer in model.modules():
        if isinstance(layer, SelectiveSSM):
            if chunk_size == "triton":
                layer.kernel = "triton"
            else:
                layer.chunk_size = chunk_size
    return model


def machine(threads: int) -> dict:
    info = dict(cpu_description(), torch=torch.__version__, python=platform.python_version(), threads=threads,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def write(rows: list[dict], info: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "measurements": rows}, indent=1) + "\n")
    fmt = lambda v, d: "–" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "case", "threads", "value", "unit", "reference", "reference value", "ratio",
                    "FLOPs ratio", "MFU", "ratio at peak", "ratio, products only", "ratio at memory floor",
                    "val loss / reference's",
                    "target", "met"])
        for r in rows:
            w.writerow([r["benchmark"], r["case"], r["threads"], fmt(r["value"], 1), r["unit"], fmt(r["reference"], 0),
                        fmt(r["reference_value"], 1), fmt(r["ratio"], 2), fmt(r["flops_ratio"], 2),
                        fmt(r.get("mfu"), 2), fmt(r.get("ratio_at_peak"), 2), fmt(r.get("ratio_products_only"), 2),
                        fmt(r.get("ratio_memory_floor"), 2),
                        "–" if r.get("val_loss") is None else f"{r['val_loss']:.3f} / {r['reference_val_loss']:.3f}",
                        fmt(r["target"], 1), {True: "yes", False: "no", None: "–"}[r["met"]]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="processes per arm (02 cpu, 10 timed steps each); "
                        "seed config: 3 x rounds timed steps per model")
    parser.add_argument("--decode-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="threads of the 02 and decode measurements")
    parser.add_argument("--seed-threads", type=int, default=os.cpu_count(), help="threads at the seed config")
    parser.add_argument("--only", choices=["02", "seed", "decode", "nanogpt", "odeint", "gpu"], action="append",
                        help="parts to measure (default: all but gpu)")
    parser.add_argument("--gpu-steps", type=int, default=20, help="timed steps per arm and mode (gpu)")
    parser.add_argument("--gpu-modes", nargs="+", choices=["eager", "compiled", "cudagraphs"],
                        default=["eager", "compiled"], help="cudagraphs: torch.compile(mode='reduce-overhead')")
    parser.add_argument("--gpu-archs", nargs="+", help="arms of the gpu part (default: all; gpt always)")
    parser.add_argument("--gpu-scan-chunk", type=int, nargs="+", default=[], metavar="L",
                        help="also time each scan arm on the chunked scan of chunk size L (a power of two)")
    parser.add_argument("--gpu-scan-triton", action="store_true",
                        help="also time each scan arm on the Triton kernels (models/scan_triton.py)")
    parser.add_argument("--out", default="results/bench_cpu", help="path stem of the .json and .csv")
    parser.add_argument("--child-arm", help=argparse.SUPPRESS)  # one arm's steps, printed as JSON
    parser.add_argument("--child-batch", type=int, default=12, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_arm:
        print(json.dumps(arm_step_seconds(args.child_arm, 12, args.threads, args.child_batch)))
        return
    if "gpu" in (args.only or []) and not torch.cuda.is_available():
        parser.error("--only gpu needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.set_num_threads(args.threads)
    info = machine(args.threads)
    print(info, flush=True)
    rows = []

    def keep(r: dict, part: str) -> None:
        """Print the row and rewrite the record with it: a crash later loses nothing measured."""
        r["threads"] = args.seed_threads if part == "seed" else args.threads
        rows.append(r)
        print(f"{r['benchmark']:28s} {r['case']:13s} {r['value']:9.1f} {r['unit']:16s}"
              + ("" if r["ratio"] is None else f" ratio {r['ratio']:.2f} vs {r['reference']}")
              + ("" if r["flops_ratio"] is None else f" (FLOPs {r['flops_ratio']:.2f})")
              + ("" if r.get("mfu") is None else f" MFU {r['mfu']:.3f}")
              + ("" if r.get("ratio_memory_floor") is None else f" memory floor {r['ratio_memory_floor']:.2f}")
              + ("" if r["met"] is None else f" target {r['target']}: {'met' if r['met'] else 'NOT met'}"),
              flush=True)
        write(rows, info, Path(args.out))

    parts = {"02": lambda: bench_02_cpu(args.rounds, args.threads), "seed": lambda: bench_seed_config(3 * args.rounds, args.seed_threads),
             "decode": lambda: bench_decode(args.decode_tokens, args.rounds),
             "nanogpt": lambda: bench_nanogpt(args.rounds) + bench_nanogpt_whole_run(),
             "odeint": lambda: bench_odeint(2 * args.rounds + 1),
             "gpu": lambda: bench_02_gpu(args.gpu_steps, args.gpu_modes, args.gpu_archs,
                                         write_row=lambda r: keep(r, "gpu"), scan_chunks=args.gpu_scan_chunk + ["triton"] * args.gpu_scan_triton)}
    for name in args.only or [p for p in parts if p != "gpu"]:
        for r in parts[name]():
            if name != "gpu":  # the gpu part keeps each row as it is measured
                keep(r, name)
    print(f"wrote {args.out}.json and .csv")


if __name__ == "__main__":
    main()
