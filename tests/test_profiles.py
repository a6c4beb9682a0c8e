"""Profiles by name: params/<notebook>/<profile>.yaml from the checkout, and from an installed wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodelm_lib.experiments import profiles

ROOT = Path(__file__).resolve().parents[1]


def test_a_profile_is_its_file():
    values = profiles.load_profile("02_seed_comparison", "colab")
    assert values == yaml.safe_load((ROOT / "params" / "02_seed_comparison" / "colab.yaml").read_text())
    assert values["profile"] == "colab"
    assert profiles.profiles("01_gradient_flow") == ["colab", "cpu", "gpu"]
    assert "06_generation" in profiles.notebooks()


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"notebook '01_gradient_flow' has no profile 'colba'; choose one of "
                                         r"'colab', 'cpu', 'gpu' \(or 'smoke': the parameters cell's own values\)"):
        profiles.load_profile("01_gradient_flow", "colba")
    with pytest.raises(ValueError, match=r"no profiles for notebook '01_gradient'; notebooks with profiles: 01_gradient_flow"):
        profiles.load_profile("01_gradient", "cpu")


def test_apply_sets_a_notebooks_parameters_and_refuses_unknown_ones():
    from test_colab import notebook_parameters

    namespace = notebook_parameters(ROOT / "notebooks" / "01_gradient_flow.ipynb")
    assert profiles.apply_profile(dict(namespace), "01_gradient_flow") == {}  # smoke: the cell itself
    namespace["profile"] = "colab"
    values = profiles.apply_profile(namespace, "01_gradient_flow")
    assert values and all(namespace[k] == v for k, v in values.items()) and namespace["dataset"] == "wikitext2"
    with pytest.raises(ValueError, match=r"profile 'cpu' of '01_gradient_flow' sets \['batch_size'.*not parameters"):
        profiles.apply_profile({"profile": "cpu"}, "01_gradient_flow")


def test_a_key_set_twice_is_refused(tmp_path, monkeypatch):
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "cpu.yaml").write_text("profile: cpu\nseeds: [0]\nprofile: colab\n")
    monkeypatch.setattr(profiles, "params_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match=r"cpu.yaml: sets \['profile'\] twice"):
        profiles.load_profile("nb", "cpu")


def test_a_profile_loads_by_name_from_an_installed_wheel(tmp_path):
    """What a Colab notebook has: nodelm installed from the wheel `make wheel` builds, no checkout."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(tmp_path), str(ROOT)],
                   check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("nodelm-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path)
    code = ("import json, nodelm_lib; from nodelm_lib import profiles; "
            "print(json.dumps([nodelm_lib.__file__, profiles.load_profile('02_seed_comparison', 'colab')]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    where, values = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(where).is_relative_to(site)  # the installed copy, not the checkout
    assert values == profiles.load_profile("02_seed_comparison", "colab")
    # the compiled CPU scan's source travels with the package (models/scan_cpu.py builds from it)
    assert (Path(where).parent / "models" / "scan_cpu.cpp").read_text() == (ROOT / "nodelm_lib/models/scan_cpu.cpp").read_text()


def test_make_wheel_needs_no_dev_environment():
    """`make wheel` builds with the interpreter at hand, without creating the venv (torch and all)."""
    done = subprocess.run(["make", "-n", "wheel", "PYTHON=python3"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.splitlines()[0] == "python3 -m pip wheel --no-deps --wheel-dir dist ."
    assert "venv" not in done.stdout and "torch" not in done.stdout


INSTALL_CELL = 'NODELM_SOURCE = ""\nimport os, sys\n'
PARAMETERS_CELL = '# Parameters (papermill overrides these)\nprofile = "smoke"\nlr_seeds = [100]\nwidths: list = [16]\n'


def test_a_misspelt_papermill_parameter_is_refused_with_the_likely_name():
    injected = '# Parameters\nprofile = "cpu"\nlr_seed = [1]\n'
    with pytest.raises(ValueError, match=r"papermill set 'lr_seed' \(did you mean 'lr_seeds'\?\), which this notebook's "
                                         r"parameters cell does not define; its parameters: NODELM_SOURCE, lr_seeds, profile, widths"):
        profiles.check_injected(["", INSTALL_CELL, PARAMETERS_CELL, injected, "import nodelm_lib as nl"])
    with pytest.raises(ValueError, match=r"'zzz'(?! \(did)"):  # nothing close: no guess
        profiles.check_injected([PARAMETERS_CELL, '# Parameters\nzzz = 1\n'])


def test_known_papermill_parameters_and_hand_runs_pass():
    profiles.check_injected(["", INSTALL_CELL, PARAMETERS_CELL, '# Parameters\nprofile = "cpu"\nwidths = [64]\n'])
    profiles.check_injected(["", INSTALL_CELL, PARAMETERS_CELL, "%matplotlib inline\nx = 1"])  # no injected cell
    profiles.check_injected([])


def test_every_notebook_checks_its_injected_parameters_and_every_profile_passes_the_check():
    """Each notebook calls use_profile (check_injected, then its profile) right after its imports,
    naming itself, and no profile file sets a name its notebook lacks (the check would stop `make <notebook> PROFILE=...` there)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        first = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
        following = next(c for c in cells[first + 1:] if c["cell_type"] == "code")
        assert f'nl.profiles.use_profile(globals(), In, "{path.stem}")' in "".join(following["source"]), path.name
        history = ["".join(c["source"]) for c in cells[: first + 1] if c["cell_type"] == "code"]
        folder = ROOT / "params" / path.stem
        for profile in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            values = yaml.safe_load(profile.read_text())
            injected = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())
            profiles.check_injected(history + [injected])


def test_a_profile_named_in_the_parameters_cell_sets_what_papermill_did_not(capsys):
    from test_colab import notebook_parameters

    namespace = notebook_parameters(ROOT / "notebooks" / "02_seed_comparison.ipynb")
    cells = ["", INSTALL_CELL, "# Parameters (papermill overrides these)\n" + "".join(f"{k} = {v!r}\n" for k, v in namespace.items())]
    smoke = dict(namespace)
    assert profiles.use_profile(smoke, cells, "02_seed_comparison") == {} and smoke == namespace  # smoke: the cell

    by_hand = {**namespace, "profile": "colab"}  # on Colab: the profile named in the parameters cell
    applied = profiles.use_profile(by_hand, cells, "02_seed_comparison")
    assert applied == profiles.load_profile("02_seed_comparison", "colab")
    assert all(by_hand[k] == v for k, v in applied.items())
    assert "profile 'colab': " in capsys.readouterr().out

    injected = '# Parameters\nprofile = "colab"\nworkers = 7\nseeds = [9]\n'  # papermill -p values
    by_papermill = {**namespace, "profile": "colab", "workers": 7, "seeds": [9]}
    applied = profiles.use_profile(by_papermill, cells + [injected], "02_seed_comparison")
    assert by_papermill["workers"] == 7 and by_papermill["seeds"] == [9]  # papermill's values win
    assert "workers" not in applied and by_papermill["d_model"] == applied["d_model"]
    with pytest.raises(ValueError, match="'worker' \\(did you mean 'workers'\\?\\)"):
        profiles.use_profile(dict(by_papermill), cells + ['# Parameters\nworker = 1\n'], "02_seed_comparison")


def test_papermill_stops_a_notebook_at_a_misspelt_parameter(tmp_path):
    """The real thing: papermill's injected cell and IPython's `In` in a kernel."""
    import nbformat
    import papermill

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("alpha = 1  # the parameters")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("from nodelm_lib import profiles\nprofiles.check_injected(In)\nprint(alpha)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "nb.ipynb"
    nbformat.write(nb, source)
    done = papermill.execute_notebook(str(source), str(tmp_path / "ok.ipynb"), parameters={"alpha": 2},
                                      progress_bar=False, cwd=str(tmp_path), kernel_name="python3")
    assert done.cells[-1].outputs[0]["text"] == "2\n"
    with pytest.raises(papermill.PapermillExecutionError, match=r"'alpah' \(did you mean 'alpha'\?\)"):
        papermill.execute_notebook(str(source), str(tmp_path / "bad.ipynb"), parameters={"alpah": 2},
                                   progress_bar=False, cwd=str(tmp_path), kernel_name="python3")

