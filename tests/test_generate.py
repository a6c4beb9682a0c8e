"""Decoding with and without the KV cache, sampling, model files and the generate / eval CLI."""

import os

import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.config import ARCHS
from nodelm_lib.generation.sampling import sample_next
import nodelm_lib.models.node as node_module
import nodelm_lib.nn.time_layers as time_layers
from nodelm_lib.nn.decode_cache import DecodeCache
from nodelm_lib.nn.time_layers import HyperLinear
from nodelm_lib.ode.solvers import FIXED_STEP_METHODS


def small(arch: str, method: str = "euler", **kw) -> nl.ModelConfig:
    base = dict(arch=arch, vocab_size=64, d_model=32, n_heads=4, n_layers=3, max_seq_len=24,
                ode=nl.ODEConfig(method=method, n_steps=3), time_features=8, time_hidden=16,
                ssm_state_size=4, ode_start=1, ode_end=2)
    base.update(kw)
    return nl.ModelConfig(**base)


def trained_like(cfg: nl.ModelConfig) -> nl.models.CausalLM:
    """A model moved off its initialisation (an untrained one predicts nearly uniformly,
    and greedy ties would make token equality meaningless)."""
    torch.manual_seed(0)
    model = nl.build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


# every arch with an ODE block at every fixed-step method; the loop is Euler's x + f(x) alone
CASES = [("gpt", "euler")] + [(arch, m) for arch in ARCHS if arch != "gpt"
                              for m in (FIXED_STEP_METHODS if arch != "looped" else ("euler",))]


@pytest.mark.parametrize("arch, method", CASES)
def test_greedy_decoding_with_cache_equals_recomputing(arch, method):
    """Same tokens and logits within 1e-5, past max_seq_len too (4 + 14 > 16 positions)."""
    model = trained_like(small(arch, method, n_layers=2, ode=nl.ODEConfig(method=method, n_steps=2),
                               max_seq_len=16))
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))
    cached, cached_logits = nl.generate(model, idx, 14, temperature=0, return_logits=True)
    plain, plain_logits = nl.generate(model, idx, 14, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(cached_logits, plain_logits, rtol=0, atol=1e-5)
    assert cached.shape == (2, 18) and torch.equal(cached[:, :4], idx)


def test_cached_pass_matches_the_full_forward_position_by_position():
    """Prefill 7 positions, then 1, then 3 at once: the logits of each pass equal the full
    forward's at those positions (the multi-position mask with a past is exercised)."""
    model = trained_like(small("node", "rk4"))
    idx = torch.randint(0, 64, (2, 11))
    full, _ = model(idx)
    cache = DecodeCache(model.cfg.max_seq_len)
    parts = [model(idx[:, :7], cache=cache)[0], model(idx[:, 7:8], cache=cache)[0], model(idx[:, 8:], cache=cache)[0]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    assert cache.length == 11


def test_time_dependent_weights_are_computed_once_per_step_not_per_token(monkeypatch):
    model = trained_like(small("node"))
    calls = []
    original = HyperLinear.weights_at
    monkeypatch.setattr(HyperLinear, "weights_at", lambda self, codes: calls.append(1) or original(self, codes))
    nl.generate(model, torch.zeros(1, 3, dtype=torch.long), 10, temperature=0)
    # the prefill pass: 4 layers x 3 Euler steps; the 9 single-token passes reuse them. Twice more
    # at t = 0 before it: fast_decode.supports freezes the field once to check that it can, asked
    # by generate and by the decoder
    assert len(calls) == 4 * 3 + 2 * 4


@pytest.mark.parametrize("arch, owner, name", [("hybrid", time_layers.TimeEmbedding, "embed"),
                                               ("node", node_module, "time_code"),
                                               ("ti_mlp", time_layers, "time_codes"),
                                               ("ti_ssm", time_layers, "time_codes")])
def test_what_depends_on_t_alone_is_computed_on_the_prefill_pass_only(monkeypatch, arch, owner, name):
    """The time embedding / time code / modulation trunk of every stage: once per (step,
    stage) on the first pass, never again for the single-token passes (rk4: 4 stages); and
    once in each of the two checks before it (``fast_decode.supports``)."""
    model = trained_like(small(arch, "rk4"))
    calls = []
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    nl.generate(model, torch.zeros(1, 3, dtype=torch.long), 10, temperature=0)
    assert len(calls) == 3 * 4 + 2  # 3 rk4 steps x 4 stages, all in the prefill pass; the two checks

def test_ssm_cache_keeps_one_recurrent_state_per_step_and_stage():
    model = trained_like(small("ti_ssm", "heun"))
    cache = DecodeCache(model.cfg.max_seq_len)
    model(torch.zeros(2, 6, dtype=torch.long), cache=cache)
    states = [s["state"] for s in cache._slots if "state" in s]
    assert len(states) == 3 * 2  # 3 steps x 2 Heun stages
    assert all(s.shape == (2, 32, 4) for s in states)  # (B, D, N): no growth with length


def test_the_cache_refuses_overflow_and_a_changed_call_sequence():
    model = trained_like(small("hybrid", "rk4"))
    cache = DecodeCache(model.cfg.max_seq_len)
    model(torch.zeros(1, 24, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds max_seq_len=24"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    cache = DecodeCache(model.cfg.max_seq_len)
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    model.set_ode(n_steps=6)  # another grid: the cached states no longer correspond
    with pytest.raises(RuntimeError, match="call"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_adaptive_methods_decode_without_cache_and_say_why_not_with_one():
    model = trained_like(small("node", "dopri5"))
    idx = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="adaptive method 'dopri5'.*use_cache=False.*fixed-step"):
        nl.generate(model, idx, 2)
    assert nl.generate(model, idx, 2, use_cache=False, temperature=0).shape == (1, 5)


def test_sampling_options():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]])
    greedy = sample_next(logits, temperature=0)
    assert greedy.item() == 1
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, top_k=1, generator=g).item() == 1
    assert sample_next(logits, top_p=1e-6, generator=g).item() == 1  # the most likely token is kept
    draws = torch.cat([sample_next(logits.expand(500, -1), top_k=2, generator=g) for _ in range(2)])
    assert set(draws.flatten().tolist()) == {1, 2}
    # top_p = 0.6: tokens 1 and 2 hold ~0.47 + ~0.43 of the mass; token 1 alone is < 0.6
    draws = sample_next(logits.expand(1000, -1), top_p=0.6, generator=g)
    assert set(draws.flatten().tolist()) == {1, 2}
    draws = sample_next(logits.expand(2000, -1), generator=g)
    assert set(draws.flatten().tolist()) == {0, 1, 2, 3, 4}


def test_sampling_is_reproducible_with_a_generator_and_arguments_are_checked():
    model = trained_like(small("ti_mlp"))
    idx = torch.zeros(1, 2, dtype=torch.long)
    a = nl.generate(model, idx, 15, generator=torch.Generator().manual_seed(3))
    b = nl.generate(model, idx, 15, generator=torch.Generator().manual_seed(3), use_cache=False)
    assert torch.equal(a, b)
    for kw, msg in (({"temperature": -1.0}, "temperature=-1.0"), ({"top_k": 0}, "top_k=0"),
                    ({"top_p": 1.5}, "top_p=1.5"), ({"max_new_tokens": -1}, "max_new_tokens=-1")):
        args = {"max_new_tokens": 3} | kw
        with pytest.raises(ValueError, match=msg):
            nl.generate(model, idx, **args)
    with pytest.raises(ValueError, match="int64"):
        nl.generate(model, idx.float(), 3)
    assert model.training is False
    model.train()
    nl.generate(model, idx, 1)
    assert model.training  # restored


def test_on_token_sees_every_new_token_as_it_is_drawn():
    model = trained_like(small("gpt"))
    idx = torch.zeros(2, 3, dtype=torch.long)
    seen, lengths = [], []
    out = nl.generate(model, idx, 6, generator=torch.Generator().manual_seed(0),
                      on_token=lambda tok: seen.append(tok.clone()))
    assert len(seen) == 6 and all(t.shape == (2, 1) for t in seen)
    assert torch.equal(torch.cat(seen, dim=1), out[:, 3:])

    # called before the next forward pass: a streaming consumer sees tokens one at a time
    def stop_after_two(tok):
        lengths.append(len(lengths) + 1)
        if len(lengths) == 2:
            raise KeyboardInterrupt
    model.train()
    with pytest.raises(KeyboardInterrupt):
        nl.generate(model, idx, 6, on_token=stop_after_two)
    assert lengths == [1, 2] and model.training  # the mode is restored on the way out


# --------------------------------------------------------------------------- model files


def test_save_and_load_model_round_trip(tmp_path):
    model = trained_like(small("ti_ssm", "rk4"))
    path = nl.save_model(model, tmp_path / "m.pt", tokenizer="char")
    loaded = nl.load_model(path)
    assert type(loaded) is type(model) and loaded.cfg == model.cfg and not loaded.training
    idx = torch.randint(0, 64, (2, 9))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)
    assert loaded.checkpoint_metadata["tokenizer"] == "char"


def test_a_crafted_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"model": Payload(), "model_config": {}}, path)
    with pytest.raises(ValueError, match="refusing to load"):
        nl.load_model(path)
    assert not marker.exists()
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a nodelm model file"):
        nl.load_model(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError):
        nl.load_model(tmp_path / "missing.pt")


def test_the_cli_stream_holds_back_a_character_split_across_tokens(capsys):
    from nodelm_lib.cli import TextStream

    class Bytes:  # a byte-level tokenizer: a non-ASCII character spans tokens
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    stream = TextStream(Bytes(), list(b"caf"))
    assert capsys.readouterr().out == "caf"
    stream.add(0xC3)  # the first byte of "é"
    assert capsys.readouterr().out == ""
    stream.add(0xA9)
    assert capsys.readouterr().out == "é"
    stream.add(0xC3)  # left incomplete at the end: printed as it decodes
    stream.close()
    assert capsys.readouterr().out == "\ufffd\n"


def test_a_training_run_is_loadable_and_the_cli_generates_and_evaluates(tmp_path, capsys):
    from nodelm_lib.cli import main

    model_cfg = nl.ModelConfig(arch="node", d_model=32, n_heads=4, n_layers=2, max_seq_len=32,
                               ode=nl.ODEConfig(n_steps=2))
    rec = nl.train(nl.TrainConfig(model=model_cfg, batch_size=2, seq_len=16, max_steps=3, eval_batches=1,
                                  eval_interval=3, out_dir=str(tmp_path / "run"), progress=False))
    loaded = nl.load_model(tmp_path / "run")  # the run directory, i.e. its checkpoint.pt
    idx = torch.randint(0, 256, (1, 10))
    torch.testing.assert_close(loaded(idx)[0], rec.model.eval()(idx)[0], rtol=0, atol=0)
    assert loaded.checkpoint_metadata["tokenizer"] == "char"

    assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "ROMEO:",
                 "--max-new-tokens", "12", "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert greedy.startswith("ROMEO:") and len(greedy.rstrip("\n")) >= 6
    assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "ROMEO:",
                 "--max-new-tokens", "12", "--temperature", "0", "--no-cache"]) == 0
    assert capsys.readouterr().out == greedy
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--split", "test",
                 "--seq-len", "32", "--max-windows", "4"]) == 0
    out = capsys.readouterr().out
    assert "tinyshakespeare/test at seq_len 32 (128 tokens): loss" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(tmp_path / "run"), "--seq-len", "2048"])
    assert exit_info.value.code == 2
    assert "seq_len=2048 exceeds the model's max_seq_len=32" in capsys.readouterr().err
