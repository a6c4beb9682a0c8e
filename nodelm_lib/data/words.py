"""Words of a split, for word-level perplexity: how subword models are compared with the
word-level literature on WikiText (e.g. GPT-2 small's zero-shot 29.41 on WikiText-2).

A model's loss is in nats per token of its own tokenizer, which no other tokenizer shares. Per
word it is not: word-level perplexity = exp(total NLL / words), with total NLL = mean loss x
tokens scored. Words are counted as the word-level WikiText benchmarks count them: the
whitespace-separated words of each line plus one end-of-line per line (``<eos>``), which gives
the published sizes of WikiText-2 (v1, tokenised): 2,088,628 / 217,646 / 245,569 words in
train / validation / test. The count is only meaningful for a loss over the whole split
(``eval_on="whole_split"``): a loss over sampled windows has no word count.
"""

from __future__ import annotations

import functools
import math

from .sources import load_text


def count_words(text: str) -> int:
    """Whitespace-separated words per line plus one end-of-line per line (module docstring)."""
    return sum(len(line.split()) + 1 for line in text.splitlines())


@functools.lru_cache(maxsize=None)
def split_words(corpus: str, split: str, variant: str | None = None) -> int:
    """``count_words`` of one split of a corpus (read whole: meant for validation and test)."""
    return count_words(load_text(corpus, split, variant=variant))


def word_perplexity(loss: float, tokens: int, words: int) -> float:
    """exp(loss x tokens / words): a mean loss in nats per token over ``tokens`` tokens that
    spell ``words`` words, as perplexity per word."""
    if not (tokens > 0 and words > 0):
        raise ValueError(f"tokens={tokens!r} and words={words!r} must both be > 0")
    return math.exp(loss * tokens / words)
