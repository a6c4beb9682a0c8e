"""Lyapunov exponents (analysis/lyapunov.py) on systems whose exponents are known, then on small LMs.

Known answers: dx/dt = A x (the exponents are the real parts of A's eigenvalues), a scalar
non-autonomous equation (the exponent is the time average of its rate), and Lorenz-63 (largest
exponent 0.906, second 0, sum -(sigma + 1 + beta) exactly). On the language models the QR
exponents, the singular values and the heat-map are checked against a Jacobian of the model's
own forward pass formed independently by reverse mode.
"""

import math

import numpy as np
import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.analysis import jacobian as jc
from nodelm_lib.analysis import lyapunov as ly

F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread is faster, and on a shared 2-core machine OpenMP's spinning
    threads made the 3 x 3 QR factorisations 5-50x slower with two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def linear_system():
    """A = S blocks S^-1, a non-normal matrix with eigenvalues 0.4, -0.1 +- 2i, -0.6, -1.3."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.zeros(5, 5, dtype=F64)
    blocks[0, 0] = 0.4
    blocks[1:3, 1:3] = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]], dtype=F64)
    blocks[3, 3], blocks[4, 4] = -0.6, -1.3
    S = torch.eye(5, dtype=F64) + 0.3 * torch.randn(5, 5, generator=g, dtype=F64)
    A = S @ blocks @ torch.linalg.inv(S)
    return A, torch.randn(5, generator=g, dtype=F64)


def test_linear_system_exponents_are_real_parts_of_eigenvalues():
    A, x0 = linear_system()
    h, transient, horizon = 0.1, 20.0, 100.0  # rk4's error in the exponents is O(h^4 |mu|^5) ~ 3e-5
    res = ly.lyapunov_spectrum(lambda t, x: A @ x, x0, torch.tensor([0.0, transient + horizon], dtype=F64), "rk4",
                               steps_per_interval=round((transient + horizon) / h),
                               transient_steps=round(transient / h), tangent="jacobian")
    expected = np.sort(np.linalg.eigvals(A.numpy()).real)[::-1]
    err = np.abs(res.exponents.numpy() - expected).max()
    assert err < 1e-3, (res.exponents, expected)
    assert res.time == pytest.approx(horizon) and res.n_steps == round(horizon / h)
    # Their sum is the volume growth rate of the discrete map, (1/h) log|det P(hA)| with P rk4's
    # stability polynomial: exact up to rounding (no finite-time oscillation), and trace(A) up to O(h^4).
    z = h * np.linalg.eigvals(A.numpy())
    discrete = np.log(np.abs(1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24)).sum() / h
    assert float(res.exponents.sum()) == pytest.approx(discrete, abs=1e-10)
    assert discrete == pytest.approx(float(torch.trace(A)), abs=1e-4)


def test_jvp_and_jacobian_tangents_agree_and_batch_is_per_trajectory():
    A, x0 = linear_system()
    field = lambda t, x: torch.tanh(x @ A.T) + math.sin(float(t)) * x  # noqa: E731  (acts row-wise)
    t = torch.tensor([0.0, 2.0], dtype=F64)
    kw = dict(method="heun", steps_per_interval=20, n_exponents=3, transient_steps=5)
    jvp = ly.lyapunov_spectrum(field, x0, t, tangent="jvp", **kw)
    jac = ly.lyapunov_spectrum(field, x0, t, tangent="jacobian", **kw)
    assert torch.allclose(jvp.exponents, jac.exponents, rtol=0, atol=1e-12)
    other = 0.5 * x0.flip(0)
    both = ly.lyapunov_spectrum(field, torch.stack([x0, other]), t, batch=True, tangent="jvp", **kw)
    alone = ly.lyapunov_spectrum(field, other, t, tangent="jvp", **kw)
    assert torch.allclose(both.per_trajectory[0], jvp.per_trajectory[0], atol=1e-12)
    assert torch.allclose(both.per_trajectory[1], alone.per_trajectory[0], atol=1e-12)
    assert torch.allclose(both.x_final[1], alone.x_final, atol=1e-12)


def test_non_autonomous_exponent_is_the_mean_rate():
    # dx/dt = (c + cos t) x: lambda over [0, T] is c + sin(T) / T. Stage times matter: evaluating
    # every stage at the step's start would be first-order accurate only (error ~ 1e-2 here).
    c, T = -0.3, 10.0
    res = ly.lyapunov_spectrum(lambda t, x: (c + torch.cos(t)) * x, torch.ones(1, dtype=F64),
                               torch.tensor([0.0, T], dtype=F64), "rk4", steps_per_interval=100, tangent="jacobian")
    assert float(res.exponents[0]) == pytest.approx(c + math.sin(T) / T, abs=1e-6)


def lorenz(t, x, sigma=10.0, rho=28.0, beta=8.0 / 3.0):
    X, Y, Z = x.unbind(-1)
    return torch.stack([sigma * (Y - X), X * (rho - Z) - Y, X * Y - beta * Z], dim=-1)


def test_lorenz_largest_exponent():
    # 32 trajectories from random starts, 5 time units of transient each (attractor reached and
    # tangent basis aligned), then 50 averaged: rk4 with h = 0.02 in float64 (~8 s on one core).
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(32, 3, generator=g, dtype=F64) * 5 + torch.tensor([0.0, 0.0, 25.0], dtype=F64)
    h, transient, horizon = 0.02, 5.0, 50.0
    res = ly.lyapunov_spectrum(lorenz, x0, torch.tensor([0.0, transient + horizon], dtype=F64), "rk4",
                               steps_per_interval=round((transient + horizon) / h),
                               transient_steps=round(transient / h), batch=True, tangent="jacobian")
    l1, l2, l3 = res.exponents.tolist()
    assert abs(l1 - 0.906) < 0.05, res.exponents
    assert abs(l2) < 0.05 and abs(l3 + 14.57) < 0.2, res.exponents
    assert l1 + l2 + l3 == pytest.approx(-(10.0 + 1.0 + 8.0 / 3.0), abs=5e-3)  # phase-space contraction rate
    assert float(res.standard_error[0]) < 0.02


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="method='dopri5'"):
        ly.lyapunov_spectrum(lorenz, torch.ones(3, dtype=F64), torch.tensor([0.0, 1.0]), "dopri5")
    with pytest.raises(ValueError, match="tangent="):
        ly.lyapunov_spectrum(lorenz, torch.ones(3, dtype=F64), torch.tensor([0.0, 1.0]), tangent="fd")


# --------------------------------------------------------------------------- language models


def small_model(arch="node", method="rk4", n_steps=3, seed=0):
    torch.manual_seed(seed)
    cfg = nl.ModelConfig(arch=arch, vocab_size=32, d_model=8, n_heads=2, n_layers=n_steps, max_seq_len=8,
                         time_features=4, time_hidden=8, hyper_dim=2, ode=nl.ODEConfig(method=method, n_steps=n_steps))
    model = nl.build_model(cfg)
    with torch.no_grad():  # away from initialisation: O(1) weights, so the flow is far from the identity
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("arch,method", [("node", "euler"), ("ti_mlp", "rk4")])
def test_step_maps_reproduce_the_forward_pass(arch, method):
    model = small_model(arch, method)
    idx = torch.randint(0, 32, (2, 6))
    x = ly.initial_state(model, idx)
    ref = model.ode_block(x)
    for step in ly.model_step_maps(model):
        x = step(x)
    # the same arithmetic in another order: float32 rounding, a few ulps of the state's size (~5)
    assert torch.allclose(x, ref, rtol=2e-6, atol=1e-6)
    logits, _ = model(idx)
    assert torch.allclose(model.lm_head(model.ln_f(x)), logits, atol=1e-5)


def flow_jacobian_reference(model, idx):
    """d x(1) / d x(0) of the model's own ``ode_block`` by reverse mode: (T, D, T, D)."""
    m = jc.analysis_model(model, F64)
    x0 = ly.initial_state(m, idx.reshape(1, -1))
    J = torch.autograd.functional.jacobian(lambda x: m.ode_block(x), x0)
    return J[0, :, :, 0]


@pytest.mark.parametrize("arch,method", [("node", "euler"), ("ti_mlp", "rk4"), ("ti_ssm", "midpoint")])
def test_token_sensitivity_and_spectrum_match_the_flow_jacobian(arch, method):
    model = small_model(arch, method)
    idx = torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(1))
    J = flow_jacobian_reference(model, idx)  # J[i, :, j, :] = d x_i(1) / d x_j(0)
    sens = ly.token_sensitivity(model, idx)
    T = len(idx)
    ref = torch.linalg.matrix_norm(J.permute(0, 2, 1, 3), ord=2).numpy()  # (T, T)
    lower = np.tril_indices(T)
    np.testing.assert_allclose(sens.sigma_max[lower], ref[lower], rtol=1e-9)
    assert np.all(sens.sigma_max[np.triu_indices(T, 1)] == 0)  # causality: exactly zero
    assert np.all(np.isnan(sens.exponent[np.triu_indices(T, 1)]))
    np.testing.assert_allclose(sens.exponent[lower], np.log(ref[lower]), rtol=1e-9)
    assert len(sens.frame()) == T * (T + 1) // 2

    p = 4
    spec = ly.token_lyapunov_spectrum(model, idx, position=p)
    block = J[p, :, p, :].numpy()  # Phi = d x_p(1) / d x_p(0)
    np.testing.assert_allclose(spec.svd, np.log(np.linalg.svd(block, compute_uv=False)), atol=1e-9)
    # Benettin from the identity basis: the product of the R factors is the R of Phi = Q R
    r = np.sort(np.log(np.abs(np.diag(np.linalg.qr(block)[1]))))[::-1]
    np.testing.assert_allclose(spec.qr, r, atol=1e-9)
    assert spec.qr.sum() == pytest.approx(np.log(abs(np.linalg.det(block))), abs=1e-9)
    assert spec.svd[0] == pytest.approx(sens.exponent[p, p], abs=1e-9)
    assert spec.history.shape == (model.cfg.ode.n_steps, model.cfg.d_model)




@pytest.mark.parametrize("arch", ["node", "ti_ssm"])  # ti_ssm's scan has no batching rule: the loop takes over
def test_jacobian_rows_batched_and_one_by_one_agree(arch):
    m = jc.analysis_model(small_model(arch, "euler", n_steps=2))
    x0 = ly.initial_state(m, torch.randint(0, 32, (1, 5)))
    rows = torch.tensor([0, 3, 17, 39, 20])
    loop = jc.jacobian_rows(m.ode_block, x0, rows, chunk_size=1)
    batched = jc.jacobian_rows(m.ode_block, x0, rows, chunk_size=2)
    full = torch.autograd.functional.jacobian(m.ode_block, x0).reshape(x0.numel(), -1)
    assert torch.allclose(loop, full[rows], atol=1e-13) and torch.allclose(batched, full[rows], atol=1e-13)
