"""A table of bad inputs, each with the message it must get: configs built from Python and from
YAML / --set, odeint, decoding, data, stored files, the command line and a run that learned nothing.

Every case is a function that feeds one bad input to the library; ``CASES`` maps its id to the
function and a regular expression its error (or warning) must match. The test asserts that the
error is a clear one (``CLEAR``) whose message matches; ``bench/bad_inputs_tally.py`` runs the same
table against any checkout to count clear / partly / raw / silent outcomes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import math
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

import nodelm_lib as nl
from nodelm_lib.runs import store as run_store
from nodelm_lib.training import evaluation

NAN, INF = math.nan, math.inf


class CLIFailure(Exception):
    """``python -m nodelm_lib ...`` stopped with a non-zero status; the message is the last line
    of its stderr (the lines before are its log, or argparse's usage)."""

    def __init__(self, code: int, stderr: str):
        super().__init__((stderr.strip().splitlines() or [""])[-1])
        self.code, self.stderr = code, stderr


class Warned(Exception):
    """A call that returned, but warned (the message): a run flagged rather than refused."""


class DiskFull(Exception):
    """A write refused by a full disk with an error that says so and names the file, leaving no
    temporary file behind (``on_a_full_disk``)."""


# errors that say what is wrong: anything else (an IndexError from deep inside, an AssertionError,
# a TypeError from comparing a str with an int) is a raw error
CLEAR = (ValueError, FileNotFoundError, CLIFailure, Warned, DiskFull)


# --------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=None)
def workdir() -> Path:
    """A folder with a tiny model file and a stored record, made once per process."""
    root = Path(tempfile.mkdtemp(prefix="nodelm-bad-inputs-"))
    torch.manual_seed(0)
    nl.save_model(nl.build_model(small()), root / "model.pt", tokenizer="char", dataset="tinyshakespeare")
    tc = nl.TrainConfig(model=small(), seq_len=16)
    record = nl.RunRecord(config=nl.config.to_dict(tc), config_hash=tc.config_hash(), seed=0, status="completed")
    (root / "runs").mkdir()
    (root / "runs" / f"{tc.config_hash()}.json").write_text(record.to_json())
    return root


def fresh(name: str) -> Path:
    """A private copy of the work folder's file ``name`` (cases damage it)."""
    target = Path(tempfile.mkdtemp(prefix="nodelm-bad-input-")) / Path(name).name
    shutil.copy(workdir() / name, target)
    return target


def small(**kw) -> nl.ModelConfig:
    return nl.ModelConfig(**{**dict(vocab_size=256, d_model=16, n_heads=2, n_layers=2, max_seq_len=16), **kw})


@functools.lru_cache(maxsize=None)
def model() -> nl.models.CausalLM:
    torch.manual_seed(0)
    return nl.build_model(small()).eval()


def cli(*argv: str) -> str:
    """Run the command line in this process; its stdout, or ``CLIFailure`` with its stderr."""
    from nodelm_lib.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    except SystemExit as stop:
        code = stop.code
    if code:
        raise CLIFailure(code, err.getvalue())
    return out.getvalue()


def model_file(*argv: str) -> tuple[str, ...]:
    return ("--checkpoint", str(workdir() / "model.pt"), *argv)


def generate(**kw):
    args = dict(idx=torch.tensor([[1, 2, 3]]), max_new_tokens=2, temperature=0.0)
    args.update(kw)
    return nl.generate(model(), **args)


def odeint(x0=None, t=None, **kw):
    field = torch.nn.Linear(3, 3)
    return nl.odeint(lambda s, x: field(x), torch.ones(3) if x0 is None else x0,
                     torch.linspace(0, 1, 3) if t is None else t, **{"method": "rk4", **kw})


NET = torch.nn.Linear(3, 3)  # module-level: a lambda naming it does not capture it


def adjoint_of_a_global_module(sensitivity: str, method: str = "rk4"):
    """A field that reaches its parameters through a global: an adjoint must not drop their gradients."""
    x0 = torch.ones(2, 3, requires_grad=True)
    NET.zero_grad()
    y = nl.odeint(lambda s, x: torch.tanh(NET(x)), x0, torch.linspace(0, 1, 3), method=method, sensitivity=sensitivity)
    y[-1].sum().backward()
    return NET.weight.grad


def edited_record(change):
    path = fresh(next((workdir() / "runs").glob("*.json")).relative_to(workdir()))
    stored = json.loads(path.read_text())
    change(stored)
    stored.pop("digest", None)  # as a record written before records had one
    path.write_text(json.dumps(stored))
    return run_store.load_records(path.parent)


def renamed_record():
    path = fresh(next((workdir() / "runs").glob("*.json")).relative_to(workdir()))
    path.rename(path.with_name("0123456789abcdef.json"))
    return run_store.load_records(path.parent)


def cut_short(name: str, keep: float = 0.5) -> Path:
    path = fresh(name)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def warned(run):
    """``run()``, with its warnings raised as ``Warned``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    if caught:
        raise Warned(" | ".join(str(w.message) for w in caught))


def trained_at_lr_10():
    tc = nl.TrainConfig(model=small(), batch_size=4, seq_len=16, max_steps=6, lr=10.0, warmup_steps=1, eval_interval=6,
                        eval_batches=1, progress=False, device="cpu")
    record = nl.train(tc)
    if getattr(record, "warnings", None):  # the flag in the record (nl.train also warns)
        raise Warned(record.warnings[0])


def config(cls, **kw):
    return cls(**kw)


def on_a_full_disk(write, folder: Path, after_bytes: int = 0):
    """``write()`` while every file written in ``folder`` hits a full disk after ``after_bytes``
    bytes: ``DiskFull`` with its message where it fails with ENOSPC and leaves ``folder`` as it was
    (no temporary file); the error itself otherwise."""
    real_open = open

    class FullFile(io.FileIO):
        def write(self, data):
            if self.tell() + len(data) > after_bytes:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    def opener(file, mode="r", *args, **kwargs):
        if Path(file).parent == folder and any(m in mode for m in "wxa"):
            raw = FullFile(file, mode.replace("t", "").replace("b", "") or "r")
            return raw if "b" in mode else io.TextIOWrapper(raw, encoding=kwargs.get("encoding") or "utf-8")
        return real_open(file, mode, *args, **kwargs)

    before = sorted(p.name for p in folder.iterdir())
    with mock.patch("builtins.open", opener), mock.patch("io.open", opener), \
            mock.patch("shutil.disk_usage", return_value=shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)):
        try:
            write()
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            left = sorted(p.name for p in folder.iterdir())
            if left != before:
                raise AssertionError(f"a full disk left {sorted(set(left) - set(before))} behind") from err
            raise DiskFull(str(err)) from err


def empty_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="nodelm-full-disk-"))


def model_file_with(change) -> Path:
    """A copy of the work folder's model file with ``change(state)`` applied to what it holds."""
    path = fresh("model.pt")
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    return path


def non_utf8_record():
    path = fresh(next((workdir() / "runs").glob("*.json")).relative_to(workdir()))
    path.write_bytes(path.read_bytes().replace(b'"seed"', b'"s\xffeed"'))
    return run_store.load_records(path.parent)


def a_profile(text: str):
    """Profile ``p`` of a one-cell notebook ``nb`` (parameters ``x`` and ``y``) holding ``text``
    (``{root}`` in it is the folder of the notebook), run in this process as ``chunk`` runs one;
    its first cell would write a file if it ran."""
    from nodelm_lib.experiments import notebook_here, profiles

    root = Path(tempfile.mkdtemp(prefix="nodelm-profile-"))
    (root / "params" / "nb").mkdir(parents=True)
    (root / "params" / "nb" / "p.yaml").write_text(text.replace("{root}", str(root)))
    cell = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
            "source": f"open({str(root / 'ran')!r}, 'w').close()\nx = 1\ny = 2"}
    (root / "nb.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with mock.patch.object(profiles, "params_dir", return_value=root / "params"):
        try:
            notebook_here.run_notebook_here(root / "nb.ipynb", "p")
        finally:
            if (root / "ran").exists() or (root / "code_ran").exists():
                raise AssertionError("a cell or the injected code ran")


def store_of_profile(text: str):
    from nodelm_lib.experiments import profiles

    root = Path(tempfile.mkdtemp(prefix="nodelm-profile-"))
    (root / "params" / "nb").mkdir(parents=True)
    (root / "params" / "nb" / "p.yaml").write_text(text)
    with mock.patch.object(profiles, "params_dir", return_value=root / "params"):
        return profiles.notebook_store("nb", "p", root)


def a_file() -> str:
    path = Path(tempfile.mkdtemp(prefix="nodelm-a-file-")) / "not_a_folder"
    path.write_text("")
    return str(path)


def tiny_train(**kw) -> nl.TrainConfig:
    return nl.TrainConfig(**{**dict(model=small(), batch_size=2, seq_len=16, max_steps=1, eval_batches=1, progress=False,
                                    device="cpu"), **kw})


M, O, T = nl.ModelConfig, nl.ODEConfig, nl.TrainConfig
over = nl.apply_overrides

# --------------------------------------------------------------------------- the table: id -> (call, message)

CASES = {
    # ModelConfig from Python: types
    "model d_model='64'": (lambda: M(d_model="64"), r"model.d_model='64' is not valid: it must be an integer \(got str\)"),
    "model d_model=64.0": (lambda: M(d_model=64.0), r"model.d_model=64.0 is not valid: it must be an integer"),
    "model d_model=True": (lambda: M(d_model=True), r"model.d_model=True is not valid: it must be an integer"),
    "model n_heads='4'": (lambda: M(n_heads="4"), r"model.n_heads='4' is not valid: it must be an integer"),
    "model n_layers=2.5": (lambda: M(n_layers=2.5), r"model.n_layers=2.5 is not valid: it must be an integer"),
    "model max_seq_len='128'": (lambda: M(max_seq_len="128"), r"model.max_seq_len='128' is not valid"),
    "model vocab_size='256'": (lambda: M(vocab_size="256"), r"model.vocab_size='256' is not valid: it must be an integer or None"),
    "model vocab_size=256.5": (lambda: M(vocab_size=256.5), r"model.vocab_size=256.5 is not valid"),
    "model dropout='0.1'": (lambda: M(dropout="0.1"), r"model.dropout='0.1' is not valid: it must be a finite number"),
    "model dropout=nan": (lambda: M(dropout=NAN), r"model.dropout=nan is not valid"),
    "model mlp_ratio=nan": (lambda: M(mlp_ratio=NAN), r"model.mlp_ratio=nan is not valid: it must be a finite number"),
    "model mlp_ratio=inf": (lambda: M(mlp_ratio=INF), r"model.mlp_ratio=inf is not valid: it must be a finite number"),
    "model bias='no'": (lambda: M(bias="no"), r"model.bias='no' is not valid: it must be True or False \(got str\)"),
    "model bias=1": (lambda: M(bias=1), r"model.bias=1 is not valid: it must be True or False \(got int\)"),
    "model parallel='yes'": (lambda: M(parallel="yes"), r"model.parallel='yes' is not valid: it must be True or False"),
    "model ode='euler'": (lambda: M(ode="euler"), r"model.ode='euler' is not valid: it must be an ODEConfig"),
    "model ode=dict": (lambda: M(ode={"method": "rk4"}), r"model.ode=\{'method': 'rk4'\} is not valid: it must be an ODEConfig"),
    "model ode_start='1'": (lambda: M(arch="hybrid", ode_start="1"), r"model.ode_start='1' is not valid: it must be an integer"),
    "model control_dim=1.5": (lambda: M(control_dim=1.5), r"model.control_dim=1.5 is not valid: it must be an integer"),
    "model ode_scale_init=nan": (lambda: M(ode_scale_init=NAN), r"model.ode_scale_init=nan is not valid: it must be a finite"),
    "model ode_scale_init='0.1'": (lambda: M(ode_scale_init="0.1"), r"model.ode_scale_init='0.1' is not valid"),
    "model time_features='32'": (lambda: M(time_features="32"), r"model.time_features='32' is not valid: it must be an integer"),
    "model time_hidden=64.0": (lambda: M(time_hidden=64.0), r"model.time_hidden=64.0 is not valid"),
    "model hyper_dim=None": (lambda: M(hyper_dim=None), r"model.hyper_dim=None is not valid: it must be an integer"),
    "model ssm_state_size='16'": (lambda: M(ssm_state_size="16"), r"model.ssm_state_size='16' is not valid"),
    "model arch=None": (lambda: M(arch=None), r"model.arch=None is not valid: it must be a string"),
    "model modulation=1": (lambda: M(modulation=1), r"model.modulation=1 is not valid: it must be a string"),
    # ModelConfig from Python: ranges and choices
    "model arch='rnn'": (lambda: M(arch="rnn"), r"model.arch='rnn' is not valid; choose one of 'gpt', 'hybrid'"),
    "model d_model=0": (lambda: M(d_model=0), r"model.d_model=0 is not valid; it must be > 0"),
    "model d_model=-8": (lambda: M(d_model=-8), r"model.d_model=-8 is not valid; it must be > 0"),
    "model n_heads=0": (lambda: M(n_heads=0), r"model.n_heads=0 is not valid; it must be > 0"),
    "model n_heads=3": (lambda: M(n_heads=3), r"model.d_model=64 is not divisible by model.n_heads=3"),
    "model n_layers=0": (lambda: M(n_layers=0), r"model.n_layers=0 is not valid; it must be > 0"),
    "model max_seq_len=0": (lambda: M(max_seq_len=0), r"model.max_seq_len=0 is not valid; it must be > 0"),
    "model vocab_size=0": (lambda: M(vocab_size=0), r"model.vocab_size=0 is not valid; it must be > 0"),
    "model dropout=1.0": (lambda: M(dropout=1.0), r"model.dropout=1.0 is not valid; it must be in \[0, 1\)"),
    "model dropout=-0.1": (lambda: M(dropout=-0.1), r"model.dropout=-0.1 is not valid; it must be in \[0, 1\)"),
    "model mlp_ratio=0": (lambda: M(mlp_ratio=0), r"model.mlp_ratio=0 is not valid; it must be > 0"),
    "model time_features=3": (lambda: M(time_features=3), r"model.time_features=3 is not valid; it must be an even number"),
    "model time_hidden=0": (lambda: M(time_hidden=0), r"model.time_hidden=0 is not valid; it must be > 0"),
    "model control_dim=-1": (lambda: M(control_dim=-1), r"model.control_dim=-1 is not valid; it must be >= 0"),
    "model modulation='timed'": (lambda: M(modulation="timed"), r"model.modulation='timed' is not valid; choose one of"),
    "model integration='rk'": (lambda: M(integration="rk"), r"model.integration='rk' is not valid; choose one of"),
    "model hybrid span 3..2": (lambda: M(arch="hybrid", ode_start=3, ode_end=2), r"model.ode_start=3, model.ode_end=2 is not a valid span"),
    "model node n_layers != n_steps": (lambda: M(arch="node", n_layers=3), r"model.n_layers=3 but model.ode.n_steps=4"),
    "model residual with rk4": (lambda: M(arch="ti_mlp", integration="residual", ode=O(method="rk4")), r"needs model.ode.method='euler'"),
    "model parallel node": (lambda: M(arch="node", parallel=True), r"model.parallel applies to the discrete blocks"),
    "model modulation on gpt": (lambda: M(modulation="constant"), r"model.modulation='constant' applies to archs"),
    "model position='alibi'": (lambda: M(position="alibi"), r"model.position='alibi' is not valid; choose one of 'learned', 'rope'"),
    "model position=None": (lambda: M(position=None), r"model.position=None is not valid: it must be a string"),
    "model rope with odd head width": (lambda: M(position="rope", d_model=12, n_heads=4), r"model.position='rope' rotates pairs .* model.d_model / model.n_heads = 3 is odd"),
    "--set model.position=absolute": (lambda: over(T(), ["model.position=absolute"]), r"model.position='absolute' is not valid; choose one of 'learned', 'rope'"),
    # ODEConfig
    "ode method='rk5'": (lambda: O(method="rk5"), r"ode.method='rk5' is not valid; choose one of 'euler'"),
    "ode sensitivity='adjoint'": (lambda: O(sensitivity="adjoint"), r"ode.sensitivity='adjoint' is not valid; choose one of"),
    "ode n_steps=0": (lambda: O(n_steps=0), r"ode.n_steps=0 is not valid; it must be > 0"),
    "ode n_steps=2.5": (lambda: O(n_steps=2.5), r"ode.n_steps=2.5 is not valid: it must be an integer"),
    "ode n_steps='4'": (lambda: O(n_steps="4"), r"ode.n_steps='4' is not valid: it must be an integer"),
    "ode rtol=nan": (lambda: O(rtol=NAN), r"ode.rtol=nan is not valid: it must be a finite number"),
    "ode rtol=inf": (lambda: O(rtol=INF), r"ode.rtol=inf is not valid: it must be a finite number"),
    "ode rtol=0": (lambda: O(rtol=0), r"ode.rtol=0 is not valid; it must be > 0"),
    "ode rtol='1e-3'": (lambda: O(rtol="1e-3"), r"ode.rtol='1e-3' is not valid: it must be a finite number \(got str\)"),
    "ode atol=nan": (lambda: O(atol=NAN), r"ode.atol=nan is not valid: it must be a finite number"),
    "ode atol=-1": (lambda: O(atol=-1.0), r"ode.atol=-1.0 is not valid; it must be > 0"),
    "ode max_num_steps=0": (lambda: O(max_num_steps=0), r"ode.max_num_steps=0 is not valid; it must be > 0"),
    "ode max_num_steps=10.5": (lambda: O(max_num_steps=10.5), r"ode.max_num_steps=10.5 is not valid: it must be an integer"),
    # TrainConfig from Python
    "train lr=nan": (lambda: T(lr=NAN), r"lr=nan is not valid: it must be a finite number"),
    "train lr=inf": (lambda: T(lr=INF), r"lr=inf is not valid: it must be a finite number"),
    "train lr=0": (lambda: T(lr=0.0), r"lr=0.0 is not valid; it must be > 0"),
    "train lr='1e-3'": (lambda: T(lr="1e-3"), r"lr='1e-3' is not valid: it must be a finite number \(got str\)"),
    "train grad_clip=nan": (lambda: T(grad_clip=NAN), r"grad_clip=nan is not valid: it must be a finite number"),
    "train grad_clip=inf": (lambda: T(grad_clip=INF), r"grad_clip=inf is not valid: it must be a finite number"),
    "train grad_clip=-1": (lambda: T(grad_clip=-1.0), r"grad_clip=-1.0 is not valid; it must be >= 0"),
    "train weight_decay=nan": (lambda: T(weight_decay=NAN), r"weight_decay=nan is not valid: it must be a finite number"),
    "train weight_decay=-0.1": (lambda: T(weight_decay=-0.1), r"weight_decay=-0.1 is not valid; it must be >= 0"),
    "train beta1=1.0": (lambda: T(beta1=1.0), r"beta1=1.0 is not valid; it must be in \[0, 1\)"),
    "train beta1=-0.1": (lambda: T(beta1=-0.1), r"beta1=-0.1 is not valid; it must be in \[0, 1\)"),
    "train beta2=1.5": (lambda: T(beta2=1.5), r"beta2=1.5 is not valid; it must be in \[0, 1\)"),
    "train beta2=nan": (lambda: T(beta2=NAN), r"beta2=nan is not valid: it must be a finite number"),
    "train min_lr_ratio=2": (lambda: T(min_lr_ratio=2.0), r"min_lr_ratio=2.0 is not valid; it must be in \[0, 1\]"),
    "train min_lr_ratio=nan": (lambda: T(min_lr_ratio=NAN), r"min_lr_ratio=nan is not valid"),
    "train warmup_steps=-1": (lambda: T(warmup_steps=-1), r"warmup_steps=-1 is not valid; it must be >= 0"),
    "train warmup_steps=1.5": (lambda: T(warmup_steps=1.5), r"warmup_steps=1.5 is not valid: it must be an integer"),
    "train batch_size=0": (lambda: T(batch_size=0), r"batch_size=0 is not valid; it must be > 0"),
    "train batch_size='12'": (lambda: T(batch_size="12"), r"batch_size='12' is not valid: it must be an integer \(got str\)"),
    "train batch_size=12.0": (lambda: T(batch_size=12.0), r"batch_size=12.0 is not valid: it must be an integer"),
    "train seq_len=0": (lambda: T(seq_len=0), r"seq_len=0 is not valid; it must be > 0"),
    "train seq_len > max_seq_len": (lambda: T(seq_len=200), r"seq_len=200 exceeds model.max_seq_len=128"),
    "train max_steps=0": (lambda: T(max_steps=0), r"max_steps=0 is not valid; it must be > 0"),
    "train max_steps='2000'": (lambda: T(max_steps="2000"), r"max_steps='2000' is not valid: it must be an integer"),
    "train eval_interval=0": (lambda: T(eval_interval=0), r"eval_interval=0 is not valid; it must be > 0"),
    "train eval_batches=0": (lambda: T(eval_batches=0), r"eval_batches=0 is not valid; it must be > 0"),
    "train eval_seed='1234'": (lambda: T(eval_seed="1234"), r"eval_seed='1234' is not valid: it must be an integer"),
    "train seed=1.5": (lambda: T(seed=1.5), r"seed=1.5 is not valid: it must be an integer"),
    "train seed='0'": (lambda: T(seed="0"), r"seed='0' is not valid: it must be an integer"),
    "train dataset='wikitext'": (lambda: T(dataset="wikitext"), r"dataset='wikitext' is not valid; choose one of"),
    "train tokenizer='bpe'": (lambda: T(tokenizer="bpe"), r"tokenizer='bpe' is not valid; choose one of"),
    "train dtype='fp16'": (lambda: T(dtype="fp16"), r"dtype='fp16' is not valid; choose one of"),
    "train device='gpu'": (lambda: T(device="gpu"), r"device='gpu' is not valid; choose one of"),
    "train eval_on='whole'": (lambda: T(eval_on="whole"), r"eval_on='whole' is not valid; choose one of"),
    "train compile='yes'": (lambda: T(compile="yes"), r"compile='yes' is not valid: it must be True or False"),
    "train progress='no'": (lambda: T(progress="no"), r"progress='no' is not valid: it must be True or False"),
    "train resume without out_dir": (lambda: T(resume=True), r"resume/checkpoint_interval need out_dir"),
    "train checkpoint_interval=-1": (lambda: T(checkpoint_interval=-1), r"checkpoint_interval=-1 is not valid"),
    "train model=dict": (lambda: T(model={"arch": "gpt"}), r"model=\{'arch': 'gpt'\} is not valid: it must be a ModelConfig"),
    "train init_from=5": (lambda: T(init_from=5), r"init_from=5 is not valid: it must be a string or None"),
    "train out_dir=5": (lambda: T(out_dir=5), r"out_dir=5 is not valid: it must be a string or None"),
    # YAML and --set
    "--set lr=abc": (lambda: over(T(), ["lr=abc"]), r"lr='abc' is not a valid float"),
    "--set lr=.nan": (lambda: over(T(), ["lr=.nan"]), r"lr=nan is not valid: it must be a finite number"),
    "--set grad_clip=.inf": (lambda: over(T(), ["grad_clip=.inf"]), r"grad_clip=inf is not valid: it must be a finite"),
    "--set model.d_model=64.5": (lambda: over(T(), ["model.d_model=64.5"]), r"model.d_model=64.5 is not a valid int"),
    "--set model.bias=maybe": (lambda: over(T(), ["model.bias=maybe"]), r"model.bias='maybe' is not a valid bool"),
    "--set beta1=1": (lambda: over(T(), ["beta1=1"]), r"beta1=1.0 is not valid; it must be in \[0, 1\)"),
    "--set foo=1": (lambda: over(T(), ["foo=1"]), r"unknown key 'foo'"),
    "--set model=3": (lambda: over(T(), ["model=3"]), r"model must be a mapping of ModelConfig fields, got 3"),
    "--set lr (no value)": (lambda: over(T(), ["lr"]), r"override 'lr' must look like key=value"),
    "yaml: a list": (lambda: nl.load_yaml(_yaml("- a\n- b\n")), r"\.yaml must hold a mapping of TrainConfig fields"),
    "yaml: bad syntax": (lambda: nl.load_yaml(_yaml("lr: [1\n")), r"\.yaml is not valid YAML"),
    "yaml: lr: .nan": (lambda: nl.load_yaml(_yaml("lr: .nan\n")), r"\.yaml: lr=nan is not valid: it must be a finite number"),
    "yaml: missing file": (lambda: nl.load_yaml("/nonexistent/c.yaml"), r"No such file or directory: '/nonexistent/c.yaml'"),
    # odeint
    "odeint t not monotone": (lambda: odeint(t=torch.tensor([0.0, 1.0, 0.5]), method="euler"), r"t must be strictly increasing .*got t\[1\]=1.0, t\[2\]=0.5"),
    "odeint t repeated": (lambda: odeint(t=torch.tensor([0.0, 0.0, 1.0]), method="euler"), r"without repeated times; got t\[0\]=0.0, t\[1\]=0.0"),
    "odeint t NaN": (lambda: odeint(t=torch.tensor([0.0, NAN])), r"t must hold finite times, got \[0.0, nan\]"),
    "odeint t inf": (lambda: odeint(t=torch.tensor([0.0, INF])), r"t must hold finite times"),
    "odeint t NaN dopri5": (lambda: odeint(t=torch.tensor([0.0, NAN]), method="dopri5"), r"t must hold finite times"),
    "odeint x0 NaN": (lambda: odeint(x0=torch.tensor([NAN, 0.0, 0.0])), r"x0 holds 1 non-finite value\(s\) \(NaN or inf\) of 3"),
    "odeint x0 NaN dopri5": (lambda: odeint(x0=torch.tensor([NAN, 0.0, 0.0]), method="dopri5"), r"x0 holds 1 non-finite value"),
    "odeint x0 inf reversible": (lambda: odeint(x0=torch.tensor([INF, 0.0, 0.0]), method="reversible_heun", sensitivity="reversible"), r"x0 holds 1 non-finite"),
    "odeint x0 integer": (lambda: odeint(x0=torch.tensor([1, 2, 3])), r"x0 must be a floating-point tensor, got Tensor of dtype torch.int64"),
    "odeint t 2-D": (lambda: odeint(t=torch.zeros(2, 2)), r"t must be a 1-D tensor of at least two output times"),
    "odeint t one time": (lambda: odeint(t=torch.tensor([0.0])), r"t must be a 1-D tensor of at least two output times"),
    "odeint method='rk5'": (lambda: odeint(method="rk5"), r"method='rk5' is not valid; choose one of"),
    "odeint sensitivity='adjoint'": (lambda: odeint(sensitivity="adjoint"), r"sensitivity='adjoint' is not valid; choose one of"),
    "odeint rtol=nan": (lambda: odeint(method="dopri5", rtol=NAN), r"rtol=nan is not valid; it must be a finite number > 0"),
    "odeint atol=0": (lambda: odeint(method="dopri5", atol=0.0), r"atol=0.0 is not valid; it must be a finite number > 0"),
    "odeint max_num_steps=0": (lambda: odeint(method="dopri5", max_num_steps=0), r"max_num_steps=0 is not valid; it must be an integer >= 1"),
    "odeint steps_per_interval=0": (lambda: odeint(steps_per_interval=0), r"steps_per_interval must be a positive integer, got 0"),
    "odeint checkpoint on dopri5": (lambda: odeint(method="dopri5", sensitivity="checkpoint"), r"sensitivity='checkpoint' needs a fixed-step method"),
    "odeint reversible on rk4": (lambda: odeint(sensitivity="reversible"), r"sensitivity='reversible' needs method='reversible_heun'"),
    # the continuous adjoints and a field whose parameters they cannot find
    "backsolve, global module": (lambda: adjoint_of_a_global_module("backsolve"), r"sensitivity='backsolve' differentiates x0 and the field's parameters only.*2 more tensor\(s\).*params=list\(module.parameters\(\)\)"),
    "interpolating, global module": (lambda: adjoint_of_a_global_module("interpolating"), r"sensitivity='interpolating' differentiates x0 .*could not find"),
    "quadrature, global module": (lambda: adjoint_of_a_global_module("quadrature"), r"sensitivity='quadrature' differentiates x0 .*could not find"),
    "reversible, global module": (lambda: adjoint_of_a_global_module("reversible", "reversible_heun"), r"sensitivity='reversible' differentiates x0 .*could not find"),
    # decoding and the model's forward
    "generate negative id (cached)": (lambda: generate(idx=torch.tensor([[1, -1]])), r"token id -1 is outside the model's vocabulary: ids must be in \[0, 255\]"),
    "generate negative id (no cache)": (lambda: generate(idx=torch.tensor([[-3, 1]]), use_cache=False), r"token id -3 is outside the model's vocabulary"),
    "generate id 256 of 256": (lambda: generate(idx=torch.tensor([[1, 256]])), r"token id 256 is outside the model's vocabulary"),
    "generate float idx": (lambda: generate(idx=torch.tensor([[1.0, 2.0]])), r"idx must be a non-empty \(B, T\) int64 tensor, got shape \(1, 2\) torch.float32"),
    "generate 1-D idx": (lambda: generate(idx=torch.tensor([1, 2])), r"idx must be a non-empty \(B, T\) int64 tensor, got shape \(2,\)"),
    "generate temperature=nan": (lambda: generate(temperature=NAN), r"temperature=nan is not valid; it must be a finite number >= 0"),
    "generate temperature=inf": (lambda: generate(temperature=INF), r"temperature=inf is not valid; it must be a finite number >= 0"),
    "generate temperature=-1": (lambda: generate(temperature=-1.0), r"temperature=-1.0 is not valid"),
    "generate temperature='1'": (lambda: generate(temperature="1"), r"temperature='1' is not valid"),
    "generate top_k=0": (lambda: generate(temperature=1.0, top_k=0), r"top_k=0 is not valid; it must be an integer >= 1"),
    "generate top_k=2.5": (lambda: generate(temperature=1.0, top_k=2.5), r"top_k=2.5 is not valid; it must be an integer >= 1"),
    "generate top_p=0": (lambda: generate(temperature=1.0, top_p=0.0), r"top_p=0.0 is not valid; it must be in \(0, 1\]"),
    "generate top_p=nan": (lambda: generate(temperature=1.0, top_p=NAN), r"top_p=nan is not valid"),
    "generate max_new_tokens=-1": (lambda: generate(max_new_tokens=-1), r"max_new_tokens=-1 is not valid; it must be an integer >= 0"),
    "generate max_new_tokens=2.5": (lambda: generate(max_new_tokens=2.5), r"max_new_tokens=2.5 is not valid; it must be an integer >= 0"),
    "generate window=0": (lambda: generate(window=0), r"window=0 is not valid; it must be an integer >= 1"),
    "generate window past max_seq_len": (lambda: generate(window=17), r"window=17 exceeds max_seq_len=16: a model with model.position='learned'"),
    "forward id past the vocabulary": (lambda: model()(torch.tensor([[1, 300]])), r"token id 300 is outside the model's vocabulary: ids must be in \[0, 255\]"),
    "forward negative id": (lambda: model()(torch.tensor([[-1, 3]])), r"token id -1 is outside the model's vocabulary"),
    "forward 1-D idx": (lambda: model()(torch.tensor([1, 2])), r"idx must be a \(B, T\) tensor of integer token ids, got shape \(2,\)"),
    "forward float idx": (lambda: model()(torch.zeros(1, 2)), r"idx must be a \(B, T\) tensor of integer token ids, got shape \(1, 2\) torch.float32"),
    "forward too long": (lambda: model()(torch.zeros(1, 17, dtype=torch.long)), r"sequence length 17 exceeds max_seq_len=16"),
    # data
    "split_windows seq_len=0": (lambda: nl.data.split_windows(np.arange(100), 4, 0), r"seq_len=0 is not valid; it must be an integer >= 1"),
    "split_windows batch_size=0": (lambda: nl.data.split_windows(np.arange(100), 0, 8), r"batch_size=0 is not valid; it must be an integer >= 1"),
    "split_windows max_windows=0": (lambda: nl.data.split_windows(np.arange(100), 4, 8, max_windows=0), r"max_windows=0 is not valid; it must be an integer >= 1 \(or None"),
    "sample_batch seq_len=0": (lambda: nl.data.sample_batch(torch.arange(100), 4, 0, torch.Generator()), r"batch_size and seq_len must be >= 1, got 4, 0"),
    "sample_batch too short": (lambda: nl.data.sample_batch(torch.arange(5), 4, 8, torch.Generator()), r"split has 5 tokens, fewer than seq_len \+ 1 = 9"),
    "get_tokenizer('bpe')": (lambda: nl.data.get_tokenizer("bpe"), r"unknown tokenizer 'bpe'; valid choices: char, gpt2"),
    "load_tokens corpus='ptb'": (lambda: nl.data.load_tokens("ptb", "test"), r"unknown corpus 'ptb'; valid choices: wikitext2"),
    "evaluate_split seq_len > max": (lambda: evaluation.evaluate_split(model(), np.arange(100), 32), r"seq_len=32 exceeds the model's max_seq_len=16"),
    # stored files
    "record with an edited lr": (lambda: edited_record(lambda r: r["config"].update(lr=0.5)), r"its stored config hashes to [0-9a-f]{16}, but the record says config_hash"),
    "record cut short": (lambda: run_store.load_records(cut_short("runs/" + _record_name()).parent), r"is not readable JSON .*store quarantine"),
    "record under another name": (renamed_record, r"0123456789abcdef.json: the file is named for run 0123456789abcdef but holds the record of run"),
    "model file cut short": (lambda: nl.load_model(cut_short("model.pt")), r"model file .*model.pt cannot be read: it was cut short or is corrupt"),
    "model file empty": (lambda: nl.load_model(cut_short("model.pt", keep=0)), r"model file .*model.pt is empty"),
    "record passed as a model file": (lambda: nl.load_model(fresh("runs/" + _record_name())), r"is not a PyTorch file \(it starts with b'\{"),
    "model file missing": (lambda: nl.load_model("/nonexistent/model.pt"), r"no checkpoint at /nonexistent/model.pt"),
    # the command line
    "cli eval --batch-size 0": (lambda: cli("eval", *model_file("--batch-size", "0")), r"argument --batch-size: 0 is not valid; it must be >= 1"),
    "cli eval --max-windows 0": (lambda: cli("eval", *model_file("--max-windows", "0")), r"argument --max-windows: 0 is not valid; it must be >= 1"),
    "cli eval --seq-len 0": (lambda: cli("eval", *model_file("--seq-len", "0")), r"argument --seq-len: 0 is not valid; it must be >= 1"),
    "cli eval --seq-len 64 > 16": (lambda: cli("eval", *model_file("--seq-len", "64")), r"seq_len=64 exceeds the model's max_seq_len=16"),
    "cli eval --device cuda (none)": (lambda: cli("eval", *model_file("--device", "cuda")) if not torch.cuda.is_available() else _skip("has CUDA"), r"device='cuda' was asked for but CUDA is not available here"),
    "cli eval --device gpu": (lambda: cli("eval", *model_file("--device", "gpu")), r"device='gpu' is not a device; use 'auto', 'cpu'"),
    "cli generate --checkpoint empty": (lambda: cli("generate", "--checkpoint", str(cut_short("model.pt", keep=0)), "--prompt", "a"), r"^error: model file .*model.pt is empty"),
    "cli generate --checkpoint cut short": (lambda: cli("generate", "--checkpoint", str(cut_short("model.pt")), "--prompt", "a"), r"^error: model file .*cannot be read: it was cut short"),
    "cli generate --checkpoint record.json": (lambda: cli("generate", "--checkpoint", str(fresh("runs/" + _record_name())), "--prompt", "a"), r"^error: model file .* is not a PyTorch file"),
    "cli generate --checkpoint missing": (lambda: cli("generate", "--checkpoint", "/nonexistent/x.pt", "--prompt", "a"), r"^error: no checkpoint at /nonexistent/x.pt"),
    "cli generate --max-new-tokens -1": (lambda: cli("generate", *model_file("--prompt", "a", "--max-new-tokens", "-1")), r"argument --max-new-tokens: -1 is not valid; it must be >= 0"),
    "cli generate --temperature nan": (lambda: cli("generate", *model_file("--prompt", "a", "--temperature", "nan")), r"argument --temperature: nan is not valid; it must be a finite number >= 0"),
    "cli generate --top-p 2": (lambda: cli("generate", *model_file("--prompt", "a", "--top-p", "2")), r"argument --top-p: 2 is not valid; it must be a finite number in \(0, 1\]"),
    "cli generate --top-k 0": (lambda: cli("generate", *model_file("--prompt", "a", "--top-k", "0")), r"argument --top-k: 0 is not valid; it must be >= 1"),
    "cli generate --prompt ''": (lambda: cli("generate", *model_file("--prompt", "")), r"--prompt is empty after tokenisation"),
    "cli generate --tokenizer gpt2 (256 vocab)": (lambda: cli("generate", *model_file("--prompt", "a", "--tokenizer", "gpt2")), r"tokenizer 'gpt2' has 50257 tokens but the model's vocab_size is 256"),
    "cli train --set lr=.nan": (lambda: cli("train", "--set", "lr=.nan"), r"^error: lr=nan is not valid: it must be a finite number"),
    "cli train --set model.arch=rnn": (lambda: cli("train", "--set", "model.arch=rnn"), r"^error: model.arch='rnn' is not valid; choose one of"),
    "cli train --config missing.yaml": (lambda: cli("train", "--config", "/nonexistent/c.yaml"), r"^error: .*No such file or directory: '/nonexistent/c.yaml'"),
    "cli train --config bad yaml": (lambda: cli("train", "--config", str(_yaml("lr: [1\n"))), r"^error: .*\.yaml is not valid YAML"),
    "cli train resume=true without out_dir": (lambda: cli("train", "--set", "resume=true"), r"^error: resume/checkpoint_interval need out_dir"),
    # issue 65: values that reached torch raw, silent mistakes, half-clear errors, code in a profile, a full disk
    "model max_seq_len=2**62": (lambda: nl.build_model(M(vocab_size=256, max_seq_len=2**62)), r"model.max_seq_len=4611686018427387904 is not valid; it must be at most 2147483647"),
    "model vocab_size=2**40": (lambda: M(vocab_size=2**40), r"model.vocab_size=1099511627776 is not valid; it must be at most 2147483647"),
    "train seed=2**64": (lambda: nl.train(tiny_train(seed=2**64)), r"seed=18446744073709551616 is not valid; it must be at most 18446744073709551615"),
    "train seed=-1": (lambda: T(seed=-1), r"seed=-1 is not valid; it must be >= 0"),
    "train eval_seed=2**64": (lambda: T(eval_seed=2**64), r"eval_seed=18446744073709551616 is not valid; it must be at most"),
    "odeint field of the wrong shape": (lambda: nl.odeint(lambda s, x: torch.zeros(5), torch.ones(3), torch.linspace(0, 1, 3)), r"the field returned a tensor of shape \(5,\) at t=0; dx/dt must have x0's shape \(3,\)"),
    "odeint field of the wrong shape (dopri5)": (lambda: nl.odeint(lambda s, x: torch.zeros(2, 3), torch.ones(3), torch.linspace(0, 1, 3), method="dopri5"), r"the field returned a tensor of shape \(2, 3\)"),
    "odeint field returns None": (lambda: nl.odeint(lambda s, x: None, torch.ones(3), torch.linspace(0, 1, 3)), r"the field returned NoneType at t=0; it must return dx/dt, a tensor of x0's shape \(3,\)"),
    "odeint field returns None (backsolve)": (lambda: nl.odeint(lambda s, x: None, torch.ones(3), torch.linspace(0, 1, 3), sensitivity="backsolve"), r"the field returned NoneType"),
    "odeint backsolve params=[3]": (lambda: odeint(sensitivity="backsolve", params=[3]), r"params\[0\]=3 is not valid: params must be tensors"),
    "odeint params=3": (lambda: odeint(params=3), r"params must be a list of tensors .*got int"),
    "build_model(dict)": (lambda: nl.build_model({"arch": "gpt"}), r"build_model takes a ModelConfig .*got dict: build one with nl.config.from_dict"),
    "build_model(None)": (lambda: nl.build_model(None), r"build_model takes a ModelConfig .*got NoneType"),
    "record with non-UTF-8 bytes": (non_utf8_record, r"[0-9a-f]{16}.json is not UTF-8 text \(byte b'\\xff' at offset \d+\).*store quarantine"),
    "model mlp_ratio=0.01": (lambda: M(mlp_ratio=0.01), r"model.mlp_ratio=0.01 is not valid: with model.d_model=64 the MLP's hidden width mlp_ratio \* d_model = 0.64 is below one unit"),
    "yaml: a key given twice": (lambda: nl.load_yaml(_yaml("lr: 0.1\nlr: 0.2\n")), r"c.yaml: sets \['lr'\] twice"),
    "yaml: a model key given twice": (lambda: nl.load_yaml(_yaml("model:\n  d_model: 32\n  d_model: 64\n")), r"sets \['d_model'\] twice"),
    "model file with NaN weights": (lambda: warned(lambda: nl.load_model(model_file_with(lambda s: s["model"]["ln_f.weight"].fill_(NAN)))), r"model file .*model.pt holds 16 non-finite weight\(s\) \(NaN or inf\) in 1 tensor\(s\): ln_f.weight \(16\)"),
    "profile store_profile outside the store": (lambda: store_of_profile("store_profile: ../../../../tmp/x\n"), r"store_profile='../../../../tmp/x' is not valid; it names the run store this profile shares"),
    "profile key holding code": (lambda: a_profile('"x\\nopen(\'{root}/code_ran\', \'w\').close()\\ny": 1\n'), r"p.yaml: parameter name .x\\nopen\(.*is not valid; a parameter is a Python identifier"),
    "profile key not a parameter": (lambda: a_profile("z: 1\n"), r"nb.ipynb \[p\] sets 'z', which the notebook's parameters cell does not define; its parameters: x, y"),
    "model unknown keyword": (lambda: M(d_modle=32), r"ModelConfig has no field 'd_modle'; valid keys: arch, vocab_size, d_model"),
    "train unknown keyword": (lambda: T(lrate=0.1), r"TrainConfig has no field 'lrate'; valid keys: model, dataset"),
    "ode unknown keyword (replace)": (lambda: __import__("dataclasses").replace(O(), steps=3), r"ODEConfig has no field 'steps'; valid keys: method, n_steps"),
    "train out_dir is a file": (lambda: nl.train(tiny_train(out_dir=a_file())), r"out_dir='.*not_a_folder' is not valid: it is a file; it must be a folder"),
    "store.run store is a file": (lambda: run_store.run(tiny_train(), store=a_file()), r"store='.*not_a_folder' is not valid: it is a file; it must be a folder"),
    "yaml: a folder": (lambda: nl.load_yaml(tempfile.mkdtemp()), r"is a folder; a config is a YAML file of TrainConfig fields"),
    "cli train --config a folder": (lambda: cli("train", "--config", tempfile.mkdtemp()), r"^error: .* is a folder; a config is a YAML file"),
    "forward targets of another batch": (lambda: model()(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long)), r"targets must have idx's shape \(2, 4\) .*got \(3, 4\)"),
    "model file whose config was edited": (lambda: nl.load_model(model_file_with(lambda s: s["model_config"].update(d_model=32))), r"the weights in .*model.pt do not fit the model config stored with them \(model.arch='gpt', d_model=32, n_layers=2\): the config was edited.*size mismatch"),
    "claim on a full disk": (lambda: (lambda store: on_a_full_disk(lambda: __import__("nodelm_lib.runs.claims", fromlist=["x"]).try_claim(store, "abc"), store))(empty_folder()), r"No space left on the disk of the run store .*: the claim abc.claim could not be written"),
    "checkpoint write on a full disk": (lambda: (lambda folder: on_a_full_disk(lambda: nl.save_model(model(), folder / "model.pt"), folder, after_bytes=4096))(empty_folder()), r"No space left on the disk of .* while writing model.pt \(.*\); nothing was replaced"),
    # a run that learned nothing
    "train lr=10 (loss above uniform)": (trained_at_lr_10, r"final validation loss [0-9.]+ is above a uniform guess over the 256 tokens \(ln 256 = 5.5452\)"),
}


def _record_name() -> str:
    return next((workdir() / "runs").glob("*.json")).name


def _yaml(text: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="nodelm-yaml-")) / "c.yaml"
    path.write_text(text)
    return path


def _skip(why: str):
    pytest.skip(why)


def outcome(run) -> BaseException | None:
    """What ``run`` raised (a CLI failure carries its stderr, one line or a traceback), or None."""
    try:
        run()
    except pytest.skip.Exception:
        raise
    except BaseException as err:  # noqa: B902  (SystemExit included: a case must not end the process)
        return err
    return None


# every id of the issue's list, so that the table keeps them
ISSUE_65_CASES = ["model max_seq_len=2**62", "train seed=2**64", "odeint field of the wrong shape", "odeint field returns None",
                  "odeint backsolve params=[3]", "build_model(dict)", "build_model(None)", "record with non-UTF-8 bytes",
                  "model mlp_ratio=0.01", "yaml: a key given twice", "model file with NaN weights",
                  "profile store_profile outside the store", "profile key holding code", "model unknown keyword",
                  "train unknown keyword", "train out_dir is a file", "store.run store is a file", "yaml: a folder",
                  "cli train --config a folder", "forward targets of another batch", "model file whose config was edited",
                  "claim on a full disk", "checkpoint write on a full disk"]
ISSUE_CASES = ["model d_model='64'", "cli eval --batch-size 0", "cli eval --max-windows 0", "cli generate --checkpoint empty",
               "cli generate --checkpoint record.json", "cli eval --device cuda (none)", "train grad_clip=nan", "model bias='no'",
               "ode rtol=nan", "generate negative id (cached)", "odeint t not monotone", "odeint t repeated", "odeint t NaN",
               "odeint x0 NaN", "odeint x0 NaN dopri5", "cli eval --seq-len 0", "train lr=10 (loss above uniform)",
               "backsolve, global module", "interpolating, global module", "quadrature, global module",
               "reversible, global module"]


def test_the_table_holds_at_least_100_cases_and_the_issues_list():
    assert len(CASES) >= 100 and not (set(ISSUE_CASES) | set(ISSUE_65_CASES)) - set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_gets_a_clear_message(case):
    run, message = CASES[case]
    err = outcome(run)
    assert isinstance(err, CLEAR), f"{type(err).__name__}: {err}"
    assert re.search(message, str(err)), str(err)
    if isinstance(err, CLIFailure):  # a one-line error, no traceback, the status of bad input
        assert "Traceback" not in err.stderr and "error:" in str(err) and err.code == 2, err.stderr


def test_an_error_on_the_command_line_is_one_line_and_debug_shows_the_traceback(monkeypatch):
    from nodelm_lib import cli as cli_module

    def broken(args):
        raise RuntimeError("something deep\nwent wrong")

    monkeypatch.setattr(cli_module, "_cpu", broken)
    with pytest.raises(CLIFailure) as failure:
        cli("cpu")
    assert failure.value.code == 1
    assert failure.value.stderr == "error: RuntimeError: something deep went wrong (run with --debug for the traceback)\n"
    with pytest.raises(RuntimeError, match="something deep"):
        cli("cpu", "--debug")
