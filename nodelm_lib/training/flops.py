"""The one FLOP counter: forward FLOPs per token of a model (counted by
``torch.utils.flop_counter``) or of a config's model, and training FLOPs by the 3x rule."""

from __future__ import annotations

import dataclasses

import torch

from nodelm_lib.config import ModelConfig, TrainConfig
from nodelm_lib.data import CharTokenizer, GPT2Tokenizer
from nodelm_lib.models import build_model
from nodelm_lib.models.common import ODEBlock
from nodelm_lib.ode.regularisers import regulariser_flops
from nodelm_lib.ode.tableaus import TABLEAUS

# the tokenizers' vocabulary sizes from their classes' constants (constructing the GPT-2
# tokenizer would load tiktoken's files, which counting FLOPs should not need)
VOCAB_SIZES = {CharTokenizer.name: CharTokenizer.vocab_size, GPT2Tokenizer.name: GPT2Tokenizer.vocab_size}
# training FLOPs per forward FLOP: the backward pass costs about twice the forward (Kaplan et al.)
TRAIN_FLOPS_PER_FORWARD_FLOP = 3


def forward_flops_per_token(model: torch.nn.Module, seq_len: int, batch_size: int = 1) -> float:
    r"""Floating-point operations of one forward pass per token, on a batch of ``batch_size``
    sequences of ``seq_len`` tokens, counted by ``torch.utils.flop_counter`` (in eval mode).

    Counts matrix products and attention (2 per multiply-add; attention as a full T x T
    product, the convention of flash-attention counts, so causal masking is not credited,
    and the same on CPU and CUDA), as is conventional; elementwise
    work (norms, activations, the SSM scan's recurrence, solver updates) is left out. Every
    field evaluation of an ODE block is counted, so it reflects the solver's stages and steps.

    Weights computed from t alone (``node``'s hypernetwork, the time-indexed gates) are
    generated once per pass, whatever the batch, so per token they cost less the larger the
    batch: give the batch one forward pass of training sees. A pass costs P + B S FLOPs (P per
    pass, S per sequence), so two counts, at one and two sequences, give the cost at any B:

    .. math:: S = F_2 - F_1, \quad P = F_1 - S, \quad \text{per token} = (P + B S) / (B T).

    (At d = 128, depth 4, T = 64 and B = 12, ``node`` counts 1.90M FLOPs per token against 3.36M at B = 1.)
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; it must be a positive number of sequences")
    one = _forward_flops(model, seq_len, 1)
    if batch_size == 1:
        return one / seq_len
    per_sequence = _forward_flops(model, seq_len, 2) - one
    per_pass = one - per_sequence
    return (per_pass + batch_size * per_sequence) / (batch_size * seq_len)



def training_forward_flops_per_token(model: torch.nn.Module, ode, seq_len: int, batch_size: int = 1) -> float:
    """Forward FLOPs per token of a training step of ``model`` whose ODE blocks train with ``ode``
    (an ``ODEConfig``), where that differs from the evaluation count on the ``ode`` grid; else 0.

    - Random training grids: the mean over the drawn step counts, uniform on [min, max]; a count
      is linear in the steps (every step evaluates the field the same number of times), so the
      mean is the count at the mean number of steps, from the counts at min and max.
    - The Jacobian regulariser: one vector-Jacobian product per step point, about two field
      evaluations (``ode.regularisers.regulariser_flops``, elementwise work left out as here). The
      kinetic term is elementwise only: it adds none.
    """
    grids = ode.training_grids()
    if grids is None and ode.jacobian_weight == 0:
        return 0.0
    low, high = (grids.min_steps, grids.max_steps) if grids is not None else (ode.n_steps, ode.n_steps)
    blocks = [m for m in model.modules() if isinstance(m, ODEBlock)]
    trained = [block.ode for block in blocks]

    def at(n_steps: int) -> float:
        for block in blocks:
            block.ode = dataclasses.replace(block.ode, n_steps=n_steps)
        return forward_flops_per_token(model, seq_len, batch_size)

    try:
        at_low, at_next = at(low), at(high if high > low else low + 1)
    finally:
        for block, config in zip(blocks, trained):
            block.ode = config
    per_step = (at_next - at_low) / max(high - low, 1)  # one step's field evaluations (all its stages)
    mean_steps = (low + high) / 2
    total = at_low + per_step * (mean_steps - low)
    if ode.jacobian_weight > 0:  # per step point, one vjp of one field evaluation (a step's first stage)
        field_flops = per_step / TABLEAUS[ode.method].n_stages  # the regularisers need a Runge-Kutta method
        total += mean_steps * regulariser_flops(field_flops, kinetic=False, jacobian=True)
    return total


def _forward_flops(model: torch.nn.Module, seq_len: int, batch_size: int) -> int:
    """FLOPs of one forward pass over ``batch_size`` sequences of zeros (see forward_flops_per_token)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_flash_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    # torch counts the CUDA attention kernels but not the CPU one; count it the same way
    custom = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention}
    device = next(model.parameters()).device
    idx = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=custom) as counter:
            model(idx, return_logits=True)
    finally:
        model.train(was_training)
    return counter.get_total_flops()


def forward_flops(tc: TrainConfig, batch_size: int | None = None) -> float:
    """Forward FLOPs per token of ``tc``'s model at ``tc.seq_len``, on forward passes of
    ``batch_size`` sequences (default ``tc.batch_size``: one device) (``forward_flops_per_token``).

    Fixed-step models are built on the meta device (no memory, no time) where they can be; others
    (an adaptive solver, whose steps at initialisation are what is counted) on the CPU.
    The global random state is left as it was. A count is made once per model, sequence length and
    batch in a process: a time estimate prices hundreds of records of a few dozen shapes.
    """
    cfg = model_with_vocab(tc)
    batch_size = tc.batch_size if batch_size is None else batch_size
    key = (repr(dataclasses.asdict(cfg)), tc.seq_len, batch_size)
    if key not in _COUNTED:
        _COUNTED[key] = _count_forward_flops(cfg, tc.seq_len, batch_size)
    return _COUNTED[key]


# forward_flops per (model config, sequence length, batch): a count is a pure function of these
_COUNTED: dict[tuple[str, int, int], float] = {}


def forget_counts() -> None:
    """Empty ``forward_flops``' memo of counts, so that the next call of each shape counts again
    (what a benchmark of the counting itself needs)."""
    _COUNTED.clear()


def _count_forward_flops(cfg, seq_len: int, batch_size: int) -> float:
    try:
        with torch.device("meta"):
            return forward_flops_per_token(build_model(cfg), seq_len, batch_size)
    except (NotImplementedError, RuntimeError):  # values read on the host (step control, unique times): meta has none
        with torch.random.fork_rng(devices=[]):
            return forward_flops_per_token(build_model(cfg), seq_len, batch_size)



def model_with_vocab(tc: TrainConfig) -> ModelConfig:
    """The model a run of ``tc`` builds: ``tc.model`` with the tokenizer's vocabulary size where it
    is unset (``VOCAB_SIZES``: the tokenizer is not loaded), for counting its FLOPs or parameters
    or keying its timings. Not finishing the config: that is ``train``'s and the store's
    (``evaluation.with_tokenizer_vocab``, which also refuses a vocabulary smaller than the
    tokenizer's)."""
    if tc.model.vocab_size is not None:
        return tc.model
    return dataclasses.replace(tc.model, vocab_size=VOCAB_SIZES[tc.tokenizer])


def training_flops(flops_per_token: float, tokens: int) -> float:
    """Training FLOPs of ``tokens`` tokens at ``flops_per_token`` forward FLOPs each: forward and
    backward, ``TRAIN_FLOPS_PER_FORWARD_FLOP`` x the forward."""
    return TRAIN_FLOPS_PER_FORWARD_FLOP * flops_per_token * tokens
