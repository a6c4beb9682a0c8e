"""Sweeps in chunks: a time budget that starts only runs that can finish, the archive of a chunk's
records, and its import into a store (a conflicting record refused)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tarfile
import time
from pathlib import Path
from unittest import mock

import pytest

import nodelm_lib as nl
from nodelm_lib.cli import main
from nodelm_lib.experiments.profiles import notebook_store
from nodelm_lib.experiments.sweeps import (MAX_AUTO_WORKERS, RUN_MEMORY_HEADROOM, UNMEASURED_RUN_MB, auto_workers,
                                          train_all)
from nodelm_lib.runs import budget, chunks
from nodelm_lib.runs.store import load_records, record_path, run_hash
from nodelm_lib.training.integrity import RecordError
from nodelm_lib.training.record import RunRecord


def tiny(seed: int, steps: int) -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", d_model=16, n_heads=2, n_layers=1, max_seq_len=16)
    return nl.TrainConfig(model=model, dataset="tinyshakespeare", tokenizer="char", batch_size=2, seq_len=16,
                          max_steps=steps, eval_interval=steps, eval_batches=1, eval_on="batches", lr=1e-3,
                          seed=seed, device="cpu", progress=False)


@pytest.fixture
def deadline_in(monkeypatch):
    """Set the budget: runs must finish within ``seconds``; an untimed run is assumed ``unknown_s``."""
    def set_budget(seconds: float, unknown_s: float = 5.0) -> None:
        monkeypatch.setenv(budget.DEADLINE_ENV, repr(time.time() + seconds))
        monkeypatch.setenv(budget.UNKNOWN_ENV, repr(unknown_s))
    return set_budget


def test_without_a_deadline_every_run_may_start(monkeypatch):
    monkeypatch.delenv(budget.DEADLINE_ENV, raising=False)
    budget.check_budget(tiny(0, 10**9), lambda: pytest.fail("no deadline: nothing to estimate"))


def test_a_run_that_cannot_finish_is_not_started_and_says_why(deadline_in):
    deadline_in(60, unknown_s=61)
    with pytest.raises(budget.BudgetReached, match=r"needs about 61 s \(assumed \(NODELM_UNKNOWN_RUN_S\).*: not started"):
        budget.check_budget(tiny(0, 4), lambda: [])
    deadline_in(60, unknown_s=59)
    budget.check_budget(tiny(0, 4), lambda: [])


def test_a_run_timed_by_the_store_starts_only_if_its_estimate_with_the_margin_fits(deadline_in):
    """An estimate is a median of the records: a run starts only if ``ESTIMATE_MARGIN`` x its
    estimate fits in what is left of the budget."""
    from nodelm_lib.config import to_dict
    from nodelm_lib.training.evaluation import with_tokenizer_vocab
    from nodelm_lib.training.profiling import cpu_description

    timed = with_tokenizer_vocab(tiny(7, 4))
    record = RunRecord(config=to_dict(timed), config_hash=timed.config_hash(), seed=7, status="completed",
                       metrics=[{}] * 4, train_time_s=40.0, wall_time_s=50.0 - budget.STARTUP_S,
                       environment=cpu_description())
    assert budget.estimate_run_s(tiny(0, 4), [record]) == (pytest.approx(50.0), "measured")
    deadline_in(55)  # the estimate fits, 1.2 x the estimate does not
    with pytest.raises(budget.BudgetReached, match=r"needs about 60 s \(1.2 x the 50 s estimated: measured\)"):
        budget.check_budget(tiny(0, 4), lambda: [record])
    deadline_in(65)
    budget.check_budget(tiny(0, 4), lambda: [record])


@pytest.mark.parametrize("name,value", [(budget.DEADLINE_ENV, "soon"), (budget.DEADLINE_ENV, "nan"),
                                        (budget.UNKNOWN_ENV, "-1"), (budget.UNKNOWN_ENV, "inf")])
def test_a_bad_budget_setting_is_named(monkeypatch, name, value):
    monkeypatch.setenv(budget.DEADLINE_ENV, repr(time.time() + 60))
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}' is not valid"):
        budget.check_budget(tiny(0, 4), lambda: [])


def test_a_sweep_under_a_budget_trains_what_fits_and_leaves_the_rest(tmp_path, deadline_in):
    store = tmp_path / "store"
    first, endless, second = tiny(0, 4), tiny(2, 10**7), tiny(1, 4)
    deadline_in(300, unknown_s=5)
    # the first run is untimed (assumed 5 s); then the store times its shape, the endless run cannot
    # fit, and the last one still does: the sweep goes on past a run that does not fit
    with pytest.raises(budget.BudgetReached, match=r"1 run\(s\) did not fit .* the first: run [0-9a-f]{16} \(gpt, seed 2"):
        train_all([first, endless, second], store=store, checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    stored = {r.seed for r in load_records(store)}
    assert stored == {0, 1}
    assert not record_path(store, run_hash(endless)).exists()


def fake_notebook(configs, store, tmp_path):
    """A stand-in for `make <nb>`: trains ``configs`` into ``store`` under the chunk's environment
    and fails as a notebook does when a run did not fit."""
    def run(env: dict) -> int:
        with mock.patch.dict(os.environ, env):
            try:
                train_all(configs, store=store, checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
            except budget.BudgetReached:
                return 1
        return 0
    return run


def test_chunks_pack_what_they_trained_and_import_into_another_store(tmp_path):
    store, home = tmp_path / "lease", tmp_path / "home"
    configs = [tiny(0, 4), tiny(1, 10**7)]
    result = chunks.run_chunk(fake_notebook(configs, store, tmp_path), store, tmp_path / "a.tar.gz", budget_s=300,
                              unknown_run_s=5)
    assert result.outcome == "budget" and result.exit_code == chunks.EXIT_MORE
    assert result.packed == [f"{run_hash(configs[0])}.json"] and "seed 1" in result.stops[0]
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert tar.getnames() == result.packed  # records only: no checkpoint travels

    done = chunks.import_archive(tmp_path / "a.tar.gz", home)
    assert done == {"added": result.packed, "same": []}
    assert [r.config_hash for r in load_records(home)] == [run_hash(configs[0])]
    assert chunks.import_archive(tmp_path / "a.tar.gz", home) == {"added": [], "same": result.packed}

    # the next chunk finds the first run stored and packs only what it adds
    result = chunks.run_chunk(fake_notebook(configs[:1] + [tiny(2, 4)], store, tmp_path), store, tmp_path / "b.tar.gz",
                              budget_s=300, unknown_run_s=5)
    assert result.outcome == "complete" and result.exit_code == 0
    assert result.packed == [f"{run_hash(tiny(2, 4))}.json"]


def test_a_record_the_store_holds_with_other_results_is_refused_and_nothing_is_imported(tmp_path):
    store, home = tmp_path / "lease", tmp_path / "home"
    configs = [tiny(0, 4), tiny(1, 4)]
    chunks.run_chunk(fake_notebook(configs, store, tmp_path), store, tmp_path / "a.tar.gz", budget_s=300, unknown_run_s=5)
    home.mkdir()
    # the same run trained by other code: a valid record (its digest rewritten) with another first loss
    other = RunRecord.from_json(record_path(store, run_hash(configs[0])))
    other.metrics[0]["loss"] += 0.5
    other.to_json(record_path(home, run_hash(configs[0])))
    with pytest.raises(RecordError, match=r"nothing imported; .*the store holds this run with other results"):
        chunks.import_archive(tmp_path / "a.tar.gz", home)
    assert not record_path(home, run_hash(configs[1])).exists()


def test_a_run_trained_again_elsewhere_imports_as_the_same_run(tmp_path):
    """Two trainings of one run differ only in times, commit, machine and the config's fields
    outside the hash: the import finds the stored one the same and keeps it, NaN losses included."""
    lease, home = tmp_path / "lease", tmp_path / "home"
    tc = tiny(0, 4)
    nl.run(tc, lease, tmp_path / "ckpt_lease")
    nl.run(dataclasses.replace(tc, progress=True), home, tmp_path / "ckpt_home")
    path = record_path(home, run_hash(tc))
    there, here = RunRecord.from_json(record_path(lease, run_hash(tc))), RunRecord.from_json(path)
    assert there.evals[-1]["train_time_s"] != here.evals[-1]["train_time_s"]  # a real second training
    assert there.config["progress"] != here.config["progress"]
    dataclasses.replace(here, environment={**here.environment, "git_commit": "0000000"}).to_json(path)
    stored = path.read_text()
    chunks.pack(lease, {}, tmp_path / "a.tar.gz")
    assert chunks.import_archive(tmp_path / "a.tar.gz", home) == {"added": [], "same": [path.name]}
    assert path.read_text() == stored

    for record, where in ((there, lease), (here, home)):  # a run that failed with a NaN loss, trained twice
        record.metrics[-1]["loss"], record.status = float("nan"), "failed"
        record.to_json(record_path(where, run_hash(tc)))
    chunks.pack(lease, {}, tmp_path / "b.tar.gz")
    assert chunks.import_archive(tmp_path / "b.tar.gz", home)["same"] == [path.name]


@pytest.mark.parametrize("member", ["../evil.json", "checkpoint.pt", "deep/er/x.json"])
def test_an_archive_holding_anything_but_records_is_refused(tmp_path, member):
    source = tmp_path / "x.json"
    source.write_text("{}")
    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=member)
    with pytest.raises(RecordError, match="is not a run record or stored evaluations file"):
        chunks.import_archive(tmp_path / "bad.tar.gz", tmp_path / "home")


def test_a_tampered_record_in_an_archive_is_refused(tmp_path):
    store = tmp_path / "lease"
    chunks.run_chunk(fake_notebook([tiny(0, 4)], store, tmp_path), store, tmp_path / "a.tar.gz", budget_s=300, unknown_run_s=5)
    path = record_path(store, run_hash(tiny(0, 4)))
    data = json.loads(path.read_text())
    data["final"]["val_loss"] = 0.1  # edited by hand: the digest no longer agrees
    path.write_text(json.dumps(data))
    chunks.pack(store, {}, tmp_path / "edited.tar.gz")
    with pytest.raises(RecordError, match="nothing imported"):
        chunks.import_archive(tmp_path / "edited.tar.gz", tmp_path / "home")


def test_the_chunk_command_passes_the_budget_to_make_and_packs_what_it_stored(tmp_path):
    """`python -m nodelm_lib chunk` with a stand-in for make that stores a record and reports a
    run that did not fit, as a notebook under the budget does; then `import-runs`."""
    donor = tmp_path / "donor"
    train_all([tiny(0, 4)], store=donor, checkpoints=tmp_path / "ckpt", isolate=False, progress=False)
    name = f"{run_hash(tiny(0, 4))}.json"
    store = tmp_path / "results" / "runs" / "gpu"  # under --root: no work folder named
    store.mkdir(parents=True)
    fake_make = tmp_path / "fake_make"
    fake_make.write_text(f'#!/bin/sh\necho "$@ $NODELM_DEADLINE" > {tmp_path}/called\ncp {donor / name} {store}/\n'
                         f'echo "run x does not fit" >> "$NODELM_BUDGET_REPORT"\nexit 2\n')
    fake_make.chmod(fake_make.stat().st_mode | stat.S_IXUSR)
    archive = tmp_path / "out" / "chunk.tar.gz"
    code = main(["chunk", "02_seed_comparison", "--profile", "gpu", "--budget", "100", "--archive", str(archive),
                 "--root", str(tmp_path), "--runner", "make", "--make", str(fake_make)])
    assert code == chunks.EXIT_MORE
    called = (tmp_path / "called").read_text().split()
    assert called[:3] == ["--no-print-directory", "02_seed_comparison", "PROFILE=gpu"] and float(called[3]) > time.time()
    assert main(["import-runs", str(archive), "--store", str(tmp_path / "home")]) == 0
    assert (tmp_path / "home" / name).read_bytes() == (donor / name).read_bytes()


# --------------------------------------------------------------------------- many runs on one device


def stored_peak(store, tc: nl.TrainConfig, peak_mb: float) -> None:
    """A finished record of ``tc`` that measured ``peak_mb`` of device memory."""
    from nodelm_lib.training.evaluation import with_tokenizer_vocab

    tc = with_tokenizer_vocab(tc)
    RunRecord(config=nl.config.to_dict(tc), config_hash=tc.config_hash(), seed=tc.seed, status="completed",
              peak_memory_mb=peak_mb).to_json(record_path(store, tc.config_hash()))


def test_auto_workers_fill_a_gpus_free_memory_by_the_peaks_runs_measured(tmp_path):
    on_gpu = [dataclasses.replace(tiny(seed, 4), device="cuda") for seed in (0, 1)]
    assert auto_workers(on_gpu, tmp_path, free_mb=2 * UNMEASURED_RUN_MB * RUN_MEMORY_HEADROOM) == 2  # nothing measured
    stored_peak(tmp_path, dataclasses.replace(on_gpu[0], seed=9), 1000.0)  # the same shape, another seed
    assert auto_workers(on_gpu, tmp_path, free_mb=5000.0) == 4  # 5000 // (1000 x 1.25)
    assert auto_workers(on_gpu, tmp_path, free_mb=10**6) == MAX_AUTO_WORKERS
    assert auto_workers(on_gpu, tmp_path, free_mb=100.0) == 1  # at least one
    assert auto_workers([tiny(0, 4)], tmp_path) == min(MAX_AUTO_WORKERS, os.cpu_count())  # a CPU: one per core


@pytest.mark.parametrize("workers", ["two", 0, 1.5, True])
def test_workers_is_a_count_or_auto(tmp_path, workers):
    with pytest.raises(ValueError, match=f"workers={workers!r} is not valid; it must be an integer >= 1 or 'auto'"):
        train_all([tiny(0, 4)], store=tmp_path, isolate=True, workers=workers, progress=False)


# --------------------------------------------------------------------------- a notebook without Jupyter


ROOT = Path(__file__).resolve().parents[1]


def test_a_misspelt_parameter_stops_a_notebook_in_this_process_before_any_cell_runs(tmp_path):
    from nodelm_lib.experiments.notebook_here import run_notebook_here

    notebook = ROOT / "notebooks" / "01_gradient_flow.ipynb"
    with pytest.raises(ValueError, match=r"sets 'max_step' \(did you mean 'max_steps'\?\)"):
        run_notebook_here(notebook, parameters={"work_dir": str(tmp_path), "max_step": 20})
    assert not list(tmp_path.iterdir())  # no cell ran: the notebook would have made its work folders


def test_the_chunk_command_runs_a_notebook_in_this_process_and_packs_its_runs(tmp_path, monkeypatch):
    """`chunk` on a lent GPU has PyTorch but no Jupyter: notebook 01 (smoke) run in-process under a
    budget, in the work folder the chunk names, its two runs packed."""
    monkeypatch.setenv("NODELM_WORK_DIR", str(tmp_path / "elsewhere"))  # --work-dir wins over it
    store = tmp_path / "results" / "runs" / "smoke"
    archive = tmp_path / "chunk.tar.gz"
    code = main(["chunk", "01_gradient_flow", "--profile", "smoke", "--budget", "600", "--unknown-run-s", "60",
                 "--archive", str(archive), "--work-dir", str(tmp_path), "--root", str(ROOT)])
    assert code == chunks.EXIT_COMPLETE
    assert not (tmp_path / "elsewhere" / "results" / "runs").exists()
    with tarfile.open(archive) as tar:
        # two run records, and the hybrid's control effect kept beside its record (store evaluations)
        stored = sorted(p.relative_to(store).as_posix() for p in store.rglob("*.json"))
        assert sorted(tar.getnames()) == stored and len(stored) == 3 and sum(n.startswith("evaluations/") for n in stored) == 1
    assert (tmp_path / "results" / "gradient_flow_smoke.csv").exists()
    # the chunk's deadline stays inside it: a later run in this process is not held to it
    assert not {budget.DEADLINE_ENV, budget.REPORT_ENV, budget.UNKNOWN_ENV} & set(os.environ)


def test_a_chunk_packs_the_store_its_notebook_writes_to(tmp_path):
    """The store is found as the notebooks find it: a variant that shares another profile's store
    (07's cpu_wide reads and writes cpu's) is packed from that store, not from one named after it."""
    assert notebook_store("02_seed_comparison", "gpu", tmp_path) == tmp_path / "results" / "runs" / "gpu"
    assert notebook_store("07_scaling", "cpu_wide", tmp_path) == tmp_path / "results" / "runs" / "cpu"
    assert notebook_store("01_gradient_flow", "smoke", tmp_path) == tmp_path / "results" / "runs" / "smoke"
    with pytest.raises(ValueError, match="has no profile 'gpux'; choose one of"):
        notebook_store("02_seed_comparison", "gpux", tmp_path)
