"""Corpora, tokenizers and batches.

Text comes from local files when we can find them (an explicit ``data_dir``, then
``$NODELM_DATA_DIR``, then ``../shared/data`` next to the checkout) and from the
Hugging Face hub otherwise. Local files are checked against pinned sha256 values,
so a silently changed corpus can never make two runs incomparable; so is hub text
wherever an offline copy pins it (WikiText-2 tokenized, tiny-shakespeare).

The hub sources are repositories of parquet data files without a loading script, as
``datasets`` >= 4.0 requires (see HUB_SOURCES). ``$NODELM_HUB_MIRROR`` may name a local
folder that holds them laid out as on the hub (``<mirror>/Salesforce/wikitext/...``);
``datasets.load_dataset`` then reads that folder instead of downloading. The tests
use this to run the hub code path offline on a stand-in built from the offline files.

A split is read as a stream of pieces (``TextSource``), never whole, and tokenised piece by
piece into a ``.npy`` file of token ids that is memory-mapped when large, so WikiText-103's
~540 MB and ~120M GPT-2 tokens take a bounded amount of memory. The cache is keyed on the sha256
of the split's text and the tokenizer name, so a changed corpus or tokenizer never reuses a stale
cache; it is written atomically and checked against a manifest on every read. Batches are random
contiguous windows, drawn from an explicit ``torch.Generator`` so that data order is reproducible
per seed; only the windows drawn are copied out of the token array.

    text = load_text("tinyshakespeare", "train")
    ids = load_tokens("wikitext2", "validation", tokenizer="gpt2")
    x, y = sample_batch(ids, 12, 64, torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from .files import atomic_write, atomic_write_text

log = logging.getLogger("nodelm_lib.data")

CORPORA = ("wikitext2", "wikitext103", "tinyshakespeare")
TOKENIZERS = ("char", "gpt2")
SPLITS = ("train", "validation", "test")

# Hugging Face configs of the WikiText dataset; the first is the default.
# Only the tokenized WikiText-2 exists offline (see shared/data/SOURCES.md).
WIKITEXT_VARIANTS = {
    "wikitext2": ("wikitext-2-v1", "wikitext-2-raw-v1"),
    "wikitext103": ("wikitext-103-raw-v1", "wikitext-103-v1"),
}

# Hugging Face hub sources. `datasets` >= 4.0 runs no loading scripts: a repository
# with one raises "Dataset scripts are no longer supported, but found <name>.py". Both
# repositories below hold parquet files (and a README whose `configs` name them), no
# script, so `load_dataset(repo, config, split=...)` reads them without running code.
# - Salesforce/wikitext: configs wikitext-{2,103}-{raw-,}v1, files <config>/<split>-*.parquet
#   (the bare id "wikitext" is a legacy alias of this repository). One row per line of
#   the original wiki.*.tokens / wiki.*.raw file, its newline kept, except that blank
#   lines (" \n" in every file) were stored as "" by the script that made the rows.
# - karpathy/tiny_shakespeare: config default, files data/<split>-*.parquet, one row per
#   split: karpathy/char-rnn's input.txt cut 90/5/5 as SHAKESPEARE_CUTS cuts it.
WIKITEXT_HUB = "Salesforce/wikitext"
TINYSHAKESPEARE_HUB = "karpathy/tiny_shakespeare"
HUB_SOURCES = {"wikitext2": WIKITEXT_HUB, "wikitext103": WIKITEXT_HUB,
               "tinyshakespeare": TINYSHAKESPEARE_HUB}
WIKITEXT_BLANK_LINE = " \n"  # what an empty Salesforce/wikitext row stands for

# sha256 of every offline text file, from shared/data/SOURCES.md (paths relative to
# the data dir). A mismatch means the copy is not the corpus the results refer to.
SHA256 = {
    "wikitext-2-v1/train.txt": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
    "wikitext-2-v1/validation.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "wikitext-2-v1/test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
    "tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
}

# sha256 of the text rebuilt from the hub, where an offline copy pins it: the
# Salesforce/wikitext wikitext-2-v1 splits are the offline files byte for byte, and the
# karpathy/tiny_shakespeare splits are SHAKESPEARE_CUTS of tinyshakespeare/input.txt.
HUB_SHA256 = {
    **{(WIKITEXT_HUB, "wikitext-2-v1", s): SHA256[f"wikitext-2-v1/{s}.txt"]
       for s in ("train", "validation", "test")},
    (TINYSHAKESPEARE_HUB, None, "train"):
        "a9e24e23a1ec77744dad26844bfd5a09b6e041954e1eef0000e7f24cba6db735",
    (TINYSHAKESPEARE_HUB, None, "validation"):
        "c64e90c160750d91a9d2d9b1ace5eab1a440f5a1701d32a8e97a179b7839f1c8",
    (TINYSHAKESPEARE_HUB, None, "test"):
        "8b5a8c8af45905547ad03b7aae6980a277a5dd78924a6e6ac64b75d63d7d40bd",
}

# tiny-shakespeare is one file; we cut it by character (it is pure ASCII, so also by
# byte) into the first 90% / next 5% / last 5%, with int() truncation: 1,003,854 /
# 55,770 / 55,770 characters, the sizes of TFDS's and the hub's tiny_shakespeare splits.
SHAKESPEARE_CUTS = {"train": (0.0, 0.9), "validation": (0.9, 0.95), "test": (0.95, 1.0)}

# The official WikiText zips unpack to these names; a data dir may hold WikiText-103 either so
# or as <config>/<split>.txt, the layout of wikitext-2-v1/.
WIKITEXT_ZIP_FILES = {"wikitext-103-raw-v1": "wikitext-103-raw/wiki.{}.raw",
                      "wikitext-103-v1": "wikitext-103/wiki.{}.tokens"}
_ZIP_SPLIT_NAMES = {"train": "train", "validation": "valid", "test": "test"}

# Bump when the .npy layout or the tokenisation of a cached split changes
# (2: a .json manifest beside each .npy, checked on read).
TOKEN_CACHE_VERSION = 2

# A corpus is read and tokenised in pieces of about this many characters (and hub splits in
# batches of this many rows), so memory does not grow with the corpus.
STREAM_CHARS = 1 << 20
HUB_BATCH_ROWS = 4096
# Caches at least this large are memory-mapped; smaller ones are read into memory, as before:
# a copy cannot lose its pages if the file is later cut short in place (a map of it would fault).
MMAP_MIN_BYTES = 64 << 20

_REPO_ROOT = Path(__file__).resolve().parents[1]


# -----------------------------------------------------------------------------
# tokenizers


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
            raise RuntimeError(
                "could not load tiktoken's 'gpt2' encoding (it downloads two files "
                "unless they are cached): point TIKTOKEN_CACHE_DIR at a cache such as "
                "shared/data/tiktoken_cache, or NODELM_DATA_DIR at the shared data dir"
            ) from e
        assert self._enc.n_vocab == self.vocab_size

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, ids) -> str:
        return self._enc.decode(_as_int_list(ids))

    def encode_stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        # cut only where the whole text's encoding has a token boundary (GPT2_SAFE_CUT)
        for chunk in cut_text(pieces, STREAM_CHARS, GPT2_SAFE_CUT):
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
    _check_choice("tokenizer", name, TOKENIZERS)
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


# -----------------------------------------------------------------------------
# finding and reading the corpora


def _candidate_dirs() -> list[tuple[Path, str]]:
    """The ../shared/data guesses, in order: next to the checkout, then next to cwd.
    ``shared/`` inside the checkout or cwd is also accepted (some copies put it there)."""
    cands = [
        (_REPO_ROOT.parent / "shared" / "data", "../shared/data next to the checkout"),
        (_REPO_ROOT / "shared" / "data", "shared/data in the checkout"),
        (Path.cwd().parent / "shared" / "data", "../shared/data next to the working dir"),
        (Path.cwd() / "shared" / "data", "shared/data in the working dir"),
    ]
    seen, out = set(), []
    for path, what in cands:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append((key, what))
    return out


def find_data_dir(data_dir=None) -> tuple[Path | None, str]:
    """Find the offline data dir: ``data_dir``, then ``$NODELM_DATA_DIR``, then
    ``../shared/data``. Returns ``(path, description)``, or ``(None, "...hub")``
    when there is none. An explicit dir or variable that does not exist is an error
    rather than a silent fall-through, so a typo never means "download instead".
    """
    for given, what in ((data_dir, "data_dir argument"),
                        (os.environ.get("NODELM_DATA_DIR"), "$NODELM_DATA_DIR")):
        if given:
            path = Path(given).expanduser().resolve()
            if not path.is_dir():
                raise FileNotFoundError(f"{what} {path} is not a directory")
            return path, f"{what}: {path}"
    for path, what in _candidate_dirs():
        if path.is_dir():
            return path, f"{what}: {path}"
    return None, "Hugging Face hub (no offline data dir found)"


# (resolved path, size, mtime_ns) -> sha256 hex; a changed file gets a new key
_hash_cache: dict[tuple[str, int, int], str] = {}
_unpinned_warned: set[str] = set()


def _sha256_of_file(path: Path, offset: int = 0) -> str:
    """sha256 of a file's bytes from ``offset`` on, read in blocks (never whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    """``_sha256_of_file``, remembered per (path, size, mtime) for the life of the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = _sha256_of_file(path)
    return _hash_cache[key]


def _file_pieces(path: Path) -> Iterator[str]:
    """A UTF-8 file's text in pieces of STREAM_CHARS characters, newlines as they are."""
    with open(path, encoding="utf-8", newline="") as f:
        while piece := f.read(STREAM_CHARS):
            yield piece


@dataclass(frozen=True)
class TextSource:
    """One split's text, read in passes, each a fresh run of pieces that join to the whole text,
    so that a corpus is never held whole (``load_tokens`` makes two passes: one to hash it, one
    to tokenise it). Local files and hub splits alike are one of these (``text_source``).

    ``label`` names the text in messages. ``pinned`` is the sha256 its UTF-8 bytes must have
    (checked by ``sha256`` and ``read``), where a copy pins it; ``copy`` says what kind of copy
    (for the error). ``file`` is a local file that holds exactly the text: its hash is then read
    from the bytes and remembered per (path, size, mtime).
    """

    label: str
    pieces: Callable[[], Iterator[str]]
    pinned: str | None = None
    file: Path | None = None
    copy: str = "offline copy"

    def sha256(self) -> str:
        """The sha256 of the text's UTF-8 bytes, checked against ``pinned``."""
        if self.file is not None:
            actual = _file_sha256(self.file)
        else:
            digest = hashlib.sha256()
            for piece in self.pieces():
                digest.update(piece.encode("utf-8"))
            actual = digest.hexdigest()
        self._check(actual)
        return actual

    def read(self) -> str:
        """The whole text as one string, checked against ``pinned``."""
        if self.file is not None:
            self.sha256()  # before decoding, and remembered for the next read
            return self.file.read_bytes().decode("utf-8")  # bytes: no newline translation
        text = "".join(self.pieces())
        self._check(hashlib.sha256(text.encode("utf-8")).hexdigest())
        return text

    def _check(self, actual: str) -> None:
        if self.pinned is None or actual == self.pinned:
            return
        if self.file is not None:  # hash the file again next time, in case it is fixed
            stale = str(self.file.resolve())
            for key in [k for k in _hash_cache if k[0] == stale]:
                del _hash_cache[key]
        raise RuntimeError(
            f"checksum mismatch for {self.label}: expected sha256 {self.pinned}, got {actual}. "
            f"The {self.copy} is not the pinned corpus (see shared/data/SOURCES.md).")


def _read_checked(root: Path, rel: str) -> str:
    """Read ``root/rel`` as UTF-8 after checking its sha256 against SHA256[rel]."""
    path = root / rel
    return TextSource(str(path), lambda: _file_pieces(path), pinned=SHA256[rel], file=path).read()


def _hub_location(path: str) -> str:
    """What ``datasets.load_dataset`` is given for hub repository ``path``: the repo id,
    or with ``$NODELM_HUB_MIRROR`` set, the folder ``<mirror>/<owner>/<name>`` that holds
    a copy laid out as on the hub (same README configs, same parquet paths). A mirror
    without the repository is an error, not a silent download."""
    mirror = os.environ.get("NODELM_HUB_MIRROR")
    if not mirror:
        return path
    local = Path(mirror).expanduser().resolve() / path
    if not local.is_dir():
        raise FileNotFoundError(f"$NODELM_HUB_MIRROR has no copy of {path}: "
                                f"{local} is not a directory")
    return str(local)


def _join_hub_rows(path: str, rows) -> str:
    """The text of consecutive rows. Rows keep their own newlines, so they are joined
    as they are, except that an empty Salesforce/wikitext row was a blank line."""
    if path == WIKITEXT_HUB:
        return "".join(row or WIKITEXT_BLANK_LINE for row in rows)
    return "".join(rows)


def _open_hub(path: str, name: str | None, split: str):
    """One split of hub repository ``path`` (or its ``$NODELM_HUB_MIRROR`` copy) as a
    ``datasets.Dataset``: downloaded once into datasets' cache and memory-mapped from there,
    so opening it holds none of its text in memory. (Tests patch this to simulate the hub.)"""
    import datasets  # lazy: slow to import and not needed offline

    return datasets.load_dataset(_hub_location(path), name, split=split)


def _hub_pieces(path: str, ds) -> Iterator[str]:
    """The text of an opened hub split, HUB_BATCH_ROWS rows at a time."""
    for batch in ds.iter(batch_size=HUB_BATCH_ROWS):
        yield _join_hub_rows(path, batch["text"])


def _check_choice(kind: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(choices)}")


def _local_file(corpus: str, variant: str | None, split: str, root: Path | None = None) -> str | None:
    """Path (relative to the data dir ``root``) of the offline file for this split, or None
    where there is never one. WikiText's is ``<config>/<split>.txt``; WikiText-103, which the
    offline data does not ship, may also sit there as its official zip unpacks it."""
    if corpus == "tinyshakespeare":
        return "tinyshakespeare/input.txt"
    if variant == "wikitext-2-raw-v1":
        return None  # hub only
    rel = f"{variant}/{split}.txt"
    if variant in WIKITEXT_ZIP_FILES and root is not None and not (root / rel).is_file():
        unzipped = WIKITEXT_ZIP_FILES[variant].format(_ZIP_SPLIT_NAMES[split])
        if (root / unzipped).is_file():
            return unzipped
    return rel


def _shakespeare_split(text: str, split: str) -> str:
    lo, hi = SHAKESPEARE_CUTS[split]
    return text[int(len(text) * lo):int(len(text) * hi)]


def _check_variant(corpus: str, variant: str | None) -> str | None:
    """The WikiText config to use (the default where ``variant`` is None), checked."""
    if corpus in WIKITEXT_VARIANTS:
        variant = variant or WIKITEXT_VARIANTS[corpus][0]
        _check_choice(f"{corpus} variant", variant, WIKITEXT_VARIANTS[corpus])
    elif variant is not None:
        raise ValueError(f"{corpus} has no variants (got {variant!r})")
    return variant


def text_source(corpus: str, split: str, data_dir=None, variant=None) -> TextSource:
    """Where one split's text comes from, opened but not read (tiny-shakespeare's one small file
    is read whole, to be cut): see ``load_text`` for the corpora, variants and the order in which
    sources are tried. Logs which source it used."""
    _check_choice("corpus", corpus, CORPORA)
    _check_choice("split", split, SPLITS)
    variant = _check_variant(corpus, variant)

    root, where = find_data_dir(data_dir)
    rel = _local_file(corpus, variant, split, root)
    if root is not None and rel is not None and (root / rel).is_file():
        log.info("%s/%s: read %s (%s)", corpus, split, root / rel, where)
        return _local_source(corpus, split, root, rel)

    repo = HUB_SOURCES[corpus]
    hub_name = "/".join(h for h in (repo, variant) if h)
    try:
        ds = _open_hub(repo, variant, split)
    except Exception as e:
        raise RuntimeError(f"{_offline_message(corpus, variant, root, where, rel)}; "
                           f"loading {hub_name} from the hub failed: {e}"
                           f"{_script_hint(repo, e)}") from e
    log.info("%s/%s: loaded %s from the Hugging Face hub%s", corpus, split, hub_name,
             f" mirror {os.environ['NODELM_HUB_MIRROR']}"
             if os.environ.get("NODELM_HUB_MIRROR") else "")
    return TextSource(f"{repo} ({variant or 'default'}) {split}", lambda: _hub_pieces(repo, ds),
                      pinned=HUB_SHA256.get((repo, variant, split)), copy="hub copy")


def _local_source(corpus: str, split: str, root: Path, rel: str) -> TextSource:
    """The split's text from the file ``root/rel``, checked where SHA256 pins it."""
    path = root / rel
    if corpus == "tinyshakespeare":  # one 1 MB file cut by character: cut in memory
        text = _shakespeare_split(_read_checked(root, rel), split)
        return TextSource(f"{path} ({split})", lambda: iter((text,)))
    pinned = SHA256.get(rel)
    if pinned is None and str(path) not in _unpinned_warned:
        _unpinned_warned.add(str(path))
        log.warning("%s has no pinned sha256 (the offline data does not include it), so it is "
                    "used unchecked; its token cache is keyed on its own sha256", path)
    return TextSource(str(path), lambda: _file_pieces(path), pinned=pinned, file=path)


def load_text(corpus: str, split: str, data_dir=None, variant=None) -> str:
    """The raw text of one split of a corpus, newlines and all, as one string
    (``load_tokens`` streams it instead: ``text_source``).

    corpus: ``wikitext2`` (variant ``wikitext-2-v1`` (default, tokenized, offline or
    hub) or ``wikitext-2-raw-v1`` (hub only)), ``wikitext103`` (variant
    ``wikitext-103-raw-v1`` (default) or ``wikitext-103-v1``; from the hub, or from a copy
    added to the data dir as ``<variant>/<split>.txt`` or as the official zip unpacks, e.g.
    ``wikitext-103-raw/wiki.valid.raw``), or ``tinyshakespeare`` (one file cut by character
    into 90% train / 5% validation / 5% test).
    Local files are used when found (see ``find_data_dir``) and checked against pinned sha256
    values where the offline data pins them; otherwise the hub (HUB_SOURCES;
    ``$NODELM_HUB_MIRROR`` for a local copy), checked too where HUB_SHA256 pins the split.
    Logs which source it used.
    """
    return text_source(corpus, split, data_dir=data_dir, variant=variant).read()


def _script_hint(repo: str, err: Exception) -> str:
    """Say what ``datasets``' refusal of a loading script means for the user."""
    if "scripts are no longer supported" not in str(err):
        return ""
    return (f". {repo} has a loading script, which `datasets` >= 4.0 no longer runs: "
            "the source must hold data files (such as parquet) instead, or use the offline "
            "copy ($NODELM_DATA_DIR, see shared/data/SOURCES.md)")


def _offline_message(corpus, variant, root, where, rel) -> str:
    """Why there was no local copy, for the error when the hub fails too."""
    if rel is None:  # this corpus / variant never exists offline
        return (f"{corpus} ({variant}) is only available from the Hugging Face hub; "
                "the offline data has only wikitext-2-v1 and tinyshakespeare")
    if rel not in SHA256:  # not in the offline data, but a copy may be added to it by hand
        at = root / rel if root is not None else f"<data dir>/{rel}"
        return (f"{corpus} ({variant}) is only available from the Hugging Face hub or a copy "
                f"added to the data dir, and {at} does not exist (the offline data has only "
                "wikitext-2-v1 and tinyshakespeare)")
    if root is None:
        tried = ", ".join(str(p) for p, _ in _candidate_dirs())
        return (f"no offline data dir for {corpus} (no data_dir, no $NODELM_DATA_DIR, "
                f"none of {tried})")
    return f"{corpus}: {root / rel} does not exist ({where})"


# -----------------------------------------------------------------------------
# token cache


def _default_cache_dir() -> Path:
    if os.environ.get("NODELM_CACHE_DIR"):
        return Path(os.environ["NODELM_CACHE_DIR"]).expanduser()
    if (_REPO_ROOT / "pyproject.toml").is_file():  # running from a checkout
        return _REPO_ROOT / ".cache" / "tokens"
    return Path.home() / ".cache" / "nodelm" / "tokens"  # installed package


def token_cache_path(corpus: str, split: str, tokenizer: str, text: str | None = None, cache_dir=None,
                     *, text_sha256: str | None = None) -> Path:
    """Where ``load_tokens`` caches this split: the name carries a key over the sha256 of the
    text (given as ``text``, or as its hex digest ``text_sha256`` where the text is streamed),
    the tokenizer name and the cache format version. The manifest sits beside it as ``.json``."""
    if (text is None) == (text_sha256 is None):
        raise TypeError("token_cache_path needs the text or its sha256 (text_sha256=), not both")
    if text is not None:
        text_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    key = hashlib.sha256(f"v{TOKEN_CACHE_VERSION}|{tokenizer}|{text_sha256}".encode()).hexdigest()
    cache_dir = Path(cache_dir).expanduser() if cache_dir else _default_cache_dir()
    return cache_dir / f"{corpus}-{split}-{tokenizer}-{key[:20]}.npy"


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """The ``.npy`` header of a 1-D array of ``n`` values of ``dtype``. numpy pads it to the
    same length whatever ``n`` is, so it can be written before the tokens are counted and
    rewritten in place once they are."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)})
    return buf.getvalue()


def write_token_cache(path: Path, tokenizer: Tokenizer, source: TextSource, text_sha256: str) -> int:
    """Tokenise ``source`` piece by piece (``Tokenizer.encode_stream``) into the ``.npy`` file
    ``path``, then write its manifest beside it; returns the number of tokens. Memory stays
    bounded by a piece, whatever the corpus's size. Each file is written to a temporary file and
    renamed into place, the manifest last, so a tokenisation that is killed leaves no cache that
    ``load_tokens`` would accept. ``text_sha256`` is the text's hash from a first pass: the text
    is hashed again as it is tokenised, and a corpus that changed in between is refused."""
    dtype = np.dtype(_token_dtype(tokenizer.vocab_size))
    text_digest, token_digest = hashlib.sha256(), hashlib.sha256()
    count = 0

    def hashed(pieces: Iterable[str]) -> Iterator[str]:
        for piece in pieces:
            text_digest.update(piece.encode("utf-8"))
            yield piece

    def write(f) -> None:
        nonlocal count
        placeholder = _npy_header(dtype, 2**63 - 1)  # the longest shape there can be
        f.write(placeholder)
        for ids in tokenizer.encode_stream(hashed(source.pieces())):
            data = np.ascontiguousarray(ids, dtype=dtype).tobytes()
            f.write(data)
            token_digest.update(data)
            count += len(ids)
        if text_digest.hexdigest() != text_sha256:
            raise RuntimeError(f"{source.label} changed while it was tokenised (sha256 {text_sha256} "
                               f"before, {text_digest.hexdigest()} during); load it again")
        header = _npy_header(dtype, count)
        if len(header) != len(placeholder):  # numpy pads both to one length; guard all the same
            raise RuntimeError(f"the .npy header for {count} tokens is {len(header)} bytes, not "
                               f"the {len(placeholder)} reserved for it")
        f.seek(0)
        f.write(header)

    atomic_write(path, write)
    manifest = {"version": TOKEN_CACHE_VERSION, "tokenizer": tokenizer.name, "text_sha256": text_sha256,
                "dtype": dtype.name, "tokens": count, "tokens_sha256": token_digest.hexdigest(),
                "source": source.label}
    atomic_write_text(path.with_suffix(".json"), json.dumps(manifest, indent=1) + "\n")
    return count


def _token_cache_problem(path: Path, ids: np.memmap, manifest, text_sha256: str, tokenizer: str) -> str | None:
    """What is wrong with the cache memory-mapped as ``ids``, measured against its manifest and
    what ``load_tokens`` asked for; None when nothing is."""
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        return f"not a 1-D integer array (shape {ids.shape}, dtype {ids.dtype})"
    if not isinstance(manifest, dict):
        return f"paired with a manifest that is not a JSON object ({type(manifest).__name__})"
    expected = {"version": TOKEN_CACHE_VERSION, "tokenizer": tokenizer, "text_sha256": text_sha256,
                "dtype": ids.dtype.name, "tokens": len(ids)}
    differ = [f"{k} {manifest.get(k)!r} in the manifest, {v!r} here" for k, v in expected.items()
              if manifest.get(k) != v]
    if differ:
        return "not what its manifest says (" + "; ".join(differ) + ")"
    size = path.stat().st_size
    if size != ids.offset + ids.nbytes:
        return f"{size} bytes long, not the {ids.offset + ids.nbytes} its header gives"
    actual = _sha256_of_file(path, ids.offset)  # read, not through the map: no pages stay resident
    if actual != manifest.get("tokens_sha256"):
        return f"corrupt: its tokens' sha256 is {actual}, its manifest says {manifest.get('tokens_sha256')}"
    return None


def _read_token_cache(path: Path, text_sha256: str, tokenizer: str, mmap: bool | None = None
                      ) -> np.ndarray | None:
    """The token ids cached at ``path`` (memory-mapped where ``mmap`` says so; None: from
    MMAP_MIN_BYTES up), or None with a warning naming the file where it is unreadable, cut short,
    corrupt or without the manifest that the last step of writing it leaves: the caller then
    tokenises again and replaces it."""
    manifest_path = path.with_suffix(".json")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        problem = (f"without a readable manifest {manifest_path.name} ({type(err).__name__}: {err}; "
                   "a tokenisation cut short leaves none)")
    else:
        try:
            ids = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            problem = f"unreadable ({type(err).__name__}: {err})"
        else:
            problem = _token_cache_problem(path, ids, manifest, text_sha256, tokenizer)
            if problem is None:
                keep_mapped = mmap if mmap is not None else ids.nbytes >= MMAP_MIN_BYTES
                return ids if keep_mapped else np.array(ids)
    log.warning("token cache %s is %s; tokenising again and replacing it", path, problem)
    return None


def load_tokens(corpus: str, split: str, tokenizer: str = "char", data_dir=None,
                cache_dir=None, variant=None, mmap: bool | None = None) -> np.ndarray:
    """One split as a 1-D array of token ids (uint16 when the vocabulary fits, else int32),
    tokenised once into a ``.npy`` cache under ``cache_dir`` (default ``$NODELM_CACHE_DIR`` or
    ``<repo>/.cache/tokens``) and read from it after.

    The text is streamed, never held whole: one pass hashes it (the cache key, and the check
    against a pinned sha256), a second, on a cache miss, tokenises it piece by piece into the
    cache (``write_token_cache``). Every read checks the cache against its manifest. ``mmap``:
    True returns a read-only ``np.memmap`` of the cache, False an array in memory, None (default)
    a memmap for caches of MMAP_MIN_BYTES or more (WikiText-103) and an array otherwise.
    ``sample_batch``, ``fixed_batches`` and ``split_windows`` copy out only the windows they use.
    """
    _check_choice("tokenizer", tokenizer, TOKENIZERS)
    if mmap not in (None, True, False):
        raise ValueError(f"mmap={mmap!r} is not valid; it must be True, False or None (by size)")
    source = text_source(corpus, split, data_dir=data_dir, variant=variant)
    text_sha = source.sha256()
    path = token_cache_path(corpus, split, tokenizer, cache_dir=cache_dir, text_sha256=text_sha)
    if path.is_file():
        cached = _read_token_cache(path, text_sha, tokenizer, mmap)
        if cached is not None:
            log.info("%s/%s/%s: token cache hit %s", corpus, split, tokenizer, path)
            return cached
    count = write_token_cache(path, get_tokenizer(tokenizer, data_dir=data_dir), source, text_sha)
    log.info("%s/%s/%s: %d tokens, cached at %s", corpus, split, tokenizer, count, path)
    ids = _read_token_cache(path, text_sha, tokenizer, mmap)
    if ids is None:
        raise RuntimeError(f"the token cache {path} just written does not read back (see the warning above)")
    return ids


# -----------------------------------------------------------------------------
# batches


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1].

    Starts are drawn uniformly from every valid offset with ``generator``, so the
    data order depends only on its seed. Returns two int64 (B, T) tensors.
    ``tokens`` may be any 1-D integer tensor or numpy array (e.g. the uint16 cache, or its
    memmap: only the windows drawn are read and copied).
    """
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    n = tokens.shape[0]
    if n < seq_len + 1:
        raise ValueError(f"split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(n - seq_len, (batch_size,), generator=generator)
    if isinstance(tokens, np.ndarray):  # gathered by numpy: torch < 2.3 has no uint16
        idx = starts.numpy()[:, None] + np.arange(seq_len)  # (B, T) gather, no Python loop
        x = torch.from_numpy(tokens[idx].astype(np.int64))
        y = torch.from_numpy(tokens[idx + 1].astype(np.int64))
    else:
        idx = (starts[:, None] + torch.arange(seq_len)).to(tokens.device)
        x = tokens[idx].to(torch.int64)
        y = tokens[idx + 1].to(torch.int64)
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and x.device.type == "cpu":
            # pinned memory lets the copy overlap with compute (as in nanoGPT)
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


def fixed_batches(tokens, n_batches: int, batch_size: int, seq_len: int,
                  seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of evaluation batches: the same on every call for a given seed,
    and independent of any training generator (it has its own)."""
    g = torch.Generator().manual_seed(seed)
    return [sample_batch(tokens, batch_size, seq_len, g) for _ in range(n_batches)]


def check_count(key: str, value, alternative: str = "") -> None:
    """ValueError unless ``value`` is an integer >= 1 (``alternative``: what else it may be)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{key}={value!r} is not valid; it must be an integer >= 1{alternative}")


def split_windows(tokens, batch_size: int, seq_len: int, max_windows: int | None = None
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A whole split as batches of consecutive, non-overlapping windows: window i is
    x = tokens[i T:(i + 1) T], y shifted by one, so every token but the first is a target
    exactly once (with the context its window gives). The last batch may be smaller;
    ``max_windows`` keeps only the first windows. ``tokens``: a 1-D sequence, array (or
    memmap: only the tokens the windows use are read) or tensor of ids."""
    check_count("batch_size", batch_size)
    check_count("seq_len", seq_len)
    if max_windows is not None:
        check_count("max_windows", max_windows, " (or None: every window)")
    n = len(tokens)
    n_windows = (n - 1) // seq_len
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"the split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    used = torch.from_numpy(np.asarray(tokens[: n_windows * seq_len + 1]).astype(np.int64))
    x = used[:-1].view(n_windows, seq_len)
    y = used[1:].view(n_windows, seq_len)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
