"""nodelm_lib.experiments.ngram: add-k n-gram models against hand-computed probabilities, k
chosen on validation only, input errors, and the real tiny-shakespeare numbers."""

import math
from fractions import Fraction as F

import numpy as np
import pandas as pd
import pytest

from nodelm_lib.experiments import ngram as bl
from nodelm_lib.data import sources

# toy text for the hand computations: V = 3, k = 1
TOY = np.array([0, 1, 0, 1, 2])
V = 3


def fitted(n, k=1.0, tokens=TOY, vocab_size=V):
    return bl.NGramModel(n, vocab_size, k).fit(tokens)


def nll(*probs):
    """Mean -log of exact fractions."""
    return sum(-math.log(p) for p in probs) / len(probs)


# ---------------------------------------------------------------------- hand-checked


def test_unigram_by_hand():
    # counts in TOY: 0 -> 2, 1 -> 2, 2 -> 1; N = 5. P(w) = (count(w) + 1) / (5 + 3)
    p0, p1, p2 = F(2 + 1, 5 + 3), F(2 + 1, 5 + 3), F(1 + 1, 5 + 3)
    assert (p0, p1, p2) == (F(3, 8), F(3, 8), F(1, 4))
    m = fitted(1)
    assert m.prob((), 0) == pytest.approx(float(p0))
    assert m.probs() == pytest.approx([float(p0), float(p1), float(p2)])
    # scores every token (no context): [2, 0] -> -(log P(2) + log P(0)) / 2
    assert m.mean_nll([2, 0]) == pytest.approx(nll(p2, p0))
    assert m.n_scored([2, 0]) == 2 and m.n_train == 5


def test_bigram_by_hand():
    # bigrams of TOY: (0,1) (1,0) (0,1) (1,2)
    # context counts: count(0) = 2, count(1) = 2 (the final 2 has no successor: not counted)
    p1_0 = F(2 + 1, 2 + 3)  # count(0,1) = 2
    p2_1 = F(1 + 1, 2 + 3)  # count(1,2) = 1
    p0_1 = F(1 + 1, 2 + 3)  # count(1,0) = 1
    p0_2 = F(0 + 1, 0 + 3)  # context 2 never seen: uniform
    assert (p1_0, p2_1, p0_2) == (F(3, 5), F(2, 5), F(1, 3))
    m = fitted(2)
    assert m.prob([0], 1) == pytest.approx(float(p1_0))
    assert m.prob([1], 2) == pytest.approx(float(p2_1))
    assert m.prob([1], 0) == pytest.approx(float(p0_1))
    assert m.prob([2], 0) == pytest.approx(float(p0_2))
    # [0, 1, 2, 0] scores positions 1..3: P(1|0) P(2|1) P(0|2)
    seq = [0, 1, 2, 0]
    assert m.mean_nll(seq) == pytest.approx(nll(p1_0, p2_1, p0_2))
    assert m.evaluate(seq) == {"loss": pytest.approx(nll(p1_0, p2_1, p0_2)), "tokens": 3}


def test_trigram_by_hand():
    # trigrams of TOY: (0,1,0) (1,0,1) (0,1,2); context (0,1) seen twice
    p0_01 = F(1 + 1, 2 + 3)
    p1_01 = F(0 + 1, 2 + 3)
    p2_01 = F(1 + 1, 2 + 3)
    p1_10 = F(1 + 1, 1 + 3)  # context (1,0) once, followed by 1
    p0_12 = F(0 + 1, 0 + 3)  # context (1,2) never seen
    m = fitted(3)
    assert m.probs([0, 1]) == pytest.approx([float(p0_01), float(p1_01), float(p2_01)])
    assert m.prob([1, 0], 1) == pytest.approx(float(p1_10))
    # [0, 1, 2, 0] scores positions 2, 3: P(2|0,1) P(0|1,2)
    assert m.mean_nll([0, 1, 2, 0]) == pytest.approx(nll(p2_01, p0_12))
    assert m.n_scored([0, 1, 2, 0]) == 2


def test_k_enters_the_formula():
    # bigram P(1|0) with k = 0.5: (2 + 0.5) / (2 + 0.5 * 3)
    m = fitted(2, k=0.5)
    assert m.prob([0], 1) == pytest.approx(float(F(5, 2) / F(7, 2)))
    # k passed to mean_nll overrides the model's k without refitting
    assert m.mean_nll([0, 1], k=1.0) == pytest.approx(-math.log(3 / 5))
    assert m.mean_nll([0, 1]) == pytest.approx(-math.log(5 / 7))


def test_log_probs_match_probs_table():
    rng = np.random.default_rng(0)
    train, seq = rng.integers(0, 5, 300), rng.integers(0, 5, 40)
    m = bl.NGramModel(3, 5, 0.1).fit(train)
    expect = [math.log(m.prob(seq[i - 2:i], seq[i])) for i in range(2, len(seq))]
    assert m.log_probs(seq) == pytest.approx(expect)


# ---------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("n,contexts", [
    (1, [()]),
    (2, [[0], [1], [2]]),
    (3, [[0, 1], [1, 0], [1, 2], [2, 2]]),  # (1,2) and (2,2) unseen
])
@pytest.mark.parametrize("k", [1e-3, 1.0, 7.0])
def test_every_context_sums_to_one(n, contexts, k):
    m = fitted(n, k)
    for c in contexts:
        p = m.probs(c)
        assert p.shape == (V,) and (p > 0).all()
        assert p.sum() == pytest.approx(1.0)


def test_unseen_context_is_uniform():
    train = np.random.default_rng(1).integers(0, 10, 500)
    train[train == 7] = 0  # 7 never appears, so no context contains it
    m = bl.NGramModel(3, 10, 0.01).fit(train)
    assert m.probs([7, 7]) == pytest.approx(np.full(10, 0.1))
    assert m.probs([3, 7]) == pytest.approx(np.full(10, 0.1))
    assert not np.allclose(m.probs([3, 3]), 0.1)  # a seen context is not


def test_vocab_256_trigram_on_large_ids():
    # ids near the top of the vocabulary must encode and decode without collisions
    train = np.array([255, 254, 255, 254, 0, 255], dtype=np.uint16)
    m = bl.NGramModel(3, 256, 1.0).fit(train)
    assert m.prob([255, 254], 255) == pytest.approx((1 + 1) / (2 + 256))
    assert m.prob([255, 254], 0) == pytest.approx((1 + 1) / (2 + 256))
    assert m.prob([254, 255], 254) == pytest.approx((1 + 1) / (1 + 256))
    assert m.probs([254, 255]).sum() == pytest.approx(1.0)


# ---------------------------------------------------------------------- choosing k

PATTERN = np.tile([0, 1, 2, 3], 200)  # deterministic: bigram P(next|prev) = 1 in train
NOISE = np.random.default_rng(2).integers(0, 8, 800)  # uniform over V = 8


def test_small_k_chosen_when_validation_follows_the_counts():
    rows = bl.fit_ngram_baselines(PATTERN, PATTERN[:100], NOISE, vocab_size=8,
                                  orders=(2,), k_grid=(100.0, 1e-3, 1.0))
    (row,) = rows
    assert row["k"] == 1e-3 and row["model"] == "bigram" and row["n"] == 2
    assert row["val_loss"] == pytest.approx(
        bl.NGramModel(2, 8, 1e-3).fit(PATTERN).mean_nll(PATTERN[:100]))


def test_k_depends_on_validation_not_test():
    grid = (1e-3, 1.0, 100.0)
    # validation that ignores the training counts wants a large k ...
    noisy_val = bl.fit_ngram_baselines(PATTERN, NOISE, PATTERN, 8, (2,), grid)[0]
    assert noisy_val["k"] == 100.0
    # ... even though this test split would have preferred the smallest one
    assert bl.NGramModel(2, 8, 1e-3).fit(PATTERN).mean_nll(PATTERN) < noisy_val["test_loss"]
    # changing only the test split changes test_loss but never k or val_loss
    a = bl.fit_ngram_baselines(PATTERN, PATTERN[:100], PATTERN, 8, (1, 2, 3), grid)
    b = bl.fit_ngram_baselines(PATTERN, PATTERN[:100], NOISE, 8, (1, 2, 3), grid)
    for ra, rb in zip(a, b):
        assert ra["k"] == rb["k"] and ra["val_loss"] == rb["val_loss"]
        assert ra["test_loss"] < rb["test_loss"]
    assert [r["k"] for r in a][1:] == [1e-3, 1e-3]


def test_rows_and_token_counts():
    rows = bl.fit_ngram_baselines(PATTERN, NOISE[:50], NOISE[:60], 8, orders=(1, 2, 3, 5))
    assert [r["model"] for r in rows] == ["unigram", "bigram", "trigram", "5-gram"]
    assert set(rows[0]) == {"model", "n", "k", "val_loss", "test_loss", "val_tokens",
                            "test_tokens", "train_tokens"}
    for r in rows:
        n = r["n"]
        assert r["val_tokens"] == 50 - (n - 1) and r["test_tokens"] == 60 - (n - 1)
        assert r["train_tokens"] == len(PATTERN) - (n - 1)
        assert r["k"] in bl.DEFAULT_K_GRID


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True])
def test_bad_order(n):
    with pytest.raises(ValueError, match=r"order must be an integer >= 1.*got"):
        bl.NGramModel(n, 3)
    with pytest.raises(ValueError, match="order must be an integer >= 1"):
        bl.fit_ngram_baselines(TOY, TOY, TOY, 3, orders=(1, n))


@pytest.mark.parametrize("k", [0, -0.5, float("nan"), float("inf")])
def test_bad_k(k):
    with pytest.raises(ValueError, match=r"k must be a finite number > 0, got"):
        bl.NGramModel(2, 3, k)
    with pytest.raises(ValueError, match="k must be a finite number > 0"):
        bl.fit_ngram_baselines(TOY, TOY, TOY, 3, k_grid=(0.1, k))
    with pytest.raises(ValueError, match="k must be a finite number > 0"):
        fitted(2).mean_nll(TOY, k=k)


def test_ids_out_of_range():
    with pytest.raises(ValueError, match=r"token id 3 outside the valid range \[0, 3\)"):
        bl.NGramModel(2, 3).fit([0, 1, 3])
    with pytest.raises(ValueError, match=r"token id -1 outside the valid range \[0, 3\)"):
        bl.NGramModel(2, 3).fit([0, -1, 2])
    with pytest.raises(ValueError, match=r"^validation has token id 5"):  # names the split
        bl.fit_ngram_baselines(TOY, np.array([0, 5]), TOY, 3)
    with pytest.raises(ValueError, match=r"^test split has 2 tokens, fewer than .* n=3"):
        bl.fit_ngram_baselines(TOY, TOY, np.array([0, 1]), 3)
    with pytest.raises(ValueError, match=r"token id 9"):
        fitted(2).probs([9])


def test_bad_shapes_and_short_splits():
    with pytest.raises(ValueError, match=r"1-D .* got shape \(2, 2\)"):
        bl.NGramModel(2, 3).fit(np.zeros((2, 2), dtype=int))
    with pytest.raises(ValueError, match="integer token ids, got dtype float64"):
        bl.NGramModel(2, 3).fit(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"has 2 tokens, fewer than the order n=3"):
        bl.NGramModel(3, 3).fit([0, 1])
    with pytest.raises(ValueError, match=r"has 2 tokens, fewer than the order n=3"):
        fitted(3).mean_nll([0, 1])
    with pytest.raises(ValueError, match=r"context must have n-1 = 2 ids, got 1"):
        fitted(3).probs([0])
    with pytest.raises(RuntimeError, match="not fitted"):
        bl.NGramModel(2, 3).mean_nll(TOY)
    with pytest.raises(ValueError, match="does not fit int64"):
        bl.NGramModel(5, 50257)


# ---------------------------------------------------------------------- real data


def test_tinyshakespeare_char(monkeypatch, tmp_path):
    def no_hub(*args):
        raise ConnectionError("hub unreachable (patched in tests): offline data not found")

    monkeypatch.setattr(sources, "_open_hub", no_hub)  # the offline copy or nothing
    monkeypatch.setenv("NODELM_CACHE_DIR", str(tmp_path))  # keep the token cache out of the repo
    df = bl.ngram_baselines("tinyshakespeare", "char")
    assert isinstance(df, pd.DataFrame)
    assert list(df["model"]) == ["unigram", "bigram", "trigram"]
    uni, bi, tri = df["val_loss"]
    assert uni > bi > tri
    assert 1.8 < df["test_loss"].iloc[2] < 2.4
    assert list(df["val_tokens"]) == [55_770, 55_769, 55_768]
    assert list(df["train_tokens"]) == [1_003_854, 1_003_853, 1_003_852]
    assert df["val_loss"].iloc[0] < math.log(256)  # better than uniform over bytes
