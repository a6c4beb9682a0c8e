"""One palette for every figure: each figure function, drawn from small synthetic tables, uses only
the style's colours (an arm's, a corpus', a series', or a grey), draws each arm in the same colour
wherever it appears, and names every interval it draws "95% CI". A figure function added to the
library without a case here fails ``test_every_figure_function_has_a_case``."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import Collection, PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from nodelm_lib import families  # noqa: E402
from nodelm_lib.analysis import dynamics_figures  # noqa: E402
from nodelm_lib.analysis.depth_trends import depth_trend_test  # noqa: E402
from nodelm_lib.data.sources import CORPORA  # noqa: E402
from nodelm_lib.experiments import scaling  # noqa: E402
from nodelm_lib.reporting import comparisons, compute_figures, figures, plotting, scaling_figures, style, trends  # noqa: E402

ARMS = ["gpt", "gpt_parallel", "gpt_matched", "hybrid", "node", "ti_mlp", "ti_ssm", "ssm"]


# --------------------------------------------------------------------------- synthetic tables


def runs_frame(arms=ARMS, seeds=range(3)) -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "seed": s, "test_loss": 2.0 + 0.02 * i + 0.01 * s, "val_loss": 1.9 + 0.02 * i,
                          "params_non_embedding": 1e5 * (1 + i), "flops_per_token": 1e6 * (1 + i),
                          "git_commit": "abc1234"}
                         for i, a in enumerate(arms) for s in seeds])


def curves_frame(arms=("gpt", "node", "ti_ssm")) -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "seed": s, "step": step, "val_loss": 4.0 / (1 + step / 50) + 0.03 * i + 0.01 * s}
                         for i, a in enumerate(arms) for s in range(3) for step in range(0, 501, 50)])


def corpora_tables() -> dict:
    out = {}
    for corpus, shift in (("tinyshakespeare", 0.0), ("wikitext2", 0.5)):
        runs = runs_frame(["gpt", "node", "ssm"]).assign(test_loss=lambda d, k=shift: d["test_loss"] + k)
        tests = comparisons.holm_family({"vs gpt": comparisons.compare_arms(runs, "test_loss", "gpt")})
        out[corpus] = (runs, tests)
    return out


def ablation_tests() -> dict:
    runs = pd.DataFrame([{"arm": a, "seed": s, "test_loss": 2.0 + 0.05 * i + 0.01 * s * (i + 1)}
                         for i, a in enumerate(["time", "constant"]) for s in range(3)])
    table = comparisons.compare_arms(runs, "test_loss", "time")
    return {"modulation": table, "integration": table.assign(arm="residual")}


def steps_solver_runs() -> pd.DataFrame:
    return pd.DataFrame([{"arm": f"{solver} {n}", "seed": s, "test_loss": 2.2 - 0.05 * np.log2(n) + 0.01 * s,
                          "ms_per_step": 10.0 * n + s}
                         for solver in ("euler", "rk4") for n in (2, 4, 8) for s in range(3)])


def depth_rows() -> pd.DataFrame:
    rows = []
    for arm, (method, trained) in {"euler 2": ("euler", 2), "rk4 2": ("rk4", 2)}.items():
        for evaluated in ("euler", "rk4"):
            for n in (1, 2, 4):
                for s in range(3):  # one step under the trained depth: far above the rest (an off-axis point)
                    loss = 3.5 if n < trained else 1.9 + 0.01 * s
                    rows.append({"arm": arm, "method": evaluated, "n_steps": n, "nfe": n * (4 if evaluated == "rk4" else 1),
                                 "val_loss": loss, "seed": s, "trained_method": method, "trained_steps": trained})
    return pd.DataFrame(rows)


def transfer_summary() -> pd.DataFrame:
    rows = [{"arm": arch, "variant": "trained", "to_steps": 4, "mean": 1.9, "ci_low": 1.85, "ci_high": 1.95}
            for arch in ("node", "ti_mlp")]
    for arch in ("node", "ti_mlp"):
        for variant in ("evaluated", "finetuned", "continued", "scratch_short", "scratch_full"):
            for m in (2, 8):
                if arch == "node" and variant == "scratch_full" and m == 8:
                    continue  # a variant the profile did not train: named in a note
                rows.append({"arm": arch, "variant": variant, "to_steps": m, "mean": 2.0, "ci_low": 1.9, "ci_high": 2.1})
    return pd.DataFrame(rows)


def long_context_curves() -> pd.DataFrame:
    return pd.DataFrame([{"arm": a, "seed": s, "window": 64, "position": p, "loss": 2.0 + 0.1 * i + 0.01 * s}
                         for i, a in enumerate(["gpt", "ti_mlp", "ssm"]) for s in range(3) for p in range(64)])


def scaling_cells(diverged: bool = True):
    rows, fitted = [], {}
    arms = ["gpt", "hybrid", "ti_ssm"]
    for i, arm in enumerate(arms):
        for width in (64, 96, 128):
            ci = 0.6 if (diverged and arm == "hybrid" and width == 96) else 0.02
            rows.append({"arm": arm, "width": width, "seeds": 3, "params_non_embedding": 100 * width ** 2,
                         "train_flops": 1e9 * width ** 2, "test_loss_mean": 2.2 - 0.001 * width + 0.02 * i,
                         "test_loss_ci": ci})
    cells = pd.DataFrame(rows)
    for axis, (col, _) in scaling.AXES.items():
        for arm in arms:
            own = cells[cells["arm"] == arm]
            fitted[(axis, arm)] = trends.fit_log_linear(own[col].to_numpy(float), own["test_loss_mean"].to_numpy(float))
    return cells, fitted, arms


def iso_table() -> pd.DataFrame:
    return pd.DataFrame([{"axis": label, "arm": arm, "width": w, "diff": 0.01 * k, "diff_ci_low": 0.01 * k - 0.02,
                          "diff_ci_high": 0.01 * k + 0.02, "extrapolated": w == 128, "x": 1e5 * w}
                         for _, label in scaling.AXES.values() for k, arm in enumerate(["gpt", "node", "ssm"])
                         for w in (64, 96, 128)])


def compute_tables():
    rows = []
    for arm in ("node", "node random", "ti_mlp reg"):
        for nfe in (2, 4, 8):
            rows.append({"arm": arm, "adaptive": False, "nfe": nfe, "ms_per_token": 0.1 * nfe, "loss": 2.0 + 1 / nfe,
                         "ci_low": 1.95 + 1 / nfe, "ci_high": 2.05 + 1 / nfe})
        rows.append({"arm": arm, "adaptive": True, "nfe": 6.5, "ms_per_token": 0.9, "loss": 2.1, "ci_low": 2.0,
                     "ci_high": 2.2})
    points = pd.DataFrame([{"arm": "gpt", "seed": s, "loss": 2.0 + 0.01 * s, "nfe": 4, "ms_per_token": 0.3}
                           for s in range(3)])
    return pd.DataFrame(rows), points, ["gpt", "node", "node random", "ti_mlp reg"]


def spectra_summary() -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "kind": kind, "head": h, "t": t, "seed": s, "mean_abs": 1 + 0.1 * t * (s + 1) + h,
                          "spectral_radius": 2.0 + t, "n_eigs": 4}
                         for m in ("node", "ti_mlp") for kind in ("qk", "ov") for h in (0, 1) for s in range(3)
                         for t in np.linspace(0, 1, 5)])


def complex_spectra() -> dict:
    rng = np.random.default_rng(0)
    eig = rng.normal(size=(5, 2, 4)) + 1j * rng.normal(size=(5, 2, 4))
    return {"node": SimpleNamespace(times=np.linspace(0, 1, 5), qk=eig, ov=eig)}


def jacobian_spectra() -> dict:
    t = np.linspace(0, 1, 5)
    curve = SimpleNamespace(times=t, spectral_radius=1 + t, max_real=t - 0.5, spectral_norm=2 + t, state_rms=1 + t)
    return {"node seed 0": curve, "node seed 1": curve, "ti_mlp seed 0": curve}


def token_spectra() -> dict:
    k = np.linspace(1, -1, 8)
    return {"node": SimpleNamespace(svd=k, qr=k - 0.1), "ti_mlp": SimpleNamespace(svd=k, qr=k)}


def sensitivity_maps() -> dict:
    exponent = np.tril(np.ones((4, 4)))
    exponent[np.triu_indices(4, k=1)] = np.nan
    return {"node": SimpleNamespace(exponent=exponent, tokens=[1, 2, 3, 4])}


def on_axes(draw):
    """A figure with one axes that ``draw(ax)`` draws into (the plotting helpers take an axes)."""
    def make():
        fig, ax = plt.subplots()
        draw(ax)
        return fig
    return make


# every figure function of reporting (and 04's dynamics figures): how to draw it from synthetic data
CASES = {
    "plot_arm_metric": on_axes(lambda ax: plotting.plot_arm_metric(ax, runs_frame(), "test_loss", ARMS, "loss",
                                                                   references={"trigram": 2.05})),
    "plot_efficiency": on_axes(lambda ax: plotting.plot_efficiency(ax, runs_frame(), "flops_per_token", "test_loss",
                                                                   ARMS, log_x=True, references={"trigram": 2.05})),
    "plot_curves": on_axes(lambda ax: plotting.plot_curves(ax, curves_frame())),
    "plot_paired_differences": on_axes(lambda ax: plotting.plot_paired_differences(ax, curves_frame())),
    "plot_reference_lines": on_axes(lambda ax: (ax.set_ylim(0, 5), plotting.plot_reference_lines(ax, {"bigram": 2.5}))),
    "steps_solver_figure": lambda: figures.steps_solver_figure(steps_solver_runs(), ["euler", "rk4"]),
    "ablation_differences_figure": lambda: figures.ablation_differences_figure(ablation_tests()),
    "depth_curve_figure": lambda: figures.depth_curve_figure(depth_rows(), ["euler", "rk4"], ["euler 2", "rk4 2"]),
    "depth_transfer_figure": lambda: figures.depth_transfer_figure(transfer_summary()),
    "decode_speed_figure": lambda: figures.decode_speed_figure(pd.DataFrame(
        {"arch": ["gpt", "node"], "uncached_tokens_per_s": [100.0, 50.0], "cached_tokens_per_s": [900.0, 60.0]})),
    "corpora_figure": lambda: figures.corpora_figure(corpora_tables(), "gpt", ["gpt", "node", "ssm"]),
    "long_context_figure": lambda: figures.long_context_figure(long_context_curves(), 16, split="test"),
    "loss_figure": lambda: scaling_figures.loss_figure(*scaling_cells()[:2], scaling_cells()[2], scaling.AXES,
                                                       {"bigram": 2.5, "trigram": 2.12}),
    "iso_figure": lambda: scaling_figures.iso_figure(iso_table(), ["gpt", "node", "ssm"], 0.02, scaling.AXES),
    "compute_figure": lambda: compute_figures.compute_figure(*compute_tables()),
    "plot_depth": lambda: dynamics_figures.plot_depth(spectra_summary()),
    "plot_depth_trend": lambda: dynamics_figures.plot_depth_trend(spectra_summary(), depth_trend_test(spectra_summary())),
    "plot_complex": lambda: dynamics_figures.plot_complex(complex_spectra()),
    "plot_jacobian": lambda: dynamics_figures.plot_jacobian(jacobian_spectra()),
    "plot_token_spectra": lambda: dynamics_figures.plot_token_spectra(token_spectra()),
    "plot_sensitivity": lambda: dynamics_figures.plot_sensitivity(sensitivity_maps()),
}

FIGURE_MODULES = [plotting, figures, scaling_figures, compute_figures, dynamics_figures]


# --------------------------------------------------------------------------- what a figure draws


def _colours(artist) -> list:
    """The visible colours of one artist (RGBA rows; fully transparent ones left out)."""
    if isinstance(artist, Collection):
        found = [*artist.get_facecolor(), *artist.get_edgecolor()]
    elif isinstance(artist, plt.Line2D):
        found = [artist.get_color()] + [c for c in (artist.get_markerfacecolor(), artist.get_markeredgecolor())
                                        if not (isinstance(c, str) and c == "none")]
    elif isinstance(artist, Text):
        found = [artist.get_color()] if artist.get_text() else []
    else:  # a patch: bars, spans
        found = [artist.get_facecolor(), artist.get_edgecolor()]
    rgba = [matplotlib.colors.to_rgba(c) for c in found]
    return [c for c in rgba if c[3] > 0]


def drawn(fig):
    """Every data artist of ``fig``'s axes and its notes: lines, collections, patches, texts (not the
    axes' frame, ticks and grid, nor legends, which repeat what they label)."""
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        yield from (*ax.get_lines(), *ax.collections, *ax.patches, *ax.texts)
    yield from fig.texts


def all_text(fig) -> str:
    """Every text of ``fig``, and the labels of its error bars (what a caller's legend would show)."""
    labels = [c.get_label() for ax in fig.axes for c in ax.containers]
    return "\n".join([t.get_text() for t in fig.findobj(Text)] + [str(label) for label in labels])


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------- the palette itself


def test_every_registered_family_and_control_has_its_own_colour():
    from nodelm_lib.experiments.protocol import CONTROLS

    assert set(families.names()) | set(CONTROLS) | {"gpt_matched"} <= set(style.ARM_COLORS)
    colours = list(style.ARM_COLORS.values())
    assert len(set(c.lower() for c in colours)) == len(colours)
    assert not any(style.is_neutral(c) for c in colours)  # greys are for references


def test_corpora_have_colours_that_no_arm_has_and_series_take_neither():
    assert set(CORPORA) <= set(style.CORPUS_COLORS)
    arms = {c.lower() for c in style.ARM_COLORS.values()}
    corpora = {c.lower() for c in style.CORPUS_COLORS.values()}
    series = {c.lower() for n in range(1, 13) for c in style.series_colors(n)}
    assert len(corpora) == len(style.CORPUS_COLORS) and not corpora & arms
    assert not series & (arms | corpora)


def test_a_variant_keeps_its_arm_colour_and_takes_its_own_line():
    assert style.arm_color("node random") == style.arm_color("node") == style.ARM_COLORS["node"]
    assert style.arm_line("node random")["linestyle"] != style.arm_line("node")["linestyle"]
    assert style.arm_line("ti_mlp reg")["color"] == style.ARM_COLORS["ti_mlp"]


def test_an_unknown_arm_corpus_or_variant_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"'tong' is not an arm with a colour; choose one of gpt, "):
        style.arm_color("tong")
    with pytest.raises(TypeError, match="an arm is named by a string"):
        style.arm_color(0)  # the old positional colours
    with pytest.raises(ValueError, match="corpus 'ptb' has no colour; choose one of tinyshakespeare"):
        style.corpus_color("ptb")
    with pytest.raises(ValueError, match=r"variant 'wide' has no line style; choose one of 'random', 'reg'"):
        style.arm_line("node wide")


def test_a_registered_family_without_a_colour_is_told_where_to_add_one():
    family = families.register(families.Family("zz_test_family"))
    try:
        with pytest.raises(ValueError, match="model family 'zz_test_family' has no colour: add it to .*ARM_COLORS"):
            style.arm_color("zz_test_family")
    finally:
        families.unregister(family.name)


def test_palette_membership_tells_palette_colours_from_others():
    assert style.is_palette_color(style.ARM_COLORS["gpt"]) and style.is_palette_color("dimgrey")
    assert style.is_palette_color(style.series_colors(3)[1]) and style.is_palette_color(style.CORPUS_COLORS["wikitext2"])
    assert not style.is_palette_color("#FF0000") and not style.is_palette_color("C1" if False else "#1f77b4")


# --------------------------------------------------------------------------- every figure function


def test_every_figure_function_has_a_case():
    """A public function of the figure modules that returns a Figure, or is a plot_* helper, is drawn here."""
    found = set()
    for module in FIGURE_MODULES:
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name.startswith("_"):
                continue
            returns = str(inspect.signature(fn).return_annotation)
            if "Figure" in returns or name.startswith("plot_"):
                found.add(name)
    assert found == set(CASES), f"without a case: {sorted(found - set(CASES))}; stale: {sorted(set(CASES) - found)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_figure_takes_every_colour_from_the_palette(name):
    fig = CASES[name]()
    offending = {matplotlib.colors.to_hex(c) for artist in drawn(fig) for c in _colours(artist)
                 if not style.is_palette_color(c)}
    assert not offending, f"{name} draws colours outside the palette: {sorted(offending)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_interval_a_figure_draws_is_named_95_percent_ci(name):
    fig = CASES[name]()
    intervals = any(isinstance(c, ErrorbarContainer) and c.has_yerr | c.has_xerr for ax in fig.axes for c in ax.containers)
    bands = any(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)
    if not (intervals or bands):
        pytest.skip(f"{name} draws no interval")
    assert "95% CI" in all_text(fig), f"{name} draws intervals without saying they are 95% CIs"


def _line_colour(fig, label) -> str:
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() == label:
                return matplotlib.colors.to_hex(line.get_color())
    raise AssertionError(f"no line labelled {label!r}")


def test_an_arm_has_one_colour_in_every_notebook_figure():
    """node in 02's curves, 08's long-context figure, 07's scaling figure and 09's compute figure."""
    curves = CASES["plot_curves"]()
    cells, fitted, arms = scaling_cells()
    scaled = scaling_figures.loss_figure(cells, fitted, arms, scaling.AXES)
    computed = CASES["compute_figure"]()
    context = figures.long_context_figure(long_context_curves().replace({"arm": {"ti_mlp": "node"}}), 16)
    assert {_line_colour(curves, "node"), _line_colour(computed, "node"), _line_colour(context, "node")} == \
        {style.ARM_COLORS["node"]}
    assert _line_colour(curves, "gpt") == _line_colour(context, "gpt") == style.ARM_COLORS["gpt"]
    assert _line_colour(scaled, "ti_ssm (log-linear)") == _line_colour(curves, "ti_ssm") == style.ARM_COLORS["ti_ssm"]


def test_the_corpora_figure_draws_both_panels_in_one_unit_and_corpora_in_their_colours():
    fig = CASES["corpora_figure"]()
    diff_ax, loss_ax = fig.axes
    assert "nats/char" in diff_ax.get_ylabel() and "nats/char" in loss_ax.get_ylabel()
    assert "bits" not in all_text(fig)
    colours = {matplotlib.colors.to_hex(c.lines[0].get_color()) for c in diff_ax.containers}
    assert colours == {style.CORPUS_COLORS["tinyshakespeare"], style.CORPUS_COLORS["wikitext2"]}
    assert "abc1234" in all_text(fig)  # the commits of the records side by side


def test_a_diverged_cell_does_not_set_the_scaling_range_and_is_named():
    cells, fitted, arms = scaling_cells(diverged=True)
    fig = scaling_figures.loss_figure(cells, fitted, arms, scaling.AXES)
    lo, hi = fig.axes[0].get_ylim()
    assert hi - lo < 0.3  # the other cells' span, not the diverged cell's ±0.6
    assert "hybrid d=96" in all_text(fig) and "cut at the axis" in all_text(fig)
    calm = scaling_figures.loss_figure(*scaling_cells(diverged=False)[:2], arms, scaling.AXES)
    assert "cut at the axis" not in all_text(calm)


def test_a_validation_reference_near_the_data_widens_the_range_to_show_it():
    cells, _, _ = scaling_cells(diverged=False)
    lo, hi, _ = scaling_figures.loss_range(cells, {"trigram": 2.12, "unigram": 3.4})
    assert lo < 2.12 < hi and hi < 3.4


def test_curves_cut_by_the_zoom_are_named_in_a_note():
    fig, ax = plt.subplots()
    plotting.plot_curves(ax, curves_frame())
    plotting.zoom_to_late(ax, curves_frame())
    notes = [t.get_text() for t in ax.texts]
    assert any("above the axis" in n for n in notes)


def test_off_axis_depth_curve_points_are_triangles_on_the_edge_not_labels():
    fig = CASES["depth_curve_figure"]()
    ax = fig.axes[0]
    top = ax.get_ylim()[1]
    edge = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert edge and all(np.allclose(line.get_ydata(), top) for line in edge)
    assert not [t for t in ax.texts if t.get_text().replace(".", "").isdigit()]  # no value labels at the edge
    assert any("above" in t.get_text() for t in ax.texts)


def test_the_depth_transfer_note_is_a_readable_line_of_its_own():
    fig = CASES["depth_transfer_figure"]()
    (note,) = [t for t in fig.texts if "not trained" in t.get_text()]
    assert note.get_fontsize() >= 8 and "node: from scratch at m (full budget) at m=8" in note.get_text()


def test_trend_titles_and_colour_bars_say_what_they_show():
    trend = CASES["plot_depth_trend"]()
    assert all("95% CI [" in ax.get_title() for ax in trend.axes)
    sensitivity = CASES["plot_sensitivity"]()
    bars = [ax for ax in sensitivity.axes if ax.get_label() == "<colorbar>"]
    assert bars and all("log σmax" in bar.get_ylabel() for bar in bars)


def test_the_long_context_figure_names_its_split():
    assert "on the test split" in CASES["long_context_figure"]().axes[0].get_title()
