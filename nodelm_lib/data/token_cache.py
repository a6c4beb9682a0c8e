"""Token caches: a split tokenised once into a ``.npy`` file, checked and memory-mapped after.

A split is read as a stream of pieces (``TextSource``), never whole, and tokenised piece by
piece into a ``.npy`` file of token ids that is memory-mapped when large, so WikiText-103's
~540 MB and ~120M GPT-2 tokens take a bounded amount of memory. The cache is keyed on the sha256
of the split's text and the tokenizer name, so a changed corpus or tokenizer never reuses a stale
cache; it is written atomically and checked against a ``.json`` manifest on every read.

    ids = load_tokens("wikitext2", "validation", tokenizer="gpt2")
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from nodelm_lib.files import atomic_write, atomic_write_text

from .sources import REPO_ROOT, TextSource, check_known, sha256_of_file, text_source
from .tokenizers import TOKENIZERS, Tokenizer, _token_dtype, get_tokenizer

log = logging.getLogger("nodelm_lib.data")  # one logger for the whole package

# Bump when the .npy layout or the tokenisation of a cached split changes
# (2: a .json manifest beside each .npy, checked on read).
TOKEN_CACHE_VERSION = 2

# Caches at least this large are memory-mapped; smaller ones are read into memory:
# a copy cannot lose its pages if the file is later cut short in place (a map of it would fault).
MMAP_MIN_BYTES = 64 << 20


def _default_cache_dir() -> Path:
    if os.environ.get("NODELM_CACHE_DIR"):
        return Path(os.environ["NODELM_CACHE_DIR"]).expanduser()
    if (REPO_ROOT / "pyproject.toml").is_file():  # running from a checkout
        return REPO_ROOT / ".cache" / "tokens"
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
    actual = sha256_of_file(path, ids.offset)  # read, not through the map: no pages stay resident
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
    check_known("tokenizer", tokenizer, TOKENIZERS)
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
