"""Evaluation past the training context (``long_context``): loss by position, its stored
evaluations, the position bands of the long-context table and its figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import nodelm_lib as nl
from nodelm_lib.runs import store as run_store
from nodelm_lib.experiments import long_context
from nodelm_lib.reporting.figures import long_context_figure, position_bins
from nodelm_lib.reporting.style import axes_description
from nodelm_lib.runs.store import checkpoint_path
from nodelm_lib.training.evaluation import evaluate_split


def tiny_model(seed: int = 0, max_seq_len: int = 16) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = nl.ModelConfig(arch="gpt", vocab_size=13, d_model=16, n_heads=2, n_layers=2, max_seq_len=max_seq_len)
    return nl.build_model(cfg)


def tokens(n: int = 100, seed: int = 1) -> torch.Tensor:
    return torch.randint(13, (n,), generator=torch.Generator().manual_seed(seed))


def test_each_position_is_the_loss_with_that_much_context():
    """The slow reference: position p of every window scored by a forward over its first p + 1 tokens."""
    model, toks = tiny_model(), tokens(3 * 8 + 1)
    curve = long_context.loss_by_position(model, toks, window=8, batch_size=2)
    assert curve["windows"] == 3 and curve["loss"].shape == (8,)
    x, y = toks[:24].view(3, 8), toks[1:25].view(3, 8)
    model.eval()
    with torch.no_grad():
        for p in range(8):
            logits, _ = model(x[:, : p + 1])
            expect = F.cross_entropy(logits[:, -1].double(), y[:, p]).item()
            assert curve["loss"][p] == pytest.approx(expect, abs=1e-5)


def test_the_curves_mean_is_the_splits_loss_at_that_context():
    model, toks = tiny_model(), tokens(200)
    curve = long_context.loss_by_position(model, toks, window=16, batch_size=3)
    whole = evaluate_split(model, toks, seq_len=16, batch_size=3)
    assert curve["windows"] == (200 - 1) // 16
    assert curve["loss"].mean() == pytest.approx(whole["loss"], abs=1e-5)
    first = long_context.loss_by_position(model, toks, window=16, max_windows=2)
    assert first["windows"] == 2 and not np.allclose(first["loss"], curve["loss"])


def test_a_learned_position_model_refuses_windows_past_its_table():
    with pytest.raises(ValueError, match="max_seq_len=16"):
        long_context.loss_by_position(tiny_model(max_seq_len=16), tokens(100), window=32)
    with pytest.raises(ValueError, match="window=0"):
        long_context.loss_by_position(tiny_model(), tokens(100), window=0)


def test_the_model_is_left_in_the_mode_it_was_in():
    model = tiny_model()
    model.train()
    long_context.loss_by_position(model, tokens(50), window=8)
    assert model.training


def tiny_run(seed: int = 0) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=32)
    return nl.TrainConfig(model=model, batch_size=2, seq_len=16, max_steps=2, lr=1e-3, warmup_steps=1,
                          eval_interval=2, eval_batches=1, progress=False, device="cpu", seed=seed)


def test_curves_are_kept_beside_the_record_and_read_back_without_the_weights(tmp_path):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    record = nl.run(tiny_run(), store=store, checkpoints=ckpt)
    computed = long_context.position_curves(record, [16, 32], max_windows=3, store=store, checkpoints=ckpt)
    assert list(computed.groupby("window").size()) == [16, 32]
    assert set(computed["windows"]) == {3} and set(computed["seed"]) == {0}
    assert not long_context.positions_missing(record, [16, 32], max_windows=3, store=store)
    assert long_context.positions_missing(record, [16], max_windows=None, store=store)
    checkpoint_path(record.config_hash, ckpt).unlink()
    read_back = long_context.position_curves(record, [16, 32], max_windows=3, store=store, checkpoints=ckpt)
    pd.testing.assert_frame_equal(read_back, computed, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="need_checkpoint=True"):
        long_context.position_curves(record, [8], max_windows=3, store=store, checkpoints=ckpt)
    with pytest.raises(ValueError, match="'train'"):
        long_context.position_curves(record, [16], split="train", store=store, checkpoints=ckpt)


def test_arm_curves_retrain_only_a_run_that_has_neither_stored_curves_nor_weights(tmp_path, monkeypatch):
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    a = nl.run(tiny_run(seed=0), store=store, checkpoints=ckpt)
    b = nl.run(tiny_run(seed=1), store=store, checkpoints=ckpt)
    first = long_context.arm_position_curves([("a", a)], [16], max_windows=2, store=store, checkpoints=ckpt,
                                             isolate=False)
    for record in (a, b):
        checkpoint_path(record.config_hash, ckpt).unlink()
    trained = []
    original = run_store.train_into_store
    monkeypatch.setattr(run_store, "train_into_store", lambda tc, *args, **kw: trained.append(tc.config_hash())
                        or original(tc, *args, **kw))
    both = long_context.arm_position_curves([("a", a), ("b", b)], [16], max_windows=2, store=store,
                                            checkpoints=ckpt, isolate=False)
    assert trained == [b.config_hash]  # a's curve is stored; b had neither curve nor weights
    assert list(both["arm"].unique()) == ["a", "b"]
    pd.testing.assert_frame_equal(both[both["arm"] == "a"].reset_index(drop=True), first)
    assert not long_context.positions_missing(b, [16], max_windows=2, store=store)


def test_curves_of_a_run_retrained_elsewhere_stay_out_of_the_committed_store(tmp_path):
    """On another kind of CPU the retraining for weights ends elsewhere: its curves go to the side
    store with its record; the committed store's record stays byte for byte and gets no evaluations."""
    from conftest import as_if_trained_elsewhere
    from nodelm_lib.runs.store import evaluations_path, record_path, weights_store

    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    record = nl.run(tiny_run(), store=store, checkpoints=ckpt)
    path = record_path(store, record.config_hash)
    stored = as_if_trained_elsewhere(path)
    committed = path.read_bytes()
    checkpoint_path(record.config_hash, ckpt).unlink()  # a clone: no weights, no stored curve
    curves = long_context.arm_position_curves([("a", stored)], [16], max_windows=2, store=store, checkpoints=ckpt,
                                              isolate=False)
    assert path.read_bytes() == committed and not evaluations_path(store, record.config_hash).exists()
    assert evaluations_path(weights_store(ckpt), record.config_hash).exists()
    again = long_context.position_curves(nl.run(tiny_run(), store, ckpt, need_checkpoint=True), [16], max_windows=2,
                                         store=store, checkpoints=ckpt)
    pd.testing.assert_frame_equal(again.assign(arm="a"), curves)


@pytest.mark.parametrize("context, longest, bands", [
    (256, 4096, [(0, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096)]),
    (3, 10, [(0, 3), (3, 6), (6, 10)]),
    (8, 8, [(0, 8)]),
    (8, 5, [(0, 5)]),
])
def test_context_bands_double_from_the_training_context(context, longest, bands):
    assert long_context.context_bands(context, longest) == bands


def synthetic_curves(context: int = 4, longest: int = 16) -> pd.DataFrame:
    """Arm "uses" loses 0.1 nats per band past the context, arm "breaks" gains 0.2; seed s adds 0.01 s."""
    rows = []
    for arm, slope in (("uses", -0.1), ("breaks", 0.2)):
        for seed in range(3):
            for p in range(longest):
                band = 0 if p < context else int(np.log2(p // context)) + 1
                rows.append({"arm": arm, "seed": seed, "config_hash": f"{arm}{seed}", "window": longest,
                             "position": p, "loss": 2.0 + slope * band + 0.01 * seed * band, "windows": 5})
    return pd.DataFrame(rows)


def test_the_table_reports_each_band_and_the_paired_change_past_the_context():
    table = long_context.long_context_table(synthetic_curves(), train_context=4).set_index(["arm", "band"])
    assert list(table.loc["uses"].index) == ["[0, 4)", "[4, 8)", "[8, 16)", "change [8, 16) - [0, 4)"]
    assert table.loc[("uses", "[0, 4)"), "mean"] == pytest.approx(2.0)
    assert table.loc[("uses", "[0, 4)"), "ci_half"] == pytest.approx(0.0, abs=1e-12)
    # the last band is two bands past the context: -0.2 + 0.02 s, s = 0, 1, 2
    change = table.loc[("uses", "change [8, 16) - [0, 4)")]
    assert change["mean"] == pytest.approx(-0.2 + 0.02)
    values = np.array([-0.2, -0.18, -0.16])
    from scipy import stats
    assert change["ci_half"] == pytest.approx(stats.t.ppf(0.975, 2) * values.std(ddof=1) / np.sqrt(3))
    assert table.loc[("breaks", "change [8, 16) - [0, 4)"), "mean"] == pytest.approx(0.4 + 0.02)
    assert (table["n"] == 3).all()


def test_position_bins_cover_every_position_once():
    for length in (1, 2, 7, 256, 4096):
        bins = position_bins(length)
        covered = [p for lo, hi in bins for p in range(lo, hi)]
        assert covered == list(range(length))
    assert position_bins(4096)[0] == (0, 1) and len(position_bins(4096)) < 60


def test_the_figure_marks_the_training_context_on_a_log_axis():
    curves = synthetic_curves().replace({"arm": {"uses": "ti_ssm", "breaks": "gpt"}})  # arms: their colours
    fig = long_context_figure(curves, train_context=4, order=["ti_ssm", "gpt"])
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["ti_ssm", "gpt"]
    assert any(line.get_xdata()[0] == 4 for line in ax.get_lines()[2:])  # the dashed training-context line
    (described,) = axes_description(fig)
    assert described["xlabel"] and described["ylabel"] and "16" in described["title"]


def test_the_claim_tests_are_scipys_paired_t_with_holm_over_every_claim():
    from scipy import stats

    rng = np.random.default_rng(9)
    rows = []
    for arm, slope in (("gpt", 0.3), ("ssm", 0.1), ("ti_ssm", 0.12)):
        for seed in range(4):
            noise = rng.normal(0, 0.02, 16)
            for p in range(16):
                band = 0 if p < 4 else int(np.log2(p // 4)) + 1
                rows.append({"arm": arm, "seed": seed, "config_hash": f"{arm}{seed}", "window": 16, "position": p,
                             "loss": 2.0 + slope * band + noise[p], "windows": 5})
    curves = pd.DataFrame(rows)
    comparisons = long_context.claim_comparisons(["gpt", "ssm", "ti_ssm"], "gpt")
    assert comparisons == [("change", "ssm", "gpt"), ("change", "ti_ssm", "gpt"), ("change", "ti_ssm", "ssm"),
                           ("last band", "ti_ssm", "gpt"), ("trained band", "ti_ssm", "gpt")]
    tests = long_context.claim_tests(curves, 4, comparisons)
    assert list(zip(tests["quantity"], tests["arm"], tests["reference"])) == comparisons
    per_run = long_context.seed_quantities(curves, 4).set_index(["quantity", "arm", "seed"])["loss"]
    raw = []
    for (quantity, arm, reference), (_, row) in zip(comparisons, tests.iterrows()):
        a, b = per_run.loc[(quantity, arm)].to_numpy(), per_run.loc[(quantity, reference)].to_numpy()
        ref = stats.ttest_rel(a, b)
        assert row["mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-9)
        assert row["p_t"] == pytest.approx(ref.pvalue, rel=1e-9)
        raw.append(ref.pvalue)
    order = np.argsort(raw)
    expected = np.minimum(1, np.maximum.accumulate((len(raw) - np.arange(len(raw))) * np.array(raw)[order]))
    assert tests["p_t_holm"].to_numpy()[order] == pytest.approx(expected, rel=1e-9)
    # the known truth: ssm degrades 2 x (0.3 - 0.1) = 0.4 nats less than gpt over two bands past the context
    change = tests.set_index(["quantity", "arm", "reference"]).loc[("change", "ssm", "gpt")]
    assert change["mean_diff"] == pytest.approx(-0.4, abs=0.05) and change["verdict"] == "better"
    assert tests.loc[0, "label"] == "change [8, 16) - [0, 4)"


def test_a_claim_on_an_unknown_quantity_or_reference_is_refused():
    with pytest.raises(ValueError, match="unknown quantity"):
        long_context.claim_tests(synthetic_curves(), 4, [("peak", "uses", "breaks")])
    with pytest.raises(ValueError, match="reference 'gpt' is not one of the arms"):
        long_context.claim_comparisons(["uses", "breaks"], "gpt")
