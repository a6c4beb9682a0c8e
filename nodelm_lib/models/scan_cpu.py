"""The selective SSM layer's mixing step without autograd as one compiled C++ loop, for CPUs: the
inference path that the layer runs when asked (``SelectiveSSM.kernel = "cpu"``;
``use_scan_kernel``), built on first use from ``scan_cpu.cpp`` by torch's C++ extension loader.

Why: without autograd the library's scan (``scans.selective_scan``) is still a chain of tensor
operators over blocks of (positions, B, N, D): the decays, the inputs, one multiply-add per
position and a batched read-out, each a pass over a tensor 16 times the activations. At 02's cpu
shape they make one ``ti_ssm`` function evaluation about 1.6-1.7x a ``gpt`` block
(``bench/nfe_cost.py``). Here each task owns one sequence and one register's width of channels
(16 on AVX-512, 8 on AVX2), keeps its (N, width) state in registers while it walks the
positions, and reads each input once: the scan (``cpu_selective_scan``), or the layer's whole step
from the softplus of Delta to the gate (``gated_scan``), is one pass over the activations.

The same function as ``selective_scan`` to float32 accuracy, not the same rounding: the decays
exp(Delta A) use torch's fast exp (``exp_u20``, within 20 ulp, as in torch's CPU flash attention),
and the read-out sums over the states in another order than the batched matrix product there.
Against a float64 reference its error is within a few times the library scan's
(``tests/test_scan_cpu.py``). So the library keeps its scan as the default, and the stored
evaluations stay what a rerun computes. Training never runs this: with autograd, or on other
dtypes, the layer's scan is ``selective_scan``.

Building needs a C++ compiler and ninja (the ``dev`` extra installs ninja); about 20 s once,
cached by torch (``TORCH_EXTENSIONS_DIR``) under a name that carries torch's vector capability,
so a machine with another instruction set never loads a build that it cannot run.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

from .scans import selective_scan

SOURCE = Path(__file__).with_name("scan_cpu.cpp")
# compiler flags per torch CPU capability: the vector width at::vec compiles to (as inductor's C++ kernels)
CAPABILITY_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma"],
}


def capability() -> str:
    """torch's vector capability on this CPU ("AVX512", "AVX2", or "DEFAULT": at::vec's scalar code)."""
    found = torch.backends.cpu.get_cpu_capability()
    return found if found in CAPABILITY_FLAGS else "DEFAULT"


def unavailable_reason() -> str | None:
    """Why the kernel cannot be built here (no ninja, no C++ compiler), or None if it can."""
    from torch.utils import cpp_extension

    _pip_ninja_on_path()
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja; the dev extra has it)"
    compiler = cpp_extension.get_cxx_compiler()
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH (set CXX to one)"
    return None


def _pip_ninja_on_path() -> None:
    """Put the ``ninja`` of the pip package (the dev extra's) on PATH, where torch's loader looks:
    a virtual environment's bin folder is not on PATH when its python is called by path."""
    try:
        import ninja
    except ImportError:
        return
    folder = getattr(ninja, "BIN_DIR", None)
    if folder and folder not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([folder, os.environ.get("PATH", "")])


def available() -> bool:
    """Whether the kernel can be built here (``unavailable_reason`` says why not)."""
    return unavailable_reason() is None


@functools.cache
def load_kernel(cap: str | None = None):
    """The compiled extension for vector capability ``cap`` (default: this CPU's, ``capability()``;
    "AVX2" or "DEFAULT" also run on an AVX-512 CPU, which is how the tests check those builds),
    built on the first call, then torch's cached build."""
    cap = capability() if cap is None else cap
    if cap not in (*CAPABILITY_FLAGS, "DEFAULT"):
        raise ValueError(f"cap={cap!r} is not valid; choose one of {[*CAPABILITY_FLAGS, 'DEFAULT']}")
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"kernel='cpu' cannot be built here: {reason}")
    from torch.utils import cpp_extension

    flags = ["-O3", f"-DCPU_CAPABILITY={cap}", *CAPABILITY_FLAGS.get(cap, [])]
    return cpp_extension.load(name=f"nodelm_scan_cpu_{cap.lower()}", sources=[str(SOURCE)], extra_cflags=flags)


def build() -> None:
    """Build (or load the cached build of) this CPU's kernel now rather than on the first scan."""
    load_kernel()


def applies(*inputs: torch.Tensor | None) -> bool:
    """Whether the compiled loop runs on these inputs: float32, no autograd, not inside
    ``torch.compile`` (elsewhere the library's scan runs: training differentiates through it).
    Raises a ValueError for tensors on another device than the CPU (a layer asked for this kernel)."""
    devices = {t.device.type for t in inputs if t is not None}
    if devices != {"cpu"}:
        raise ValueError(f"kernel='cpu' runs on CPU tensors; got tensors on {sorted(devices)} "
                         "(set the layers' kernel to None there: use_scan_kernel(model, None))")
    differentiated = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    return not (differentiated or torch.compiler.is_compiling()
                or any(t is not None and t.dtype != torch.float32 for t in inputs))


def cpu_selective_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B_s: torch.Tensor,
                       C_s: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``scans.selective_scan`` (same arguments and results: y (B, T, D), the last state (B, D, N))
    by the compiled loop where it ``applies``, else by ``selective_scan``."""
    if not applies(x, delta, A, B_s, C_s, h0):
        return selective_scan(x, delta, A, B_s, C_s, h0)
    return _run(x, delta, A, B_s, C_s, h0)


def gated_scan(x: torch.Tensor, delta_raw: torch.Tensor, A: torch.Tensor, B_s: torch.Tensor, C_s: torch.Tensor,
               h0: torch.Tensor | None, skip: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective SSM layer's whole mixing step in the compiled loop's one pass:
    (y + skip x) * silu(gate) with y the scan of ``x`` and delta = softplus(``delta_raw``), and the
    last state; ``skip`` (D,), ``gate`` (B, T, D). Only where ``applies`` (the layer checks): the
    softplus and the silu use torch's CPU kernels' vector functions, so the pass saves three
    passes over the activations (the same function as ``cpu_selective_scan``'s)."""
    if tuple(skip.shape) != (x.shape[-1],) or gate.shape != x.shape:
        raise ValueError(f"skip must be ({x.shape[-1]},) and gate {tuple(x.shape)}; got {tuple(skip.shape)} and "
                         f"{tuple(gate.shape)}")
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    return _run(x, delta_raw, A, B_s, C_s, h0, skip.contiguous(), gate)


def _run(x, delta, A, B_s, C_s, h0, skip=None, gate=None):
    """The compiled loop on checked shapes: ``scan``, or ``gated_scan`` with ``skip`` and ``gate``."""
    if x.shape != delta.shape or x.dim() != 3:
        raise ValueError(f"x and delta must have the same shape (B, T, D); got {tuple(x.shape)} and {tuple(delta.shape)}")
    (batch, T, D), N = x.shape, A.shape[1]
    expected = {"A": (D, N), "B_s": (batch, T, N), "C_s": (batch, T, N), "h0": (batch, D, N)}
    for name, t in zip(expected, (A, B_s, C_s, h0)):  # the loop indexes by these shapes
        if t is not None and tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; with x {tuple(x.shape)} and A's {N} states it must "
                             f"be {expected[name]}")
    rows = [t if t.stride(-1) == 1 else t.contiguous() for t in (x, delta, B_s, C_s)]
    A_t = A.t().contiguous()
    state = x.new_empty(0) if h0 is None else h0.contiguous()
    kernel = load_kernel()
    if gate is None:
        return tuple(kernel.scan(rows[0], rows[1], A_t, rows[2], rows[3], state))
    return tuple(kernel.gated_scan(rows[0], rows[1], A_t, rows[2], rows[3], state, skip, gate))
