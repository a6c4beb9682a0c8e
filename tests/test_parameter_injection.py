"""A notebook's parameter values are injected as lines of code (``name = value``), by papermill and
by ``run_notebook_here``: a key that is not a declared parameter, and above all one that holds code,
is refused before any cell runs, from a profile file and from ``parameters`` alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodelm_lib.experiments import profiles
from nodelm_lib.experiments.notebook_here import injected_cell, run_notebook_here
from nodelm_lib.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def code_key(marker: Path) -> str:
    """A key that assigns the declared parameters x and y around a line that creates ``marker``."""
    return f'x\nopen("{marker}", "w").close()\ny'


def notebook(folder: Path) -> Path:
    """A two-parameter notebook whose cells leave files behind when they run."""
    def cell(source: str, tags=()) -> dict:
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source, "outputs": [],
                "execution_count": None}

    ran = folder / "ran"
    cells = [cell(f"open({str(folder / 'first_cell_ran')!r}, 'w').close()"),
             cell("x = 1\ny = 2", tags=["parameters"]),
             cell(f"open({str(ran)!r}, 'w').write(str((x, y)))")]
    path = folder / "tiny.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def a_profile(params: Path, monkeypatch, text: str, notebook_name: str = "tiny", name: str = "cpu") -> None:
    (params / notebook_name).mkdir(parents=True, exist_ok=True)
    (params / notebook_name / f"{name}.yaml").write_text(text)
    monkeypatch.setattr(profiles, "params_dir", lambda: params)


def test_declared_parameters_run(tmp_path):
    path = notebook(tmp_path)
    assert run_notebook_here(path, parameters={"y": 5}) == 0
    assert (tmp_path / "ran").read_text() == "(1, 5)"


def test_a_parameter_key_holding_code_is_refused_before_any_cell_runs(tmp_path):
    path, marker = notebook(tmp_path), tmp_path / "injected_code_ran"
    with pytest.raises(ValueError, match=r"parameter name 'x\\nopen\(.*' is not valid; a parameter is a Python identifier"):
        run_notebook_here(path, parameters={code_key(marker): 1})
    assert not marker.exists() and not (tmp_path / "first_cell_ran").exists()


def test_a_profile_key_holding_code_is_refused_before_any_cell_runs(tmp_path, monkeypatch):
    path, marker = notebook(tmp_path), tmp_path / "injected_code_ran"
    a_profile(tmp_path / "params", monkeypatch, json.dumps({code_key(marker): 1}))  # JSON is YAML
    with pytest.raises(ValueError, match=r"cpu.yaml: parameter name 'x\\nopen\(.*' is not valid"):
        run_notebook_here(path, "cpu")
    assert not marker.exists() and not (tmp_path / "first_cell_ran").exists()


def test_an_undeclared_key_is_refused_before_any_cell_runs(tmp_path, monkeypatch):
    path = notebook(tmp_path)
    a_profile(tmp_path / "params", monkeypatch, "x: 3\nz: 4\n")
    with pytest.raises(ValueError, match=r"tiny.ipynb \[cpu\] sets 'z', which the notebook's parameters cell does not "
                                         r"define; its parameters: x, y"):
        run_notebook_here(path, "cpu")
    assert not (tmp_path / "first_cell_ran").exists()


def test_the_injected_cell_refuses_a_name_that_is_not_an_identifier(tmp_path):
    assert injected_cell({"x": 1, "y": "a"}) == "# Parameters\nx = 1\ny = 'a'\n"
    for bad in (code_key(tmp_path / "m"), "1x", "class", "a b", 3):
        with pytest.raises(ValueError, match="is not valid; a parameter is a Python identifier"):
            injected_cell({bad: 1})


def test_check_params_refuses_what_papermill_would_run(tmp_path):
    """``make <nb>`` runs ``check-params`` on the file before papermill injects it."""
    path, marker = notebook(tmp_path), tmp_path / "injected_code_ran"

    def check(text: str) -> subprocess.CompletedProcess:
        params = tmp_path / "p.yaml"
        params.write_text(text)
        return subprocess.run([sys.executable, "-m", "nodelm_lib", "check-params", str(path), str(params)],
                              capture_output=True, text=True)

    ok = check("x: 3\n")
    assert ok.returncode == 0 and "1 parameter(s) of tiny.ipynb" in ok.stdout
    bad = check(json.dumps({code_key(marker): 1}))
    assert bad.returncode == 2 and "is not a valid" not in bad.stderr and "a parameter is a Python identifier" in bad.stderr
    assert check("x: 1\nx: 2\n").returncode == 2  # set twice
    assert "sets 'w'" in check("w: 1\n").stderr
    assert not marker.exists()


def test_the_makefile_checks_a_profile_before_papermill_runs_it():
    rule = (ROOT / "Makefile").read_text()
    for papermill in ("$(VENV)/bin/papermill notebooks/$*.ipynb", "$(VENV)/bin/papermill notebooks/$$nb.ipynb"):
        before = rule[: rule.index(papermill)]
        assert "nodelm_lib check-params" in before[before.rindex("\n\n"):], papermill


def test_every_shipped_profile_passes_the_check():
    for folder in sorted((ROOT / "params").iterdir()):
        for path in sorted(folder.glob("*.yaml")):
            profiles.check_parameters_file(ROOT / "notebooks" / f"{folder.name}.ipynb", path)


def test_a_store_profile_must_name_a_profile_not_a_path(tmp_path, monkeypatch):
    params = tmp_path / "params"
    a_profile(params, monkeypatch, "x: 1\n", name="cpu")
    a_profile(params, monkeypatch, "store_profile: cpu\n", name="wide")
    assert profiles.notebook_store("tiny", "wide", tmp_path) == tmp_path / "results" / "runs" / "cpu"
    a_profile(params, monkeypatch, "store_profile: ../../../../tmp/x\n", name="escape")
    with pytest.raises(ValueError, match=r"store_profile='../../../../tmp/x' is not valid; it names the run store this "
                                         r"profile shares, a folder under results/runs"):
        profiles.notebook_store("tiny", "escape", tmp_path)


@pytest.mark.parametrize("name", ["../../tmp/x", "a/b", "..", ".", "", None])
def test_a_run_store_is_a_folder_name_under_results_runs(tmp_path, name):
    with pytest.raises(ValueError, match="is not valid; it is a profile's name"):
        Workspace(tmp_path).runs(name)
    assert Workspace(tmp_path).runs("cpu_wide") == tmp_path / "results" / "runs" / "cpu_wide"
