"""Corpora, tokenizers, token caches and batches (``from nodelm_lib.data import load_tokens``):

    sources.py       find_data_dir, TextSource, text_source, load_text: a split's text from local
                     files (checked against pinned sha256 values) or the Hugging Face hub
    tokenizers.py    get_tokenizer, CharTokenizer (UTF-8 bytes), GPT2Tokenizer (tiktoken), cut_text
    token_cache.py   load_tokens: a split tokenised once into a checked, memory-mapped .npy cache
    batches.py       sample_batch, fixed_batches, split_windows: (x, y) windows of the token ids
    words.py         count_words, split_words, word_perplexity: perplexity per word of a subword model

A split's text is streamed, never held whole: hashed in one pass (the cache key, and the check
against a pinned sha256), tokenised piece by piece into the cache in another, so WikiText-103
takes a bounded amount of memory. Batches are drawn from an explicit ``torch.Generator``, so data
order is reproducible per seed. Every module logs to the one logger ``nodelm_lib.data``.

    text = load_text("tinyshakespeare", "train")
    ids = load_tokens("wikitext2", "validation", tokenizer="gpt2")
    x, y = sample_batch(ids, 12, 64, torch.Generator().manual_seed(0))

This is the package's namespace; the code reads each name from the module that defines it, so
patch a name there (``sources._open_hub``, ``sources.STREAM_CHARS``), not here.
"""

from .batches import check_count, fixed_batches, sample_batch, split_windows, window_count
from .sources import (CORPORA, HUB_SOURCES, SHA256, SPLITS, TINYSHAKESPEARE_HUB, WIKITEXT_HUB, WIKITEXT_VARIANTS,
                      TextSource, find_data_dir, load_text, text_source)
from .token_cache import load_tokens, token_cache_path, write_token_cache
from .tokenizers import (GPT2_SAFE_CUT, TOKENIZERS, CharTokenizer, GPT2Tokenizer, Tokenizer, configure_tiktoken_cache,
                         cut_text, get_tokenizer)
from .words import count_words, split_words, word_perplexity

__all__ = [
    "CORPORA", "SPLITS", "WIKITEXT_VARIANTS", "HUB_SOURCES", "WIKITEXT_HUB", "TINYSHAKESPEARE_HUB", "SHA256",
    "TextSource", "find_data_dir", "text_source", "load_text",
    "TOKENIZERS", "Tokenizer", "CharTokenizer", "GPT2Tokenizer", "get_tokenizer", "configure_tiktoken_cache",
    "cut_text", "GPT2_SAFE_CUT",
    "load_tokens", "token_cache_path", "write_token_cache",
    "sample_batch", "fixed_batches", "split_windows", "window_count", "check_count",
    "count_words", "split_words", "word_perplexity",
]
