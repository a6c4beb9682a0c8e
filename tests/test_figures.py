"""Figures a reviewer can read: one resolution, axis labels with units, and the figure helpers of
notebook 02 (log-scale efficiency axes, the corpora side by side, published claims beside ours)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from nodelm_lib.reporting import comparisons  # noqa: E402
from nodelm_lib.reporting.figures import corpora_figure  # noqa: E402
from nodelm_lib.reporting.plotting import plot_arm_metric, plot_efficiency  # noqa: E402
from nodelm_lib.reporting.style import STYLE, axes_description, save_figure  # noqa: E402
from nodelm_lib.reporting.tables import claims_table  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def runs_frame(offsets: dict[str, float], seeds=range(5)) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame([{"arm": a, "seed": s, "test_loss": 2.0 + off + 0.01 * s + rng.normal(0, 0.002),
                          "val_loss": 1.9 + off + 0.01 * s, "params_non_embedding": 1e5 * (1 + i) ** 3,
                          "flops_per_token": 1e6 * (1 + i)}
                         for i, (a, off) in enumerate(offsets.items()) for s in seeds])


def line_figure(y_end: float = 4.0, xlabel: str = "step") -> plt.Figure:
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [3, y_end])
    ax.set_xlabel(xlabel)
    return fig


def nudged_png(path: Path, levels: int) -> bytes:
    """``path``'s PNG with one pixel's red channel moved by ``levels``, its metadata kept: what
    another CPU's rendering of the same figure looks like (anti-aliasing rounded elsewhere)."""
    import io

    from PIL import PngImagePlugin

    image = Image.open(path)
    pixels = np.asarray(image).copy()
    pixels[5, 5, 0] = pixels[5, 5, 0] - levels if pixels[5, 5, 0] >= levels else pixels[5, 5, 0] + levels
    info = PngImagePlugin.PngInfo()
    info.add_text("Description", image.info["Description"])
    out = io.BytesIO()
    Image.fromarray(pixels, image.mode).save(out, format="png", pnginfo=info, dpi=image.info["dpi"])
    return out.getvalue()


@pytest.mark.parametrize("levels, kept", [(1, True), (2, True), (3, False), (40, False)])
def test_a_rendering_within_rounding_of_the_saved_figure_keeps_its_files(tmp_path, levels, kept):
    """A rerun on another CPU type draws the same figure with anti-aliased edges rounded elsewhere;
    save_figure keeps the committed PNG and PDF then (git stays clean), and writes both where a
    pixel moved by more than SAME_PICTURE_LEVELS."""
    png, pdf = save_figure(line_figure(), tmp_path / "f")
    committed = nudged_png(png, levels)
    png.write_bytes(committed)
    pdf.write_bytes(b"the committed pdf")
    save_figure(line_figure(), tmp_path / "f")
    assert (png.read_bytes() == committed) is kept
    assert (pdf.read_bytes() == b"the committed pdf") is kept
    plt.close("all")


def test_a_changed_figure_is_written_again(tmp_path):
    png, pdf = save_figure(line_figure(), tmp_path / "f")
    first = png.read_bytes()
    save_figure(line_figure(y_end=4.5), tmp_path / "f")  # the data moved: many pixels change
    assert png.read_bytes() != first
    relabelled = save_figure(line_figure(xlabel="tokens"), tmp_path / "f")[0]  # the axes description changed
    assert json.loads(Image.open(relabelled).info["Description"])[0]["xlabel"] == "tokens"
    pdf.unlink()  # a missing PDF: both are written, even for the same picture
    before = png.read_bytes()
    save_figure(line_figure(xlabel="tokens"), tmp_path / "f")
    assert pdf.exists() and png.read_bytes() == before
    png.write_bytes(b"not a png")
    save_figure(line_figure(xlabel="tokens"), tmp_path / "f")
    assert png.read_bytes() == before
    plt.close("all")


def test_save_figure_writes_the_project_resolution_and_describes_the_axes(tmp_path):
    plt.rcdefaults()  # the default style (100 dpi): save_figure still writes the project's
    fig, (a, b) = plt.subplots(1, 2)
    runs = runs_frame({"gpt": 0.0, "node": 0.05})
    plot_arm_metric(a, runs, "test_loss", ["gpt", "node"], "test loss (nats/char)")
    b.plot([1, 2], [3, 4])
    b.set_xlabel("step")
    fig.colorbar(b.scatter([1, 2], [3, 4], c=[0, 1]), ax=b)
    png, pdf = save_figure(fig, tmp_path / "f")
    assert pdf.exists()
    image = Image.open(png)
    assert image.info["dpi"] == pytest.approx((STYLE["savefig.dpi"],) * 2, abs=0.01)
    described = json.loads(image.info["Description"])
    assert described == [
        {"title": "", "xlabel": "", "ylabel": "test loss (nats/char)", "x_categorical": True, "y_categorical": False,
         "y_label_shared": False},
        {"title": "", "xlabel": "step", "ylabel": "", "x_categorical": False, "y_categorical": False,
         "y_label_shared": False},
    ]  # the colour bar is left out
    plt.close(fig)
    fig, (a, b) = plt.subplots(1, 2, sharey=True)
    a.set_ylabel("loss (nats/char)")
    b.barh([0, 1], [1, 2])
    b.set_yticks([0, 1], ["gpt − node", "ti_mlp − gpt"])
    # the panel beside shows no tick labels of its own (sharey): its y axis is the labelled one
    assert [(d["y_label_shared"], d["y_categorical"]) for d in axes_description(fig)] == [(False, True), (True, False)]
    plt.close(fig)


def test_efficiency_on_a_log_axis_keeps_the_arms_apart():
    fig, ax = plt.subplots()
    plot_efficiency(ax, runs_frame({"gpt": 0.0, "node": 0.05, "ti_mlp": 0.1}), "params_non_embedding", "test_loss",
                    ["gpt", "node", "ti_mlp"], "non-embedding parameters (log scale)", "test loss (nats/char)",
                    log_x=True)
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_xlim()
    assert lo < 1e5 and hi > 2.7e6
    plt.close(fig)


def test_the_corpora_figure_draws_each_corpus_difference_and_loss_in_one_unit():
    order = ["gpt", "node", "ti_mlp"]
    corpora = {}
    for name, shift in (("tinyshakespeare", 0.0), ("wikitext2", 0.3)):
        runs = runs_frame({"gpt": shift, "node": shift + 0.02, "ti_mlp": shift + 0.1})
        tests = comparisons.holm_family({"vs gpt": comparisons.compare_arms(runs, "test_loss", "gpt", equivalence_margin=0.02)})
        corpora[name] = (runs, tests)
    fig = corpora_figure(corpora, "gpt", order)
    diff_ax, loss_ax = fig.axes
    assert [t.get_text() for t in diff_ax.get_legend().get_texts()] == ["tinyshakespeare", "wikitext2"]
    assert diff_ax.get_ylabel() == "test loss − gpt's (nats/char)" and loss_ax.get_ylabel() == "test loss (nats/char)"
    # the plotted differences are the tests' means, one marker per corpus and arm
    means = sorted(round(float(y), 6) for c in diff_ax.containers for y in c.lines[0].get_ydata())
    expected = sorted(round(float(v), 6) for _, t in corpora.values() for v in t["mean_diff"])
    assert means == expected
    plt.close(fig)


def test_claims_table_sets_published_numbers_beside_ours_with_both_rankings():
    runs = runs_frame({"gpt": 0.0, "node": 0.02, "ti_mlp": 0.1, "ti_ssm": 0.05})
    published = {"source": "a README", "setup": "non-causal", "metric": "val_loss",
                 "rows": {"ti_ssm": "2.147 ± 0.124", "ti_mlp": "2.231 ± 0.025", "node": "2.336 ± 0.018",
                          "gpt": "2.367 ± 0.022"}}
    table = claims_table(runs, published, ["gpt", "node", "ti_mlp", "ti_ssm"])
    assert table["arm"].tolist() == ["gpt", "node", "ti_mlp", "ti_ssm"]
    assert table["published rank"].tolist() == [4, 3, 2, 1] and table["our rank"].tolist() == [1, 2, 4, 3]
    assert table["published val loss"].tolist()[0] == "2.367 ± 0.022"
    assert table["ours val loss"].iloc[0].startswith("1.92")
    with pytest.raises(ValueError, match=r"published arm\(s\) \['tong'\] have no runs"):
        claims_table(runs, {**published, "rows": {"tong": "1.0"}}, ["gpt"])
    with pytest.raises(ValueError, match=r"published lacks \['setup'\]"):
        claims_table(runs, {k: v for k, v in published.items() if k != "setup"}, ["gpt"])


def describe(png: Path):
    info = Image.open(png).info
    return info.get("dpi"), json.loads(info["Description"]) if "Description" in info else None


@pytest.mark.parametrize("png", sorted(FIGURES.glob("*.png")), ids=lambda p: p.name)
def test_each_committed_figure_has_the_resolution_and_labelled_axes(png):
    dpi, axes = describe(png)
    if axes is None:
        pytest.skip(f"{png.name} was drawn before save_figure described its axes; its notebook's next run adds them")
    assert dpi == pytest.approx((STYLE["savefig.dpi"],) * 2, abs=0.01)
    for ax in axes:
        assert ax["ylabel"] or ax.get("y_categorical") or ax.get("y_label_shared"), \
            f"{png.name}: an axes without a y label ({ax})"
        assert ax["xlabel"] or ax["x_categorical"], f"{png.name}: an axes without an x label ({ax})"
        for label in (ax["xlabel"], ax["ylabel"]):
            if "loss" in label:
                assert "nats" in label or "bits" in label, f"{png.name}: a loss axis without its unit: {label!r}"
