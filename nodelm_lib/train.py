"""Training loop: ``rec = nl.train(TrainConfig(...))``.

One run trains one model on one corpus and returns a ``RunRecord``: the config and its
hash, per-step metrics (loss, lr, total and per-module-group gradient norms), evaluations
on a fixed set of validation batches, final train / validation / test loss, parameter
counts, wall time, tokens/s, peak memory, the compile time (``compile=True``) and the
software environment.

Precision: ``dtype="bfloat16"`` is bf16 autocast, allowed on a CPU only where the CPU computes
bf16 natively (``check_dtype_supported``); on CUDA, float32 matmuls run on TF32 tensor cores
(``enable_tf32``). ``compile=True`` runs the training steps through ``torch.compile``; the
eager module (same parameters) evaluates, is checkpointed and is returned.

Reproducibility: the seed fixes initialisation, dropout and the batch order (a dedicated
``torch.Generator``); evaluation batches depend on ``eval_seed`` only, so every seed and
every architecture is scored on the same text. A checkpoint stores the model, optimiser,
both random states and the metrics so far, so ``resume=True`` continues a killed run to the
same final numbers as an uninterrupted one.

Failure: a non-finite loss or gradient stops the run with ``NonFiniteError`` naming the
step; the last good checkpoint is kept and the record so far is written (status "failed").

Several processes: launched by ``torchrun``, one run trains data-parallel (DDP) with
``batch_size`` as the global batch, to the numbers of one process (``distributed.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import platform
import resource
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from tqdm import tqdm  # text bar everywhere: tqdm.auto warns without ipywidgets

from . import __version__, distributed, integrity
from .config import TrainConfig, from_dict, to_dict
from .data import fixed_batches, get_tokenizer, load_tokens, sample_batch, split_windows
from .distributed import SINGLE, Context
from .files import atomic_write, atomic_write_text
from .losses import release_kept_buffers
from .checkpoints import load_torch_file, read_checkpoint
from .models import CausalLM, build_model
from .profiling import cpu_description, forward_flops_per_token, keep_freed_memory, saved_tensor_bytes

CHECKPOINT_NAME = "checkpoint.pt"
RECORD_NAME = "record.json"

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Raised when the loss or gradient norm stops being finite; ``.record`` holds the run so far."""

    def __init__(self, message: str, record: "RunRecord"):
        super().__init__(message)
        self.record = record


@dataclass
class RunRecord:
    """Everything one run produced; ``to_json`` / ``from_json`` round-trip it."""

    config: dict
    config_hash: str
    seed: int
    status: str = "running"  # running | completed | failed | interrupted
    metrics: list[dict] = field(default_factory=list)  # one row per optimisation step
    evals: list[dict] = field(default_factory=list)  # one row per evaluation (step, val_loss, train_time_s)
    final: dict = field(default_factory=dict)  # train_loss, val_loss, test_loss
    params: dict = field(default_factory=dict)  # total, non_embedding
    flops_per_token: float = 0.0  # forward pass, matmuls and attention (profiling.forward_flops_per_token)
    # the sequences per forward pass that flops_per_token was counted at: this process's share of
    # the batch (records written before the count took a batch have 1, the count at one sequence)
    flops_batch_size: int = 1
    wall_time_s: float = 0.0
    train_time_s: float = 0.0
    tokens_per_s: float = 0.0
    peak_memory_mb: float = 0.0  # process_peak_memory_mb at the end of the run
    # compile=True: seconds of this process's first training step, which traces and compiles the
    # forward and backward graphs (one step's own compute included); 0 for an eager run
    compile_time_s: float = 0.0
    activation_mb: float = 0.0  # saved-for-backward tensors of one training step (activation_bytes)
    environment: dict = field(default_factory=dict)
    error: str | None = None
    checkpoint: str | None = None  # the final model's file, when the run kept one
    # what a finished run did that its numbers alone would not say (``check_learned``)
    warnings: list[str] = field(default_factory=list)
    # the trained model, returned by ``train`` in the process that trained it; not stored in the
    # JSON (None in a record read back: load ``checkpoint`` with ``nl.load_model``)
    model: CausalLM | None = field(default=None, repr=False, compare=False, metadata={"stored": False})

    @property
    def train_config(self) -> TrainConfig:
        return from_dict(TrainConfig, self.config)

    def to_json(self, path: str | Path | None = None) -> str:
        """The record as JSON, with a digest of its contents (``integrity.digest``) that
        ``from_json`` checks; written atomically to ``path`` if given."""
        stored = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("stored", True)}
        text = json.dumps({**stored, integrity.DIGEST_KEY: integrity.digest(stored)}, indent=1)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "RunRecord":
        """The record in JSON text or a file; ``integrity.RecordError`` naming the file where it
        is not readable JSON, not a record, or changed since it was written (its digest)."""
        text, path = str(text_or_path), None
        if not text.lstrip().startswith("{"):
            path = Path(text_or_path)
            text = path.read_text()
        fields = [f for f in dataclasses.fields(cls) if f.metadata.get("stored", True)]
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        return cls(**integrity.parse_record(text, path, [f.name for f in fields], required))


# --------------------------------------------------------------------------- helpers


def resolve_device(name: str) -> torch.device:
    """``"auto"``: CUDA when available, else the CPU; any other name as given (CUDA asked for
    but missing is an error)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={name!r} is not a device; use 'auto', 'cpu', 'cuda' (or 'cuda:N') or 'mps'") from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(device.type)
    if available is not None and not available():
        raise ValueError(f"device={name!r} was asked for but {device.type.upper()} is not available here; "
                         "use device='cpu' or 'auto'")
    return device


# x86 /proc/cpuinfo flags (and the aarch64 feature) of native bf16 arithmetic: without one, bf16
# matmuls are emulated by converting to float32 and back, slower than float32 itself
NATIVE_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
ALLOW_EMULATED_BF16_ENV = "NODELM_ALLOW_EMULATED_BF16"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (x86 "flags", aarch64 "Features"); empty
    where there is no such file (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16 on x86, BF16 on
    aarch64). ``flags``: the CPU's feature flags; by default this machine's (``cpu_flags``),
    together with torch's own check where it has one."""
    if flags is None:
        flags = set(cpu_flags())
        for name, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported")):
            if getattr(torch.cpu, check, lambda: False)():  # private in torch 2.x: used only if present
                flags.add(name)
    return bool(NATIVE_BF16_CPU_FLAGS & set(flags))


def check_dtype_supported(dtype: str, device: torch.device, flags: Iterable[str] | None = None) -> None:
    """Refuse ``dtype="bfloat16"`` on a CPU without native bf16 (``cpu_has_native_bf16``): there
    PyTorch emulates it, and a run is several times slower than in float32, not faster. The
    environment variable ``NODELM_ALLOW_EMULATED_BF16=1`` lets it run anyway (e.g. to test the
    bf16 code path). ``flags`` as in ``cpu_has_native_bf16``."""
    if dtype != "bfloat16" or device.type != "cpu" or cpu_has_native_bf16(flags):
        return
    if os.environ.get(ALLOW_EMULATED_BF16_ENV, "") not in ("", "0"):
        return
    raise ValueError(
        f"dtype='bfloat16' on device='cpu': this CPU ({cpu_description()['cpu_name']}) has no native bfloat16 "
        f"arithmetic (neither AMX-BF16 nor AVX512-BF16 among its flags), so PyTorch would emulate it: several "
        f"times slower than float32 (a training step ~6x, a matmul ~13x on an AVX2 EPYC). Use dtype='float32' "
        f"here (bfloat16 on a GPU), or set {ALLOW_EMULATED_BF16_ENV}=1 to run emulated bf16 anyway"
    )


def compile_for(model: torch.nn.Module, device: torch.device, ctx: Context = SINGLE) -> torch.nn.Module:
    """``torch.compile(model)``; on one CUDA GPU (no DDP) with CUDA graphs (``mode="reduce-overhead"``),
    which replay a step's kernels instead of launching each from Python: at 02's gpu sizes the
    GPU otherwise waits on the CPU's launches (``bench/record.py --only gpu`` measures it). Not
    under DDP, whose gradient hooks run between the graph's kernels."""
    if device.type == "cuda" and not ctx.active:
        return torch.compile(model, mode="reduce-overhead")
    return torch.compile(model)


def enable_tf32() -> None:
    """Let float32 matmuls and cuDNN convolutions use TF32 tensor cores (Ampere and newer GPUs;
    older ones ignore it): products keep 10 mantissa bits, sums stay float32, several times the
    float32 throughput. Process-wide; the CPU's arithmetic is unaffected."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / span)
    min_lr = tc.lr * tc.min_lr_ratio
    return min_lr + 0.5 * (tc.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) only: not on biases, norms or scalars."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = dict(lr=tc.lr, betas=(tc.beta1, tc.beta2))
    try:  # the fused kernel: one kernel for the whole update, several times faster on CPU
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, **kwargs)


def grad_norms(model: CausalLM, groups: dict[str, list[str]]) -> dict[str, float]:
    """L2 norm of the gradient, in total and per module group (before clipping)."""
    return _grad_norms(model, groups)[0]


def _grad_norms(model: CausalLM, groups: dict[str, list[str]]) -> tuple[dict[str, float], list, list]:
    """``grad_norms``, the gradients and their norms (tensors), for ``clip_gradients``."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        raise RuntimeError("no parameter has a gradient: was backward() called?")
    grads = [g for _, g in named]
    per_tensor = list(torch._foreach_norm(grads))
    values = torch.stack(per_tensor).float().tolist()  # one host sync
    norms = dict(zip((n for n, _ in named), values))
    squares = {g: sum(norms[n] ** 2 for n in members if n in norms) for g, members in groups.items()}
    out = {"grad_norm": math.sqrt(sum(squares.values()))}
    out.update({f"grad_norm/{g}": math.sqrt(s) for g, s in squares.items()})
    return out, grads, per_tensor


def clip_gradients(grads: list[torch.Tensor], norms: list[torch.Tensor], max_norm: float) -> None:
    r"""``torch.nn.utils.clip_grad_norm_`` from per-tensor norms already computed: every gradient
    scaled by :math:`\min(1, c / (\lVert(\lVert g_i\rVert)_i\rVert + 10^{-6}))`, by the same
    operations, so to the same numbers, with one pass over the gradients instead of two
    (``grad_norms`` has read them once; node's 13M hypernetwork parameters make that pass
    ~3 ms of a step at 02's cpu config). On a CPU, where reading the factor costs no device
    synchronisation, a factor of exactly 1 (no clipping, most steps of a run) skips the pass:
    multiplying by 1 changes no number, and the pass is ~1.5 ms of node's step there."""
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if factor.device.type == "cpu" and factor.item() == 1.0:
        return
    torch._foreach_mul_(grads, factor)


@torch.no_grad()
def evaluate(model: CausalLM, batches, device: torch.device, autocast, ctx: Context = SINGLE) -> float:
    """Mean loss per token over fixed batches, in eval mode (no dropout). Batches of one size
    (random windows) are averaged as they come; a smaller last batch (a whole split) is
    weighted by its tokens. In a data-parallel run (``ctx``) each rank scores every
    ``world_size``-th batch and the per-batch losses are gathered, so every rank returns the
    single-process number."""
    batches = list(batches)
    was_training = model.training
    model.eval()
    mine = {}
    for i in distributed.my_batches(ctx, batches):
        x, y = batches[i]
        with autocast():
            _, loss = model(x.to(device), y.to(device), return_logits=False)
        mine[i] = float(loss)
    model.train(was_training)
    losses = distributed.gather_values(ctx, len(batches), mine, device)
    sizes = [y.numel() for _, y in batches]
    if len(set(sizes)) == 1:
        return float(np.mean(losses))
    return float(np.dot(losses, sizes) / sum(sizes))


def batch_tokens(batches) -> int:
    """Tokens scored by an evaluation over ``batches``."""
    return sum(y.numel() for _, y in batches)


@torch.no_grad()
def evaluate_split(model: CausalLM, tokens, seq_len: int, batch_size: int = 8, max_windows: int | None = None,
                   device: torch.device | str = "cpu") -> dict:
    """Mean loss over a whole split cut into consecutive, non-overlapping windows of
    ``seq_len`` (``data.split_windows``: each position scored once, with as much context as
    its window gives), or over the first ``max_windows`` of them. Returns loss, perplexity,
    bits per token and the number of tokens scored. With learned positions ``seq_len`` may not
    exceed the model's ``max_seq_len``; a rope model takes any (``CausalLM.context_limit``)."""
    if model.context_limit is not None and seq_len > model.context_limit:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={model.cfg.max_seq_len} "
                         "(its position embeddings end there)")
    batches = split_windows(tokens, batch_size, seq_len, max_windows)
    loss = evaluate(model, batches, torch.device(device), contextlib.nullcontext)
    return {"loss": loss, "perplexity": math.exp(loss), "bits_per_token": loss / math.log(2),
            "tokens": batch_tokens(batches), "seq_len": seq_len}


def environment(device: torch.device, ctx: Context = SINGLE) -> dict:
    env = {
        "nodelm": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        **cpu_description(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    if ctx.active:  # a data-parallel run: the timings and memory are rank 0's
        env["world_size"] = ctx.world_size
        env["backend"] = distributed.BACKENDS[device.type]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        if commit.returncode == 0:
            env["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (e.g. an installed wheel): the commit is simply not recorded
    return env


def process_peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory in MiB: on CUDA the most the caching allocator has held
    allocated on ``device`` since its peak was last reset (``train`` resets it at the start of a
    run), on the CPU the peak resident set size since the process started. Stored as
    ``RunRecord.peak_memory_mb``."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def with_tokenizer_vocab(tc: TrainConfig) -> TrainConfig:
    """Fill ``model.vocab_size`` from the tokenizer, or check that it is large enough."""
    vocab = get_tokenizer(tc.tokenizer).vocab_size
    if tc.model.vocab_size is None:
        return dataclasses.replace(tc, model=dataclasses.replace(tc.model, vocab_size=vocab))
    if tc.model.vocab_size < vocab:
        raise ValueError(
            f"model.vocab_size={tc.model.vocab_size} is smaller than the {tc.tokenizer!r} tokenizer's "
            f"vocabulary ({vocab}); set model.vocab_size={vocab} or leave it unset"
        )
    return tc


def split_tokens(tc: TrainConfig, split: str) -> np.ndarray:
    """One split of ``tc``'s corpus as a 1-D array of token ids, as ``load_tokens`` gives it: a
    memmap of the token cache for a large corpus (WikiText-103), which ``sample_batch`` and
    ``split_windows`` read window by window rather than widening it whole to int64."""
    return load_tokens(tc.dataset, split, tc.tokenizer, data_dir=tc.data_dir)


def eval_batches(tc: TrainConfig, split: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed evaluation batches of ``split``, the same for every seed and architecture of
    a comparison: ``eval_batches`` random windows drawn with ``eval_seed``, or with
    ``eval_on="whole_split"`` the whole split in consecutive windows (``data.split_windows``)."""
    tokens = split_tokens(tc, split)
    if tc.eval_on == "whole_split":
        return split_windows(tokens, tc.batch_size, tc.seq_len)
    return fixed_batches(tokens, tc.eval_batches, tc.batch_size, tc.seq_len, tc.eval_seed)


def final_eval_batches(tc: TrainConfig, split: str, during_training=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of the final validation / test loss: the whole split for
    ``eval_on="whole_split_at_end"``, else those of ``eval_batches`` (``during_training``, the
    validation batches already drawn, is returned as is when given)."""
    if tc.eval_on == "whole_split_at_end":
        return split_windows(split_tokens(tc, split), tc.batch_size, tc.seq_len)
    return during_training if during_training is not None else eval_batches(tc, split)


def activation_bytes(model: CausalLM, x: torch.Tensor, y: torch.Tensor, autocast) -> int:
    """Bytes of the tensors autograd saves for backward in one training forward pass on (x, y):
    the activation memory of a step, which (unlike the process's resident set) belongs to the
    model. Random state is restored after, so measuring changes no number of the run."""
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []), autocast():
        n, _ = saved_tensor_bytes(lambda: model(x, y, return_logits=False))
    return n


# --------------------------------------------------------------------------- checkpoints


def save_training_state(path: Path, model, optimizer, step: int, batch_gen: torch.Generator, record: RunRecord,
                        rank_rng: list[dict] | None = None) -> None:
    """Everything an exact resume needs; also a model file ``nl.load_model`` reads (it holds
    the model's config, the tokenizer and the dataset next to the weights). ``rank_rng``: every
    rank's random state in a data-parallel run (``distributed.gather_rng_states``)."""
    config = record.config
    state = {
        "step": step,
        "model": model.state_dict(),
        "model_config": config["model"] | {"vocab_size": model.cfg.vocab_size},
        "tokenizer": config["tokenizer"],
        "dataset": config["dataset"],
        "optimizer": optimizer.state_dict(),
        "batch_generator": batch_gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "config_hash": record.config_hash,
        "metrics": record.metrics,
        "evals": record.evals,
        "train_time_s": record.train_time_s,
    }
    if rank_rng is not None:
        state["rank_rng"] = rank_rng
    atomic_write(path, lambda f: torch.save(state, f))


def load_training_state(path: Path, model, optimizer, batch_gen: torch.Generator, record: RunRecord,
                        ctx: Context = SINGLE, device: torch.device | None = None) -> int:
    """Restore a run from ``path``, written by any number of processes; returns the number of
    steps already done. In a data-parallel run (``ctx``) every rank reads the same replicated
    state, and rank r > 0 its own random state (``distributed.restore_rng_state``)."""
    state = load_torch_file(path, "checkpoint")
    if state["config_hash"] != record.config_hash:
        raise ValueError(
            f"checkpoint {path} belongs to config {state['config_hash']}, not {record.config_hash}; "
            "use another out_dir or resume=False"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    batch_gen.set_state(state["batch_generator"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    record.metrics, record.evals = list(state["metrics"]), list(state["evals"])
    record.train_time_s = float(state.get("train_time_s", 0.0))
    distributed.restore_rng_state(ctx, state.get("rank_rng"), record.seed, int(state["step"]), device)
    return int(state["step"])


def parent_checkpoint(tc: TrainConfig) -> Path:
    """Where the final model of ``tc.init_from`` lies: beside ``tc``'s own checkpoint folder."""
    if not tc.out_dir:
        raise ValueError(f"init_from={tc.init_from!r} needs out_dir: the parent run's checkpoint is looked up "
                         "beside the run's own, <out_dir>/../<init_from>/checkpoint.pt")
    return Path(tc.out_dir).parent / tc.init_from / CHECKPOINT_NAME


# the model fields a fine-tuning run may change relative to its parent: the depth
DEPTH_FIELDS = ("n_layers", "ode")


def load_parent_weights(model: CausalLM, tc: TrainConfig) -> None:
    """Copy the parent run's final weights (``tc.init_from``) into ``model``, exactly.

    The parent's model config must equal ``tc.model`` in everything but the depth
    (``DEPTH_FIELDS``): a continuous-depth model's weights do not depend on its number of
    solver steps, so the same flow is then solved on another grid.
    """
    path = parent_checkpoint(tc)
    if not path.exists():
        raise FileNotFoundError(f"no final model of parent run {tc.init_from} at {path}; train it first "
                                "(nl.run(..., need_checkpoint=True))")
    state = read_checkpoint(path)  # the checks of a model file (tensors and plain data only)
    parent = state["model_config"]
    child = to_dict(tc.model) | {"vocab_size": model.cfg.vocab_size}
    differ = sorted(k for k in child if k not in DEPTH_FIELDS and parent.get(k) != child[k])
    if differ:
        raise ValueError(f"the model of parent run {tc.init_from} differs from this run's in {', '.join(differ)}; "
                         f"a fine-tuning run may change only {', '.join(DEPTH_FIELDS)}")
    model.load_state_dict(state["model"])


# --------------------------------------------------------------------------- the loop


def _final_train_loss(metrics: list[dict]) -> float:
    """Mean training loss over the last 10% of steps (at least 1, at most 50): one step's
    loss is too noisy to compare runs by."""
    n = max(1, min(50, len(metrics) // 10))
    return float(np.mean([row["loss"] for row in metrics[-n:]]))


def train(tc: TrainConfig, callback: Callable[[int, dict, CausalLM], None] | None = None) -> RunRecord:
    """Train ``tc.model`` on ``tc.dataset`` and return the run record.

    ``callback(step, row, model)`` is called after every optimisation step with that step's
    metrics row (``step`` counts completed updates); an exception it raises stops the run
    after the record so far is saved. With ``out_dir`` set, the record is written to
    ``out_dir/record.json`` and checkpoints to ``out_dir/checkpoint.pt``. The trained model
    is returned as ``record.model`` (not part of the JSON).

    Launched by ``torchrun`` with several processes, every process calls this and trains its
    share of each global batch (``distributed.py``); all return the same record, rank 0 alone
    writes files and shows progress, and ``callback`` runs on every rank.
    """
    t_start = time.perf_counter()
    tc = with_tokenizer_vocab(tc)
    ctx = distributed.launch_context()
    local_batch = distributed.check_batch_divides(tc.batch_size, ctx.world_size)
    device = distributed.process_device(ctx, resolve_device(tc.device))
    check_dtype_supported(tc.dtype, device)
    if device.type == "cpu":
        keep_freed_memory()  # no page faults on the step's large tensors (profiling.keep_freed_memory)
    if device.type == "cuda":
        enable_tf32()
        torch.cuda.reset_peak_memory_stats(device)  # the peak of this run, not of the process
    out_dir = Path(tc.out_dir) if tc.out_dir else None
    ckpt_path = out_dir / CHECKPOINT_NAME if out_dir else None

    train_tokens = split_tokens(tc, "train")
    val_batches = eval_batches(tc, "validation")

    distributed.setup(ctx, device)
    torch.manual_seed(tc.seed)  # initialisation and dropout masks
    model = build_model(tc.model)
    if tc.init_from is not None:
        load_parent_weights(model, tc)
    model = model.to(device)
    distributed.seed_rank(ctx, tc.seed)  # ranks > 0: dropout masks of their own
    optimizer = make_optimizer(model, tc)
    batch_gen = torch.Generator().manual_seed(tc.seed)  # batch order, shared by every arch of a seed
    groups = model.param_groups()
    x0, y0 = val_batches[0]  # a batch of this process's rows, to measure and probe a training step
    probe = x0[:local_batch].to(device), y0[:local_batch].to(device)
    # the training steps' forward; the eager `model` (same parameters) does everything else, so
    # state_dicts keep their names (no "_orig_mod." prefix) and decoding keeps its KV cache
    step_model = distributed.wrap(ctx, compile_for(model, device, ctx) if tc.compile else model, device,
                                  unused=distributed.unused_parameters(ctx, model, *probe))
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.dtype == "bfloat16")  # noqa: E731

    record = RunRecord(
        config=to_dict(tc), config_hash=tc.config_hash(), seed=tc.seed,
        params={"total": model.num_params(), "non_embedding": model.num_params(non_embedding=True)},
        flops_per_token=forward_flops_per_token(model, tc.seq_len, local_batch), flops_batch_size=local_batch,
        environment=environment(device, ctx),
    )
    record.activation_mb = activation_bytes(model, *probe, autocast) / 2**20
    start = 0
    if tc.resume and ckpt_path is not None and ckpt_path.exists():
        start = load_training_state(ckpt_path, model, optimizer, batch_gen, record, ctx, device)
        log.info("%s seed %d (%s): resumed from step %d of %d (%s)", tc.model.arch, tc.seed, record.config_hash,
                 start, tc.max_steps, ckpt_path)
    elif ckpt_path is not None and ckpt_path.exists() and ctx.is_main:
        log.warning("%s holds a checkpoint, but resume=False: this run starts at step 0 and replaces it", ckpt_path)
    if start == 0:
        record.evals.append({"step": 0, "val_loss": evaluate(model, val_batches, device, autocast, ctx),
                             "train_time_s": 0.0})
    time_before = record.train_time_s  # training time before this process (a resumed run)

    writer = _tensorboard_writer(tc.log_dir) if ctx.is_main else None
    model.train()
    train_time = 0.0
    bar = tqdm(total=tc.max_steps, initial=start, disable=not (tc.progress and ctx.is_main),
               desc=f"{tc.model.arch} seed {tc.seed}")
    try:
        for step in range(start, tc.max_steps):
            t0 = time.perf_counter()
            row = _train_step(model, step_model, optimizer, tc, step, train_tokens, batch_gen, device, groups,
                              autocast, record, ctx)
            step_time = time.perf_counter() - t0
            if tc.compile and step == start:
                record.compile_time_s = step_time
            train_time += step_time
            done = step + 1
            record.metrics.append(row)
            if done % tc.eval_interval == 0 or done == tc.max_steps:
                record.evals.append({"step": done, "val_loss": evaluate(model, val_batches, device, autocast, ctx),
                                     "train_time_s": time_before + train_time})
                bar.set_postfix(loss=f"{row['loss']:.3f}", val=f"{record.evals[-1]['val_loss']:.3f}")
            if tc.checkpoint_interval and done % tc.checkpoint_interval == 0:
                record.train_time_s = time_before + train_time
                _checkpoint(ctx, device, ckpt_path, model, optimizer, done, batch_gen, record)
            _log_tensorboard(writer, done, row, record.evals[-1] if record.evals[-1]["step"] == done else None)
            bar.update(1)
            if callback is not None:
                callback(done, row, model)
    except BaseException as err:  # save what was computed, then let the error through
        record.status = "failed" if isinstance(err, NonFiniteError) else "interrupted"
        record.error = f"{type(err).__name__}: {err}"
        _finish(record, tc, device, t_start, train_time, time_before, out_dir, ctx)
        raise
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        release_kept_buffers()  # the bf16 head's kept gradient logits serve training steps only

    final_val_batches = final_eval_batches(tc, "validation", val_batches)
    test_batches = final_eval_batches(tc, "test")
    record.final = {
        "train_loss": _final_train_loss(record.metrics),
        "val_loss": (record.evals[-1]["val_loss"] if final_val_batches is val_batches
                     else evaluate(model, final_val_batches, device, autocast, ctx)),
        "test_loss": evaluate(model, test_batches, device, autocast, ctx),  # computed once, at the end
        "val_tokens": batch_tokens(final_val_batches),
        "test_tokens": batch_tokens(test_batches),
    }
    record.status = "completed"
    check_learned(record, model.cfg.vocab_size)
    if out_dir is not None and start < tc.max_steps:
        record.train_time_s = time_before + train_time
        _checkpoint(ctx, device, ckpt_path, model, optimizer, tc.max_steps, batch_gen, record)
    if ckpt_path is not None and ckpt_path.exists():
        record.checkpoint = str(ckpt_path)
    _finish(record, tc, device, t_start, train_time, time_before, out_dir, ctx)
    record.model = model
    return record


class AboveUniformWarning(UserWarning):
    """A run that finished worse than guessing every token uniformly: it learned nothing."""


def check_learned(record: RunRecord, vocab_size: int) -> None:
    """Flag ``record`` (in ``record.warnings``, and as an ``AboveUniformWarning``) where its final
    validation loss is above ln(vocab_size), the loss of a uniform guess over the vocabulary: a
    run that diverged without a non-finite loss (a learning rate far too high) would otherwise
    read as "completed". Its numbers are kept as they are."""
    uniform = math.log(vocab_size)
    loss = record.final.get("val_loss", math.nan)
    if loss > uniform:
        lr = record.config.get("lr")
        message = (f"final validation loss {loss:.4f} is above a uniform guess over the {vocab_size} tokens "
                   f"(ln {vocab_size} = {uniform:.4f}): the run learned nothing (lr={lr} too high, or too few "
                   f"steps?)")
        record.warnings.append(message)
        warnings.warn(f"{record.config['model']['arch']} seed {record.seed} ({record.config_hash}): {message}",
                      AboveUniformWarning, stacklevel=3)


def _checkpoint(ctx: Context, device, path: Path, model, optimizer, step: int, batch_gen, record: RunRecord) -> None:
    """``save_training_state`` by rank 0 alone, with every rank's random state (a collective:
    every rank calls this at the same steps)."""
    rank_rng = distributed.gather_rng_states(ctx, device)
    if ctx.is_main:
        save_training_state(path, model, optimizer, step, batch_gen, record, rank_rng)


def _training_batch(tc: TrainConfig, train_tokens, batch_gen, device, ctx: Context):
    """The next global batch of the seed's order, or in a data-parallel run this rank's rows of it."""
    if not ctx.active:
        return sample_batch(train_tokens, tc.batch_size, tc.seq_len, batch_gen, device=device)
    x, y = distributed.local_rows(ctx, *sample_batch(train_tokens, tc.batch_size, tc.seq_len, batch_gen))
    return x.to(device), y.to(device)


def _train_step(model, step_model, optimizer, tc, step, train_tokens, batch_gen, device, groups, autocast,
                record, ctx: Context = SINGLE) -> dict:
    lr = lr_at(step, tc)
    for group in optimizer.param_groups:
        group["lr"] = lr
    x, y = _training_batch(tc, train_tokens, batch_gen, device, ctx)
    with autocast():
        _, loss = step_model(x, y, return_logits=False)
    # the global batch's loss on every rank, so that every rank stops at a non-finite one together
    loss_value = distributed.global_mean(ctx, loss)
    if not math.isfinite(loss_value):
        raise NonFiniteError(f"non-finite loss ({loss_value}) at step {step + 1}", record)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norms, grads, per_tensor = _grad_norms(model, groups)
    if not math.isfinite(norms["grad_norm"]):
        bad = [g for g, v in norms.items() if not math.isfinite(v)]
        raise NonFiniteError(f"non-finite gradient at step {step + 1} in {', '.join(bad)}", record)
    if tc.grad_clip > 0:
        clip_gradients(grads, per_tensor, tc.grad_clip)
    optimizer.step()
    solver_counts = {f"ode/{key}": value for key, value in model.ode_stats().items()}
    return {"step": step + 1, "loss": loss_value, "lr": lr, **norms, **solver_counts}


def _finish(record: RunRecord, tc: TrainConfig, device, t_start: float, train_time: float, time_before: float,
            out_dir, ctx: Context = SINGLE) -> None:
    """Timings (wall time of this process; training time and tokens/s over all processes of a
    resumed run), peak memory (of this process), and the record written to out_dir (by rank 0)."""
    record.wall_time_s = time.perf_counter() - t_start
    record.train_time_s = time_before + train_time
    tokens = len(record.metrics) * tc.batch_size * tc.seq_len
    record.tokens_per_s = tokens / record.train_time_s if record.train_time_s > 0 else 0.0
    record.peak_memory_mb = process_peak_memory_mb(device)
    if out_dir is not None and ctx.is_main:
        record.to_json(out_dir / RECORD_NAME)


def _tensorboard_writer(log_dir: str | None):
    if not log_dir:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError("log_dir needs TensorBoard: pip install tensorboard (in the [dev] extra)") from err
    return SummaryWriter(log_dir)


def _log_tensorboard(writer, step: int, row: dict, evaluation: dict | None) -> None:
    if writer is None:
        return
    for key, value in row.items():
        if key != "step":
            writer.add_scalar(f"train/{key}", value, step)
    if evaluation is not None:
        writer.add_scalar("val/loss", evaluation["val_loss"], step)

