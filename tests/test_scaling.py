"""Notebook 07's library: fitted trends (trends.py) checked against scipy and synthetic truth, the
t-intervals over seeds and their coverage, the slope tests against scipy, the iso read-offs, the
reuse of notebook 02's runs, and clear errors."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import optimize

import nodelm_lib as nl
from conftest import fake_record
from nodelm_lib.experiments import protocol, scaling, sweep_time
from nodelm_lib.reporting import stats, trends
from nodelm_lib.runs.store import run_hash

ROOT = Path(__file__).resolve().parents[1]


def power(x, E, A, alpha):
    return E + A * np.asarray(x, dtype=float) ** -alpha


# --------------------------------------------------------------------------- fits


def test_the_power_law_fit_recovers_known_parameters_from_noisy_points():
    rng = np.random.default_rng(0)
    x = np.repeat(np.geomspace(1e5, 3e7, 8), 3)
    y = power(x, 1.4, 60.0, 0.3) + rng.normal(0, 0.003, x.size)
    trend, at_bound = trends.fit_power_law(x, y)
    assert at_bound == ""
    assert trend.params["E"] == pytest.approx(1.4, abs=0.03)
    assert trend.params["alpha"] == pytest.approx(0.3, abs=0.03)
    assert trend(2e6) == pytest.approx(power(2e6, 1.4, 60.0, 0.3), abs=0.003)
    # the same least-squares optimum as scipy's Levenberg-Marquardt from a start near it
    ref, _ = optimize.curve_fit(power, x, y, p0=[1.3, 50.0, 0.28], maxfev=20000)
    assert [trend.params[k] for k in ("E", "A", "alpha")] == pytest.approx(ref, rel=1e-4)
    chosen = trends.fit_trend(x, y)
    assert chosen.form == trends.POWER_LAW and "curvature resolved" in chosen.reason


def test_the_log_linear_fit_is_numpy_least_squares_and_its_slope_per_doubling():
    x = np.array([1e5, 2e5, 4e5, 8e5, 1e5, 2e5, 4e5, 8e5])
    y = 3.0 - 0.1 * np.log(x) + np.array([0.01, -0.02, 0.0, 0.01, -0.01, 0.02, 0.0, -0.01])
    trend = trends.fit_log_linear(x, y)
    b, a = np.polyfit(np.log(x), y, 1)
    assert (trend.params["a"], trend.params["b"]) == pytest.approx((a, b), rel=1e-12)
    assert trend.slope_per_doubling(3e5) == pytest.approx(b * math.log(2))


@pytest.mark.parametrize("seed", range(40))
def test_the_power_law_profile_is_scipys_non_negative_least_squares(seed):
    """The closed-form two-unknown NNLS, interior and on each face (E = 0, A' = 0, both), against
    scipy's active-set solver: the same residual, and coefficients where the optimum is unique."""
    rng = np.random.default_rng(seed)
    u = rng.normal(0, 1, 12)
    alpha = float(rng.choice([1e-3, 0.3, 2.0]))
    v = np.exp(-alpha * u)
    E, A = rng.choice([-1.0, 0.0, 1.5]), rng.choice([-2.0, 0.0, 3.0])
    y = E + A * v + rng.normal(0, 0.05, u.size)
    (E_fit, A_fit), rss = trends._power_profile(u.tolist(), y.tolist(), alpha)
    ref, rnorm = optimize.nnls(np.column_stack([np.ones_like(u), v]), y)
    assert E_fit >= 0 and A_fit >= 0
    assert rss == pytest.approx(rnorm ** 2, rel=1e-9, abs=1e-12)
    assert (E_fit, A_fit) == pytest.approx(tuple(ref), rel=1e-6, abs=1e-9)


def test_the_scaling_analysis_does_not_depend_on_the_blas_kernels(tmp_path):
    """07's fits, intervals and tests use no BLAS and no vector exp/log: run under two of
    OpenBLAS's kernel sets (as on two kinds of CPU) they write the same bytes. Before, a
    least-squares solve through the BLAS moved the committed tests in the 15th digit."""
    import subprocess
    import sys

    rng = np.random.default_rng(3)
    rows = [{"arm": arm, "seed": seed, "width": w, "params": 1e5 * w, "flops": 3e8 * w,
             "test_loss": power(1e5 * w, 1.4, 60.0 + 5 * (arm == "b"), 0.3) + rng.normal(0, 0.01)}
            for arm in ("gpt", "b") for seed in range(3) for w in (1, 2, 4, 8, 16)]
    pd.DataFrame(rows).to_csv(tmp_path / "points.csv", index=False)
    script = ("import sys, pandas as pd\n"
              "from nodelm_lib.reporting import trends\n"
              "p = pd.read_csv(sys.argv[1])\n"
              "fit = lambda q: pd.Series({(a, k): v for a, g in q.groupby('arm')\n"
              "    for k, v in trends.fit_trend(g['params'], g['test_loss']).params.items()})\n"
              "print(trends.seed_t_intervals(p, fit, n_boot=200).to_csv(), trends.jackknife(p, fit).to_csv())\n")
    outputs = []
    for core in ("Haswell", "Sandybridge"):
        env = {**os.environ, "OPENBLAS_CORETYPE": core}
        outputs.append(subprocess.run([sys.executable, "-c", script, str(tmp_path / "points.csv")], env=env,
                                      check=True, capture_output=True, text=True).stdout)
    assert outputs[0] == outputs[1]


def test_the_power_law_slope_per_doubling_is_its_derivative_in_log2_x():
    trend = trends.Trend(trends.POWER_LAW, {"E": 1.5, "A": 40.0, "alpha": 0.3}, 1e5, 1e7, 8, 4)
    x, h = 1e6, 1e-6
    numeric = (trend(x * 2 ** h) - trend(x * 2 ** -h)) / (2 * h)
    assert trend.slope_per_doubling(x) == pytest.approx(numeric, rel=1e-6)


@pytest.mark.parametrize("x, y, why", [
    ([1e5, 2e5, 4e5] * 3, 3.0 - 0.1 * np.log([1e5, 2e5, 4e5] * 3), "3 sizes"),
    # a straight line in log x: the power law's optimum sits on E = 0, its log-linear limit
    ([1e5, 2e5, 4e5, 8e5] * 3, 2.5 - 0.1 * np.log([1e5, 2e5, 4e5, 8e5] * 3) + np.repeat([1e-3, -1e-3, 0.0], 4),
     "not identified"),
])
def test_points_that_cannot_carry_three_parameters_get_the_log_linear_fit_and_say_why(x, y, why):
    trend = trends.fit_trend(x, y)
    assert trend.form == trends.LOG_LINEAR and why in trend.reason


def test_curvature_inside_the_noise_keeps_the_log_linear_fit():
    rng = np.random.default_rng(3)
    x = np.repeat([1e5, 2e5, 4e5, 8e5], 3)
    y = power(x, 1.0, 8.0, 0.05) + rng.normal(0, 0.05, x.size)  # barely curved, noisy
    trend = trends.fit_trend(x, y)
    assert trend.form == trends.LOG_LINEAR
    assert "no curvature resolved" in trend.reason or "not identified" in trend.reason


def test_extrapolation_is_outside_the_fitted_range():
    trend = trends.fit_log_linear([1e5, 1e6], [2.0, 1.8])
    assert trend.extrapolates([5e4, 1e5, 5e5, 1e6, 2e6]).tolist() == [True, False, False, False, True]


# --------------------------------------------------------------------------- t-intervals over seeds and jackknife


def seed_frame(values: dict) -> pd.DataFrame:
    return pd.DataFrame([{"seed": s, "v": v} for s, v in values.items()])


def test_the_seed_intervals_leave_out_resamples_that_are_not_finite():
    """A resample with an infinite statistic (here a range of 0) is left out of the SD, as NaN is."""
    points = pd.DataFrame({"seed": [0, 1, 2], "y": [1.0, 2.0, 4.0]})
    with np.errstate(divide="ignore"):
        row = trends.seed_t_intervals(points, lambda p: pd.Series({"r": 1 / (p["y"].max() - p["y"].min())})).loc["r"]
    draws, _ = trends.seed_draws([0, 1, 2])
    y = points["y"].to_numpy()
    finite = [1 / np.ptp(y[list(d)]) for d in draws if np.ptp(y[list(d)]) > 0]
    assert row["sd_boot"] == pytest.approx(np.std(finite)) and math.isfinite(row["ci_low"])


def test_the_seed_interval_of_a_mean_is_the_t_interval():
    points = seed_frame({0: 1.70, 1: 1.74, 2: 1.69})
    boot = trends.seed_t_intervals(points, lambda p: pd.Series({"mean": p["v"].mean()}))
    row, ref = boot.loc["mean"], stats.mean_ci(points["v"])
    assert bool(row["exact"]) and row["n_boot"] == 27  # all 3**3 draws
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ref["ci_low"], ref["ci_high"]), rel=1e-12)


def test_draws_are_random_beyond_n_boot_and_reproducible():
    draws, exact = trends.seed_draws(range(6), n_boot=500, rng=1)
    assert not exact and len(draws) == 500 and draws == trends.seed_draws(range(6), n_boot=500, rng=1)[0]


def test_jackknife_pseudo_values_of_a_least_squares_read_off_are_each_seeds_own():
    rng = np.random.default_rng(5)
    x = np.array([1e5, 2e5, 4e5, 8e5])
    points = pd.DataFrame([{"seed": s, "x": xi, "y": 2.8 - 0.1 * np.log(xi) + rng.normal(0, 0.02)}
                           for s in range(4) for xi in x])

    def read_off(p):
        return pd.Series({"at 3e5": float(trends.fit_log_linear(p["x"], p["y"])(3e5))})

    pseudo = trends.jackknife(points, read_off)["at 3e5"]
    own = [read_off(points[points["seed"] == s])["at 3e5"] for s in range(4)]
    assert pseudo.to_numpy() == pytest.approx(own, rel=1e-10)


def synthetic_arm(rng, n_seeds, x, truth, noise=0.02, seed_sd=0.02):
    """Points of one arm: truth(x) + a seed's offset (shared by its widths) + noise."""
    offsets = rng.normal(0, seed_sd, n_seeds)
    return pd.DataFrame([{"seed": s, "x": xi, "y": truth(xi) + offsets[s] + rng.normal(0, noise)}
                         for s in range(n_seeds) for xi in x])


@pytest.mark.parametrize("form, truth, reps, lo, hi", [
    # linear in the seeds' values: the t interval, so its coverage is exact
    (trends.LOG_LINEAR, lambda x: 2.8 - 0.1 * np.log(x), 400, 0.92, 0.98),
    # a refitted power law: close to nominal
    (trends.POWER_LAW, lambda x: power(x, 1.4, 40.0, 0.3), 150, 0.88, 0.99),
])
def test_the_seed_t_interval_covers_the_truth_at_about_its_nominal_rate(form, truth, reps, lo, hi):
    rng = np.random.default_rng(11)
    x, at = np.array([2e5, 4.5e5, 8e5, 1.8e6]), 6e5  # read off between the sizes, as notebook 07 does

    def read_off(p):
        return pd.Series({"y": float(trends.fit_form(p["x"], p["y"], form)(at))})

    covered = 0
    for _ in range(reps):
        points = synthetic_arm(rng, 3, x, truth, noise=0.01, seed_sd=0.01)
        row = trends.seed_t_intervals(points, read_off).loc["y"]
        covered += row["ci_low"] <= truth(at) <= row["ci_high"]
    assert lo <= covered / reps <= hi


# --------------------------------------------------------------------------- iso read-offs


def sweep_points(arms: dict, widths=(64, 96, 128, 192), seeds=(0, 1, 2), noise=0.0, rng=None) -> pd.DataFrame:
    """A sweep's table with_cells: arm -> (params at width w, test loss at params P)."""
    rows = []
    for arm, (params_of, loss_of) in arms.items():
        for w in widths:
            P = params_of(w)
            for s in seeds:
                eps = rng.normal(0, noise) if noise else 0.0
                rows.append({"cell": scaling.cell_name(arm, w), "arm": arm, "width": w, "seed": s, "lr": 1e-3,
                             "params_non_embedding": int(P), "train_flops": 6.0 * P * 1e6,
                             "val_loss": 0.0, "test_loss": loss_of(P) + 0.01 * s + eps, "ms_per_step": 1.0})
    return pd.DataFrame(rows)


def test_the_iso_read_off_interpolates_a_synthetic_arm_and_marks_extrapolations():
    gpt = (lambda w: 50 * w * w, lambda P: 3.0 - 0.1 * np.log(P))
    wide = (lambda w: 100 * w * w, lambda P: 2.9 - 0.1 * np.log(P))  # 2x gpt's parameters at a width
    points = sweep_points({"gpt": gpt, "wide": wide}, noise=1e-4, rng=np.random.default_rng(0))
    result = scaling.analyse(points, reference="gpt", n_boot=200)
    iso = result.iso[(result.iso["arm"] == "wide") & (result.iso["axis"] == "non-embedding parameters")]
    for _, row in iso.iterrows():
        P = 50 * row["width"] ** 2
        assert row["loss"] == pytest.approx(2.9 - 0.1 * np.log(P) + 0.01, abs=1e-3)  # + the mean seed offset
        assert row["diff"] == pytest.approx(-0.1, abs=1e-3)
        # wide's smallest model has 100 * 64^2 parameters: gpt's at d=64 (50 * 64^2) lies below it
        assert row["extrapolated"] == (row["width"] == 64)
    tested = result.tests[(result.tests["axis"] == "params")]
    assert sorted(tested["width"]) == [96, 128, 192]
    assert set(iso.loc[iso["extrapolated"], "verdict"]) == {"extrapolated: not tested"}


def test_a_tie_is_claimed_only_by_tost_within_the_margin():
    gpt = (lambda w: 50 * w * w, lambda P: 3.0 - 0.1 * np.log(P))
    same = (lambda w: 50 * w * w, lambda P: 3.0005 - 0.1 * np.log(P))
    rng = np.random.default_rng(2)
    points = sweep_points({"gpt": gpt, "same": same}, seeds=range(6), noise=0.002, rng=rng)
    verdicts = set(scaling.analyse(points, equivalence_margin=0.02, n_boot=200).tests["verdict"])
    assert verdicts == {"equivalent (±0.02)"}
    noisy = sweep_points({"gpt": gpt, "same": same}, seeds=range(3), noise=0.03, rng=rng)
    assert set(scaling.analyse(noisy, equivalence_margin=0.02, n_boot=200).tests["verdict"]) == {
        "not resolved at 3 seeds"}


# --------------------------------------------------------------------------- slopes, paired by seed


def slope_sweep(rng, seeds=range(3)):
    """gpt falls 0.03 per unit of ln P; "steep" falls 0.08 (per doubling: 0.03 ln 2 and 0.08 ln 2);
    "flat" as gpt. Each seed has its own slope jitter (so the per-seed slopes differ) and noise."""
    truth = {"gpt": 0.03, "steep": 0.08, "flat": 0.03}
    jitter = {(arm, s): rng.normal(0, 0.004) for arm in truth for s in seeds}
    rows = []
    for arm, b in truth.items():
        for w in (64, 96, 128, 192):
            P = 50 * w * w
            for s in seeds:
                loss = 3.0 - (b + jitter[(arm, s)]) * np.log(P) + rng.normal(0, 0.002)
                rows.append({"cell": scaling.cell_name(arm, w), "arm": arm, "width": w, "seed": s, "lr": 1e-3,
                             "params_non_embedding": P, "train_flops": 6.0 * P * 1e6, "val_loss": loss,
                             "test_loss": loss, "ms_per_step": 1.0})
    return pd.DataFrame(rows), truth


def test_the_slope_tests_are_scipys_paired_t_on_each_seeds_own_fit_with_holm():
    from scipy import stats as sp

    points, truth = slope_sweep(np.random.default_rng(4), seeds=range(5))
    fitted = scaling.fit_trends(points)
    tests = scaling.slope_tests(points, fitted, "gpt").set_index(["axis", "arm"])
    assert sorted(tests.index) == sorted((a, arm) for a in scaling.AXES for arm in ("steep", "flat"))

    def own_slopes(arm, col):
        g = points[points["arm"] == arm]
        return np.array([np.polyfit(np.log(s[col]), s["test_loss"], 1)[0] * math.log(2)
                         for _, s in g.groupby("seed")])

    raw = {}
    for axis, (col, _) in scaling.AXES.items():
        for arm in ("steep", "flat"):
            a, b = own_slopes(arm, col), own_slopes("gpt", col)
            ref = sp.ttest_rel(a, b)
            row = tests.loc[(axis, arm)]
            assert row["mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-9)
            assert row["p_t"] == pytest.approx(ref.pvalue, rel=1e-9)
            ci = ref.confidence_interval(0.95)
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
            assert row["slope"] == pytest.approx(a.mean()) and row["reference_slope"] == pytest.approx(b.mean())
            raw[(axis, arm)] = ref.pvalue
    # Holm over the 4 tests together (both axes): scaled by 4, 3, 2, 1 in order of p, kept monotone
    order = sorted(raw, key=raw.get)
    running = 0.0
    for k, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * raw[key]))
        assert tests.loc[key, "p_t_holm"] == pytest.approx(running, rel=1e-9)
    # the known truth: steep falls (0.08 - 0.03) ln 2 faster per doubling, flat as gpt
    assert tests.loc[("params", "steep"), "mean_diff"] == pytest.approx(-0.05 * math.log(2), abs=0.005)
    assert tests.loc[("params", "steep"), "verdict"] == "better"
    assert tests.loc[("params", "flat"), "verdict"] == "no significant difference"


def test_the_slope_of_a_log_linear_trend_is_the_mean_of_the_per_seed_fits_with_the_fits_interval():
    """With every run present, the per-seed slopes' mean and t-interval are the fits table's."""
    points, _ = slope_sweep(np.random.default_rng(6))
    result = scaling.analyse(points, reference="gpt", n_boot=200)
    tests = scaling.slope_tests(points, result.trends, "gpt").set_index(["axis", "arm"])
    fits = result.fits.set_index(["axis", "arm"])
    for axis, (_, label) in scaling.AXES.items():
        fit = fits.loc[(label, "steep")]
        row = tests.loc[(axis, "steep")]
        assert (row["slope"], row["slope_ci_low"], row["slope_ci_high"]) == pytest.approx(
            (fit["slope_per_doubling"], fit["slope_per_doubling_ci_low"], fit["slope_per_doubling_ci_high"]),
            rel=1e-9)


def test_slope_tests_with_and_without_leave_out_the_flagged_run_only_in_the_second():
    from nodelm_lib.experiments import divergence

    points, _ = slope_sweep(np.random.default_rng(7))
    bad = (points["cell"] == "steep d=96") & (points["seed"] == 0)
    points.loc[bad, ["val_loss", "test_loss"]] += 0.5
    flags = divergence.diverged(points, divergence.DivergenceRule("bigram", seed_margin=0.1), {"bigram": 9.0}, group="cell")
    assert flags.to_numpy().tolist() == bad.to_numpy().tolist()
    both = scaling.slope_tests_with_and_without(points, scaling.fit_trends(points), flags, "gpt")
    assert list(both["runs"].unique()) == ["all", "diverged left out"]
    assert set(both.loc[both["runs"] == "diverged left out", "n_left_out"]) == {1}
    steep = both[(both["arm"] == "steep") & (both["axis"] == "params")].set_index("runs")
    kept = points[~bad & (points["arm"] == "steep") & (points["seed"] == 0)]
    own = np.polyfit(np.log(kept["params_non_embedding"]), kept["test_loss"], 1)[0] * math.log(2)
    others = [np.polyfit(np.log(g["params_non_embedding"]), g["test_loss"], 1)[0] * math.log(2)
              for s, g in points[points["arm"] == "steep"].groupby("seed") if s != 0]
    assert steep.loc["diverged left out", "slope"] == pytest.approx(np.mean([own, *others]), rel=1e-9)
    assert steep.loc["all", "slope"] != pytest.approx(steep.loc["diverged left out", "slope"], abs=1e-3)


# --------------------------------------------------------------------------- notebook 02's runs


def params_02(profile: str = "cpu") -> dict:
    return yaml.safe_load((ROOT / "params" / "02_seed_comparison" / f"{profile}.yaml").read_text())




def test_the_d128_cells_have_the_config_hashes_of_02s_committed_runs():
    p = params_02()
    base = protocol.base_from_params(p)
    arms = ["gpt", "hybrid", "node_tong", "ti_mlp", "ti_ssm", "ssm"]
    cells = scaling.width_cells(base.model, arms, [p["d_model"]])
    centers = scaling.lr_centers(ROOT / "results" / "seed_comparison_cpu_lr_selection.csv", arms)
    runs_02 = pd.read_csv(ROOT / "results" / "seed_comparison_cpu_runs.csv")
    name_02 = {"node_tong": "node"}
    for name, seed, tc in protocol.sweep_configs(base, cells, [0, 1, 2],
                                                 {c: centers[scaling.split_cell(c)[0]] for c in cells}):
        arm = scaling.split_cell(name)[0]
        row = runs_02[(runs_02["arm"] == name_02.get(arm, arm)) & (runs_02["seed"] == seed)].iloc[0]
        assert run_hash(tc) == row["config_hash"], name
        assert (ROOT / "results" / "runs" / "cpu" / f"{row['config_hash']}.json").exists()


def test_reused_02_runs_are_read_not_retrained(tmp_path, monkeypatch):
    store, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    # notebook 02's third cell, at a tiny size: its base config and its arms
    model = nl.ModelConfig(vocab_size=nl.data.get_tokenizer("char").vocab_size, d_model=16, n_heads=4, n_layers=2,
                           max_seq_len=32, ssm_state_size=4, ode=nl.ODEConfig(method="euler", n_steps=2))
    base_02 = nl.TrainConfig(model=model, dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16,
                             max_steps=3, lr=1e-3, warmup_steps=1, min_lr_ratio=0.1, beta2=0.99, eval_interval=3,
                             eval_batches=1, eval_on="batches", device="cpu", dtype="float32", compile=False,
                             progress=False)
    arms_02 = protocol.architecture_arms(model, ["gpt", "node"], controls=["ssm"], presets={"node": "tong"})
    rates = {"gpt": 4e-3, "node": 1e-3, "ssm": 2e-3}
    filled = nl.sweep(base_02, arms_02, [0, 1], lr_selection=rates, store=store, checkpoints=checkpoints,
                      isolate=False, progress=False)

    def no_training(*args, **kwargs):
        raise AssertionError("a stored run was trained again")

    monkeypatch.setattr("nodelm_lib.runs.store.train_into_store", no_training)
    base = protocol.base_config(n_heads=4, n_layers=2, max_seq_len=32, ssm_state_size=4, ode_method="euler",
                                dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16, max_steps=3,
                                warmup_steps=1, min_lr_ratio=0.1, beta2=0.99, eval_interval=3, eval_batches=1,
                                eval_on="batches", device="cpu")
    cells = scaling.width_cells(base.model, ["gpt", "node_tong", "ssm"], [16])
    centers = scaling.lr_centers({"gpt": 4e-3, "node_tong": 1e-3, "ssm": 2e-3}, ["gpt", "node_tong", "ssm"])
    selection = {c: centers[scaling.split_cell(c)[0]] for c in cells}
    assert scaling.stored_runs(base, cells, [0, 1], selection, store)["stored"].all()
    runs = scaling.with_cells(nl.sweep(base, cells, [0, 1], lr_selection=selection, store=store,
                                       checkpoints=checkpoints, isolate=False, progress=False))
    name_02 = {"gpt": "gpt", "node_tong": "node", "ssm": "ssm"}
    for _, row in runs.iterrows():
        old = filled[(filled["arm"] == name_02[row["arm"]]) & (filled["seed"] == row["seed"])].iloc[0]
        assert row["config_hash"] == old["config_hash"] and row["test_loss"] == old["test_loss"]


def test_grids_are_02s_rates_to_the_bit():
    grids = scaling.lr_grids({"gpt": 4e-3, "node": 1e-3}, ["gpt d=64", "node d=128"], [0.5, 1, 2])
    assert grids == {"gpt d=64": [2e-3, 4e-3, 8e-3], "node d=128": [5e-4, 1e-3, 2e-3]}


# --------------------------------------------------------------------------- time


def test_time_estimate_packs_each_phase_on_its_lanes_and_resolves_auto_workers(tmp_path, monkeypatch):
    base = protocol.base_config(n_heads=4, n_layers=2, max_seq_len=32, ssm_state_size=4, ode_method="euler",
                                dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16, max_steps=10,
                                warmup_steps=1, min_lr_ratio=0.1, beta2=0.99, eval_interval=5, eval_batches=1,
                                eval_on="batches", device="cpu")
    gpt = nl.config.with_values(base, scaling.width_cells(base.model, ["gpt"], [16])["gpt d=16"])
    fake_record(gpt, 0.5).to_json(tmp_path / "gpt.json")  # 10 steps x 0.5 s + 1 s start-up = 6 s a run
    phases = {"a": [("gpt", nl.config.with_values(gpt, {"seed": s})) for s in range(3)],
              "b": [("gpt", nl.config.with_values(gpt, {"seed": 9}))]}
    _, totals = sweep_time.time_estimate(phases, tmp_path, workers=2, startup_s=1.0)
    assert totals["empty_store_s"].tolist() == pytest.approx([12.0, 6.0]) and totals["workers"].tolist() == [2, 2]
    assert "total, 2 run(s) at a time: " in sweep_time.format_time_estimate(totals)
    assert sweep_time.format_time_estimate(totals, with_store=False).splitlines() == [
        "a: 3 runs, 12 s from an empty store", "b: 1 runs, 6 s from an empty store",
        "total, 2 run(s) at a time: 18 s from an empty store"]
    monkeypatch.setattr("os.cpu_count", lambda: 3)  # "auto" on a CPU: one run per core
    _, totals = sweep_time.time_estimate(phases, tmp_path, workers="auto", startup_s=1.0)
    assert totals["empty_store_s"].tolist() == pytest.approx([6.0, 6.0]) and totals["workers"].tolist() == [3, 3]
    assert "total, 3 run(s) at a time: " in sweep_time.format_time_estimate(totals)
    with pytest.raises(ValueError, match=r"workers='many' is not valid; it must be an integer >= 1 or 'auto'"):
        sweep_time.time_estimate(phases, tmp_path, workers="many")


def test_makespan_puts_the_longest_runs_first_on_the_lane_that_frees_first():
    assert sweep_time.makespan([3, 3, 2, 2, 2], workers=2) == 7
    assert sweep_time.makespan([5, 1, 1], workers=1) == 7


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("x, y, match", [
    ([1e5, -1.0], [2.0, 1.9], "finite and > 0"),
    ([1e5, 2e5], [2.0, math.nan], "NaN"),
    ([1e5, 1e5, 1e5], [2.0, 1.9, 1.8], "2 or more distinct x"),
    ([1e5, 2e5], [2.0], "same length"),
])
def test_bad_points_are_refused_with_the_reason(x, y, match):
    with pytest.raises(ValueError, match=match):
        trends.fit_trend(x, y)


def test_bad_sweep_inputs_are_refused_with_the_reason(tmp_path):
    model = nl.ModelConfig(vocab_size=256, d_model=16, n_heads=4, n_layers=2)
    with pytest.raises(ValueError, match="arm 'mamba' is not valid"):
        scaling.width_cells(model, ["gpt", "mamba"], [16])
    with pytest.raises(ValueError, match="subset of widths"):
        scaling.width_cells(model, ["gpt"], [16], arm_widths={"gpt": [24]})
    with pytest.raises(ValueError, match=r"centre the grid of arm\(s\) \['ssm'\]"):
        scaling.lr_centers({"gpt": 1e-3}, ["gpt", "ssm"])
    with pytest.raises(FileNotFoundError, match="run notebook 02"):
        scaling.lr_centers(tmp_path / "missing.csv", ["gpt"])
    with pytest.raises(ValueError, match="lr_factors"):
        scaling.lr_grids({"gpt": 1e-3}, ["gpt d=16"], [0.0, 1.0])
    with pytest.raises(ValueError, match="not a cell name"):
        scaling.split_cell("gpt-16")
    with pytest.raises(ValueError, match="at least 2 seeds"):
        trends.seed_draws([0])
    points = sweep_points({"gpt": (lambda w: 50 * w * w, lambda P: 3.0 - 0.1 * np.log(P))})
    with pytest.raises(ValueError, match="equivalence_margin"):
        scaling.analyse(points, equivalence_margin=0)
    with pytest.raises(ValueError, match="reference arm 'hybrid' has no runs"):
        scaling.analyse(points, reference="hybrid")
