r"""The Jacobian of a continuous-depth model's vector field along its own solve (notebook 04), and
the reverse-mode Jacobians that notebook 04's analyses share.

**The vector field's Jacobian** (``jacobian_spectra``): along the trajectory of one input through
the model's own solve (``nodelm_lib.ode.Solver.trajectory``), the Jacobian
J_i = d f / d x of ``model.ode_block.vector_field`` (ablation switches applied) at each step start
(t_i, x(t_i)), with respect to the whole state (T positions x D). Causal attention makes J block
lower-triangular over positions, so its eigenvalues are the union of those of the diagonal blocks
d f_p / d x_p (``mode="blocks"``, exact; ``"full"`` diagonalises the whole N x N matrix, N = T D).
``"arnoldi"`` is matrix-free for large d: Ritz values of a Krylov space of JVPs estimate the
outer eigenvalues, and Golub-Kahan-Lanczos bidiagonalisation (JVPs and VJPs; power iteration on
J^T J accelerated) the spectral norm. (For ``reversible_heun`` the trajectory holds the solver's
y states; the solver itself evaluates the field at its auxiliary z states.)

These are spectra of dx/dt itself: with ``integration="residual"`` they include the factor
n_steps that the weight spectra (``spectral.py``) leave out (``WeightSpectra.field_scale``).

**Shared tools**: ``analysis_model`` (an eval-mode copy in float64 with frozen parameters) and
``jacobian_rows`` (rows of a Jacobian by reverse mode, batched on the composite attention kernel),
which the Lyapunov analyses (``lyapunov.py``) use as well.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch.func import jvp, vjp

from nodelm_lib import families
from nodelm_lib.models.common import continuous_block

from .spectral import fixed_step_block, real_from_json, real_to_json, sorted_eigvals, summarize


# --------------------------------------------------------------------------- reverse-mode Jacobians


@contextmanager
def _math_attention():
    """The fused CPU / CUDA attention kernels have no forward-mode AD rule (jvp) and may have no
    batching rule for their backward (``is_grads_batched``): use the composite math kernel while
    differentiating so (the same function, other rounding)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def analysis_model(model: torch.nn.Module, dtype: torch.dtype | None = torch.float64) -> torch.nn.Module:
    """An eval-mode copy of ``model`` (no dropout) in ``dtype`` with parameters frozen, for the analyses.

    ``dtype=None`` keeps the model's dtype. The original is not touched.
    """
    copy_ = copy.deepcopy(model)
    if dtype is not None:
        copy_ = copy_.to(dtype)
    copy_.eval()
    for p in copy_.parameters():
        p.requires_grad_(False)
    return copy_


def jacobian_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: torch.Tensor | None = None,
                  chunk_size: int | None = None) -> torch.Tensor:
    """Rows of the Jacobian d fn(x) / d x, flattened: (len(rows), x.numel()), all rows by default.

    Reverse mode: the graph of fn is built once and differentiated along unit cotangents,
    ``chunk_size`` of them per batched backward pass (``is_grads_batched``, attention on the
    composite math kernel, which every device can batch), or one per pass with ``chunk_size=1``.
    The default is 1 on CPU, where the plain loop measured 3x faster than batches of 64-1024,
    and 256 on CUDA. A backward without batching rules (ti_ssm's scan) falls back to the loop.
    Either way this is 10-70x faster here than the same Jacobian by vmapped ``torch.func.jvp``
    (whose elementwise rules go through Python decompositions in this torch).
    """
    chunk = chunk_size or (256 if x.is_cuda else 1)
    batched = chunk > 1
    with (_math_attention() if batched else nullcontext()), torch.enable_grad():
        xg = x.detach().requires_grad_()
        y = fn(xg)
        rows = torch.arange(y.numel(), device=y.device) if rows is None else torch.as_tensor(rows, device=y.device)
        out = []
        for start in range(0, len(rows), chunk):
            sel = rows[start:start + chunk]
            cot = torch.zeros(len(sel), y.numel(), dtype=y.dtype, device=y.device)
            cot[torch.arange(len(sel), device=y.device), sel] = 1.0
            cot = cot.reshape(len(sel), *y.shape)
            if batched:
                try:
                    g = torch.autograd.grad(y, xg, cot, retain_graph=True, is_grads_batched=True)[0]
                except RuntimeError as err:  # a backward without batching rules (ti_ssm's scan): one row at a time
                    if "atching rule" not in str(err):
                        raise
                    batched = False
            if not batched:
                g = torch.stack([torch.autograd.grad(y, xg, c, retain_graph=True)[0] for c in cot])
            out.append(g.reshape(len(sel), -1))
    return torch.cat(out)


# --------------------------------------------------------------------------- the field's Jacobian


def trajectory(model, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's own solve of one input: (step times (n+1,), states x(t_i) for i = 0..n), the
    last being x(1), from ``Solver.trajectory`` on ``model.ode_block.vector_field`` with the block's
    own solver and interval (as ``ODEBlock.forward`` solves it). ``idx`` (B, T); eval mode is the
    caller's business."""
    block = fixed_step_block(model)
    x0 = model.embed(idx)
    _, points = block.solver().trajectory(block.vector_field, x0, block.times(x0.dtype, x0.device))
    return torch.stack([s for s, _, _ in points]), [x for _, x, _ in points]


def field_jacobian(model, t: torch.Tensor, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """d f / d x of ``model.ode_block.vector_field`` at (t, x) for one sequence x (1, T, D), as an
    (N, N) matrix over the flattened state (N = T D; row/column index p D + d), by reverse mode
    (``jacobian_rows``: one graph, one backward pass per row or per ``chunk_size`` rows)."""
    return jacobian_rows(lambda y: model.ode_block.vector_field(t, y), x, chunk_size=chunk_size)


def _lanczos_norm(matvec, rmatvec, n: int, k: int, seed: int, dtype, device) -> float:
    """Largest singular value of A (n x n, given by A v and A^T u) from k steps of Golub-Kahan-Lanczos
    bidiagonalisation with full re-orthogonalisation: sigma_max of the k x k bidiagonal matrix
    (exact when k = n; the largest singular value converges first)."""
    k = min(k, n)
    g = torch.Generator().manual_seed(seed)
    V = torch.zeros(k + 1, n, dtype=dtype, device=device)
    U = torch.zeros(k, n, dtype=dtype, device=device)
    alpha, beta = [], []
    v = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    V[0] = v / v.norm()
    for j in range(k):
        u = matvec(V[j])
        for _ in range(2):
            u = u - (U[:j] @ u) @ U[:j]
        alpha.append(float(u.norm()))
        if alpha[-1] == 0.0:
            break
        U[j] = u / alpha[-1]
        w = rmatvec(U[j])
        for _ in range(2):
            w = w - (V[: j + 1] @ w) @ V[: j + 1]
        beta.append(float(w.norm()))
        if beta[-1] < 1e-12 * max(alpha):
            break
        V[j + 1] = w / beta[-1]
    m = len(alpha)
    B = torch.diag(torch.tensor(alpha, dtype=torch.float64))
    if m > 1:
        B += torch.diag(torch.tensor(beta[: m - 1], dtype=torch.float64), 1)
    return float(torch.linalg.matrix_norm(B, ord=2))


def _arnoldi(matvec, n: int, m: int, seed: int, dtype, device) -> np.ndarray:
    """Ritz values of an m-step Arnoldi process (full re-orthogonalisation)."""
    m = min(m, n)
    g = torch.Generator().manual_seed(seed)
    V = torch.zeros(m + 1, n, dtype=dtype, device=device)
    Hm = torch.zeros(m + 1, m, dtype=torch.float64)
    v = torch.randn(n, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    V[0] = v / v.norm()
    for j in range(m):
        w = matvec(V[j])
        for _ in range(2):  # twice is enough (Kahan)
            c = V[: j + 1] @ w
            w = w - c @ V[: j + 1]
            Hm[: j + 1, j] += c.double().cpu()
        Hm[j + 1, j] = float(w.norm())
        if Hm[j + 1, j] < 1e-12 * max(1.0, float(Hm[: j + 1, j].abs().max())):  # invariant subspace found
            m = j + 1
            break
        V[j + 1] = w / Hm[j + 1, j]
    return sorted_eigvals(Hm[:m, :m])


@dataclass
class JacobianSpectra:
    """Spectra of d f / d x along one trajectory: per step start time, the eigenvalues (all N, or
    the Ritz values with ``mode="arnoldi"``), the spectral radius, the largest real part, the
    spectral norm (largest singular value) and the root mean square of the state x(t_i) (the
    layer norms divide by each token's standard deviation, so a small state means a large J).

    ``stats`` holds ``summarize`` of each time's eigenvalues, which is all the tables and figures
    use: ``to_dict`` keeps it instead of the eigenvalues (T D of them per time, 5248 for 41 tokens
    at d = 128), so a result read back (``from_dict``) has ``eigenvalues=None``."""

    mode: str
    times: np.ndarray
    eigenvalues: list[np.ndarray] | None
    spectral_norm: np.ndarray
    state_rms: np.ndarray
    tokens: list[int]
    stats: list[dict] = field(default=None, repr=False)

    def __post_init__(self):
        if self.stats is None:
            if self.eigenvalues is None:
                raise ValueError("JacobianSpectra needs its eigenvalues or their stats (summarize's dicts)")
            self.stats = [summarize(e) for e in self.eigenvalues]

    @property
    def spectral_radius(self) -> np.ndarray:
        return np.array([s["spectral_radius"] for s in self.stats])

    @property
    def max_real(self) -> np.ndarray:
        return np.array([s["max_real"] for s in self.stats])

    def summary(self) -> pd.DataFrame:
        return pd.DataFrame([dict(step=i, t=float(t), kind="jacobian", head=-1, **stats,
                                  spectral_norm=float(s), state_rms=float(r), mode=self.mode)
                             for i, (t, stats, s, r) in enumerate(zip(self.times, self.stats, self.spectral_norm,
                                                                      self.state_rms))])

    def to_dict(self) -> dict:
        """Everything but the eigenvalues, as JSON (class docstring)."""
        return dict(mode=self.mode, times=real_to_json(self.times), spectral_norm=real_to_json(self.spectral_norm),
                    state_rms=real_to_json(self.state_rms), tokens=[int(t) for t in self.tokens],
                    stats=[dict(s) for s in self.stats])

    @classmethod
    def from_dict(cls, data: dict) -> "JacobianSpectra":
        return cls(data["mode"], real_from_json(data["times"]), None, real_from_json(data["spectral_norm"]),
                   real_from_json(data["state_rms"]), list(data["tokens"]), [dict(s) for s in data["stats"]])


def jacobian_spectra(model, idx: torch.Tensor, mode: str = "blocks", n_krylov: int = 64,
                     dtype: torch.dtype | None = torch.float64, chunk_size: int | None = None,
                     seed: int = 0) -> JacobianSpectra:
    """Eigenvalues and spectral norm of the field's Jacobian at each step start of the model's own
    solve of ``idx`` (T,) or (1, T) (module docstring). ``mode``: ``"blocks"`` (exact: the union of
    the D x D diagonal blocks' eigenvalues), ``"full"`` (exact: the whole N x N matrix), or
    ``"arnoldi"`` (matrix-free estimates: ``n_krylov`` JVPs per time for the Ritz values, and
    ``n_krylov`` JVP + VJP pairs of Golub-Kahan-Lanczos for the norm). In the explicit modes the
    spectral norm comes from ``n_krylov`` Lanczos steps on J (exact when n_krylov >= N; an SVD of
    a few thousand rows cost seconds per t here). Computed on an eval copy in ``dtype``."""
    if mode not in ("blocks", "full", "arnoldi"):
        raise ValueError(f"mode={mode!r} is not valid; choose 'blocks', 'full' or 'arnoldi'")
    continuous_block(model, "jacobian_spectra")
    if mode == "arnoldi" and not families.get(model.cfg.arch).forward_mode:
        raise ValueError(f"mode='arnoldi' needs forward-mode AD (torch.func.jvp), which {model.cfg.arch} does not "
                         f"support (its declaration says forward_mode=False); use 'blocks' or 'full'")
    m = analysis_model(model, dtype)
    idx = idx.reshape(1, -1).to(next(m.parameters()).device)
    with torch.no_grad():
        times, states = trajectory(m, idx)
    times, states = times[:-1], states[:-1]  # the Jacobian where each step starts
    eigs, norms = [], []
    for t, x in zip(times, states):
        _, T, D = x.shape
        N = T * D
        if mode == "arnoldi":
            f = lambda y: m.ode_block.vector_field(t, y.reshape(x.shape)).reshape(-1)  # noqa: E731
            xf = x.reshape(-1)
            with _math_attention():
                matvec = lambda v: jvp(f, (xf,), (v,))[1]  # noqa: E731
                _, pullback = vjp(f, xf)
                rmatvec = lambda u: pullback(u)[0]  # noqa: E731
                eigs.append(_arnoldi(matvec, N, n_krylov, seed, x.dtype, x.device))
                norms.append(_lanczos_norm(matvec, rmatvec, N, n_krylov, seed, x.dtype, x.device))
            continue
        J = field_jacobian(m, t, x, chunk_size)
        if mode == "full":
            eigs.append(sorted_eigvals(J))
        else:
            blocks = torch.stack([J[p * D:(p + 1) * D, p * D:(p + 1) * D] for p in range(T)])
            e = sorted_eigvals(blocks).reshape(-1)
            eigs.append(e[np.lexsort((-e.imag, -np.abs(e)))])
        norms.append(_lanczos_norm(lambda v: J @ v, lambda u: J.T @ u, N, n_krylov, seed, J.dtype, J.device))
    rms = np.array([float(x.double().pow(2).mean().sqrt()) for x in states])
    return JacobianSpectra(mode, times.double().cpu().numpy(), eigs, np.array(norms), rms, idx[0].tolist())
