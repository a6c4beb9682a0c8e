"""The fixed-step solvers: convergence order, grids, errors, torchdiffeq pass-through."""

import math

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.ode import TABLEAUS

ORDERS = {"euler": 1, "midpoint": 2, "heun": 2, "rk4": 4, "rk38": 4}


def linear_problem():
    torch.manual_seed(0)
    A = torch.randn(4, 4, dtype=torch.float64) * 0.5
    x0 = torch.randn(4, dtype=torch.float64)
    exact = torch.linalg.matrix_exp(A) @ x0
    return (lambda t, x: A @ x), x0, exact


@pytest.mark.parametrize("method", sorted(ORDERS))
def test_convergence_order(method):
    """Halving the step divides the error at t=1 by ~2^p."""
    field, x0, exact = linear_problem()
    errors = []
    for n in (16, 32, 64):
        y = nl.odeint(field, x0, torch.linspace(0, 1, n + 1, dtype=torch.float64), method=method)
        errors.append((y[-1] - exact).norm().item())
    observed = math.log2(errors[1] / errors[2])
    assert abs(observed - ORDERS[method]) < 0.25, f"{method}: observed order {observed:.2f}"
    assert TABLEAUS[method].order == ORDERS[method]


def test_returns_every_output_time_and_the_initial_state():
    field, x0, _ = linear_problem()
    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    y = nl.odeint(field, x0, t, method="euler")
    assert y.shape == (5, 4)
    torch.testing.assert_close(y[0], x0)


def test_adaptive_pass_through_meets_tolerance():
    field, x0, exact = linear_problem()
    y = nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), method="dopri5", rtol=1e-9, atol=1e-10)
    assert (y[-1] - exact).norm() < 1e-7


def test_direct_gradients_match_finite_differences():
    A = torch.randn(3, 3, dtype=torch.float64) * 0.3
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: nl.odeint(lambda s, z: torch.tanh(A @ z), x, t, method="rk4")[-1], (x0,))


def test_bad_arguments_are_clear_errors():
    field, x0, _ = linear_problem()
    t = torch.linspace(0, 1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method='rk5' is not valid; choose one of 'euler'"):
        nl.odeint(field, x0, t, method="rk5")
    with pytest.raises(ValueError, match="sensitivity=.adjoint. is not valid; choose one of .direct., .checkpoint., .reversible."):
        nl.odeint(field, x0, t, sensitivity="adjoint")
    with pytest.raises(ValueError, match="1-D tensor"):
        nl.odeint(field, x0, torch.tensor(1.0), method="euler")


class TanhField(torch.nn.Module):
    """A small nonlinear field with parameters and a closure-captured conditioning vector."""

    def __init__(self, dim=3):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(dim, dim).double()

    def forward(self, t, x, u):
        return torch.tanh(self.lin(x) + u) * (1 + t)


@pytest.mark.parametrize("method", ["euler", "rk4", "rk38"])
def test_checkpoint_gradients_equal_direct(method):
    field = TanhField()
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    inputs = (x0, u, *field.parameters())
    grads = {}
    for sens in ("direct", "checkpoint"):
        y = nl.odeint(lambda s, z: field(s, z, u), x0, t, method=method, sensitivity=sens)
        grads[sens] = torch.autograd.grad((y ** 2).sum(), inputs)
    for g_direct, g_ckpt in zip(grads["direct"], grads["checkpoint"]):
        torch.testing.assert_close(g_ckpt, g_direct, rtol=0, atol=1e-9)


def test_checkpoint_passes_gradcheck():
    field = TanhField()
    u = torch.zeros(3, dtype=torch.float64)
    t = torch.linspace(0, 1, 4, dtype=torch.float64)
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: nl.odeint(lambda s, z: field(s, z, u), x, t, method="rk4", sensitivity="checkpoint")[-1], (x0,))


def test_checkpoint_with_an_adaptive_method_is_a_clear_error():
    field, x0, _ = linear_problem()
    with pytest.raises(ValueError, match="needs a fixed-step method"):
        nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), method="dopri5", sensitivity="checkpoint")


def test_reversible_heun_is_second_order():
    field, x0, exact = linear_problem()
    errors = [(nl.odeint(field, x0, torch.linspace(0, 1, n + 1, dtype=torch.float64),
                         method="reversible_heun")[-1] - exact).norm().item() for n in (32, 64, 128)]
    observed = math.log2(errors[1] / errors[2])
    assert abs(observed - 2.0) < 0.25, f"observed order {observed:.2f}"


def test_reversible_heun_steps_back_exactly():
    """Algebraic reversibility: unstepping a trajectory recovers every state to rounding."""
    from nodelm_lib.ode.reversible import reversible_heun_step, reversible_heun_unstep

    field = TanhField()
    u = torch.randn(3, dtype=torch.float64)
    f_u = lambda s, z: field(s, z, u)  # noqa: E731
    t = torch.linspace(0, 1, 17, dtype=torch.float64)
    x0 = torch.randn(3, dtype=torch.float64)
    trajectory = [(x0, x0, f_u(t[0], x0))]
    with torch.no_grad():
        for i in range(16):
            trajectory.append(reversible_heun_step(f_u, t[i], t[i + 1], *trajectory[-1]))
        state = trajectory[-1]
        for i in reversed(range(16)):
            state = reversible_heun_unstep(f_u, t[i], t[i + 1], *state)
            for a, b in zip(state, trajectory[i]):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_reversible_heun_checkpoint_gradients_equal_direct():
    field = TanhField()
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.linspace(0, 1, 6, dtype=torch.float64)
    u = torch.zeros(3, dtype=torch.float64)
    grads = [torch.autograd.grad(nl.odeint(lambda s, z: field(s, z, u), x0, t, method="reversible_heun",
                                           sensitivity=sens)[-1].sum(), (x0, *field.parameters()))
             for sens in ("direct", "checkpoint")]
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-9)


@pytest.mark.parametrize("n_steps", [1, 5, 32])
def test_reversible_gradients_equal_direct_through_the_same_solve(n_steps):
    field = TanhField()
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, dtype=torch.float64, requires_grad=True)  # captured in a closure
    t = torch.linspace(0, 1, n_steps + 1, dtype=torch.float64)
    inputs = (x0, u, *field.parameters())
    weights = torch.randn(n_steps + 1, 3, dtype=torch.float64)  # a loss on every output time
    grads, outs = {}, {}
    for sens in ("direct", "reversible"):
        y = nl.odeint(lambda s, z: field(s, z, u), x0, t, method="reversible_heun", sensitivity=sens,
                      params=(u, *field.parameters()))
        outs[sens] = y.detach()
        grads[sens] = torch.autograd.grad((weights * y).sum(), inputs)
    torch.testing.assert_close(outs["reversible"], outs["direct"], rtol=0, atol=1e-12)
    for a, b in zip(grads["direct"], grads["reversible"]):
        torch.testing.assert_close(b, a, rtol=1e-7, atol=1e-10)


def test_reversible_finds_module_parameters_and_passes_gradcheck():
    lin = torch.nn.Linear(3, 3).double()

    class Field(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, t, x):
            return torch.tanh(self.lin(x))

    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = nl.odeint(Field(), x0, t, method="reversible_heun", sensitivity="reversible")
    y.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    assert torch.autograd.gradcheck(
        lambda x: nl.odeint(Field(), x, t, method="reversible_heun", sensitivity="reversible")[-1], (x0,))


def test_reversible_with_another_method_is_a_clear_error():
    field, x0, _ = linear_problem()
    with pytest.raises(ValueError, match="sensitivity='reversible' needs method='reversible_heun', not method='rk4'"):
        nl.odeint(field, x0, torch.linspace(0, 1, 3, dtype=torch.float64), method="rk4", sensitivity="reversible")


def test_reversible_memory_does_not_grow_with_the_number_of_steps():
    """Bytes autograd keeps for backward: flat for reversible, growing for direct."""
    from nodelm_lib.profiling import saved_tensor_bytes

    field = TanhField()
    u = torch.zeros(3, dtype=torch.float64)
    x0 = torch.randn(64, 3, dtype=torch.float64, requires_grad=True)

    def kept(n, sens):
        t = torch.linspace(0, 1, n + 1, dtype=torch.float64)
        return saved_tensor_bytes(lambda: nl.odeint(lambda s, z: field(s, z, u), x0, t, method="reversible_heun",
                                             sensitivity=sens, params=tuple(field.parameters())))[0]

    # only the time grid itself (28 more float64 values) grows
    assert kept(32, "reversible") - kept(4, "reversible") == (32 - 4) * 8
    assert kept(32, "direct") > 4 * kept(4, "direct")
