"""nodelm_lib.data: offline corpora and their checksums, the data-dir search order,
tokenizers, the token cache, and batch sampling.

The hub loader is patched to fail in every test (the real one spends ~30 s retrying
when offline), so these tests never touch the network. Streaming, the memory-mapped token
cache and its checks are in test_data_stream.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nodelm_lib import data
from nodelm_lib.data import sources

_real_open_hub = sources._open_hub  # the autouse fixture below replaces it
# byte and line counts from shared/data/SOURCES.md
WIKITEXT2 = {"train": (10_797_148, 36_718), "validation": (1_121_681, 3_760),
             "test": (1_256_449, 4_358)}
SHAKESPEARE_BYTES = 1_115_394
SHAKESPEARE_SPLITS = {"train": 1_003_854, "validation": 55_770, "test": 55_770}


class HubSplit:
    """What nodelm_lib.data reads of an opened hub split (a datasets.Dataset): batches of
    its "text" column."""

    def __init__(self, *rows):
        self.rows = list(rows)

    def iter(self, batch_size):
        for i in range(0, len(self.rows), batch_size):
            yield {"text": self.rows[i:i + batch_size]}


@pytest.fixture(autouse=True)
def offline(offline_data):
    """No hub, no stray env (conftest.offline_data): each test sets what it needs."""


@pytest.fixture
def shared(shared_dir, monkeypatch) -> Path:
    monkeypatch.setenv("NODELM_DATA_DIR", str(shared_dir))
    return shared_dir


# -----------------------------------------------------------------------------
# finding the data


def test_search_order(tmp_path, monkeypatch):
    explicit, env, sibling = (tmp_path / n for n in ("explicit", "env", "sibling"))
    for d in (explicit, env, sibling):
        d.mkdir()
    monkeypatch.setattr(sources, "_candidate_dirs", lambda: [(sibling, "../shared/data")])

    assert data.find_data_dir()[0] == sibling
    monkeypatch.setenv("NODELM_DATA_DIR", str(env))
    assert data.find_data_dir() == (env, f"$NODELM_DATA_DIR: {env}")
    assert data.find_data_dir(explicit)[0] == explicit  # explicit beats env

    monkeypatch.delenv("NODELM_DATA_DIR")
    sibling.rmdir()
    root, what = data.find_data_dir()
    assert root is None and "hub" in what

    with pytest.raises(FileNotFoundError, match="nope"):  # a typo is not "use the hub"
        data.find_data_dir(tmp_path / "nope")


def test_default_search_finds_shared_next_to_checkout():
    repo = Path(data.__file__).resolve().parents[2]
    paths = [p for p, _ in sources._candidate_dirs()]
    assert paths[0] == (repo.parent / "shared" / "data").resolve()


def test_no_data_dir_uses_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_candidate_dirs", lambda: [])
    monkeypatch.setattr(sources, "HUB_SHA256", {})  # a stand-in text, not the pinned corpus
    calls = []
    monkeypatch.setattr(sources, "_open_hub", lambda *a: calls.append(a) or HubSplit("from hub\n"))
    assert data.load_text("wikitext2", "test") == "from hub\n"
    assert calls == [("Salesforce/wikitext", "wikitext-2-v1", "test")]


def test_missing_local_file_falls_back_to_hub(tmp_path, monkeypatch):
    (tmp_path / "wikitext-2-v1").mkdir()  # a data dir without this split
    with pytest.raises(RuntimeError, match="test.txt does not exist.*hub failed"):
        data.load_text("wikitext2", "test", data_dir=tmp_path)
    monkeypatch.setattr(sources, "_open_hub", lambda *a: HubSplit("hub text"))
    monkeypatch.setattr(sources, "HUB_SHA256", {})  # a stand-in text, not the pinned corpus
    assert data.load_text("wikitext2", "test", data_dir=tmp_path) == "hub text"


def test_hub_loader_joins_rows(monkeypatch):
    """HF rows keep their own newlines, so they are joined as they are, except that an
    empty Salesforce/wikitext row was a blank line, " \\n"; rows are read in batches, and
    the text is the same across a batch's edge (tests/test_data_hub.py runs the real loader
    on parquet stand-ins of the hub repositories)."""
    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split))
        return HubSplit("", " = Title = \n", "", " Body text .\n")

    fake = type(sys)("datasets")
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(sources, "_open_hub", _real_open_hub)
    monkeypatch.setattr(sources, "_candidate_dirs", lambda: [])
    monkeypatch.setattr(sources, "HUB_BATCH_ROWS", 3)  # the last row in a batch of its own
    source = data.text_source("wikitext2", "train", variant="wikitext-2-raw-v1")
    assert list(source.pieces()) == [" \n = Title = \n \n", " Body text .\n"]
    assert data.load_text("wikitext2", "train", variant="wikitext-2-raw-v1") == " \n = Title = \n \n Body text .\n"
    assert sources._join_hub_rows("elsewhere/corpus", ["", " = Title = \n"]) == " = Title = \n"
    assert calls == [("Salesforce/wikitext", "wikitext-2-raw-v1", "train")] * 2


# -----------------------------------------------------------------------------
# offline corpora


@pytest.mark.parametrize("split", data.SPLITS)
def test_wikitext2_offline(shared, split, caplog):
    with caplog.at_level(logging.INFO, logger="nodelm_lib.data"):
        text = data.load_text("wikitext2", split)
    n_bytes, n_lines = WIKITEXT2[split]
    assert len(text.encode("utf-8")) == n_bytes
    assert text.count("\n") == n_lines  # kept as is, newlines included
    assert str(shared / "wikitext-2-v1" / f"{split}.txt") in caplog.text


def test_tinyshakespeare_splits_partition_file(shared):
    full = (shared / "tinyshakespeare" / "input.txt").read_bytes().decode("utf-8")
    assert len(full) == SHAKESPEARE_BYTES
    parts = {s: data.load_text("tinyshakespeare", s) for s in data.SPLITS}
    assert {s: len(t) for s, t in parts.items()} == SHAKESPEARE_SPLITS
    assert "".join(parts[s] for s in data.SPLITS) == full


def test_checksum_mismatch_names_file_and_hashes(shared, tmp_path):
    rel = "wikitext-2-v1/validation.txt"
    copy = tmp_path / rel
    copy.parent.mkdir()
    shutil.copyfile(shared / rel, copy)
    assert data.load_text("wikitext2", "validation", data_dir=tmp_path)  # intact: fine

    raw = bytearray(copy.read_bytes())
    raw[1000] ^= 0x01  # same size; only the content (and mtime) changes
    copy.write_bytes(bytes(raw))
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    with pytest.raises(RuntimeError) as err:
        data.load_text("wikitext2", "validation", data_dir=tmp_path)
    msg = str(err.value)
    assert str(copy) in msg
    assert data.SHA256[rel] in msg
    assert hashlib.sha256(bytes(raw)).hexdigest() in msg


def test_checksum_is_cached_per_process(shared, monkeypatch):
    data.load_text("wikitext2", "test")

    class NoHash:
        @staticmethod
        def sha256(*a):
            raise AssertionError("rehashed an unchanged file")

    monkeypatch.setattr(sources, "hashlib", NoHash)
    assert len(data.load_text("wikitext2", "test")) > 0


# -----------------------------------------------------------------------------
# errors


def test_unknown_names_list_valid_choices(shared, tmp_path):
    cases = [
        (lambda: data.load_text("ptb", "train"), data.CORPORA),
        (lambda: data.load_text("wikitext2", "dev"), data.SPLITS),
        (lambda: data.get_tokenizer("bpe"), data.TOKENIZERS),
        (lambda: data.load_tokens("wikitext2", "test", "bpe", cache_dir=tmp_path), data.TOKENIZERS),
        (lambda: data.load_text("wikitext2", "test", variant="wikitext-3"),
         data.WIKITEXT_VARIANTS["wikitext2"]),
    ]
    for call, valid in cases:
        with pytest.raises(ValueError) as err:
            call()
        for name in valid:
            assert name in str(err.value)


def test_hub_only_corpora_fail_clearly_offline(shared):
    with pytest.raises(RuntimeError, match="wikitext103.*only available from the Hugging Face hub"):
        data.load_text("wikitext103", "validation")
    with pytest.raises(RuntimeError, match="wikitext-2-raw-v1.*only available from the Hugging Face hub"):
        data.load_text("wikitext2", "train", variant="wikitext-2-raw-v1")


def test_hub_only_corpora_load_from_hub(shared, monkeypatch):
    calls = []
    monkeypatch.setattr(sources, "_open_hub", lambda *a: calls.append(a) or HubSplit(" = A = \n"))
    assert data.load_text("wikitext103", "test") == " = A = \n"
    data.load_text("wikitext2", "train", variant="wikitext-2-raw-v1")
    assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "test"),
                     ("Salesforce/wikitext", "wikitext-2-raw-v1", "train")]


# -----------------------------------------------------------------------------
# tokenizers


def test_char_tokenizer_round_trip():
    tok = data.get_tokenizer("char")
    text = "Hello, wörld — 日本語 🙂\n<|endoftext|>"
    ids = tok.encode(text)
    assert tok.name == "char" and tok.vocab_size == 256
    assert len(ids) == len(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.decode(ids[:-1] + [0xE6]) .endswith("\ufffd")  # half a character: no crash
    assert np.array_equal(tok.encode_array(text), ids)


def test_gpt2_tokenizer_offline(shared):
    if not (shared / "tiktoken_cache").is_dir():
        pytest.skip(f"no tiktoken cache at {shared / 'tiktoken_cache'}")
    tok = data.get_tokenizer("gpt2")  # sets TIKTOKEN_CACHE_DIR from the data dir
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(shared / "tiktoken_cache")
    assert tok.vocab_size == 50257
    assert tok.encode("Hello world") == [15496, 995]
    text = "a<|endoftext|>b"  # special-token text is plain text, not an error
    assert tok.decode(tok.encode(text)) == text


def test_configure_tiktoken_cache_respects_user_setting(shared, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/somewhere/else")
    data.configure_tiktoken_cache()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == "/somewhere/else"


def test_a_failed_gpt2_load_names_the_users_tiktoken_cache(monkeypatch):
    # a lent GPU's image sets TIKTOKEN_CACHE_DIR to a cache without GPT-2's files: the error must
    # say which cache was used, since the data dir's one is then not read
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/opt/tiktoken_cache")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(RuntimeError, match="TIKTOKEN_CACHE_DIR is /opt/tiktoken_cache"):
        data.get_tokenizer("gpt2")


# -----------------------------------------------------------------------------
# token cache


def test_token_cache_hit_on_second_call(shared, tmp_path, monkeypatch):
    text = data.load_text("tinyshakespeare", "validation")
    ids = data.load_tokens("tinyshakespeare", "validation", "char", cache_dir=tmp_path)
    assert ids.dtype == np.uint16 and ids.ndim == 1
    assert np.array_equal(ids, np.frombuffer(text.encode(), np.uint8))
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".npy"]  # tokens and manifest; no temp file left
    assert files[0].stem == files[1].stem
    umask = os.umask(0)
    os.umask(umask)
    for f in files:  # shareable, unlike mkstemp's 0600
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask

    def boom(self, text):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr(data.CharTokenizer, "encode_array", boom)
    again = data.load_tokens("tinyshakespeare", "validation", "char", cache_dir=tmp_path)
    assert np.array_equal(again, ids)


def test_token_cache_default_dir_from_env(shared, tmp_path, monkeypatch):
    monkeypatch.setenv("NODELM_CACHE_DIR", str(tmp_path))
    data.load_tokens("tinyshakespeare", "test", "char")
    assert len(list(tmp_path.glob("tinyshakespeare-test-char-*.npy"))) == 1


def test_token_cache_key_depends_on_tokenizer_and_text(tmp_path):
    key = lambda tok, text: data.token_cache_path("c", "train", tok, text, tmp_path)
    assert key("char", "abc") == key("char", "abc")
    assert key("char", "abc") != key("gpt2", "abc")
    assert key("char", "abc") != key("char", "abd")
    streamed = data.token_cache_path("c", "train", "char", cache_dir=tmp_path,
                                     text_sha256=hashlib.sha256(b"abc").hexdigest())
    assert streamed == key("char", "abc")  # a streamed text's hash names the same file
    with pytest.raises(TypeError, match="not both"):
        data.token_cache_path("c", "train", "char", "abc", tmp_path, text_sha256="0" * 64)


def test_token_cache_gpt2(shared, tmp_path):
    if not (shared / "tiktoken_cache").is_dir():
        pytest.skip(f"no tiktoken cache at {shared / 'tiktoken_cache'}")
    char = data.load_tokens("tinyshakespeare", "test", "char", cache_dir=tmp_path)
    bpe = data.load_tokens("tinyshakespeare", "test", "gpt2", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npy"))) == 2
    assert bpe.dtype == np.uint16 and 0 < len(bpe) < len(char)
    tok = data.get_tokenizer("gpt2")
    assert tok.decode(bpe) == data.load_text("tinyshakespeare", "test")


# -----------------------------------------------------------------------------
# batches


def test_sample_batch_windows():
    tokens = torch.arange(1000)
    x, y = data.sample_batch(tokens, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # y is x shifted by one token
    assert torch.equal(x - x[:, :1], torch.arange(16).expand(8, 16))  # contiguous windows
    assert x.min() >= 0 and y.max() <= 999


def test_sample_batch_covers_last_window_and_accepts_uint16():
    tokens = np.arange(11, dtype=np.uint16)  # exactly seq_len + 1: one possible window
    x, y = data.sample_batch(tokens, 3, 10, torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64
    assert torch.equal(x, torch.arange(10).expand(3, 10))
    assert torch.equal(y, torch.arange(1, 11).expand(3, 10))


def test_sample_batch_seeded():
    tokens = torch.randint(0, 256, (5000,))
    draw = lambda seed: data.sample_batch(tokens, 4, 32, torch.Generator().manual_seed(seed))
    a, b, c = draw(1), draw(1), draw(2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_sample_batch_too_short():
    with pytest.raises(ValueError, match="seq_len"):
        data.sample_batch(torch.arange(10), 2, 10, torch.Generator())


def test_fixed_batches_identical_across_calls():
    tokens = torch.randint(0, 256, (5000,))
    first = data.fixed_batches(tokens, 3, 4, 32, seed=7)
    torch.manual_seed(123)  # the global RNG must not matter
    second = data.fixed_batches(tokens, 3, 4, 32, seed=7)
    other = data.fixed_batches(tokens, 3, 4, 32, seed=8)
    assert len(first) == 3
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first[0][0], other[0][0])
    assert not torch.equal(first[0][0], first[1][0])  # batches differ from each other
