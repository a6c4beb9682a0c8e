"""The build files agree with each other.

- environment.yml (conda) lists the same runtime + dev dependencies as pyproject.toml,
  with the same lower bounds;
- pyproject asks for torch as a range that the Makefile's pinned wheel satisfies, so a
  pre-installed torch (pinned CPU wheel, CUDA build, Colab) is never replaced by pip;
- the Makefile has the documented targets, and one per notebook in notebooks/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
ENVIRONMENT = ROOT / "environment.yml"
MAKEFILE = ROOT / "Makefile"

# conda-forge name -> pip (PyPI) name, where they differ
CONDA_TO_PIP = {"pytorch": "torch", "pytorch-cpu": "torch", "pytorch-gpu": "torch",
                "matplotlib-base": "matplotlib"}
# conda entries that are the toolchain, not dependencies of the package
CONDA_TOOLCHAIN = {"python", "pip"}

PINNED_TORCH_FALLBACK = "2.13.0"  # used only if the Makefile's TORCH_SPEC can't be read
REQUIRED_TARGETS = ("help", "setup", "test", "reproduce", "lab", "clean", "distclean",
                    "tables", "wheel", "docs", "docs-notebooks")

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        tomllib = pytest.importorskip("tomli", reason="Python 3.10 needs tomli to read TOML")
    with path.open("rb") as f:
        return tomllib.load(f)


def _load_yaml(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def _norm(name: str) -> str:
    """PEP 503-style name normalisation: case, and runs of - _ . are equivalent."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _parse(spec: str) -> tuple[str, str]:
    """'numpy >=1.24,<3' or 'conda-forge::numpy>=1.24' -> ('numpy', '>=1.24,<3')."""
    spec = spec.split("#", 1)[0].split(";", 1)[0].strip()
    spec = spec.split("::", 1)[-1]  # conda channel prefix
    m = _REQ.match(spec)
    if not m:
        raise ValueError(f"cannot parse requirement {spec!r}")
    return _norm(m.group(1)), m.group(3).replace(" ", "")


def _lower_bound(constraint: str) -> str | None:
    """The version in a '>=' clause (None when there is none)."""
    for clause in constraint.split(","):
        if clause.startswith(">="):
            return clause[2:]
    return None


def _pyproject_deps() -> dict[str, str | None]:
    project = _load_toml(PYPROJECT)["project"]
    reqs = list(project.get("dependencies", []))
    reqs += list(project.get("optional-dependencies", {}).get("dev", []))
    out: dict[str, str | None] = {}
    for r in reqs:
        name, constraint = _parse(r)
        out[name] = _lower_bound(constraint)
    return out


def _environment_deps() -> dict[str, str | None]:
    env = _load_yaml(ENVIRONMENT)
    out: dict[str, str | None] = {}
    for item in env.get("dependencies", []):
        if isinstance(item, dict):  # the `pip:` sub-list: PyPI names
            for r in item.get("pip", []) or []:
                r = str(r).strip()
                if r.startswith("-") or r.startswith(".") or "://" in r:
                    continue  # -e ., -r file, URLs: not a named dependency
                name, constraint = _parse(r)
                out[name] = _lower_bound(constraint)
            continue
        name, constraint = _parse(str(item))
        if name in CONDA_TOOLCHAIN:
            continue
        # conda's single '=' means a version prefix; only '>=' counts as a lower bound
        out[CONDA_TO_PIP.get(name, name)] = _lower_bound(constraint)
    return out


def test_environment_yml_matches_pyproject():
    py = _pyproject_deps()
    env = _environment_deps()
    problems = []
    only_py = sorted(set(py) - set(env))
    only_env = sorted(set(env) - set(py))
    if only_py:
        problems.append("environment.yml is missing (in pyproject.toml): "
                        + ", ".join(f"{n}>={py[n]}" if py[n] else n for n in only_py))
    if only_env:
        problems.append("pyproject.toml (dependencies + [dev]) is missing (in environment.yml): "
                        + ", ".join(f"{n}>={env[n]}" if env[n] else n for n in only_env))
    for n in sorted(set(py) & set(env)):
        if py[n] != env[n]:
            problems.append(f"{n}: lower bound {py[n]!r} in pyproject.toml but "
                            f"{env[n]!r} in environment.yml")
    assert not problems, "\n".join(problems)


def test_environment_yml_is_conda_forge_python310():
    env = _load_yaml(ENVIRONMENT)
    assert env.get("name") == "nodelm"
    assert "conda-forge" in env.get("channels", [])
    specs = dict(_parse(str(d)) for d in env["dependencies"] if not isinstance(d, dict))
    assert "pip" in specs
    assert _lower_bound(specs.get("python", "")) == "3.10", specs.get("python")


def _makefile_torch_pin() -> str:
    m = re.search(r"^TORCH_SPEC\s*\?=\s*torch\s*==\s*(\S+)\s*$", MAKEFILE.read_text(), re.M)
    return m.group(1) if m else PINNED_TORCH_FALLBACK


def test_torch_requirement_is_a_range_the_pinned_wheel_satisfies():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    project = _load_toml(PYPROJECT)["project"]
    torch_reqs = [r for r in project["dependencies"] if _parse(r)[0] == "torch"]
    assert len(torch_reqs) == 1, f"expected one torch requirement, got {torch_reqs}"
    constraint = _parse(torch_reqs[0])[1]
    assert "==" not in constraint and "===" not in constraint and "~=" not in constraint, (
        f"pyproject pins torch ({torch_reqs[0]!r}); it must be a range so that the torch "
        "installed first by `make setup` (CPU pin, CUDA build, Colab) is kept")
    assert _lower_bound(constraint), f"torch requirement {torch_reqs[0]!r} has no '>=' bound"
    pin = _makefile_torch_pin()
    assert Version(pin) in SpecifierSet(constraint), (
        f"the Makefile's pinned torch {pin} does not satisfy pyproject's {torch_reqs[0]!r}")


# ------------------------------------------------------------------ Makefile targets

def _make_targets() -> set[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("GNU make is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "MAKEOVERRIDES")}
    # -p prints the database; -q runs nothing; -r/-R leave out the built-in rules.
    proc = subprocess.run([make, "-qprR", "-f", str(MAKEFILE)], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    if "GNU Make" not in proc.stdout:
        pytest.skip("`make` is not GNU make")
    # The "# Files" section holds one block per file, separated by blank lines:
    #   [# Not a target:]  name: prereqs  #-comments  <TAB>recipe lines
    # A target is a name with a recipe or prerequisites (a bare .PHONY entry is not).
    targets = set()
    files = proc.stdout.split("\n# Files\n", 1)[-1]
    for block in files.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if not lines or lines[0].startswith("# Not a target:"):
            continue
        m = re.match(r"^([A-Za-z0-9_.%/-][^\s:=#]*):(?!=)(.*)$", lines[0])
        if not m:
            continue
        has_prereqs = bool(m.group(2).strip().lstrip(":").strip())
        has_recipe = any(line.startswith("\t") for line in lines[1:])
        if has_prereqs or has_recipe:
            targets.add(m.group(1))
    return targets


def test_makefile_declares_targets():
    targets = _make_targets()
    missing = [t for t in REQUIRED_TARGETS if t not in targets]
    assert not missing, f"Makefile has no target(s): {', '.join(missing)}"


def test_makefile_has_a_target_per_notebook():
    targets = _make_targets()
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    missing = [nb for nb in notebooks if nb not in targets]
    assert not missing, (
        "notebooks without a Makefile target (add them to NOTEBOOKS := ...): "
        + ", ".join(missing))


def test_a_test_worker_takes_only_its_share_of_the_cores():
    """Under pytest-xdist (``make test``), the workers' torch threads together fit the cores, and
    the processes a test starts inherit the same share (conftest.py)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers == 1:
        pytest.skip("one test process: it keeps torch's own thread count")
    import torch

    cores = len(os.sched_getaffinity(0))
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
    assert torch.get_num_threads() * workers <= max(cores, workers)
