"""The integrators study's measurements (notebook 05) on problems small enough for CI."""

import math

import pytest

from nodelm_lib.analysis import integrators as ig


def test_error_vs_nfe_shows_each_methods_order():
    accuracy = ig.error_vs_nfe(ig.linear_problem(4), ["euler", "heun", "rk4"], [16, 32, 64], ["dopri5"], [1e-4, 1e-8])
    orders = ig.observed_orders(accuracy).set_index("method").observed_order
    for method, p in {"euler": 1, "heun": 2, "rk4": 4}.items():
        assert abs(orders[method] - p) < 0.2, (method, orders[method])
    adaptive = accuracy[accuracy.kind == "adaptive"].sort_values("tolerance")
    assert adaptive.nfe.is_monotonic_decreasing and adaptive.error.iloc[0] < adaptive.error.iloc[-1]


def test_sensitivity_costs_compare_each_gradient_with_direct():
    problem = ig.hybrid_problem(d_model=16, n_heads=2, batch=2, seq_len=64, dtype=__import__("torch").float64)
    costs = ig.sensitivity_costs(problem, ["direct", "checkpoint", "backsolve", "reversible"], [2, 8], repeats=1)
    err = costs.set_index(["sensitivity", "n_steps"]).grad_rel_error
    assert err[("direct", 8)] == 0 and err[("checkpoint", 8)] < 1e-12 and err[("reversible", 8)] < 1e-12
    assert 0 < err[("backsolve", 8)] < err[("backsolve", 2)] < 1e-2  # the continuous adjoint converges
    table = ig.summary(costs)
    assert list(table.sensitivity) == ["direct", "checkpoint", "backsolve", "reversible"]
    assert (table.n_steps == 8).all() and "peak_ratio_8_over_2" in table
    direct_peak = costs.set_index(["sensitivity", "n_steps"]).peak_mb
    if not math.isnan(direct_peak[("direct", 8)]):  # direct keeps every stage: it grows
        assert direct_peak[("direct", 8)] > direct_peak[("direct", 2)]


def test_reversible_uses_reversible_heun():
    assert ig.method_for("reversible", "rk4") == "reversible_heun"
    assert ig.method_for("backsolve", "rk4") == "rk4"
    with pytest.raises(ValueError, match="method='rk5'"):
        ig.error_vs_nfe(ig.linear_problem(2), ["rk5"], [2])
