"""The Triton scan's kernels (``models/scan_triton.py``) compiled by Triton's own compiler and
ptxas for the GPUs of the estimates, on a machine without one: a kernel that Triton's interpreter
runs (``tests/test_scan_triton.py``) but its compiler refuses would otherwise fail only in a GPU
lease. In a module of its own: the interpreter's tests set ``TRITON_INTERPRET=1`` in their
process, and a kernel imported under it is not compiled."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from nodelm_lib.models import scan_triton  # noqa: E402


COMPILE = """
import torch
from nodelm_lib.models import scan_triton
for capability, dtype, block_d, stages in {cases}:
    kernels = scan_triton.compile_kernels(capability, getattr(torch, dtype), block_d, stages)
    assert all(k["cubin"].startswith(b"\\x7fELF") for k in kernels.values()), capability  # machine code, not PTX
    pipelined = sum("async_copy" in k["ttgir"] for k in kernels.values())  # loads through shared memory, ahead
    print(capability, dtype, block_d, stages, pipelined, ",".join(sorted(kernels)))
"""


def test_the_kernels_compile_to_machine_code_for_every_gpu_of_the_estimates(tmp_path):
    # Triton's compiler and its ptxas, without a GPU: in a process of its own, since this one may
    # run Triton's interpreter; a fresh cache, so each kernel is compiled here, not read back
    default = (scan_triton.BLOCK_D, scan_triton.STAGES)
    cases = [(c, "float32", *default) for c in sorted(set(scan_triton.CAPABILITIES.values()))]
    cases += [(90, "float64", *default), (90, "float32", 16, 3), (90, "float32", 64, 3), (90, "float32", 32, 1)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, "-c", COMPILE.format(cases=cases)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = "backward HAS_H0=False HAS_GLAST=False,backward HAS_H0=False HAS_GLAST=True,backward HAS_H0=True " \
               "HAS_GLAST=False,backward HAS_H0=True HAS_GLAST=True,forward HAS_H0=False,forward HAS_H0=True"
    # every variant's loop pipelined where it has stages and the GPU copies asynchronously (sm_80 on), none elsewhere
    want = [f"{c} {d} {b} {s} {6 if s > 1 and c >= 80 else 0} {variants}" for c, d, b, s in cases]
    assert done.stdout.splitlines() == want


def test_compiling_ahead_refuses_a_dtype_block_or_stages_the_op_does_not_take():
    with pytest.raises(ValueError, match=r"dtype=torch.bfloat16 is not valid; the Triton scan takes \['torch.float32', 'torch.float64'\]"):
        scan_triton.compile_kernels(90, torch.bfloat16)
    with pytest.raises(ValueError, match="block_d=24 is not valid; it must be a power of two"):
        scan_triton.compile_kernels(90, block_d=24)
    with pytest.raises(ValueError, match="stages=0 is not valid"):
        scan_triton.compile_kernels(90, stages=0)


def test_compiling_ahead_where_triton_runs_its_interpreter_says_to_use_another_process():
    done = subprocess.run([sys.executable, "-c", "from nodelm_lib.models import scan_triton; scan_triton.compile_kernels(90)"],
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True)
    assert done.returncode != 0
    assert "compile_kernels needs its compiler; call it in a process without it" in done.stderr
