"""Measurements: memory must see live tensors and nothing else; CPU availability is the share
of time a fixed workload runs at its fastest; the CPU description names what torch runs on."""

import math
import re

import pytest
import torch

from nodelm_lib.training import profiling
from nodelm_lib.training.profiling import availability_from_times, cpu_availability, cpu_description, peak_memory_mb, saved_tensor_bytes


def hold_all(n):
    tensors = [torch.ones(1024, 1024) for _ in range(n)]  # 4 MiB each, all alive at once
    return sum(t[0, 0].item() for t in tensors)


def one_at_a_time(n):
    return sum(torch.ones(1024, 1024)[0, 0].item() for _ in range(n))


def test_peak_memory_sees_live_tensors_and_not_freed_ones():
    peak, out = peak_memory_mb(lambda: hold_all(10))
    if math.isnan(peak):
        pytest.skip("no exact CPU peak memory on this platform")
    assert out == 10
    assert 39 <= peak < 48, peak
    again, _ = peak_memory_mb(lambda: hold_all(10))  # memory freed by the first call is not reused silently
    assert 39 <= again < 48, again
    # freed tensors are not counted (10 of them alive at once would be 40 MiB); the least of three
    # tries, because the resident set is the whole process's: another thread's allocation during a
    # try counts too
    assert min(peak_memory_mb(lambda: one_at_a_time(10))[0] for _ in range(3)) < 12


def test_peak_memory_is_not_fooled_by_memory_the_allocator_kept():
    """Tensors freed while glibc served them from its heap leave resident free memory behind;
    a later call reusing it must still count it."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("not glibc")
    libc.mallopt(-3, 256 * 2**20)  # as after a long run: large blocks come from the heap
    big = [torch.ones(1024, 1024) for _ in range(30)]
    pin = torch.ones(16)  # allocated above them: the heap cannot shrink past it
    del big  # 120 MiB of free but resident heap below `pin`
    peak, _ = peak_memory_mb(lambda: hold_all(10))
    del pin
    if math.isnan(peak):
        pytest.skip("no exact CPU peak memory on this platform")
    assert 39 <= peak < 48, peak


FAULTS_PER_STEP = """
import resource, sys, torch
import nodelm_lib as nl
from nodelm_lib.training.profiling import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
model = nl.build_model(nl.ModelConfig(arch="node", vocab_size=256, d_model=128, n_heads=4, max_seq_len=64,
                                      hyper_dim=64, time_hidden=64, time_features=64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, 256, (12, 64))

def step():
    opt.zero_grad(set_to_none=True)
    model(x, x)[1].backward()
    opt.step()

for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4)
"""


def test_keep_freed_memory_stops_the_page_faults_of_a_training_step():
    """A training step frees and reallocates the same large tensors; with glibc's default
    settings many come from fresh mappings that fault on first touch (thousands per step for
    node's hypernetwork), with ``keep_freed_memory`` from memory already resident."""
    import subprocess
    import sys

    if not profiling.keep_freed_memory():
        pytest.skip("not glibc")
    faults = {mode: float(subprocess.run([sys.executable, "-c", FAULTS_PER_STEP, mode], check=True,
                                         capture_output=True, text=True).stdout.split()[-1])
              for mode in ("default", "keep")}
    assert faults["keep"] <= 0.1 * faults["default"] + 50, faults


def test_saved_tensor_bytes_counts_what_backward_keeps():
    x = torch.randn(100, requires_grad=True)
    nbytes, y = saved_tensor_bytes(lambda: (x * x).sum())
    assert nbytes == 2 * 100 * 4  # mul saves both operands
    assert y.requires_grad


def test_availability_is_the_share_of_time_at_the_fastest_speed():
    assert availability_from_times([0.01] * 5) == pytest.approx(1.0)
    # three chunks at full speed and one stalled for 10x: 4 * 0.01 of 0.13 s
    assert availability_from_times([0.01, 0.01, 0.1, 0.01]) == pytest.approx(0.04 / 0.13)
    with pytest.raises(ValueError, match="positive chunk time"):
        availability_from_times([])


def test_cpu_availability_measures_chunks_for_the_time_asked():
    res = cpu_availability(seconds=0.3, chunk_s=0.01)
    assert 0 < res["availability"] <= 1
    assert res["chunks"] >= 2 and res["best_ms"] <= res["median_ms"]
    assert 0.3 <= res["seconds"] < 20  # stops at the first chunk past 0.3 s (a stalled VM can stretch one)
    with pytest.raises(ValueError, match="seconds=0"):
        cpu_availability(seconds=0)


def test_cli_prints_the_availability(capsys):
    from nodelm_lib.cli import main

    assert main(["cpu", "--seconds", "0.2"]) == 0
    # 1.00 when every chunk of so short a probe ran at the same speed (one stalled chunk can fill 0.2 s)
    assert re.match(r"cpu availability (0\.\d\d|1\.00) over \d", capsys.readouterr().out)


def test_cpu_description_names_the_cpu_and_torch_kernels(monkeypatch):
    desc = cpu_description()
    assert desc["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert desc["cpu_count"] >= 1 and isinstance(desc["cpu_name"], str) and desc["cpu_name"]

    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/cpuinfo")

    monkeypatch.setattr(profiling, "open", no_proc, raising=False)  # not Linux: platform's answer instead
    monkeypatch.setattr(profiling.platform, "processor", lambda: "some arm chip")
    assert cpu_description()["cpu_name"] == "some arm chip"
