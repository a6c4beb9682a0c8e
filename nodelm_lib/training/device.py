"""Where and in what precision a run computes: the device, bf16 support on this CPU, TF32 and
``torch.compile`` on CUDA, and the software and hardware environment a record carries."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
from pathlib import Path
from typing import Iterable

import torch

from nodelm_lib.version import __version__

from . import distributed
from .distributed import SINGLE, Context
from .profiling import cpu_description


# x86 /proc/cpuinfo flags (and the aarch64 feature) of native bf16 arithmetic: without one, bf16
# matmuls are emulated by converting to float32 and back, slower than float32 itself
NATIVE_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
ALLOW_EMULATED_BF16_ENV = "NODELM_ALLOW_EMULATED_BF16"


def resolve_device(name: str) -> torch.device:
    """``"auto"``: CUDA when available, else the CPU; any other name as given (CUDA asked for
    but missing is an error)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={name!r} is not a device; use 'auto', 'cpu', 'cuda' (or 'cuda:N') or 'mps'") from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(device.type)
    if available is not None and not available():
        raise ValueError(f"device={name!r} was asked for but {device.type.upper()} is not available here; "
                         "use device='cpu' or 'auto'")
    return device


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (x86 "flags", aarch64 "Features"); empty
    where there is no such file (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16 on x86, BF16 on
    aarch64). ``flags``: the CPU's feature flags; by default this machine's (``cpu_flags``),
    together with torch's own check where it has one."""
    if flags is None:
        flags = set(cpu_flags())
        for name, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported")):
            if getattr(torch.cpu, check, lambda: False)():  # private in torch 2.x: used only if present
                flags.add(name)
    return bool(NATIVE_BF16_CPU_FLAGS & set(flags))


def check_dtype_supported(dtype: str, device: torch.device, flags: Iterable[str] | None = None) -> None:
    """Refuse ``dtype="bfloat16"`` on a CPU without native bf16 (``cpu_has_native_bf16``): there
    PyTorch emulates it, and a run is several times slower than in float32, not faster. The
    environment variable ``NODELM_ALLOW_EMULATED_BF16=1`` lets it run anyway (e.g. to test the
    bf16 code path). ``flags`` as in ``cpu_has_native_bf16``."""
    if dtype != "bfloat16" or device.type != "cpu" or cpu_has_native_bf16(flags):
        return
    if os.environ.get(ALLOW_EMULATED_BF16_ENV, "") not in ("", "0"):
        return
    raise ValueError(
        f"dtype='bfloat16' on device='cpu': this CPU ({cpu_description()['cpu_name']}) has no native bfloat16 "
        f"arithmetic (neither AMX-BF16 nor AVX512-BF16 among its flags), so PyTorch would emulate it: several "
        f"times slower than float32 (a training step ~6x, a matmul ~13x on an AVX2 EPYC). Use dtype='float32' "
        f"here (bfloat16 on a GPU), or set {ALLOW_EMULATED_BF16_ENV}=1 to run emulated bf16 anyway"
    )


def compile_for(model: torch.nn.Module, device: torch.device, ctx: Context = SINGLE) -> torch.nn.Module:
    """``torch.compile(model)``; on one CUDA GPU (no DDP) with CUDA graphs (``mode="reduce-overhead"``),
    which replay a step's kernels instead of launching each from Python: at d = 256, depth 6 the
    GPU otherwise waits on the CPU's launches (``bench/record.py --only gpu`` measures it). Not
    under DDP, whose gradient hooks run between the graph's kernels."""
    if device.type == "cuda" and not ctx.active:
        return torch.compile(model, mode="reduce-overhead")
    return torch.compile(model)


def enable_tf32() -> None:
    """Let float32 matmuls and cuDNN convolutions use TF32 tensor cores (Ampere and newer GPUs;
    older ones ignore it): products keep 10 mantissa bits, sums stay float32, several times the
    float32 throughput. Process-wide; the CPU's arithmetic is unaffected."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def environment(device: torch.device, ctx: Context = SINGLE) -> dict:
    env = {
        "nodelm": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        **cpu_description(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    if ctx.active:  # a data-parallel run: the timings and memory are rank 0's
        env["world_size"] = ctx.world_size
        env["backend"] = distributed.BACKENDS[device.type]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        if commit.returncode == 0:
            env["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (e.g. an installed wheel): the commit is simply not recorded
    return env


def process_peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory in MiB: on CUDA the most the caching allocator has held
    allocated on ``device`` since its peak was last reset (``train`` resets it at the start of a
    run), on the CPU the peak resident set size since the process started. Stored as
    ``RunRecord.peak_memory_mb``."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
