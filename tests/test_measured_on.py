"""Timing tables name their machine, and a rerun on another machine writes its own beside them
(reporting.measured_on, notebooks 05 and 06)."""

import re
from pathlib import Path

import pytest

from nodelm_lib.reporting.measured_on import committed_machine, machine_slug, measured_on
from nodelm_lib.runs.timing import this_machine

ROOT = Path(__file__).resolve().parents[1]
XEON = "Intel(R) Xeon(R) Processor (AVX512)"
EPYC = "AMD EPYC 7B13 64-Core Processor (AVX2)"


def test_a_machine_becomes_a_file_name_part():
    assert machine_slug(XEON) == "intel-r-xeon-r-processor-avx512"
    assert machine_slug("NVIDIA H200") == "nvidia-h200"
    with pytest.raises(ValueError, match="no letters or digits"):
        machine_slug("(?)")


def test_the_first_measurement_is_the_table_and_names_its_machine(tmp_path):
    where = measured_on(tmp_path, "generation_cpu", machine=XEON)
    assert (where.committed, where.apart, where.suffix) == (None, False, "")
    assert where.name("generation_speed_cpu") == "generation_speed_cpu"
    path = where.write_machine()
    assert path == tmp_path / "generation_cpu_machine.txt"
    assert committed_machine(tmp_path, "generation_cpu") == XEON


def test_a_rerun_on_the_same_kind_of_machine_rewrites_the_table(tmp_path):
    measured_on(tmp_path, "integrators_cpu", machine=XEON).write_machine()
    where = measured_on(tmp_path, "integrators_cpu", machine=XEON)
    assert not where.apart and where.name("integrators_cpu_summary") == "integrators_cpu_summary"
    assert where.describe() == f"timings measured on {XEON}"


def test_a_rerun_on_another_machine_writes_apart_and_leaves_the_committed_machine_file(tmp_path):
    measured_on(tmp_path, "integrators_cpu", machine=XEON).write_machine()
    where = measured_on(tmp_path, "integrators_cpu", machine=EPYC)
    assert where.apart and where.committed == XEON
    assert where.name("integrators_cost_cpu") == "integrators_cost_cpu_on_amd-epyc-7b13-64-core-processor-avx2"
    assert where.write_machine() == tmp_path / "integrators_cpu_on_amd-epyc-7b13-64-core-processor-avx2_machine.txt"
    assert committed_machine(tmp_path, "integrators_cpu") == XEON  # the committed table still names its own
    assert XEON in where.describe() and EPYC in where.describe() and where.suffix in where.describe()


def test_an_empty_machine_file_is_refused_with_what_it_should_hold(tmp_path):
    (tmp_path / "generation_cpu_machine.txt").write_text("\n")
    with pytest.raises(ValueError, match="should name the machine"):
        measured_on(tmp_path, "generation_cpu", machine=XEON)


@pytest.mark.parametrize("table", ["integrators_cpu", "generation_cpu"])
def test_every_committed_timing_table_names_its_machine(table):
    machine = committed_machine(ROOT / "results", table)
    assert machine is not None, f"results/{table}_machine.txt is missing"
    assert re.fullmatch(r".+ \((AVX2|AVX512|DEFAULT|ZVECTOR|SVE\d*)\)|NVIDIA .+", machine), machine


@pytest.mark.slow
def test_notebook_06_on_another_machine_writes_beside_the_committed_tables(tmp_path):
    papermill = pytest.importorskip("papermill")
    results = tmp_path / "results"
    results.mkdir()
    other = "Some Other CPU (AVX2)"
    assert other != this_machine("cpu")
    (results / "generation_smoke_machine.txt").write_text(other + "\n")
    papermill.execute_notebook(str(ROOT / "notebooks" / "06_generation.ipynb"), str(tmp_path / "out.ipynb"),
                               parameters={"work_dir": str(tmp_path), "device": "cpu"}, cwd=str(tmp_path),
                               kernel_name="python3", progress_bar=False)
    suffix = f"_on_{machine_slug(this_machine('cpu'))}"
    written = sorted(p.name for p in results.glob("generation_smoke*"))
    assert written == sorted(["generation_smoke_machine.txt", f"generation_smoke{suffix}.csv",
                              f"generation_smoke{suffix}_machine.txt", f"generation_smoke_samples{suffix}.csv"])
    assert (results / "generation_smoke_machine.txt").read_text() == other + "\n"
    figures = list((tmp_path / "figures").glob("generation_speed_smoke*"))
    assert figures and all(p.stem == f"generation_speed_smoke{suffix}" for p in figures)
