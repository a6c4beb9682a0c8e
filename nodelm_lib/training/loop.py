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

import logging
import math
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm  # text bar everywhere: tqdm.auto warns without ipywidgets

from nodelm_lib.config import TrainConfig, to_dict
from nodelm_lib.data import sample_batch
from nodelm_lib.data.words import split_words
from nodelm_lib.files import check_folder
from nodelm_lib.models import CausalLM, build_model
from nodelm_lib.nn.lora import add_lora, count_lora_parameters
from nodelm_lib.nn.losses import release_kept_buffers

from . import distributed
from .device import (check_dtype_supported, compile_for, enable_tf32, environment,
                     process_peak_memory_mb, resolve_device)
from .distributed import SINGLE, Context
from .evaluation import (activation_bytes, batch_tokens, eval_batches, evaluate, final_eval_batches,
                         split_tokens, with_tokenizer_vocab)
from .flops import forward_flops_per_token, training_forward_flops_per_token
from .optim import clip_gradients, lr_at, make_optimizer, measure_gradients
from .profiling import keep_freed_memory
from .record import CHECKPOINT_NAME, RECORD_NAME, NonFiniteError, RunRecord, check_learned, final_train_loss
from .state import load_parent_weights, load_training_state, save_training_state


log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the loop


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

    ``tc`` may be unfinished (``model.vocab_size`` unset): it is finished here, once
    (``with_tokenizer_vocab``), and what this calls takes it finished.
    """
    t_start = time.perf_counter()
    check_folder("out_dir", tc.out_dir)
    check_folder("log_dir", tc.log_dir)
    tc = with_tokenizer_vocab(tc)
    ctx = distributed.launch_context()
    local_batch = distributed.check_batch_divides(tc.batch_size, ctx.world_size)
    device = _prepare_device(tc, ctx)
    out_dir = Path(tc.out_dir) if tc.out_dir else None
    ckpt_path = out_dir / CHECKPOINT_NAME if out_dir else None

    train_tokens = split_tokens(tc, "train")
    val_batches = eval_batches(tc, "validation")

    distributed.setup(ctx, device)
    torch.manual_seed(tc.seed)  # initialisation and dropout masks
    model = build_model(tc.model)
    if tc.init_from is not None:
        load_parent_weights(model, tc)
    if tc.lora_rank:  # before the optimiser (it takes what requires grad) and a resume (its keys)
        add_lora(model, tc.lora_rank)
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

    record = _new_record(tc, model, local_batch, probe, autocast, device, ctx)
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
    # a subword run's whole-split validation loss also as perplexity per word (data.words)
    tokens_per_word = (batch_tokens(val_batches) / split_words(tc.dataset, "validation")
                       if writer is not None and tc.eval_on == "whole_split" and tc.tokenizer != "char" else None)
    model.train()
    train_time = 0.0
    bar = tqdm(total=tc.max_steps, initial=start, disable=not (tc.progress and ctx.is_main),
               desc=f"{tc.model.arch} seed {tc.seed}")
    try:
        for step in range(start, tc.max_steps):
            t0 = time.perf_counter()
            row = train_step(model, step_model, optimizer, tc, step, train_tokens, batch_gen, device, groups,
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
            _log_tensorboard(writer, done, row, record.evals[-1] if record.evals[-1]["step"] == done else None,
                             tokens_per_word)
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

    record.final = _final_losses(tc, model, record, val_batches, autocast, device, ctx)
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


def _prepare_device(tc: TrainConfig, ctx: Context) -> torch.device:
    """This process's device, checked for ``tc.dtype`` and set up for a run on it."""
    device = distributed.process_device(ctx, resolve_device(tc.device))
    check_dtype_supported(tc.dtype, device)
    if device.type == "cpu":
        keep_freed_memory()  # no page faults on the step's large tensors (profiling.keep_freed_memory)
    if device.type == "cuda":
        enable_tf32()
        torch.cuda.reset_peak_memory_stats(device)  # the peak of this run, not of the process
    return device


def _new_record(tc: TrainConfig, model: CausalLM, local_batch: int, probe, autocast, device,
                ctx: Context) -> RunRecord:
    """The record of a run about to train: what it is, its size and cost per token (for a step of
    ``local_batch`` rows, this process's), and where it runs; ``probe``, one batch of inputs,
    measures a step's activations."""
    record = RunRecord(
        config=to_dict(tc), config_hash=tc.config_hash(), seed=tc.seed,
        params={"total": model.num_params(), "non_embedding": model.num_params(non_embedding=True),
                **({"trained": count_lora_parameters(model)} if tc.lora_rank else {})},
        flops_per_token=forward_flops_per_token(model, tc.seq_len, local_batch), flops_batch_size=local_batch,
        train_flops_per_token=training_forward_flops_per_token(model, tc.model.ode, tc.seq_len, local_batch),
        environment=environment(device, ctx),
    )
    record.activation_mb = activation_bytes(model, *probe, autocast) / 2**20
    return record


def _final_losses(tc: TrainConfig, model: CausalLM, record: RunRecord, val_batches, autocast, device,
                  ctx: Context) -> dict:
    """The trained model's final losses: train (``final_train_loss``), validation on the
    profile's final batches (the last evaluation's, where they are the curve's batches) and,
    with ``score_test``, test, computed once, here."""
    final_val_batches = final_eval_batches(tc, "validation", val_batches)
    final = {
        "train_loss": final_train_loss(record.metrics),
        "val_loss": (record.evals[-1]["val_loss"] if final_val_batches is val_batches
                     else evaluate(model, final_val_batches, device, autocast, ctx)),
        "val_tokens": batch_tokens(final_val_batches),
    }
    if tc.score_test:
        test_batches = final_eval_batches(tc, "test")
        final["test_loss"] = evaluate(model, test_batches, device, autocast, ctx)
        final["test_tokens"] = batch_tokens(test_batches)
    return final


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


def train_step(model, step_model, optimizer, tc, step, train_tokens, batch_gen, device, groups, autocast,
                record, ctx: Context = SINGLE) -> dict:
    lr = lr_at(step, tc)
    for group in optimizer.param_groups:
        group["lr"] = lr
    x, y = _training_batch(tc, train_tokens, batch_gen, device, ctx)
    ode = tc.model.ode
    if ode.random_grid or ode.regularised:  # this step's grid and noise, from (seed, step) alone
        model.draw_step(tc.seed, step)
    with autocast():
        _, loss = step_model(x, y, return_logits=False)
    # the flow regularisers: minimised with the loss, not logged in it
    penalty, flow = model.flow_penalty() if ode.regularised else (None, {})
    # the global batch's loss on every rank, so that every rank stops at a non-finite one together
    loss_value = distributed.global_mean(ctx, loss)
    if not math.isfinite(loss_value):
        raise NonFiniteError(f"non-finite loss ({loss_value}) at step {step + 1}", record)
    optimizer.zero_grad(set_to_none=True)
    (loss if penalty is None else loss + penalty).backward()
    norms, grads, per_tensor = measure_gradients(model, groups)
    if not math.isfinite(norms["grad_norm"]):
        bad = [g for g, v in norms.items() if not math.isfinite(v)]
        raise NonFiniteError(f"non-finite gradient at step {step + 1} in {', '.join(bad)}", record)
    if tc.grad_clip > 0:
        clip_gradients(grads, per_tensor, tc.grad_clip)
    optimizer.step()
    solver_counts = {f"ode/{key}": value for key, value in model.ode_stats().items()}
    return {"step": step + 1, "loss": loss_value, "lr": lr, **norms, **solver_counts, **flow}


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


def _log_tensorboard(writer, step: int, row: dict, evaluation: dict | None, tokens_per_word: float | None) -> None:
    if writer is None:
        return
    for key, value in row.items():
        if key != "step":
            writer.add_scalar(f"train/{key}", value, step)
    if evaluation is not None:
        loss = evaluation["val_loss"]
        writer.add_scalar("val/loss", loss, step)
        writer.add_scalar("val/perplexity", math.exp(min(loss, 700.0)), step)  # min: exp overflows past ~709
        if tokens_per_word is not None:
            writer.add_scalar("val/word_perplexity", math.exp(min(loss * tokens_per_word, 700.0)), step)

