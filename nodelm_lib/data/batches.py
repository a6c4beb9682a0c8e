"""Batches: windows of a split's token ids as (x, y) int64 tensors, y shifted by one token.

Random windows are drawn from an explicit ``torch.Generator``, so that data order is reproducible
per seed; only the windows drawn are copied out of the token array (or its memmap).

    x, y = sample_batch(ids, 12, 64, torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import numbers

import numpy as np
import torch


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1].

    Starts are drawn uniformly from every valid offset with ``generator``, so the
    data order depends only on its seed. Returns two int64 (B, T) tensors.
    ``tokens`` may be any 1-D integer tensor or numpy array (e.g. the uint16 cache, or its
    memmap: only the windows drawn are read and copied).
    """
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    n = tokens.shape[0]
    if n < seq_len + 1:
        raise ValueError(f"split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(n - seq_len, (batch_size,), generator=generator)
    if isinstance(tokens, np.ndarray):  # gathered by numpy: torch < 2.3 has no uint16
        idx = starts.numpy()[:, None] + np.arange(seq_len)  # (B, T) gather, no Python loop
        x = torch.from_numpy(tokens[idx].astype(np.int64))
        y = torch.from_numpy(tokens[idx + 1].astype(np.int64))
    else:
        idx = (starts[:, None] + torch.arange(seq_len)).to(tokens.device)
        x = tokens[idx].to(torch.int64)
        y = tokens[idx + 1].to(torch.int64)
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and x.device.type == "cpu":
            # pinned memory lets the copy overlap with compute (as in nanoGPT)
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


def fixed_batches(tokens, n_batches: int, batch_size: int, seq_len: int,
                  seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of evaluation batches: the same on every call for a given seed,
    and independent of any training generator (it has its own)."""
    g = torch.Generator().manual_seed(seed)
    return [sample_batch(tokens, batch_size, seq_len, g) for _ in range(n_batches)]


def check_count(key: str, value, alternative: str = "") -> None:
    """ValueError unless ``value`` is an integer >= 1 (``alternative``: what else it may be)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{key}={value!r} is not valid; it must be an integer >= 1{alternative}")


def window_count(n_tokens: int, seq_len: int) -> int:
    """Consecutive windows of ``seq_len`` targets that ``split_windows`` cuts ``n_tokens`` into."""
    return (n_tokens - 1) // seq_len


def split_windows(tokens, batch_size: int, seq_len: int, max_windows: int | None = None
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A whole split as batches of consecutive, non-overlapping windows: window i is
    x = tokens[i T:(i + 1) T], y shifted by one, so every token but the first is a target
    exactly once (with the context its window gives). The last batch may be smaller;
    ``max_windows`` keeps only the first windows. ``tokens``: a 1-D sequence, array (or
    memmap: only the tokens the windows use are read) or tensor of ids."""
    check_count("batch_size", batch_size)
    check_count("seq_len", seq_len)
    if max_windows is not None:
        check_count("max_windows", max_windows, " (or None: every window)")
    n = len(tokens)
    n_windows = window_count(n, seq_len)
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"the split has {n} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    used = torch.from_numpy(np.asarray(tokens[: n_windows * seq_len + 1]).astype(np.int64))
    x = used[:-1].view(n_windows, seq_len)
    y = used[1:].view(n_windows, seq_len)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_windows, batch_size)]
