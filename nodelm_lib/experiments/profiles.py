"""A notebook's profiles by name: ``params/<notebook>/<profile>.yaml``, from a checkout or a wheel.

    values = nl.profiles.load_profile("02_seed_comparison", "colab")
    nl.profiles.use_profile(globals(), In, "02_seed_comparison")  # in a notebook, after its imports

The files live in ``params/`` at the repository root (papermill reads them there: ``make 02
PROFILE=cpu``). The package reaches them through the link ``nodelm_lib/params -> ../params``,
which also ships them in the wheel (``pyproject.toml``'s package data), so that a notebook on
Colab, with nodelm installed from a wheel and no checkout, loads a profile by name instead of
having its ~35 values typed into the parameters cell. ``smoke`` is no file: it is each notebook's
parameters cell itself.
"""

from __future__ import annotations

import ast
import difflib
import json
import keyword
import re
from pathlib import Path
from typing import Any, Iterable, MutableMapping

import yaml

from nodelm_lib.config import UniqueKeyLoader

SMOKE = "smoke"


def params_dir() -> Path:
    """Where the profiles are: the package's ``params`` (the link in a checkout, the copy in a
    wheel), else the checkout's own ``params/`` (a checkout whose file system kept no link)."""
    shipped = Path(__file__).resolve().parents[1] / "params"
    if shipped.is_dir():
        return shipped
    from nodelm_lib.workspace import repository_root

    root = repository_root()
    if root is not None and (root / "params").is_dir():
        return root / "params"
    raise FileNotFoundError(f"no profiles: neither {shipped} nor a checkout's params/ exists; reinstall nodelm "
                            "from a wheel built by `make wheel` (it ships them)")


def notebooks() -> list[str]:
    """The notebooks that have profiles (their file stems)."""
    return sorted(p.name for p in params_dir().iterdir() if p.is_dir())


def profiles(notebook: str) -> list[str]:
    """The profile names of ``notebook`` (``smoke`` is its parameters cell, no file)."""
    folder = params_dir() / notebook
    if not folder.is_dir():
        raise ValueError(f"no profiles for notebook {notebook!r}; notebooks with profiles: {', '.join(notebooks())}")
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_profile(notebook: str, profile: str) -> dict[str, Any]:
    """The parameter values of ``notebook``'s profile ``profile``; a ValueError naming the
    valid profiles for an unknown one, and for a file that sets a key twice (plain YAML would
    keep the last value silently)."""
    names = profiles(notebook)
    if profile not in names:
        raise ValueError(f"notebook {notebook!r} has no profile {profile!r}; choose one of {', '.join(map(repr, names))} "
                         f"(or {SMOKE!r}: the parameters cell's own values)")
    path = params_dir() / notebook / f"{profile}.yaml"
    values = read_parameters_file(path)
    store = values.get("store_profile")
    if store is not None and not (isinstance(store, str) and STORE_NAME.fullmatch(store)):  # a path: anywhere
        raise ValueError(f"{path}: store_profile={store!r} is not valid; it names the run store this profile shares, "
                         f"a folder under results/runs named for a profile (letters, digits, _ and -, e.g. "
                         f"{names[0]!r}), or null for its own")
    return values


# a run store's name: a profile's, one folder under results/runs (never a path)
STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def read_parameters_file(path: str | Path) -> dict[str, Any]:
    """The parameter values in the YAML file ``path`` (a profile, or a file for papermill's ``-f``):
    a mapping whose keys are Python identifiers (``check_parameter_names``), each set once."""
    with open(path) as f:  # the file, not its text: an error then names it
        values = yaml.load(f, Loader=UniqueKeyLoader)
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of parameter names to values")
    check_parameter_names(values, source=str(path))
    return values


def check_parameter_names(values: dict[str, Any], declared: Iterable[str] | None = None, source: str = "parameters") -> None:
    """Refuse a parameter name that is not a Python identifier, or (given ``declared``, the names a
    notebook's parameters cell assigns) one the notebook does not declare.

    Papermill, and ``run_notebook_here``, inject the values as ``name = value`` lines that run as
    code: a key such as ``"x\nimport os; os.system('...')\ny"`` would run its middle line. So the
    names are checked before any cell runs, not by ``check_injected`` inside the notebook, which
    comes too late and sees only the assignments such a key makes."""
    for name in values:
        if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
            raise ValueError(f"{source}: parameter name {name!r} is not valid; a parameter is a Python identifier "
                             "(letters, digits and _, not starting with a digit, not a keyword)")
    if declared is not None:
        declared = set(declared)
        unknown = sorted(set(values) - declared)
        if unknown:
            hints = {name: difflib.get_close_matches(name, sorted(declared), n=1) for name in unknown}
            said = "; ".join(f"{n!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for n, h in hints.items())
            raise ValueError(f"{source} sets {said}, which the notebook's parameters cell does not define; its "
                             f"parameters: {', '.join(sorted(n for n in declared if not n.startswith('_')))}")


def declared_parameters(notebook_path: str | Path) -> set[str]:
    """The names that the cell tagged ``parameters`` of the notebook file ``notebook_path`` assigns."""
    cells = json.loads(Path(notebook_path).read_text())["cells"]
    tagged = [c for c in cells if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not tagged:
        raise ValueError(f"{notebook_path} has no code cell tagged 'parameters' to take values")
    source = tagged[0]["source"]
    return _assigned("".join(source) if isinstance(source, list) else source)


def check_parameters_file(notebook_path: str | Path, path: str | Path) -> dict[str, Any]:
    """The values of the parameters file ``path`` for the notebook ``notebook_path``, checked as
    ``make <notebook>`` needs them before papermill injects them (``python -m nodelm_lib
    check-params``): names that are identifiers and parameters of the notebook, each set once."""
    values = read_parameters_file(path)
    check_parameter_names(values, declared_parameters(notebook_path), source=str(path))
    return values


def notebook_store(notebook: str, profile: str, work_dir: str | Path) -> Path:
    """The run store that ``notebook`` run with ``profile`` in ``work_dir`` writes to, found as the
    notebooks find it: ``<work_dir>/results/runs/<name>`` (the profile's own ``work_dir`` where it
    sets one), the name being the profile's ``store_profile`` where it sets one (a variant sharing
    another profile's store, as 07's ``cpu_wide`` shares ``cpu``'s), else the profile's own. A
    chunk snapshots and packs this store: any other would pack nothing of what the notebook trained."""
    values = {} if profile == SMOKE else load_profile(notebook, profile)
    root = Path(values.get("work_dir") or work_dir).expanduser()
    return root / "results" / "runs" / (values.get("store_profile") or profile)


def apply_profile(namespace: MutableMapping[str, Any], notebook: str, profile: str | None = None,
                  keep: Iterable[str] = ()) -> dict[str, Any]:
    """Set ``notebook``'s parameters in ``namespace`` (a notebook's ``globals()``) to the values
    of ``profile`` (default: ``namespace["profile"]``), except the names in ``keep``, and return
    what it set; ``smoke`` sets nothing. A profile key that is not already a parameter in
    ``namespace`` is refused: a misspelt one would otherwise be a new variable that nothing reads."""
    profile = namespace.get("profile", SMOKE) if profile is None else profile
    if profile == SMOKE:
        return {}
    values = load_profile(notebook, profile)
    unknown = sorted(set(values) - set(namespace))
    if unknown:
        raise ValueError(f"profile {profile!r} of {notebook!r} sets {unknown}, which are not parameters of the notebook")
    keep = set(keep)
    applied = {k: v for k, v in values.items() if k not in keep}
    namespace.update(applied)
    return applied


def use_profile(namespace: MutableMapping[str, Any], history: list[str], notebook: str) -> dict[str, Any]:
    """What every notebook calls right after its imports, with ``globals()`` and ``In``:
    ``check_injected(history)``, then the values of the profile its parameters name
    (``profile = "colab"``) for every parameter papermill did not set. Papermill's values win:
    ``make 02 PROFILE=cpu`` injects the whole file anyway, and ``-p workers 1`` must not be
    undone by the file's ``workers: 2``. On Colab, naming the profile in the parameters cell is
    then all it takes. Returns what it set (empty for ``smoke``, the parameters cell itself)."""
    check_injected(history)
    injected = _injected_cell(history)
    applied = apply_profile(namespace, notebook, keep=_assigned(injected) if injected else ())
    if applied:
        print(f"profile {namespace['profile']!r}: {len(applied)} values from params/{notebook}/{namespace['profile']}.yaml")
    return applied


# papermill's translator writes the injected cell as this comment line, then one assignment per value
INJECTED_HEADER = "# Parameters"


def check_injected(history: list[str]) -> None:
    """Refuse a papermill value for a name that no earlier cell defines: ``papermill -p lr_seed 1``
    (for ``lr_seeds``) or a misspelt key in a ``-f`` file would otherwise define a new variable
    that nothing reads, and the notebook would run its defaults silently.

    ``history`` is IPython's input history, the notebook's ``In``: the cell papermill injected
    (its first line is ``# Parameters``, alone) and the cells before it, the parameters cell
    among them. Call it in the cell after the parameters: ``nl.profiles.check_injected(In)``.
    Without an injected cell (a notebook run by hand) there is nothing to check."""
    cells = [c for c in history if isinstance(c, str)]
    injected = [i for i, c in enumerate(cells) if _is_injected(c)]
    if not injected:
        return
    last = injected[-1]
    declared = set().union(*(_assigned(c) for c in cells[:last] if not _is_injected(c)))
    unknown = sorted(_assigned(cells[last]) - declared)
    if unknown:
        hints = {name: difflib.get_close_matches(name, sorted(declared), n=1) for name in unknown}
        said = "; ".join(f"{n!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for n, h in hints.items())
        raise ValueError(f"papermill set {said}, which this notebook's parameters cell does not define; its "
                         f"parameters: {', '.join(sorted(n for n in declared if not n.startswith('_')))}")


def _is_injected(cell: str) -> bool:
    return cell.splitlines()[:1] == [INJECTED_HEADER]


def _injected_cell(history: list[str]) -> str | None:
    """The source of the last cell papermill injected into ``history``, or None."""
    cells = [c for c in history if isinstance(c, str) and _is_injected(c)]
    return cells[-1] if cells else None


def _assigned(source: str) -> set[str]:
    """The names a cell's source assigns at its top level (``x = ...``, ``x: int = ...``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: such a cell defines no parameter
        return set()
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names
