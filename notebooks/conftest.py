"""nbval over the notebooks, with two additions to nbval's exact comparison of cell outputs.

1. **Numbers compare with a rounding tolerance.** The stored outputs were computed on one CPU;
   another runs other vector kernels (AVX2 vs AVX-512), whose sums round differently, and short
   smoke trainings carry that into the 4th significant digit (0.8175 vs 0.8172, 70.61 vs 70.59).
   When nbval finds a difference, each differing output is compared again as text with its
   numbers taken out: the text must be the same (up to the column alignment that a number's width
   changes) and every number must agree to ``REL_TOL``, or ``ABS_TOL`` for values at float32
   rounding level, or one unit of the digit printed last. Integers (counts, steps, seeds) must be
   equal. An output that agrees is replaced by the stored one, and nbval compares again, so any
   other difference still fails with nbval's own report.
   A cell whose numbers are differences of smoke-run results can move more than that (node's
   smoke Δ in 02 is -0.082 on an AVX2 EPYC and -0.084 on an AVX-512 one: the difference of two
   ~4-nat losses); such a cell says so in its source with a comment line
   ``# nbval-abs-tol: 0.005 (why)``, and its non-integer numbers then also agree within that.
2. **Unexpected stderr is printed.** nbval only says "Unexpected output fields from running code:
   {'stderr'}"; this prints the text (pytest shows it under "Captured stdout call"). It found the
   cause of CI failures by turns in figure cells of 05 and 04: matplotlib's warning that placing
   a loc="best" legend took over a second, which ``style.save_figure`` now silences.
"""

from __future__ import annotations

import re

try:
    from nbval.plugin import IPyNbCell
except ImportError:  # plain pytest over this folder, without the [dev] extra: nothing to patch
    IPyNbCell = None

# Differences between CPUs measured on the smoke notebooks were at most 4e-4 relative.
REL_TOL = 1e-3
# float32's machine epsilon is 1.2e-7: gradient errors of that size are rounding, whatever their digits.
ABS_TOL = 1e-7

# a cell's own absolute tolerance for its numbers (see the module doc)
_CELL_ABS_TOL = re.compile(r"^\s*#\s*nbval-abs-tol:\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", re.MULTILINE)

# a number, not part of a name (gpt2), a version (0.11.0) or a path; a unit (28.3x, 12 ms) or a
# full stop may follow it
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\d_])(?!\.\d)")


def stderr_text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")


def _last_digit_unit(token: str) -> float:
    """The value of one unit in the last printed digit: 1e-4 for "0.8175", 1e-8 for "8.1e-06"."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def cell_abs_tol(source: str) -> float:
    """The tolerance a cell's ``# nbval-abs-tol: X`` comment line declares for its numbers (0: none)."""
    match = _CELL_ABS_TOL.search(source or "")
    return float(match.group(1)) if match else 0.0


def _numbers_agree(ref: str, test: str, abs_tol: float = 0.0) -> bool:
    if "." not in ref + test and "e" not in (ref + test).lower():
        return int(ref) == int(test)
    a, b = float(ref), float(test)
    tol = max(REL_TOL * max(abs(a), abs(b)), ABS_TOL, abs_tol, _last_digit_unit(ref), _last_digit_unit(test))
    return abs(a - b) <= tol * (1 + 1e-9)  # 2.18 - 2.17 is 0.010000000000000231 in binary


def agree_up_to_rounding(ref: str, test: str, abs_tol: float = 0.0) -> bool:
    """Whether two printed outputs say the same up to floating-point rounding (see the module doc),
    or within ``abs_tol`` for non-integers."""
    ref_parts, test_parts = _NUMBER.split(ref), _NUMBER.split(test)
    if [" ".join(p.split()) for p in ref_parts] != [" ".join(p.split()) for p in test_parts]:
        return False
    return all(_numbers_agree(r, t, abs_tol) for r, t in zip(_NUMBER.findall(ref), _NUMBER.findall(test)))


def reconcile(test: list[dict], ref: list[dict], abs_tol: float = 0.0) -> list[dict]:
    """``test`` with each text that agrees with its stored counterpart up to rounding (or
    ``abs_tol``) replaced by the stored text; outputs that do not pair up one to one are left as
    they are."""
    if len(test) != len(ref):
        return test
    out = []
    for t, r in zip(test, ref):
        t = type(t)(t)  # a shallow copy of the same type: nbval reads NotebookNode attributes
        if t.get("output_type") == r.get("output_type") and t.get("name") == r.get("name"):
            if isinstance(t.get("text"), str) and isinstance(r.get("text"), str):
                if agree_up_to_rounding(r["text"], t["text"], abs_tol):
                    t["text"] = r["text"]
            if isinstance(t.get("data"), dict) and isinstance(r.get("data"), dict):
                t["data"] = type(t["data"])(
                    {mime: r["data"][mime] if isinstance(v, str) and isinstance(r["data"].get(mime), str)
                     and agree_up_to_rounding(r["data"][mime], v, abs_tol) else v for mime, v in t["data"].items()})
        out.append(t)
    return out


if IPyNbCell is not None:
    _compare_outputs = IPyNbCell.compare_outputs

    def _compare_outputs_up_to_rounding(self, test, ref, skip_compare=None):
        if _compare_outputs(self, test, ref, skip_compare):
            return True
        abs_tol = cell_abs_tol(getattr(getattr(self, "cell", None), "source", ""))
        if _compare_outputs(self, reconcile(test, ref, abs_tol), ref, skip_compare):
            return True
        if stderr_text(test) and not stderr_text(ref):
            print(f"stderr of this run, absent from the stored notebook:\n{stderr_text(test)}")
        return False

    IPyNbCell.compare_outputs = _compare_outputs_up_to_rounding
