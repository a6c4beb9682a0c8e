"""Tokenizers: text to integer ids and back.

``char`` is the UTF-8 bytes of the text (vocabulary 256, no download); ``gpt2`` is tiktoken's
GPT-2 BPE, read offline from ``<data dir>/tiktoken_cache`` when there is one. Both encode a
stream of pieces (``encode_stream``) to the ids of the whole text, without holding it whole: the
GPT-2 encoding is cut only where its pre-tokenizer always ends a piece (GPT2_SAFE_CUT).

    tok = get_tokenizer("gpt2")
    ids = tok.encode_array(text)  # uint16: the smallest dtype that holds every id
"""

from __future__ import annotations

import logging
import os
import re
from typing import Iterable, Iterator

import numpy as np

from . import sources
from .sources import check_known, find_data_dir

log = logging.getLogger("nodelm_lib.data")  # one logger for the whole package

TOKENIZERS = ("char", "gpt2")


class Tokenizer:
    """What the rest of the library needs from a tokenizer: a name, a vocabulary
    size, and ``encode`` / ``decode`` between text and integer ids."""

    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def encode_array(self, text: str) -> np.ndarray:
        """Encode to the smallest integer array that holds every id (as cached)."""
        return np.asarray(self.encode(text), dtype=_token_dtype(self.vocab_size))

    def encode_stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        """The ids of the text that ``pieces`` join to, in arrays that concatenate to
        ``encode_array`` of that text. This default joins the whole text first; a tokenizer that
        knows where its encoding may be cut overrides it, so that a corpus is never held whole."""
        yield self.encode_array("".join(pieces))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """Byte-level "characters": the UTF-8 bytes of the text, vocabulary 256.

    Needs no download and round-trips any text. Non-ASCII characters take several
    tokens; a decode that cuts one in half shows U+FFFD instead of raising.
    """

    name = "char"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(_as_int_list(ids)).decode("utf-8", errors="replace")

    def encode_array(self, text: str) -> np.ndarray:
        # frombuffer avoids a 10M-element Python list for the WikiText-2 train split
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def encode_stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        # a character's bytes do not depend on its neighbours: every piece encodes on its own
        for piece in pieces:
            yield self.encode_array(piece)


class GPT2Tokenizer(Tokenizer):
    """The GPT-2 BPE (tiktoken's ``gpt2`` encoding, vocabulary 50257).

    Special tokens are encoded as plain text (``disallowed_special=()``), so a corpus
    that happens to contain "<|endoftext|>" tokenizes instead of raising.
    """

    name = "gpt2"
    vocab_size = 50257

    def __init__(self, data_dir=None):
        import tiktoken  # lazy: the char tokenizer must work without it

        configure_tiktoken_cache(data_dir)
        try:
            self._enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken raises requests' errors when offline
            cache = os.environ.get("TIKTOKEN_CACHE_DIR")
            raise RuntimeError(
                "could not load tiktoken's 'gpt2' encoding (it downloads two files "
                "unless they are cached): point TIKTOKEN_CACHE_DIR at a cache such as "
                "shared/data/tiktoken_cache, or NODELM_DATA_DIR at the shared data dir"
                + (f" (TIKTOKEN_CACHE_DIR is {cache}, which is used as it is: the data dir's cache is "
                   "read only where the variable is unset)" if cache else "")
            ) from e
        assert self._enc.n_vocab == self.vocab_size

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, ids) -> str:
        return self._enc.decode(_as_int_list(ids))

    def encode_stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        # cut only where the whole text's encoding has a token boundary (GPT2_SAFE_CUT), in chunks
        # of the size the corpus is read in (sources.STREAM_CHARS, looked up now, not at import)
        for chunk in cut_text(pieces, sources.STREAM_CHARS, GPT2_SAFE_CUT):
            yield self.encode_array(chunk)


# Where GPT-2's encoding may be cut. tiktoken's pre-tokenizer (the r50k pattern,
# '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s) splits text into
# pieces that BPE never merges across. Two kinds of place end a piece whatever surrounds them, so
# that the text encoded in parts cut there gives the whole text's ids: after a "\n" between two
# printable ASCII characters ("a\nb"), and after a "\n" followed by a space and a printable
# character ("\n b": the whitespace up to that space is one piece, the space begins the next
# word's). WikiText has one at nearly every line. A cut after any "\n" is not enough: whole,
# "a \nb" has the pieces " ", "\n"; cut after the "\n", " \n" is one piece.
GPT2_SAFE_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])|(?<=\n)(?= [!-~])")


def cut_text(pieces: Iterable[str], size: int, cut: re.Pattern) -> Iterator[str]:
    """Join ``pieces`` and yield the text again in chunks of at least ``size`` characters (the
    last may be shorter), each one cut at the first match of ``cut`` past ``size``. Text with no
    such match stays in one chunk, so memory is bounded by about ``size`` plus twice the longest
    stretch of text without one (a line, for WikiText). ``cut`` must match a position before a
    character, never the end of the text."""
    pending, n, want = [], 0, size
    for piece in pieces:
        pending.append(piece)
        n += len(piece)
        if n >= want:
            rest = yield from _cut_chunks("".join(pending), size, cut)
            pending, n = [rest], len(rest)
            # no cut in a long stretch yet: search again once it has doubled, not at every piece
            want = size if n < size else 2 * n
    rest = yield from _cut_chunks("".join(pending), size, cut)
    if rest:
        yield rest


def _cut_chunks(text: str, size: int, cut: re.Pattern):
    """Yield ``text``'s chunks for ``cut_text``; return the rest, which has no cut past ``size``."""
    start = 0
    while (m := cut.search(text, start + size)) is not None:  # lookbehinds see before pos
        yield text[start:m.start()]
        start = m.start()
    return text[start:]


def get_tokenizer(name: str, data_dir=None) -> Tokenizer:
    """Return the tokenizer called ``name`` (one of TOKENIZERS)."""
    check_known("tokenizer", name, TOKENIZERS)
    return CharTokenizer() if name == "char" else GPT2Tokenizer(data_dir)


def configure_tiktoken_cache(data_dir=None) -> None:
    """Point tiktoken at ``<data dir>/tiktoken_cache`` unless the user chose a cache.

    tiktoken reads ``$TIKTOKEN_CACHE_DIR`` on every load and uses a file there
    (named by the sha1 of its URL) when its sha256 matches, so setting the variable
    before ``get_encoding`` is enough to work offline.
    """
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    root, _ = find_data_dir(data_dir)
    if root is not None and (root / "tiktoken_cache").is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(root / "tiktoken_cache")
        log.info("TIKTOKEN_CACHE_DIR=%s", os.environ["TIKTOKEN_CACHE_DIR"])


def _as_int_list(ids) -> list[int]:
    # accept lists, numpy arrays and tensors alike
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def _token_dtype(vocab_size: int):
    # ids run from 0 to vocab_size - 1; uint16 halves the cache and memory footprint. Larger
    # vocabularies take int32 rather than uint32: torch.from_numpy reads uint32 only from torch
    # 2.3, and no vocabulary comes near 2**31.
    return np.uint16 if vocab_size <= 2**16 else np.int32
