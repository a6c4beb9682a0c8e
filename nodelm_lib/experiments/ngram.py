"""Add-k smoothed n-gram count models: the "unigram / bigram / trigram" reference rows
printed next to trained language models.

An order-n model predicts token w from its context c, the previous n-1 tokens:

    P(w | c) = (count(c, w) + k) / (count(c) + k V)

where count(c, w) is how often the n-gram (c, w) occurs in the training split,
count(c) = sum_w count(c, w) is how often c occurs as a context, V is the vocabulary
size and k > 0 the smoothing constant. For n = 1 the context is empty and count(c) is
N, the number of training tokens. Every context's probabilities sum to 1 over the
vocabulary, and an unseen context gets the uniform 1/V.

The loss is the mean negative log-likelihood in nats per token, scored on every token
from position n-1 on (its context is the previous n-1 tokens of the same split), so a
split of length L scores L - (n - 1) tokens. k is chosen from a grid by validation
loss and the test split is only ever scored with that k.

    rows = fit_ngram_baselines(train, validation, test, vocab_size=256)
    df = ngram_baselines("tinyshakespeare", "char")

Counting is numpy only: each n-gram is encoded as one int64 (base-V digits), counted
with np.unique and looked up with np.searchsorted, so memory grows with the number of
distinct n-grams seen, never with V^n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nodelm_lib import data
from nodelm_lib.runs.records import loss_units

# spans "trust the counts" (tiny k, good for long contexts on big data) to "nearly
# uniform" (k >> 1); the best k for char-level trigrams sits in the middle.
DEFAULT_K_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)

ORDER_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}

_INT64_MAX = np.iinfo(np.int64).max


def order_name(n: int) -> str:
    """"unigram", "bigram", "trigram", then "4-gram", "5-gram", ..."""
    return ORDER_NAMES.get(n, f"{n}-gram")


@dataclass
class NGramModel:
    """Add-k smoothed n-gram model of order ``n`` over ids ``0 .. vocab_size - 1``.

        m = NGramModel(n=3, vocab_size=256, k=0.01).fit(train)
        m.mean_nll(validation), m.n_scored(validation)
    """

    n: int
    vocab_size: int
    k: float = 1.0
    # fitted state: sorted n-gram codes with counts, sorted context codes with counts
    _grams: np.ndarray | None = field(default=None, init=False, repr=False)
    _gram_counts: np.ndarray | None = field(default=None, init=False, repr=False)
    _ctxs: np.ndarray | None = field(default=None, init=False, repr=False)
    _ctx_counts: np.ndarray | None = field(default=None, init=False, repr=False)
    n_train: int = field(default=0, init=False)  # n-grams counted: len(train) - (n - 1)

    def __post_init__(self):
        _check_order(self.n)
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, (int, np.integer)) \
                or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {self.vocab_size!r}")
        # codes are base-V numbers with n digits; they must fit in int64
        if self.vocab_size ** self.n > _INT64_MAX:
            raise ValueError(
                f"order n={self.n} with vocab_size={self.vocab_size} does not fit int64 "
                f"n-gram codes (V^n > 2^63 - 1); use a smaller n")
        _check_k(self.k)

    # ------------------------------------------------------------------ counting

    def fit(self, tokens) -> "NGramModel":
        """Count every n-gram of ``tokens`` (the training split). Returns self."""
        codes = self._codes(tokens, "train")
        self._grams, self._gram_counts = np.unique(codes, return_counts=True)
        # count(c) is the marginal of the n-gram counts (not the (n-1)-gram count over
        # the whole split, which also counts the last context that has no successor);
        # that is what makes each context's probabilities sum to exactly 1.
        # codes // V drops the last digit; codes are sorted so the contexts are too.
        ctx = self._grams // self.vocab_size
        self._ctxs, start = np.unique(ctx, return_index=True)
        self._ctx_counts = np.add.reduceat(self._gram_counts, start)
        self.n_train = len(codes)
        return self

    def _codes(self, tokens, what: str) -> np.ndarray:
        """int64 code of the n-gram ending at each position n-1 .. L-1 of ``tokens``."""
        t = check_tokens(tokens, self.vocab_size, what)
        if len(t) < self.n:
            raise ValueError(
                f"{what} split has {len(t)} tokens, fewer than the order n={self.n}: "
                f"an order-{self.n} model needs at least {self.n} tokens")
        t = t.astype(np.int64)
        m = len(t) - (self.n - 1)
        codes = np.zeros(m, dtype=np.int64)
        for j in range(self.n):  # loop over the n digits, not over tokens
            codes = codes * self.vocab_size + t[j:j + m]
        return codes

    # ------------------------------------------------------------------ scoring

    def _require_fit(self):
        if self._grams is None:
            raise RuntimeError("NGramModel is not fitted: call fit(train_tokens) first")

    def _log_probs_of_codes(self, codes: np.ndarray, k: float) -> np.ndarray:
        joint = _lookup(self._grams, self._gram_counts, codes)
        ctx = _lookup(self._ctxs, self._ctx_counts, codes // self.vocab_size)
        return np.log(joint + k) - np.log(ctx + k * self.vocab_size)

    def log_probs(self, tokens, k: float | None = None) -> np.ndarray:
        """log P(tokens[i] | previous n-1 tokens) for i = n-1 .. L-1 (natural log)."""
        self._require_fit()
        k = self.k if k is None else _check_k(k)
        return self._log_probs_of_codes(self._codes(tokens, "scored"), k)

    def mean_nll(self, tokens, k: float | None = None) -> float:
        """Mean negative log-likelihood in nats per token over ``n_scored(tokens)``
        tokens. ``k`` overrides the model's smoothing (the counts do not depend on it)."""
        return float(-self.log_probs(tokens, k).mean())

    def n_scored(self, tokens) -> int:
        """How many tokens ``mean_nll`` averages over: len(tokens) - (n - 1)."""
        return len(tokens) - (self.n - 1)

    def evaluate(self, tokens, k: float | None = None) -> dict:
        """``{"loss": mean_nll, "tokens": n_scored}`` for one split."""
        return {"loss": self.mean_nll(tokens, k), "tokens": self.n_scored(tokens)}

    def probs(self, context=()) -> np.ndarray:
        """The full distribution P(. | context) over the vocabulary, shape (V,).
        ``context`` is the n-1 previous ids (empty for a unigram)."""
        self._require_fit()
        ctx = check_tokens(np.asarray(context, dtype=np.int64).reshape(-1), self.vocab_size,
                           "context")
        if len(ctx) != self.n - 1:
            raise ValueError(f"context must have n-1 = {self.n - 1} ids, got {len(ctx)}")
        code = 0
        for c in ctx:
            code = code * self.vocab_size + int(c)
        codes = code * self.vocab_size + np.arange(self.vocab_size, dtype=np.int64)
        return np.exp(self._log_probs_of_codes(codes, self.k))

    def prob(self, context, w: int) -> float:
        """P(w | context)."""
        return float(self.probs(context)[w])


def _lookup(keys: np.ndarray, counts: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """counts[keys == q] for each query, 0 where q was never seen (keys are sorted)."""
    idx = np.searchsorted(keys, queries)
    idx = np.minimum(idx, len(keys) - 1)  # a query past the last key is a miss, not an error
    hit = keys[idx] == queries
    return np.where(hit, counts[idx], 0).astype(np.float64)


# ---------------------------------------------------------------------- validation


def _check_order(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n-gram order must be an integer >= 1 (1 = unigram, 2 = bigram, "
                         f"3 = trigram, ...), got {n!r}")
    return int(n)


def _check_k(k) -> float:
    if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)) \
            or not math.isfinite(k) or k <= 0:
        raise ValueError(f"smoothing k must be a finite number > 0, got {k!r}")
    return float(k)


def check_tokens(tokens, vocab_size: int, what: str = "tokens") -> np.ndarray:
    """``tokens`` as a 1-D integer array with every id in [0, vocab_size)."""
    t = np.asarray(tokens)
    if t.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of token ids, got shape {t.shape}")
    if t.size and not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {t.dtype}")
    if t.size:
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{what} has token id {bad} outside the valid range "
                             f"[0, {vocab_size}) for vocab_size={vocab_size}")
    return t


# ---------------------------------------------------------------------- tables


def fit_ngram_baselines(train, validation, test, vocab_size: int, orders=(1, 2, 3),
                        k_grid=DEFAULT_K_GRID) -> list[dict]:
    """One row per order: the add-k model fitted on ``train`` with the k of ``k_grid``
    that has the lowest validation loss (ties: the first in the grid), then scored on
    ``test`` with that k. Rows hold model, n, k, val_loss, test_loss (nats per token),
    val_tokens, test_tokens, train_tokens (positions scored / counted: len - (n-1))."""
    orders = [_check_order(n) for n in orders]
    if not orders:
        raise ValueError("orders is empty; give at least one order, e.g. (1, 2, 3)")
    k_grid = [_check_k(k) for k in (DEFAULT_K_GRID if k_grid is None else k_grid)]
    if not k_grid:
        raise ValueError("k_grid is empty; give at least one k > 0")
    # check the splits up front so that an error names the split it is about
    for what, split in (("train", train), ("validation", validation), ("test", test)):
        t = check_tokens(split, vocab_size, what)
        if len(t) < max(orders):
            raise ValueError(f"{what} split has {len(t)} tokens, fewer than the largest "
                             f"order n={max(orders)}")
    rows = []
    for n in orders:
        model = NGramModel(n, vocab_size).fit(train)
        # the counts are fixed, so trying a k is just one more scoring pass
        val_losses = [model.mean_nll(validation, k) for k in k_grid]
        best = int(np.argmin(val_losses))  # chosen on validation only; test never looks
        model.k = k_grid[best]
        rows.append({
            "model": order_name(n), "n": n, "k": model.k,
            "val_loss": val_losses[best], "test_loss": model.mean_nll(test),
            "val_tokens": model.n_scored(validation), "test_tokens": model.n_scored(test),
            "train_tokens": model.n_train,
        })
    return rows


def ngram_baselines(dataset: str, tokenizer: str, orders=(1, 2, 3), k_grid=None,
                    data_dir=None) -> pd.DataFrame:
    """``fit_ngram_baselines`` on a corpus's train / validation / test splits, as a
    DataFrame: ``ngram_baselines("tinyshakespeare", "char")``. Each split's loss is also given
    in the units of a trained run's row (``records.loss_units``: perplexity, bits per token and,
    for a subword tokenizer, perplexity per word), so that the references fill the same columns."""
    splits = [data.load_tokens(dataset, s, tokenizer, data_dir=data_dir)
              for s in ("train", "validation", "test")]
    vocab_size = data.get_tokenizer(tokenizer, data_dir=data_dir).vocab_size
    rows = fit_ngram_baselines(*splits, vocab_size=vocab_size, orders=orders, k_grid=k_grid)
    for row in rows:
        for split in ("val", "test"):  # every token of the split is scored: whole splits
            row.update(loss_units(split, row[f"{split}_loss"], row[f"{split}_tokens"], dataset, tokenizer))
    return pd.DataFrame(rows)
