"""The split between solvers and gradient methods: strategy objects, the one grid, the one RK stage function."""

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.ode import GRADIENT_METHODS, SENSITIVITIES, TABLEAUS, Solver, gradient_method, rk_stages
from nodelm_lib.ode.tableaus import ADAPTIVE_TABLEAUS

F64 = torch.float64


def tanh_problem():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3).double()
    u = torch.randn(3, dtype=F64, requires_grad=True)
    x0 = torch.randn(3, dtype=F64, requires_grad=True)
    return (lambda s, x: torch.tanh(lin(x) + u) * (1 + s)), x0, (u, *lin.parameters())


@pytest.mark.parametrize("name", SENSITIVITIES)
def test_an_object_and_its_name_are_the_same_gradient_method(name):
    field, x0, params = tanh_problem()
    method = "reversible_heun" if name == "reversible" else "rk4"
    t = torch.linspace(0, 1, 5, dtype=F64)
    obj = GRADIENT_METHODS[name]()
    assert obj.name == name and gradient_method(name) == obj and gradient_method(obj) is obj
    results = []
    for sensitivity in (name, obj):
        y = nl.odeint(field, x0, t, method=method, sensitivity=sensitivity, steps_per_interval=2, params=params)
        results.append((y, torch.autograd.grad(y[-1].sum(), (x0, *params))))
    (y_name, g_name), (y_obj, g_obj) = results
    assert torch.equal(y_name, y_obj)
    for a, b in zip(g_name, g_obj):
        assert torch.equal(a, b)


def test_the_public_objects_and_their_order():
    assert SENSITIVITIES == ("direct", "checkpoint", "backsolve", "interpolating", "quadrature", "reversible")
    assert [type(gradient_method(n)) for n in SENSITIVITIES] == [
        nl.Direct, nl.Checkpoint, nl.Backsolve, nl.Interpolating, nl.Quadrature, nl.Reversible]
    assert [n for n in SENSITIVITIES if gradient_method(n).reevaluates_field] == [
        "backsolve", "interpolating", "quadrature", "reversible"]
    assert nl.SolveStats is nl.SolverCounters


def test_unknown_names_and_objects_are_clear_errors():
    with pytest.raises(ValueError, match="sensitivity='adjoint' is not valid; choose one of 'direct', 'checkpoint'"):
        gradient_method("adjoint")
    field, x0, _ = tanh_problem()
    with pytest.raises(ValueError, match="needs a fixed-step method"):
        nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=F64), method="dopri5", sensitivity=nl.Checkpoint())


def test_a_user_gradient_method_is_called_with_the_solver():
    seen = {}

    class Spy(nl.Direct):
        def solve(self, solver, field, x0, t, params=None, counters=None):
            seen.update(solver=solver, t=t)
            return super().solve(solver, field, x0, t, params, counters)

    field, x0, _ = tanh_problem()
    y = nl.odeint(field, x0, torch.tensor([0.0, 1.0]), method="midpoint", sensitivity=Spy(), steps_per_interval=3)
    assert seen["solver"] == Solver("midpoint", 3) and seen["t"].dtype == F64
    torch.testing.assert_close(y, nl.odeint(field, x0, torch.tensor([0.0, 1.0], dtype=F64), method="midpoint",
                                            steps_per_interval=3), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["euler", "rk4", "reversible_heun"])
def test_the_solver_steps_on_its_own_step_times(method):
    """Every field evaluation of a fixed-step solve happens at t_m + c dt_m of ``step_times``."""
    seen = []

    def field(s, x):
        seen.append(s.clone())
        return -x

    t = torch.tensor([0.0, 0.3, 1.0], dtype=F64)
    solver = Solver(method, 3)
    solver.integrate(field, torch.ones(2, dtype=F64), t)
    grid = solver.step_times(t)
    assert len(grid) == 6
    assert all(torch.equal(s, t[i // 3] + (i % 3) * dt) for i, (s, dt) in enumerate(grid))
    if method == "euler":
        assert all(torch.equal(a, s) for a, (s, _) in zip(seen, grid))
    elif method == "reversible_heun":  # f(t0, x0), then one evaluation at the end of each step
        assert torch.equal(seen[0], t[0]) and all(torch.equal(a, s + dt) for a, (s, dt) in zip(seen[1:], grid))
    else:
        starts = seen[::4]
        assert len(seen) == 4 * len(grid) and all(torch.equal(a, s) for a, (s, _) in zip(starts, grid))
    with pytest.raises(ValueError, match="adaptive"):
        Solver("dopri5").step_times(t)


@pytest.mark.parametrize("method", ["rk4", "reversible_heun", "dopri5"])
def test_trajectory_points_hold_the_field_at_each_step_point(method):
    field, x0, _ = tanh_problem()
    t = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    solver = Solver(method, 4, rtol=1e-6, atol=1e-6)
    counters = nl.SolverCounters()
    with torch.no_grad():
        ys, points = solver.trajectory(field, x0, t, counters)
        torch.testing.assert_close(ys, solver.integrate(field, x0, t), rtol=0, atol=0)
    assert torch.equal(points[0][1], x0) and torch.equal(points[-1][1], ys[-1]) and points[-1][0] == t[-1]
    for s, x, f in points:
        torch.testing.assert_close(f, field(s, x), rtol=0, atol=0)
    assert counters.n_accepted == len(points) - 1
    if method == "rk4":  # the recorded f is the step's first stage: no extra evaluation
        assert counters.nfe == 8 * 4 + 1


@pytest.mark.parametrize("name", sorted(ADAPTIVE_TABLEAUS))
def test_the_embedded_error_is_the_difference_of_the_two_solutions(name):
    tableau = ADAPTIVE_TABLEAUS[name]
    low = nl.ode.ButcherTableau(name + "_low", 1, tableau.c, tableau.a, tableau.b_low)
    field, x0, _ = tanh_problem()
    s0, dt = torch.tensor(0.2, dtype=F64), torch.tensor(0.1, dtype=F64)
    with torch.no_grad():
        step = rk_stages(field, tableau, s0, dt, x0, error=True)
        x_low = rk_stages(field, low, s0, dt, x0).x1
    assert step.k[0].equal(field(s0, x0)) and len(step.k) == tableau.n_stages
    torch.testing.assert_close(step.error, step.x1 - x_low, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="no embedded solution"):
        rk_stages(field, TABLEAUS["rk4"], s0, dt, x0, error=True)


def small(arch, **ode):
    span = dict(ode_start=1, ode_end=2) if arch == "hybrid" else {}
    cfg = nl.ModelConfig(arch=arch, vocab_size=32, d_model=8, n_heads=2, n_layers=3, max_seq_len=8,
                         time_features=4, time_hidden=8, hyper_dim=2, ode=nl.ODEConfig(n_steps=3, **ode), **span)
    return nl.build_model(cfg).eval()


def test_the_ode_block_owns_its_interval_solver_and_grid():
    model = small("ti_mlp", method="rk4")
    block = model.ode_block
    assert block.times(F64).tolist() == [0.0, 1.0] and block.times(F64).dtype == F64
    assert block.solver() == Solver("rk4", 3, model.cfg.ode.rtol, model.cfg.ode.atol, model.cfg.ode.max_num_steps)
    assert [float(s) for s, _ in block.step_times()] == pytest.approx([0, 1 / 3, 2 / 3])
    model.set_ode(method="dopri5")
    assert block.solver().steps_per_interval == 1


def test_embed_is_what_the_body_receives():
    model = small("node")
    idx = torch.randint(0, 32, (2, 5))
    seen = []
    hook = model.ode_block.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    model(idx)
    hook.remove()
    assert torch.equal(seen[0], model.embed(idx))
    assert torch.equal(model.embed(idx[:, 3:], start=3), model.embed(idx)[:, 3:])


@pytest.mark.parametrize("arch", ["gpt", "hybrid", "ssm"])
def test_only_continuous_depth_models_have_a_depth_flow(arch):
    model = small(arch)
    with pytest.raises(ValueError, match=r"the check needs a continuous-depth model \(arch 'node', 'ti_mlp', 'ti_ssm'\)"):
        nl.models.continuous_block(model, "the check")
    for arch in ("node", "ti_mlp", "ti_ssm"):
        m = small(arch)
        assert nl.models.continuous_block(m, "the check") is m.ode_block
