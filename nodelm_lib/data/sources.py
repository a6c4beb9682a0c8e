"""Where a split's text comes from: local files laid out like the hub, or the Hugging Face hub.

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

A split is opened as a ``TextSource``: a stream of pieces, read again on every pass and
never held whole (``token_cache`` hashes it in one pass and tokenises it in another).

    text = load_text("tinyshakespeare", "train")
    source = text_source("wikitext103", "validation")
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger("nodelm_lib.data")  # one logger for the whole package

CORPORA = ("wikitext2", "wikitext103", "tinyshakespeare")
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

# A corpus is read and tokenised in pieces of about this many characters (and hub splits in
# batches of this many rows), so memory does not grow with the corpus. GPT2Tokenizer reads
# STREAM_CHARS from this module when it runs, so one setting sizes both.
STREAM_CHARS = 1 << 20
HUB_BATCH_ROWS = 4096

# nodelm_lib/data/sources.py -> the checkout (or site-packages) that holds nodelm_lib
REPO_ROOT = Path(__file__).resolve().parents[2]


def _candidate_dirs() -> list[tuple[Path, str]]:
    """The ../shared/data guesses, in order: next to the checkout, then next to cwd.
    ``shared/`` inside the checkout or cwd is also accepted (some copies put it there)."""
    cands = [
        (REPO_ROOT.parent / "shared" / "data", "../shared/data next to the checkout"),
        (REPO_ROOT / "shared" / "data", "shared/data in the checkout"),
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


def sha256_of_file(path: Path, offset: int = 0) -> str:
    """sha256 of a file's bytes from ``offset`` on, read in blocks (never whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    """``sha256_of_file``, remembered per (path, size, mtime) for the life of the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = sha256_of_file(path)
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


def check_known(kind: str, value, choices) -> None:
    """ValueError naming an unknown ``kind`` of data (corpus, split, tokenizer) and the known ones."""
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
        check_known(f"{corpus} variant", variant, WIKITEXT_VARIANTS[corpus])
    elif variant is not None:
        raise ValueError(f"{corpus} has no variants (got {variant!r})")
    return variant


def text_source(corpus: str, split: str, data_dir=None, variant=None) -> TextSource:
    """Where one split's text comes from, opened but not read (tiny-shakespeare's one small file
    is read whole, to be cut): see ``load_text`` for the corpora, variants and the order in which
    sources are tried. Logs which source it used."""
    check_known("corpus", corpus, CORPORA)
    check_known("split", split, SPLITS)
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
