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
   A cell whose numbers are properties of smoke-*trained* models can move further, relative to
   their size (04's spectra and Lyapunov exponents of a node trained for a few steps: up to 6%
   between an AVX2 EPYC and an AVX-512 Xeon); it declares ``# nbval-rel-tol: 0.1 (why)``. Its
   non-integers then agree within that share of their size, and so do its integers of three or
   more digits or followed by "%" or "x" (printed floats such as "4761", "208x" or "-76%");
   other integers (seeds, counts of heads or positions) stay exact.
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

# a cell's own tolerance for its numbers, absolute or relative (see the module doc)
_CELL_TOL = re.compile(r"^\s*#\s*nbval-(abs|rel)-tol:\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", re.MULTILINE)
# under a cell's relative tolerance, integers this large, or followed by these units, are rounded
# floats (4761, 208x, -76%), not counts
_ROUNDED_INTEGER = 100
_ROUNDED_UNITS = ("%", "x")

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


def _cell_tol(kind: str, source: str) -> float:
    return next((float(value) for k, value in _CELL_TOL.findall(source or "") if k == kind), 0.0)


def cell_abs_tol(source: str) -> float:
    """The tolerance a cell's ``# nbval-abs-tol: X`` comment line declares for its numbers (0: none)."""
    return _cell_tol("abs", source)


def cell_rel_tol(source: str) -> float:
    """The tolerance a cell's ``# nbval-rel-tol: X`` comment line declares, relative (0: none)."""
    return _cell_tol("rel", source)


def _numbers_agree(ref: str, test: str, abs_tol: float = 0.0, rel_tol: float = 0.0, unit: str = "") -> bool:
    a, b = float(ref), float(test)
    if "." not in ref + test and "e" not in (ref + test).lower():
        rounded = max(abs(a), abs(b)) >= _ROUNDED_INTEGER or unit in _ROUNDED_UNITS
        if not (rel_tol and rounded):
            return a == b
    tol = max(max(REL_TOL, rel_tol) * max(abs(a), abs(b)), ABS_TOL, abs_tol, _last_digit_unit(ref),
              _last_digit_unit(test))
    return abs(a - b) <= tol * (1 + 1e-9)  # 2.18 - 2.17 is 0.010000000000000231 in binary


def agree_up_to_rounding(ref: str, test: str, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    """Whether two printed outputs say the same up to floating-point rounding (see the module doc),
    or within a cell's ``abs_tol`` / ``rel_tol``."""
    ref_parts, test_parts = _NUMBER.split(ref), _NUMBER.split(test)
    if [" ".join(p.split()) for p in ref_parts] != [" ".join(p.split()) for p in test_parts]:
        return False
    units = [part.lstrip()[:1] for part in ref_parts[1:]]  # what follows each number
    return all(_numbers_agree(r, t, abs_tol, rel_tol, u)
               for r, t, u in zip(_NUMBER.findall(ref), _NUMBER.findall(test), units))


def reconcile(test: list[dict], ref: list[dict], abs_tol: float = 0.0, rel_tol: float = 0.0) -> list[dict]:
    """``test`` with each text that agrees with its stored counterpart up to rounding (or a cell's
    ``abs_tol`` / ``rel_tol``) replaced by the stored text; outputs that do not pair up one to one
    are left as they are."""
    if len(test) != len(ref):
        return test
    out = []
    for t, r in zip(test, ref):
        t = type(t)(t)  # a shallow copy of the same type: nbval reads NotebookNode attributes
        if t.get("output_type") == r.get("output_type") and t.get("name") == r.get("name"):
            if isinstance(t.get("text"), str) and isinstance(r.get("text"), str):
                if agree_up_to_rounding(r["text"], t["text"], abs_tol, rel_tol):
                    t["text"] = r["text"]
            if isinstance(t.get("data"), dict) and isinstance(r.get("data"), dict):
                t["data"] = type(t["data"])(
                    {mime: r["data"][mime] if isinstance(v, str) and isinstance(r["data"].get(mime), str)
                     and agree_up_to_rounding(r["data"][mime], v, abs_tol, rel_tol) else v
                     for mime, v in t["data"].items()})
        out.append(t)
    return out


if IPyNbCell is not None:
    _compare_outputs = IPyNbCell.compare_outputs

    def _compare_outputs_up_to_rounding(self, test, ref, skip_compare=None):
        if _compare_outputs(self, test, ref, skip_compare):
            return True
        source = getattr(getattr(self, "cell", None), "source", "")
        if _compare_outputs(self, reconcile(test, ref, cell_abs_tol(source), cell_rel_tol(source)), ref, skip_compare):
            return True
        if stderr_text(test) and not stderr_text(ref):
            print(f"stderr of this run, absent from the stored notebook:\n{stderr_text(test)}")
        return False

    IPyNbCell.compare_outputs = _compare_outputs_up_to_rounding
