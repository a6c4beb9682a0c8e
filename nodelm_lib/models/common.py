"""What every language model shares: token + position embeddings, final norm, tied head.

A family subclasses ``CausalLM`` and implements ``body(x, **kwargs)``, the map from the
embedded sequence (B, T, D) to the final hidden states (B, T, D). Everything else (the
``max_seq_len`` check, the loss, initialisation, parameter counts) lives here once.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig, ODEConfig
from ..nn import linear_cross_entropy
from ..ode.stats import SolveStats


class CausalLM(nn.Module):
    """Base class: ``logits, loss = model(idx, targets)``; ``loss`` is None without targets.

    ``model(idx, targets, return_logits=False)`` returns ``(None, loss)`` and computes the loss
    in chunks without materialising the (B, T, V) logits (what training and evaluation use).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is None; set it (e.g. 256 for char, 50257 for gpt2)")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def body(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True, **kwargs):
        B, T = idx.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}; "
                "crop the context or build the model with a larger max_seq_len"
            )
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        h = self.ln_f(self.body(x, **kwargs))
        if targets is not None and not return_logits:
            return None, linear_cross_entropy(h.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1))
        logits = self.lm_head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    def set_ode(self, ode: ODEConfig | None = None, **changes) -> None:
        """Solve every ODE block with another configuration from now on.

        ``model.set_ode(n_steps=32)`` or ``model.set_ode(method="dopri5", rtol=1e-6)`` evaluates
        a trained model at other steps or with another solver; ``model.set_ode(cfg.ode)`` goes
        back. Changes are validated like the config itself.
        """
        blocks = [m for m in self.modules() if isinstance(getattr(m, "ode", None), ODEConfig)]
        if not blocks:
            raise ValueError(f"{type(self).__name__} has no ODE block to reconfigure")
        for block in blocks:
            block.ode = dataclasses.replace(ode or block.ode, **changes)

    def ode_stats(self) -> dict[str, int]:
        """Solver counters of the last forward (and backward) pass, summed over the ODE blocks.

        Keys as in ``SolveStats`` (nfe, n_accepted, n_rejected, nfe_backward); ``{}`` for a
        model without ODE blocks. Training logs them per step as ``ode/<key>``.
        """
        found = [m.stats for m in self.modules() if isinstance(getattr(m, "stats", None), SolveStats)]
        if not found:
            return {}
        return {key: sum(s.as_dict()[key] for s in found) for key in found[0].as_dict()}

    # ------------------------------------------------------------------ initialisation

    def init_weights(self, n_residual_layers: int) -> None:
        """nanoGPT initialisation: N(0, 0.02) weights, zero biases, and residual output
        projections (``c_proj``) scaled by 1/sqrt(2 * n_residual_layers) so the residual
        stream's variance does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        std = 0.02 / math.sqrt(2 * n_residual_layers)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=std)

    # ------------------------------------------------------------------ bookkeeping

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (the tied head counted once). ``non_embedding`` leaves out the
        token and position embeddings, the usual basis for comparing model sizes."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def param_groups(self) -> dict[str, list[str]]:
        """Parameter names grouped by top-level module (``wte``, ``blocks``, ``ode_block`` ...),
        the groups for which training logs separate gradient norms."""
        groups: dict[str, list[str]] = {}
        for name, _ in self.named_parameters():
            groups.setdefault(name.split(".")[0], []).append(name)
        return groups
