"""make reproduce's timing record: every step timed and saved as it finishes, so a stopped
reproduce keeps what it measured; a failed notebook stops the rest."""

import json
import stat
import subprocess

import pandas as pd
import pytest
import torch

from nodelm_lib.cli import main
from nodelm_lib.reporting.reproduce import reproduce
from nodelm_lib.reporting.tables import markdown_table


def _record(root, profile="cpu"):
    return json.loads((root / "results" / f"reproduce_{profile}.json").read_text())


def _notebook_that_stores(root, runs_per_notebook, calls):
    """A stand-in for `make <nb>`: stores runs like 02 would and remembers what it was asked."""
    def run(nb):
        calls.append(nb)
        runs = root / "results" / "runs" / "cpu"
        runs.mkdir(parents=True, exist_ok=True)
        for i in range(runs_per_notebook.get(nb, 0)):
            (runs / f"{nb}_{i}.json").write_text("{}")
        return 0
    return run


def test_every_notebook_is_timed_between_two_probes(tmp_path):
    calls, lines = [], []
    record = reproduce(["01_a", "02_b"], "cpu", tmp_path, run_notebook=_notebook_that_stores(tmp_path, {"02_b": 3}, calls),
                       cpu_probe=lambda: "cpu availability 0.50", log=lines.append)
    assert calls == ["01_a", "02_b"] and record.status == "done"
    assert [s.name for s in record.steps] == ["cpu probe before", "01_a", "02_b", "cpu probe after"]
    assert [s.new_stored_runs for s in record.steps] == [None, 0, 3, None]
    assert record.total_s >= sum(s.seconds for s in record.steps) > 0

    saved = _record(tmp_path)
    assert saved["status"] == "done" and saved["steps"][0]["status"] == "cpu availability 0.50"
    assert saved["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert saved["machine"]["torch"] == torch.__version__ and saved["machine"]["cpu_name"] in lines[0]
    table = pd.read_csv(tmp_path / "results" / "reproduce_cpu.csv")
    assert list(table["step"]) == ["cpu probe before", "01_a", "02_b", "cpu probe after", "total"]
    assert table["new stored runs"].iloc[-1] == 3 and table["status"].iloc[-1] == "done"
    assert "| total |" in markdown_table(table)  # what `make tables` puts in README
    assert lines[-1].startswith(">> reproduce [cpu]: done after 0h00m")


def test_a_failed_notebook_stops_the_rest_and_is_recorded(tmp_path):
    calls = []

    def run(nb):
        calls.append(nb)
        return 2 if nb == "02_b" else 0

    record = reproduce(["01_a", "02_b", "03_c"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe",
                       log=lambda _: None)
    assert calls == ["01_a", "02_b"]
    assert record.status == "failed at 02_b"
    assert [(s["name"], s["status"]) for s in _record(tmp_path)["steps"]] == [
        ("cpu probe before", "probe"), ("01_a", "done"), ("02_b", "failed"), ("cpu probe after", "probe")]


def test_times_are_on_disk_as_each_notebook_ends_and_survive_ctrl_c(tmp_path):
    seen = {}

    def run(nb):
        if nb == "02_b":
            seen["before 02_b"] = [s["name"] for s in _record(tmp_path)["steps"]]
            raise KeyboardInterrupt
        return 0

    with pytest.raises(KeyboardInterrupt):
        reproduce(["01_a", "02_b", "03_c"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe",
                  log=lambda _: None)
    assert seen["before 02_b"] == ["cpu probe before", "01_a", "02_b"]  # 02_b on disk as running
    saved = _record(tmp_path)
    assert saved["status"] == "interrupted at 02_b"
    assert [(s["name"], s["status"]) for s in saved["steps"]][-2:] == [("01_a", "done"), ("02_b", "interrupted")]
    assert saved["total_s"] > 0


def test_no_notebooks_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no notebooks"):
        reproduce([], "cpu", tmp_path)


def test_cli_runs_make_with_the_profile(tmp_path):
    """`python -m nodelm_lib reproduce` calls `<make> --no-print-directory <nb> PROFILE=<profile>` in --root."""
    fake_make = tmp_path / "fake_make"
    fake_make.write_text('#!/bin/sh\necho "$@" >> calls.txt\n[ "$2" != bad ]\n')
    fake_make.chmod(fake_make.stat().st_mode | stat.S_IXUSR)
    args = ["reproduce", "--root", str(tmp_path), "--make", str(fake_make), "--profile", "smoke", "--probe-seconds", "0.05"]
    assert main(args + ["nb1", "nb2"]) == 0
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["--no-print-directory nb1 PROFILE=smoke",
                                                                 "--no-print-directory nb2 PROFILE=smoke"]
    assert _record(tmp_path, "smoke")["steps"][0]["status"].startswith("cpu availability ")
    assert main(args + ["bad", "nb3"]) == 1
    assert _record(tmp_path, "smoke")["status"] == "failed at bad"


def test_the_commit_is_dirty_for_code_changes_not_for_cleared_outputs(tmp_path):
    """A from-scratch reproduce deletes the committed run records first; that must not mark the
    record -dirty, while an edit to the code must."""
    from nodelm_lib.reporting.reproduce import _git_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "results" / "runs").mkdir(parents=True)
    (tmp_path / "results" / "runs" / "a.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    clean = _git_commit(tmp_path)
    assert clean and not clean.endswith("-dirty")

    (tmp_path / "results" / "runs" / "a.json").unlink()
    assert _git_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert _git_commit(tmp_path) == f"{clean}-dirty"


def test_variants_of_the_profile_run_as_steps_of_their_own(tmp_path):
    for name in ("cpu", "cpu_wikitext2", "cpu_b", "gpu_wikitext2"):
        (tmp_path / "params" / "02_b").mkdir(parents=True, exist_ok=True)
        (tmp_path / "params" / "02_b" / f"{name}.yaml").write_text("profile: x\n")
    calls = []

    def run(nb, variant=None):
        calls.append((nb, variant))
        if variant == "cpu_wikitext2":  # a variant stores in its own profile's folder
            runs = tmp_path / "results" / "runs" / variant
            runs.mkdir(parents=True, exist_ok=True)
            (runs / "r.json").write_text("{}")
        return 0

    record = reproduce(["01_a", "02_b"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe", log=lambda m: None)
    assert calls == [("01_a", None), ("02_b", None), ("02_b", "cpu_b"), ("02_b", "cpu_wikitext2")]
    names = [s.name for s in record.steps]
    assert names[1:-1] == ["01_a", "02_b", "02_b [cpu_b]", "02_b [cpu_wikitext2]"]
    assert [s.new_stored_runs for s in record.steps[1:-1]] == [0, 0, 0, 1]


def _git_repo(root):
    """``root`` as a clean git checkout: a reproduce resumes only a record of the same commit."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                       capture_output=True)

    (root / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    return git


def test_a_killed_reproduce_resumes_at_the_same_commit_keeping_every_part(tmp_path):
    import time

    _git_repo(tmp_path)
    calls = []

    def killed_in_02(nb):  # a session that ends inside 02: the heartbeat has written its time so far
        calls.append(nb)
        if nb == "02_b":
            (tmp_path / "results" / "runs" / "cpu").mkdir(parents=True, exist_ok=True)
            (tmp_path / "results" / "runs" / "cpu" / "first.json").write_text("{}")
            time.sleep(0.3)
            raise SystemExit("the session ended")  # stands for SIGKILL: nothing after this runs
        return 0

    with pytest.raises(SystemExit):
        reproduce(["01_a", "02_b", "03_c"], "cpu", tmp_path, run_notebook=killed_in_02, cpu_probe=lambda: "probe",
                  log=lambda _: None, heartbeat_s=0.05)
    left = _record(tmp_path)
    assert left["status"] == "running" and left["steps"][-1]["status"] == "running"
    assert left["steps"][-1]["seconds"] > 0.1 and left["steps"][-1]["new_stored_runs"] == 1

    lines = []
    record = reproduce(["01_a", "02_b", "03_c"], "cpu", tmp_path, run_notebook=_notebook_that_stores(tmp_path, {"02_b": 2}, calls),
                       cpu_probe=lambda: "probe", log=lines.append, heartbeat_s=0.05)
    assert calls == ["01_a", "02_b", "02_b", "03_c"]  # 01_a was done: not run again
    assert record.status == "done" and len(record.sessions) == 2
    assert [(s.name, s.status) for s in record.steps] == [
        ("cpu probe before", "probe"), ("01_a", "done"), ("02_b", "killed"),
        ("cpu probe before", "probe"), ("02_b", "done"), ("03_c", "done"), ("cpu probe after", "probe")]
    assert record.total_s >= sum(s.seconds for s in record.steps) > 0.1
    assert any(line.startswith(">> resuming the reproduce of") for line in lines)
    table = pd.read_csv(tmp_path / "results" / "reproduce_cpu.csv")
    assert table["new stored runs"].iloc[-1] == 3  # 1 by the killed part, 2 by the resumed one


def test_a_finished_or_other_commits_record_is_not_resumed(tmp_path):
    git = _git_repo(tmp_path)
    calls = []
    run = _notebook_that_stores(tmp_path, {}, calls)
    reproduce(["01_a"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe", log=lambda _: None)
    again = reproduce(["01_a"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe", log=lambda _: None)
    assert calls == ["01_a", "01_a"] and len(again.sessions) == 1  # the first was done: a new record

    saved = _record(tmp_path)
    saved["status"] = "running"
    (tmp_path / "results" / "reproduce_cpu.json").write_text(json.dumps(saved))
    (tmp_path / "code.py").write_text("x = 2\n")
    git("commit", "-qam", "other code")
    other = reproduce(["01_a"], "cpu", tmp_path, run_notebook=run, cpu_probe=lambda: "probe", log=lambda _: None)
    assert calls == ["01_a"] * 3 and len(other.sessions) == 1 and other.commit != saved["commit"]


def test_a_record_timed_on_another_cpu_is_named_before_it_is_replaced(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "reproduce_cpu.json").write_text(json.dumps(
        {"profile": "cpu", "started": "2026-01-01 00:00", "commit": "abc1234", "status": "done",
         "machine": {"cpu_name": "Some Other CPU", "cpu_capability": "NEON"}, "steps": []}))
    lines = []
    reproduce(["01_a"], "cpu", tmp_path, run_notebook=lambda nb: 0, cpu_probe=lambda: "probe", log=lines.append)
    assert "Some Other CPU (NEON)" in lines[0] and "2026-01-01 00:00" in lines[0]
    assert "not this machine's" in lines[0]
    lines.clear()  # the record it wrote is this machine's: nothing to say
    reproduce(["01_a"], "cpu", tmp_path, run_notebook=lambda nb: 0, cpu_probe=lambda: "probe", log=lines.append)
    assert not any("not this machine's" in line for line in lines)
