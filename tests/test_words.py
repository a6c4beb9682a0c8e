"""Perplexity per word for subword runs: the word count (WikiText's convention), the arithmetic,
the table column, and TensorBoard's scalars."""

from __future__ import annotations

import math

import pytest

import nodelm_lib as nl
from nodelm_lib.data import words
from nodelm_lib.runs.records import record_row
from nodelm_lib.training.evaluation import with_tokenizer_vocab
from nodelm_lib.training.record import RunRecord


def test_words_are_whitespace_words_plus_one_end_of_line_per_line():
    # "a b c" 3 + 1, "" 0 + 1, " d  e " 2 + 1
    assert words.count_words("a b c\n\n d  e \n") == 8
    assert words.count_words("") == 0


def test_wikitext2_has_its_published_word_counts(shared_dir):
    # the word-level WikiText-2 sizes (Merity et al. 2016): validation 217,646, test 245,569
    assert words.split_words("wikitext2", "validation") == 217_646
    assert words.split_words("wikitext2", "test") == 245_569


def test_word_perplexity_rescales_the_loss_per_token_to_per_word():
    assert words.word_perplexity(2.0, 3, 2) == pytest.approx(math.exp(3.0))
    with pytest.raises(ValueError, match="words=0"):
        words.word_perplexity(2.0, 3, 0)


def record(tokenizer: str, eval_on: str, loss: float = 3.0, tokens: int = 300_000) -> RunRecord:
    tc = with_tokenizer_vocab(nl.TrainConfig(dataset="wikitext2", tokenizer=tokenizer, eval_on=eval_on))
    return RunRecord(config=nl.config.to_dict(tc), config_hash=tc.config_hash(), seed=tc.seed, status="completed",
                     final={"val_loss": loss, "test_loss": loss, "train_loss": loss, "val_tokens": tokens,
                            "test_tokens": tokens})


def test_a_subword_runs_table_row_has_perplexity_per_word(shared_dir):
    row = record_row(record("gpt2", "whole_split"))
    assert row["test_word_ppl"] == pytest.approx(math.exp(3.0 * 300_000 / 245_569))
    assert row["val_word_ppl"] == pytest.approx(math.exp(3.0 * 300_000 / 217_646))
    assert row["test_word_ppl"] == pytest.approx(record_row(record("gpt2", "whole_split_at_end"))["test_word_ppl"])
    assert math.isnan(record_row(record("gpt2", "batches"))["test_word_ppl"])  # sampled windows: no word count
    assert math.isnan(record_row(record("char", "whole_split"))["test_word_ppl"])  # per character already


def test_the_ngram_references_are_in_the_units_of_the_runs_rows(shared_dir, monkeypatch, tmp_path):
    """A subword corpus's n-gram rows carry perplexity per word over the split's words, as a run's
    row does; a character corpus's have none (per character already)."""
    from nodelm_lib.experiments.ngram import ngram_baselines

    monkeypatch.setenv("NODELM_CACHE_DIR", str(tmp_path))  # keep the token cache out of the repo
    unigram = ngram_baselines("wikitext2", "gpt2", orders=(1,), k_grid=(1.0,)).iloc[0]
    assert unigram["test_word_ppl"] == pytest.approx(math.exp(unigram["test_loss"] * unigram["test_tokens"] / 245_569))
    assert unigram["val_word_ppl"] == pytest.approx(math.exp(unigram["val_loss"] * unigram["val_tokens"] / 217_646))
    assert unigram["test_ppl"] == pytest.approx(math.exp(unigram["test_loss"]))
    assert unigram["test_word_ppl"] > unigram["test_ppl"]  # more than one GPT-2 token per word
    char = ngram_baselines("tinyshakespeare", "char", orders=(1,), k_grid=(1.0,)).iloc[0]
    assert math.isnan(char["test_word_ppl"])
    assert char["test_bits_per_token"] == pytest.approx(char["test_loss"] / math.log(2))


def test_tensorboard_gets_perplexity_beside_the_loss(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = nl.ModelConfig(d_model=32, n_heads=4, n_layers=1, max_seq_len=32)
    nl.train(nl.TrainConfig(model=model, dataset="tinyshakespeare", batch_size=4, seq_len=32, max_steps=2,
                            eval_interval=2, eval_batches=1, progress=False, log_dir=str(tmp_path)))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    loss, ppl = (events.Scalars(tag)[-1].value for tag in ("val/loss", "val/perplexity"))
    assert ppl == pytest.approx(math.exp(loss), rel=1e-5)
    assert "val/word_perplexity" not in events.Tags()["scalars"]  # a character run: per character already
