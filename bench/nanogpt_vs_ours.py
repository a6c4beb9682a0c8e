"""Training step of this library's ``gpt`` against nanoGPT's, at nanoGPT's CPU baby config.

    python bench/nanogpt_vs_ours.py                    # 6 rounds x 20 timed steps each, 1 thread
    python bench/nanogpt_vs_ours.py --threads 2 --rounds 10
    python bench/nanogpt_vs_ours.py --quick            # tiny sizes: a smoke test, not a measurement

The reference is ``bench/nanogpt_reference.py`` (nanoGPT's model and train.py iteration,
re-implemented from its description) at ``BABY``: 4 layers, 4 heads, width 128, block 64,
batch 12, dropout 0, LayerNorm and Linear without bias (train.py's default), full (B, T, V)
logits and ``F.cross_entropy``, AdamW (multi-tensor: nanoGPT fuses it on CUDA only), clip 1.0,
warmup + cosine. Ours is ``gpt`` at the same sizes (``bias`` on, ModelConfig's default, unless
``--no-ours-bias``) trained by ``nodelm_lib/train.py``'s own step (``_train_step``: the learning
rate of ``lr_at``, a batch from ``sample_batch``, the chunked loss without (B, T, V) logits, the
loss's finiteness check, the per-group gradient norms, clipping, ``make_optimizer``'s fused
AdamW), with the same optimiser settings (lr 1e-3, min lr 1e-4, warmup 100 of 2000, weight
decay 0.1, betas (0.9, 0.99)). Evaluation, checkpoints and the progress bar are in neither.

Both train in this process on the tiny-shakespeare train split (this library's 90% cut) with
nanoGPT's vocabulary of its 65 distinct characters (``--vocab 256``: this library's byte ids,
vocabulary 256, for both). They take turns in rounds, the order alternating between rounds so
that neither always runs first after the other; each turn's first step is not timed (it pays
for the switch: caches and allocator state left by the other model). Reported: the median
seconds per step over every timed step, tokens/s = batch x block / median, and the ratio
ours / reference of the medians (below 1: ours is faster; issue 20 asks for reference / ours
>= 1.3). Also the median CPU time per step (``time.process_time``, every thread of the
process): on a shared machine that gives this process less than its threads' worth of cores,
wall times grow with the contention and CPU times much less. Nothing is written to results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # nanogpt_reference
import nodelm_lib as nl  # noqa: E402
from nodelm_lib.data import load_tokens  # noqa: E402
from nodelm_lib.profiling import cpu_description  # noqa: E402
from nodelm_lib.train import RunRecord, _train_step, make_optimizer  # noqa: E402
from nanogpt_reference import BABY, NanoGPT, NanoGPTConfig, NanoGPTTrainer, char_vocab_65  # noqa: E402

# --quick: every size small, so that a run takes seconds; the numbers mean nothing
QUICK = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=2)


def training_ids(vocab: int) -> tuple[np.ndarray, str]:
    """The tiny-shakespeare train split as uint16 ids in nanoGPT's 65-character vocabulary
    (or the byte ids, ``vocab=256``), and a description; random ids if the corpus is missing."""
    try:
        splits = [load_tokens("tinyshakespeare", s, "char") for s in ("train", "validation", "test")]
    except (OSError, RuntimeError, ValueError) as err:
        print(f"note: tiny-shakespeare not available ({type(err).__name__}: {err}); timing on random ids")
        return np.random.default_rng(0).integers(0, vocab, 200_000).astype(np.uint16), f"random ids < {vocab}"
    if vocab == 256:
        return splits[0], "tiny-shakespeare train split, byte ids (vocabulary 256)"
    alphabet = np.unique(np.concatenate(splits))
    ids, _ = char_vocab_65(splits[0], alphabet)
    return ids, f"tiny-shakespeare train split, its {len(alphabet)} distinct characters"


class Ours:
    """``gpt`` and ``nl.train``'s optimiser and step, at the reference's sizes and settings."""

    def __init__(self, cfg: NanoGPTConfig, ids: np.ndarray, bias: bool, seed: int = 0):
        model_cfg = nl.ModelConfig(arch="gpt", vocab_size=cfg.vocab_size, d_model=cfg.n_embd, n_heads=cfg.n_head,
                                   n_layers=cfg.n_layer, max_seq_len=cfg.block_size, dropout=cfg.dropout, bias=bias)
        self.tc = nl.TrainConfig(model=model_cfg, batch_size=cfg.batch_size, seq_len=cfg.block_size,
                                 max_steps=cfg.max_iters, lr=cfg.learning_rate,
                                 min_lr_ratio=cfg.min_lr / cfg.learning_rate, warmup_steps=cfg.warmup_iters,
                                 weight_decay=cfg.weight_decay, beta1=cfg.beta1, beta2=cfg.beta2,
                                 grad_clip=cfg.grad_clip, device="cpu", progress=False)
        torch.manual_seed(seed)
        self.model = nl.build_model(model_cfg).train()
        self.optimizer = make_optimizer(self.model, self.tc)
        self.groups = self.model.param_groups()
        self.tokens = torch.from_numpy(ids.astype(np.int64))  # as train.split_tokens holds a split
        self.batch_gen = torch.Generator().manual_seed(seed)
        self.record = RunRecord(config={}, config_hash="", seed=seed)  # only named by a NonFiniteError
        self.device = torch.device("cpu")
        self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.tc.dtype == "bfloat16")
        self.iter_num = 0

    def step(self) -> float:
        row = _train_step(self.model, self.model, self.optimizer, self.tc, self.iter_num % self.tc.max_steps,
                          self.tokens, self.batch_gen, self.device, self.groups, self.autocast, self.record)
        self.iter_num += 1
        return row["loss"]

    def num_params(self) -> int:
        return self.model.num_params()


class Reference:
    def __init__(self, cfg: NanoGPTConfig, ids: np.ndarray, seed: int = 0):
        torch.manual_seed(seed)
        self.model = NanoGPT(cfg).train()
        self.trainer = NanoGPTTrainer(self.model, ids, cfg, torch.Generator().manual_seed(seed))

    def step(self) -> float:
        return self.trainer.step()

    def num_params(self) -> int:
        return self.model.num_params(non_embedding=False)


def run_turn(runner, steps: int) -> tuple[list[float], list[float], list[float]]:
    """One untimed step, then ``steps`` timed ones: (wall seconds of each, CPU seconds of each
    (every thread of this process), losses)."""
    runner.step()
    times, cpu_times, losses = [], [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        losses.append(runner.step())
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return times, cpu_times, losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="timed steps per model per round (default 20; --quick 3)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, the order alternating (default 6; --quick 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as bench/record.py's 02 step)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps: checks that it runs")
    p.add_argument("--vocab", type=int, choices=(65, 256), default=65,
                   help="65: nanoGPT's character vocabulary; 256: this library's byte ids")
    p.add_argument("--ref-bias", action=argparse.BooleanOptionalAction, default=False,
                   help="biases in the reference's LayerNorms and Linears (nanoGPT's train.py: off)")
    p.add_argument("--ours-bias", action=argparse.BooleanOptionalAction, default=True,
                   help="biases in gpt's LayerNorms and Linears (ModelConfig's default: on)")
    a = p.parse_args()
    steps = a.steps or (3 if a.quick else 20)
    rounds = a.rounds or (2 if a.quick else 6)
    torch.set_num_threads(a.threads)

    ids, data = training_ids(a.vocab)
    cfg = dataclasses.replace(BABY, vocab_size=a.vocab, bias=a.ref_bias, **(QUICK if a.quick else {}))
    runners = {"nanoGPT (reference)": Reference(cfg, ids), "nodelm gpt (ours)": Ours(cfg, ids, a.ours_bias)}
    names = list(runners)
    for runner in runners.values():  # first steps allocate everything: not part of any turn
        for _ in range(2):
            runner.step()

    times = {name: [] for name in names}
    cpu_times = {name: [] for name in names}
    losses = {name: [] for name in names}
    round_ratios = []
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t, c, loss = run_turn(runners[name], steps)
            times[name] += t
            cpu_times[name] += c
            losses[name] += loss
        ref_round, our_round = (statistics.median(times[n][-steps:]) for n in names)
        round_ratios.append(our_round / ref_round)

    cpu = cpu_description()
    tokens = cfg.batch_size * cfg.block_size
    print(f"{'QUICK (tiny sizes, not a measurement): ' if a.quick else ''}nanoGPT baby config: n_layer {cfg.n_layer}, "
          f"n_head {cfg.n_head}, n_embd {cfg.n_embd}, block {cfg.block_size}, batch {cfg.batch_size}, "
          f"vocab {cfg.vocab_size}, dropout {cfg.dropout}; {data}")
    print(f"CPU: {cpu['cpu_name']} ({cpu['cpu_count']} logical cores, {cpu['cpu_capability']}); "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{rounds} rounds x {steps} timed steps per model (1 untimed step per turn), order alternating; "
          f"step = forward, backward, clip, optimiser step\n")
    bias = {names[0]: a.ref_bias, names[1]: a.ours_bias}
    medians = {}
    cpu_medians = {name: float(np.median(cpu_times[name])) * 1e3 for name in names}
    print(f"{'model':22s} {'bias':>5s} {'params':>9s} {'ms/step':>9s} {'IQR ms':>15s} {'tokens/s':>9s} "
          f"{'CPU ms/step':>11s} {'loss (last 10 timed)':>21s}")
    for name in names:
        t = np.array(times[name]) * 1e3
        medians[name] = float(np.median(t))
        iqr = f"{np.percentile(t, 25):.2f}-{np.percentile(t, 75):.2f}"
        print(f"{name:22s} {str(bias[name]):>5s} {runners[name].num_params():9,d} {medians[name]:9.2f} {iqr:>15s} "
              f"{tokens / medians[name] * 1e3:9.0f} {cpu_medians[name]:11.2f} {np.mean(losses[name][-10:]):21.3f}")
    ratio = medians[names[1]] / medians[names[0]]
    print(f"\nratio ours / reference (median ms/step): {ratio:.3f}  ->  ours is x{1 / ratio:.2f} the reference's "
          f"speed (issue 20 target: >= 1.3)")
    print(f"ratio of CPU time per step (all threads; less sensitive to a busy machine): "
          f"{cpu_medians[names[1]] / cpu_medians[names[0]]:.3f}")
    print("per-round ratios (wall): " + " ".join(f"{x:.3f}" for x in round_ratios))


if __name__ == "__main__":
    main()
