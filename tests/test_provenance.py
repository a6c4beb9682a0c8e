"""One provenance per table: every row of a results table from one library version on one kind of CPU."""

from __future__ import annotations

import pandas as pd
import pytest

import nodelm_lib as nl
from nodelm_lib.runs.records import check_provenance, record_row


def row(arm: str, seed: int, commit: str, capability: str = "AVX2") -> dict:
    config = nl.config.to_dict(nl.TrainConfig())
    record = nl.RunRecord(config=config, config_hash=f"{arm}{seed}", seed=seed, status="completed",
                          final={"val_loss": 2.0, "test_loss": 2.1},
                          environment={"git_commit": commit, "cpu_name": "AMD EPYC", "cpu_capability": capability})
    return record_row(record, arm=arm)


def test_record_rows_carry_their_commit_and_cpu():
    r = row("gpt", 0, "abc1234", "AVX512")
    assert r["git_commit"] == "abc1234" and r["cpu"] == "AMD EPYC (AVX512)"
    bare = record_row(nl.RunRecord(config=nl.config.to_dict(nl.TrainConfig()), config_hash="x", seed=0))
    assert bare["git_commit"] == "unknown" and bare["cpu"] == "unknown CPU (?)"


def test_a_gpu_run_names_its_gpu_so_runs_of_two_gpu_kinds_are_not_one_provenance():
    def gpu_row(gpu: str) -> dict:
        record = nl.RunRecord(config=nl.config.to_dict(nl.TrainConfig()), config_hash=gpu, seed=0, status="completed",
                              final={"val_loss": 2.0}, environment={"git_commit": "abc1234", "device": "cuda",
                                                                    "device_name": gpu, "cpu_name": "Intel(R) Xeon(R) Processor",
                                                                    "cpu_capability": "AVX512"})
        return record_row(record, arm="gpt")

    assert gpu_row("NVIDIA H200")["cpu"] == "NVIDIA H200 with Intel(R) Xeon(R) Processor (AVX512)"
    with pytest.raises(ValueError, match="2 library versions or CPUs"):
        check_provenance(pd.DataFrame([gpu_row("NVIDIA H200"), gpu_row("NVIDIA H100 80GB HBM3")]))


def test_a_table_of_one_commit_and_cpu_says_so():
    runs = pd.DataFrame([row(a, s, "abc1234") for a in ("gpt", "node") for s in range(3)])
    assert check_provenance(runs) == "all 6 runs by commit abc1234 on AMD EPYC (AVX2)"


def test_a_table_mixing_commits_or_cpus_is_refused_or_flagged():
    runs = pd.DataFrame([row("gpt", s, "abc1234") for s in range(3)] + [row("hybrid", s, "def5678") for s in range(3)])
    with pytest.raises(ValueError, match=r"come from 2 library versions or CPUs: commit abc1234 on AMD EPYC \(AVX2\): "
                                         r"3 runs \(gpt\); commit def5678 on AMD EPYC \(AVX2\): 3 runs \(hybrid\)"):
        check_provenance(runs)
    assert check_provenance(runs, allow_mixed=True).startswith("MIXED provenance: commit abc1234")
    same_commit_other_cpu = pd.DataFrame([row("gpt", 0, "abc1234"), row("gpt", 1, "abc1234", "AVX512")])
    with pytest.raises(ValueError, match="2 library versions or CPUs"):
        check_provenance(same_commit_other_cpu)
    with pytest.raises(ValueError, match=r"lack column\(s\) \['git_commit', 'cpu'\]"):
        check_provenance(runs.drop(columns=["git_commit", "cpu"]))


def test_commits_with_the_same_library_code_are_one_version_and_others_are_not(tmp_path):
    import subprocess

    from nodelm_lib.runs.records import same_library

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    library = tmp_path / "nodelm_lib"
    library.mkdir()
    git("init", "-q")
    commits = []
    for path, text in (("nodelm_lib/a.py", "x = 1\n"), ("README.md", "docs\n"), ("nodelm_lib/a.py", "x = 2\n")):
        (tmp_path / path).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", path)
        commits.append(git("rev-parse", "--short", "HEAD"))
    first, docs_only, code_changed = commits
    assert same_library([first, docs_only], library)
    assert not same_library([first, docs_only, code_changed], library)
    assert not same_library([first, "unknown"], library) and not same_library([first, "0000000"], library)

    runs = pd.DataFrame([row("gpt", 0, first), row("gpt", 1, docs_only)])
    assert check_provenance(runs, library=library) == (
        f"all 2 runs by commits {', '.join(sorted([first, docs_only]))} (the same nodelm_lib code) on AMD EPYC (AVX2)")
    with pytest.raises(ValueError, match="2 library versions or CPUs"):
        check_provenance(pd.DataFrame([row("gpt", 0, first), row("gpt", 1, code_changed)]), library=library)
    with pytest.raises(ValueError, match="2 library versions or CPUs"):  # the same code on two kinds of CPU
        check_provenance(pd.DataFrame([row("gpt", 0, first), row("gpt", 1, docs_only, "AVX512")]), library=library)


def test_without_git_or_a_checkout_commits_are_never_taken_for_one_version(tmp_path, monkeypatch):
    import subprocess

    from nodelm_lib.runs import records

    outside = tmp_path / "installed" / "nodelm_lib"  # a wheel's copy: no checkout above it
    outside.mkdir(parents=True)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert not records.same_library(["abc1234", "def5678"], outside)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert not records.same_library(["abc1234", "def5678"])
