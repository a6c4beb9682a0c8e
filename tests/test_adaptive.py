"""The adaptive embedded Runge-Kutta solver: tolerances, step counting, dense output, gradients."""

import dataclasses
import math

import pytest
import torch
import torchdiffeq

from nodelm_lib.ode import TABLEAUS, rk_step
from nodelm_lib.ode.adaptive import _attempt, _interpolant_terms, _interpolate, solve_adaptive
from nodelm_lib.ode.counters import SolveStats
from nodelm_lib.ode.tableaus import ADAPTIVE_TABLEAUS, DOPRI5

METHODS = sorted(ADAPTIVE_TABLEAUS)
T_OUT = (0.0, 0.1, 0.35, 0.7, 1.0)


def linear_problem(dtype=torch.float64):
    """dx/dt = A x, x(t) = exp(A t) x0."""
    g = torch.Generator().manual_seed(0)
    A = (torch.randn(4, 4, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    x0 = torch.randn(4, generator=g, dtype=torch.float64).to(dtype)
    exact = lambda t: torch.stack([torch.linalg.matrix_exp(A * s) @ x0 for s in t])  # noqa: E731
    return (lambda t, x: A @ x), x0, exact


def chirp(t, x):
    """An oscillator whose frequency jumps from 1 to 21 around t = 0.5: the controller overshoots
    when the step must shrink, so there are rejected steps at every tolerance."""
    w = 1 + 20 * torch.sigmoid(40 * (t - 0.5))
    return torch.stack([x[1], -w**2 * x[0]])


def solve(field, x0, t, method, tol, **kwargs):
    return solve_adaptive(field, x0, t, ADAPTIVE_TABLEAUS[method], rtol=tol, atol=tol,
                          max_num_steps=kwargs.pop("max_num_steps", 100_000), **kwargs)


def test_tableaus():
    assert set(METHODS) == {"dopri5", "bosh3", "adaptive_heun", "fehlberg2"}
    assert {name: tab.order for name, tab in ADAPTIVE_TABLEAUS.items()} == \
        {"dopri5": 5, "bosh3": 3, "adaptive_heun": 2, "fehlberg2": 2}
    assert [name for name, tab in ADAPTIVE_TABLEAUS.items() if tab.fsal] == ["dopri5", "bosh3"]
    assert not any(tab.fsal or tab.b_low is not None for tab in TABLEAUS.values())
    with pytest.raises(AssertionError, match="b_low must sum to 1"):
        dataclasses.replace(DOPRI5, b_low=(1.0,) + DOPRI5.b_low[1:])


# Global error vs tolerance. rtol and atol bound the local error per step; the global error is
# their accumulation over the steps. For dopri5, bosh3 and adaptive_heun the embedded estimate
# is pessimistic (it is the lower-order solution's error) and the global error stays below tol.
# fehlberg2's 1st-order solution is built to have a tiny error constant, so its estimate is about
# the local error of the propagated solution itself, which then adds up over the steps: about
# 70x tol here, for torchdiffeq's fehlberg2 too.
GLOBAL_ERROR_FACTOR = {"dopri5": 10, "bosh3": 10, "adaptive_heun": 10, "fehlberg2": 200}


@pytest.mark.parametrize("method", METHODS)
def test_meets_its_tolerance_at_every_output_time(method):
    field, x0, exact = linear_problem()
    t = torch.tensor(T_OUT, dtype=torch.float64)
    tol = 1e-6
    y = solve(field, x0, t, method, tol)
    assert y.shape == (5, 4) and torch.equal(y[0], x0)
    x = exact(t)
    assert ((y - x).abs() < GLOBAL_ERROR_FACTOR[method] * (tol + tol * x.abs())).all()


# Tight tolerance; adaptive_heun needs ~37000 steps at 1e-10, so it gets 1e-8 (3700 steps).
TIGHT = {"dopri5": (1e-10, 1e-8), "bosh3": (1e-10, 1e-8), "adaptive_heun": (1e-8, 3e-8), "fehlberg2": (1e-10, 6e-8)}


@pytest.mark.parametrize("method", METHODS)
def test_tight_tolerance_agrees_with_the_exact_solution(method):
    field, x0, exact = linear_problem()
    t = torch.tensor(T_OUT, dtype=torch.float64)
    tol, bound = TIGHT[method]
    assert (solve(field, x0, t, method, tol) - exact(t)).abs().max() < bound


@pytest.mark.parametrize("method", ["dopri5", "bosh3"])
def test_nfe_falls_as_the_tolerance_loosens(method):
    field, x0, _ = linear_problem()
    t = torch.tensor(T_OUT, dtype=torch.float64)
    nfe = []
    for tol in (1e-8, 1e-5, 1e-3):
        stats = SolveStats()
        solve(field, x0, t, method, tol, stats=stats)
        nfe.append(stats.nfe)
    assert nfe[0] > nfe[1] > nfe[2], nfe


@pytest.mark.parametrize("method", METHODS)
def test_nfe_formula(method):
    """Every attempted step evaluates stages 2..s (stage 1 is the known f(t, x)). A non-FSAL
    method evaluates f(t1, x1) once more per accepted step. Plus 2 at the start: f(t0, x0) and
    the trial Euler step of the initial step-size selection."""
    tab = ADAPTIVE_TABLEAUS[method]
    stats = SolveStats(nfe=3, n_accepted=4, n_rejected=5)  # counts are added to, not reset
    solve(chirp, torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64),
          method, 1e-3, stats=stats)
    attempts = stats.n_accepted - 4 + stats.n_rejected - 5
    assert stats.n_rejected - 5 > 0  # the formula is checked with rejections in it
    expected = (tab.n_stages - 1) * attempts + (0 if tab.fsal else stats.n_accepted - 4) + 2
    assert stats.nfe - 3 == expected


@pytest.mark.parametrize("method", ["dopri5", "bosh3"])
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_initial_step_follows_hairer(method, direction):
    """dx/dt = -x, x0 = 1, rtol = atol = 1e-6, so sc = 2e-6: d0 = d1 = 5e5, h0 = 0.01 d0 / d1 = 0.01;
    the Euler step gives f1 - f0 = 0.01, d2 = 0.01 / sc / h0 = 5e5; h1 = (0.01 / 5e5)^(1/(p+1)) and
    the first step is min(100 h0, h1) = h1 (accepted, so it is the trajectory's first step)."""
    trajectory, stats = [], SolveStats()
    solve(lambda t, x: -x, torch.ones(1, dtype=torch.float64), torch.tensor([0.0, direction], dtype=torch.float64),
          method, 1e-6, trajectory=trajectory, stats=stats)
    expected = direction * (0.01 / 5e5) ** (1 / (ADAPTIVE_TABLEAUS[method].order + 1))
    assert stats.n_rejected == 0 and math.isclose(trajectory[1][0].item(), expected, rel_tol=1e-12)


@pytest.mark.parametrize("method", ["dopri5", "adaptive_heun"])
def test_decreasing_times_integrate_backwards(method):
    field, x0, exact = linear_problem()
    t = torch.tensor(T_OUT[::-1], dtype=torch.float64)
    x1 = exact(t[:1])[0]
    stats = SolveStats()
    y = solve(field, x1, t, method, 1e-6, stats=stats)
    x = exact(t)
    assert ((y - x).abs() < 10 * (1e-6 + 1e-6 * x.abs())).all()
    assert (y[-1] - x0).abs().max() < 1e-5 and stats.n_accepted > 1


def test_time_arguments_are_checked():
    field, x0, _ = linear_problem()
    for bad in ([0.0, 0.5, 0.3, 1.0], [0.0, 0.5, 0.5, 1.0], [1.0, 1.0]):
        with pytest.raises(ValueError, match="strictly increasing or strictly decreasing"):
            solve(field, x0, torch.tensor(bad, dtype=torch.float64), "dopri5", 1e-6)
    with pytest.raises(ValueError, match="1-D tensor"):
        solve(field, x0, torch.tensor([0.0], dtype=torch.float64), "dopri5", 1e-6)


def test_too_many_steps_is_a_runtime_error_saying_where():
    field, x0, _ = linear_problem()
    stats = SolveStats()
    with pytest.raises(RuntimeError, match=r"dopri5 exceeded max_num_steps=5 at t=0\.\d+ of \[0, 1\] \(last step size "):
        solve(field, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), "dopri5", 1e-10, max_num_steps=5, stats=stats)
    assert stats.n_accepted + stats.n_rejected == 5  # counted up to where it stopped


@pytest.mark.parametrize("method,tols", [
    ("dopri5", (1e-10, 1e-6)), ("bosh3", (1e-10, 1e-6)), ("adaptive_heun", (1e-6,)), ("fehlberg2", (1e-8, 1e-6)),
])
def test_agrees_with_torchdiffeq(method, tols):
    """Same methods, different step sequences: agreement to a few times the tolerance
    (observed: at most 0.4 tol, 1.5 tol for fehlberg2, whose global errors are ~70 tol).

    ``step_t=t`` makes torchdiffeq step onto the output times: its outputs between steps come from
    a quartic through a midpoint value that for bosh3 is only 2nd-order accurate (x0 + h/2 k2),
    which leaves its bosh3 ~2000 tol off at 1e-10 (~100 tol at 1e-6). Its adaptive_heun and
    fehlberg2 also take the next step's first stage from this step's last one (at the Euler /
    1st-order point, not at x1) where we evaluate f(t1, x1): slightly different methods.
    """
    field, x0, _ = linear_problem()
    t = torch.tensor(T_OUT, dtype=torch.float64)
    for tol in tols:
        ours = solve(field, x0, t, method, tol)
        theirs = torchdiffeq.odeint(field, x0, t, rtol=tol, atol=tol, method=method, options={"step_t": t})
        assert ((ours - theirs).abs() < 5 * (tol + tol * ours.abs())).all(), (tol, (ours - theirs).abs().max())


def test_direct_gradients_pass_gradcheck():
    """Finite differences also move the step sizes (they depend on x0 and W through the error
    estimates), which autograd holds fixed. The step sizes move smoothly, and at this tolerance
    the output moves by ~1e-9 relative through them, far below gradcheck's tolerances. A 1e-6
    perturbation could flip an accept/reject decision only for an error ratio within ~1e-6 of 1;
    here every attempted step has ratio < 0.61 (all accepted), so the decisions are robust."""
    g = torch.Generator().manual_seed(1)
    W = (torch.randn(2, 2, generator=g, dtype=torch.float64) * 0.8).requires_grad_()
    x0 = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.tensor([0.0, 1.0], dtype=torch.float64)

    def final_state(x, w):
        return solve(lambda s, z: torch.tanh(w @ z), x, t, "dopri5", 1e-9)[-1]

    assert torch.autograd.gradcheck(final_state, (x0, W))


def test_gradients_are_those_of_the_accepted_steps():
    """Backprop through the solve equals backprop through the accepted steps replayed with
    rk_step on the same grid: rejected attempts leave nothing in the graph."""
    x0 = torch.tensor([1.0, 0.3], dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    field = lambda t, x: scale * chirp(t, x)  # noqa: E731
    t = torch.tensor([0.0, 0.6, 1.0], dtype=torch.float64)
    trajectory, stats = [], SolveStats()
    y = solve(field, x0, t, "dopri5", 1e-4, trajectory=trajectory, stats=stats)
    assert stats.n_rejected > 0
    grads = torch.autograd.grad(y[-1].sum(), (x0, scale))
    x = x0
    times = [s for s, _, _ in trajectory]
    for t0, t1 in zip(times, times[1:]):
        x = rk_step(field, DOPRI5, t0, t1 - t0, x)
    torch.testing.assert_close(x, y[-1], rtol=1e-12, atol=1e-12)
    for ours, replay in zip(grads, torch.autograd.grad(x.sum(), (x0, scale))):
        torch.testing.assert_close(ours, replay, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["dopri5", "fehlberg2"])
@pytest.mark.parametrize("decreasing", [False, True])
def test_trajectory(method, decreasing):
    field, x0, _ = linear_problem()
    t = torch.tensor(T_OUT[::-1] if decreasing else T_OUT, dtype=torch.float64)
    trajectory, stats = [], SolveStats()
    y = solve(field, x0, t, method, 1e-5, trajectory=trajectory, stats=stats)
    times = torch.stack([s for s, _, _ in trajectory])
    assert len(trajectory) == stats.n_accepted + 1
    steps = times.diff() * (-1 if decreasing else 1)
    assert (steps > 0).all() and times[0] == t[0] and times[-1] == t[-1]
    assert torch.equal(trajectory[-1][1], y[-1])
    for s, x, f in trajectory:
        assert s.dtype == x0.dtype and s.ndim == 0
        assert torch.equal(f, field(s, x))  # exactly: FSAL's last stage is taken at x1 itself


def test_float32_and_any_shape():
    field64, x0, exact = linear_problem()
    X0 = torch.stack([x0, 2 * x0, -x0]).float()  # (3, 4): the field acts on the last dim
    A = field64(None, torch.eye(4, dtype=torch.float64)).float()  # A @ I
    t = torch.tensor(T_OUT, dtype=torch.float32)
    y = solve(lambda s, x: x @ A.T, X0, t, "dopri5", 1e-5)
    assert y.dtype == torch.float32 and y.shape == (5, 3, 4)
    torch.testing.assert_close(y[:, 1], 2 * exact(t.double()).float(), rtol=1e-4, atol=1e-4)


# Dense output. dopri5's continuous extension is 4th order: its error at a point inside a step
# of size h is O(h^5). The cubic Hermite interpolant's is O(h^4).

def _midpoint_error(tableau, h):
    field, x0, exact = linear_problem()
    step = _attempt(field, tableau, 0.0, h, x0, field(None, x0))
    f1 = field(None, step.x1)
    x_mid = _interpolate(x0, _interpolant_terms(step, f1, tableau), 0.5)
    return (x_mid - exact([h / 2])[0]).norm().item()


@pytest.mark.parametrize("tableau,order", [(DOPRI5, 5),
                                           (dataclasses.replace(DOPRI5, name="dopri5_hermite", dense_d=None), 4)])
def test_dense_output_order(tableau, order):
    errors = [_midpoint_error(tableau, h) for h in (0.4, 0.2, 0.1)]
    observed = math.log2(errors[1] / errors[2])
    assert abs(observed - order) < 0.3, (errors, observed)


def test_dopri5_dense_output_beats_hermite_with_large_steps():
    """The chirp at a loose tolerance: few, large steps. The same steps with dopri5's own
    interpolant and with a cubic Hermite one (a copy of the tableau without ``dense_d``, so only
    the interpolant differs), compared at each step's midpoint with a tight solve from the step's
    start point (so that only the error made within the step counts)."""
    x0 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    tol = 1e-5
    trajectory = []
    solve(chirp, x0, torch.tensor([0.0, 1.0], dtype=torch.float64), "dopri5", tol, trajectory=trajectory)
    times = torch.stack([s for s, _, _ in trajectory])
    midpoints = (times[:-1] + times[1:]) / 2
    t = torch.cat([times[:1], midpoints, times[-1:]])
    dense = solve_adaptive(chirp, x0, t, DOPRI5, tol, tol, 10_000)
    hermite = solve_adaptive(chirp, x0, t, dataclasses.replace(DOPRI5, name="dopri5_hermite", dense_d=None),
                             tol, tol, 10_000)
    assert torch.equal(dense[-1], hermite[-1])  # the same steps
    local = torch.stack([solve(chirp, x, torch.stack([s, m]), "dopri5", 1e-12)[-1]
                         for (s, x, _), m in zip(trajectory, midpoints)])
    err_dense = (dense[1:-1] - local).abs().max()
    err_hermite = (hermite[1:-1] - local).abs().max()
    assert len(midpoints) > 20
    assert err_dense < 20 * tol and err_hermite > 10 * err_dense, (err_dense, err_hermite)  # 7e-5, 3e-3
