"""The notebooks' composite figures, each a whole ``plt.Figure`` of one experiment: the ablations'
(notebook 03: solver and steps, paired differences, the adaptive-depth curve, fine-tuning at another
depth), decoding speed (06), one comparison on several corpora (02) and loss by position past the
training context (08). Arms and corpora in their ``style`` colours, other series (solvers, the
variants of an ablation) in ``style.series_colors``; every interval named "95% CI"."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .plotting import arm_order, note_clipped
from .style import CI_LABEL, NEUTRAL, NOTE, arm_color, corpus_color, series_colors, use_style


# --------------------------------------------------------------------------- ablations (notebook 03)

INTERVAL = f"mean ± {CI_LABEL} over seeds (t)"
# one marker per series beside its colour (solvers, variants), so that print in grey still tells them;
# triangles are left out: they mark points beyond the axis, and stars the trained depth
MARKERS = ["o", "s", "D", "P", "X", "h", "p", "d"]


def steps_solver_arm(arm: str) -> tuple[str, int]:
    """``"rk4 8"`` -> ``("rk4", 8)``: the solver and number of steps of a ``steps_solver``
    ablation arm (``ablations.ablation_arms`` names them ``"<solver> <n>"``)."""
    solver, _, steps = arm.partition(" ")
    if not steps.isdigit():
        raise ValueError(f"a steps_solver arm is named '<solver> <steps>', e.g. 'euler 4'; got {arm!r}")
    return solver, int(steps)


def nfe_per_forward(solver: str, n_steps: int) -> int:
    """Field evaluations of one forward pass: steps x the solver's stages."""
    from nodelm_lib.ode.tableaus import TABLEAUS

    if solver not in TABLEAUS:
        raise ValueError(f"solver {solver!r} is not a fixed-step method; choose one of {', '.join(TABLEAUS)}")
    return n_steps * TABLEAUS[solver].n_stages


def _errorbar_by(ax: plt.Axes, x, stats, **kwargs):
    """Error bars from ``mean_ci`` results (a single seed: no bar)."""
    means = [s["mean"] for s in stats]
    halves = [0.0 if np.isnan(s["ci_half"]) else s["ci_half"] for s in stats]
    return ax.errorbar(x, means, yerr=halves, **{"marker": "o", "capsize": 3, **kwargs})


def steps_solver_figure(runs, solvers, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """The ``steps_solver`` ablation over depth, a line per solver, every point the mean ± 95%
    CI over seeds: test loss against solver steps, test loss against field evaluations per
    forward pass (NFE: steps x stages, the cost axis), and milliseconds per training step
    against NFE. ``runs``: one row per run (arm, seed, test_loss, ms_per_step)."""
    from .stats import mean_ci

    parsed = runs["arm"].map(steps_solver_arm)
    fig, (steps_ax, nfe_ax, time_ax) = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = series_colors(len(solvers))
    for i, solver in enumerate(solvers):
        rows = runs[parsed.str[0] == solver]
        arms = list(dict.fromkeys(rows["arm"]))
        n = [steps_solver_arm(a)[1] for a in arms]
        nfe = [nfe_per_forward(solver, k) for k in n]
        loss = [mean_ci(rows.loc[rows["arm"] == a, "test_loss"].astype(float)) for a in arms]
        time = [mean_ci(rows.loc[rows["arm"] == a, "ms_per_step"].astype(float)) for a in arms]
        style = {"color": colors[i], "marker": MARKERS[i % len(MARKERS)], "label": solver}
        _errorbar_by(steps_ax, n, loss, **style)
        _errorbar_by(nfe_ax, nfe, loss, **style)
        _errorbar_by(time_ax, nfe, time, **style)
    steps_ax.set_xlabel("solver steps (depth)")
    for ax in (nfe_ax, time_ax):
        ax.set_xlabel("field evaluations per forward (NFE)")
    steps_ax.set_ylabel(f"test loss ({unit})")
    nfe_ax.set_ylabel(f"test loss ({unit})")
    time_ax.set_ylabel("ms per training step")
    for ax in (steps_ax, nfe_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.legend(title=INTERVAL, fontsize=7, title_fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def ablation_differences_figure(tests: dict, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """The two- and three-arm ablations in one panel: for every arm, its test loss minus its
    ablation's reference, paired by seed (``tests``: ablation -> ``comparisons.compare_arms`` table),
    as the mean difference with its 95% t-interval; left of zero the arm is better. Each row
    names the arm, the reference and the Holm-adjusted paired-t p of its ablation."""
    labels, rows = [], []
    for name, table in tests.items():
        for _, row in table.iterrows():
            labels.append(f"{name}: {row['arm']} − {row['reference']}\n(n={int(row['n'])}, p_Holm={row['p_t_holm']:.2g})")
            rows.append((name, row))
    fig, ax = plt.subplots(figsize=(6.5, 0.55 * len(rows) + 1.4))
    names = list(tests)
    colors = series_colors(len(names))
    y = np.arange(len(rows))[::-1]
    for yi, (name, row) in zip(y, rows):
        ax.errorbar(row["mean_diff"], yi, xerr=[[row["mean_diff"] - row["ci_low"]], [row["ci_high"] - row["mean_diff"]]],
                    fmt="o", capsize=4, color=colors[names.index(name)])
    ax.axvline(0.0, color=NEUTRAL, linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(f"Δ test loss vs the reference ({unit})\npaired mean difference and its {CI_LABEL} (t)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def depth_curve_means(depth):
    """Validation loss per (trained arm, evaluation method, steps, NFE), mean over seeds, from
    ``ablations.depth_curve`` rows with an ``arm`` column; rows in order of first appearance."""
    keys = ["arm", "method", "n_steps", "nfe"]
    return depth.groupby(keys, sort=False)["val_loss"].mean().reset_index()


def depth_curve_figure(depth, solvers, arms, unit: str = "nats/token", focus: float = 0.5) -> plt.Figure:
    """The adaptive-depth curve: one panel per evaluation solver, validation loss (mean ± 95% CI
    over seeds) against field evaluations per forward pass (log2 axis), a line per trained arm
    (in the order of ``arms``), and a ring where the arm's own solver and steps are (from the
    rows' ``trained_method`` / ``trained_steps``). A flat curve past the trained steps means
    the model learned a flow. The y axis shows ``focus`` nats above the lowest mean, where the
    arms differ; a mean above that (a model solved with far too few steps) is a triangle on the
    top edge, and a note says so (the values are in the notebook's table below the figure)."""
    from .stats import mean_ci

    fig, axes = plt.subplots(1, len(solvers), figsize=(4.8 * len(solvers), 3.8), sharey=True, squeeze=False)
    means = depth.groupby(["arm", "method", "n_steps"])["val_loss"].mean()
    bottom = float(means.min())
    top = bottom + focus
    colors = series_colors(len(arms))
    for ax, method in zip(axes[0], solvers):
        above = []
        for i, arm in enumerate(arms):
            rows = depth[(depth["arm"] == arm) & (depth["method"] == method)]
            points = list(dict.fromkeys(rows["n_steps"]))
            stats = [mean_ci(rows.loc[rows["n_steps"] == n, "val_loss"].astype(float)) for n in points]
            nfe = [int(rows.loc[rows["n_steps"] == n, "nfe"].iloc[0]) for n in points]
            marker = MARKERS[i % len(MARKERS)]
            _errorbar_by(ax, nfe, stats, color=colors[i], label=f"trained {arm}", markersize=4, marker=marker)
            off = [x for x, st in zip(nfe, stats) if st["mean"] > top]
            if off:  # off the scale: a triangle on the edge, in the arm's colour
                ax.plot(off, [top] * len(off), "^", color=colors[i], markersize=6, clip_on=False, zorder=4)
                above.append(arm)
            trained = rows[(rows["trained_method"] == method) & (rows["n_steps"] == rows["trained_steps"])]
            if len(trained):
                ax.plot(int(trained["nfe"].iloc[0]), float(trained["val_loss"].mean()), marker="o", markersize=11,
                        markerfacecolor="none", markeredgecolor=colors[i], linestyle="none")
        if above:
            note_clipped(ax, f"▲ on the top edge: means above {top:.2f} (table below)", where="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"NFE per forward ({method} at evaluation)")
        ax.set_title(f"evaluated with {method}")
    axes[0][0].set_ylim(bottom - 0.05 * focus, top)
    axes[0][0].set_ylabel(f"validation loss ({unit})\n{INTERVAL}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False,
               title="ring: the solver and steps each was trained with; ▲: mean above the axis", title_fontsize=8)
    fig.tight_layout(rect=(0, 0.1 + 0.05 * ((len(labels) - 1) // 4), 1, 1))
    return fig


# ablations.depth_transfer's variants (its VARIANTS), as the figure's legend says them
TRANSFER_LABELS = {"trained": "trained at n (n steps)", "evaluated": "evaluated at m, no training",
                  "finetuned": "fine-tuned at m (short budget)", "continued": "control: trained on at n (short budget)",
                  "scratch_short": "from scratch at m (short budget)", "scratch_full": "from scratch at m (full budget)"}


def depth_transfer_figure(summary, title: str | None = None, unit: str = "nats/token") -> plt.Figure:
    """Fine-tuning at another depth (``ablations.transfer_summary``'s table): a panel per
    trained arch on one y scale, test loss (mean ± 95% CI over seeds) against the target depth m
    (log2 axis) for each variant (``TRANSFER_LABELS``; the rows are ``ablations.depth_transfer``'s variants), and the trained model at its own
    depth as a star. A variant a profile did not train at some m (the full budget, to fit its
    time) is named under the panel instead of leaving a silent gap."""
    archs = list(dict.fromkeys(summary["arm"]))
    fig, axes = plt.subplots(1, len(archs), figsize=(5.2 * len(archs), 4.0), squeeze=False, sharey=True)
    variants = [v for v in TRANSFER_LABELS if v != "trained"]
    colors = series_colors(len(variants))
    missing = []
    for ax, arch in zip(axes[0], archs):
        rows = summary[summary["arm"] == arch]
        steps = sorted(set(rows.loc[rows["variant"] != "trained", "to_steps"]))
        for i, variant in enumerate(variants):
            part = rows[rows["variant"] == variant]
            if part.empty:
                continue
            missing += [f"{arch}: {TRANSFER_LABELS[variant]} at m={m}" for m in steps if m not in set(part["to_steps"])]
            shift = 2 ** (0.06 * (i - (len(variants) - 1) / 2))  # side by side on the log axis
            ax.errorbar(part["to_steps"] * shift, part["mean"],
                        yerr=[part["mean"] - part["ci_low"], part["ci_high"] - part["mean"]],
                        marker=MARKERS[i % len(MARKERS)], capsize=3, linestyle="none", color=colors[i],
                        label=TRANSFER_LABELS[variant])
        trained = rows[rows["variant"] == "trained"]
        ax.errorbar(trained["to_steps"], trained["mean"],
                    yerr=[trained["mean"] - trained["ci_low"], trained["ci_high"] - trained["mean"]],
                    marker="*", markersize=12, capsize=3, linestyle="none", color=NEUTRAL,
                    label=TRANSFER_LABELS["trained"])
        ax.set_xscale("log", base=2)
        ticks = sorted(set(rows["to_steps"]))
        ax.set_xticks(ticks, [str(s) for s in ticks])
        ax.set_xlabel("solver steps m")
        ax.set_title(arch)
    axes[0][0].set_ylabel(f"test loss ({unit})\n{INTERVAL}")
    handles = {}
    for ax in axes[0]:  # one legend for every panel: the union of what they draw
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if title:
        fig.suptitle(title)
    # stacked from the bottom edge up: the note (inside the axes it would sit on the lowest points), the
    # legend, the panels; each takes the height it measures, so that neither runs into an axis label
    renderer, height = fig.canvas.get_renderer(), fig.bbox.height
    note_top = 0.0
    if missing:
        note = fig.text(0.5, 0.01, "not trained (time budget): " + "; ".join(missing), ha="center", va="bottom",
                        fontsize=8, color=NOTE)
        note_top = 0.01 + note.get_window_extent(renderer).height / height
    legend = fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8,
                        frameon=False, bbox_to_anchor=(0.5, note_top))
    legend_top = note_top + legend.get_window_extent(renderer).height / height
    fig.tight_layout(rect=(0, legend_top + 0.01, 1, 1))
    return fig


# --------------------------------------------------------------------------- generation (notebook 06)


def decode_speed_figure(speed, title: str | None = None) -> plt.Figure:
    """Decoding speed per arch with and without the KV cache: paired bars of tokens per second
    on a log axis (``speed``: one row per arch, columns arch, uncached_tokens_per_s and
    cached_tokens_per_s, as notebook 06 measures them)."""
    use_style()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    x = np.arange(len(speed))
    uncached, cached = series_colors(2)
    ax.bar(x - 0.2, speed["uncached_tokens_per_s"], width=0.4, color=uncached, label="recompute the window")
    ax.bar(x + 0.2, speed["cached_tokens_per_s"], width=0.4, color=cached, label="KV cache")
    ax.set_xticks(x, speed["arch"])
    ax.set_ylabel("decoded tokens / s (log scale)")
    ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # beside the bars, never over them
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- corpora side by side


def corpora_figure(corpora: dict, reference: str, order, unit: str = "nats/char") -> plt.Figure:
    """One comparison on several corpora: ``corpora`` maps a corpus (``data.sources.CORPORA``; its
    colour is ``style.corpus_color``'s, no arm's) to its ``(runs, tests)`` (a sweep's
    ``record_row`` table and its ``compare_arms`` / ``comparisons.holm_family`` table). Left: each
    arm's paired test-loss difference to ``reference`` (mean and 95% CI), one marker per corpus;
    right: each arm's test loss (mean ± 95% CI), both in ``unit``. Where the runs carry their
    library commit (``git_commit``), a note under the panels names each corpus' commits: tables
    side by side from different commits say so."""
    from .stats import mean_ci

    fig, (diff_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 3.8))
    arms = [a for a in order if a != reference]
    width = 0.6 / max(1, len(corpora) - 1) if len(corpora) > 1 else 0.0
    for k, (name, (runs, tests)) in enumerate(corpora.items()):
        shift = (k - (len(corpora) - 1) / 2) * width
        style = {"fmt": MARKERS[k % len(MARKERS)], "capsize": 3, "color": corpus_color(name), "label": name}
        rows = tests[tests["family"] == f"vs {reference}"] if "family" in tests.columns else tests
        rows = rows[rows["reference"] == reference].set_index("arm")
        xs = [i + shift for i, a in enumerate(arms) if a in rows.index]
        found = [a for a in arms if a in rows.index]
        mean = rows.loc[found, "mean_diff"].to_numpy(float)
        err = np.vstack([mean - rows.loc[found, "ci_low"].to_numpy(float), rows.loc[found, "ci_high"].to_numpy(float) - mean])
        diff_ax.errorbar(xs, mean, yerr=err, **style)
        stats = [mean_ci(runs.loc[runs["arm"] == a, "test_loss"].astype(float)) for a in order]
        loss_ax.errorbar(np.arange(len(order)) + shift, [s["mean"] for s in stats], yerr=[s["ci_half"] for s in stats],
                         **style)
    diff_ax.axhline(0.0, color=NEUTRAL, linewidth=0.8)
    diff_ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    diff_ax.set_ylabel(f"test loss − {reference}'s ({unit})")
    diff_ax.set_title(f"paired difference to {reference}, mean and {CI_LABEL}", fontsize=10)
    loss_ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    loss_ax.set_ylabel(f"test loss ({unit})")
    loss_ax.set_title(f"test loss, mean ± {CI_LABEL} over seeds", fontsize=10)
    diff_ax.legend(title="corpus")
    commits = {name: sorted(set(runs["git_commit"].astype(str))) for name, (runs, _) in corpora.items()
               if "git_commit" in runs.columns}
    if commits:
        fig.text(0.5, 0.01, "records from library commits: " + "; ".join(f"{name} {', '.join(c)}"
                                                                          for name, c in commits.items()),
                 ha="center", va="bottom", fontsize=8, color=NOTE)
    fig.tight_layout(rect=(0, 0.06 if commits else 0, 1, 1))
    return fig


def position_bins(length: int, per_octave: int = 4) -> list[tuple[int, int]]:
    """Log-spaced bins [lo, hi) covering positions 0 .. length - 1, ``per_octave`` per doubling
    (position 0 alone first): a loss-by-position curve averaged in them is readable on a log
    axis, where single positions past a few hundred are noise."""
    edges = sorted({0, 1, *(int(round(2 ** (k / per_octave))) for k in range(int(per_octave * np.log2(max(length, 2))) + 1)),
                    length})
    edges = [e for e in edges if e <= length]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def long_context_figure(curves, train_context: int, order=None, unit: str = "nats/char",
                        split: str | None = None) -> plt.Figure:
    """Loss by position past the training context: per arm, the mean over seeds (band: 95% CI)
    of ``long_context.position_curves``' longest window, in log-spaced position bins, with the
    training context marked. ``curves`` has columns arm, seed, window, position, loss; ``split``
    (the text they were scored on) is named in the title."""
    from .stats import mean_ci

    longest = int(curves["window"].max())
    curves = curves[curves["window"] == longest]
    bins = position_bins(longest)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for arm in arm_order(curves, order):
        by_seed = curves[curves["arm"] == arm].pivot_table(index="position", columns="seed", values="loss")
        centres, stats = [], []
        for lo, hi in bins:
            centres.append(np.sqrt(max(lo, 0.5) * hi))  # the bin's geometric middle on the log axis
            stats.append(mean_ci(by_seed.iloc[lo:hi].mean(axis=0).to_numpy()))
        mean = np.array([s["mean"] for s in stats])
        half = np.nan_to_num(np.array([s["ci_half"] for s in stats]))
        ax.plot(centres, mean, color=arm_color(arm), label=arm)
        ax.fill_between(centres, mean - half, mean + half, color=arm_color(arm), alpha=0.2, linewidth=0)
    ax.axvline(train_context, color=NEUTRAL, linestyle="--", linewidth=0.8)
    ax.annotate("training context", (train_context, 1.0), xycoords=("data", "axes fraction"),
                xytext=(4, -4), textcoords="offset points", ha="left", va="top", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("position in the window (tokens of context)")
    ax.set_ylabel(f"loss ({unit})")
    on = f" on the {split} split" if split else ""
    ax.set_title(f"loss by position{on}, windows of {longest}; mean ± {CI_LABEL} over seeds", fontsize=10)
    ax.legend(title="arm")
    fig.tight_layout()
    return fig
