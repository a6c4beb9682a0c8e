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

Tokenised splits are cached as ``.npy`` files keyed on the sha256 of the split's
text and the tokenizer name, so a changed corpus or tokenizer never reuses a stale
cache. Batches are random contiguous windows, drawn from an explicit
``torch.Generator`` so that data order is reproducible per seed.

    text = load_text("tinyshakespeare", "train")
    ids = load_tokens("wikitext2", "validation", tokenizer="gpt2")
    x, y = sample_batch(torch.from_numpy(ids), 12, 64, torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import hashlib
import logging
import numbers
import os
from pathlib import Path

import numpy as np
import torch

from .files import atomic_write

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

# Bump when the .npy layout or the tokenisation of a cached split changes.
TOKEN_CACHE_VERSION = 1

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
    # ids run from 0 to vocab_size - 1; uint16 halves the cache and memory footprint
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


def _read_checked(root: Path, rel: str) -> str:
    """Read ``root/rel`` as UTF-8 after checking its sha256 against SHA256[rel]."""
    path = root / rel
    data = path.read_bytes()  # bytes, so no newline translation on any platform
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = hashlib.sha256(data).hexdigest()
    actual, expected = _hash_cache[key], SHA256[rel]
    if actual != expected:
        del _hash_cache[key]  # re-check next time, in case the file is fixed
        raise RuntimeError(
            f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}. "
            "The offline copy is not the pinned corpus (see shared/data/SOURCES.md)."
        )
    return data.decode("utf-8")


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
    """The split's text from its rows. Rows keep their own newlines, so they are joined
    as they are, except that an empty Salesforce/wikitext row was a blank line."""
    if path == WIKITEXT_HUB:
        return "".join(row or WIKITEXT_BLANK_LINE for row in rows)
    return "".join(rows)


def _load_hub(path: str, name: str | None, split: str) -> str:
    """One split from the Hugging Face hub (or ``$NODELM_HUB_MIRROR``), as one string,
    checked against HUB_SHA256 where an offline copy pins it.
    (Tests patch this to simulate offline.)"""
    import datasets  # lazy: slow to import and not needed offline

    ds = datasets.load_dataset(_hub_location(path), name, split=split)
    text = _join_hub_rows(path, ds["text"])
    expected = HUB_SHA256.get((path, name, split))
    if expected is not None:
        actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if actual != expected:
            raise RuntimeError(
                f"checksum mismatch for {path} ({name or 'default'}) {split}: expected "
                f"sha256 {expected}, got {actual}. The hub copy is not the pinned corpus "
                "(see shared/data/SOURCES.md).")
    return text


def _check_choice(kind: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(choices)}")


def _local_file(corpus: str, variant: str | None, split: str) -> str | None:
    """Path (relative to the data dir) of the offline file for this split, if any."""
    if corpus == "wikitext2" and variant == "wikitext-2-v1":
        return f"wikitext-2-v1/{split}.txt"
    if corpus == "tinyshakespeare":
        return "tinyshakespeare/input.txt"
    return None  # wikitext-2-raw-v1 and WikiText-103 live only on the hub


def _shakespeare_split(text: str, split: str) -> str:
    lo, hi = SHAKESPEARE_CUTS[split]
    return text[int(len(text) * lo):int(len(text) * hi)]


def load_text(corpus: str, split: str, data_dir=None, variant=None) -> str:
    """The raw text of one split of a corpus, newlines and all.

    corpus: ``wikitext2`` (variant ``wikitext-2-v1`` (default, tokenized, offline or
    hub) or ``wikitext-2-raw-v1`` (hub only)), ``wikitext103`` (hub only, variant
    ``wikitext-103-raw-v1`` (default) or ``wikitext-103-v1``), or ``tinyshakespeare``
    (one file cut by character into 90% train / 5% validation / 5% test).
    Local files are used when found (see ``find_data_dir``) and checked against
    pinned sha256 values; otherwise the hub (HUB_SOURCES; ``$NODELM_HUB_MIRROR`` for a
    local copy), checked too where HUB_SHA256 pins the split. Logs which source it used.
    """
    _check_choice("corpus", corpus, CORPORA)
    _check_choice("split", split, SPLITS)
    if corpus in WIKITEXT_VARIANTS:
        variant = variant or WIKITEXT_VARIANTS[corpus][0]
        _check_choice(f"{corpus} variant", variant, WIKITEXT_VARIANTS[corpus])
    elif variant is not None:
        raise ValueError(f"{corpus} has no variants (got {variant!r})")

    root, where = find_data_dir(data_dir)
    rel = _local_file(corpus, variant, split)
    if root is not None and rel is not None and (root / rel).is_file():
        text = _read_checked(root, rel)
        log.info("%s/%s: read %s (%s)", corpus, split, root / rel, where)
        return _shakespeare_split(text, split) if corpus == "tinyshakespeare" else text

    hub = (HUB_SOURCES[corpus], variant)
    hub_name = "/".join(h for h in hub if h)
    try:
        text = _load_hub(*hub, split)
    except Exception as e:
        raise RuntimeError(f"{_offline_message(corpus, variant, root, where, rel)}; "
                           f"loading {hub_name} from the hub failed: {e}"
                           f"{_script_hint(hub[0], e)}") from e
    log.info("%s/%s: loaded %s from the Hugging Face hub%s", corpus, split, hub_name,
             f" mirror {os.environ['NODELM_HUB_MIRROR']}"
             if os.environ.get("NODELM_HUB_MIRROR") else "")
    return text


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


def token_cache_path(corpus: str, split: str, tokenizer: str, text: str, cache_dir=None) -> Path:
    """Where ``load_tokens`` caches this split: the name carries a key over the
    text's sha256, the tokenizer name and the cache format version."""
    text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    key = hashlib.sha256(f"v{TOKEN_CACHE_VERSION}|{tokenizer}|{text_sha}".encode()).hexdigest()
    cache_dir = Path(cache_dir).expanduser() if cache_dir else _default_cache_dir()
    return cache_dir / f"{corpus}-{split}-{tokenizer}-{key[:20]}.npy"


def _read_token_cache(path: Path) -> np.ndarray | None:
    """The token ids cached at ``path``, or None (with a warning naming the file) where it is
    cut short, corrupt or not a 1-D integer array: the caller tokenises again and replaces it."""
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        problem = f"unreadable ({type(err).__name__}: {err})"
    else:
        if ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer):
            return ids
        problem = f"not a 1-D integer array (shape {ids.shape}, dtype {ids.dtype})"
    log.warning("token cache %s is %s; tokenising again and replacing it", path, problem)
    return None


def load_tokens(corpus: str, split: str, tokenizer: str = "char", data_dir=None,
                cache_dir=None, variant=None) -> np.ndarray:
    """One split as a 1-D array of token ids (uint16 when the vocabulary fits, else
    int32), tokenised once and then read from the ``.npy`` cache under ``cache_dir``
    (default ``$NODELM_CACHE_DIR`` or ``<repo>/.cache/tokens``)."""
    _check_choice("tokenizer", tokenizer, TOKENIZERS)
    text = load_text(corpus, split, data_dir=data_dir, variant=variant)
    path = token_cache_path(corpus, split, tokenizer, text, cache_dir)
    if path.is_file():
        cached = _read_token_cache(path)
        if cached is not None:
            log.info("%s/%s/%s: token cache hit %s", corpus, split, tokenizer, path)
            return cached
    tok = get_tokenizer(tokenizer, data_dir=data_dir)
    ids = tok.encode_array(text)
    atomic_write(path, lambda f: np.save(f, ids))
    log.info("%s/%s/%s: %d tokens, cached at %s", corpus, split, tokenizer, len(ids), path)
    return ids


# -----------------------------------------------------------------------------
# batches


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1].

    Starts are drawn uniformly from every valid offset with ``generator``, so the
    data order depends only on its seed. Returns two int64 (B, T) tensors.
    ``tokens`` may be any 1-D integer tensor or numpy array (e.g. the uint16 cache).
    """
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(tokens)
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    n = tokens.numel()
    if n < seq_len + 1:
        raise ValueError(f"split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(n - seq_len, (batch_size,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len)  # (B, T) gather, no Python loop
    idx = idx.to(tokens.device)
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
    ``max_windows`` keeps only the first windows."""
    check_count("batch_size", batch_size)
    check_count("seq_len", seq_len)
    if max_windows is not None:
        check_count("max_windows", max_windows, " (or None: every window)")
    tokens = torch.as_tensor(np.asarray(tokens).astype(np.int64))
    n_windows = (tokens.numel() - 1) // seq_len
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"the split has {tokens.numel()} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    x = tokens[: n_windows * seq_len].view(n_windows, seq_len)
    y = tokens[1: n_windows * seq_len + 1].view(n_windows, seq_len)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
