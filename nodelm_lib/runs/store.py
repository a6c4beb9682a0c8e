"""The run store: one JSON record per run, named by its config hash, and ``nl.run(tc)``.

A store is a folder of run records (``results/runs/<profile>/<hash>.json``). The hash covers every
field that changes the numbers a run produces (seed included), so

- a run whose completed record exists is read back, never rerun;
- an interrupted run (killed process, Ctrl-C, a crash) resumes from its last checkpoint under
  ``checkpoints/runs/<hash>/`` to the same numbers an uninterrupted run gives;
- records are written atomically (temp file + rename): a kill never leaves half a record.

A run that stops with a non-finite loss is a result too (status ``"failed"``) and is stored.

Several workers may share one store (two notebooks, a sweep on a cluster: ``launch.py``): a
worker claims a hash with an atomic lock file before training it (``claims.py``), so no run is
trained by two workers at once; one that finds a run claimed waits for its record. With
``isolate=True`` a run trains in a fresh Python process (``isolated.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from nodelm_lib.config import TrainConfig
from nodelm_lib.files import atomic_write_text, check_folder
from nodelm_lib.training.distributed import launch_context
from nodelm_lib.training.evaluation import with_tokenizer_vocab
from nodelm_lib.training.integrity import read_evaluations_file, verify_record
from nodelm_lib.training.loop import train
from nodelm_lib.training.record import CHECKPOINT_NAME, RECORD_NAME, RunRecord

from . import claims
from .budget import check_budget
from .isolated import train_in_subprocess
from .records import recount_flops

log = logging.getLogger(__name__)

DEFAULT_STORE = "results/runs"
DEFAULT_CHECKPOINTS = "checkpoints/runs"


def record_path(store: str | Path, config_hash: str) -> Path:
    return Path(store) / f"{config_hash}.json"


def run_config(tc: TrainConfig) -> TrainConfig:
    """The config a run of ``tc`` trains and is stored under: ``tc`` finished, its model's
    ``vocab_size`` filled from the tokenizer or checked against it (``with_tokenizer_vocab``);
    idempotent. The store's entries finish a config here, once: ``run``, ``run_hash`` (so every
    look-up by hash: ``stored_record``, ``finished_record``) and a launcher's job
    (``launch.RunJob``); below them (``train_into_store``, ``budget``, ``isolated``) the config
    is finished, and other code takes the vocabulary from ``flops.model_with_vocab``."""
    return with_tokenizer_vocab(tc)


def run_hash(tc: TrainConfig) -> str:
    """The hash a run of ``tc`` is stored under: its finished config's (``run_config``), as the
    run records it. The same for ``tc`` finished or not."""
    return run_config(tc).config_hash()


def stored_record(tc: TrainConfig, store: str | Path = DEFAULT_STORE) -> RunRecord | None:
    """The finished (completed or failed) record of ``tc`` in ``store``, or None."""
    path = record_path(store, run_hash(tc))
    if not path.exists():
        return None
    record = read_record(path)
    return record if record.status in ("completed", "failed") else None


def checkpoint_path(config_hash: str, checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> Path:
    """Where ``run`` keeps the checkpoint (and, at the end, the final model) of a run."""
    return Path(checkpoints) / config_hash / CHECKPOINT_NAME


WEIGHTS_STORE = "retrained_for_weights"  # under the checkpoints folder: records of runs trained again for their weights


def weights_store(checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> Path:
    """The side store of runs trained again for their weights that ended elsewhere than their
    stored records (``train_into_store``)."""
    return Path(checkpoints) / WEIGHTS_STORE


def weights_record(config_hash: str, checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> RunRecord | None:
    """The record of the training whose final model is on disk (``checkpoints/<hash>/record.json``,
    written when that training ended), or None where no finished training left its weights there."""
    path = Path(checkpoints) / config_hash / RECORD_NAME
    if not (path.exists() and checkpoint_path(config_hash, checkpoints).exists()):
        return None
    return RunRecord.from_json(path)


def finished_record(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                    need_checkpoint: bool = False) -> RunRecord | None:
    """``stored_record``; with ``need_checkpoint``, the record of the final model on disk (the
    stored one, or that of a retraining which ended elsewhere: ``weights_record``), or None where
    no final model is on disk."""
    done = stored_record(tc, store)
    if done is None or not need_checkpoint:
        return done
    on_disk = weights_record(done.config_hash, checkpoints)
    if on_disk is None:
        return None
    return done if same_training(on_disk, done) else on_disk


def evaluations_store(record: RunRecord, store: str | Path = DEFAULT_STORE,
                      checkpoints: str | Path = DEFAULT_CHECKPOINTS) -> Path:
    """The store whose record is ``record``'s training, where evaluations of its weights belong:
    ``store``, or the side store (``weights_store``) of a retraining that ended elsewhere, so that
    a committed store never holds evaluations of weights its records do not describe."""
    path = record_path(store, record.config_hash)
    if path.exists() and same_training(read_record(path), record):
        return Path(store)
    return weights_store(checkpoints)


def run(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
        isolate: bool = False, need_checkpoint: bool = False, threads: int | None = None) -> RunRecord:
    """Train ``tc`` once, or read its record back from ``store`` if it was trained before.

    The run checkpoints every ``tc.checkpoint_interval`` steps (default: every evaluation)
    under ``checkpoints/<hash>/`` and resumes from there when restarted; its final model stays
    there (``record.checkpoint``, loadable with ``nl.load_model``). ``isolate=True`` trains in
    a fresh process (``isolated.py``), with ``threads`` torch threads if given.
    ``need_checkpoint=True`` retrains a stored run whose final model is not on disk (records are
    committed, checkpoints are not). Training is deterministic on one kind of CPU, so the retrained
    run usually ends with the stored record's losses: the stored record then stays as it is (its
    commit, CPU and times are those of the training the tables were built from), and only the
    weights are new. A retraining that ends elsewhere (another kind of CPU) keeps the stored record
    too, since other tables read it and must not mix CPUs: its own record goes, with a warning,
    to the side store ``weights_store(checkpoints)``, and ``run`` returns it, as the record of the
    weights on disk (evaluations of them belong beside it: ``evaluations_store``). Returns the
    stored record (with ``need_checkpoint``, the record of the final model on disk); an in-process run also carries the trained model as ``record.model``. While another
    worker holds the run's claim (``claims.py``), this waits for it and reads its record. Under a
    time budget (``budget.py``), a run that cannot finish in time raises ``BudgetReached``
    before it starts. ``tc`` may be unfinished (``run_config`` finishes it).
    """
    check_folder("store", store)
    check_folder("checkpoints", checkpoints)
    tc = run_config(tc)
    done = finished_record(tc, store, checkpoints, need_checkpoint)
    if done is not None:
        return done
    with claims.wait_for_claim(store, tc.config_hash()):
        done = finished_record(tc, store, checkpoints, need_checkpoint)  # the worker waited for may have stored it
        if done is not None:
            return done
        check_budget(tc, lambda: load_records(store, cached=True))
        return train_into_store(tc, store, checkpoints, isolate, threads)


def train_into_store(tc: TrainConfig, store: str | Path = DEFAULT_STORE, checkpoints: str | Path = DEFAULT_CHECKPOINTS,
                     isolate: bool = False, threads: int | None = None) -> RunRecord:
    """Train ``tc`` (resuming its checkpoint) and write its finished record to ``store``; the
    caller holds the run's claim. ``run`` without the look-up and the claim. A record the store
    already holds (a run trained again for its weights, by ``run`` or a launcher's job) is kept
    where the new training reproduces it (``same_training``). ``tc`` is finished (``run_config``,
    as ``run`` and a launcher's job pass it); an unfinished one is a ValueError."""
    if tc.model.vocab_size is None:  # its checkpoint folder and record would be named by another hash
        raise ValueError("train_into_store takes a finished config (model.vocab_size set): pass "
                         "store.run_config(tc), or call nl.run(tc), which finishes it")
    stored = stored_record(tc, store)
    config_hash = tc.config_hash()
    out_dir = Path(checkpoints) / config_hash
    tc = dataclasses.replace(tc, out_dir=str(out_dir), resume=True,
                             checkpoint_interval=tc.checkpoint_interval or tc.eval_interval)
    if isolate:
        record = train_in_subprocess(tc, out_dir, threads)
    else:
        try:
            record = train(tc)
        except Exception as err:
            record = getattr(err, "record", None)
            if record is None or record.status != "failed":
                raise  # a bug or an interruption: nothing to store, the checkpoint resumes it
    if stored is not None and same_training(stored, record):
        return dataclasses.replace(stored, model=record.model)
    if record.status in ("completed", "failed") and launch_context().is_main:  # rank 0 of a data-parallel run
        if stored is not None:
            log.warning("run %s (%s, seed %s) trained again for its weights ended elsewhere than its stored "
                        "record (final %s, stored %s): the stored record is kept, this training's goes to %s",
                        config_hash, tc.model.arch, tc.seed, record.final, stored.final, weights_store(checkpoints))
            record.to_json(record_path(weights_store(checkpoints), config_hash))
        else:
            record.to_json(record_path(store, config_hash))
    return record


def training_outcome(record: dict) -> str:
    """What every training of one run must reproduce, from a record's fields (a stored record's
    JSON, or ``vars`` of a ``RunRecord``): its config hash, status, final losses, validation curve
    and per-step training losses. Not its times (the curve's ``train_time_s`` included), commit,
    machine or the config's fields outside the hash (paths, progress bars): a run trained again
    elsewhere differs there. As canonical JSON, so that a NaN loss equals a NaN loss."""
    outcome = [record.get("config_hash"), record.get("status"), record.get("final"),
               [{k: v for k, v in e.items() if k != "train_time_s"} for e in record.get("evals") or []],
               [m.get("loss") for m in record.get("metrics") or []]]
    return json.dumps(outcome, sort_keys=True)


def same_training(a: RunRecord, b: RunRecord) -> bool:
    """Whether two trainings of one run ended alike (``training_outcome``)."""
    return training_outcome(vars(a)) == training_outcome(vars(b))


def evaluations_path(store: str | Path, config_hash: str) -> Path:
    """Where evaluations of a run's final model made after its training (``write_evaluations``)
    are kept: beside the records, one file per run, outside ``load_records``' glob."""
    return Path(store) / "evaluations" / f"{config_hash}.json"


def read_evaluations(record: RunRecord, store: str | Path = DEFAULT_STORE) -> dict[str, dict]:
    """The stored evaluations of ``record``'s final model, ``{key: values}`` as written by
    ``write_evaluations``; empty where there are none, or where they belong to another training
    of the run: one whose final validation loss was not this record's (a run retrained on
    another CPU ends a little elsewhere, and its weights must be evaluated again)."""
    path = evaluations_path(store, record.config_hash)
    if not path.exists():
        return {}
    data = read_evaluations_file(path)
    if data.get("final_val_loss") != record.final.get("val_loss"):
        log.warning("%s: evaluations of another training of this run (final val loss %s, the record's %s); "
                    "ignored", path, data.get("final_val_loss"), record.final.get("val_loss"))
        return {}
    return data["evaluations"]


def write_evaluations(record: RunRecord, evaluations: dict[str, dict], store: str | Path = DEFAULT_STORE) -> Path:
    """Keep ``evaluations`` (``{key: values}``, JSON) of ``record``'s final model beside its
    record, so that a table computed from the weights reads them back where the weights are
    not on disk (checkpoints are not committed; records and these are). Replaces the file
    atomically; tagged with the record's final validation loss (``read_evaluations``)."""
    payload = {"config_hash": record.config_hash, "final_val_loss": record.final.get("val_loss"),
               "evaluations": dict(sorted(evaluations.items()))}
    return atomic_write_text(evaluations_path(store, record.config_hash), json.dumps(payload, indent=1) + "\n")


def load_records(store: str | Path = DEFAULT_STORE, cached: bool = False) -> list[RunRecord]:
    """Every record in ``store``, sorted by file name.

    ``cached=True`` reads again only the files that are new or changed (by modification time and
    size) since this process last read the store, and returns the same objects as then: for callers
    that only read them, once per run (a time budget's estimate, a sweep ordering its runs), where
    parsing and verifying a store of hundreds of records would cost seconds each time."""
    paths = sorted(Path(store).glob("*.json"))
    if not cached:
        return [read_record(p) for p in paths]
    seen = _RECORDS_READ.setdefault(str(Path(store).resolve()), {})
    records = []
    for path in paths:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        if path.name not in seen or seen[path.name][0] != version:
            seen[path.name] = (version, read_record(path))
        records.append(seen[path.name][1])
    for gone in set(seen) - {p.name for p in paths}:
        del seen[gone]
    return records


# load_records(cached=True): per resolved store folder, each file's (mtime, size) and its record
_RECORDS_READ: dict[str, dict[str, tuple[tuple[int, int], RunRecord]]] = {}


def read_record(path: str | Path) -> RunRecord:
    """The record at ``path``, verified (``integrity.verify_record``: a file named like a hash
    holds that hash's record, which is the hash of its config; a ``RecordError`` names the file,
    what disagrees and what to do). A finished record whose FLOPs were counted at another batch than
    its training's (written before the count took the batch: ``records.recount_flops``) is
    counted again and written back, once, so every table of a store compares the same count."""
    record = RunRecord.from_json(path)
    verify_record(record, path)
    if record.status in ("completed", "failed") and recount_flops(record):
        record.to_json(path)
        log.info("%s: FLOPs per token counted again at the training batch (%d sequences)", path,
                 record.flops_batch_size)
    return record
