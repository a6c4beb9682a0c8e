"""What every language model shares: token + position embeddings, final norm, tied head.

A family subclasses ``CausalLM`` and implements ``body(x, **kwargs)``, the map from the
embedded sequence (B, T, D) to the final hidden states (B, T, D). Everything else (the
position embeddings and the ``max_seq_len`` check, the loss, initialisation, parameter counts)
lives here once, as does ``ODEBlock``, the one place where a model calls the ODE solver, and
``ContinuousDepthLM``, the body of the models that are a single time-dependent block
integrated over t in [0, 1].
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import typing

import torch
import torch.nn as nn
import torch.nn.functional as F

from nodelm_lib import families
from nodelm_lib.config import ModelConfig, ODEConfig
from nodelm_lib.nn.decode_cache import DecodeCache, active_cache, compiling
from nodelm_lib.nn.losses import linear_cross_entropy
from nodelm_lib.nn.time_grid import KeptGrid, time_grid
from nodelm_lib.ode import FIXED_STEP_METHODS, Solver, SolverCounters, gradient_method
from nodelm_lib.ode.random_grid import step_generator
from nodelm_lib.ode.regularisers import FlowRegulariser
from nodelm_lib.ode.tableaus import TABLEAUS


def check_token_ids(idx: torch.Tensor, vocab_size: int, read_values: bool = True) -> None:
    """ValueError unless ``idx`` is a (B, T) integer tensor of ids in [0, vocab_size): an
    embedding lookup would fail with a bare IndexError on an id past the end, and a lookup by
    indexing (cached decoding) would wrap a negative id around. ``read_values=False`` checks the
    shape and dtype only (no host synchronisation: a CUDA forward, a compiled one)."""
    if not isinstance(idx, torch.Tensor) or idx.ndim != 2 or idx.is_floating_point() or idx.is_complex() \
            or idx.dtype == torch.bool:
        what = f"shape {tuple(idx.shape)} {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"idx must be a (B, T) tensor of integer token ids, got {what}")
    if read_values and idx.numel():
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the model's vocabulary: ids must be in [0, {vocab_size - 1}] "
                             f"(vocab_size={vocab_size})")


class CausalLM(nn.Module):
    """Base class: ``logits, loss = model(idx, targets)``; ``loss`` is None without targets.

    ``model(idx, targets, return_logits=False)`` returns ``(None, loss)`` and computes the loss
    in chunks without materialising the (B, T, V) logits (what training and evaluation use).

    Positions (``cfg.position``): ``"learned"`` adds ``wpe``, a table of ``max_seq_len``
    embeddings, to the token embeddings, and refuses longer sequences; with ``"rope"`` there is
    no table (``wpe`` is None) and the attention layers rotate queries and keys instead
    (``layers.apply_rope``), so any length runs (``context_limit``).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is None; set it (e.g. 256 for char, 50257 for gpt2)")
        self.cfg = cfg
        # the entries of the model file it was loaded from besides the weights and config (tokenizer,
        # dataset, step, ...; ``training.model_files.load_model``); empty for a model built here
        self.checkpoint_metadata: dict = {}
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.position == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    # Fast decoding (``generation.fast_decode``) runs ``decode_stages()`` in place of ``body``: the
    # body's discrete blocks (each with ``freeze()``) and ODE blocks (fields with ``freeze(t, control,
    # device)``) in order, or None for a body it cannot run (then the modules decode). It is trusted
    # only where it is defined with ``body`` (``frozen.honours``); ``decode_kwargs`` are the forward
    # arguments it handles.
    decode_kwargs: frozenset[str] = frozenset()

    def body(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def decode_stages(self) -> list[nn.Module] | None:
        return None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True,
                cache: DecodeCache | None = None, **kwargs):
        """``cache`` (a ``DecodeCache``, see ``generate``): ``idx`` holds only the positions after
        the ``cache.length`` already processed, and their state is added to the cache."""
        check_token_ids(idx, self.cfg.vocab_size, read_values=idx.device.type == "cpu" and not compiling())
        B, T = idx.shape
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)} (the next token of each position), "
                             f"got {tuple(targets.shape)}")
        if cache is not None and compiling():  # the layers cannot see the cache there (``compiling``)
            raise ValueError("decoding with a cache under torch.compile is not supported: pass the "
                             "uncompiled model (nl.generate does)")
        start = cache.length if cache is not None else 0
        if self.context_limit is not None and start + T > self.context_limit:
            raise ValueError(
                f"sequence length {start + T} exceeds max_seq_len={self.cfg.max_seq_len}; "
                "crop the context, or build the model with a larger max_seq_len or with position='rope'"
            )
        x = self.embed(idx, start)
        if cache is None:
            h = self.ln_f(self.body(x, **kwargs))
        else:
            with cache.step(T):
                h = self.ln_f(self.body(x, **kwargs))
        if targets is not None and not return_logits:
            return None, linear_cross_entropy(h.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1))
        logits = self.lm_head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    @property
    def context_limit(self) -> int | None:
        """The most positions a sequence may have: ``max_seq_len`` with learned positions (the
        table ends there), None with rope (no limit: ``max_seq_len`` is the training context)."""
        return self.cfg.max_seq_len if self.wpe is not None else None

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The embedded sequence drop(wte(idx) + wpe(pos)) for idx (B, T) at positions start, start + 1, ...
        (with rope drop(wte(idx)): attention adds the positions): what ``body`` receives (for a
        continuous-depth model, x(0))."""
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))
        return self.drop(x)

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

    def draw_step(self, seed: int, step: int) -> None:
        """Draw what every ODE block solves with at training step ``step`` of a run with seed
        ``seed``: its random grid (``ODEBlock.draw_grid``) and its flow regularisers' noise, each
        from a stream of its own (``random_grid.step_generator``). The training loop calls it
        before each step, so both depend on (seed, step) alone: a resumed run draws the same."""
        blocks = [m for m in self.modules() if isinstance(m, ODEBlock)]
        for stream, block in enumerate(blocks):
            block.draw_grid(step_generator(seed, step, stream))
            block.noise = step_generator(seed, step, len(blocks) + stream)

    def flow_penalty(self) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The flow regularisers' penalty gathered by the last training forward pass (summed over
        the ODE blocks; None where none was gathered) and its unweighted integrals, to log."""
        blocks = [m for m in self.modules() if isinstance(m, ODEBlock) and m.penalty is not None]
        if not blocks:
            return None, {}
        integrals = {f"flow/{k}": sum(b.flow_integrals[k] for b in blocks) for k in blocks[0].flow_integrals}
        return sum(b.penalty for b in blocks), integrals

    def ode_stats(self) -> dict[str, int]:
        """Solver counters of the last forward (and backward) pass, summed over the ODE blocks.

        Keys as in ``SolverCounters`` (nfe, n_accepted, n_rejected, nfe_backward); ``{}`` for a
        model without ODE blocks. Training logs them per step as ``ode/<key>``.
        """
        found = [m.counters for m in self.modules() if isinstance(m, ODEBlock)]
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
        # Time-dependent layers (``owns_init``) initialise themselves: the networks reading t
        # must not start at N(0, 0.02), or their outputs, and so the depth dependence, would
        # start near zero. Children first, so that a layer can adjust what its children set.
        for name, module in reversed(list(self.named_modules())):
            if getattr(module, "owns_init", False):
                module.reset_parameters(std=std if name.endswith("c_proj") else 0.02)

    # ------------------------------------------------------------------ bookkeeping

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (the tied head counted once). ``non_embedding`` leaves out the
        token and position embeddings (a rope model has none of the latter), the usual basis
        for comparing model sizes."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + (self.wpe.weight.numel() if self.wpe is not None else 0)
        return n

    def param_groups(self) -> dict[str, list[str]]:
        """Parameter names grouped by top-level module (``wte``, ``blocks``, ``ode_block`` ...),
        the groups for which training logs separate gradient norms."""
        groups: dict[str, list[str]] = {}
        for name, _ in self.named_parameters():
            groups.setdefault(name.split(".")[0], []).append(name)
        return groups


# --------------------------------------------------------------------------- ODE blocks

DEPTH_INTERVAL = (0.0, 1.0)  # every ODE block integrates over depth t in [0, 1]


_TWICE = contextvars.ContextVar("nodelm_twice_differentiable", default=False)


def twice_differentiable() -> bool:
    """Whether the layers are asked for kernels that backpropagate twice (``differentiable_twice``)."""
    return _TWICE.get()


@contextlib.contextmanager
def differentiable_twice(needed: bool = True):
    """Within it, layers run kernels whose backward can itself be differentiated: PyTorch's math
    attention kernel (the fused CPU and flash ones implement no double backward) and the SSM
    layer's sequential scan (the fused scan's backward is hand-written). The Jacobian regulariser
    needs it: it backpropagates through a vector-Jacobian product. Slower; off unless ``needed``."""
    if not needed:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    token = _TWICE.set(True)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        _TWICE.reset(token)


class InferencePlan(typing.NamedTuple):
    """What an inference solve of an ``ODEBlock`` steps on, formed once per setting
    (``ODEBlock.inference_plan``): for ``ode`` (a copy) and a state of ``dtype`` on ``device``."""

    ode: ODEConfig
    dtype: torch.dtype
    device: torch.device
    decoding: bool  # formed while decoding (``active_cache``): no field times, weights kept per call site
    solver: Solver
    times: torch.Tensor
    steps: list
    field_times: torch.Tensor | None


class ODEBlock(nn.Module):
    """Integrates ``field(t, x, *args)`` from t = 0 to t = 1 and returns x(1).

    Fixed-step methods take ``ode.n_steps`` steps; adaptive ones choose their own. ``self.ode``
    may be replaced after training (``CausalLM.set_ode``) to evaluate at other steps or
    methods; ``self.counters`` holds the counters of the last solve (reset at every forward).
    ``times``, ``solver`` and ``step_times`` are the interval, solver and grid of that solve, for
    anything that must reproduce it (``node.evaluate_at``, the analyses).

    Two ablation switches of the continuous-depth models live here, since they are about how
    the field is integrated and not about what it computes:

    - ``integration="residual"``: the discrete stack x_{k+1} = x_k + f(t_k, x_k) instead of
      the Euler step x_k + dt f(t_k, x_k); solved as the ODE of f / dt, so every gradient
      method still applies.
    - ``modulation="constant"``: the field sees t = 0 at every step, so its weights do not
      depend on depth (the control for "does the t-dependence matter?").
    """

    def __init__(self, field: nn.Module, ode: ODEConfig, dropout: float = 0.0,
                 integration: str = "ode", modulation: str = "time"):
        super().__init__()
        self.field = field
        self.ode: ODEConfig = ode
        self.dropout = dropout
        self.integration = integration
        self.modulation = modulation
        self.counters = SolverCounters()
        # the grid of the next training solve (``draw_grid``): times t_0 = 0 < ... < t_n on the CPU
        self.drawn_grid: torch.Tensor | None = None
        # the flow regularisers' noise for the next training solve, and what the last one gathered
        self.noise: torch.Generator | None = None
        self.penalty: torch.Tensor | None = None
        self.flow_integrals: dict[str, float] = {}
        # the weights of an inference solve's grid, kept for the next solves (``open_grid``)
        self.keep_inference_weights = True
        self.kept_grid = KeptGrid()
        self._plan: InferencePlan | None = None  # the last inference solve's grid (``inference_plan``)

    @staticmethod
    def times(dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
        """t = [0, 1]: the output times of the solve, in the state's dtype (as ``odeint`` casts them)."""
        return torch.tensor(DEPTH_INTERVAL, dtype=dtype, device=device)

    def solver(self) -> Solver:
        """The solver ``self.ode`` describes (``n_steps`` steps over [0, 1] for a fixed-step method)."""
        ode = self.ode
        steps = ode.n_steps if ode.method in FIXED_STEP_METHODS else 1
        return Solver(ode.method, steps, ode.rtol, ode.atol, ode.max_num_steps)

    def step_times(self, dtype: torch.dtype | None = None, device=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(t_m, dt_m)`` of every step of the solve (fixed-step methods; ``Solver.step_times``)."""
        return self.solver().step_times(self.times(dtype, device))

    def draw_grid(self, generator: torch.Generator) -> None:
        """Draw the grid of the next training solve from ``ode.training_grids()`` (none for a
        model trained on its fixed grid). Evaluation (``eval()``) always solves the ``ode`` grid."""
        grids = self.ode.training_grids()
        self.drawn_grid = None if grids is None else grids.draw(generator, torch.float64)

    def solve_grid(self, dtype: torch.dtype, device) -> tuple[Solver, torch.Tensor]:
        """The solver and output times of the next solve: in training, after ``draw_grid``, one
        step per interval of the drawn grid; otherwise ``solver()`` over ``times()``."""
        if self.training and self.drawn_grid is not None:
            ode = self.ode
            return (Solver(ode.method, 1, ode.rtol, ode.atol, ode.max_num_steps),
                    self.drawn_grid.to(dtype=dtype, device=device))
        return self.solver(), self.times(dtype, device)

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        ode = self.ode
        grad = gradient_method(ode.sensitivity)
        if grad.reevaluates_field and self.training and self.dropout > 0:
            # backward evaluates the field again: new dropout masks would make the
            # reconstructed trajectory (and so the gradients) wrong
            raise ValueError(f"sensitivity={ode.sensitivity!r} needs a deterministic field: set dropout=0 "
                             "or use sensitivity='checkpoint' or 'direct'")
        if self.integration == "residual" and ode.method != "euler":
            raise ValueError(f"integration='residual' is a discrete stack x + f(t_k, x): it needs "
                             f"method='euler', got {ode.method!r}")
        self.counters.reset()
        plan = self.inference_plan(x)
        if plan is not None:
            grad.check(plan.solver)
            return self._solve_planned(plan, x, *args)
        solver, grid = self.solve_grid(x.dtype, x.device)
        grad.check(solver)
        field = lambda t, h: self.vector_field(t, h, *args)  # noqa: E731
        n_steps = solver.steps_per_interval * (grid.numel() - 1)
        if self.integration == "residual" and n_steps != ode.n_steps:  # a drawn grid: f once per step of it
            field = lambda t, h: self.vector_field(t, h, *args) * (n_steps / ode.n_steps)  # noqa: E731
        regularised = self.training and torch.is_grad_enabled() and ode.regularised
        if regularised:  # gathers the penalty at every step point of this solve
            field = FlowRegulariser(ode.kinetic_weight, ode.jacobian_weight).wrap(
                field, grid, ode.method, solver.steps_per_interval, self.noise)
        times = self.field_times(x) if grad.name == "direct" or not torch.is_grad_enabled() else None
        with self.open_grid(times), \
                differentiable_twice(regularised and ode.jacobian_weight > 0):
            states = grad.solve(
                solver,
                field,
                x,
                grid,
                params=(*self.field.parameters(), *(a for a in args if torch.is_tensor(a) and a.requires_grad)),
                counters=self.counters,
            )
        self.penalty, self.flow_integrals = None, {}
        if regularised:  # the integrals logged are those the loss weighs
            weights = {"kinetic": ode.kinetic_weight, "jacobian": ode.jacobian_weight}
            self.penalty = field.penalty()
            self.flow_integrals = {k: v for k, v in field.integrals().items() if weights[k] > 0}
        return states[-1]

    def inference_plan(self, x: torch.Tensor) -> "InferencePlan | None":
        """The solver, output times, step times and field times (``field_times``) of a solve of
        ``x`` without autograd in eval mode with a fixed-step method, formed on the first such
        solve and kept while ``ode``, x's dtype and device, and decoding or not stay the same; None
        for any other solve (training, gradients, adaptive methods, compiling). They are the
        numbers ``solve_grid`` and ``field_times`` would form again on every pass (a few dozen
        scalar tensor operations per solve, a visible share of a 4-step solve of a small model),
        so a planned solve is the unplanned one bit for bit."""
        ode = self.ode
        if self.training or torch.is_grad_enabled() or ode.method not in FIXED_STEP_METHODS or compiling():
            return None
        plan, decoding = self._plan, active_cache() is not None
        if plan is None or plan.dtype != x.dtype or plan.device != x.device or plan.decoding != decoding \
                or plan.ode != ode:
            solver, times = self.solve_grid(x.dtype, x.device)
            plan = self._plan = InferencePlan(dataclasses.replace(ode), x.dtype, x.device, decoding, solver, times,
                                              solver.step_times(times), self.field_times(x))
        return plan

    def _solve_planned(self, plan: "InferencePlan", x: torch.Tensor, *args) -> torch.Tensor:
        """x(1) of a solve on ``plan``'s grid: the fixed-step loop alone (without autograd every
        gradient method is this loop), and only its last state (no stack of the trajectory)."""
        field = lambda t, h: self.vector_field(t, h, *args)  # noqa: E731
        with self.open_grid(plan.field_times):
            xs, _ = plan.solver.march(field, x, plan.times, self.counters, grid=plan.steps)
        self.penalty, self.flow_integrals = None, {}
        return xs[-1]

    def open_grid(self, times: torch.Tensor | None):
        """The ``time_grid`` of one solve over ``times`` (none for None). At inference (eval mode,
        no autograd) it is the grid kept from the last such solve while the times and parameters
        are unchanged (``KeptGrid``): the time-dependent weights are formed once for all passes."""
        if times is None:
            return contextlib.nullcontext()
        if self.keep_inference_weights and not self.training and not torch.is_grad_enabled():
            return time_grid(self.kept_grid.grid(times, self.field))
        return time_grid(times)

    def train(self, mode: bool = True) -> "ODEBlock":
        self.kept_grid.clear()  # a change of mode starts inference afresh (the weights are formed again)
        self._plan = None
        return super().train(mode)

    def field_times(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every t at which a solve of ``x`` evaluates the field, when they are known before it
        starts, so that weights may be generated for all of them at once (``time_grid.TimeGrid``): an
        explicit Runge-Kutta method and not decoding (its cache keeps weights per call site);
        else None. ``forward`` opens the grid only for backprop through the solve (``direct``)
        or no gradient at all: the other gradient methods evaluate the field again in
        backward, outside this solve.

        The times are the solver's own numbers (``step_times``, then stage start t_m + c_i dt_m
        as ``rk_stages`` forms it, in x's dtype), so a field sees bit for bit the t it would see
        without the grid. The grid is the next solve's (``solve_grid``: a drawn one in training)."""
        ode = self.ode
        if ode.method not in TABLEAUS or active_cache() is not None or compiling():
            return None
        c = TABLEAUS[ode.method].c
        solver, grid = self.solve_grid(x.dtype, x.device)
        steps = solver.step_times(grid)
        return torch.unique(torch.stack([t_m + c_i * dt_m for t_m, dt_m in steps for c_i in c]))

    def check_control(self, control: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        """The control vector as ``forward`` hands it to the field (the hybrid's block checks it).
        Fast decoding calls it in place of ``forward``: a subclass that changes one changes both."""
        return control

    def vector_field(self, t: torch.Tensor, x: torch.Tensor, *args) -> torch.Tensor:
        """What the solver integrates: ``field`` with the two switches applied."""
        if self.modulation == "constant":
            t = torch.zeros_like(t)
        out = self.field(t, x, *args)
        if self.integration == "residual":  # x + f = x + dt * (f / dt), dt = 1 / n_steps
            out = out * float(self.ode.n_steps)
        return out


class TimeDependentField(nn.Module):
    """A vector field f(t, x) whose weights are functions of t: the families that declare
    ``time_dependent_weights`` build their field from this class, and the spectral analysis reads
    the weights through ``weights_at``."""

    def weights_at(self, t: torch.Tensor) -> dict[str, torch.Tensor | tuple | None]:
        """The field's weights at field time ``t`` (a 0-d tensor), as the forward pass forms them:
        ``w_qkv`` (3D, D) and ``b_qkv``, ``w_o`` and ``b_o`` of the attention, ``w_1``, ``b_1``,
        ``w_2``, ``b_2`` of the MLP (None without one), ``ln_1``, ``ln_2`` (scale, shift)."""
        raise NotImplementedError(f"{type(self).__name__} must say what its weights are at t")


class OneBlockLM(CausalLM):
    """A model whose whole body is one ``ODEBlock`` (``self.ode_block``): the embedded sequence
    is x(0), the final hidden state x(1). The continuous families, and the weight-tied loop."""

    ode_block: ODEBlock

    @property
    def field(self) -> nn.Module:
        return self.ode_block.field

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return self.ode_block(x)

    def decode_stages(self) -> list[nn.Module]:
        return [self.ode_block]


class ContinuousDepthLM(OneBlockLM):
    """A single time-dependent block f(t, x) integrated over t in [0, 1] (node, ti_mlp,
    ti_ssm): the embedded sequence is x(0), the final hidden state x(1).

    Subclasses build ``field`` (an nn.Module with ``forward(t, x)``) and call
    ``super().__init__(cfg, field)``.
    """

    def __init__(self, cfg: ModelConfig, field: nn.Module):
        super().__init__(cfg)
        self.ode_block = ODEBlock(field, cfg.ode, cfg.dropout, cfg.integration, cfg.modulation)
        # an Euler step adds dt * f, so n steps add about one block's worth in total; the
        # residual stack adds n blocks, which the nanoGPT output-projection scaling is for
        self.init_weights(n_residual_layers=1 if cfg.integration == "ode" else cfg.n_layers)


def continuous_block(model: nn.Module, purpose: str) -> ODEBlock:
    """The ``ODEBlock`` of a continuous-depth model (a continuous family: the whole body is one
    ODE block, x(0) the embedded sequence); a ``ValueError`` saying what needs one otherwise."""
    if not isinstance(model, ContinuousDepthLM):
        arch = getattr(getattr(model, "cfg", None), "arch", None)
        raise ValueError(f"{purpose} needs a continuous-depth model "
                         f"(arch {', '.join(map(repr, families.names(continuous=True)))}), "
                         f"got {type(model).__name__} (arch={arch!r})")
    return model.ode_block
