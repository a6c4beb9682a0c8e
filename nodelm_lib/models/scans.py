r"""The scans that evaluate the selective SSM's recurrence :math:`h_s = a_s h_{s-1} + b_s`
(``ssm.SelectiveSSM``'s core).

Two scans. ``selective_scan`` (the layer's default) fuses the whole selective SSM core, decays,
inputs, recurrence and read-out, into one autograd function over time-major buffers: a loop of
one in-place multiply-add per position, everything else batched over blocks of 16 positions
that stay in cache (``_SelectiveScan``). The
chunked ``linear_recurrence`` (the layer's ``chunk_size`` path, kept as a second
implementation) solves :math:`h_s = a_s h_{s-1} + b_s` (h_{-1} = 0) for given a and b without
a Python loop over s: the positions are cut into chunks of L, every chunk is scanned at once
(a loop over the L offsets, each step one in-place multiply-add on all chunks together),
then a loop over the T / L chunks carries each chunk's end state into the next. About
2 L + T / L small steps instead of T; L near sqrt(T) is best. Only products of a appear,
never :math:`\exp(-\sum \log a)`, so with a in (0, 1] nothing can overflow. It materialises
a and b in full and is several times slower per call at small CPU sizes (B 12, T 64, D 128, N 16).

Autograd records neither scan: each ``backward`` is the adjoint recurrence, the same scan run
backwards, :math:`\lambda_s = g_s + a_{s+1}\lambda_{s+1}`, with
:math:`\partial L/\partial b_s = \lambda_s` and :math:`\partial L/\partial a_s = \lambda_s h_{s-1}`.
They keep a and h only (the fused scan h only, forming a again): recording the in-place steps
would keep a copy per step.
"""

from __future__ import annotations

import functools
import math

import torch

from nodelm_lib.nn.decode_cache import compiling

# exp(x) = 2^(x log2 e): the fused scan forms its decays with exp2, which torch's CPU kernels
# evaluate in about half exp's time, on the largest tensor of the scan. The same value to
# float32 rounding (the product with log2 e rounds once more).
LOG2_E = 1.4426950408889634


def check_power_of_two(name: str, value: int) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a power of two (1, 2, 4, ...)."""
    if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{name}={value!r} is not valid; it must be a power of two (1, 2, 4, ...)")


def check_chunk_size(chunk_size: int) -> None:
    """Raise ValueError unless ``chunk_size`` is a power of two (1, 2, 4, ...)."""
    check_power_of_two("chunk_size", chunk_size)


@torch.no_grad()
def _chunked_scan(a: torch.Tensor, b: torch.Tensor, chunk_size: int) -> torch.Tensor:
    r"""h with h_s = a_s h_{s-1} + b_s along dim 1, without autograd (see the module docstring).

    With chunk c's cumulative products :math:`P_{c,j} = \prod_{i \le j} a_{c,i}` and its
    states :math:`H_{c,j}` started from 0, :math:`h_{c,j} = H_{c,j} + P_{c,j} h_{c-1,L-1}`.
    """
    T = a.shape[1]
    L = min(chunk_size, T)
    pad = -T % L
    if pad:  # a = 1, b = 0 past the end leave h unchanged
        a = torch.cat([a, a.new_ones(a.shape[0], pad, *a.shape[2:])], dim=1)
        b = torch.cat([b, b.new_zeros(b.shape[0], pad, *b.shape[2:])], dim=1)
    shape = (a.shape[0], a.shape[1] // L, L, *a.shape[2:])
    a_c = a.reshape(shape)
    h = b.reshape(shape).clone()
    prods = a_c.clone()
    for j in range(1, L):  # every chunk at once
        h[:, :, j].addcmul_(a_c[:, :, j], h[:, :, j - 1])
        prods[:, :, j].mul_(prods[:, :, j - 1])
    for c in range(1, shape[1]):  # carry the previous chunk's end state in
        h[:, c].addcmul_(prods[:, c], h[:, c - 1, -1:])
    return h.reshape(a.shape)[:, :T]


class _AdjointRecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, scan):
        h = scan(a, b)
        ctx.save_for_backward(a, h)
        ctx.scan = scan
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h = ctx.saved_tensors
        # lambda_s = g_s + a_{s+1} lambda_{s+1}: the forward scan on reversed positions, with
        # the reversed a shifted by one (its first entry multiplies lambda_T = 0: any value)
        a_next = torch.cat([torch.ones_like(a[:, :1]), a.flip(1)[:, :-1]], dim=1)
        lam = ctx.scan(a_next, grad_h.flip(1)).flip(1)
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        return lam * h_prev, lam, None


def adjoint_recurrence(a: torch.Tensor, b: torch.Tensor, scan) -> torch.Tensor:
    """h_s = a_s h_{s-1} + b_s (h_{-1} = 0) along dim 1 by ``scan(a, b)`` (any solver of it, run
    without autograd), differentiable in a and b through the same ``scan`` run backwards (the
    module docstring): how ``linear_recurrence`` and other candidate scans get their gradients."""
    return _AdjointRecurrence.apply(a, b, scan)


def default_chunk_size(T: int) -> int:
    """The power of two nearest sqrt(T): about 2 L + T / L steps is least at L = sqrt(T)."""
    return 1 << max(0, round(math.log2(math.sqrt(max(T, 1)))))


def linear_recurrence(a: torch.Tensor, b: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    r"""h_s = a_s h_{s-1} + b_s with h_{-1} = 0, for a, b of shape (B, T, *S); returns h (B, T, *S).

    Chunked scan with L = ``chunk_size`` (default: ``default_chunk_size(T)``; module
    docstring); differentiable in a and b through the adjoint scan (not twice).
    """
    if a.shape != b.shape or a.dim() < 2:
        raise ValueError(f"a and b must have the same shape (B, T, ...); got {tuple(a.shape)} and {tuple(b.shape)}")
    if chunk_size is None:
        chunk_size = default_chunk_size(a.shape[1])
    check_chunk_size(chunk_size)
    return adjoint_recurrence(a, b, functools.partial(_chunked_scan, chunk_size=chunk_size))


def linear_recurrence_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same recurrence as ``linear_recurrence`` by a sequential loop over positions (tests)."""
    state, out = torch.zeros_like(b[:, 0]), []
    for s in range(a.shape[1]):
        state = a[:, s] * state + b[:, s]
        out.append(state)
    return torch.stack(out, dim=1)


def time_major(*tensors: torch.Tensor, axis: int) -> list[torch.Tensor]:
    """(B, T, K) -> contiguous (T, B, K) with a unit axis inserted at ``axis`` (-2 for the D-sized
    inputs, giving (T, B, 1, D); -1 for the N-sized ones, (T, B, N, 1)): the two broadcast
    shapes of ``_SelectiveScan``'s (T, B, N, D) layout. Contiguous: broadcasting over strided
    views is several times slower on a CPU."""
    return [t.transpose(0, 1).contiguous().unsqueeze(axis) for t in tensors]


SCAN_BLOCK = 16  # positions per block of ``_SelectiveScan`` (see there)
# The scan without autograd keeps no states for backward, only the block being worked on (its
# decays and its states; the previous block's states wait in a second buffer for their last row),
# so its block can be sized to a core's cache rather than fixed: that block's decays and states
# together fit in this many bytes (``inference_block``). A block of any length gives the same
# numbers bit for bit (each position's arithmetic is the same), so this only sets the speed.
INFERENCE_BLOCK_BYTES = 1 << 20


def inference_block(batch: int, state_size: int, channels: int, itemsize: int = 4) -> int:
    """Positions per block of the scan without autograd: the largest power of two whose decays
    and states, (block, batch, state_size, channels) each, fit ``INFERENCE_BLOCK_BYTES``
    together; at least 1. At 02's cpu shape (B 12, N 16, D 128, float32) 4 positions; one
    window of 08 (B 1) 64."""
    fits = INFERENCE_BLOCK_BYTES // (2 * batch * state_size * channels * itemsize)
    return 1 << max(0, fits.bit_length() - 1)


class _SelectiveScan(torch.autograd.Function):
    r"""y_s = sum_n C_{s,n} h_{s,.,n} with h_s = exp(Delta_s A) * h_{s-1} + (Delta_s x_s) B_s, fused.

    Shapes: x, delta (B, T, D); A (D, N); B_s, C_s (B, T, N); h0 (B, D, N) or None (zeros).
    Internally every (., N, D) tensor is time-major with D innermost, (T, B, N, D): each
    position's state H[s] is one contiguous block that the recurrence updates in place, and
    every reduction over n or d is a cheap strided sum or a small matmul (on a CPU, sums over
    a short innermost axis and batched matrix-vector products are several times slower).
    Only the recurrence itself is a loop over positions (one fused multiply-add each).

    Both passes walk the positions in blocks of ``block`` (forward from the start, backward
    from the end, carrying the state / adjoint across block edges), and do all of a block's
    work (decays, inputs, recurrence, read-out; in backward every reduction) before the next:
    a block's (block, B, N, D) tensors stay in cache, so the one full-size tensor, the states H
    kept for backward, is written once and read once; the decays a are formed again per block in
    backward (``_decays``), which costs no measurable time on a CPU and saves a state-sized
    tensor per layer. Why: at B 12, T 64, D 128, N 16 one full-size tensor is
    6 MiB, and the unblocked version's dozen passes over seven of them ran at memory speed:
    3 ms per elementwise op instead of 0.2.

    Backward: with :math:`\lambda_s = \partial L/\partial h_s = g_s C_s + a_{s+1} \lambda_{s+1}`
    (the same recurrence run backwards, g = dL/dy plus dL/dh_{T-1} at the end) and
    :math:`G_s = \lambda_s a_s h_{s-1}` (the gradient of log a_s = Delta_s A):

    .. math::
        \partial_C = \textstyle\sum_d g H, \quad
        \partial_B = \sum_d \lambda\, \Delta x, \quad
        \partial_\Delta = \sum_n G A + x \sum_n \lambda B, \quad
        \partial_x = \Delta \sum_n \lambda B, \quad
        \partial_A = \sum_{b,s} G \Delta, \quad \partial_{h_0} = a_0 \lambda_0.
    """

    @staticmethod
    def forward(ctx, x, delta, A, B_s, C_s, h0, block):
        y, last, H = _scan_forward(x, delta, A, B_s, C_s, h0, block)
        ctx.block = block
        ctx.save_for_backward(x, delta, A, B_s, C_s, h0, H)
        return y, last

    @staticmethod
    def backward(ctx, grad_y, grad_last):
        x, delta, A, B_s, C_s, h0, H = ctx.saved_tensors
        grads = _scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, ctx.block,
                               h0 is not None and ctx.needs_input_grad[5])
        return *grads, None


def _scan_forward(x, delta, A, B_s, C_s, h0, block, keep_states: bool = True):
    """``_SelectiveScan``'s forward: y (B, T, D) and the last state (B, D, N), both views, and
    the states H (T, B, N, D) that backward needs, or None with ``keep_states=False`` (no
    backward: the blocks' states then go into two block-sized buffers in turn, which stay in
    cache, instead of a full-size tensor written once and never read; the same numbers. Two, so
    that the state that ends a block is still there when the next block starts from it)."""
    (delta_tm, x_tm), (B_tm, C_tm) = time_major(delta, x, axis=-2), time_major(B_s, C_s, axis=-1)
    shape = (*delta_tm.shape[:2], A.shape[1], A.shape[0])  # (T, B, N, D)
    A_2 = _log2_decay_rates(A.t().contiguous())
    dx = delta_tm * x_tm
    # big outputs go into buffers from torch.empty: measured on CPU, an elementwise op
    # that allocates its own (T, B, N, D) output page-faults and runs 5-8x slower
    block_shape = (min(block, shape[0]), *shape[1:])
    H = delta.new_empty(shape) if keep_states else None
    buffers = () if keep_states else (delta.new_empty(block_shape), delta.new_empty(block_shape))
    a_b = delta.new_empty(block_shape)  # one block's decays, rebuilt in backward
    y = delta.new_empty(shape[0], shape[1], 1, shape[3])
    previous = None if h0 is None else h0.transpose(-1, -2)  # h_{s-1} at the block's start
    for i, (lo, hi) in enumerate(_blocks(shape[0], block)):
        _decays(delta_tm[lo:hi], A_2, out=a_b[:hi - lo])
        # the inputs b_s; states in place
        H_b = torch.mul(dx[lo:hi], B_tm[lo:hi], out=H[lo:hi] if keep_states else buffers[i % 2][:hi - lo])
        states, decays = H_b.unbind(0), a_b.unbind(0)  # one op for all positions' views, not one each
        if previous is not None:
            states[0].addcmul_(decays[0], previous)
        for s in range(1, hi - lo):
            states[s].addcmul_(decays[s], states[s - 1])
        torch.matmul(C_tm[lo:hi].transpose(-1, -2), H_b, out=y[lo:hi])  # sum over n
        previous = H_b[-1]
    if not keep_states:
        return y.squeeze(-2).transpose(0, 1), previous.transpose(-1, -2), None
    return y.squeeze(-2).transpose(0, 1), H[-1].transpose(-1, -2), H


def _scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block, need_grad_h0):
    """``_SelectiveScan``'s backward (its docstring has the math): the gradients of x, delta, A,
    B_s, C_s and h0 (None unless ``need_grad_h0``), some of them views."""
    (delta_tm, x_tm, g), (B_tm, C_tm) = time_major(delta, x, grad_y, axis=-2), time_major(B_s, C_s, axis=-1)
    T, batch, N, D = H.shape
    A_t, dx = A.t().contiguous(), delta_tm * x_tm
    A_2 = _log2_decay_rates(A_t)
    grad_C, grad_B = H.new_empty(T, batch, N, 1), H.new_empty(T, batch, N, 1)
    lam_B, grad_delta = H.new_empty(T, batch, 1, D), H.new_empty(T, batch, 1, D)
    grad_A = torch.zeros_like(A_t)  # (N, D)
    scratch = [H.new_empty(min(block, T), batch, N, D) for _ in range(3)]
    # carry: lambda and the decay at the first position of the block after this one
    grad_h0, carry, carry_a = None, None, None
    for lo, hi in reversed(_blocks(T, block)):
        a_b, H_b = _decays(delta_tm[lo:hi], A_2, out=scratch[2][:hi - lo]), H[lo:hi]
        lam = torch.mul(g[lo:hi], C_tm[lo:hi], out=scratch[0][:hi - lo])  # g_s C_s, becomes lambda_s
        if carry is not None:
            lam[-1].addcmul_(carry_a, carry)
        elif grad_last is not None:
            lam[-1].add_(grad_last.transpose(-1, -2))
        lams, decays = lam.unbind(0), a_b.unbind(0)
        for s in range(hi - lo - 2, -1, -1):
            lams[s].addcmul_(decays[s + 1], lams[s + 1])
        torch.matmul(H_b, g[lo:hi].transpose(-1, -2), out=grad_C[lo:hi])  # sum over d
        torch.matmul(lam, dx[lo:hi].transpose(-1, -2), out=grad_B[lo:hi])
        torch.matmul(B_tm[lo:hi].transpose(-1, -2), lam, out=lam_B[lo:hi])  # sum over n
        if lo == 0 and need_grad_h0:
            grad_h0 = (a_b[0] * lam[0]).transpose(-1, -2)
        carry, carry_a = lam[0].clone(), a_b[0].clone()
        G = lam.mul_(a_b)  # lambda is not needed past here: G in its buffer
        G[1:].mul_(H_b[:-1])
        if lo > 0:
            G[0].mul_(H[lo - 1])
        elif h0 is None:
            G[0].zero_()
        else:
            G[0].mul_(h0.transpose(-1, -2))
        torch.sum(torch.mul(G, A_t, out=scratch[1][:hi - lo]), -2, keepdim=True, out=grad_delta[lo:hi])
        grad_A += G.mul_(delta_tm[lo:hi]).sum((0, 1))
    grad_delta.add_(x_tm * lam_B)
    grad_x = delta_tm * lam_B
    return (*(z.squeeze(-2).transpose(0, 1) for z in (grad_x, grad_delta)), grad_A.t(),
            grad_B.squeeze(-1).transpose(0, 1), grad_C.squeeze(-1).transpose(0, 1), grad_h0)


def _log2_decay_rates(A_t: torch.Tensor) -> torch.Tensor:
    """A's contiguous transpose (N, D) as the rates of ``_decays``: exp(Delta A) = 2^(Delta (A log2 e))."""
    return A_t * LOG2_E


def _decays(delta: torch.Tensor, A_2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """a = exp(Delta A) in (0, 1] for a block of positions: delta (L, B, 1, D), A_2 from
    ``_log2_decay_rates``, into ``out`` (L, B, N, D). Formed per block in forward and again in
    backward rather than stored for backward: the same numbers bit for bit at no measurable cost
    in time, and about a third less peak memory in a training step."""
    return torch.mul(delta, A_2, out=out).exp2_()


def _blocks(length: int, block: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of ``block`` consecutive positions covering 0..length."""
    return [(lo, min(lo + block, length)) for lo in range(0, length, block)]


def _define_compiled_scan():
    """``torch.ops.nodelm.selective_scan`` (x, delta, A, B_s, C_s, h0, block) -> (y, last, H),
    differentiable in its first six inputs, or None where torch has no ``custom_op`` (< 2.4)."""
    if not hasattr(torch.library, "custom_op"):
        return None

    @torch.library.custom_op("nodelm::selective_scan", mutates_args=(), schema=(
        "(Tensor x, Tensor delta, Tensor A, Tensor B_s, Tensor C_s, Tensor? h0, int block) "
        "-> (Tensor, Tensor, Tensor)"))
    def scan(x, delta, A, B_s, C_s, h0, block):
        y, last, H = _scan_forward(x, delta, A, B_s, C_s, h0, block)
        return y.contiguous(), last.contiguous(), H

    @scan.register_fake
    def _(x, delta, A, B_s, C_s, h0, block):
        (batch, T, D), N = x.shape, A.shape[1]
        return delta.new_empty(batch, T, D), delta.new_empty(batch, D, N), delta.new_empty(T, batch, N, D)

    @torch.library.custom_op("nodelm::selective_scan_backward", mutates_args=(), schema=(
        "(Tensor grad_y, Tensor? grad_last, Tensor x, Tensor delta, Tensor A, Tensor B_s, Tensor C_s, Tensor? h0, "
        "Tensor H, int block) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"))
    def scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block):
        grads = _scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block, h0 is not None)
        return tuple(x.new_empty(0) if g is None else g.contiguous() for g in grads)  # no h0: an empty grad_h0

    @scan_backward.register_fake
    def _(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, block):
        return (*(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, delta, A, B_s, C_s)),
                x.new_empty(0) if h0 is None else torch.empty_like(h0, memory_format=torch.contiguous_format))

    def setup_context(ctx, inputs, output):
        x, delta, A, B_s, C_s, h0, ctx.block = inputs
        ctx.mark_non_differentiable(output[2])  # H: saved for backward, never a result
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, delta, A, B_s, C_s, h0, output[2])

    def backward(ctx, grad_y, grad_last, _grad_H):
        x, delta, A, B_s, C_s, h0, H = ctx.saved_tensors
        if grad_y is None:  # only the last state was used
            grad_y = torch.zeros_like(x)
        *grads, grad_h0 = scan_backward(grad_y, grad_last, x, delta, A, B_s, C_s, h0, H, ctx.block)
        return *grads, None if h0 is None else grad_h0, None

    scan.register_autograd(backward, setup_context=setup_context)
    return scan


COMPILED_SCAN = _define_compiled_scan()


def selective_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B_s: torch.Tensor, C_s: torch.Tensor,
                   h0: torch.Tensor | None = None, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The selective SSM's core: y_{s,d} = sum_n C_{s,n} h_{s,d,n} with
    h_s = exp(Delta_s A) * h_{s-1} + Delta_s x_s B_s and h_{-1} = ``h0`` (default 0).

    x, delta (B, T, D); A (D, N); B_s, C_s (B, T, N); h0 (B, D, N). Returns y (B, T, D) and the
    last state h_{T-1} (B, D, N). Differentiable in every input (``_SelectiveScan``, which works
    through the positions ``block`` at a time; any block gives the same outputs, and gradients
    up to rounding). ``block`` None: ``SCAN_BLOCK`` with autograd, ``inference_block`` without.
    """
    if x.shape != delta.shape or x.dim() != 3:
        raise ValueError(f"x and delta must have the same shape (B, T, D); got {tuple(x.shape)} and {tuple(delta.shape)}")
    if block is not None and block < 1:
        raise ValueError(f"block={block} must be a positive number of positions (or None: the default)")
    differentiated = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                     for t in (x, delta, A, B_s, C_s, h0))
    if x.shape[1] == 1 and not differentiated:
        return _scan_step(x, delta, A, B_s, C_s, h0)
    if compiling() and COMPILED_SCAN is not None:
        y, last, _ = COMPILED_SCAN(x, delta, A, B_s, C_s, h0, block or SCAN_BLOCK)
        return y, last
    if not differentiated:  # no backward: the states need not be kept
        block = block or inference_block(x.shape[0], A.shape[1], A.shape[0], x.element_size())
        y, last, _ = _scan_forward(x, delta, A, B_s, C_s, h0, block, keep_states=False)
        return y, last
    return _SelectiveScan.apply(x, delta, A, B_s, C_s, h0, block or SCAN_BLOCK)


def _scan_step(x, delta, A, B_s, C_s, h0):
    """One position of the scan without autograd (a decoding step): h = exp(Delta A) * h0 +
    Delta x B, y = h C, in the natural (B, D, N) layout. A third of the time-major kernel's
    ops, whose layout pays off only over many positions; the same values up to rounding."""
    d = delta[:, 0, :, None]  # (B, D, 1)
    h = (d * x[:, 0, :, None]) * B_s[:, 0, None, :]  # (B, D, N)
    if h0 is not None:
        h = h.addcmul_(torch.exp2(d * (A * LOG2_E)), h0)  # as the fused scan forms its decays
    return torch.matmul(h, C_s[:, 0, :, None]).transpose(1, 2), h  # y (B, 1, D), last state (B, D, N)


def scan_with(recurrence):
    """A ``selective_scan`` that forms the decays a and inputs b in full, (B, T, D, N), and
    solves h_s = a_s h_{s-1} + b_s with ``recurrence(a, b)``: the chunked ``linear_recurrence``
    (the layer's ``chunk_size`` path) or the sequential reference (the tests' ground truth)."""

    def scan(x, delta, A, B_s, C_s, h0=None):
        a = torch.exp(delta[..., None] * A)
        b = (delta * x)[..., None] * B_s[:, :, None, :]
        if h0 is not None:  # continue from h0: h_0 = a_0 h0 + b_0
            b = torch.cat([b[:, :1] + a[:, :1] * h0[:, None], b[:, 1:]], dim=1)
        states = recurrence(a, b)
        return torch.einsum("btdn,btn->btd", states, C_s), states[:, -1]

    return scan


selective_scan_reference = scan_with(linear_recurrence_reference)


def scan_in_float32(scan, x, delta, A, B_s, C_s, h0=None):
    """``scan(x, delta, A, B_s, C_s, h0)`` with autocast off and every input in float32 (float64
    if one is), y returned in x's dtype and the state in the scan's. Why: h_s multiplies up to T
    decays, which bf16's 8-bit mantissa would not carry, and under autocast the inputs arrive
    mixed (bf16 projections, float32 A(t), on CUDA a float32 softplus), which the fused scan's
    preallocated buffers cannot take."""
    inputs = (x, delta, A, B_s, C_s, h0)
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in inputs if t is not None), torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        y, last = scan(*(None if t is None else t.to(dtype) for t in inputs))
    return y.to(x.dtype), last
