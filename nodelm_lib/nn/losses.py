"""The output head's loss: cross-entropy of ``h @ W.T`` computed in row chunks, so that the
(N, V) logits never exist at once (``linear_cross_entropy``), on a CPU; on a GPU the plain
``F.linear`` + ``F.cross_entropy``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


# Rows per chunk so that one chunk of logits holds about 8M floats (32 MB): the full
# (B*T, V) logits of a GPT-2-vocabulary batch are ~400 MB, and allocating and freeing them
# every step dominated the step time on CPU.
CHUNK_LOGITS = 2**23

# Vocabulary columns per product in the forward z = h W^T. Its inner size is only D, so one
# product over the whole vocabulary streams a (rows, V) output that leaves the cache before it is
# complete; in blocks of this many columns each block of z (and of W) stays in L2 while it is
# written. Every logit is the same length-D dot product either way (bitwise equal with MKL).
# 256 to 2048 columns run alike; the measurement is on the docs' Benchmarks page (bench/head_loss.py).
HEAD_COLUMNS = 1024


def _logits(h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = h @ weight.T``, written ``HEAD_COLUMNS`` vocabulary columns at a time (in place:
    a slice of ``out`` keeps the row stride BLAS writes with)."""
    for j in range(0, weight.shape[0], HEAD_COLUMNS):
        torch.mm(h, weight[j:j + HEAD_COLUMNS].t(), out=out[:, j:j + HEAD_COLUMNS])
    return out


def _chunked_cross_entropy(h, weight, targets, chunk: int, with_grads: bool):
    r"""Mean cross-entropy of z = h W^T against ``targets`` and, if asked, its gradients.

    Per chunk of rows: loss += logsumexp(z) - z_y; and since the loss is a scalar, its
    gradients are formed at once: G = (softmax(z) - onehot(y)) / N, dL/dh = G W,
    dL/dW += G^T h. One logits buffer is reused for every chunk and all softmax work is in
    place: fresh (N, V) allocations cost more than the matmuls on CPU (page faults).
    """
    n, vocab = h.shape[0], weight.shape[0]
    acc = torch.promote_types(h.dtype, torch.float32)  # softmax and sums in >= float32
    h, weight = h.to(acc), weight.to(acc)
    total = torch.zeros((), dtype=acc, device=h.device)
    grad_h = torch.empty_like(h) if with_grads else None
    grad_w = torch.zeros_like(weight) if with_grads else None
    buf = torch.empty(min(chunk, n), vocab, dtype=acc, device=h.device)
    for start in range(0, n, chunk):
        hc, yc = h[start:start + chunk], targets[start:start + chunk]
        z = buf[: hc.shape[0]]
        _logits(hc, weight, out=z)
        total += _softmax_cross_entropy_(z, yc, n, with_grads)
        if with_grads:
            torch.mm(z, weight, out=grad_h[start:start + chunk])
            grad_w.addmm_(z.t(), hc)
    return total / n, grad_h, grad_w


def _softmax_cross_entropy_(z: torch.Tensor, targets: torch.Tensor, n: int, with_grads: bool) -> torch.Tensor:
    """The summed cross-entropy of the logits ``z`` (rows, V) against ``targets``; with
    ``with_grads``, z becomes (softmax(z) - onehot(y)) / n in place (its gradient in a mean over n
    rows), else exp(z - max)."""
    z_y = z.gather(1, targets[:, None]).squeeze(1)
    z_max = z.amax(dim=-1)
    z.sub_(z_max[:, None]).exp_()
    z_sum = z.sum(dim=-1)
    if with_grads:
        z.div_(z_sum[:, None] * n)  # softmax / N
        z[torch.arange(z.shape[0], device=z.device), targets] -= 1.0 / n
    return (z_sum.log() + z_max - z_y).sum()


# Rows whose low-precision gradient logits G are kept for one pair of gradient products (about
# 128M values, 256 MB in bf16): see _chunked_cross_entropy_low_precision.
LOW_PRECISION_LOGITS = 2**27


# The low-precision loss's gradient logits G, kept between calls, one buffer per (dtype, device):
# at the GPT-2 vocabulary and 2048 rows G is 206 MB in bf16, above the largest chunk glibc serves
# from its heap (32 MB, even with ``profiling.keep_freed_memory``), so a fresh one came from mmap and
# page-faulted ~50,000 times every step, a seventh of a bf16 seed-config step. ``release_kept_buffers``
# frees it (``nl.train`` does when its steps end).
_KEPT_GRADIENT_LOGITS: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _kept_gradient_logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (rows, vocab) buffer for G from ``_KEPT_GRADIENT_LOGITS``, grown when too small. Its
    contents are garbage and every row is written before it is read; one loss at a time per
    process uses it (as training does)."""
    key = (dtype, torch.device(device))
    kept = _KEPT_GRADIENT_LOGITS.get(key)
    if kept is None or kept.numel() < rows * vocab:
        kept = _KEPT_GRADIENT_LOGITS[key] = torch.empty(rows * vocab, dtype=dtype, device=device)
    return kept[:rows * vocab].view(rows, vocab)


def release_kept_buffers() -> None:
    """Free the buffers the low-precision head loss keeps between calls (``_KEPT_GRADIENT_LOGITS``)."""
    _KEPT_GRADIENT_LOGITS.clear()


def _chunked_cross_entropy_low_precision(h, weight, targets, chunk: int, with_grads: bool, dtype: torch.dtype):
    """``_chunked_cross_entropy`` with its three products in ``dtype`` (CPU autocast's bf16), as
    autocast runs a linear layer, and the softmax in float32, as autocast runs a cross-entropy.

    Each chunk's logits come out of the product in ``dtype`` and are widened into the float32
    buffer for the softmax. The gradient logits G are narrowed back into a buffer that holds up
    to ``LOW_PRECISION_LOGITS`` of them, and both gradient products run once per buffer: per
    chunk, dL/dW would be a (V, D) low-precision product added into float32 every time.
    Gradients match float32 to ~2e-3 relative (bf16's rounding); the loss to ~1e-6.
    """
    n, vocab = h.shape[0], weight.shape[0]
    h_low, w_low = h.to(dtype), weight.to(dtype)
    group = max(chunk, LOW_PRECISION_LOGITS // vocab) if with_grads else chunk
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if with_grads else None
    grad_w = None
    G = _kept_gradient_logits(min(group, n), vocab, dtype, h.device) if with_grads \
        else torch.empty(min(chunk, n), vocab, dtype=dtype, device=h.device)
    buf = torch.empty(min(chunk, n), vocab, dtype=torch.float32, device=h.device)
    for first in range(0, n, group):
        last = min(first + group, n)
        for start in range(first, last, chunk):
            stop = min(start + chunk, last)
            z_low = G[start - first:stop - first]
            z = buf[:stop - start].copy_(_logits(h_low[start:stop], w_low, out=z_low))
            total += _softmax_cross_entropy_(z, targets[start:stop], n, with_grads)
            if with_grads:
                z_low.copy_(z)
        if with_grads:
            G_rows = G[:last - first]
            grad_h[first:last] = torch.mm(G_rows, w_low)
            part = torch.mm(G_rows.t(), h_low[first:last])
            grad_w = part.float() if grad_w is None else grad_w.add_(part)
    return total / n, grad_h, grad_w


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype narrower than float32 that autocast runs products in on ``device``'s type, or None."""
    kind = device.type
    try:  # torch >= 2.4
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    except (TypeError, AttributeError):  # older: is_autocast_enabled() takes no device type
        dtype = torch.get_autocast_cpu_dtype() if kind == "cpu" and torch.is_autocast_cpu_enabled() else None
    return dtype if dtype is not None and dtype.itemsize < 4 else None


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper: forward computes the gradients, backward only scales them."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk, low_dtype):
        loss, grad_h, grad_w = _head_loss(h, weight, targets, chunk, True, low_dtype)
        ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        if not torch.compiler.is_compiling() and grad_out.device.type == "cpu" and grad_out.item() == 1.0:
            # loss.backward(): hand over the gradients themselves. grad_w * 1 would be a fresh
            # (V, D) tensor (51 MB at the GPT-2 vocabulary), above glibc's largest heap chunk, so
            # mmap'd and page-faulted on every step. Safe: the engine frees the saved
            # tensors before the weight's gradient is accumulated, so AccumulateGrad takes this
            # tensor as .grad (and copies it instead while the graph is retained). Not while
            # compiling: .item() would break the graph (and the compiled step has its own buffers).
            return grad_h, grad_w, None, None, None
        return grad_h * grad_out, grad_w * grad_out, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(h @ weight.T, targets)`` for h (N, D), weight (V, D), targets (N,),
    computed in row chunks so the (N, V) logits never exist at once (``chunk`` rows each).

    Under CPU autocast (bf16) the three products run in bf16 and the softmax in float32, as
    autocast would run a linear layer and a cross-entropy (``_chunked_cross_entropy_low_precision``):
    autocast itself does not cast the chunked path's ``mm(out=)``, which kept the head, most of a
    large-vocabulary step, in float32.

    Only on a CPU, where it was measured to pay. On a GPU (``chunk`` not given) the loss is
    the plain ``F.cross_entropy(F.linear(h, weight), targets)``: the caching allocator makes
    the (N, V) buffers free to reuse, autocast runs the product in bf16, and ``torch.compile``
    fuses the softmax; the chunked loop would keep this head in float32, most of a GPU step at
    a 50257-token vocabulary."""
    if chunk is None and h.device.type != "cpu":
        return F.cross_entropy(F.linear(h, weight), targets)
    chunk = chunk or max(1, CHUNK_LOGITS // weight.shape[0])
    low_dtype = autocast_dtype(h.device)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(h, weight, targets, chunk, low_dtype)
    return _head_loss(h, weight, targets, chunk, False, low_dtype)[0]


def _head_loss(h, weight, targets, chunk, with_grads, low_dtype):
    """Loss and (if ``with_grads``) gradients, with the products in ``low_dtype`` unless None."""
    if low_dtype is None:
        return _chunked_cross_entropy(h, weight, targets, chunk, with_grads)
    return _chunked_cross_entropy_low_precision(h, weight, targets, chunk, with_grads, low_dtype)
