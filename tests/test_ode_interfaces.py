"""The ODE package's declared pieces: the one weighted sum of stages, dense output read from the
tableau, the solver-scheme interface and the abstract gradient method."""

import dataclasses
from typing import ClassVar

import pytest
import torch

from nodelm_lib.ode.adaptive import solve_adaptive
from nodelm_lib.ode.adjoint import ContinuousAdjoint
from nodelm_lib.ode.gradients import REVERSIBLE_METHODS, GradientMethod
from nodelm_lib.ode.reversible import ReversibleHeun
from nodelm_lib.ode.runge_kutta import weighted_sum
from nodelm_lib.ode.scheme import ReversibleScheme, Scheme
from nodelm_lib.ode.solve import SENSITIVITIES, gradient_method, odeint
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS, SCHEMES, RungeKutta, Solver
from nodelm_lib.ode.tableaus import DOPRI5, TABLEAUS


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


# ---------------------------------------------------------------- dense output, from the tableau

def _dense_solve(tableau):
    """dopri5's steps with ``tableau``'s dense output, at times inside the steps."""
    A = torch.tensor([[-0.5, 1.0], [-1.0, -0.5]], dtype=torch.float64)
    x0 = torch.tensor([1.0, 0.5], dtype=torch.float64)
    t = torch.linspace(0, 3, 13, dtype=torch.float64)
    return solve_adaptive(lambda s, x: A @ x, x0, t, tableau, rtol=1e-4, atol=1e-6, max_num_steps=100)


def test_dense_output_is_read_from_the_tableau():
    """dopri5 carries its continuous extension; the same pair without it (any name) falls back to
    the cubic Hermite interpolant, and a pair given dopri5's under another name uses it."""
    assert DOPRI5.dense_d is not None and all(tab.dense_d is None for tab in TABLEAUS.values())
    hermite = dataclasses.replace(DOPRI5, dense_d=None)
    renamed = dataclasses.replace(DOPRI5, name="my_dopri5")
    with_dense, without = _dense_solve(DOPRI5), _dense_solve(hermite)
    assert torch.equal(_dense_solve(renamed), with_dense)
    assert not torch.equal(without, with_dense)
    # the step points themselves (t = 0 and 3) are exact either way
    assert torch.equal(without[[0, -1]], with_dense[[0, -1]])


def test_a_tableau_checks_its_dense_weights():
    with pytest.raises(AssertionError, match="dense_d must have one weight per stage"):
        dataclasses.replace(DOPRI5, dense_d=(1.0, 0.0))


# ---------------------------------------------------------------- the solver scheme

@pytest.mark.parametrize("method", FIXED_STEP_METHODS)
def test_every_fixed_step_scheme_declares_the_interface(method):
    scheme = Solver(method).scheme
    assert isinstance(scheme, Scheme) and scheme.name == method
    assert isinstance(scheme, ReversibleScheme) == (method in REVERSIBLE_METHODS)


def test_reversible_heun_is_the_reversible_scheme():
    assert REVERSIBLE_METHODS == ("reversible_heun",) and isinstance(ReversibleHeun(), ReversibleScheme)
    assert not isinstance(RungeKutta(TABLEAUS["rk4"]), ReversibleScheme)


def test_a_scheme_missing_a_method_cannot_be_made():
    class NoValue(Scheme):
        name = "no_value"

        def nfe(self, n_steps):
            return n_steps

        def init(self, field, t0, x0):
            return x0

        def step(self, field, t0, dt, state, f0=None):
            return state + dt * field(t0, state)

    with pytest.raises(TypeError, match="value"):
        NoValue()
    with pytest.raises(TypeError, match="unstep"):
        type("NoUnstep", (ReversibleScheme, NoValue), {"value": lambda self, state: state})()


def test_a_declared_scheme_marches():
    """A scheme written against the interface alone runs in Solver.march (explicit Euler here)."""

    class Euler(Scheme):
        name = "my_euler"

        def nfe(self, n_steps):
            return n_steps

        def init(self, field, t0, x0):
            return x0

        def step(self, field, t0, dt, state, f0=None):
            return state + dt * (field(t0, state) if f0 is None else f0)

        def value(self, state):
            return state

    field = lambda s, x: -x  # noqa: E731
    x0, t = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.linspace(0, 1, 5, dtype=torch.float64)
    solver = Solver("euler")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SCHEMES, "euler", Euler())
        xs = torch.stack(solver.march(field, x0, t)[0])
    torch.testing.assert_close(xs, solver.integrate(field, x0, t), rtol=0, atol=1e-15)


# ---------------------------------------------------------------- the gradient method

def test_gradient_method_is_abstract():
    with pytest.raises(TypeError, match="solve"):
        GradientMethod()
    with pytest.raises(TypeError, match="forward"):
        ContinuousAdjoint()


def test_a_gradient_method_without_solve_cannot_be_made():
    @dataclasses.dataclass(frozen=True)
    class Unfinished(GradientMethod):
        name: ClassVar[str] = "unfinished"

        def check(self, solver):
            pass

    with pytest.raises(TypeError, match="solve"):
        Unfinished()


@pytest.mark.parametrize("name", SENSITIVITIES)
def test_every_gradient_method_subclasses_the_declared_one(name):
    method = gradient_method(name)
    assert isinstance(method, GradientMethod) and method.name == name


def test_a_gradient_method_with_solve_works_in_odeint():
    @dataclasses.dataclass(frozen=True)
    class Detached(GradientMethod):
        name: ClassVar[str] = "detached"

        def solve(self, solver, field, x0, t, params=None, counters=None):
            with torch.no_grad():
                return solver.integrate(field, x0, t, counters)

    x0, t = torch.ones(3, requires_grad=True), torch.linspace(0, 1, 3)
    y = odeint(lambda s, x: -x, x0, t, sensitivity=Detached())
    assert not y.requires_grad
    assert torch.equal(y, odeint(lambda s, x: -x, x0, t).detach())
