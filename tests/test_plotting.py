"""Figure helpers: labels must not overlap; curves, paired differences and reference lines
draw what they say; saving a figure writes no warnings."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nodelm_lib.plotting import LABEL_PLACES, label_points  # noqa: E402


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

    from nodelm_lib.plotting import save_figure

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

    from nodelm_lib.plotting import plot_curves

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

    from nodelm_lib.plotting import plot_curves

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

    from nodelm_lib.plotting import plot_paired_differences
    from nodelm_lib.stats import mean_ci

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
    from nodelm_lib.plotting import plot_paired_differences

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
    from nodelm_lib.plotting import plot_reference_lines

    fig, ax = plt.subplots()
    ax.set_ylim(1.8, 2.2)
    texts = plot_reference_lines(ax, {"bigram": 2.47, "trigram": 2.01, "unigram": 1.5})
    assert [t.get_text() for t in texts] == ["trigram"]
    assert [tuple(line.get_ydata()) for line in ax.get_lines()] == [(2.01, 2.01)]
    assert ax.get_ylim() == (1.8, 2.2)
    plt.close(fig)


def test_labels_of_nearby_reference_lines_do_not_overlap():
    from nodelm_lib.plotting import plot_reference_lines

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


def test_zoom_to_late_leaves_out_the_early_loss():
    from nodelm_lib.plotting import plot_curves, zoom_to_late

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

    from nodelm_lib.plotting import plot_arm_metric, plot_efficiency

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
