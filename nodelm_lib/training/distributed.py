"""Data-parallel training (PyTorch DDP) of one run on several processes, launched by ``torchrun``.

    torchrun --nproc_per_node=4 -m nodelm_lib train --set batch_size=32 ...

``nl.train`` reads the launch from the environment torchrun sets (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``); without it, or with one process, nothing here runs and training is the single-process
loop, bit for bit. With N processes:

- ``batch_size`` stays the *global* batch. Every rank draws the same global batch from the same
  seeded generator and keeps its own contiguous share of the rows (``local_batch``), so the ranks
  see disjoint parts of one global batch order: the order a single process sees.
- Each rank's loss is the mean over its rows; DDP averages the gradients, which for equal shards is
  the gradient of the mean over the global batch. The logged loss is all-reduced to the global mean.
  So N processes compute what one process computes with the same ``batch_size`` (up to float
  rounding in the sums: ~1e-7 relative).
- Evaluation batches are dealt round-robin to the ranks and the per-batch losses gathered, so the
  recorded validation and test losses are exactly the single-process numbers.
- Only rank 0 writes checkpoints, records and logs; a checkpoint holds every rank's random state,
  and resumes under any world size (the replicated model, optimiser and batch generator are the
  same on every rank).
- Backend: ``nccl`` on CUDA (one GPU per process, ``cuda:LOCAL_RANK``), ``gloo`` on the CPU.

Dropout: rank 0 keeps the run seed's random stream (a one-process run's); rank r > 0 draws its
masks from a stream derived from (seed, r), so the ranks' masks are independent.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as torch_dist

BACKENDS = {"cuda": "nccl", "cpu": "gloo"}
EXIT_WAIT = timedelta(seconds=30)  # how long a finishing rank waits for the others at exit
EXIT_SETTLE = timedelta(milliseconds=100)  # then, the GIL left to gloo's workers (see _destroy)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """Where this process stands in a data-parallel run (``world_size == 1``: a plain run)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, records and logs."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


SINGLE = Context()


def launch_context(environ=None) -> Context:
    """The rank, local rank and world size torchrun (or SLURM through submitit's
    ``TorchDistributedEnvironment``) put in the environment; ``SINGLE`` when there are none."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return SINGLE
    try:
        world = int(environ["WORLD_SIZE"])
        rank = int(environ.get("RANK", "0"))
        local_rank = int(environ.get("LOCAL_RANK", "0"))
    except ValueError as err:
        raise ValueError(f"the launch environment is not valid (WORLD_SIZE={environ.get('WORLD_SIZE')!r}, "
                         f"RANK={environ.get('RANK')!r}, LOCAL_RANK={environ.get('LOCAL_RANK')!r}): {err}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"the launch environment is not valid: RANK={rank} must be in [0, WORLD_SIZE={world})")
    return Context(rank=rank, local_rank=local_rank, world_size=world)


def check_batch_divides(batch_size: int, world_size: int) -> int:
    """The per-rank batch: ``batch_size`` is the global batch, split evenly. Unequal shards would
    weight the ranks' rows unequally in DDP's gradient average, so they are refused."""
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} (the global batch) does not divide among {world_size} processes; "
                         f"choose a multiple of {world_size} (e.g. {batch_size - batch_size % world_size or world_size}) "
                         f"or another --nproc_per_node")
    return batch_size // world_size


def process_device(ctx: Context, device: torch.device) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` (one GPU per process) or the CPU."""
    if not ctx.active:
        return device
    if device.type not in BACKENDS:
        raise ValueError(f"data-parallel training runs on {' or '.join(map(repr, BACKENDS))}, not device={device.type!r}")
    if device.type == "cuda":
        if ctx.local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={ctx.local_rank} but this machine has {torch.cuda.device_count()} GPU(s); "
                             f"start at most that many processes per node (--nproc_per_node)")
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    return device


def setup(ctx: Context, device: torch.device) -> None:
    """Join the process group (nccl on CUDA, gloo on CPU) unless this process already has; the
    group is left in place for later runs of the same process and destroyed at exit."""
    if not ctx.active or torch_dist.is_initialized():
        return
    torch_dist.init_process_group(backend=BACKENDS[device.type], rank=ctx.rank, world_size=ctx.world_size)
    atexit.register(_destroy)


def _destroy() -> None:
    """Leave the process group together, and only once gloo's worker threads are done with Python.

    A gloo worker releases a finished collective's tensors after the caller has already woken, and the
    release takes the GIL. If the interpreter is finalising by then, the worker thread is killed
    inside a noexcept destructor and the whole process aborts ("terminate called without an active
    exception": seen in about one CPU launch in seven; the core dump shows ~AsyncAllgatherWork
    under ProcessGroupGloo::runLoop). So: a barrier (a rank that never arrives, e.g. one that
    crashed, is waited for EXIT_WAIT, not forever), then the GIL released for EXIT_SETTLE so the
    workers can let go, then the group destroyed."""
    if not torch_dist.is_initialized():
        return
    if torch_dist.get_backend() == "gloo":  # the crash is in gloo's runLoop; nccl (untried here) as before
        try:
            torch_dist.barrier(async_op=True).wait(timeout=EXIT_WAIT)
        except RuntimeError as err:
            log.warning("leaving the process group without the other ranks (%s)", err)
        time.sleep(EXIT_SETTLE.total_seconds())
    torch_dist.destroy_process_group()


def unused_parameters(ctx: Context, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    """Names of the parameters a training step leaves without a gradient (the hybrid's control
    projection, when no control is given), found by one forward and backward on (x, y) with the
    random state restored after; none in a single process, where it does not matter. DDP must
    be told of them, or it waits for their gradients forever."""
    if not ctx.active:
        return []
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        _, loss = model(x, y, return_logits=False)
        loss.backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def wrap(ctx: Context, model: torch.nn.Module, device: torch.device, unused: list[str] = ()) -> torch.nn.Module:
    """``model`` under DistributedDataParallel (which also broadcasts rank 0's weights), or as is.
    With ``unused`` parameters DDP looks for them every step (``find_unused_parameters``) and leaves
    their gradients None on every rank, as a single process does: AdamW then skips them, as it
    does there (a zero gradient would still decay their weights)."""
    if not ctx.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=bool(unused))


def seed_rank(ctx: Context, seed: int, step: int = 0) -> None:
    """Give rank r > 0 its own dropout stream, derived from (seed, rank, step); rank 0 keeps the
    run seed's stream. ``step`` is where a resumed run restarts (no saved state for this rank)."""
    if ctx.rank == 0:
        return
    (derived,) = np.random.SeedSequence([seed, ctx.rank, step]).generate_state(1)
    torch.manual_seed(int(derived))


def local_rows(ctx: Context, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """This rank's contiguous share of the rows of each (global-batch) tensor."""
    if not ctx.active:
        return tensors
    share = check_batch_divides(tensors[0].shape[0], ctx.world_size)
    return tuple(t[ctx.rank * share:(ctx.rank + 1) * share] for t in tensors)


def global_mean(ctx: Context, value: torch.Tensor) -> float:
    """The mean of a scalar over the ranks (the loss of the global batch), on every rank."""
    if not ctx.active:
        return float(value.detach())
    value = value.detach().float().reshape(1).clone()
    torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
    return float(value) / ctx.world_size


def my_batches(ctx: Context, batches: list) -> list[int]:
    """Indices of the evaluation batches this rank scores: round-robin over the ranks."""
    return list(range(ctx.rank, len(batches), ctx.world_size))


def gather_values(ctx: Context, n: int, mine: dict[int, float], device: torch.device) -> list[float]:
    """Every rank's ``{index: value}`` combined into one list of ``n`` values, on every rank.
    Float64 and a sum with zeros elsewhere: each value arrives exactly as its rank computed it."""
    if not ctx.active:
        return [mine[i] for i in range(n)]
    values = torch.zeros(n, dtype=torch.float64, device=device)
    for i, value in mine.items():
        values[i] = value
    torch_dist.all_reduce(values, op=torch_dist.ReduceOp.SUM)
    return values.tolist()


def gather_rng_states(ctx: Context, device: torch.device) -> list[dict] | None:
    """Every rank's random state (CPU, and its GPU's), in rank order, on every rank; None for a
    single process (whose state the checkpoint holds already)."""
    if not ctx.active:
        return None
    state = {"torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
    states: list = [None] * ctx.world_size
    torch_dist.all_gather_object(states, state)
    return states


def restore_rng_state(ctx: Context, states: list[dict] | None, seed: int, step: int, device: torch.device) -> None:
    """After a resume: rank r > 0 takes back its own saved random state when the checkpoint was
    written by as many processes, otherwise a fresh stream derived from (seed, rank, step). Rank 0
    takes the checkpoint's main state (``state.load_training_state``)."""
    if ctx.rank == 0:
        return
    if states is not None and len(states) == ctx.world_size:
        torch.set_rng_state(states[ctx.rank]["torch"])
        if states[ctx.rank]["cuda"] is not None and device.type == "cuda":
            torch.cuda.set_rng_state(states[ctx.rank]["cuda"], device)
        return
    seed_rank(ctx, seed, step)


def barrier(ctx: Context) -> None:
    """Wait for every rank (e.g. until rank 0 has written a checkpoint the others may read)."""
    if ctx.active:
        torch_dist.barrier()
