"""Config validation, YAML round-trips and command-line style overrides."""

import hashlib
import json
from pathlib import Path

import pytest

import nodelm_lib as nl
from nodelm_lib.config import (HASHED_ONLY_IF_CHANGED, NON_SEMANTIC_KEYS, apply_overrides, from_dict, load_yaml,
                               save_yaml, to_dict)
from nodelm_lib.training.integrity import HASH_NAME


def test_yaml_round_trip(tmp_path):
    tc = nl.TrainConfig(model=nl.ModelConfig(arch="hybrid", d_model=96, ode=nl.ODEConfig(method="rk4", n_steps=6)),
                        lr=3e-4, max_steps=17)
    save_yaml(tc, tmp_path / "c.yaml")
    back = load_yaml(tmp_path / "c.yaml")
    assert back == tc and isinstance(back.model.ode, nl.ODEConfig)
    assert back.config_hash() == tc.config_hash()


def test_overrides_parse_types_and_nested_keys():
    tc = apply_overrides(nl.TrainConfig(), ["model.arch=hybrid", "max_steps=500", "lr=1e-3",
                                            "model.ode.method=rk4", "progress=false"])
    assert tc.model.arch == "hybrid" and tc.max_steps == 500 and tc.lr == 1e-3
    assert tc.model.ode.method == "rk4" and tc.progress is False


@pytest.mark.parametrize("override, message", [
    (["model.arch=transformer"], r"model.arch='transformer' is not valid; choose one of 'gpt', 'hybrid'"),
    (["model.ode.method=rk5"], r"ode.method='rk5' is not valid; choose one of 'euler'"),
    (["dataset=ptb"], r"dataset='ptb' is not valid; choose one of 'wikitext2'"),
    (["max_stpes=3"], r"unknown key 'max_stpes'"),
    (["model.depth=3"], r"unknown key 'model.depth'"),
    (["max_steps=abc"], r"max_steps='abc' is not a valid int"),
    (["max_steps=0"], r"max_steps=0 is not valid; it must be > 0"),
    (["model.dropout=1.5"], r"model.dropout=1.5 is not valid"),
    (["model.n_heads=5"], r"d_model=64 is not divisible by model.n_heads=5"),
    (["seq_len=512"], r"seq_len=512 exceeds model.max_seq_len=128"),
    (["lr"], r"must look like key=value"),
])
def test_invalid_values_name_the_key_and_the_choices(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(nl.TrainConfig(), override)


def test_unknown_keys_in_a_dict_are_rejected_with_the_valid_keys():
    d = to_dict(nl.TrainConfig())
    d["model"]["widht"] = 3
    with pytest.raises(ValueError, match=r"unknown key\(s\) model.widht for ModelConfig; valid keys: arch"):
        from_dict(nl.TrainConfig, d)


def test_hybrid_span_is_checked():
    with pytest.raises(ValueError, match="ode_start=3, model.ode_end=3 is not a valid span"):
        nl.ModelConfig(arch="hybrid", n_layers=4, ode_start=3, ode_end=3)


def test_hash_ignores_where_a_run_is_written_but_not_what_it_computes():
    a = nl.TrainConfig()
    assert a.config_hash() == nl.TrainConfig(out_dir="/tmp/x", progress=False).config_hash()
    assert a.config_hash() != nl.TrainConfig(seed=1).config_hash()


RUNS = Path(__file__).resolve().parent.parent / "results" / "runs"


def test_committed_records_keep_their_hashes():
    """Every committed record of a store (named by its hash) hashes to its name from its stored
    config: fields added since (``HASHED_ONLY_IF_CHANGED``, e.g. model.position) are left out."""
    # the committed stores: a local "smoke" store (the notebooks' nbval runs, not committed) holds newer records
    records = sorted(p for p in RUNS.glob("*/*.json") if HASH_NAME.fullmatch(p.stem) and p.parent.name != "smoke")
    configs = {path: json.loads(path.read_text())["config"] for path in records}
    older = [path for path, config in configs.items() if "position" not in config["model"]]
    assert len(older) >= 50, f"expected the committed cpu stores under {RUNS}, made before model.position"
    for path, config in configs.items():
        assert from_dict(nl.TrainConfig, config).config_hash() == path.stem, path


def test_a_nested_field_added_later_is_hashed_only_when_changed():
    """model.position at its default leaves the hash what it was before the field existed (the
    hash of the config without it); any other value changes it."""
    tc = nl.TrainConfig()
    d = {k: v for k, v in to_dict(tc).items() if k not in NON_SEMANTIC_KEYS
         and not (k in HASHED_ONLY_IF_CHANGED and v == HASHED_ONLY_IF_CHANGED[k])}
    assert d["model"].pop("position") == "learned"
    for dotted, default in HASHED_ONLY_IF_CHANGED.items():  # model.ode's options, added later still
        if dotted.startswith("model.ode."):
            assert d["model"]["ode"].pop(dotted.rsplit(".", 1)[1]) == default
    before = hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert tc.config_hash() == before
    rope = nl.TrainConfig(model=nl.ModelConfig(position="rope"))
    assert rope.config_hash() != before
    assert from_dict(nl.TrainConfig, to_dict(rope)).config_hash() == rope.config_hash()
