"""Count how the bad inputs of tests/test_bad_inputs.py fare against a checkout: clear / partly /
raw / silent.

    PYTHONPATH=<checkout> python bench/bad_inputs_tally.py [--table tests/test_bad_inputs.py] [--list]

- clear: an error (ValueError, FileNotFoundError, a one-line command-line error, a warning for a
  run) that matches the table's message, or otherwise names the key or value;
- partly: names the key or value, but as another kind of error (a traceback, a late failure);
- raw: an error that names neither (an IndexError, "'<=' not supported ...", a bare EOFError);
- silent: no error and no warning.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

CLEAR_KINDS = {"ValueError", "FileNotFoundError", "CLIFailure", "Warned", "RecordError", "CheckpointError", "DiskFull",
               "UnknownKeyError"}


def load_table(path: Path):
    spec = importlib.util.spec_from_file_location("bad_input_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def key_of(case: str, message: str) -> str | None:
    """The key a case's id names (``"model d_model='64'"`` -> ``d_model``, ``"cli eval --seq-len 0"``
    -> ``seq_len``), else the first word of its expected message (``"t must ..."`` -> ``t``)."""
    match = re.search(r"([A-Za-z_][\w-]*)\s*=", case) or re.search(r"--([\w-]+)", case) \
        or re.match(r"\^?(?:error: )?([A-Za-z_]\w*)\b", message)
    return match.group(1).lstrip("-").replace("-", "_") if match else None


def names_key(key: str | None, text: str) -> bool:
    """Whether an error message names ``key`` (as ``key=``, ``--key`` or opening with it)."""
    if key is None:
        return False
    return any(form in text for form in (f"{key}=", f"--{key.replace('_', '-')}", f"{key} ")) \
        or re.match(rf"(error: )?{re.escape(key)}\b", text) is not None


def classify(case: str, err: BaseException | None, message: str) -> str:
    if err is None:
        return "silent"
    kind, text = type(err).__name__, str(err)
    names = names_key(key_of(case, message), text)
    if kind in CLEAR_KINDS and "Traceback" not in text and (re.search(message, text) or names):
        return "clear"
    return "partly" if names else "raw"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=str(Path(__file__).resolve().parents[1] / "tests" / "test_bad_inputs.py"))
    parser.add_argument("--list", action="store_true", help="print every case's outcome")
    args = parser.parse_args(argv)
    table = load_table(Path(args.table))
    tally = Counter()
    for case, (run, message) in table.CASES.items():
        try:
            err = table.outcome(run)
        except BaseException as skipped:  # noqa: B902  (pytest.skip: the case does not apply here)
            print(f"skipped   {case}: {skipped}")
            continue
        verdict = classify(case, err, message)
        tally[verdict] += 1
        if args.list:
            text = " ".join(str(err).split())[:160] if err is not None else ""
            print(f"{verdict:9} {case}: {type(err).__name__ if err is not None else '-'} {text}")
    import nodelm_lib

    print(f"{nodelm_lib.__file__}: {sum(tally.values())} cases: " +
          ", ".join(f"{tally[k]} {k}" for k in ("clear", "partly", "raw", "silent")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
