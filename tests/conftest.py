"""What several test files share: the data fixtures (no hub, no stray data variables, the offline
data dir), a check that every parameter gets a gradient, and a fake finished run record. (Each
pytest-xdist worker's share of the cores is set in the repository's conftest.py.)"""

from pathlib import Path

import pytest

from nodelm_lib import data
from nodelm_lib.data import sources


@pytest.fixture
def offline_data(monkeypatch):
    """No hub, no stray env: each test sets what it needs."""
    def no_hub(path, name, split):
        raise ConnectionError("hub unreachable (patched in tests)")

    monkeypatch.setattr(sources, "_open_hub", no_hub)
    for var in ("NODELM_DATA_DIR", "NODELM_CACHE_DIR", "TIKTOKEN_CACHE_DIR"):
        # set-then-delete makes monkeypatch restore the original state even when
        # the code under test sets the variable itself (configure_tiktoken_cache)
        monkeypatch.setenv(var, "unset")
        monkeypatch.delenv(var)


@pytest.fixture(scope="module")
def shared_dir() -> Path:
    """The shared data dir, found by the library's own search order."""
    root, _ = data.find_data_dir()
    if root is None or not (root / "wikitext-2-v1").is_dir():
        pytest.skip("no offline data dir (../shared/data or $NODELM_DATA_DIR)")
    return root


def assert_every_parameter_gets_a_gradient(model, seq_len: int) -> None:
    """One training step's backward on random tokens gives every parameter of ``model`` a finite,
    non-zero gradient (the hybrid gets a control vector, else its control_proj is unused)."""
    import torch

    model.train()
    idx = torch.randint(0, 64, (2, seq_len))
    extra = {"control": torch.randn(2, 4)} if model.cfg.arch == "hybrid" else {}
    _, loss = model(idx, idx.roll(-1, dims=1), **extra)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} has no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def fake_record(tc, seconds_per_step: float, steps: int = 10, other_s: float = 0.0, environment: dict | None = None,
                **fields):
    """A finished ``RunRecord`` of ``tc`` (a ``TrainConfig``): ``steps`` training steps at
    ``seconds_per_step`` and ``other_s`` seconds of wall time outside them, on this machine unless
    ``environment`` names another; no evaluation and empty metrics unless ``fields`` give some."""
    from nodelm_lib.config import to_dict
    from nodelm_lib.training.evaluation import with_tokenizer_vocab
    from nodelm_lib.training.profiling import cpu_description
    from nodelm_lib.training.record import RunRecord

    tc = with_tokenizer_vocab(tc)
    fields.setdefault("metrics", [{}] * steps)
    return RunRecord(config=to_dict(tc), config_hash=tc.config_hash(), seed=tc.seed, status="completed",
                     train_time_s=seconds_per_step * steps, wall_time_s=seconds_per_step * steps + other_s,
                     environment=cpu_description() if environment is None else environment, **fields)


def as_if_trained_elsewhere(path: Path):
    """Rewrite the stored record at ``path`` as another kind of CPU would have trained it: every
    loss a little elsewhere (0.01 nats), so a retraining here no longer reproduces it. Returns it."""
    from nodelm_lib.training.record import RunRecord, final_train_loss

    stored = RunRecord.from_json(path)
    for row in stored.metrics:
        row["loss"] += 0.01
    for row in stored.evals:
        row["val_loss"] += 0.01
    stored.final.update(train_loss=final_train_loss(stored.metrics), val_loss=stored.evals[-1]["val_loss"])
    stored.to_json(path)
    return stored
