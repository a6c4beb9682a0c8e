"""The selective scan as two Triton kernels, a candidate for CUDA (``bench/scan.py``,
``bench/record.py --gpu-scan-triton``); the layer runs it only when asked
(``SelectiveSSM.kernel = "triton"``), until a GPU's measurement makes it the CUDA default.

Why: on a GPU the library's scans are chains of many small operators, the chunked one over
(B, T, D, N) tensors of decays and inputs, and under CUDA graphs both leave ``ti_ssm``'s step
several times ``gpt``'s (docs/benchmarks.md). Here each program owns a block of channels of one
sequence and keeps its (BLOCK_D, N) state in registers while it walks the positions: the forward
is one kernel that reads the inputs once and writes y, the last state and the states H that the
backward reads; the backward is one kernel walking back.
Each walk is a loop of T dependent steps with few programs per SM to hide memory latency by,
so Triton software-pipelines it (``STAGES``): a step's inputs are loaded a few positions ahead.

The same recurrence as ``selective_scan`` (``scans.py``): with a_s = exp(Delta_s A) and
b_s = Delta_s x_s B_s, h_s = a_s h_{s-1} + b_s (h_{-1} = h0, default 0) and y_s = h_s C_s.
Backward, walking s from T-1 down with g the gradient of h_s:

    g += gy_s C_s;  grad a_s = g h_{s-1};  grad b_s = g;  g <- a_s g  (the gradient of h_{s-1})

from which grad Delta_s = sum_n(grad a_s a_s A) + x_s sum_n(g B_s), grad x_s = Delta_s sum_n(g B_s),
and grad A, grad B_s, grad C_s sum over the channels or sequences they are shared by. Those sums
cross programs: each program writes its own partial sums and torch adds them, in a fixed order, so
the results are the same on every run (atomic adds would not be).

Triton is imported lazily: on a machine without it nothing here is needed. With
``TRITON_INTERPRET=1`` set before Triton is imported, the kernels run on CPU tensors (slowly),
which is how the tests check them without a GPU.
"""

from __future__ import annotations

import torch

from .scans import check_power_of_two

BLOCK_D = 32  # channels per program (default): 8 programs per sequence at d = 256, 256 over a batch of 32
# the positions' loop software-pipelined in this many stages (1: not at all): a step's loads are
# issued STAGES - 1 positions ahead, into shared memory (sm_80 on: ``compile_kernels`` shows it)
STAGES = 3


def available() -> bool:
    """Whether Triton can be imported here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernels():
    """The forward and backward kernels (``scan_triton_kernels``), imported on first use: that
    module imports Triton."""
    from . import scan_triton_kernels

    return scan_triton_kernels.forward, scan_triton_kernels.backward


def check_stages(stages: int) -> None:
    """A ValueError naming ``stages`` unless it is a whole number >= 1."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages={stages!r} is not valid; it must be a whole number >= 1 (1: the loop not pipelined)")


def _constants(N: int, block_d: int, stages: int) -> dict:
    """The kernels' constants: block sizes of about four state entries per thread, as many warps
    as that takes (1 to 8), and the loop's stages."""
    import triton

    block_n = triton.next_power_of_2(N)
    warps = min(8, max(1, block_d * block_n // 128))
    return dict(BLOCK_D=block_d, BLOCK_N=block_n, STAGES=stages, num_warps=warps)


def _launch_shape(x: torch.Tensor, N: int, block_d: int, stages: int):
    """The grid (sequences, channel blocks) and the kernels' constants (``_constants``)."""
    import triton

    batch, T, D = x.shape
    return (batch, triton.cdiv(D, block_d)), _constants(N, block_d, stages)


# the GPUs of ``estimate.GPUS`` by compute capability: what ``compile_kernels`` checks ahead of a lease
CAPABILITIES = {"T4": 75, "A100": 80, "L4": 89, "H100": 90, "H200": 90}


def compile_kernels(capability: int, dtype: torch.dtype = torch.float32, block_d: int = BLOCK_D,
                    stages: int = STAGES, N: int = 16) -> dict[str, dict[str, str | bytes]]:
    """Both kernels compiled as Triton compiles them for a GPU of compute ``capability`` (75, 80,
    89, 90: ``CAPABILITIES``), on a machine without one: every variant the op launches (with and
    without h0, and the backward with and without the last state's gradient), by name, for
    ``dtype`` inputs, ``block_d`` channels per program, ``stages`` and ``N`` states; each as the
    forms Triton lowers it through (``"ttgir"``, ``"ptx"``, and ``"cubin"``, the machine code).

    Why: Triton compiles a kernel when it is first launched, so one it cannot compile for a GPU
    would otherwise fail only on that GPU, in a lease's minutes. This runs Triton's whole pipeline
    to its bundled ptxas. It needs Triton's compiler, not its interpreter: in a process that
    imported Triton with ``TRITON_INTERPRET=1`` set (the CPU tests) it raises; run it in another."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointer = {torch.float32: "*fp32", torch.float64: "*fp64"}
    if dtype not in pointer:
        raise ValueError(f"dtype={dtype} is not valid; the Triton scan takes {sorted(map(str, pointer))}")
    check_power_of_two("block_d", block_d)
    check_stages(stages)
    forward, backward = _kernels()
    if not isinstance(forward, triton.runtime.JITFunction):
        raise RuntimeError("Triton runs its interpreter in this process (TRITON_INTERPRET=1 was set when it was "
                           "imported): compile_kernels needs its compiler; call it in a process without it")
    blocks = _constants(N, block_d, stages)
    warps = blocks.pop("num_warps")
    variants = {f"forward HAS_H0={h0}": (forward, dict(blocks, HAS_H0=h0)) for h0 in (False, True)}
    variants |= {f"backward HAS_H0={h0} HAS_GLAST={glast}": (backward, dict(blocks, HAS_H0=h0, HAS_GLAST=glast))
                 for h0 in (False, True) for glast in (False, True)}
    target = GPUTarget("cuda", capability, 32)
    compiled = {}
    for name, (kernel, constants) in variants.items():
        # the launch's arguments: tensors (``*_ptr``), the sizes T, D, N (int32) and the constants
        signature = {arg: "constexpr" if arg in constants else pointer[dtype] if arg.endswith("_ptr") else "i32"
                     for arg in inspect.signature(kernel.fn).parameters}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
        compiled[name] = dict(triton.compile(source, target=target, options=dict(num_warps=warps)).asm)
    return compiled


def _forward(x, delta, A, B_s, C_s, h0, block_d, stages):
    (batch, T, D), N = x.shape, A.shape[1]
    grid, blocks = _launch_shape(x, N, block_d, stages)
    y = torch.empty_like(x)
    last = x.new_empty(batch, D, N)
    H = x.new_empty(batch, T, D, N)
    _kernels()[0][grid](x, delta, A, B_s, C_s, last if h0 is None else h0, y, last, H, T, D, N,
                        HAS_H0=h0 is not None, **blocks)
    return y, last, H


def _backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block_d, stages):
    (batch, T, D), N = x.shape, A.shape[1]
    grid, blocks = _launch_shape(x, N, block_d, stages)
    blocks_d = grid[1]
    grad_x, grad_delta = torch.empty_like(x), torch.empty_like(delta)
    grad_A = x.new_empty(batch, D, N)  # per sequence, summed below
    grad_B, grad_C = x.new_empty(blocks_d, batch, T, N), x.new_empty(blocks_d, batch, T, N)  # per channel block
    grad_h0 = torch.empty_like(h0) if h0 is not None else None
    _kernels()[1][grid](grad_y, grad_last if grad_last is not None else x, x, delta, A, B_s, C_s,
                        h0 if h0 is not None else x, H, grad_x, grad_delta, grad_A, grad_B, grad_C,
                        grad_h0 if grad_h0 is not None else x, T, D, N,
                        HAS_H0=h0 is not None, HAS_GLAST=grad_last is not None, **blocks)
    return grad_x, grad_delta, grad_A.sum(0), grad_B.sum(0), grad_C.sum(0), grad_h0


def _define_op():
    """``torch.ops.nodelm.triton_scan`` (x, delta, A, B_s, C_s, h0) -> (y, last, H), differentiable
    in its inputs: one operator to ``torch.compile`` (which neither traces into it nor breaks its
    graph there) and to CUDA graphs; None where torch has no ``custom_op`` (< 2.4)."""
    if not hasattr(torch.library, "custom_op"):
        return None

    @torch.library.custom_op("nodelm::triton_scan", mutates_args=(), schema=(
        "(Tensor x, Tensor delta, Tensor A, Tensor B_s, Tensor C_s, Tensor? h0, int block_d, int stages) "
        "-> (Tensor, Tensor, Tensor)"))
    def scan(x, delta, A, B_s, C_s, h0, block_d, stages):
        return _forward(x, delta, A, B_s, C_s, h0, block_d, stages)

    @scan.register_fake
    def _(x, delta, A, B_s, C_s, h0, block_d, stages):
        (batch, T, D), N = x.shape, A.shape[1]
        return torch.empty_like(x), x.new_empty(batch, D, N), x.new_empty(batch, T, D, N)

    @torch.library.custom_op("nodelm::triton_scan_backward", mutates_args=(), schema=(
        "(Tensor grad_y, Tensor? grad_last, Tensor x, Tensor delta, Tensor A, Tensor B_s, Tensor C_s, Tensor? h0, "
        "Tensor H, int block_d, int stages) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"))
    def scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block_d, stages):
        *grads, grad_h0 = _backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block_d, stages)
        return *grads, x.new_empty(0) if grad_h0 is None else grad_h0  # no h0: an empty grad_h0

    @scan_backward.register_fake
    def _(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block_d, stages):
        return (*(torch.empty_like(t) for t in (x, delta, A, B_s, C_s)),
                x.new_empty(0) if h0 is None else torch.empty_like(h0))

    def setup_context(ctx, inputs, output):
        *tensors, ctx.block_d, ctx.stages = inputs
        ctx.mark_non_differentiable(output[2])  # H: saved for backward, never a result
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors, output[2])

    def backward(ctx, grad_y, grad_last, _grad_H):
        x, delta, A, B_s, C_s, h0, H = ctx.saved_tensors
        grad_y = torch.zeros_like(x) if grad_y is None else grad_y.contiguous()
        grad_last = None if grad_last is None else grad_last.contiguous()
        *grads, grad_h0 = scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, ctx.block_d, ctx.stages)
        return *grads, None if h0 is None else grad_h0, None, None

    scan.register_autograd(backward, setup_context=setup_context)
    return scan


TRITON_SCAN = _define_op()


def triton_selective_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B_s: torch.Tensor,
                          C_s: torch.Tensor, h0: torch.Tensor | None = None,
                          block_d: int = BLOCK_D, stages: int = STAGES) -> tuple[torch.Tensor, torch.Tensor]:
    """``scans.selective_scan`` on the two kernels: y (B, T, D) and the last state (B, D, N),
    differentiable in every input. In float32 (the layer calls it through ``scan_in_float32``) or
    float64 (the tests), every input alike. ``block_d``: channels per program, a power of two
    (fewer: more programs to hide the GPU's memory latency; more: fewer partial sums); ``stages``:
    the positions' loop software-pipelined in that many stages (``STAGES``; 1: not pipelined).
    Triton's interpreter (the CPU tests) ignores ``stages``: only a GPU runs the pipelined loop."""
    if x.shape != delta.shape or x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"x and delta must have the same shape (B, T, D), T >= 1; got {tuple(x.shape)} and "
                         f"{tuple(delta.shape)}")
    (batch, T, D), N = x.shape, A.shape[-1]
    expected = {"A": (D, N), "B_s": (batch, T, N), "C_s": (batch, T, N), "h0": (batch, D, N)}
    for name, t in zip(expected, (A, B_s, C_s, h0)):  # the kernels index by these shapes, unchecked
        if t is not None and tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; with x {tuple(x.shape)} and A's {N} states it must "
                             f"be {expected[name]}")
    dtypes = {t.dtype for t in (x, delta, A, B_s, C_s, h0) if t is not None}
    if len(dtypes) != 1 or not dtypes <= {torch.float32, torch.float64}:
        raise ValueError(f"the Triton scan takes inputs all float32 or all float64; got {sorted(map(str, dtypes))}")
    check_power_of_two("block_d", block_d)
    check_stages(stages)
    if batch * T * D * N >= 2**31:  # the kernels index with 32-bit integers
        raise ValueError(f"the Triton scan takes fewer than 2**31 state entries (B T D N); got {batch * T * D * N}")
    if TRITON_SCAN is None:
        raise RuntimeError(f"the Triton scan needs torch.library.custom_op (torch >= 2.4); this is torch {torch.__version__}")
    x, delta, A, B_s, C_s = (t.contiguous() for t in (x, delta, A, B_s, C_s))
    y, last, _ = TRITON_SCAN(x, delta, A, B_s, C_s, None if h0 is None else h0.contiguous(), block_d, stages)
    return y, last
