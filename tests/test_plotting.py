"""Figure helpers: labels of nearby points must not overlap; saving a figure writes no warnings."""

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
