"""The Triton kernels of ``scan_triton`` (the recurrence and its gradients are stated there).
A module of its own because it imports Triton at load: ``scan_triton`` imports it on first use,
so a machine without Triton never does. Triton finds a kernel's helpers among its module's globals."""

import triton
import triton.language as tl


@triton.jit
def channel_tile(D, N, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's channels d and states n, their masks, and the offsets of its (d, n) tile
    in a (D, N) array."""
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    dm, nm = d < D, n < N
    return d, n, dm, nm, dm[:, None] & nm[None, :], d[:, None] * N + n[None, :]


@triton.jit
def load_or_zeros(ptr, offsets, mask, PRESENT: tl.constexpr, like):
    """A tile of an optional input (an initial state, a gradient), zeros where it is absent."""
    if PRESENT:
        tile = tl.load(ptr + offsets, mask=mask, other=0.0)
    else:
        tile = tl.zeros_like(like)
    return tile


@triton.jit
def forward(x_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, y_ptr, last_ptr, H_ptr,
            T, D, N, HAS_H0: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """y, the last state and every state H of sequence ``program_id(0)``'s channel block
    ``program_id(1)``, walking the positions with the state in registers."""
    b = tl.program_id(0)
    d, n, dm, nm, dn, state = channel_tile(D, N, BLOCK_D, BLOCK_N)
    A = tl.load(A_ptr + state, mask=dn, other=0.0)
    h = load_or_zeros(h0_ptr + b * D * N, state, dn, HAS_H0, A)
    for s in tl.range(0, T, num_stages=STAGES):  # loads issued STAGES - 1 positions ahead
        row = (b * T + s) * D
        x = tl.load(x_ptr + row + d, mask=dm, other=0.0)
        dt = tl.load(delta_ptr + row + d, mask=dm, other=0.0)
        Bs = tl.load(B_ptr + (b * T + s) * N + n, mask=nm, other=0.0)
        Cs = tl.load(C_ptr + (b * T + s) * N + n, mask=nm, other=0.0)
        h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * Bs[None, :]
        tl.store(H_ptr + (b * T + s) * D * N + state, h, mask=dn)
        tl.store(y_ptr + row + d, tl.sum(h * Cs[None, :], axis=1), mask=dm)
    tl.store(last_ptr + b * D * N + state, h, mask=dn)


@triton.jit
def backward(gy_ptr, glast_ptr, x_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, H_ptr,
             gx_ptr, gdelta_ptr, gA_ptr, gB_ptr, gC_ptr, gh0_ptr,
             T, D, N, HAS_H0: tl.constexpr, HAS_GLAST: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """The gradients of one sequence's channel block, walking the positions back from the stored
    states: x's and Delta's in full; A's per sequence, B_s's and C_s's per channel block (partial
    sums that the caller adds); h0's where there is one."""
    b, blk = tl.program_id(0), tl.program_id(1)
    d, n, dm, nm, dn, state = channel_tile(D, N, BLOCK_D, BLOCK_N)
    A = tl.load(A_ptr + state, mask=dn, other=0.0)
    g = load_or_zeros(glast_ptr + b * D * N, state, dn, HAS_GLAST, A)
    gA = tl.zeros_like(A)
    h_init = load_or_zeros(h0_ptr + b * D * N, state, dn, HAS_H0, A)  # the state before position 0
    h = tl.load(H_ptr + (b * T + T - 1) * D * N + state, mask=dn, other=0.0)  # h_s; each step reads h_{s-1}
    for i in tl.range(0, T, num_stages=STAGES):
        s = T - 1 - i
        row = (b * T + s) * D
        x = tl.load(x_ptr + row + d, mask=dm, other=0.0)
        dt = tl.load(delta_ptr + row + d, mask=dm, other=0.0)
        gy = tl.load(gy_ptr + row + d, mask=dm, other=0.0)
        Bs = tl.load(B_ptr + (b * T + s) * N + n, mask=nm, other=0.0)
        Cs = tl.load(C_ptr + (b * T + s) * N + n, mask=nm, other=0.0)
        before = tl.load(H_ptr + (b * T + tl.maximum(s - 1, 0)) * D * N + state, mask=dn, other=0.0)
        h_prev = tl.where(s > 0, before, h_init)
        # partial sums of this program's channels: torch adds the programs' in a fixed order
        part = (blk * (tl.num_programs(0) * T) + b * T + s) * N + n
        tl.store(gC_ptr + part, tl.sum(gy[:, None] * h, axis=0), mask=nm)
        g += gy[:, None] * Cs[None, :]
        a = tl.exp(dt[:, None] * A)
        ga_a = g * h_prev * a  # grad a_s times a_s
        gA += ga_a * dt[:, None]
        gBx = tl.sum(g * Bs[None, :], axis=1)  # sum_n g B_s, per channel
        tl.store(gdelta_ptr + row + d, tl.sum(ga_a * A, axis=1) + x * gBx, mask=dm)
        tl.store(gx_ptr + row + d, dt * gBx, mask=dm)
        tl.store(gB_ptr + part, tl.sum(g * (dt * x)[:, None], axis=0), mask=nm)
        g = g * a
        h = h_prev
    tl.store(gA_ptr + b * D * N + state, gA, mask=dn)  # one partial per sequence
    if HAS_H0:
        tl.store(gh0_ptr + b * D * N + state, g, mask=dn)
