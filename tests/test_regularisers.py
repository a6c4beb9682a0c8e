"""Flow regularisers (issue 67, item 2): the Hutchinson estimate against the exact Frobenius
norm, reproducibility and gradients, the kinetic quadrature along an Euler solve, bad inputs."""

import math

import pytest
import torch

from nodelm_lib.ode import odeint
from nodelm_lib.ode.regularisers import (FlowRegulariser, RegularisedField, jacobian_frobenius,
                                         jacobian_frobenius_exact, kinetic_energy, regulariser_flops)

D = 6


class Tanh(torch.nn.Module):
    """A small nonlinear field, f(t, x) = tanh(W x + b) (1 + t)."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W = torch.nn.Parameter(torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D))
        self.b = torch.nn.Parameter(torch.randn(D, generator=g, dtype=torch.float64) * 0.1)

    def forward(self, t, x):
        return torch.tanh(x @ self.W.T + self.b) * (1 + t)


def point(batch=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.tensor(0.3, dtype=torch.float64), torch.randn(batch, D, generator=g, dtype=torch.float64)


def per_sample_estimates(field, t, x, n, noise, seed):
    """n single-sample estimates drawn in sequence from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([jacobian_frobenius(field, t, x, 1, g, noise, create_graph=False) for _ in range(n)])


@pytest.mark.parametrize("noise", ["gaussian", "rademacher"])
def test_the_hutchinson_estimate_agrees_with_the_exact_frobenius_norm(noise):
    field, (t, x) = Tanh(), point()
    exact = jacobian_frobenius_exact(field, t, x)
    samples = per_sample_estimates(field, t, x, 4000, noise, seed=0)
    mean, se = samples.mean(), samples.std() / math.sqrt(len(samples))
    assert abs(mean - exact) < 4 * se, (noise, mean.item(), exact.item(), se.item())
    # n_samples averages the same draws: one call with 4000 samples is the same mean
    many = jacobian_frobenius(field, t, x, 4000, torch.Generator().manual_seed(0), noise, create_graph=False)
    torch.testing.assert_close(many, mean)


def test_the_gaussian_estimators_variance_is_the_theoretical_one():
    """Per sample, Var ||e^T J||^2 = 2 ||J J^T||_F^2 for Gaussian e (with N vectors, / N^2):
    the standard error used above is the right one, and the estimate is not exact by accident."""
    field, (t, x) = Tanh(), point(batch=1)
    jac = torch.autograd.functional.jacobian(lambda y: field(t, y), x).reshape(D, D)
    variance = 2 * (jac @ jac.T).pow(2).sum()
    samples = per_sample_estimates(field, t, x, 4000, "gaussian", seed=1)
    assert samples.var().item() == pytest.approx(variance.item(), rel=0.15)


def test_rademacher_is_exact_for_a_diagonal_linear_field():
    """f = A x with A diagonal: ||e^T A||^2 = sum_i e_i^2 A_ii^2 = ||A||_F^2 for every +-1 vector."""
    A = torch.diag(torch.tensor([0.5, -1.0, 2.0, 3.0, -0.25, 1.5], dtype=torch.float64))
    field = lambda t, x: x @ A.T  # noqa: E731
    t, x = point(batch=4)
    exact = jacobian_frobenius_exact(field, t, x)
    assert exact.item() == pytest.approx(A.pow(2).sum().item())  # per vector: the batch is averaged
    torch.testing.assert_close(per_sample_estimates(field, t, x, 20, "rademacher", seed=3),
                               exact.expand(20), rtol=1e-12, atol=0)


def test_the_reduction_sums_the_last_dimension_and_averages_the_rest():
    f = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4)
    assert kinetic_energy(f).item() == pytest.approx(f.pow(2).sum(-1).mean().item())


def test_a_seeded_generator_reproduces_the_estimate():
    field, (t, x) = Tanh(), point()
    a, b = (jacobian_frobenius(field, t, x, 3, torch.Generator().manual_seed(7)) for _ in range(2))
    c = jacobian_frobenius(field, t, x, 3, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_gradients_flow_through_the_penalty_to_the_fields_parameters():
    field, (t, x) = Tanh(), point()
    reg = FlowRegulariser(kinetic=0.0, jacobian=1.0, n_samples=2)
    wrapped = reg.wrap(field, torch.linspace(0, 1, 5), "rk4", generator=torch.Generator().manual_seed(0))
    odeint(wrapped, x, torch.linspace(0, 1, 5), method="rk4")
    wrapped.penalty().backward()
    for name, p in field.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert wrapped.n_points == 4 and wrapped.integrals()["jacobian"] > 0


def test_the_kinetic_quadrature_along_an_euler_solve_is_the_hand_computation():
    field, (_, x0) = Tanh(), point()
    t = torch.tensor([0.0, 0.1, 0.35, 0.6, 1.0], dtype=torch.float64)  # uneven steps: dt_m matters
    reg = FlowRegulariser(kinetic=2.5)
    wrapped = reg.wrap(field, t, "euler")
    ys = odeint(wrapped, x0, t, method="euler")
    with torch.no_grad():
        expected = sum((t[m + 1] - t[m]) * field(t[m], ys[m]).pow(2).sum(-1).mean() for m in range(len(t) - 1))
    assert wrapped.integrals()["kinetic"] == pytest.approx(expected.item(), rel=1e-12)
    assert wrapped.penalty().item() == pytest.approx(2.5 * expected.item(), rel=1e-12)
    torch.testing.assert_close(ys, odeint(field, x0, t, method="euler"))  # the solve itself is unchanged


def test_the_jacobian_quadrature_along_a_midpoint_solve_uses_the_step_points():
    """Two stages per step: only the first (at x_m) is regularised; with a diagonal linear field
    Rademacher is exact, so the sum is dt * ||A||_F^2 over the steps exactly."""
    A = torch.diag(torch.tensor([0.5, -1.0, 2.0, 3.0, -0.25, 1.5], dtype=torch.float64))
    field = lambda t, x: x @ A.T  # noqa: E731
    t = torch.linspace(0, 1, 3, dtype=torch.float64)
    wrapped = FlowRegulariser(kinetic=1.0, jacobian=1.0).wrap(field, t, "midpoint", steps_per_interval=2)
    ys = odeint(wrapped, point()[1], t, method="midpoint", steps_per_interval=2)
    assert wrapped.n_points == 4 and wrapped.calls == 8
    assert wrapped.integrals()["jacobian"] == pytest.approx(A.pow(2).sum().item(), rel=1e-12)
    grid = torch.linspace(0, 1, 5, dtype=torch.float64)
    xs = [point()[1]]  # the step points x_m, recomputed by hand: midpoint steps of dt = 1/4
    for m in range(4):
        dt = grid[m + 1] - grid[m]
        xs.append(xs[-1] + dt * field(0, xs[-1] + dt / 2 * field(0, xs[-1])))
    torch.testing.assert_close(ys[-1], xs[-1])
    expected = sum(0.25 * kinetic_energy(field(0, x)) for x in xs[:4])
    assert wrapped.integrals()["kinetic"] == pytest.approx(expected.item(), rel=1e-12)


def test_under_no_grad_nothing_accumulates_and_reset_clears():
    field, (_, x0) = Tanh(), point()
    t = torch.linspace(0, 1, 4, dtype=torch.float64)
    wrapped = FlowRegulariser(kinetic=1.0, jacobian=1.0).wrap(field, t)
    with torch.no_grad():
        odeint(wrapped, x0, t, method="euler")
    assert wrapped.penalty().item() == 0.0 and wrapped.n_points == 0
    wrapped = FlowRegulariser(kinetic=1.0).wrap(field, t)  # no noise: two solves are the same sum
    odeint(wrapped, x0, t, method="euler")
    once = wrapped.penalty().item()
    odeint(wrapped, x0, t, method="euler")  # two solves without a reset add up
    assert once > 0 and wrapped.penalty().item() == pytest.approx(2 * once, rel=1e-6)
    wrapped.reset()
    assert wrapped.penalty().item() == 0.0 and wrapped.calls == 0


def test_checkpoint_recomputation_is_refused_rather_than_miscounted():
    field, (_, x0) = Tanh(), point()
    t = torch.linspace(0, 1, 3, dtype=torch.float64)
    wrapped = FlowRegulariser(kinetic=1.0).wrap(field, t, "rk4")
    ys = odeint(wrapped, x0, t, method="rk4", sensitivity="checkpoint")
    with pytest.raises(RuntimeError, match="sensitivity='direct'"):
        (ys[-1].sum() + wrapped.penalty()).backward()


def test_the_wrapped_module_owns_the_fields_parameters():
    field = Tanh()
    wrapped = FlowRegulariser(kinetic=1.0).wrap(field, torch.linspace(0, 1, 3))
    assert isinstance(wrapped, RegularisedField)
    assert {id(p) for p in wrapped.parameters()} == {id(p) for p in field.parameters()}


def test_flops_count_one_vjp_as_twice_the_field():
    assert regulariser_flops(1000.0, n_samples=3, kinetic=False) == 6000.0
    assert regulariser_flops(1000.0, n_samples=1, numel=10) == 20 + 2000 + 20
    assert regulariser_flops(1000.0, jacobian=False) == 0.0  # kinetic: elementwise only


@pytest.mark.parametrize("kwargs, match", [
    ({"n_samples": 0}, r"n_samples=0 is not valid; it must be an integer >= 1"),
    ({"n_samples": 1.5}, r"n_samples=1.5 is not valid"),
    ({"noise": "uniform"}, r"noise='uniform' is not valid; choose one of 'rademacher', 'gaussian'"),
    ({"kinetic": -1.0}, r"kinetic=-1.0 is not valid; a regulariser weight must be a finite number >= 0"),
    ({"jacobian": float("nan")}, r"jacobian=nan is not valid"),
    ({"jacobian": True}, r"jacobian=True is not valid"),
])
def test_bad_regulariser_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlowRegulariser(**kwargs)


def test_bad_estimator_inputs_and_methods_are_named():
    field, (t, x) = Tanh(), point()
    with pytest.raises(ValueError, match=r"n_samples=0 is not valid"):
        jacobian_frobenius(field, t, x, n_samples=0)
    with pytest.raises(ValueError, match=r"noise='normal' is not valid; choose one of 'rademacher', 'gaussian'"):
        jacobian_frobenius(field, t, x, noise="normal")
    with pytest.raises(ValueError, match=r"n_samples=-2 is not valid"):
        regulariser_flops(100.0, n_samples=-2)
    reg = FlowRegulariser(kinetic=1.0)
    for method in ("dopri5", "reversible_heun"):
        with pytest.raises(ValueError, match=rf"method='{method}' is not valid for a regularised field; "
                                             r"choose .*'euler'.*'rk4'"):
            reg.wrap(field, torch.linspace(0, 1, 3), method)
    with pytest.raises(ValueError, match=r"method='rk5' is not valid; choose one of"):
        reg.wrap(field, torch.linspace(0, 1, 3), "rk5")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cpu_generator_gives_the_same_estimate_on_cuda():
    """The noise is drawn on the generator's device and moved: one seed, one estimate anywhere."""
    field, (t, x) = Tanh(), point()
    cpu = jacobian_frobenius(field, t, x, 4, torch.Generator().manual_seed(0))
    gpu = jacobian_frobenius(field.cuda(), t.cuda(), x.cuda(), 4, torch.Generator().manual_seed(0))
    torch.testing.assert_close(gpu.cpu(), cpu)
