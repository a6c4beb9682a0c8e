r"""Spectra of the field's weights along depth t (Tong et al., ICLR 2025, section 5).

Weight spectra of ``node`` and ``ti_mlp`` models (``ti_ssm``: attention only), on the grid the
model's own solver uses: by default its **step starts** t_i (``solver_grid``, from
``ODEBlock.step_times``; t_i = i / n for n steps). A multi-stage method also evaluates the field at t_i + c_j dt (rk4: t_i + dt/2 twice and
t_i + dt, so the weights at t = 1 enter the last step); ``field_times(model)`` lists every time the
field receives in one forward pass, and ``weight_spectra(model, times=field_times(model))`` reads
the weights at all of them.

**Weight products per head** (``weight_spectra``). At each solver time t_i the layers' weights
are read with the layers' own ``weight_at`` (``HyperLinear.weight_at(code)`` for node,
``ModulatedLinear.weight_at(h)`` for ti_mlp: the code path of the forward pass), at the time the
field itself receives (``modulation="constant"`` shows it t = 0). Shapes follow ``nn.Linear``:
a weight is (out, in) and y = x W^T. With the fused c_attn weight W (3D, D), W_Q = W[:D],
W_K = W[D:2D], W_V = W[2D:], head h the rows h d_h:(h+1) d_h (d_h = D / H) of each, W_Q^h etc.
(d_h, D); W_O = c_proj's weight (D, D) and W_O[:, h] its columns of head h. The products:

- **QK** = W_K^h W_Q^h^T (d_h x d_h). The attention score is q_i . k_j = x_i^T (W_Q^h^T W_K^h) x_j
  (before the 1/sqrt(d_h) of softmax, which is left out); that bilinear form's D x D matrix
  W_Q^h^T W_K^h has rank d_h and the same nonzero eigenvalues as its d_h x d_h twin (AB and BA).
  In Tong's row-vector notation (Q = X W_Q, W_Q of shape D x d_h) it is W_Q W_K^T. With
  ``position="rope"`` the score is x_i^T W_Q^h^T R_{j-i} W_K^h x_j (R a rotation by the distance):
  QK is then the form at distance 0.
- **OV** = W_V^h W_O[:, h] (d_h x d_h), the twin of the head's D x D value-to-output map
  W_O[:, h] W_V^h (x_j -> its contribution to the output, rank d_h); Tong's W_V W_O.
- **FF** = the MLP's linear part W_2 W_1 (D x D, W_1 = c_fc's (M, D), W_2 = c_proj's (D, M)), the
  GELU left out; optionally on a subset S of hidden units, W_2[:, S] W_1[S]. It shares its
  nonzero eigenvalues with W_1[S] W_2[:, S] (|S| x |S|); the smaller of the two is computed, so
  there are min(D, |S|) eigenvalues.

With ``fold_layernorm=True`` the layer norms' scales are folded in: W_Q, W_K, W_V (and W_1) are
multiplied on the right by diag(gamma_1(t)) (diag(gamma_2(t))), the maps seen by the normalised
input. Eigenvalues are complex128, computed in float64 from the weights.

These are the eigenvalues of the layers' weights. With ``integration="residual"`` the solver
integrates ``n_steps`` times the field (``ODEBlock.vector_field``: x + f = x + dt (n f)), so the OV
and FF maps of dx/dt are ``WeightSpectra.field_scale`` (= n_steps; 1 otherwise) times these; the
Jacobian spectra (``jacobian.py``) are of dx/dt itself and include the factor.

Notebook 04's other analyses live beside this one: the field's Jacobian along the solve
(``jacobian.py``), growth with depth (``depth_trends.py``), Lyapunov exponents (``lyapunov.py``),
their figures (``dynamics_figures.py``) and the summary and conclusions written from the tables
(``dynamics_report.py``). The solver's grid (``fixed_step_block``, ``solver_grid``) and
``sorted_eigvals`` / ``summarize`` serve the Jacobian spectra too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from nodelm_lib import families
from nodelm_lib.models.common import continuous_block
from nodelm_lib.ode import FIXED_STEP_METHODS

KINDS = ("qk", "ov", "ff")


# --------------------------------------------------------------------------- results as JSON
# Results are kept in run stores as JSON (``dynamics_store.py``); Python's float repr round-trips a
# float64 exactly, so a result read back gives the tables it gave when computed, digit for digit.


def real_to_json(a: np.ndarray) -> dict:
    """A float array as JSON (shape and values; NaN and inf as Python's json writes them)."""
    a = np.asarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "values": a.ravel().tolist()}


def real_from_json(data: dict) -> np.ndarray:
    return np.array(data["values"], dtype=np.float64).reshape(data["shape"])


def complex_to_json(a: np.ndarray) -> dict:
    """A complex array as JSON: its shape, real and imaginary parts."""
    a = np.asarray(a, dtype=np.complex128)
    return {"shape": list(a.shape), "real": a.real.ravel().tolist(), "imag": a.imag.ravel().tolist()}


def complex_from_json(data: dict) -> np.ndarray:
    out = np.empty(len(data["real"]), dtype=np.complex128)
    out.real, out.imag = data["real"], data["imag"]  # set part by part: re + 1j * im can turn -0.0 into 0.0
    return out.reshape(data["shape"])


# --------------------------------------------------------------------------- the solver's grid


def fixed_step_block(model):
    """The continuous block of ``model``, refused where its method is adaptive (no fixed grid)."""
    block = continuous_block(model, "spectral analysis")
    if block.ode.method not in FIXED_STEP_METHODS:
        raise ValueError(f"ode.method={block.ode.method!r} is adaptive: its grid depends on the input; "
                         f"use a fixed-step method ({', '.join(FIXED_STEP_METHODS)})")
    return block


def _param(model) -> torch.Tensor:
    return next(model.parameters())


def solver_grid(model) -> torch.Tensor:
    """The step start times t_i (n_steps,) of the model's fixed-step solve, in the parameters' dtype:
    ``ODEBlock.step_times``, the numbers the solver steps on (t_i = i / n up to rounding)."""
    p = _param(model)
    return torch.stack([s for s, _ in fixed_step_block(model).step_times(p.dtype, p.device)])


def field_time(model, t: torch.Tensor) -> torch.Tensor:
    """The time the field receives when the solver evaluates ``vector_field`` at ``t``
    (``t`` itself, or 0 with ``modulation="constant"``): read from the field's own input."""
    block = fixed_step_block(model)
    seen: list = []
    hook = block.field.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    p = _param(model)
    try:
        with torch.no_grad():
            block.vector_field(t, torch.zeros(1, 1, model.cfg.d_model, dtype=p.dtype, device=p.device))
    finally:
        hook.remove()
    return seen[0]


def field_times(model) -> torch.Tensor:
    """Every time at which the field is evaluated in one forward pass of the model, in order
    (n_steps x stages for RK methods), recorded from the field's input during ``model(idx)``."""
    block = fixed_step_block(model)
    seen: list = []
    hook = block.field.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device=_param(model).device))
    finally:
        hook.remove()
        model.train(was_training)
    return torch.stack([s.reshape(()) for s in seen])


# --------------------------------------------------------------------------- weights at t


@dataclass
class LayerWeights:
    """The field's weights at one time, as the forward pass uses them ((out, in) like ``nn.Linear``).

    ``w_q``, ``w_k``, ``w_v`` (D, D): rows of c_attn; ``w_o`` (D, D): c_proj; ``w_1`` (M, D) and
    ``w_2`` (D, M): the MLP (None for ti_ssm); ``b_*`` the matching biases (None without);
    ``ln_1``, ``ln_2``: (scale, shift) of the layer norms. ``t`` is the solver's time, ``field_t``
    the time the field sees.
    """

    t: float
    field_t: float
    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    w_1: torch.Tensor | None
    w_2: torch.Tensor | None
    b_qkv: torch.Tensor | None
    b_o: torch.Tensor | None
    b_1: torch.Tensor | None
    b_2: torch.Tensor | None
    ln_1: tuple[torch.Tensor, torch.Tensor | None]
    ln_2: tuple[torch.Tensor, torch.Tensor | None]


@torch.no_grad()
def layer_weights(model, t: torch.Tensor) -> LayerWeights:
    """The field's weights at solver time ``t`` (a 0-d tensor), from the field's own ``weights_at``
    (``models.common.TimeDependentField``: the families that declare ``time_dependent_weights``)."""
    block = fixed_step_block(model)
    if not families.get(model.cfg.arch).time_dependent_weights:
        raise ValueError(f"the weight spectra need a field whose weights depend on t; model.arch="
                         f"{model.cfg.arch!r} does not declare time_dependent_weights")
    D = model.cfg.d_model
    tf = field_time(model, t)
    w = block.field.weights_at(tf)
    w_qkv = w["w_qkv"]
    return LayerWeights(float(t), float(tf), w_qkv[:D], w_qkv[D:2 * D], w_qkv[2 * D:], w["w_o"], w["w_1"], w["w_2"],
                        w["b_qkv"], w["b_o"], w["b_1"], w["b_2"], w["ln_1"], w["ln_2"])


# --------------------------------------------------------------------------- products and eigenvalues


def sorted_eigvals(M: torch.Tensor) -> np.ndarray:
    """Eigenvalues (complex128) of the last two dims of M, by decreasing |lambda| (then imaginary part)."""
    ev = torch.linalg.eigvals(M.detach().to(device="cpu", dtype=torch.float64)).numpy()
    out = np.empty_like(ev)
    for idx in np.ndindex(ev.shape[:-1]):
        e = ev[idx]
        out[idx] = e[np.lexsort((-e.imag, -np.abs(e)))]
    return out


def _heads(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(D, D) -> (H, d_h, D): the rows of each head."""
    D = w.shape[0]
    return w.reshape(n_heads, D // n_heads, -1)


def qk_eigvals(w_q: torch.Tensor, w_k: torch.Tensor, n_heads: int) -> np.ndarray:
    """(H, d_h) eigenvalues of W_K^h W_Q^h^T: the nonzero eigenvalues of the score form W_Q^h^T W_K^h."""
    q, k = _heads(w_q.double(), n_heads), _heads(w_k.double(), n_heads)
    return sorted_eigvals(k @ q.transpose(1, 2))


def ov_eigvals(w_v: torch.Tensor, w_o: torch.Tensor, n_heads: int) -> np.ndarray:
    """(H, d_h) eigenvalues of W_V^h W_O[:, h]: the nonzero eigenvalues of the head's map W_O[:, h] W_V^h."""
    v = _heads(w_v.double(), n_heads)  # (H, d_h, D)
    o = _heads(w_o.double().T, n_heads)  # (H, d_h, D): o[h] = W_O[:, h]^T
    return sorted_eigvals(v @ o.transpose(1, 2))


def ff_eigvals(w_1: torch.Tensor, w_2: torch.Tensor, units: np.ndarray | None = None) -> np.ndarray:
    """min(D, |S|) eigenvalues of the MLP's linear part W_2[:, S] W_1[S] (S = ``units``, default all):
    the |S| x |S| twin W_1[S] W_2[:, S] when |S| <= D, else the D x D product."""
    w_1, w_2 = w_1.double(), w_2.double()
    if units is not None:
        sel = torch.as_tensor(units, device=w_1.device)
        w_1, w_2 = w_1[sel], w_2[:, sel]
    if w_1.shape[0] <= w_1.shape[1]:
        return sorted_eigvals(w_1 @ w_2)
    return sorted_eigvals(w_2 @ w_1)


ZERO_TOL = 1e-9


def summarize(eigs: np.ndarray) -> dict:
    """Spectral radius, mean |lambda|, fraction with positive real part and the largest real part.

    A real part within ``ZERO_TOL`` times the spectral radius of zero counts as not positive: its
    sign is rounding. (The field Jacobian has T exactly zero eigenvalues, one per token, as both
    layer norms ignore a constant shift of a token's state; computed, they are +-1e-16 x rho.)
    """
    mag = np.abs(eigs)
    rho = float(mag.max())
    return dict(n_eigs=int(eigs.size), spectral_radius=rho, mean_abs=float(mag.mean()),
                frac_pos_real=float((eigs.real > ZERO_TOL * rho).mean()), max_real=float(eigs.real.max()))


@dataclass
class WeightSpectra:
    """Eigenvalues of the weight products at each solver time (module docstring).

    ``qk``, ``ov`` (n_t, H, d_h) and ``ff`` (n_t, r) complex128, each row by decreasing |lambda|;
    ``ff`` is None for ti_ssm. ``times`` the solver's times, ``field_times`` what the field saw;
    ``field_scale`` the factor between these layer-weight maps and those of dx/dt (n_steps with
    ``integration="residual"``, else 1; module docstring).
    """

    arch: str
    times: np.ndarray
    field_times: np.ndarray
    qk: np.ndarray
    ov: np.ndarray
    ff: np.ndarray | None
    ff_units: np.ndarray | None
    fold_layernorm: bool
    field_scale: float = 1.0

    def _groups(self):
        for i, t in enumerate(self.times):
            for kind in ("qk", "ov"):
                for h, eigs in enumerate(getattr(self, kind)[i]):
                    yield i, t, kind, h, eigs
            if self.ff is not None:
                yield i, t, "ff", -1, self.ff[i]

    def summary(self) -> pd.DataFrame:
        """One row per (step, kind, head) with ``summarize``'s columns; FF has head = -1."""
        return pd.DataFrame([dict(step=i, t=float(t), kind=kind, head=h, **summarize(e))
                             for i, t, kind, h, e in self._groups()])

    def eigenvalues(self) -> pd.DataFrame:
        """Every eigenvalue: step, t, kind, head, index, real, imag, abs."""
        rows = [pd.DataFrame(dict(step=i, t=float(t), kind=kind, head=h, index=np.arange(len(e)),
                                  real=e.real, imag=e.imag, abs=np.abs(e)))
                for i, t, kind, h, e in self._groups()]
        return pd.concat(rows, ignore_index=True)

    def to_dict(self) -> dict:
        """Every field as JSON (``from_dict`` rebuilds the same object)."""
        return dict(arch=self.arch, times=real_to_json(self.times), field_times=real_to_json(self.field_times),
                    qk=complex_to_json(self.qk), ov=complex_to_json(self.ov),
                    ff=None if self.ff is None else complex_to_json(self.ff),
                    ff_units=None if self.ff_units is None else [int(u) for u in self.ff_units],
                    fold_layernorm=self.fold_layernorm, field_scale=self.field_scale)

    @classmethod
    def from_dict(cls, data: dict) -> "WeightSpectra":
        return cls(data["arch"], real_from_json(data["times"]), real_from_json(data["field_times"]),
                   complex_from_json(data["qk"]), complex_from_json(data["ov"]),
                   None if data["ff"] is None else complex_from_json(data["ff"]),
                   None if data["ff_units"] is None else np.array(data["ff_units"], dtype=np.int64),
                   bool(data["fold_layernorm"]), float(data["field_scale"]))


@torch.no_grad()
def weight_spectra(model, times: torch.Tensor | None = None, ff_units: int | None = None, seed: int = 0,
                   fold_layernorm: bool = False) -> WeightSpectra:
    """QK and OV eigenvalues per head and FF eigenvalues at each time of ``times`` (default: the
    solver's step starts, ``solver_grid``; ``field_times(model)`` for every stage). ``ff_units``: use
    a random subset of that many hidden units (the same at every t, drawn with ``seed``); None uses all."""
    block = fixed_step_block(model)  # a continuous-depth model with a fixed-step method
    times = solver_grid(model) if times is None else times
    H = model.cfg.n_heads
    units = None
    qk, ov, ff, ftimes = [], [], [], []
    for t in times:
        w = layer_weights(model, t)
        w_q, w_k, w_v, w_1 = w.w_q, w.w_k, w.w_v, w.w_1
        if fold_layernorm:
            g1 = w.ln_1[0]
            w_q, w_k, w_v = w_q * g1, w_k * g1, w_v * g1  # W diag(gamma): scales the input columns
            if w_1 is not None:
                w_1 = w_1 * w.ln_2[0]
        qk.append(qk_eigvals(w_q, w_k, H))
        ov.append(ov_eigvals(w_v, w.w_o, H))
        if w_1 is not None:
            if ff_units is not None and units is None:
                units = np.sort(np.random.default_rng(seed).choice(w_1.shape[0], size=ff_units, replace=False))
            ff.append(ff_eigvals(w_1, w.w_2, units))
        ftimes.append(w.field_t)
    return WeightSpectra(model.cfg.arch, times.detach().double().cpu().numpy(), np.array(ftimes), np.stack(qk),
                         np.stack(ov), np.stack(ff) if ff else None, units, fold_layernorm,
                         float(block.ode.n_steps) if block.integration == "residual" else 1.0)
