"""Figure helpers: labels must not overlap; curves, paired differences and reference lines
draw what they say; saving a figure writes no warnings."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nodelm_lib.reporting.style import LABEL_PLACES, label_points  # noqa: E402


def boxes(fig, texts):
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts]


def test_labels_of_coinciding_points_take_different_sides():
    fig, ax = plt.subplots()
    ax.plot([0, 10], [0, 10], "o")
    # four arms on almost the same spot (like node and ti_mlp on the FLOPs axis), one far away
    texts = label_points(ax, [5, 5.01, 5.02, 4.99, 9], [5, 5, 5.01, 5.0, 1], ["ti_mlp", "node", "a", "b", "far"])
    placed = boxes(fig, texts)
    for i in range(len(placed)):
        for j in range(i):
            assert not placed[i].overlaps(placed[j]), (texts[i].get_text(), texts[j].get_text())
    assert [t.xyann for t in texts[:4]] == [place[0] for place in LABEL_PLACES]
    assert texts[4].xyann == LABEL_PLACES[0][0]  # nothing near it: the usual upper right
    plt.close(fig)


def test_a_fifth_label_on_a_crowded_spot_still_gets_written():
    fig, ax = plt.subplots()
    texts = label_points(ax, [1.0] * 5, [1.0] * 5, list("abcde"))
    assert [t.get_text() for t in texts] == list("abcde")
    assert all(t.axes is ax for t in texts)
    plt.close(fig)


def test_save_figure_is_silent_about_a_slow_best_legend(tmp_path, monkeypatch):
    """matplotlib warns when a loc="best" legend took over a second to place, which on a busy
    machine happens by turns; nbval then fails on the unexpected stderr. Fake a clock that
    advances 2 s per reading, check matplotlib does warn, and that save_figure does not."""
    import itertools
    import types
    import warnings

    import matplotlib.legend

    from nodelm_lib.reporting.style import save_figure

    ticks = itertools.count(step=2.0)
    # only legend.py's view of the clock: pytest's own timing keeps the real one
    monkeypatch.setattr(matplotlib.legend, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))

    def figure():
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1], label="line")
        ax.legend()
        return fig

    with warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        figure().savefig(tmp_path / "plain.png")
    assert any("can be slow" in str(w.message) for w in plain)

    with warnings.catch_warnings(record=True) as saved:
        warnings.simplefilter("always")
        paths = save_figure(figure(), tmp_path / "saved")
    assert [str(w.message) for w in saved] == []
    assert all(p.stat().st_size > 0 for p in paths)
    plt.close("all")


# --------------------------------------------------------------------------- multi-seed curves


def synthetic_curves(arms=("gpt", "node"), seeds=(0, 1, 2), steps=(0, 100, 200, 300), offset=0.1, noise_sd=0.3):
    """Loss that falls from ~5.5 to ~2; arm i is ``i * offset`` above the first arm for every
    seed; each seed has its own noise (shared by all arms, so it cancels in pairs) and its
    own wall time per step (the slower seed is slower in every arm)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    noise = {seed: rng.normal(0.0, noise_sd, len(steps)) for seed in seeds}
    rows = []
    for i, arm in enumerate(arms):
        for seed in seeds:
            for j, step in enumerate(steps):
                loss = 2.0 + 3.5 * np.exp(-step / 60) + noise[seed][j] + i * offset
                time = step * (1.0 + 0.1 * seed + 0.5 * i)
                rows.append({"arm": arm, "seed": seed, "step": step, "train_time_s": time, "val_loss": loss})
    return pd.DataFrame(rows)


def test_curves_at_step_over_wall_time_draw_the_mean_time_per_step():
    import numpy as np

    from nodelm_lib.reporting.plotting import plot_curves

    curves = synthetic_curves()
    fig, ax = plt.subplots()
    plot_curves(ax, curves, x="train_time_s", at="step")
    assert [line.get_label() for line in ax.lines] == ["gpt", "node"]
    for line, arm in zip(ax.lines, ["gpt", "node"]):
        per_step = curves[curves["arm"] == arm].groupby("step")
        np.testing.assert_allclose(line.get_xdata(), per_step["train_time_s"].mean().to_numpy())
        np.testing.assert_allclose(line.get_ydata(), per_step["val_loss"].mean().to_numpy())
    assert len(ax.lines[0].get_xdata()) == 4  # one point per step, not one per (seed, time)
    assert ax.get_legend().get_title().get_text() == "mean ± 95% CI"
    plt.close(fig)


def test_curves_over_step_are_unchanged_and_name_the_band():
    import numpy as np

    from nodelm_lib.reporting.plotting import plot_curves

    curves = synthetic_curves()
    fig, ax = plt.subplots()
    plot_curves(ax, curves, band="range", order=["node", "gpt"])
    node = curves[curves["arm"] == "node"].groupby("step")["val_loss"]
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [0, 100, 200, 300])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), node.mean().to_numpy())
    band = ax.collections[0].get_paths()[0].vertices[:, 1]  # fill_between's polygon: the range
    assert np.isclose(band.max(), node.max().max()) and np.isclose(band.min(), node.min().min())
    assert ax.get_legend().get_title().get_text() == "mean, range over seeds"
    plt.close(fig)


def test_paired_differences_cancel_the_shared_seed_noise():
    import numpy as np

    from nodelm_lib.reporting.plotting import plot_paired_differences
    from nodelm_lib.reporting.stats import mean_ci

    curves = synthetic_curves()
    fig, ax = plt.subplots()
    diffs = plot_paired_differences(ax, curves, reference="gpt")
    assert list(diffs.columns) == ["arm", "seed", "step", "diff"]
    assert set(diffs["arm"]) == {"node"} and len(diffs) == 3 * 4
    np.testing.assert_allclose(diffs["diff"], 0.1)
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), 0.1)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() - band.min() < 1e-9  # paired: the CI half-width is ~0
    # an unpaired CI at the same step is wide: the seed noise does not cancel
    step = curves[curves["step"] == 300]
    unpaired = mean_ci(step.loc[step["arm"] == "node", "val_loss"])["ci_half"]
    assert unpaired > 0.1
    assert any(np.allclose(other.get_ydata(), 0.0) for other in ax.get_lines()[1:])  # the line at 0
    assert ax.get_legend().get_title().get_text() == "Δ vs gpt, mean ± 95% CI (paired by seed)"
    plt.close(fig)


def test_paired_differences_leave_out_seeds_missing_in_the_reference():
    from nodelm_lib.reporting.plotting import plot_paired_differences

    curves = synthetic_curves(arms=("gpt", "node", "ti_mlp"), seeds=(0, 1, 2, 3))
    curves = curves[~((curves["arm"] == "gpt") & (curves["seed"] == 3))]
    curves = curves[~((curves["arm"] == "gpt") & (curves["seed"] == 1) & (curves["step"] == 200))]
    fig, ax = plt.subplots()
    diffs = plot_paired_differences(ax, curves, reference="gpt", x="train_time_s")
    assert list(diffs.columns) == ["arm", "seed", "step", "train_time_s", "diff"]
    assert 3 not in set(diffs["seed"])
    assert len(diffs[(diffs["seed"] == 1) & (diffs["step"] == 200)]) == 0
    assert len(diffs) == 2 * (3 * 4 - 1)
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["node", "ti_mlp"]
    plt.close(fig)


def test_reference_lines_outside_the_limits_are_left_out():
    from nodelm_lib.reporting.plotting import plot_reference_lines

    fig, ax = plt.subplots()
    ax.set_ylim(1.8, 2.2)
    texts = plot_reference_lines(ax, {"bigram": 2.47, "trigram": 2.01, "unigram": 1.5})
    assert [t.get_text() for t in texts] == ["trigram"]
    assert [tuple(line.get_ydata()) for line in ax.get_lines()] == [(2.01, 2.01)]
    assert ax.get_ylim() == (1.8, 2.2)
    plt.close(fig)


def test_labels_of_nearby_reference_lines_do_not_overlap():
    from nodelm_lib.reporting.plotting import plot_reference_lines

    fig, ax = plt.subplots()
    ax.set_ylim(1.0, 3.0)
    refs = {"trigram": 2.010, "nanoGPT 2.011": 2.011, "bigram": 2.47, "top": 2.999}
    texts = plot_reference_lines(ax, refs)
    assert [t.get_text() for t in texts] == ["trigram", "nanoGPT 2.011", "bigram", "top"]
    placed = boxes(fig, texts)
    for i in range(len(placed)):
        for j in range(i):
            assert not placed[i].overlaps(placed[j]), (texts[i].get_text(), texts[j].get_text())
    axes_box = ax.get_window_extent(fig.canvas.get_renderer())
    assert all(axes_box.y0 <= b.y0 and b.y1 <= axes_box.y1 + 0.5 for b in placed)  # inside the axes
    plt.close(fig)


def test_a_reference_label_moves_left_off_the_data_it_would_hide():
    from nodelm_lib.reporting.plotting import plot_reference_lines

    fig, ax = plt.subplots(figsize=(3, 3))
    ax.errorbar([0, 1, 2, 3], [1.0, 1.05, 1.88, 1.1], yerr=0.02, fmt="o")  # the last arms sit on the line
    ax.scatter([2.9, 3.0, 3.1], [1.88, 1.885, 1.875])
    ax.set_xlim(-0.5, 3.5)
    ax.set_ylim(0.9, 2.0)
    fig.tight_layout()
    (text,) = plot_reference_lines(ax, {"a long reference label": 1.88})
    assert text.get_horizontalalignment() == "left" and text.xy[0] < 0.5
    label = text.get_window_extent(fig.canvas.get_renderer())
    points = ax.transData.transform([(2, 1.88), (3, 1.88)])
    assert not any(label.contains(*p) for p in points)
    plt.close(fig)


def test_a_reference_label_stays_right_where_nothing_is_hidden():
    from nodelm_lib.reporting.plotting import plot_reference_lines

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1.0, 1.1], "o")
    ax.set_ylim(0.9, 2.0)
    (text,) = plot_reference_lines(ax, {"bigram": 1.8})
    assert text.get_horizontalalignment() == "right" and text.xy[0] > 0.5
    plt.close(fig)


def test_zoom_to_late_leaves_out_the_early_loss():
    from nodelm_lib.reporting.plotting import plot_curves, zoom_to_late

    curves = synthetic_curves(steps=tuple(range(0, 1001, 50)), noise_sd=0.02)
    fig, ax = plt.subplots()
    plot_curves(ax, curves)
    lo, hi = zoom_to_late(ax, curves, x_from_fraction=0.25, references={"bigram": 2.47})
    assert ax.get_ylim() == (lo, hi)
    assert hi < 3.0 < 5.0 < curves["val_loss"].max()  # the early ~5.5 is out of view
    late_means = curves[curves["step"] >= 250].groupby(["arm", "step"])["val_loss"].mean()
    assert lo < late_means.min() and late_means.max() < hi  # the late mean curves stay in view
    assert hi > 2.47  # and so does the reference line
    for line in ax.lines:  # the CI bands after the first quarter too
        band = ax.collections[ax.lines.index(line)].get_paths()[0].vertices
        late_band = band[band[:, 0] >= 250, 1]
        assert lo <= late_band.min() and late_band.max() <= hi
    # without the reference, the top follows the curves (whose late values are below 2.4)
    assert zoom_to_late(ax, curves)[1] < 2.47
    plt.close(fig)


def test_arm_metric_and_efficiency_draw_references():
    import pandas as pd

    from nodelm_lib.reporting.plotting import plot_arm_metric, plot_efficiency

    runs = pd.DataFrame({"arm": ["gpt", "gpt", "node", "node"], "seed": [0, 1, 0, 1],
                         "test_loss": [2.00, 2.04, 1.95, 1.99], "params": [1e6, 1e6, 2e5, 2e5]})
    refs = {"trigram": 2.01, "bigram": 2.47}
    fig, axes = plt.subplots(1, 2)
    plot_arm_metric(axes[0], runs, "test_loss", references=refs)
    plot_efficiency(axes[1], runs, "params", "test_loss", references=refs)
    for ax in axes:
        assert [t.get_text() for t in ax.texts if t.get_text() in refs] == ["trigram"]
    renderer = fig.canvas.get_renderer()
    texts = axes[1].texts
    for i in range(len(texts)):
        for j in range(i):
            assert not texts[i].get_window_extent(renderer).overlaps(texts[j].get_window_extent(renderer))
    plt.close(fig)


# --------------------------------------------------------------------------- notebooks 03 and 06


def ablation_runs():
    """steps_solver arms over two seeds: test loss 2 + steps / 10 (+0.1 for rk4), seed 1 0.02 above
    seed 0; ms per step 10 x steps (x4 for rk4)."""
    import pandas as pd

    rows = [{"arm": f"{solver} {n}", "seed": s, "test_loss": 2 + n / 10 + (0.1 if solver == "rk4" else 0) + 0.02 * s,
             "ms_per_step": 10.0 * n * (4 if solver == "rk4" else 1)}
            for solver in ("euler", "rk4") for n in (1, 2, 4) for s in (0, 1)]
    return pd.DataFrame(rows)


def test_steps_solver_figure_draws_loss_against_steps_and_nfe_and_time_per_solver(tmp_path):
    import numpy as np

    from nodelm_lib.reporting.figures import steps_solver_figure
    from nodelm_lib.reporting.style import save_figure

    fig = steps_solver_figure(ablation_runs(), ["euler", "rk4"], title="ablation: x")
    steps_ax, nfe_ax, time_ax = fig.axes
    assert fig._suptitle.get_text() == "ablation: x"
    assert [t.get_text() for t in steps_ax.get_legend().get_texts()] == ["euler", "rk4"]
    assert steps_ax.get_legend().get_title().get_text() == "mean ± 95% CI over seeds (t)"
    assert nfe_ax.get_xlabel() == time_ax.get_xlabel() == "field evaluations per forward (NFE)"
    assert {ax.get_xscale() for ax in fig.axes} == {"log"}
    euler, rk4 = (bars.lines[0] for bars in steps_ax.containers)  # the data lines of the two error bars
    assert list(euler.get_xdata()) == [1, 2, 4]
    np.testing.assert_allclose(np.asarray(euler.get_ydata(), float), [2.11, 2.21, 2.41])  # mean of the two seeds
    np.testing.assert_allclose(np.asarray(rk4.get_ydata(), float), [2.21, 2.31, 2.51])
    assert list(nfe_ax.containers[1].lines[0].get_xdata()) == [4, 8, 16]  # rk4: 4 stages per step
    # the 95% t-interval of two seeds 0.02 apart: t_{0.975,1} * 0.01 * sqrt(2) / sqrt(2)
    (caps_low, caps_high) = steps_ax.containers[0].lines[1][:2]
    np.testing.assert_allclose(caps_high.get_ydata()[0] - 2.11, 12.706205 * 0.01, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(time_ax.containers[1].lines[0].get_ydata(), float), [40, 80, 160])
    paths = save_figure(fig, tmp_path / "ablation_steps_solver")
    assert [p.name for p in paths] == ["ablation_steps_solver.png", "ablation_steps_solver.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)
    plt.close(fig)


def test_steps_solver_arms_must_name_solver_and_steps():
    import pytest

    from nodelm_lib.reporting.figures import nfe_per_forward, steps_solver_arm, steps_solver_figure

    assert steps_solver_arm("rk4 16") == ("rk4", 16)
    assert nfe_per_forward("rk4", 16) == 64 and nfe_per_forward("euler", 3) == 3
    with pytest.raises(ValueError, match="'dopri5'"):
        nfe_per_forward("dopri5", 2)
    runs = ablation_runs().replace({"arm": {"euler 1": "time"}})
    with pytest.raises(ValueError, match=r"'<solver> <steps>', e.g. 'euler 4'; got 'time'"):
        steps_solver_figure(runs, ["euler"])
    plt.close("all")


def test_ablation_differences_figure_draws_each_paired_difference_with_its_interval():
    import numpy as np
    import pandas as pd

    from nodelm_lib.reporting import comparisons
    from nodelm_lib.reporting.figures import ablation_differences_figure

    runs = pd.DataFrame({"arm": ["time"] * 3 + ["constant"] * 3, "seed": [0, 1, 2] * 2,
                         "test_loss": [2.0, 2.1, 2.2, 2.1, 2.25, 2.3]})
    tests = {"modulation": comparisons.compare_arms(runs, "test_loss", "time")}
    fig = ablation_differences_figure(tests, title="t")
    (ax,) = fig.axes
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["modulation: constant − time"]
    (bars,) = ax.containers
    np.testing.assert_allclose(np.asarray(bars.lines[0].get_xdata(), float), [tests["modulation"]["mean_diff"].iloc[0]])
    low, high = (float(np.asarray(line.get_xdata(), float)[0]) for line in bars.lines[1][:2])
    assert (low, high) == pytest_approx((tests["modulation"]["ci_low"].iloc[0], tests["modulation"]["ci_high"].iloc[0]))
    assert any(np.asarray(line.get_xdata(), float)[0] == 0.0 for line in ax.lines)  # the zero line
    plt.close(fig)


def pytest_approx(values):
    import pytest

    return pytest.approx(values)


def test_depth_curve_figure_has_a_panel_per_solver_and_a_line_per_trained_arm():
    import numpy as np
    import pandas as pd

    from nodelm_lib.reporting.figures import depth_curve_figure, depth_curve_means

    rows = [{"arm": arm, "seed": s, "method": method, "n_steps": n, "nfe": n * (4 if method == "rk4" else 1),
             "trained_method": arm.split()[0], "trained_steps": 2,
             "val_loss": 2.0 + 0.1 * n + (0.5 if method == "rk4" else 0) + (0.2 if arm == "rk4 2" else 0) + 0.01 * s}
            for arm in ("euler 2", "rk4 2") for s in (0, 1) for method in ("euler", "rk4") for n in (1, 2, 4)]
    depth = pd.DataFrame(rows)
    mean = depth_curve_means(depth)
    assert len(mean) == 12 and list(mean.columns) == ["arm", "method", "n_steps", "nfe", "val_loss"]
    fig = depth_curve_figure(depth, ["euler", "rk4"], ["euler 2", "rk4 2"])
    assert [ax.get_title() for ax in fig.axes] == ["evaluated with euler", "evaluated with rk4"]
    for ax in fig.axes:
        assert len(ax.containers) == 2 and ax.get_xscale() == "log"
    rk4_panel = fig.axes[1]
    assert list(rk4_panel.containers[0].lines[0].get_xdata()) == [4, 8, 16]  # NFE: 4 stages per step
    np.testing.assert_allclose(np.asarray(rk4_panel.containers[1].lines[0].get_ydata(), float),
                               [2.805, 2.905, 3.105])  # trained rk4 2, seed mean
    # one ring per panel: euler 2's on the euler panel, rk4 2's on the rk4 panel, at NFE 2 and 8
    rings = [[(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines if line.get_markersize() == 11]
             for ax in fig.axes]
    assert rings == [[(2, pytest_approx(2.205))], [(8, pytest_approx(2.905))]]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["trained euler 2", "trained rk4 2"]
    assert fig.axes[0].get_ylabel() == "validation loss (nats/token)\nmean ± 95% CI over seeds (t)"
    # the y axis shows 0.5 nats above the lowest mean; the rk4-evaluated means above it are triangles on the
    # top edge (at NFE 8 and 16 for euler 2, 4 to 16 for rk4 2), not value labels that run into one another
    top = fig.axes[0].get_ylim()[1]
    assert top == pytest_approx(2.105 + 0.5)
    edge = [line for ax in fig.axes for line in ax.lines if line.get_marker() == "^"]
    assert all(np.allclose(line.get_ydata(), top) for line in edge)
    assert {4, 8, 16} <= {int(x) for line in edge if line.axes is fig.axes[1] for x in line.get_xdata()}
    assert not [t for ax in fig.axes for t in ax.texts if t.get_text()[:1].isdigit()]
    assert any("top edge" in t.get_text() for t in fig.axes[1].texts)
    plt.close(fig)


def test_depth_transfer_figure_has_a_panel_per_arch_and_a_star_at_the_trained_depth():
    import pandas as pd

    from nodelm_lib.reporting.figures import depth_transfer_figure

    rows = [{"arm": arch, "to_steps": m, "variant": v, "n": 3, "mean": 2.0 + 0.1 * i, "ci_low": 1.9 + 0.1 * i,
             "ci_high": 2.1 + 0.1 * i}
            for arch in ("node", "ti_mlp") for m in (2, 8)
            for i, v in enumerate(["evaluated", "finetuned", "scratch_short", "scratch_full"])]
    rows += [{"arm": arch, "to_steps": 4, "variant": "trained", "n": 3, "mean": 1.8, "ci_low": 1.7, "ci_high": 1.9}
             for arch in ("node", "ti_mlp")]
    fig = depth_transfer_figure(pd.DataFrame(rows), title="x")
    assert [ax.get_title() for ax in fig.axes] == ["node", "ti_mlp"]
    node = fig.axes[0]
    assert len(node.containers) == 5
    star = node.containers[-1].lines[0]
    assert star.get_marker() == "*" and list(star.get_xdata()) == [4] and list(star.get_ydata()) == [1.8]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "evaluated at m, no training", "fine-tuned at m (short budget)", "from scratch at m (short budget)",
        "from scratch at m (full budget)", "trained at n (n steps)"]
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    assert fig.axes[0].get_ylabel().startswith("test loss (nats/token)")
    plt.close(fig)


def test_depth_transfer_figure_names_an_untrained_variant_below_the_panel_not_over_its_points():
    import pandas as pd

    from nodelm_lib.reporting.figures import depth_transfer_figure

    rows = [{"arm": "node", "to_steps": m, "variant": v, "n": 3, "mean": mean, "ci_low": mean - 0.01,
             "ci_high": mean + 0.01}
            for m, v, mean in [(2, "evaluated", 2.1), (8, "evaluated", 2.3), (2, "continued", 1.80),
                               (8, "continued", 1.80), (2, "scratch_full", 1.9)]]
    rows.append({"arm": "node", "to_steps": 4, "variant": "trained", "n": 3, "mean": 1.85, "ci_low": 1.84,
                 "ci_high": 1.86})
    fig = depth_transfer_figure(pd.DataFrame(rows))
    ax = fig.axes[0]
    (note,) = [t for t in fig.texts if t.get_text().startswith("not trained")]
    assert "node: from scratch at m (full budget) at m=8" in note.get_text() and note.get_fontsize() >= 8
    fig.canvas.draw()  # axis labels take their places when drawn
    renderer = fig.canvas.get_renderer()
    box, panel = note.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.y1 < panel.y0 and box.y0 >= 0  # below the axes and inside the figure
    assert not box.overlaps(ax.xaxis.label.get_window_extent(renderer))
    assert not box.overlaps(fig.legends[0].get_window_extent(renderer))
    plt.close(fig)


def test_decode_speed_figure_draws_a_pair_of_bars_per_arch(tmp_path):
    import pandas as pd

    from nodelm_lib.reporting.figures import decode_speed_figure
    from nodelm_lib.reporting.style import save_figure

    speed = pd.DataFrame({"arch": ["gpt", "node", "ti_ssm"], "cached_tokens_per_s": [700.0, 500.0, 300.0],
                          "uncached_tokens_per_s": [300.0, 150.0, 90.0]})
    fig = decode_speed_figure(speed, title="greedy decoding")
    (ax,) = fig.axes
    uncached, cached = ax.containers
    assert [b.get_height() for b in uncached] == [300.0, 150.0, 90.0]
    assert [b.get_height() for b in cached] == [700.0, 500.0, 300.0]
    assert all(c.get_x() > u.get_x() for u, c in zip(uncached, cached))  # the cache to the right of each pair
    assert [t.get_text() for t in ax.get_xticklabels()] == ["gpt", "node", "ti_ssm"]
    assert ax.get_yscale() == "log" and ax.get_title() == "greedy decoding"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["recompute the window", "KV cache"]
    assert all(p.exists() for p in save_figure(fig, tmp_path / "generation_speed"))
    plt.close(fig)
