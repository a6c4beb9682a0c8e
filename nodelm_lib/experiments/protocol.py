"""Arms and the comparison protocol: notebook 02's base config and arms from its parameters
(``base_config``, ``comparison_setup``), the arms comparing architectures (``architecture_arms``,
with the ``CONTROLS`` and ``ARCH_PRESETS``), each arm's configs per seed at its selected learning
rate (``arm_configs``, ``sweep_configs``, ``selected_lrs``) and the check that a sweep's arms
differ in nothing else (``check_protocol``).

**The comparison protocol** (``check_protocol``, enforced by ``sweeps.sweep``): the arms of a sweep
may differ in their model only, and in their learning rate only where a recorded selection
(``lr_selection.select_lr``: each arm's best rate of a small grid, on validation, on a seed that is
not reported) chose it. Optimiser, schedule, weight decay, batch size, sequence
length, step budget (hence tokens), evaluation batches and data are shared, and every arm runs
the same seeds. The seed fixes the training batch order independently of the model
(``training/loop.py``), so arm A and arm B of seed s see the same batches in the same order and are
scored on the same validation and test batches: differences between arms are paired by seed.
Validation picks nothing: every run trains for the fixed step budget, and its test loss is
computed once, at the end.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from nodelm_lib.config import (NON_SEMANTIC_KEYS, TONG_HYPERNETWORK, ModelConfig, ODEConfig, TrainConfig, for_arch,
                               to_dict, with_values)
from nodelm_lib.data import get_tokenizer

# the TrainConfig fields arms may not change: everything but the model and the seed (and the
# learning rate, which check_protocol allows to differ only through a recorded selection), besides
# the fields that do not change what a run computes (the config hash leaves them out too)
PROTOCOL_EXEMPT = NON_SEMANTIC_KEYS | {"model", "seed", "device", "lr"}


# Control arms (``architecture_arms(controls=...)``): each isolates one difference between gpt
# and the continuous-depth models.
#   gpt_parallel: gpt with the parallel block x + Attn(LN_1 x) + MLP(LN_2 x) of node / ti_*
#   ssm:          a discrete transformer with ti_ssm's selective SSM in the MLP's place, in the
#                 same parallel form and without time dependence
CONTROLS = {
    "gpt_parallel": lambda model: dataclasses.replace(for_arch(model, "gpt"), parallel=True),
    "ssm": lambda model: dataclasses.replace(for_arch(model, "ssm"), parallel=True),
}
# Named presets of arch-specific options (``architecture_arms(presets=...)``)
ARCH_PRESETS = {"tong": TONG_HYPERNETWORK}


def architecture_arms(model: ModelConfig, archs: Iterable[str], match_to: str | None = None,
                      match_by: str = "d_model", controls: Iterable[str] = (),
                      presets: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Arms comparing architectures at one shape: ``{arch: {"model": for_arch(model, arch)}}``.

    With ``match_to`` (an arch), a ``gpt_matched`` arm is added: a ``gpt`` whose non-embedding
    parameter count is the closest to that arch's (``match_params``, by ``match_by``), so
    that "fewer parameters" and "better loss" can be told apart. ``controls`` adds arms of
    ``CONTROLS`` by name. ``presets`` maps an arch to a preset of ``ARCH_PRESETS`` applied to
    that arch's arm (``{"node": "tong"}``: Tong et al.'s hypernetwork sizes).
    """
    from nodelm_lib.models import count_params, match_params

    presets = dict(presets or {})
    for arch, name in presets.items():
        if name not in ARCH_PRESETS:
            raise ValueError(f"preset {name!r} (for {arch!r}) is not valid; choose one of {', '.join(map(repr, ARCH_PRESETS))}")

    def arm_model(arch: str) -> ModelConfig:
        cfg = for_arch(model, arch)
        return dataclasses.replace(cfg, **ARCH_PRESETS[presets[arch]]) if arch in presets else cfg

    archs = list(archs)
    arms = {arch: {"model": arm_model(arch)} for arch in archs}
    if match_to is not None:
        target = count_params(arm_model(match_to))["non_embedding"]
        arms["gpt_matched"] = {"model": match_params(for_arch(model, "gpt"), target, by=match_by)}
    for name in controls:
        if name not in CONTROLS:
            raise ValueError(f"control {name!r} is not valid; choose one of {', '.join(map(repr, CONTROLS))}")
        arms[name] = {"model": CONTROLS[name](model)}
    return arms


def base_config(*, n_heads: int, n_layers: int, max_seq_len: int, ssm_state_size: int, ode_method: str,
                dataset: str, tokenizer: str, batch_size: int, seq_len: int, max_steps: int, warmup_steps: int,
                min_lr_ratio: float, beta2: float, eval_interval: int, eval_batches: int, eval_on: str,
                device: str = "auto", dtype: str = "float32", compile_model: bool = False,
                d_model: int = 128) -> TrainConfig:
    """Notebook 02's base config from 02's parameters: every arm's run is this config with the
    arm's model, a seed and the arm's selected rate (``lr`` here is a placeholder). Notebooks 03,
    04 and 07 build 02's runs through it too, so at 02's shape and rate their config hashes are 02's.
    The ODE of ``node`` / ``ti_*`` takes ``n_layers`` solver steps: as many as ``gpt`` has blocks."""
    model = ModelConfig(vocab_size=get_tokenizer(tokenizer).vocab_size, d_model=d_model, n_heads=n_heads,
                        n_layers=n_layers, max_seq_len=max_seq_len, ssm_state_size=ssm_state_size,
                        ode=ODEConfig(method=ode_method, n_steps=n_layers))
    return TrainConfig(model=model, dataset=dataset, tokenizer=tokenizer, batch_size=batch_size, seq_len=seq_len,
                       max_steps=max_steps, lr=1e-3, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                       beta2=beta2, eval_interval=eval_interval, eval_batches=eval_batches, eval_on=eval_on,
                       device=device, dtype=dtype, compile=compile_model, progress=False)


# notebook 02's parameters that make its base config (``base_config``'s keywords; the optional
# ones keep their defaults where a profile leaves them out) and its arms (``architecture_arms``)
BASE_PARAMETERS = ("n_heads", "n_layers", "max_seq_len", "ssm_state_size", "ode_method", "dataset", "tokenizer",
                   "batch_size", "seq_len", "max_steps", "warmup_steps", "min_lr_ratio", "beta2", "eval_interval",
                   "eval_batches", "eval_on")
OPTIONAL_BASE_PARAMETERS = ("d_model", "device", "dtype", "compile_model")
ARM_PARAMETERS = ("archs", "match_to", "controls", "presets")


def base_from_params(params: Mapping[str, Any]) -> TrainConfig:
    """``base_config`` from a mapping of notebook 02's parameters (a profile's values; 04's and 07's
    profiles repeat the ones they share with 02), ignoring the keys it does not take."""
    _require(params, BASE_PARAMETERS)
    return base_config(**{k: params[k] for k in BASE_PARAMETERS + OPTIONAL_BASE_PARAMETERS if k in params})


def comparison_setup(params: Mapping[str, Any]) -> tuple[TrainConfig, dict[str, dict[str, Any]]]:
    """Notebook 02's base config and arms from a mapping of its parameters (a profile's values,
    ``profiles.load_profile("02_seed_comparison", profile)``), built as the notebook builds them:
    what a benchmark or a script needs to train or time 02's runs without copying its third cell."""
    _require(params, BASE_PARAMETERS + ARM_PARAMETERS)
    base = base_from_params(params)
    arms = architecture_arms(base.model, params["archs"], match_to=params["match_to"], controls=params["controls"],
                             presets=params["presets"])
    return base, arms


def _require(params: Mapping[str, Any], names: Iterable[str]) -> None:
    missing = [k for k in names if k not in params]
    if missing:
        raise ValueError(f"notebook 02's parameters lack {', '.join(map(repr, missing))}: give a profile's values "
                         "(profiles.load_profile('02_seed_comparison', <profile>))")


def arm_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int]) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) for every arm and seed: ``arms`` maps a name to dotted-key overrides
    of ``base`` (``{"node": {"model.arch": "node"}}``, or ``{"wide": {"model": ModelConfig(...)}}``)."""
    seeds = list(seeds)
    if not arms:
        raise ValueError("arms is empty: give at least one {name: overrides}")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    return [(name, seed, with_values(base, {**overrides, "seed": seed})) for name, overrides in arms.items()
            for seed in seeds]


def check_protocol(configs: list[tuple[str, int, TrainConfig]], lr_selection: Mapping[str, float] | None = None) -> None:
    """Raise unless every arm shares the training protocol and the seeds (module docstring).

    Learning rates may differ between arms only as ``lr_selection`` (arm -> selected rate,
    from ``lr_selection.select_lr``) says: with it every arm must run at its selected rate,
    without it every arm at the same rate.
    """
    reference_name, _, reference = configs[0]
    for name, _, tc in configs:
        if lr_selection is not None:
            if name not in lr_selection:
                raise ValueError(f"arm {name!r} has no recorded learning-rate selection; the selection covers "
                                 f"{', '.join(map(repr, lr_selection))}: run select_lr over every arm")
            if not math.isclose(tc.lr, lr_selection[name], rel_tol=1e-12):
                raise ValueError(f"arm {name!r} runs at lr={tc.lr!r} but its recorded selection chose "
                                 f"lr={lr_selection[name]!r}")
        elif tc.lr != reference.lr:
            raise ValueError(f"arm {name!r} changes the learning rate (lr={tc.lr!r}, arm {reference_name!r} "
                             f"lr={reference.lr!r}) without a recorded selection; choose per-arm rates with "
                             "select_lr and pass its table to sweep(lr_selection=...)")
    shared = {k: v for k, v in to_dict(reference).items() if k not in PROTOCOL_EXEMPT}
    for name, _, tc in configs[1:]:
        other = {k: v for k, v in to_dict(tc).items() if k not in PROTOCOL_EXEMPT}
        differ = sorted(k for k in shared if shared[k] != other[k])
        if differ:
            raise ValueError(f"arm {name!r} changes the training protocol ({', '.join(differ)}) relative to arm "
                             f"{reference_name!r}; arms of a comparison may differ only in their model")
    seeds_of: dict[str, set] = {}
    for name, seed, _ in configs:
        seeds_of.setdefault(name, set()).add(seed)
    first = next(iter(seeds_of.values()))
    for name, seeds in seeds_of.items():
        if seeds != first:
            raise ValueError(f"arm {name!r} runs seeds {sorted(seeds)}, others {sorted(first)}: pairing needs the same seeds")


def sweep_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection=None
                  ) -> list[tuple[str, int, TrainConfig]]:
    """(arm, seed, config) of every run ``sweeps.sweep`` trains with these arguments."""
    return selected_arm_configs(base, arms, seeds, lr_selection)[0]


def selected_arm_configs(base: TrainConfig, arms: dict[str, dict[str, Any]], seeds: Iterable[int], lr_selection
                          ) -> tuple[list[tuple[str, int, TrainConfig]], dict[str, float] | None]:
    """``arm_configs`` with each arm at its selected learning rate (``base.lr`` where the
    selection has none, which ``check_protocol`` then refuses), and the selection as a mapping;
    without a selection, the arms as given and None. ``sweep_configs`` without the selection;
    ``sweeps.sweep`` checks the two together."""
    if lr_selection is None:
        return arm_configs(base, arms, seeds), None
    selected = selected_lrs(lr_selection)
    arms = {name: {**overrides, "lr": selected.get(name, base.lr)} for name, overrides in arms.items()}
    return arm_configs(base, arms, seeds), selected


def selected_lrs(selection) -> dict[str, float]:
    """arm -> selected learning rate, from ``lr_selection.select_lr``'s table, the path of its CSV
    file (a notebook's ``<stem>_lr_selection.csv``), or a mapping arm -> rate (returned as is)."""
    if isinstance(selection, Mapping):
        return {str(k): float(v) for k, v in selection.items()}
    if isinstance(selection, (str, Path)):
        import pandas as pd

        path = Path(selection)
        if not path.is_file():
            raise FileNotFoundError(f"no learning-rate selection at {path}: run the notebook that selects the rates "
                                    "(02) with this profile first, or give the rates as a mapping arm -> rate")
        selection = pd.read_csv(path)
    missing = {"arm", "lr", "selected"} - set(selection.columns)
    if missing:
        raise ValueError(f"the learning-rate selection lacks column(s) {sorted(missing)}; pass select_lr's table")
    chosen = selection[selection["selected"].astype(bool)]
    counts = chosen["arm"].value_counts()
    if (counts > 1).any():
        raise ValueError(f"the selection chose several rates for arm(s) {sorted(counts[counts > 1].index)}")
    return {str(arm): float(lr) for arm, lr in zip(chosen["arm"], chosen["lr"])}
