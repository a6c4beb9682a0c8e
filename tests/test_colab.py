"""The Colab path without Colab: each notebook's install cell under a simulated ``google.colab``,
the wheel a user uploads, and notebooks that write only under their ``work_dir``."""

import json
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest

import nodelm_lib as nl
from nodelm_lib.workspace import ENV_VAR, repository_root, workspace

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def install_cell(notebook: Path) -> str:
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    return "".join(cells[0]["source"])


@pytest.fixture
def on_colab(monkeypatch):
    """``google.colab`` importable, and pip replaced by a recorder of its command lines."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.delenv("NODELM_SOURCE", raising=False)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw)))
    return calls


def test_every_notebook_has_the_same_install_cell():
    cells = {nb.name: install_cell(nb) for nb in NOTEBOOKS}
    assert len(cells) == len(NOTEBOOKS) >= 8 and len(set(cells.values())) == 1, sorted(cells)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_without_a_source_stops_with_what_to_set(notebook, on_colab):
    with pytest.raises(RuntimeError, match=r"Set NODELM_SOURCE in this cell .*git\+https://github.com/<you>/nodelm"
                                           r".*make wheel"):
        exec(install_cell(notebook), {})
    assert on_colab == []  # stopped before pip


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_installs_the_given_source(notebook, on_colab, monkeypatch, tmp_path):
    wheel = tmp_path / "nodelm-0.2.0-py3-none-any.whl"
    source = install_cell(notebook).replace('NODELM_SOURCE = ""', f'NODELM_SOURCE = {str(wheel)!r}', 1)
    exec(source, {})
    monkeypatch.setenv("NODELM_SOURCE", str(ROOT))  # a directory, given through the environment
    exec(install_cell(notebook), {})
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    # each source installed with its dependencies, then over an installed nodelm of the same version
    assert [cmd for cmd, _ in on_colab] == [cmd for src in (str(wheel), str(ROOT))
                                           for cmd in (pip + [src], pip + ["--no-deps", "--force-reinstall", src])]
    assert all(kw == {"check": True} for _, kw in on_colab)  # a failed pip stops the notebook


def test_install_cell_does_nothing_outside_colab(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    exec(install_cell(NOTEBOOKS[0]), {})
    assert calls == []


def test_wheel_holds_the_library_only(tmp_path):
    """What `make wheel` builds: the package and its metadata, no notebooks, tests or results."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(tmp_path), str(ROOT)],
                   check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("nodelm-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nodelm_lib/workspace.py" in names and "nodelm_lib/models/gpt.py" in names
    assert all(n.startswith(("nodelm_lib/", "nodelm-")) for n in names), names


def test_workspace_default_and_errors(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert repository_root() == ROOT  # the tests import the checkout (editable install)
    assert workspace().root == ROOT
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "w"))
    ws = workspace()
    assert ws.root == tmp_path / "w" and ws.root.is_dir()
    # a new work folder is ready to write into (notebook 05 once failed on one: no results/)
    assert ws.results.is_dir() and ws.figures.is_dir() and ws.checkpoints.is_dir()
    assert ws.runs("cpu") == tmp_path / "w" / "results" / "runs" / "cpu"
    assert ws.rel(ws.figures / "a.png") == "figures/a.png" and ws.rel("/elsewhere/x") == "/elsewhere/x"
    with pytest.raises(ValueError, match=r"work_dir must be an absolute path .*'results'"):
        workspace("results")


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*") if p.is_file()}


def test_notebook_writes_only_under_work_dir(tmp_path):
    """Notebook 01 (smoke), run by papermill from an unrelated directory: every output lands
    under work_dir, none in the current directory or the repository."""
    papermill = pytest.importorskip("papermill")
    cwd, work = tmp_path / "somewhere", tmp_path / "work"
    cwd.mkdir()
    repo_outputs = {d: _files(ROOT / d) for d in ("results", "figures") if (ROOT / d).is_dir()}
    started = time.time()
    papermill.execute_notebook(str(ROOT / "notebooks" / "01_gradient_flow.ipynb"), str(tmp_path / "out.ipynb"),
                               parameters={"work_dir": str(work), "max_steps": 20, "eval_interval": 10},
                               cwd=str(cwd), kernel_name="python3", progress_bar=False)
    written = _files(work)
    assert {"results/gradient_flow_smoke.csv", "results/gradient_flow_smoke_verdict.csv",
            "figures/gradient_flow_smoke.png"} <= set(written), sorted(written)
    assert all(t >= started for t in written.values())
    assert not any(cwd.iterdir())
    for d, before in repo_outputs.items():
        after = _files(ROOT / d)
        changed = sorted(f for f, t in after.items() if t >= started and before.get(f) != t)
        assert changed == [], f"{d}/ changed by a notebook told to write under {work}: {changed}"


def test_every_notebook_trains_through_the_run_store():
    """A notebook rerun after a disconnect must read finished work back: none calls nl.train itself."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert "nl.train(" not in code, f"{path.name} trains outside the run store (use nl.run / nl.sweep)"


def test_a_notebook_rerun_reads_its_runs_back_and_trains_nothing(tmp_path):
    """Notebook 01 (smoke) run twice into one work_dir, as after a Colab disconnect: the second run
    rewrites no record or checkpoint and gives the same table."""
    papermill = pytest.importorskip("papermill")
    work = tmp_path / "work"
    params = {"work_dir": str(work), "max_steps": 20, "eval_interval": 10}

    def execute(name):
        papermill.execute_notebook(str(ROOT / "notebooks" / "01_gradient_flow.ipynb"), str(tmp_path / name),
                                   parameters=params, cwd=str(tmp_path), kernel_name="python3", progress_bar=False)
        return (work / "results" / "gradient_flow_smoke.csv").read_text()

    first = execute("first.ipynb")
    trained = {f: t for f, t in _files(work).items() if f.startswith(("results/runs/smoke/", "checkpoints/runs/smoke/"))}
    records = [f for f in trained if f.startswith("results/") and "/evaluations/" not in f]
    evaluations = [f for f in trained if "/evaluations/" in f]  # the hybrid's control effect
    assert len(records) == 2 and len(evaluations) == 1 and sum(f.endswith(".pt") for f in trained) == 2, sorted(trained)
    assert execute("again.ipynb") == first
    assert {f: t for f, t in _files(work).items() if f in trained} == trained  # nothing trained or written again


def test_workspace_is_exported():
    assert nl.workspace is workspace and isinstance(nl.workspace(str(ROOT)), nl.Workspace)


def parameters_source(notebook: Path) -> str:
    """The source of a notebook's one cell tagged ``parameters``."""
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    (params,) = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    return "".join(params["source"])


def notebook_parameters(notebook: Path) -> dict:
    """The names and default values of a notebook's parameters cell."""
    namespace: dict = {}
    exec(parameters_source(notebook), namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("__")}


def load_profile(path: Path) -> dict:
    """A profile's values, refusing a key set twice (plain YAML keeps the last one silently)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"{path.name} sets {twice} twice", node.start_mark)
        return loader.construct_mapping(node, deep=deep)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(path.read_text(), Loader=UniqueKeys)


def test_a_profile_setting_a_key_twice_is_refused(tmp_path):
    import yaml

    path = tmp_path / "colab.yaml"
    path.write_text("profile: d=128, depth 4\nseeds: [0]\nprofile: colab\n")
    with pytest.raises(yaml.constructor.ConstructorError, match=r"\['profile'\] twice"):
        load_profile(path)
    path.write_text("profile: colab\nseeds: [0]\n")
    assert load_profile(path) == {"profile": "colab", "seeds": [0]}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_profiles_set_only_parameters_the_notebook_has(notebook):
    """papermill passes unknown names silently: a misspelt key would leave the default in place."""
    names = notebook_parameters(notebook)
    assert names["device"] == "auto" and names["work_dir"] is None and names["dtype"] == "float32"
    profiles = sorted((ROOT / "params" / notebook.stem).glob("*.yaml"))
    assert {p.stem for p in profiles} >= {"cpu", "gpu", "colab"}
    for path in profiles:
        values = load_profile(path)
        unknown = sorted(set(values) - set(names))
        assert not unknown, f"{path.relative_to(ROOT)} sets {unknown}, not parameters of {notebook.name}"
        assert values["profile"] == path.stem
        if path.stem in ("gpu", "colab"):
            assert values["device"] == "auto"
        if path.stem == "colab":  # a T4: no bf16 units
            assert values["dtype"] == "float32"
        if path.stem == "gpu" and "compile_model" in names:
            assert values["dtype"] == "bfloat16" and values["compile_model"] is True


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_name_of_the_parameters_cell(notebook):
    """papermill reads the cell line by line and skips a line with two '=' (one in a comment, say):
    that name would be missing from `papermill --help-notebook`, with a warning at every run."""
    translators = pytest.importorskip("papermill.translators")
    parsed = [p.name for p in translators.PythonTranslator.inspect({"source": parameters_source(notebook)})]
    assert sorted(parsed) == sorted(notebook_parameters(notebook))
