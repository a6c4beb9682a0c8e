"""``bench/gpu_lease.sh`` without a GPU: the steps it is given are checked before anything runs,
and CUDA MPS, when a step starts it, is quit at the end (the machine left as it was found).
``nvidia-smi`` and ``nvidia-cuda-mps-control`` are stubs on PATH that log their calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_lease.sh"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def lease(tmp_path: Path, steps: str, mps_starts: bool = True) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The script run with ``steps`` in a copy of its folder layout (bench/ under a scratch root),
    with the GPU tools stubbed; returns the process, its OUT folder and the stubs' call log."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    root, bin_, out, calls = tmp_path / "repo", tmp_path / "bin", tmp_path / "out", tmp_path / "calls.log"
    for folder in (root / "bench", bin_, out):
        folder.mkdir(parents=True)
    shutil.copy(SCRIPT, root / "bench" / SCRIPT.name)
    stub(bin_, "nvidia-smi", f'echo "nvidia-smi $*" >> {calls}; echo "Stub GPU, 1 MiB, 0"\n')
    # each call logged with its arguments and what it read on stdin (how the script sends "quit")
    stub(bin_, "nvidia-cuda-mps-control", f'echo "mps-control $* | $(cat)" >> {calls}\n' + ("" if mps_starts else "exit 1\n"))
    stub(bin_, "python3", 'echo "torch stub"\n')
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "bench/gpu_lease.sh", str(out), "60", steps], cwd=root, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    return done, out, calls


def test_a_misspelt_step_stops_the_script_before_anything_runs(tmp_path):
    done, out, calls = lease(tmp_path, "tests,mspd")
    assert done.returncode == 2
    assert "unknown step 'mspd'; the steps are tests,scan,steps,many,kernels,manynode,mps,mpsd,chunk" in done.stderr
    assert not calls.exists() and not (out / "gpu.txt").exists()


def test_mps_started_by_a_step_is_started_once_and_quit_at_the_end(tmp_path):
    done, out, calls = lease(tmp_path, "mpsd,mps")  # both start it; the benchmark (a stub here) runs under it
    assert done.returncode == 0, done.stderr
    summary = (out / "gpu.txt").read_text()
    assert "mpsd: CUDA MPS started" in summary and "mps: exit 0" in summary
    mps = [line for line in calls.read_text().splitlines() if line.startswith("mps-control")]
    assert mps == ["mps-control -d | ", "mps-control  | quit"]  # started as a daemon once, then told to quit


def test_mps_that_does_not_start_is_reported_and_not_quit(tmp_path):
    done, out, calls = lease(tmp_path, "mpsd", mps_starts=False)
    assert done.returncode == 0, done.stderr
    assert "mpsd: the MPS control daemon did not start" in (out / "gpu.txt").read_text()
    assert [line for line in calls.read_text().splitlines() if line.startswith("mps-control")] == ["mps-control -d | "]
