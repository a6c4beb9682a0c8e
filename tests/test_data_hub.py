"""nodelm_lib.data's hub branch, end to end, on a local stand-in of the hub.

The hub sources must load with `datasets` >= 4.0, which runs no loading scripts: they are
repositories of parquet files (Salesforce/wikitext, karpathy/tiny_shakespeare). Here each
is rebuilt in tmp_path from the offline files, laid out as on the hub (README `configs`,
parquet files under the same paths, rows made the way the hub's rows were made), and
``$NODELM_HUB_MIRROR`` points at it. With no offline data dir, ``load_text`` takes the
hub branch and the real ``datasets.load_dataset`` reads the stand-in: nothing is mocked,
and nothing touches the network.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest

from nodelm_lib import data
from nodelm_lib.data import sources

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def shared_dir() -> Path:
    """The shared data dir, found by the library's own search order."""
    root, _ = data.find_data_dir()
    if root is None or not (root / "wikitext-2-v1").is_dir() or not (root / "tinyshakespeare").is_dir():
        pytest.skip("no offline data dir (../shared/data or $NODELM_DATA_DIR)")
    return root


@pytest.fixture
def mirror(tmp_path, monkeypatch) -> Path:
    """An empty hub mirror, no offline data dir, and a private `datasets` cache."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(sources, "_candidate_dirs", lambda: [])  # no ../shared/data either
    for var in ("NODELM_DATA_DIR", "NODELM_CACHE_DIR"):
        monkeypatch.setenv(var, "unset")
        monkeypatch.delenv(var)
    monkeypatch.setenv("NODELM_HUB_MIRROR", str(root))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return root


def offline_text(shared: Path, rel: str) -> str:
    return (shared / rel).read_bytes().decode("utf-8")


# -----------------------------------------------------------------------------
# stand-ins, laid out as the hub repositories are


def wikitext_rows(text: str) -> list[str]:
    """Rows as Salesforce/wikitext holds them: the rows its old loading script wrote
    (one per line of the file, newline kept; a blank line became "")."""
    return [line if line.strip() else "" for line in io.StringIO(text)]


def write_parquet(path: Path, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": pa.array(rows, pa.string())}), path)


def write_readme(repo: Path, configs: dict[str, list[tuple[str, str]]]) -> None:
    """A dataset card whose YAML `configs` name the data files, as the hub's do."""
    lines = ["---", "configs:"]
    for name, files in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        for split, pattern in files:
            lines += [f"  - split: {split}", f"    path: {pattern}"]
    (repo / "README.md").write_text("\n".join(lines + ["---", "", "# stand-in", ""]))


def make_wikitext(mirror: Path, configs: dict[str, dict[str, str]]) -> Path:
    """Salesforce/wikitext with these configs: <config>/<split>-00000-of-00001.parquet."""
    repo = mirror / data.WIKITEXT_HUB
    for config, splits in configs.items():
        for split, text in splits.items():
            write_parquet(repo / config / f"{split}-00000-of-00001.parquet", wikitext_rows(text))
    write_readme(repo, {c: [(s, f"{c}/{s}-*") for s in splits] for c, splits in configs.items()})
    return repo


def make_tiny_shakespeare(mirror: Path, full: str) -> Path:
    """karpathy/tiny_shakespeare: data/<split>-00000-of-00001.parquet, one row per split,
    cut as its old loading script cut input.txt (90%, then half of the rest, then the rest)."""
    i = int(len(full) * 0.9)
    train, rest = full[:i], full[i:]
    j = int(len(rest) * 0.5)
    splits = {"train": train, "validation": rest[:j], "test": rest[j:]}
    repo = mirror / data.TINYSHAKESPEARE_HUB
    for split, text in splits.items():
        write_parquet(repo / "data" / f"{split}-00000-of-00001.parquet", [text])
    write_readme(repo, {"default": [(s, f"data/{s}-*") for s in splits]})
    return repo


# -----------------------------------------------------------------------------
# the hub sources, rebuilt from the offline files, give the offline text exactly


@pytest.mark.parametrize("split", data.SPLITS)
def test_wikitext2_from_hub_equals_offline_file(shared_dir, mirror, split, caplog):
    expected = offline_text(shared_dir, f"wikitext-2-v1/{split}.txt")
    rows = wikitext_rows(expected)
    assert "" in rows and "".join(rows) != expected  # joining as is would lose the blank lines
    make_wikitext(mirror, {"wikitext-2-v1": {split: expected}})

    with caplog.at_level(logging.INFO, logger="nodelm_lib.data"):
        text = data.load_text("wikitext2", split)
    assert text == expected  # byte for byte, so also its pinned sha256
    assert "Salesforce/wikitext/wikitext-2-v1 from the Hugging Face hub mirror" in caplog.text


def test_tinyshakespeare_from_hub_equals_offline_cuts(shared_dir, mirror):
    full = offline_text(shared_dir, "tinyshakespeare/input.txt")
    make_tiny_shakespeare(mirror, full)
    parts = {s: data.load_text("tinyshakespeare", s) for s in data.SPLITS}
    assert parts == {s: sources._shakespeare_split(full, s) for s in data.SPLITS}
    assert "".join(parts[s] for s in data.SPLITS) == full


def test_hub_copy_that_differs_from_the_pinned_corpus_is_refused(shared_dir, mirror):
    text = offline_text(shared_dir, "wikitext-2-v1/validation.txt")
    make_wikitext(mirror, {"wikitext-2-v1": {"validation": text.replace(" the ", " a ", 1)}})
    with pytest.raises(RuntimeError, match="checksum mismatch for Salesforce/wikitext "
                                           r"\(wikitext-2-v1\) validation") as err:
        data.load_text("wikitext2", "validation")
    assert data.SHA256["wikitext-2-v1/validation.txt"] in str(err.value)


def test_hub_only_variants_rebuild_blank_lines(shared_dir, mirror):
    """Configs with no offline copy (and no pinned hash) go through the same join;
    a slice of the offline text stands in for their files."""
    lines = list(io.StringIO(offline_text(shared_dir, "wikitext-2-v1/test.txt")))
    piece = "".join(lines[:60])
    assert " \n" in lines[:60]
    make_wikitext(mirror, {"wikitext-2-raw-v1": {"train": piece},
                           "wikitext-103-raw-v1": {"validation": piece}})
    assert data.load_text("wikitext2", "train", variant="wikitext-2-raw-v1") == piece
    assert data.load_text("wikitext103", "validation") == piece


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_wikitext103_from_hub_streams_to_the_whole_texts_tokens(shared_dir, mirror, tmp_path, monkeypatch,
                                                                tokenizer):
    """A hub split goes through the streamed path a local copy does: rows read in batches, text
    tokenised in chunks into the memory-mapped cache. Its tokens are those of the whole text.
    WikiText-2's validation text stands in (WikiText-103's validation articles are the same)."""
    if tokenizer == "gpt2":
        if not (shared_dir / "tiktoken_cache").is_dir():
            pytest.skip(f"no tiktoken cache at {shared_dir / 'tiktoken_cache'}")
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(shared_dir / "tiktoken_cache"))
    text = offline_text(shared_dir, "wikitext-2-v1/validation.txt")
    make_wikitext(mirror, {"wikitext-103-raw-v1": {"validation": text}})
    monkeypatch.setattr(sources, "HUB_BATCH_ROWS", 100)  # ~38 batches of rows
    monkeypatch.setattr(sources, "STREAM_CHARS", 10_000)  # ~110 chunks
    ids = data.load_tokens("wikitext103", "validation", tokenizer, cache_dir=tmp_path / "cache", mmap=True)
    assert isinstance(ids, np.memmap)
    assert np.array_equal(ids, data.get_tokenizer(tokenizer).encode_array(text))


# -----------------------------------------------------------------------------
# errors


def test_loading_script_source_fails_clearly(mirror):
    """The legacy karpathy/tiny_shakespeare layout (a loading script, no data files):
    `datasets` >= 4 refuses it, and the error names the source and says why."""
    repo = mirror / data.TINYSHAKESPEARE_HUB
    repo.mkdir(parents=True)
    (repo / "tiny_shakespeare.py").write_text("import datasets  # legacy loading script\n")
    (repo / "README.md").write_text("---\npretty_name: TinyShakespeare\n---\n")
    with pytest.raises(RuntimeError) as err:
        data.load_text("tinyshakespeare", "train")
    msg = str(err.value)
    assert "karpathy/tiny_shakespeare" in msg
    assert "Dataset scripts are no longer supported, but found tiny_shakespeare.py" in msg
    assert "has a loading script, which `datasets` >= 4.0 no longer runs" in msg


def test_mirror_without_the_repository_is_an_error(mirror):
    with pytest.raises(RuntimeError, match="only available from the Hugging Face hub.*"
                                           "NODELM_HUB_MIRROR has no copy of Salesforce/wikitext"):
        data.load_text("wikitext103", "test")


def test_hub_ids_by_default(monkeypatch):
    monkeypatch.delenv("NODELM_HUB_MIRROR", raising=False)
    assert sources._hub_location(data.WIKITEXT_HUB) == "Salesforce/wikitext"
    assert data.HUB_SOURCES == {"wikitext2": "Salesforce/wikitext",
                                "wikitext103": "Salesforce/wikitext",
                                "tinyshakespeare": "karpathy/tiny_shakespeare"}
