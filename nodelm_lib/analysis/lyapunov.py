r"""Finite-time Lyapunov exponents of a flow, by the QR (Benettin) method on the solver's own step map.

**Method.** A fixed-step explicit Runge-Kutta solve is a sequence of maps
x_{m+1} = Phi_m(x_m) = ``rk_step(field, tableau, s_m, dt, x_m)`` on the grid the solver uses
(``t[i] + j dt``, ``dt = (t[i+1] - t[i]) / steps_per_interval``: ``Solver.step_times``).
Perturbations are advanced by the Jacobians of these maps, J_m = dPhi_m/dx (x_m), applied to an
orthonormal basis Q_m of k tangent vectors; each step re-orthonormalises by QR,

    J_m Q_m = Q_{m+1} R_m,      lambda_i = (1 / tau) * sum_m log |(R_m)_ii|,

with tau the time covered by the summed steps (steps in a discarded transient still align the
basis but are not summed). These are the exponents of the discrete solve, which converge to the
continuous ones as dt -> 0 (for dx/dt = A x and rk4 they are (1/dt) log|P(dt mu)|, P the rk4
stability polynomial and mu the eigenvalues of A, i.e. Re(mu) up to O(dt^4)).

**Tangents.** ``tangent="jvp"`` applies J_m to the k basis vectors with ``torch.func.jvp``
vectorised by ``torch.func.vmap`` (matrix-free). ``tangent="jacobian"`` forms J_m by reverse mode
and multiplies: the same J_m (a test checks that both give the same exponents). Reverse mode is
the fast one with the installed torch on CPU: forward-mode AD of elementwise ``mul``/``add``/
``addcmul`` runs through Python reference decompositions (measured 0.1-0.6 ms per op against
5 us for ``sin`` or ``mm``), which dominates a 3-dimensional system like Lorenz-63, and a
vmapped JVP Jacobian of a small LM field took 10-70x longer than the reverse-mode one.

**Language models** (``token_sensitivity``, ``token_lyapunov_spectrum``): the state is the
whole embedded sequence x (1, T, D), the field ``model.ode_block.vector_field`` (ablation
switches applied), the method and number of steps the model's own ``ode`` config, over the
solver's interval [0, 1] (tau = 1). The log growth is divided by that depth time, not by the
number of steps: rates per unit of depth t, which for one flow converge as dt -> 0, where a
per-step rate would shrink like 1 / n_steps (divide by n_steps for a per-layer rate). Jacobians
(of one step map, or of the whole flow) are formed explicitly by reverse mode
(``jacobian.jacobian_rows``).
Causal attention makes every Jacobian block lower-triangular over positions: x_i(1) depends on
x_j(0) for j <= i only. Over one unit of
time and a handful of steps the "exponents" are finite-time growth rates of that one map; the
docstrings below say exactly which quantity each function returns. They apply to ``ti_ssm``
too (its scan's ``autograd.Function`` has a batchable backward, but no forward-mode rule).

The reverse-mode Jacobians and the analysis copy of a model are ``jacobian.py``'s; the figures of
these exponents are ``dynamics_figures.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch.func import jvp, vmap

from nodelm_lib.models.common import continuous_block
from nodelm_lib.ode import TABLEAUS, Solver, rk_step

from .jacobian import analysis_model, jacobian_rows
from .spectral import real_from_json, real_to_json

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- generic flows


@dataclass
class LyapunovSpectrum:
    """Result of ``lyapunov_spectrum``.

    ``exponents`` (k,) sorted in decreasing order (the mean over trajectories when several were
    integrated); ``per_trajectory`` (B, k) each trajectory's exponents in QR order (B = 1 without
    a batch);
    ``time`` the averaging time tau; ``n_steps`` the steps summed; ``history`` (n_steps, k) the
    running estimate after each summed step (mean over trajectories), if asked for; ``x_final``
    the state at the end.
    """

    exponents: torch.Tensor
    per_trajectory: torch.Tensor
    time: float
    n_steps: int
    history: torch.Tensor | None
    x_final: torch.Tensor

    @property
    def standard_error(self) -> torch.Tensor:
        """Standard error of ``exponents`` over independent trajectories (NaN for one trajectory)."""
        b = self.per_trajectory.shape[0]
        if b < 2:
            return torch.full_like(self.exponents, float("nan"))
        per = self.per_trajectory.sort(dim=1, descending=True).values
        return per.std(dim=0) / math.sqrt(b)


def _tableau(method: str):
    if method not in TABLEAUS:
        raise ValueError(f"method={method!r} is not valid for the Lyapunov step map; choose one of "
                         f"{', '.join(map(repr, TABLEAUS))} (explicit fixed-step Runge-Kutta)")
    return TABLEAUS[method]


def step_grid(t: torch.Tensor, steps_per_interval: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (s, dt) of every step a fixed-step solve over ``t`` takes (``Solver.step_times``):
    dt = (t[i+1] - t[i]) / k and s = t[i] + j dt."""
    return Solver("euler", steps_per_interval).step_times(t)


def _random_basis(n: int, k: int, seed: int, dtype, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    return q.to(dtype=dtype, device=device)


def _qr_log_growth(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and log|diag R| of the QR factorisation of V (..., n, k)."""
    Q, R = torch.linalg.qr(V)
    return Q, torch.diagonal(R, dim1=-2, dim2=-1).abs().log()


def lyapunov_spectrum(field: Field, x0: torch.Tensor, t: torch.Tensor, method: str = "rk4",
                      steps_per_interval: int = 1, n_exponents: int | None = None, transient_steps: int = 0,
                      batch: bool = False, tangent: str = "jvp", chunk_size: int | None = None,
                      history: bool = False, seed: int = 0) -> LyapunovSpectrum:
    """Lyapunov exponents of dx/dt = field(t, x) by the QR method on the RK step map (module docstring).

    ``x0`` is one state of any shape (N = x0.numel() dimensions), or with ``batch=True`` a batch
    (B, ...) of B independent initial states, each with its own tangent basis; ``field`` is then
    called on the whole batch, as ``nl.odeint`` calls it, and must act on each row independently.
    ``t`` and ``steps_per_interval`` define the grid as in ``nl.odeint``; ``method`` is an explicit
    RK tableau. The first ``transient_steps`` steps evolve the state and align the basis but are
    not summed. ``n_exponents`` (default N) tangent vectors start as a random orthonormal basis
    (``seed``). ``tangent``: ``"jvp"`` (matrix-free, vmapped over the k tangents; ``chunk_size``
    bounds the vmap) or ``"jacobian"`` (each J_m formed by reverse mode, one batched backward pass;
    for small N). Works in x0's dtype: use float64.
    """
    tableau = _tableau(method)
    if tangent not in ("jvp", "jacobian"):
        raise ValueError(f"tangent={tangent!r} is not valid; choose 'jvp' or 'jacobian'")
    grid = step_grid(t.to(device=x0.device, dtype=x0.dtype), steps_per_interval)
    if not 0 <= transient_steps < len(grid):
        raise ValueError(f"transient_steps={transient_steps} must be in [0, {len(grid)}) "
                         f"(the grid has {len(grid)} steps)")
    xb = x0 if batch else x0.unsqueeze(0)  # (B, *shape): one code path
    B, shape = xb.shape[0], xb.shape[1:]
    n = math.prod(shape)
    k = n if n_exponents is None else n_exponents
    if not 1 <= k <= n:
        raise ValueError(f"n_exponents={n_exponents} must be in [1, {n}]")
    unbatch = (lambda y: y) if batch else (lambda y: y.squeeze(0))  # noqa: E731
    rebatch = (lambda y: y) if batch else (lambda y: y.unsqueeze(0))  # noqa: E731
    eye = torch.eye(n, dtype=x0.dtype, device=x0.device).reshape(n, 1, *shape).expand(n, B, *shape)

    def advance(x, Q, s, dt):
        """One step of every trajectory: x (B, *shape), Q (B, n, k) -> x_next, J Q (B, n, k)."""
        step = lambda y: rebatch(rk_step(field, tableau, s, dt, unbatch(y)))  # noqa: E731
        if tangent == "jacobian":
            with torch.enable_grad():
                xg = x.detach().requires_grad_()
                y = step(xg)
                rows = torch.autograd.grad(y, xg, eye, is_grads_batched=True)[0]  # rows[i, b] = e_i^T J_b
            J = rows.reshape(n, B, n).transpose(0, 1)
            return y.detach(), J @ Q
        cols = Q.permute(2, 0, 1).reshape(k, B, *shape)  # column c of every trajectory's basis
        ys, V = vmap(lambda v: jvp(step, (x,), (v,)), chunk_size=chunk_size)(cols)
        return ys[0], V.reshape(k, B, n).permute(1, 2, 0)

    x = xb.detach()
    Q = _random_basis(n, k, seed, x0.dtype, x0.device).expand(B, n, k).contiguous()
    total = torch.zeros(B, k, dtype=torch.float64, device=x0.device)
    running = []
    tau = 0.0
    for m, (s, dt) in enumerate(grid):
        x, V = advance(x, Q, s, dt)
        Q, log_r = _qr_log_growth(V)
        if m >= transient_steps:
            total = total + log_r.to(torch.float64)
            tau += float(dt)
            if history:
                running.append((total / tau).mean(0))
    per = total / tau
    exponents = per.mean(0).sort(descending=True).values
    return LyapunovSpectrum(exponents, per, tau, len(grid) - transient_steps,
                            torch.stack(running) if history else None, unbatch(x))


# --------------------------------------------------------------------------- language models


def model_step_maps(model: torch.nn.Module,
                    dtype: torch.dtype | None = None) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The solver's step maps x -> x_next of a continuous-depth model, in order.

    Each is ``rk_step(model.ode_block.vector_field, tableau, s, dt, x)`` with the model's method
    and the grid its ``ODEBlock`` solves on (``ODEBlock.step_times`` in the state's dtype), so
    composing them reproduces ``model.ode_block(x)`` (a test checks it).
    """
    block = continuous_block(model, "the Lyapunov analysis")
    tableau = _tableau(block.ode.method)
    if dtype is None:
        dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    return [(lambda x, s=s, dt=dt: rk_step(block.vector_field, tableau, s, dt, x))
            for s, dt in block.step_times(dtype, device)]


def initial_state(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """x(0) for idx (B, T): the embedded sequence, ``model.embed(idx)``."""
    return model.embed(idx)


@dataclass
class TokenSensitivity:
    """Result of ``token_sensitivity`` for one sequence of T tokens.

    ``exponent[i, j] = (1/tau) log sigma_max(d x_i(1) / d x_j(0))`` for j <= i and NaN above the
    diagonal (exactly zero blocks: causality); ``sigma_max[i, j]`` the largest singular values
    themselves (zeros above the diagonal, as computed); ``tokens`` the ids; tau = 1.
    """

    exponent: np.ndarray
    sigma_max: np.ndarray
    tokens: list[int]
    time: float

    def frame(self) -> pd.DataFrame:
        """Long format: one row per (output position i, input position j <= i)."""
        T = len(self.tokens)
        rows = [dict(i=i, j=j, token_i=self.tokens[i], token_j=self.tokens[j], sigma_max=self.sigma_max[i, j],
                     exponent=self.exponent[i, j]) for i in range(T) for j in range(i + 1)]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """The largest singular values, tokens and time as JSON; ``from_dict`` computes the
        exponents from them as ``token_sensitivity`` does (``sensitivity_exponents``)."""
        return dict(sigma_max=real_to_json(self.sigma_max), tokens=[int(t) for t in self.tokens], time=self.time)

    @classmethod
    def from_dict(cls, data: dict) -> "TokenSensitivity":
        sigma = real_from_json(data["sigma_max"])
        return cls(sensitivity_exponents(sigma, data["time"]), sigma, list(data["tokens"]), float(data["time"]))


def sensitivity_exponents(sigma_max: np.ndarray, tau: float) -> np.ndarray:
    """(1/tau) log sigma_max for j <= i, NaN above the diagonal (zero blocks: causality)."""
    with np.errstate(divide="ignore"):
        exponent = np.log(sigma_max) / tau
    exponent[np.triu_indices(len(sigma_max), k=1)] = np.nan
    return exponent


def flow_jacobian(model: torch.nn.Module, x0: torch.Tensor, rows: torch.Tensor | None = None,
                  chunk_size: int | None = None) -> torch.Tensor:
    """d x(1) / d x(0) through the model's own step maps (``model_step_maps``) for one sequence
    x0 (1, T, D), as an (N, N) matrix over the flattened state (index p D + d), or its ``rows``."""
    steps = model_step_maps(model, x0.dtype)

    def flow(x):
        for step in steps:
            x = step(x)
        return x

    return jacobian_rows(flow, x0, rows, chunk_size)


def token_sensitivity(model: torch.nn.Module, idx: torch.Tensor, dtype: torch.dtype | None = torch.float64,
                      chunk_size: int | None = None) -> TokenSensitivity:
    r"""Token-level sensitivity heat-map over one sequence ``idx`` (T,) or (1, T).

    For output position i and input position j,

    .. math:: S_{ij} = \frac{1}{\tau} \log \sigma_{\max}\Big(\frac{\partial x_i(1)}{\partial x_j(0)}\Big),

    the maximal finite-time growth rate over [0, tau = 1] of a perturbation of token j's embedded
    state x_j(0), seen at token i's final hidden state x_i(1) (before the final layer norm), with
    x(1) the model's own solve. The D x D blocks are cut from the flow Jacobian ``flow_jacobian``
    ((T D)^2 entries, held in memory). S_ii is the largest exponent of
    ``token_lyapunov_spectrum(position=i)``'s singular-value spectrum. Computed on an eval copy in
    ``dtype`` (float64 by default).
    """
    m = analysis_model(model, dtype)
    idx = idx.reshape(1, -1).to(m.wte.weight.device)
    with torch.no_grad():
        x0 = initial_state(m, idx)
    _, T, D = x0.shape
    J = flow_jacobian(m, x0, chunk_size=chunk_size)  # J[i D + b, j D + a] = d x_{i,b}(1) / d x_{j,a}(0)
    blocks = J.reshape(T, D, T, D).permute(0, 2, 1, 3)  # [i, j] = d x_i(1) / d x_j(0), (D_out, D_in)
    sigma = torch.linalg.matrix_norm(blocks, ord=2).double().cpu().numpy()
    tau = 1.0
    return TokenSensitivity(sensitivity_exponents(sigma, tau), sigma, idx[0].tolist(), tau)


@dataclass
class TokenSpectrum:
    """Result of ``token_lyapunov_spectrum`` at one position.

    ``qr``: the QR (Benettin) exponents (1/tau) sum_m log|(R_m)_kk| of the diagonal-block
    cocycle, started from the identity basis, in decreasing order; ``svd``: (1/tau) log of the
    singular values of Phi = d x_p(1) / d x_p(0), decreasing (Phi = Q_n R_n ... R_1, so both
    spectra have the same sum, (1/tau) log|det Phi|); ``history`` (n_steps, D) the running QR sums
    after each step (divided by the time so far).
    """

    position: int
    token: int
    qr: np.ndarray
    svd: np.ndarray
    time: float
    history: np.ndarray

    def frame(self) -> pd.DataFrame:
        k = np.arange(len(self.qr))
        return pd.DataFrame(dict(position=self.position, token=self.token, index=k, qr=self.qr, svd=self.svd))

    def to_dict(self) -> dict:
        """Every field as JSON (``from_dict`` rebuilds the same object)."""
        return dict(position=int(self.position), token=int(self.token), qr=real_to_json(self.qr),
                    svd=real_to_json(self.svd), time=self.time, history=real_to_json(self.history))

    @classmethod
    def from_dict(cls, data: dict) -> "TokenSpectrum":
        return cls(int(data["position"]), int(data["token"]), real_from_json(data["qr"]), real_from_json(data["svd"]),
                   float(data["time"]), real_from_json(data["history"]))


def token_lyapunov_spectrum(model: torch.nn.Module, idx: torch.Tensor, position: int = -1,
                            dtype: torch.dtype | None = torch.float64, chunk_size: int | None = None) -> TokenSpectrum:
    """Full finite-time Lyapunov spectrum (D exponents) of one token's state over the depth flow.

    Benettin on the model's own step maps: at every step the tangent basis Q (D x D, starting at
    the identity) of position p is advanced by that step's Jacobian block (J_m)_pp = d x_p' / d x_p
    (D rows by reverse mode, ``jacobian_rows``) and re-orthonormalised by QR. Because attention is
    causal, perturbations of x_p never reach earlier positions and those of later positions never
    reach p, so (J_n ... J_1)_pp = (J_n)_pp ... (J_1)_pp: this is exactly the QR method on
    Phi = d x_p(1) / d x_p(0). Over tau = 1 and n steps the QR exponents depend on the starting
    basis, so the singular-value exponents (1/tau) log sigma_k(Phi) are returned next to them (Phi
    = Q_n R_n ... R_1, so the two have the same sum). Computed on an eval copy in ``dtype``.
    """
    m = analysis_model(model, dtype)
    idx = idx.reshape(1, -1).to(m.wte.weight.device)
    with torch.no_grad():
        x = initial_state(m, idx)
    _, T, D = x.shape
    p = position % T
    rows = torch.arange(p * D, (p + 1) * D)
    Q = torch.eye(D, dtype=x.dtype, device=x.device)
    R_prod = torch.eye(D, dtype=torch.float64, device=x.device)
    total = torch.zeros(D, dtype=torch.float64, device=x.device)
    hist = []
    tau = 1.0
    steps = model_step_maps(m, x.dtype)
    for m_, step in enumerate(steps):
        J_pp = jacobian_rows(step, x, rows, chunk_size)[:, p * D:(p + 1) * D]
        with torch.no_grad():
            x = step(x)
        Q, R = torch.linalg.qr(J_pp @ Q)
        total += torch.diagonal(R).abs().log().double()
        R_prod = R.double() @ R_prod
        hist.append((total / (tau * (m_ + 1) / len(steps))).cpu().numpy())
    qr = (total / tau).sort(descending=True).values.cpu().numpy()
    svd = (torch.linalg.svdvals(R_prod).log() / tau).cpu().numpy()
    return TokenSpectrum(p, int(idx[0, p]), qr, svd, tau, np.stack(hist))
