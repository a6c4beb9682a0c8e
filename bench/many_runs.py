"""Many runs on one device: the aggregate training throughput of k runs at once against one run
alone, measured in the same call (issue 40's target: >= 3x on an H100 at 02's gpu shape).

    python bench/many_runs.py --workers 8 --steps 300 --out results/bench_cuda_many_runs   # on a GPU
    python bench/many_runs.py --tiny --workers 2 --steps 5 --out /tmp/many_runs           # a CPU check

Both phases train 02's gpu profile's ``gpt`` arm (``--tiny``: a one-layer character model) through
the sweep's own path (``train_all``: isolated processes, a fresh store each phase, seeds that no
other phase uses): first one run alone, then ``--workers`` runs at once. An untimed run comes first,
so that both phases find the same warm compile cache (a model's first compilation took ~32 s on an
H100, later ones 3-4 s). Two ratios:

* **wall**: k runs' tokens per wall second of their phase against one run's; start-up and
  compilation are counted, as a sweep pays them for every run;
* **steady**: the sum of the k records' ``tokens_per_s`` (their training loops) against the lone
  run's, which leaves out start-up and compilation. The runs overlap only if they start together
  and take about as long; the wall ratio needs no such assumption.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from time import perf_counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nodelm_lib as nl  # noqa: E402
from nodelm_lib.experiments.sweeps import train_all  # noqa: E402


def base_config(tiny: bool, steps: int, arm: str = "gpt") -> nl.TrainConfig:
    """02 gpu's ``arm`` run cut to ``steps`` (evaluated once, at the end), or a tiny CPU stand-in."""
    if tiny:
        model = nl.ModelConfig(arch="gpt", d_model=32, n_heads=2, n_layers=1, max_seq_len=32)
        tc = nl.TrainConfig(model=model, dataset="tinyshakespeare", batch_size=4, seq_len=32)
    else:
        from record import gpu_02_arms

        tc, arms = gpu_02_arms()
        if arm not in arms:
            raise ValueError(f"arm={arm!r} is not an arm of 02's gpu profile; choose one of {', '.join(arms)}")
        tc = dataclasses.replace(tc, model=arms[arm])
    # scored on two fixed batches once, at the end: the profile's whole-split scoring is not what is timed
    return dataclasses.replace(tc, max_steps=steps, warmup_steps=min(tc.warmup_steps, steps // 2),
                               eval_interval=steps, eval_on="batches", eval_batches=2, progress=False)


def mps_running() -> bool | None:
    """Whether a CUDA MPS control daemon runs here (then processes' kernels share the GPU at once,
    instead of taking turns)."""
    import subprocess

    try:
        return subprocess.run(["pgrep", "-x", "nvidia-cuda-mps-control"], capture_output=True).returncode == 0
    except OSError:  # no pgrep: say so rather than guess
        return None


def phase(base: nl.TrainConfig, seeds: list[int], workers: int) -> dict:
    """Train one run per seed with ``workers`` at once into a fresh store; wall time and records."""
    configs = [dataclasses.replace(base, seed=s) for s in seeds]
    with tempfile.TemporaryDirectory() as store, tempfile.TemporaryDirectory() as checkpoints:
        started = perf_counter()
        records = train_all(configs, store, checkpoints, isolate=True, workers=workers, progress=False)
        wall = perf_counter() - started
    failed = [r.config_hash for r in records if r.status != "completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) did not complete ({failed}): no throughput to compare")
    tokens = sum(r.config["max_steps"] * r.config["batch_size"] * r.config["seq_len"] for r in records)
    return dict(workers=workers, runs=len(records), wall_s=wall, tokens=tokens, tokens_per_s=tokens / wall,
                steady_tokens_per_s=sum(r.tokens_per_s for r in records),
                compile_s=[r.compile_time_s for r in records], peak_memory_mb=[r.peak_memory_mb for r in records],
                device=records[0].environment.get("device_name") or records[0].environment.get("cpu_name"))


def compare(base: nl.TrainConfig, workers: int) -> dict:
    """One run alone, then ``workers`` at once (after an untimed run that warms the compile cache):
    each phase's numbers and the two ratios."""
    phase(base, [workers + 1], 1)
    alone = phase(base, [0], 1)
    together = phase(base, list(range(1, workers + 1)), workers)
    return dict(alone=alone, together=together, wall_ratio=together["tokens_per_s"] / alone["tokens_per_s"],
                steady_ratio=together["steady_tokens_per_s"] / alone["steady_tokens_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8, help="runs at once in the second phase (>= 2)")
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--arm", default="gpt", help="the arm of 02's gpu profile every run trains (default gpt)")
    p.add_argument("--tiny", action="store_true", help="a one-layer character model (a CPU check of the bench)")
    p.add_argument("--out", default="results/bench_cuda_many_runs", help="path stem of the .json written")
    a = p.parse_args()
    if a.workers < 2 or a.steps < 1:
        p.error(f"--workers {a.workers} --steps {a.steps}: need workers >= 2 and steps >= 1")
    result = compare(base_config(a.tiny, a.steps, a.arm), a.workers)
    out = Path(a.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(steps=a.steps, tiny=a.tiny, arm=a.arm, mps=mps_running(), **result), indent=1) + "\n")
    for name in ("alone", "together"):
        r = result[name]
        print(f"{r['workers']} at a time: {r['runs']} run(s), {r['wall_s']:.1f} s wall, "
              f"{r['tokens_per_s']:,.0f} tokens/s by the wall, {r['steady_tokens_per_s']:,.0f} in the training loops "
              f"({r['device']})")
    print(f"aggregate throughput, {a.workers} at once against one alone: x{result['wall_ratio']:.2f} by the wall, "
          f"x{result['steady_ratio']:.2f} in the training loops (target on an H100: >= 3); wrote {out}")


if __name__ == "__main__":
    main()
