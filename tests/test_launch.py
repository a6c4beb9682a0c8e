"""Sweeps through a submitit launcher (its local executor): the sequential sweep's records, nothing
submitted twice, each run trained once by concurrent sweeps, results collected while jobs run."""

from __future__ import annotations

import sys
import threading
import time

import pytest

import nodelm_lib as nl
from nodelm_lib.experiments import sweeps
from nodelm_lib.runs import claims, launch
from nodelm_lib.runs.store import record_path

ARMS = {"gpt": {}, "hybrid": {"model.arch": "hybrid", "model.ode_start": 0, "model.ode_end": 1}}
SEEDS = [0, 1]
POLL_S = 0.2


def tiny() -> nl.TrainConfig:
    model = nl.ModelConfig(arch="gpt", vocab_size=256, d_model=16, n_heads=2, n_layers=2, max_seq_len=16)
    return nl.TrainConfig(model=model, batch_size=4, seq_len=16, max_steps=8, lr=3e-3, warmup_steps=2,
                          eval_interval=4, eval_batches=2, progress=False, device="cpu")


def computed(store, config_hash: str) -> dict:
    """What a stored run computed, without what it measured about the machine."""
    record = nl.RunRecord.from_json(record_path(store, config_hash))
    return {"config_hash": record.config_hash, "status": record.status, "final": record.final,
            "losses": [row["loss"] for row in record.metrics]}


def local_launcher(folder, **parameters) -> "launch.Launcher":
    return launch.Launcher("local", folder=folder, poll_s=POLL_S, **parameters)


@pytest.fixture
def launchers():
    """Launchers made by a test, whose jobs are cancelled when it ends (a failed test leaves none)."""
    made = []
    yield made
    for launcher in made:
        launcher.cancel()


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    """The same sweep, one run after another in this process."""
    store = tmp_path_factory.mktemp("sequential") / "runs"
    table = nl.sweep(tiny(), ARMS, SEEDS, store=store, checkpoints=store.parent / "ckpt", isolate=False,
                     progress=False)
    return store, table


def test_without_submitit_the_launcher_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'nodelm\[cluster\]'"):
        launch.Launcher("local")
    with pytest.raises(ImportError, match=r"nodelm\[cluster\]"):
        nl.sweep(tiny(), ARMS, SEEDS, store=tmp_path / "runs", checkpoints=tmp_path / "ckpt", launcher="local",
                 progress=False)


def test_collect_reads_finished_runs_and_lists_the_others(sequential, tmp_path):
    store = tmp_path / "runs"
    store.mkdir()
    done, running = sequential[1]["config_hash"][:2]
    (store / f"{done}.json").write_text(record_path(sequential[0], done).read_text())
    with claims.try_claim(store, running):
        table = sweeps.collect(tiny(), ARMS, SEEDS, store)
    assert list(table["status"]) == ["completed", "running", "missing", "missing"]
    assert list(table["config_hash"]) == list(sequential[1]["config_hash"])
    assert table["val_loss"].iloc[0] == sequential[1]["val_loss"].iloc[0]
    assert "pid" in table["claimed_by"].iloc[1] and table["val_loss"].isna().sum() == 3


def test_a_local_launcher_sweep_equals_the_sequential_one_and_a_rerun_submits_nothing(sequential, tmp_path,
                                                                                     launchers):
    pytest.importorskip("submitit")
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    launchers.append(local_launcher(tmp_path / "jobs"))
    first = nl.sweep(tiny(), ARMS, SEEDS, store=store, checkpoints=ckpt, launcher=launchers[0], wait=False,
                     progress=False)  # returns at once: the jobs train meanwhile
    assert len(first) == 4 and set(first["status"]) <= {"missing", "running", "completed"}
    deadline = time.time() + 900  # only against a hang: a loaded 2-core machine can take minutes
    while not (table := sweeps.collect(tiny(), ARMS, SEEDS, store))["status"].eq("completed").all():
        assert time.time() < deadline, f"the jobs did not finish: {table[['arm', 'seed', 'status']]}"
        time.sleep(POLL_S)
    expected = sequential[1]
    assert list(table["config_hash"]) == list(expected["config_hash"])
    for config_hash in expected["config_hash"]:
        assert computed(store, config_hash) == computed(sequential[0], config_hash)

    rerun = local_launcher(tmp_path / "jobs")
    rerun.executor.submit = lambda *a, **k: pytest.fail("a stored run was submitted again")
    again = nl.sweep(tiny(), ARMS, SEEDS, store=store, checkpoints=ckpt, launcher=rerun, progress=False)
    assert rerun.history == [] and list(again["val_loss"]) == list(table["val_loss"])


def test_two_concurrent_sweeps_train_each_run_exactly_once(sequential, tmp_path, launchers):
    pytest.importorskip("submitit")
    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    seeds = SEEDS[:1]  # 2 runs, 4 jobs racing for them: each job is a fresh interpreter (~4 s of CPU)
    launchers += [local_launcher(tmp_path / f"jobs{i}") for i in range(2)]
    tables, errors = [None, None], []

    def drive(i):
        try:
            tables[i] = nl.sweep(tiny(), ARMS, seeds, store=store, checkpoints=ckpt, launcher=launchers[i],
                                 progress=False)
        except Exception as err:  # reported by the assertion below
            errors.append(err)

    drivers = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for d in drivers:
        d.start()
    for d in drivers:
        d.join(timeout=900)
    assert not errors, errors
    trained = [row["config_hash"] for la in launchers for row in la.history if row["outcome"] == "trained"]
    expected = sequential[1][sequential[1]["seed"].isin(seeds)]
    assert sorted(trained) == sorted(expected["config_hash"])  # every run, each once
    assert list(tables[0]["val_loss"]) == list(tables[1]["val_loss"]) == list(expected["val_loss"])
    assert len(launchers[0].history) + len(launchers[1].history) <= 4  # no job submitted twice either
    assert not list(store.glob("*.claim"))  # every claim released


def test_a_job_of_two_tasks_trains_one_data_parallel_run(sequential, tmp_path, launchers):
    pytest.importorskip("submitit")
    store = tmp_path / "runs"
    launcher = local_launcher(tmp_path / "jobs", tasks_per_node=2)
    launchers.append(launcher)
    table = nl.sweep(tiny(), {"gpt": {}}, [0], store=store, checkpoints=tmp_path / "ckpt", launcher=launcher,
                     progress=False)
    (config_hash,) = table["config_hash"]
    record = nl.RunRecord.from_json(record_path(store, config_hash))
    assert record.environment["world_size"] == 2 and launcher.outcomes() == {"trained": 1}
    one = computed(sequential[0], config_hash)  # batch 4 on one process; here 2 on each of 2 ranks
    assert computed(store, config_hash)["losses"] == pytest.approx(one["losses"], abs=1e-5, rel=0)
    assert record.final["val_loss"] == pytest.approx(one["final"]["val_loss"], abs=1e-5, rel=0)


def test_slurm_jobs_must_state_their_time_limit():
    with pytest.raises(ValueError, match=r"timeout_min=\.\.\.\) in minutes"):
        launch._with_time_limit("slurm", {})
    assert launch._with_time_limit("slurm", {"timeout_min": 60}) == {"timeout_min": 60}
    assert launch._with_time_limit("local", {})["timeout_min"] == launch.LOCAL_TIMEOUT_MIN


def test_a_job_that_retrains_a_run_for_its_weights_keeps_the_stored_record(tmp_path, caplog):
    """A launcher's job with ``need_checkpoint`` on a clone (records, no weights) trains the run
    again; where that training ends elsewhere than the stored record (another kind of CPU), the
    stored record stays byte for byte and the retraining's record goes to the side store, as
    ``run`` does (both go through ``store.train_into_store``)."""
    import json
    import shutil

    from conftest import as_if_trained_elsewhere
    from nodelm_lib.config import to_dict
    from nodelm_lib.runs.final_weights import weights_store

    store, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    config_hash = nl.run(tiny(), store=store, checkpoints=ckpt, need_checkpoint=True).config_hash
    path = record_path(store, config_hash)
    stored = as_if_trained_elsewhere(path)
    before = path.read_bytes()
    shutil.rmtree(ckpt / config_hash)
    job = launch.RunJob()
    assert job(to_dict(tiny()), str(store), str(ckpt))["outcome"] == "recorded"  # the record is enough
    with caplog.at_level("WARNING"):
        done = job(to_dict(tiny()), str(store), str(ckpt), need_checkpoint=True)
    assert done == {"config_hash": config_hash, "outcome": "trained", "status": "completed"}
    assert path.read_bytes() == before and "ended elsewhere than its stored record" in caplog.text
    side = json.loads(record_path(weights_store(ckpt), config_hash).read_text())
    assert side["final"]["val_loss"] != stored.final["val_loss"] and (ckpt / config_hash / "checkpoint.pt").exists()
    assert job(to_dict(tiny()), str(store), str(ckpt), need_checkpoint=True)["outcome"] == "recorded"
