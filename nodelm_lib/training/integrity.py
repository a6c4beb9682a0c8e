"""Stored files checked when they are read: run records, stored evaluations and checkpoints.

A run record is trusted only if it is what its name says. Three things must agree: the file's
stem (a store names each record by its config hash), the record's ``config_hash``, and the hash
of the config stored in it, recomputed as ``TrainConfig.config_hash`` computes it (fields added
after the record was written take their defaults, which ``config.HASHED_ONLY_IF_CHANGED`` keeps
out of the hash). A record also carries a ``digest`` of its contents (records written before the
digest existed have none), so a hand-edited loss is caught too; and a completed record's final
losses must be the ones its own curves end on.

A file that fails raises ``RecordError`` naming the file, what disagrees and what to do:
``python -m nodelm_lib store quarantine <store>`` moves every bad file of a store aside (into
``<store>/quarantine/``), after which the runs they stood for train again.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Iterable

from nodelm_lib.config import TrainConfig, from_dict

# a store names a record by its 16-hex-digit config hash; other names (a notebook's named
# records, a run's out_dir/record.json) are checked for everything but the name
HASH_NAME = re.compile(r"[0-9a-f]{16}")
DIGEST_KEY = "digest"


class RecordError(ValueError):
    """A stored record or evaluations file that is unreadable or not what its name says."""


class CheckpointError(ValueError):
    """A checkpoint or model file that cannot be read (cut short, corrupt, or not one)."""


def what_to_do(path: str | Path | None) -> str:
    """The way out, for an error message about the stored file ``path`` (None: a record given
    as text)."""
    if path is None:
        return "write the record again from its run"
    folder = Path(path).parent
    if folder.name == "evaluations":
        folder = folder.parent
    return (f"move it aside with `python -m nodelm_lib store quarantine {folder}` (or delete it); "
            "the run it stood for then trains again")


def digest(data: dict) -> str:
    """sha256 over a record's stored fields (``digest`` itself left out), in a canonical JSON
    form: the same for the dict written and the dict read back from that JSON."""
    # the round trip turns what JSON cannot tell apart into one form (tuples, int keys)
    return parsed_digest(json.loads(json.dumps(data)))


def parsed_digest(data: dict) -> str:
    """``digest`` of a dict parsed from JSON text. Such a dict is already in the form the round
    trip of ``digest`` gives, and reading a store skips that trip: it is most of the time a
    record takes to read."""
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def read_record_text(path: Path) -> str:
    """The text of the stored file ``path``; a ``RecordError`` naming it (and what to do) where its
    bytes are not UTF-8, as every writer here writes: a damaged file, or not a record at all."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(f"{path} is not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at offset "
                          f"{err.start}): it was damaged, or is not a record; {what_to_do(path)}") from None


def parse_record(text: str, path: Path | None, fields: Iterable[str], required: Iterable[str]) -> dict:
    """The fields of a record from its JSON ``text``, read from ``path`` (None: given as text),
    its digest checked where it has one. ``fields``: a record's stored fields; ``required``:
    those without a default."""
    where = str(path) if path is not None else "the record text"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"{where} is not readable JSON ({err}): it was cut short or edited; "
                          f"{what_to_do(path)}") from None
    if not isinstance(data, dict):
        raise RecordError(f"{where} holds a JSON {type(data).__name__}, not a run record; {what_to_do(path)}")
    stored = data.pop(DIGEST_KEY, None)
    unknown = sorted(set(data) - set(fields))
    missing = sorted(set(required) - set(data))
    if unknown or missing:
        what = "; ".join(s for s in (f"unknown fields {unknown}" if unknown else "",
                                     f"missing fields {missing}" if missing else "") if s)
        raise RecordError(f"{where} is not a run record ({what}); {what_to_do(path)}")
    if stored is not None and stored != parsed_digest(data):
        raise RecordError(f"{where} was changed after it was written: its contents no longer match its digest "
                          f"(a hand-edited loss, config or metric?); {what_to_do(path)}")
    return data


def _stored_config(record, path: Path) -> TrainConfig:
    try:
        return from_dict(TrainConfig, record.config)
    except (ValueError, TypeError) as err:
        raise RecordError(f"{path}: its stored config is not a valid TrainConfig ({err}); {what_to_do(path)}") from None


def verify_record(record, path: str | Path) -> None:
    """Raise ``RecordError`` unless ``record``, read from ``path``, is what its name says: a
    file named like a config hash holds that hash's record, the record's ``config_hash`` is the
    hash of its stored config, its seed is the config's, and a completed record's final train
    and validation losses are where its own curves end (module docstring)."""
    path = Path(path)
    tc = _stored_config(record, path)
    recomputed = tc.config_hash()
    if recomputed != record.config_hash:
        raise RecordError(
            f"{path}: its stored config hashes to {recomputed}, but the record says config_hash "
            f"{record.config_hash}: the config was edited after the run (lr={tc.lr}, seed={tc.seed}, "
            f"arch={tc.model.arch!r} now) or the record was written by other code; {what_to_do(path)}")
    if HASH_NAME.fullmatch(path.stem) and path.stem != record.config_hash:
        raise RecordError(
            f"{path}: the file is named for run {path.stem} but holds the record of run {record.config_hash} "
            f"({tc.model.arch} seed {tc.seed}): a record copied or renamed under another run's name would stand "
            f"in for that run (and show one seed twice in a table); {what_to_do(path)}")
    if record.seed != tc.seed:
        raise RecordError(f"{path}: the record says seed {record.seed} but its config says seed {tc.seed}; "
                          f"{what_to_do(path)}")
    if record.status == "completed":
        _check_final_losses(record, tc, path)


def _check_final_losses(record, tc: TrainConfig, path: Path) -> None:
    """A completed record's final losses must be where its own curves end (``RunRecord.curve_ends``)."""
    for name, value, expected in record.curve_ends(tc.eval_on):
        same = value == expected or (isinstance(value, float) and math.isnan(value) and math.isnan(expected))
        if not same:
            raise RecordError(f"{path}: its {name} is {value!r}, but its own curve ends at {expected!r}: the record "
                              f"was edited after the run; {what_to_do(path)}")


def read_evaluations_file(path: str | Path) -> dict:
    """A stored evaluations file (``store.write_evaluations``), checked: readable JSON naming
    the run of its file name."""
    path = Path(path)
    try:
        data = json.loads(read_record_text(path))
    except json.JSONDecodeError as err:
        raise RecordError(f"{path} is not readable JSON ({err}): it was cut short or edited; "
                          f"{what_to_do(path)}") from None
    if not isinstance(data, dict) or not {"config_hash", "final_val_loss", "evaluations"} <= set(data):
        raise RecordError(f"{path} is not a stored evaluations file (expected the keys config_hash, "
                          f"final_val_loss, evaluations); {what_to_do(path)}")
    if data["config_hash"] != path.stem:
        raise RecordError(f"{path}: the file is named for run {path.stem} but holds evaluations of run "
                          f"{data['config_hash']}; {what_to_do(path)}")
    return data
