"""The ODE package's declared pieces: the one weighted sum of stages, dense output read from the
tableau, the solver-scheme interface and the abstract gradient method."""

import torch

from nodelm_lib.ode.runge_kutta import weighted_sum


def test_weighted_sum_keeps_each_rounding_order():
    """Steps sum fused (one rounding per added term), dense output unfused (w_i k_i rounded first):
    pinned to the plain expressions, so that neither moves a solution's last bits."""
    torch.manual_seed(0)
    k = [torch.randn(1000) for _ in range(4)]
    w = (1 / 6, 0.0, 1 / 3, -2 / 7)
    fused = torch.add(torch.add(k[0] * w[0], k[2], alpha=w[2]), k[3], alpha=w[3])
    unfused = k[0] * w[0] + k[2] * w[2] + k[3] * w[3]
    assert torch.equal(weighted_sum(w, k), fused)
    assert torch.equal(weighted_sum(w, k, fused=False), unfused)
