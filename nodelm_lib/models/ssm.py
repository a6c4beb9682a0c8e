"""A selective diagonal state-space layer (Mamba-style, no convolution), the mixer of two
families: modulated in depth t in ``ti_ssm`` (``time_indexed.py``) or static in the discrete
control ``ssm`` (``discrete_ssm.py``). Its recurrence is evaluated by the scans of ``scans.py``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from nodelm_lib.nn.decode_cache import active_cache, compiling
from nodelm_lib.nn.frozen import FrozenSSM, freeze_layer
from nodelm_lib.nn.time_grid import GridPoint
from nodelm_lib.nn.time_layers import ModulatedLinear, StaticLinear

from . import scan_cpu
from .common import twice_differentiable
from .scan_triton import triton_selective_scan
from .scans import (check_chunk_size, linear_recurrence, scan_in_float32, scan_with, selective_scan,
                    selective_scan_reference)


# --------------------------------------------------------------------------- under torch.compile
# The compiler would trace _SelectiveScan's Python loops position by position: at the seed's sizes
# (d 256, depth 6, T 128) compiling ti_ssm then takes minutes and its compiled step runs slower
# than eager. While compiling, the scan is instead one opaque operator, whose forward and backward
# run the eager code above: the rest of the model compiles around it in one graph (on one CUDA GPU,
# training.device.compile_for's CUDA graph is meant to replay the scan's kernels with the rest). Outputs
# are contiguous, as the compiler assumes from the shapes the fake (meta) functions give.


# --------------------------------------------------------------------------- layer


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y, for y > 0: x = y + log(1 - exp(-y))."""
    return y + torch.log(-torch.expm1(-y))


class SelectiveSSM(nn.Module):
    r"""Selective diagonal SSM (Mamba without the convolution) whose parameters depend on t.

    With h = h(t) the trunk output (``TimeModulation``), for u (B, T, D) and state size N:

    .. math::
        [x'; z] = W_{in}(t) u, \quad x = \mathrm{SiLU}(x'), \quad [\delta; B_s; C_s] = W_x(t) x_s + b_x, \quad
        \Delta_{s,d} = \mathrm{softplus}(\delta_{s,d})

        A(t)_{d,n} = -\exp(A^{\log}_{d,n} + a_d(t)), \qquad
        D(t)_d = D^{base}_d \cdot 2\sigma(d_d(t)), \qquad a(t), d(t) \text{ linear in } h

        S_{s,d,n} = e^{\Delta_{s,d} A_{d,n}} S_{s-1,d,n} + \Delta_{s,d} B_{s,n} x_{s,d}, \qquad
        y_{s,d} = \textstyle\sum_n C_{s,n} S_{s,d,n} + D(t)_d x_{s,d}

        \mathrm{out} = W_{out}(t)\,(y \odot \mathrm{SiLU}(z))

    with W_in, W_x, W_out ``ModulatedLinear``. With ``hidden=None`` the layer is static (the
    ``ssm`` control): plain linear projections, A = -exp(A^log), D = D^base. A is exponentiated ZOH-style and B by Euler,
    as in Mamba. A(t) < 0 for every t, so each decay e^{Delta A} lies in (0, 1) and the scan
    is stable; the recurrence runs over positions only, so the layer is causal. Init:
    A^log_{d,n} = log n (S4D-real), the Delta bias slice inverse-softplus of dt ~ LogU[1e-3,
    1e-1] (Mamba), the a and d heads N(0, 0.02) with zero bias (A(t), D(t) start near their
    bases), D^base = 1.
    """

    def __init__(self, d_model: int, state_size: int, hidden: int | None, bias: bool = True,
                 chunk_size: int | None = None):
        super().__init__()
        if chunk_size is not None:
            check_chunk_size(chunk_size)
        self.d_model, self.state_size, self.chunk_size = d_model, state_size, chunk_size
        self.kernel: str | None = None  # "triton" or "cpu": another kernel for the scan (``scan``, ``use_scan_kernel``)
        self.time_dependent = hidden is not None

        def linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
            if self.time_dependent:
                return ModulatedLinear(in_features, out_features, hidden, bias)
            return StaticLinear(in_features, out_features, bias=bias)

        self.in_proj = linear(d_model, 2 * d_model, bias)
        self.x_proj = linear(d_model, d_model + 2 * state_size, True)
        self.out_proj = linear(d_model, d_model, bias)
        self.A_log = nn.Parameter(torch.empty(d_model, state_size))
        self.D_base = nn.Parameter(torch.empty(d_model))
        if self.time_dependent:
            self.A_head = nn.Linear(hidden, d_model)  # a(t)
            self.D_head = nn.Linear(hidden, d_model)  # d(t)
        self.reset_parameters()

    owns_init = True  # CausalLM.init_weights calls reset_parameters after the children's

    def reset_parameters(self, std: float = 0.02, dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        """The init of the class docstring (the projections keep ModulatedLinear's, ``std``
        is theirs); it runs after them, since it sets the Delta slice of x_proj's bias."""
        n = torch.arange(1, self.state_size + 1, dtype=torch.float32)
        with torch.no_grad():
            self.A_log.copy_(n.log().expand(self.d_model, -1))
            self.D_base.fill_(1.0)
            dt = torch.exp(torch.empty(self.d_model).uniform_(math.log(dt_min), math.log(dt_max)))
            self.x_proj.bias.zero_()
            self.x_proj.bias[: self.d_model].copy_(inverse_softplus(dt))
        if self.time_dependent:
            for head in (self.A_head, self.D_head):
                nn.init.normal_(head.weight, std=0.02)
                nn.init.zeros_(head.bias)

    def A_at(self, h: torch.Tensor | None) -> torch.Tensor:
        """A(t) (D, N), negative everywhere, for the trunk output h(t) (static: -exp(A^log))."""
        if not self.time_dependent:
            return -torch.exp(self.A_log)
        return -torch.exp(self.A_log + self.A_head(h)[:, None])

    def D_at(self, h: torch.Tensor | None) -> torch.Tensor:
        """D(t) (D,): the skip gain, in (0, 2 D_base), equal to D_base when d(t) = 0 (static:
        D_base)."""
        if not self.time_dependent:
            return self.D_base
        return self.D_base * 2 * torch.sigmoid(self.D_head(h))

    def forward(self, u: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(u, h, self.scan())

    frozen_mirrors = ("forward", "_forward")  # fast decoding runs FrozenSSM in place of both

    def frozen_at(self, h: torch.Tensor | None) -> FrozenSSM:
        return FrozenSSM(freeze_layer(self.in_proj, h), freeze_layer(self.x_proj, h), freeze_layer(self.out_proj, h),
                         self.A_at(h), self.D_at(h), self.scan())

    def scan(self):
        """The scan this layer runs: the fused ``selective_scan``, or with ``chunk_size`` the
        chunked linear recurrence, or with ``kernel = "triton"`` the two Triton kernels of
        ``scan_triton`` (a candidate on CUDA, not chosen by default until measured there), or with
        ``kernel = "cpu"`` the compiled loop of ``scan_cpu`` at inference on a CPU (the same
        function to float32 accuracy; training still runs ``selective_scan``); in float32 at
        least (``scan_in_float32``). Asked for kernels that differentiate twice
        (``common.differentiable_twice``: the Jacobian regulariser), the sequential scan."""
        check_kernel(self.kernel)
        if not compiling() and twice_differentiable():  # compiled training refuses the regularisers (TrainConfig)
            return functools.partial(scan_in_float32, selective_scan_reference)
        if self.kernel == "triton":
            return functools.partial(scan_in_float32, triton_selective_scan)
        if self.kernel == "cpu":
            scan = functools.partial(scan_in_float32, scan_cpu.cpu_selective_scan)
            scan.one_pass = scan_cpu.gated_scan  # _forward's whole mixing step, where scan_cpu.applies
            return scan
        if self.chunk_size is None:
            return functools.partial(scan_in_float32, selective_scan)
        return functools.partial(scan_in_float32, scan_with(lambda a, b: linear_recurrence(a, b, self.chunk_size)))

    def reference_forward(self, u: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """``forward`` with the sequential scan: the ground truth for the fast ones."""
        return self._forward(u, h, functools.partial(scan_in_float32, selective_scan_reference))

    def _forward(self, u: torch.Tensor, h: torch.Tensor, scan) -> torch.Tensor:
        """The layer's function with ``scan``. A scan with a ``one_pass`` (``kernel = "cpu"``) runs
        everything from the softplus to the gate in that one call where ``scan_cpu.applies``."""
        D, N = self.d_model, self.state_size
        x, z = self.in_proj(u, h).chunk(2, dim=-1)
        x = F.silu(x)  # Mamba applies SiLU after its convolution; there is no convolution here
        delta, B_s, C_s = self.x_proj(x, h).split([D, N, N], dim=-1)
        cache = active_cache()
        slot = cache.slot() if cache is not None else None
        # while decoding, continue from the state after the last cached position
        state = slot.get("state") if slot is not None else None
        h_t = h.value if isinstance(h, GridPoint) else h  # A(t), D(t) from h(t) itself: two small heads
        A_t = _per_time(h, self, "A", lambda: self.A_at(h_t))
        D_t = _per_time(h, self, "D", lambda: self.D_at(h_t))
        one_pass = getattr(scan, "one_pass", None)
        if one_pass is not None and scan_cpu.applies(x, delta, A_t, B_s, C_s, state, D_t, z):
            mixed, last = one_pass(x, delta, A_t, B_s, C_s, state, D_t, z)
        else:
            y, last = scan(x, F.softplus(delta), A_t, B_s, C_s, state)  # delta (B, T, D)
            mixed = (y + D_t * x) * F.silu(z)
        if slot is not None:
            slot["state"] = last
        return self.out_proj(mixed, h)


KERNELS = (None, "triton", "cpu")  # SelectiveSSM.kernel: the library's scan, scan_triton's, scan_cpu's


def check_kernel(kernel) -> None:
    """A ValueError naming ``kernel`` unless it is one of ``KERNELS``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not valid; choose None (the library's scan), 'triton' (CUDA) "
                         "or 'cpu' (a compiled loop for inference on a CPU)")


def use_scan_kernel(model: nn.Module, kernel: str | None) -> int:
    """Set every selective SSM layer of ``model`` to run the scan by ``kernel`` (``KERNELS``;
    ``SelectiveSSM.scan``) and return how many layers there are (0: the model has no SSM). Not part
    of the config: it changes how the same function is computed, not the model. For "cpu" the
    kernel is built now (``scan_cpu.build``), so a missing compiler is said here, not mid-evaluation."""
    check_kernel(kernel)
    layers = [m for m in model.modules() if isinstance(m, SelectiveSSM)]
    if kernel == "cpu" and layers:
        scan_cpu.build()
    for layer in layers:
        layer.kernel = kernel
    return len(layers)


def _per_time(h, owner: nn.Module, name: str, compute):
    """``compute()``, which depends on t alone: on a grid kept per grid time where it can be
    (``GridPoint.once``), else computed."""
    return h.once(owner, name, compute) if isinstance(h, GridPoint) else compute()
