"""nl.odeint: fixed-step solvers (orders, grids, torch.compile) and every sensitivity against direct."""

import math
import statistics

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
    with pytest.raises(ValueError, match="sensitivity='adjoint' is not valid; choose one of 'direct', 'checkpoint', "
                                         "'backsolve', 'interpolating', 'quadrature', 'reversible'"):
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
    from nodelm_lib.training.profiling import saved_tensor_bytes

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


# ---------------------------------------------------------------- sub-steps, stats, torch.compile


@pytest.mark.parametrize("method", ["euler", "rk4", "reversible_heun"])
def test_steps_per_interval_equals_the_same_steps_on_a_finer_grid(method):
    field, x0, _ = linear_problem()
    t = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    fine = nl.odeint(field, x0, torch.linspace(0, 1, 17, dtype=torch.float64), method=method)
    coarse = nl.odeint(field, x0, t, method=method, steps_per_interval=8)
    assert coarse.shape == (3, 4)
    torch.testing.assert_close(coarse, fine[::8], rtol=0, atol=1e-12)


def test_fixed_step_stats_count_evaluations_and_steps():
    field, x0, _ = linear_problem()
    stats = nl.SolveStats()
    nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), method="rk38", steps_per_interval=5, stats=stats)
    assert (stats.nfe, stats.n_accepted, stats.n_rejected) == (20, 5, 0)


def test_fixed_step_solve_compiles_to_one_graph():
    """fullgraph=True fails on any graph break (e.g. a host sync or data-dependent control flow)."""
    field = TanhField()
    u = torch.randn(3, dtype=torch.float64)
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    x0 = torch.randn(5, 3, dtype=torch.float64)

    def solve(x):
        return nl.odeint(lambda s, z: field(s, z, u), x, t, method="rk4")

    torch._dynamo.reset()
    compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x0), solve(x0), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- continuous adjoints

ADJOINTS = ["backsolve", "interpolating", "quadrature"]


@pytest.mark.parametrize("sensitivity", ADJOINTS)
@pytest.mark.parametrize("steps_per_interval", [1, 16])
def test_adjoint_gradients_equal_direct_on_the_linear_problem(sensitivity, steps_per_interval):
    """64 rk4 steps; a loss on every output time; a parameter matrix and a closure-captured
    forcing vector: each continuous adjoint within 1e-4 relative of the discrete gradient."""
    torch.manual_seed(0)
    A = (torch.randn(4, 4, dtype=torch.float64) * 0.5).requires_grad_()
    u = torch.randn(4, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(4, dtype=torch.float64, requires_grad=True)
    t = torch.linspace(0, 1, 64 // steps_per_interval + 1, dtype=torch.float64)
    weights = torch.randn(t.numel(), 4, dtype=torch.float64)
    grads = {}
    for sens in ("direct", sensitivity):
        y = nl.odeint(lambda s, x: A @ x + u, x0, t, method="rk4", sensitivity=sens, params=(A, u),
                      steps_per_interval=steps_per_interval)
        grads[sens] = torch.autograd.grad((weights * y).sum(), (x0, A, u))
    for name, g, g_direct in zip(("x0", "A", "u"), grads[sensitivity], grads["direct"]):
        rel = ((g - g_direct).norm() / g_direct.norm()).item()
        assert rel < 1e-4, f"{sensitivity}: d/d{name} differs from direct by {rel:.2e} (relative)"


@pytest.mark.parametrize("sensitivity", ADJOINTS + ["checkpoint", "direct"])
def test_every_sensitivity_passes_gradcheck(sensitivity):
    """Finite differences of the discrete solve: the continuous adjoints differ from them by
    O(h^4), so 32 rk4 steps on a tiny field keep that under gradcheck's tolerance."""
    field = TanhField()
    u = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)

    def solve(x, v, weight):
        return nl.odeint(lambda s, z: field(s, z, v), x, t, method="rk4", sensitivity=sensitivity,
                         steps_per_interval=16, params=(v, *field.parameters()))[1:]

    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(solve, (x0, u, field.lin.weight), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("sensitivity", ADJOINTS + ["reversible"])
def test_closure_captured_modules_and_tensors_are_found(sensitivity):
    lin = torch.nn.Linear(3, 3).double()
    u = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    method = "reversible_heun" if sensitivity == "reversible" else "rk4"
    grads = {}
    for sens in ("direct", sensitivity):
        y = nl.odeint(lambda s, z: torch.tanh(lin(z) + u), x0, t, method=method, sensitivity=sens)
        grads[sens] = torch.autograd.grad(y[-1].sum(), (x0, u, lin.weight, lin.bias))
    for g, g_direct in zip(grads[sensitivity], grads["direct"]):
        torch.testing.assert_close(g, g_direct, rtol=1e-4, atol=1e-8)


def test_find_params_sees_modules_tensors_and_bound_methods():
    from nodelm_lib.ode import find_params

    field = TanhField()
    u = torch.randn(3, requires_grad=True)
    frozen = torch.randn(3)
    assert {id(p) for p in find_params(lambda s, z: field(s, z, u) + frozen)} == {id(p) for p in (*field.parameters(), u)}
    assert len(find_params(field.forward)) == 2


def test_interpolating_is_stable_where_backsolve_drifts():
    """x1 is pulled hard onto sin(2 pi t), x2 integrates w x1. Integrating x backwards
    amplifies every rounding error by ~exp(50), so backsolve's x1, and its dL/dw = int x1 dt,
    are garbage; interpolating re-integrates forwards only and stays exact."""
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def field(s, x):
        return torch.stack([-50 * (x[0] - torch.sin(2 * math.pi * s)), w * x[0]])

    x0 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    grads = {}
    for sens in ("direct", "interpolating", "backsolve"):
        y = nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), method="rk4", sensitivity=sens,
                      steps_per_interval=256, params=(w,))
        grads[sens] = torch.autograd.grad(y[-1, 1], w)[0]
    error = {s: abs((grads[s] / grads["direct"] - 1).item()) for s in ("interpolating", "backsolve")}
    assert error["interpolating"] < 1e-4, error
    assert not error["backsolve"] < 1.0, error  # NaN / inf count as drifted


def test_adjoint_stats_count_backward_evaluations():
    field, x0, _ = linear_problem()
    x0 = x0.clone().requires_grad_()
    stats = nl.SolveStats()
    y = nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), method="rk4", sensitivity="backsolve",
                  steps_per_interval=8, stats=stats)
    assert stats.nfe == 32 and stats.nfe_backward == 0
    y[-1].sum().backward()
    assert stats.nfe_backward == 32  # one vector-Jacobian product per stage of each backward step


@pytest.mark.parametrize("ours,theirs", [("euler", "euler"), ("midpoint", "midpoint"), ("rk38", "rk4")])
def test_fixed_step_methods_agree_with_torchdiffeq(ours, theirs):
    """torchdiffeq's fixed-step rk4 steps with the 3/8 rule: it is our rk38."""
    torchdiffeq = pytest.importorskip("torchdiffeq")
    field, x0, _ = linear_problem()
    t = torch.linspace(0, 1, 9, dtype=torch.float64)
    torch.testing.assert_close(nl.odeint(field, x0, t, method=ours), torchdiffeq.odeint(field, x0, t, method=theirs),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("sensitivity", ADJOINTS)
def test_adjoints_with_an_adaptive_solver(sensitivity):
    """dopri5 forwards and backwards at a tight tolerance: the continuous adjoint and the
    gradient of the discrete adaptive solve both approach the exact gradient. interpolating and
    quadrature read x(t) from a cubic Hermite interpolant over dopri5's (long) accepted steps:
    4th order against the solver's 5th, hence their looser bound (measured: 1.2e-5 relative)."""
    field = TanhField()
    u = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0.0, 0.4, 1.0], dtype=torch.float64)
    grads = {}
    for sens in ("direct", sensitivity):
        y = nl.odeint(lambda s, z: field(s, z, u), x0, t, method="dopri5", rtol=1e-9, atol=1e-9, sensitivity=sens,
                      params=(u, *field.parameters()))
        grads[sens] = torch.autograd.grad((y[1:] ** 2).sum(), (x0, u, *field.parameters()))
    rtol = 1e-6 if sensitivity == "backsolve" else 1e-4
    for g, g_direct in zip(grads[sensitivity], grads["direct"]):
        torch.testing.assert_close(g, g_direct, rtol=rtol, atol=1e-8)


@pytest.mark.parametrize("sensitivity", ["reversible", "backsolve"])
def test_peak_memory_of_flat_memory_methods_does_not_grow_with_steps(sensitivity):
    """Forward + backward at 64 steps peaks within a few states of 4 steps. A state is 1 MiB;
    keeping every state would add 60 MiB (rk4's stages: 240). Each peak is the median of three
    runs. The bound is 8 states: in the full suite, after earlier tests changed glibc's heap
    settings, growth of 3.04 and 3.54 MiB was measured (fresh-clone CI runs, 2026-11-24 / 25;
    alone it is typically under 0.3 MiB): the resident set also sees the heap's small
    allocations, which this measurement cannot tell from tensors."""
    from nodelm_lib.training.profiling import peak_memory_mb

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256).double()
    x0 = torch.randn(512, 256, dtype=torch.float64, requires_grad=True)
    method = "reversible_heun" if sensitivity == "reversible" else "rk4"

    def peak(n):
        def run():
            y = nl.odeint(lambda s, x: torch.tanh(lin(x)), x0, torch.tensor([0.0, 1.0], dtype=torch.float64),
                          method=method, sensitivity=sensitivity, steps_per_interval=n)
            y[-1].sum().backward()
        return peak_memory_mb(run)[0]

    peak(4)  # warm-up
    small, large = (statistics.median(peak(n) for _ in range(3)) for n in (4, 64))
    if math.isnan(small):
        pytest.skip("no exact CPU peak memory on this platform")
    state_mb = x0.numel() * 8 / 2**20
    assert large - small < 8 * state_mb, (small, large)
