"""A minimal re-implementation of Karpathy's nanoGPT (model.py, train.py and
config/train_shakespeare_char.py), written from the description of its public repository, not
copied: the reference that ``bench/nanogpt_vs_ours.py`` times ``gpt`` against.

What is reproduced, because it decides the speed or the numbers of a step:

* model: token + learned position embeddings (dropout after their sum); ``n_layer`` pre-LN
  blocks ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))`` with LayerNorm (eps 1e-5, bias optional);
  attention from one fused (C, 3C) projection ``c_attn`` split into q, k, v, heads as
  (B, H, T, C / H), ``F.scaled_dot_product_attention(is_causal=True)`` (dropout only in training),
  the output projection ``c_proj`` and residual dropout; an MLP C -> 4C -> C with exact (erf)
  GELU; a final LayerNorm and a bias-free head whose weight is the token embedding's (tying).
  With targets the head is applied to every position and the loss is ``F.cross_entropy`` over
  the full (B, T, V) logits; without them only the last position's logits are computed (what
  nanoGPT's sampling uses).
* initialisation: every Linear and Embedding weight N(0, 0.02), Linear biases zero, then every
  residual output projection (``c_proj.weight``, in attention and MLP) N(0, 0.02 / sqrt(2 n_layer)).
* optimiser: ``torch.optim.AdamW`` with two groups, weight decay on parameters with dim >= 2
  only; the fused kernel only when training on CUDA (so on a CPU it is the default
  multi-tensor implementation, as nanoGPT has it).
* schedule: linear warmup ``lr (it + 1) / (warmup + 1)``, cosine decay to ``min_lr`` at
  ``lr_decay_iters``, ``min_lr`` after.
* one training iteration (gradient accumulation 1, no autocast and no loss scaling: on a CPU
  nanoGPT's context is a no-op and its GradScaler disables itself): set the learning rate,
  forward on the current batch, draw the next batch (nanoGPT prefetches it while the forward
  is in flight on a GPU), backward, clip the gradient norm to 1.0, optimiser step,
  ``zero_grad(set_to_none=True)``, and ``loss.item()`` (the CPU command logs every iteration).
* batches: ``batch_size`` random windows of ``block_size`` tokens, starts from
  ``torch.randint``, each row cut from a uint16 array and converted to int64, stacked.

``NanoGPTTrainer.estimate_loss`` is train.py's evaluation (every ``eval_interval`` iterations,
``eval_iters`` random batches of each split); ``bench/nanogpt_vs_ours.py --whole-run`` runs it on
nanoGPT's schedule. Left out: checkpoints, the MFU estimate of
the log line, wandb, DDP and ``torch.compile`` (the CPU command passes ``--compile=False``),
and the reopening of the data file as a fresh ``np.memmap`` at every batch (here the split is an
in-memory array).

``BABY`` is the configuration of nanoGPT's README suggestion for a CPU: ``train.py
config/train_shakespeare_char.py --device=cpu --compile=False --block_size=64 --batch_size=12
--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``,
on the rest of train_shakespeare_char.py (learning rate 1e-3, min_lr 1e-4, warmup 100,
beta2 0.99) and of train.py's defaults (weight decay 0.1, beta1 0.9, grad clip 1.0, and
``bias = False``: train.py's default, which that config does not change). Its vocabulary is
the 65 distinct characters of tiny-shakespeare (nanoGPT's prepare.py); this library's char
tokenizer is byte-level with 256 ids, and tiny-shakespeare's bytes are exactly those 65
characters, so ``char_vocab_65`` maps one onto the other.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class NanoGPTConfig:
    """Model and optimisation settings; the defaults are the baby config (``BABY``)."""

    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    # optimisation (train.py with config/train_shakespeare_char.py and the CPU overrides)
    batch_size: int = 12
    learning_rate: float = 1e-3
    max_iters: int = 2000
    lr_decay_iters: int = 2000
    warmup_iters: int = 100
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0


BABY = NanoGPTConfig()


class SelfAttention(nn.Module):
    """Causal multi-head self-attention from one fused qkv projection."""

    def __init__(self, cfg: NanoGPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        heads = lambda z: z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # noqa: E731
        q, k, v = (heads(z) for z in self.c_attn(x).split(self.n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class FeedForward(nn.Module):
    """C -> 4C, exact GELU, 4C -> C, dropout."""

    def __init__(self, cfg: NanoGPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: NanoGPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """``logits, loss = model(idx, targets)``: (B, T, V) logits and the mean cross-entropy
    with targets; (B, 1, V) logits of the last position and ``None`` without."""

    def __init__(self, cfg: NanoGPTConfig = BABY):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # one matrix: the embedding is the head's weight
        self.apply(self._init_module)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_module(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, the tied matrix once; nanoGPT's ``non_embedding`` count leaves out the
        position embeddings only (the token embedding is also the head)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        assert T <= self.cfg.block_size, f"sequence of {T} tokens, block size is {self.cfg.block_size}"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def configure_optimizer(model: nn.Module, cfg: NanoGPTConfig, device_type: str = "cpu") -> torch.optim.AdamW:
    """AdamW, weight decay on matrices and embeddings (dim >= 2) only; fused on CUDA only."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             **({"fused": True} if fused else {}))


def learning_rate(it: int, cfg: NanoGPTConfig) -> float:
    """Linear warmup, then cosine decay from ``learning_rate`` to ``min_lr`` at ``lr_decay_iters``."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def get_batch(data: np.ndarray, cfg: NanoGPTConfig, generator: torch.Generator | None = None,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``data`` (a 1-D uint16 array): x and x shifted by one."""
    T = cfg.block_size
    starts = torch.randint(len(data) - T, (cfg.batch_size,), generator=generator).tolist()
    x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in starts])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in starts])
    return x.to(device), y.to(device)


def char_vocab_65(byte_ids: np.ndarray, alphabet: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Byte ids (this library's char tokenizer) as indices into the sorted set of distinct
    bytes, nanoGPT's character vocabulary (65 for tiny-shakespeare). Returns (uint16 ids,
    alphabet); pass ``alphabet`` (e.g. of the whole corpus) to map another split alike."""
    if alphabet is None:
        alphabet = np.unique(byte_ids)
    lookup = np.full(256, -1, dtype=np.int64)
    lookup[alphabet] = np.arange(len(alphabet))
    ids = lookup[byte_ids.astype(np.int64)]
    if (ids < 0).any():
        raise ValueError("byte ids outside the alphabet")
    return ids.astype(np.uint16), alphabet


class NanoGPTTrainer:
    """train.py's loop, one iteration per ``step()``: the model, its optimiser, the training
    split (uint16 ids) and the batch fetched ahead, as nanoGPT keeps them."""

    def __init__(self, model: NanoGPT, data: np.ndarray, cfg: NanoGPTConfig | None = None,
                 generator: torch.Generator | None = None, device: str | torch.device = "cpu"):
        self.model, self.cfg, self.data = model, cfg or model.cfg, data
        self.generator, self.device = generator, torch.device(device)
        self.optimizer = configure_optimizer(model, self.cfg, self.device.type)
        self.iter_num = 0
        self.X, self.Y = get_batch(data, self.cfg, generator, self.device)

    def step(self) -> float:
        lr = learning_rate(self.iter_num, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _, loss = self.model(self.X, self.Y)
        self.X, self.Y = get_batch(self.data, self.cfg, self.generator, self.device)  # the next batch
        loss.backward()
        if self.cfg.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        return loss.item()

    @torch.no_grad()
    def estimate_loss(self, splits: dict[str, np.ndarray], eval_iters: int) -> dict[str, float]:
        """train.py's ``estimate_loss``: for each split, the mean loss of ``eval_iters`` random
        batches in eval mode, then back to training mode."""
        self.model.eval()
        out = {}
        for name, data in splits.items():
            losses = [self.model(*get_batch(data, self.cfg, self.generator, self.device))[1].item()
                      for _ in range(eval_iters)]
            out[name] = float(np.mean(losses))
        self.model.train()
        return out
