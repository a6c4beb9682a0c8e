"""Profiles by name: params/<notebook>/<profile>.yaml from the checkout, and from an installed wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodelm_lib import profiles

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


def test_make_wheel_needs_no_dev_environment():
    """`make wheel` builds with the interpreter at hand, without creating the venv (torch and all)."""
    done = subprocess.run(["make", "-n", "wheel", "PYTHON=python3"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.splitlines()[0] == "python3 -m pip wheel --no-deps --wheel-dir dist ."
    assert "venv" not in done.stdout and "torch" not in done.stdout
