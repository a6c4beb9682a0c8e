"""Memory measurements: bytes kept for backward (deterministic) and peak memory of a call."""

from __future__ import annotations

import os
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


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _track_live_tensors_in_rss() -> bool:
    """Prepare glibc (see ``peak_memory_mb``); False where that is not possible."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ready = bool(libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)) and os.access("/proc/self/clear_refs", os.W_OK)
        if ready:
            libc.malloc_trim(0)
        return ready
    except (OSError, AttributeError):
        return False


def _proc_status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{key} not found in /proc/self/status")
