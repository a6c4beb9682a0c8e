"""Model families are declared once (``nodelm_lib/families.py``): a family defined only in this file
builds, trains, is causal and is listed wherever the library lists families; the declarations are
torch-free and agree with the registry; and no committed record's config hash moved."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import nodelm_lib as nl
from nodelm_lib import config, families, models
from nodelm_lib.config import for_arch, from_dict
from nodelm_lib.experiments.protocol import architecture_arms
from nodelm_lib.families import Family
from nodelm_lib.nn.layers import CausalSelfAttention

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- a family of this file only
# The worked example of docs/guides/adding-a-family.md: everything a family of the library has,
# in one place (there, a file in nodelm_lib/models/).


class AttentionBlock(nn.Module):
    """x + Attn(LN(x)): a transformer block without its MLP."""

    def __init__(self, cfg: nl.ModelConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.bias, cfg.position == "rope")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))


class AttentionOnlyLM(models.CausalLM):
    """``attn_only``: ``n_layers`` attention-only blocks between the shared embeddings and head."""

    def __init__(self, cfg: nl.ModelConfig):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(AttentionBlock(cfg) for _ in range(cfg.n_layers))
        self.init_weights(n_residual_layers=cfg.n_layers)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


FAMILY = Family("attn_only", has_mlp=False, summary="attention-only blocks (a test family)")


@pytest.fixture
def attn_only():
    """The test family, registered for one test and removed after it, so that other tests see
    the library's families only."""
    models.register_family(FAMILY, AttentionOnlyLM)
    yield nl.ModelConfig(arch="attn_only", vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
    models.unregister_family("attn_only")


def test_the_test_family_builds_is_causal_and_decodes(attn_only):
    torch.manual_seed(0)
    model = nl.build_model(attn_only).eval()
    assert isinstance(model, AttentionOnlyLM) and len(model.blocks) == 2
    idx = torch.randint(0, 64, (2, 16))
    base, _ = model(idx)
    for j in (0, 5, 15):  # changing token j never changes the logits before j, and does from j on
        changed = idx.clone()
        changed[:, j] = (changed[:, j] + 1) % 64
        logits, _ = model(changed)
        torch.testing.assert_close(logits[:, :j], base[:, :j], rtol=0, atol=1e-6)
        assert (logits[:, j:] - base[:, j:]).abs().max() > 1e-6
    # it decodes through its modules (no frozen form: no fast path), with the KV cache as without
    prompt = idx[:, :4]
    assert torch.equal(nl.generate(model, prompt, 8, temperature=0),
                       nl.generate(model, prompt, 8, temperature=0, use_cache=False))


def test_the_test_family_trains(attn_only):
    tc = nl.TrainConfig(model=dataclasses.replace(attn_only, vocab_size=None), batch_size=4, seq_len=32, max_steps=3, lr=3e-3, warmup_steps=1,
                        eval_interval=3, eval_batches=1, progress=False)
    record = nl.train(tc)
    assert record.status == "completed" and len(record.metrics) == 3
    assert record.config_hash == record.train_config.config_hash() and record.train_config.model.arch == "attn_only"


def test_the_test_family_is_listed_wherever_families_are(attn_only):
    assert config.ARCHS == ("gpt", "hybrid", "node", "ti_mlp", "ti_ssm", "ssm", "looped", "attn_only")
    assert "attn_only" not in config.CONTINUOUS_ARCHS
    with pytest.raises(ValueError, match=r"choose one of 'gpt', .*'ssm', 'looped', 'attn_only'"):
        nl.ModelConfig(arch="rnn")
    moved = for_arch(nl.ModelConfig(arch="node", modulation="constant"), "attn_only")
    assert moved.arch == "attn_only" and moved.modulation == "time"  # node's exclusive option is reset
    assert config.apply_overrides(nl.TrainConfig(), ["model.arch=attn_only"]).model.arch == "attn_only"
    arms = architecture_arms(attn_only, ["gpt", "attn_only"])
    assert arms["attn_only"]["model"] == attn_only
    assert nl.count_params(attn_only)["non_embedding"] < nl.count_params(for_arch(attn_only, "gpt"))["non_embedding"]
    with pytest.raises(ValueError, match="attn_only has no MLP"):  # its declaration says so
        nl.match_params(attn_only, 10_000, by="mlp_ratio")
    with pytest.raises(ValueError, match="model.parallel applies to the discrete blocks of gpt, hybrid, ssm, looped"):
        dataclasses.replace(attn_only, parallel=True)  # an option it does not declare


def test_the_test_family_is_gone_after_its_test():
    assert "attn_only" not in config.ARCHS
    with pytest.raises(ValueError, match="model.arch='attn_only' is not valid"):
        nl.ModelConfig(arch="attn_only")


# --------------------------------------------------------------------------- the declarations


def test_the_families_and_their_order():
    """ARCHS lists the families in the order their files register them (models/__init__.py)."""
    assert config.ARCHS == ("gpt", "hybrid", "node", "ti_mlp", "ti_ssm", "ssm", "looped")
    assert config.CONTINUOUS_ARCHS == ("node", "ti_mlp", "ti_ssm")


@pytest.mark.parametrize("name", families.names())
def test_every_family_is_declared_and_built_by_its_class(name):
    family, cls = families.get(name), models.model_class(name)
    assert family.name == name and family.summary
    assert family.continuous == issubclass(cls, models.ContinuousDepthLM)
    defaults = {f.name: f.default for f in dataclasses.fields(nl.ModelConfig)}
    assert all(defaults[o.name] == o.default for o in family.options)
    cfg = for_arch(nl.ModelConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=3, max_seq_len=16), name)
    model = nl.build_model(cfg)
    assert type(model) is cls
    if family.time_dependent_weights:  # what the spectral analysis reads
        assert isinstance(model.field, models.TimeDependentField)
        weights = model.field.weights_at(torch.tensor(0.5))
        assert weights["w_qkv"].shape == (96, 32) and (weights["w_1"] is not None) == family.has_mlp


def test_registering_checks_the_declaration_against_the_class_and_the_config():
    with pytest.raises(ValueError, match="already registered"):
        models.register_family(Family("gpt"), models.GPT)
    with pytest.raises(TypeError, match="declares continuous=True"):
        models.register_family(Family("bad", continuous=True), AttentionOnlyLM)
    with pytest.raises(ValueError, match="must be a ModelConfig field"):
        models.register_family(Family("bad", options=(families.Option("hyper_dim", 5),)), AttentionOnlyLM)
    with pytest.raises(ValueError, match="must be an identifier"):
        Family("not a name")
    assert "bad" not in config.ARCHS


def test_the_declaration_module_is_torch_free():
    """families.py imports the standard library only, and loads without torch."""
    path = ROOT / "nodelm_lib" / "families.py"
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported <= {"__future__", "dataclasses", "typing"}, imported
    code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('families', {str(path)!r}); "
            f"m = sys.modules['families'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"assert 'torch' not in sys.modules; print(m.solver_steps(3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{'ode.n_steps': 3}"


# --------------------------------------------------------------------------- committed records


def committed_records() -> dict[Path, dict]:
    """Every JSON record under results/runs/** that holds a config and its hash (evaluations and
    other side files do not)."""
    records = {}
    for path in sorted((ROOT / "results" / "runs").rglob("*.json")):
        if path.parent.name == "smoke":  # a local store of the notebooks' nbval runs, not committed
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "config" in data and "config_hash" in data:
            records[path] = data
    return records


def test_every_committed_record_keeps_its_config_hash():
    """Each committed record builds under today's checks and hashes to the hash it was stored
    under (the declarations moved the checks, not what the hash covers)."""
    records = committed_records()
    assert len(records) >= 500, f"expected the committed stores under results/runs, found {len(records)} records"
    for path, record in records.items():
        assert from_dict(nl.TrainConfig, record["config"]).config_hash() == record["config_hash"], path
