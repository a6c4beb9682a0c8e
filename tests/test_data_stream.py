"""nodelm_lib.data's streamed path: a split read in pieces, tokenised chunk by chunk into a
``.npy`` token cache with a manifest, memory-mapped when large, and batches drawn from it.

Its tokens must equal the in-memory path's (``encode_array`` of the whole text), and the
memory it takes must not grow with the corpus: ``test_tokenising_a_large_corpus_takes_bounded_memory``
tokenises a generated 256 MiB WikiText-103 stand-in in a subprocess and bounds its peak RSS.
WikiText-103 itself is not in the offline data; the stand-ins are laid out as a copy of it
added to the data dir would be (tests/test_data_hub.py has one laid out as on the hub).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nodelm_lib import data
from nodelm_lib.data import sources

# the peak RSS that tokenising a corpus may add to a process, whatever the corpus's size
RSS_CAP_MIB = 64


@pytest.fixture(autouse=True)
def offline(offline_data):
    """No hub, no stray env (conftest.offline_data): each test sets what it needs."""


@pytest.fixture
def tiktoken_cache(shared_dir, monkeypatch) -> Path:
    """The GPT-2 BPE files, for a data dir (a stand-in) that does not have them."""
    cache = shared_dir / "tiktoken_cache"
    if not cache.is_dir():
        pytest.skip(f"no tiktoken cache at {cache}")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache


WORDS = ["the", "of", "and", "Valkyria", "Chronicles", "@-@", "1", "@,@", "000", "<unk>", "don't",
         "it's", "'s", "日本語", "café", "(", ")", ",", ".", '"', "1998", "=", ";", "Sega", "III"]


def wikitext_like(n_lines: int, seed: int = 0) -> str:
    """Text laid out as WikiText's files are: lines that start with a space and end " \\n",
    headings " = ... = ", blank lines " \\n", words, numbers, punctuation, some non-ASCII."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        r = rng.random()
        if r < 0.15:
            lines.append(" \n")
        elif r < 0.2:
            lines.append(f" = {' '.join(rng.choices(WORDS, k=3))} = \n")
        else:
            lines.append(" " + " ".join(rng.choices(WORDS, k=rng.randint(1, 60))) + " \n")
    return "".join(lines)


def add_wikitext103(root: Path, splits: dict[str, str], variant: str = "wikitext-103-raw-v1") -> Path:
    """A copy of WikiText-103 added to data dir ``root`` as ``<variant>/<split>.txt``."""
    for split, text in splits.items():
        path = root / variant / f"{split}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


@pytest.fixture
def standin(tmp_path, monkeypatch) -> Path:
    """A small WikiText-103 stand-in, read and tokenised in pieces of 1000 characters."""
    monkeypatch.setattr(sources, "STREAM_CHARS", 1000)
    return add_wikitext103(tmp_path / "data", {"train": wikitext_like(3000, seed=1),
                                               "validation": wikitext_like(600, seed=2)})


# -----------------------------------------------------------------------------
# cutting text for GPT-2


def test_cut_text_cuts_at_the_first_match_past_the_size():
    bar = re.compile(r"(?<=\|)(?=.)")
    chunks = list(data.cut_text(["ab|cd|", "efgh|ij", "|k"], 3, bar))
    assert chunks == ["ab|", "cd|", "efgh|", "ij|", "k"]
    # a stretch without a match stays whole, however long
    assert list(data.cut_text(["abcdefgh"] * 3 + ["|x"], 2, bar)) == ["abcdefgh" * 3 + "|", "x"]
    assert list(data.cut_text([], 2, bar)) == []


def test_gpt2_safe_cuts_keep_the_whole_texts_ids(tiktoken_cache):
    """Random text from characters chosen to trip BPE at a cut (runs of mixed whitespace,
    contractions, non-ASCII letters and spaces, and \\x1c, which Python's regexes call whitespace
    and tiktoken's do not), cut at every GPT2_SAFE_CUT place: the ids are the whole text's.
    Cutting after every newline instead changes them, so the test can tell."""
    tok = data.get_tokenizer("gpt2")
    alphabet = ["a", "Z", " ", "\n", "\t", "\r", "'", "s", "ll", "1", ".", "=", "@", "é", "日",
                "\u00a0", "\x1c", "\x85", " \n", "\n ", "\n\n"]
    naive = re.compile(r"(?<=\n)(?=.)", re.S)
    rng = random.Random(0)
    cuts = naive_differs = 0
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50)))
        whole = tok.encode(text)
        chunks = list(data.cut_text([text], 1, data.GPT2_SAFE_CUT))
        assert "".join(chunks) == text
        assert [i for c in chunks for i in tok.encode(c)] == whole, chunks
        cuts += len(chunks) - 1
        naive_differs += [i for c in data.cut_text([text], 1, naive) for i in tok.encode(c)] != whole
    assert cuts > 500 and naive_differs > 50


@pytest.mark.parametrize("rel", ["wikitext-2-v1/validation.txt", "tinyshakespeare/input.txt"])
def test_gpt2_stream_equals_the_whole_text(shared_dir, tiktoken_cache, monkeypatch, rel):
    monkeypatch.setattr(sources, "STREAM_CHARS", 4096)
    tok = data.get_tokenizer("gpt2")
    path = shared_dir / rel
    chunks = list(tok.encode_stream(sources._file_pieces(path)))
    assert len(chunks) > 100  # cut at hundreds of places
    whole = tok.encode_array(path.read_bytes().decode("utf-8"))
    assert np.array_equal(np.concatenate(chunks), whole)


def test_char_stream_equals_the_whole_text():
    tok = data.get_tokenizer("char")
    text = "Hello, wörld — 日本語 🙂\n" * 50
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]  # cut anywhere, next to non-ASCII too
    assert np.array_equal(np.concatenate(list(tok.encode_stream(pieces))), tok.encode_array(text))


# -----------------------------------------------------------------------------
# WikiText-103 from a local copy


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_memmap_tokens_equal_the_in_memory_path(standin, tmp_path, request, monkeypatch, tokenizer):
    if tokenizer == "gpt2":
        request.getfixturevalue("tiktoken_cache")
    cache = tmp_path / "cache"
    tok = data.get_tokenizer(tokenizer)
    for split in ("train", "validation"):
        ids = data.load_tokens("wikitext103", split, tokenizer, data_dir=standin, cache_dir=cache, mmap=True)
        expected = tok.encode_array(data.load_text("wikitext103", split, data_dir=standin))
        assert isinstance(ids, np.memmap) and not ids.flags.writeable
        assert ids.dtype == np.uint16 and np.array_equal(ids, expected)
    assert len(list(cache.glob("*.npy"))) == len(list(cache.glob("*.json"))) == 2

    def boom(self, pieces):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr(type(tok), "encode_stream", boom)
    again = data.load_tokens("wikitext103", "validation", tokenizer, data_dir=standin, cache_dir=cache)
    assert type(again) is np.ndarray and again.flags.writeable  # small: read into memory
    assert np.array_equal(again, expected)


def test_small_corpora_keep_their_tokens(shared_dir, tiktoken_cache, tmp_path):
    """The offline corpora, streamed, give the tokens of their whole text, as arrays in memory."""
    for corpus, split, tokenizer in (("wikitext2", "validation", "gpt2"), ("wikitext2", "test", "char"),
                                     ("tinyshakespeare", "test", "gpt2"), ("tinyshakespeare", "train", "char")):
        ids = data.load_tokens(corpus, split, tokenizer, data_dir=shared_dir, cache_dir=tmp_path)
        text = data.load_text(corpus, split, data_dir=shared_dir)
        assert type(ids) is np.ndarray
        assert np.array_equal(ids, data.get_tokenizer(tokenizer).encode_array(text)), (corpus, split, tokenizer)


def test_official_zip_layout_and_unpinned_copy(tmp_path, caplog):
    """WikiText-103 as its zip unpacks (wikitext-103-raw/wiki.valid.raw) is found too; a copy
    the offline data does not pin is used with one warning that says so."""
    text = wikitext_like(50)
    path = tmp_path / "wikitext-103-raw" / "wiki.valid.raw"
    path.parent.mkdir()
    path.write_bytes(text.encode())
    with caplog.at_level(logging.INFO, logger="nodelm_lib.data"):
        assert data.load_text("wikitext103", "validation", data_dir=tmp_path) == text
        assert data.load_text("wikitext103", "validation", data_dir=tmp_path) == text
    assert caplog.text.count(f"{path} has no pinned sha256") == 1
    add_wikitext103(tmp_path, {"validation": "ours\n"})  # <config>/<split>.txt comes first
    assert data.load_text("wikitext103", "validation", data_dir=tmp_path) == "ours\n"


def test_missing_wikitext103_names_where_a_copy_goes(tmp_path):
    with pytest.raises(RuntimeError) as err:
        data.load_tokens("wikitext103", "test", "char", data_dir=tmp_path, cache_dir=tmp_path)
    msg = str(err.value)
    assert "only available from the Hugging Face hub or a copy added to the data dir" in msg
    assert f"{tmp_path / 'wikitext-103-raw-v1' / 'test.txt'} does not exist" in msg
    with pytest.raises(ValueError, match="wikitext-103-raw-v1, wikitext-103-v1"):
        data.load_tokens("wikitext103", "test", "char", variant="wikitext-103", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"mmap='yes' is not valid; it must be True, False or None"):
        data.load_tokens("wikitext103", "test", "char", data_dir=tmp_path, mmap="yes")


def test_wikitext103_is_a_dataset_of_the_configs_and_profiles():
    """The gpu profile's WikiText-103 variant names a corpus the config accepts; a misspelt one
    is refused with the valid names."""
    import yaml

    import nodelm_lib as nl

    assert nl.TrainConfig(dataset="wikitext103", tokenizer="gpt2").dataset == "wikitext103"
    with pytest.raises(ValueError, match=r"dataset='wikitext-103' is not valid; choose one of "
                                         r"'wikitext2', 'wikitext103', 'tinyshakespeare'"):
        nl.TrainConfig(dataset="wikitext-103")
    params = Path(data.__file__).resolve().parents[2] / "params"
    profile = yaml.safe_load((params / "02_seed_comparison" / "gpu_wikitext103.yaml").read_text())
    assert (profile["dataset"], profile["tokenizer"]) == ("wikitext103", "gpt2")
    for path in params.glob("*/*.yaml"):
        values = yaml.safe_load(path.read_text())
        assert values.get("dataset", "wikitext2") in data.CORPORA, path


# -----------------------------------------------------------------------------
# the cache: written atomically, checked on every read


def cached(standin, cache, **kw):
    return data.load_tokens("wikitext103", "validation", "char", data_dir=standin, cache_dir=cache, **kw)


def test_a_killed_tokenisation_leaves_no_cache(standin, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real = data.CharTokenizer.encode_stream

    def killed(self, pieces):
        stream = real(self, pieces)
        yield next(stream)
        raise KeyboardInterrupt  # as a Ctrl-C (or a kill) midway would

    monkeypatch.setattr(data.CharTokenizer, "encode_stream", killed)
    with pytest.raises(KeyboardInterrupt):
        cached(standin, cache)
    assert list(cache.iterdir()) == []  # no cache, no manifest, no temporary file
    monkeypatch.setattr(data.CharTokenizer, "encode_stream", real)
    text = data.load_text("wikitext103", "validation", data_dir=standin)
    assert np.array_equal(cached(standin, cache), np.frombuffer(text.encode(), np.uint8))


@pytest.mark.parametrize("damage, problem", [
    ("drop manifest", "without a readable manifest"),
    ("flip a token", "corrupt: its tokens' sha256 is"),
    ("append bytes", "bytes long, not the"),
    ("cut short", "unreadable (ValueError"),
    ("manifest of another text", "not what its manifest says (text_sha256"),
])
def test_a_damaged_cache_is_rebuilt_with_a_warning(standin, tmp_path, caplog, damage, problem):
    cache = tmp_path / "cache"
    first = np.array(cached(standin, cache))
    (npy,) = cache.glob("*.npy")
    manifest = npy.with_suffix(".json")
    raw = bytearray(npy.read_bytes())
    if damage == "drop manifest":  # killed between writing the tokens and their manifest
        manifest.unlink()
    elif damage == "flip a token":
        raw[-10] ^= 0x01
        npy.write_bytes(bytes(raw))
    elif damage == "append bytes":
        npy.write_bytes(bytes(raw) + b"\0\0")
    elif damage == "cut short":
        npy.write_bytes(bytes(raw[:-100]))
    else:
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "text_sha256": "0" * 64}))
    with caplog.at_level(logging.WARNING, logger="nodelm_lib.data"):
        again = cached(standin, cache, mmap=True)
    assert f"token cache {npy} is " in caplog.text and problem in caplog.text
    assert "tokenising again" in caplog.text
    assert np.array_equal(again, first)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nodelm_lib.data"):
        assert np.array_equal(cached(standin, cache), first)  # rebuilt on disk: no warning now
    assert "token cache" not in caplog.text


def test_a_corpus_that_changes_while_tokenised_is_refused(tmp_path):
    """The text is hashed (the cache key), then read again to tokenise: if it changed in
    between, the tokens would sit under the old text's key."""
    texts = iter(["the text when hashed\n", "the text when tokenised\n"])
    source = data.TextSource("a stand-in", lambda: iter([next(texts)]))
    key = source.sha256()
    with pytest.raises(RuntimeError, match=r"a stand-in changed while it was tokenised"):
        data.write_token_cache(tmp_path / "c.npy", data.get_tokenizer("char"), source, key)
    assert list(tmp_path.iterdir()) == []


# -----------------------------------------------------------------------------
# batches from the memmap


def test_batches_from_a_memmap_equal_those_from_a_tensor(standin, tmp_path):
    """Same draws, same windows: a run's numbers do not depend on how its tokens are held."""
    ids = data.load_tokens("wikitext103", "train", "char", data_dir=standin, cache_dir=tmp_path, mmap=True)
    assert isinstance(ids, np.memmap)
    tensor = torch.from_numpy(np.array(ids).astype(np.int64))
    for seed in range(3):
        a = data.sample_batch(ids, 8, 64, torch.Generator().manual_seed(seed))
        b = data.sample_batch(tensor, 8, 64, torch.Generator().manual_seed(seed))
        assert a[0].dtype == torch.int64 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for (xa, ya), (xb, yb) in zip(data.fixed_batches(ids, 3, 4, 32, seed=7), data.fixed_batches(tensor, 3, 4, 32, seed=7)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    for max_windows in (None, 5):
        pairs = zip(data.split_windows(ids, 4, 32, max_windows), data.split_windows(tensor, 4, 32, max_windows))
        for (xa, ya), (xb, yb) in pairs:
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_runs_numbers_do_not_depend_on_how_its_tokens_are_held(shared_dir, tmp_path, monkeypatch):
    """nl.train draws from load_tokens' array now; holding the split as an int64 tensor, as it
    did before, gives the same losses, step by step and at the end."""
    import nodelm_lib as nl

    from nodelm_lib.training import evaluation, loop

    monkeypatch.setenv("NODELM_CACHE_DIR", str(tmp_path))
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    tc = nl.TrainConfig(model=model, dataset="tinyshakespeare", batch_size=4, seq_len=16, max_steps=4,
                        warmup_steps=1, eval_interval=2, eval_batches=2, eval_on="whole_split_at_end",
                        device="cpu", progress=False, data_dir=str(shared_dir))
    now = nl.train(tc)
    held = evaluation.split_tokens
    as_tensor = lambda tc, split: torch.from_numpy(held(tc, split).astype(np.int64))  # noqa: E731
    monkeypatch.setattr(loop, "split_tokens", as_tensor)  # the training split
    monkeypatch.setattr(evaluation, "split_tokens", as_tensor)  # the evaluation batches
    before = nl.train(tc)
    assert [m["loss"] for m in now.metrics] == [m["loss"] for m in before.metrics]
    assert [e["val_loss"] for e in now.evals] == [e["val_loss"] for e in before.evals]
    assert now.final == before.final and now.final["test_loss"] > 0


# -----------------------------------------------------------------------------
# memory


CHILD = r'''
import json, sys
from pathlib import Path

import numpy as np
import torch

from nodelm_lib import data


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_kib():
    # VmHWM, not getrusage's ru_maxrss: that also keeps the peak of threads that have exited
    return status_kib("VmHWM")


def restart_peak():
    # Linux: the peak RSS starts again from the current RSS; where it cannot, the peak so far
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return peak_kib()


root, cache, tokenizer = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
data.get_tokenizer(tokenizer, data_dir=root)  # tiktoken's tables: not the corpus's memory
x, y = data.sample_batch(np.arange(1000), 2, 8, torch.Generator())  # torch's first-call set-up, likewise

base = restart_peak()
ids = data.load_tokens("wikitext103", "train", tokenizer, data_dir=root, cache_dir=cache)
tokenising = peak_kib() - base

# Batches fault in pages of the memory-mapped cache: page cache, mapped (RssFile) and kept, not
# memory of the process's own. What the draws allocate is the growth of the peak less that.
base, mapped = restart_peak(), status_kib("RssFile")
x, y = data.sample_batch(ids, 32, 128, torch.Generator().manual_seed(0))
data.fixed_batches(ids, 4, 32, 128, seed=1)
data.split_windows(ids, 32, 128, max_windows=64)
batches = peak_kib() - base - (status_kib("RssFile") - mapped)

path = root / "wikitext-103-raw-v1" / "train.txt"
with open(path, "rb") as f:
    head = f.read(4096)
    f.seek(-4096, 2)
    tail = f.read()
first = data.get_tokenizer(tokenizer).encode_array(head.decode("utf-8", errors="ignore"))[:100]
ends = np.array_equal(ids[:100], first)
if tokenizer == "char":
    ends = ends and bytes(ids[-4096:].astype(np.uint8)) == tail
print(json.dumps({"tokenising_kib": tokenising, "batches_kib": batches, "tokens": len(ids),
                  "memmap": isinstance(ids, np.memmap), "ends_match": ends}))
'''


def write_standin(path: Path, size: int) -> int:
    """A WikiText-like file of about ``size`` bytes: a 1 MiB block of lines, written again and
    again (each block ends a line, so the file is lines throughout). Returns its size."""
    block = wikitext_like(20000).encode()
    block = block[:block.rindex(b"\n", 0, 1 << 20) + 1]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(max(1, size // len(block))):
            f.write(block)
    return path.stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer, mib", [("char", 256), ("gpt2", 16)])
def test_tokenising_a_large_corpus_takes_bounded_memory(tmp_path, request, tokenizer, mib):
    """Tokenising a WikiText-103 stand-in in a fresh process (``load_tokens`` on a cache miss:
    hash, tokenise, write, check, map) raises its peak RSS by less than RSS_CAP_MIB, far below
    the corpus (``mib`` MiB of text; 256 MiB of characters make a 512 MiB uint16 cache) and below
    what holding it whole would take (the text, and for GPT-2 a Python list of ~70 bytes per
    token); so do batches drawn from the memmap, less the cache pages they map."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(data.__file__).resolve().parents[2])}
    if tokenizer == "gpt2":
        env["TIKTOKEN_CACHE_DIR"] = str(request.getfixturevalue("tiktoken_cache"))
    root, cache = tmp_path / "data", tmp_path / "cache"
    size = write_standin(root / "wikitext-103-raw-v1" / "train.txt", mib << 20)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = subprocess.run([sys.executable, str(script), str(root), str(cache), tokenizer],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    tokenising, batches = result["tokenising_kib"] / 1024, result["batches_kib"] / 1024
    print(f"{tokenizer}: {size / 2**20:.0f} MiB of text, {result['tokens']:,} tokens; peak RSS grew by "
          f"{tokenising:.1f} MiB tokenising, {batches:.1f} MiB drawing batches (cap {RSS_CAP_MIB} MiB)")
    assert result["ends_match"]
    if tokenizer == "char":  # 512 MiB of uint16 ids: mapped, not read (gpt2's 13 MiB are read)
        assert result["tokens"] == size and result["memmap"]
    assert tokenising < RSS_CAP_MIB and batches < RSS_CAP_MIB
