"""Measurements: bytes kept for backward (deterministic), peak memory of a call, forward
FLOPs per token, which CPU this is, and how much of its speed a shared machine is giving now."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def saved_tensor_bytes(fn: Callable[[], T]) -> tuple[int, T]:
    """Run ``fn()`` and return (bytes of every tensor autograd saved for backward, its result).

    Deterministic and device-independent, so it can be asserted in tests (e.g. that a
    gradient method's memory does not grow with the number of solver steps). Tensors saved
    twice are counted twice: it is an upper bound on what backward holds.
    """
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


def peak_memory_mb(fn: Callable[[], T], device: str | torch.device = "cpu") -> tuple[float, T]:
    """Run ``fn()`` and return (how far memory peaked above its level at the start, in MiB, result).

    On CUDA, ``torch.cuda.max_memory_allocated`` after a reset. On Linux CPUs (glibc), the
    process's resident-set high-water mark, made to track live tensors: glibc first hands its
    free memory back to the system (``malloc_trim``), so that reusing it counts again, and is
    told to serve every allocation of 64 KiB or more with its own mmap (``mallopt``), so that
    freed tensors leave the resident set at once; then the mark is reset through
    ``/proc/self/clear_refs``. The mmap setting stays for the rest of the process (large
    allocations get a little slower: time things before measuring memory). Tensors under
    64 KiB are not seen. Elsewhere returns NaN.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - start) / 2**20, out
    if not _track_live_tensors_in_rss():
        return float("nan"), fn()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    start = _proc_status_mb("VmRSS")
    out = fn()
    return _proc_status_mb("VmHWM") - start, out


M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1  # glibc's mallopt parameter numbers


def keep_freed_memory(largest_heap_chunk_mb: int = 32, keep_mb: int = 1024) -> bool:
    """Tell glibc to serve allocations up to ``largest_heap_chunk_mb`` from its heap and to keep
    up to ``keep_mb`` of freed memory for reuse instead of handing it back to the system.

    Why: a training step allocates and frees the same large tensors every step. By default glibc
    serves many of them with fresh ``mmap``s, and every page of a fresh mapping page-faults on
    first touch: at d = 128, depth 4, batch 12 x 64 1,600 (gpt) to 8,600 (node) faults per step, ~13% of node's
    step time and ~5% of ti_ssm's; with this setting, none. The
    price is a resident set that stays at its high-water mark (the process's peak, which
    ``process_peak_memory_mb`` reports anyway). ``peak_memory_mb`` sets its own threshold while
    it measures. Numbers are unchanged: only where memory comes from. Returns False where this
    is not glibc (nothing changed).
    """
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, largest_heap_chunk_mb * 2**20)
                                     and libc.mallopt(M_TRIM_THRESHOLD, keep_mb * 2**20))


def _glibc():
    """glibc through ctypes (with ``mallopt`` and ``malloc_trim``), or None elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _track_live_tensors_in_rss() -> bool:
    """Prepare glibc (see ``peak_memory_mb``); False where that is not possible."""
    libc = _glibc()
    ready = libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)) \
        and os.access("/proc/self/clear_refs", os.W_OK)
    if ready:
        libc.malloc_trim(0)
    return ready


def _proc_status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{key} not found in /proc/self/status")


def cpu_description() -> dict:
    """Which CPU this process runs on, for records: the model name, the logical cores torch may
    use, and torch's CPU capability (the widest vector instruction set its kernels dispatch to,
    e.g. ``AVX512`` or ``AVX2``). Float results are identical on rerun on one machine, not across
    machines: the vector width and the blocking the BLAS picks for a CPU model set the order of
    every sum, and so its rounding. (Forcing a narrower ``ATEN_CPU_CAPABILITY`` does not give back
    an older CPU's numbers, so the capability alone does not decide them.)"""
    return {"cpu_name": _cpu_model_name(), "cpu_count": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:  # Linux: there platform.processor() only says "x86_64"
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:  # not Linux
        names = []
    return names[0] if names else (platform.processor() or platform.machine() or "unknown")


def availability_from_times(chunk_seconds: list[float]) -> float:
    """Share of the elapsed time a fixed workload ran at its fastest speed: ``n * min / sum``
    over the times of ``n`` identical chunks. 1 when every chunk ran as fast as the fastest."""
    if not chunk_seconds or min(chunk_seconds) <= 0:
        raise ValueError(f"need at least one positive chunk time, got {chunk_seconds!r}")
    return len(chunk_seconds) * min(chunk_seconds) / sum(chunk_seconds)


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def cpu_availability(seconds: float = 10.0, chunk_s: float = 0.02) -> dict:
    """How much of one core's speed this machine gives now: a fixed pure-Python loop is run in
    chunks of about ``chunk_s`` for ``seconds``, and the fastest chunk stands for the core's own
    speed (``availability_from_times``). About 1 on a dedicated core. A shared VM whose vCPU is
    throttled or preempted reads lower, and timings taken meanwhile (ms/step, tokens/s, a
    notebook's wall time) are slower too, though not by ``1 / availability`` (how to read them:
    the docs' Reproducing page, "Timing on shared machines").
    Returns availability, chunks, best_ms, median_ms, seconds (the probe's wall time, from its
    first chunk to the end of its last: at least ``seconds``).
    """
    if seconds <= 0 or chunk_s <= 0:
        raise ValueError(f"seconds and chunk_s must be positive, got seconds={seconds}, chunk_s={chunk_s}")
    calibration, fastest = 20_000, float("inf")
    for _ in range(3):  # the fastest of three, in case one lands in a stall
        t0 = time.perf_counter()
        _spin(calibration)
        fastest = min(fastest, time.perf_counter() - t0)
    n = max(1_000, int(calibration * chunk_s / max(fastest, 1e-6)))
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() < start + seconds:
        t0 = time.perf_counter()
        _spin(n)
        times.append(time.perf_counter() - t0)
    # the wall time, not the sum of the chunks: that leaves out the loop between them and could
    # fall a hair short of the time asked for
    return {"availability": availability_from_times(times), "chunks": len(times), "best_ms": min(times) * 1e3,
            "median_ms": statistics.median(times) * 1e3, "seconds": time.perf_counter() - start}
