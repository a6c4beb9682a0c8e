"""nbval's comparison of notebook outputs up to floating-point rounding (notebooks/conftest.py):
the differences one CPU's kernels make against another's pass; anything else still fails."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "notebook_conftest", Path(__file__).resolve().parents[1] / "notebooks" / "conftest.py")
nbconf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbconf)


# Pairs seen between an AVX2 and an AVX-512 machine on the smoke notebooks (CI, 2026-11-22).
@pytest.mark.parametrize("ref, test", [
    ("  node  0.8175  -1.428\n", "  node  0.8172  -1.428\n"),
    ("mean |delta logit| with control: 8.09e-06\n", "mean |delta logit| with control: 8.1e-06\n"),
    ("   node   ov     2   0.0514   0.0731  1.422\n", "   node   ov     2   0.0514  0.07309  1.422\n"),
    ("reversible    1.9e-16 1.7e-16 8.9e-08 8.5e-08\n", "reversible    1.2e-16 1.8e-16 9.1e-08 8.5e-08\n"),
    ("<td>3.3398</td>", "<td>3.3397</td>"),
    ("radius 70.61 at t = 0.", "radius 70.59 at t = 0."),
    ("i.e. 28.3x less", "i.e. 28.4x less"),
    ("log|det| = 2.17", "log|det| = 2.18"),  # one unit in the last digit, which binary floats overshoot
])
def test_rounding_differences_between_cpus_agree(ref, test):
    assert nbconf.agree_up_to_rounding(ref, test)


@pytest.mark.parametrize("ref, test", [
    ("final val loss 3.4893", "final val loss 3.4993"),      # 3e-3 relative: more than rounding
    ("4/4 heads grow", "3/4 heads grow"),                   # counts are exact
    ("36/190 pairs", "36/191 pairs"),
    ("rk4 error 1.2e-10", "rk4 error 3.0e-04"),               # above float32 rounding level
    ("VERDICT: PASS 0.5", "VERDICT: FAIL 0.5"),              # the words must match
    ("loss 2.1 2.2", "loss 2.1"),                            # so must the count of numbers
    ("torch 2.13.0", "torch 2.14.0"),                        # a version is text, not a number
    ("arch gpt2", "arch gpt3"),                              # so is a digit in a name
    ("it took 3.", "it took 4."),                            # a count ending a sentence is a count
])
def test_other_differences_still_fail(ref, test):
    assert not nbconf.agree_up_to_rounding(ref, test)


def test_reconcile_replaces_only_outputs_that_agree():
    ref = [{"output_type": "stream", "name": "stdout", "text": "loss 0.8175\n"},
           {"output_type": "execute_result", "data": {"text/plain": "a 1.000", "text/html": "<td>2.0</td>"}}]
    test = [{"output_type": "stream", "name": "stdout", "text": "loss 0.8172\n"},
            {"output_type": "execute_result", "data": {"text/plain": "a 1.0005", "text/html": "<td>2.5</td>"}}]
    out = nbconf.reconcile(test, ref)
    assert out[0]["text"] == "loss 0.8175\n"
    assert out[1]["data"] == {"text/plain": "a 1.000", "text/html": "<td>2.5</td>"}
    assert test[0]["text"] == "loss 0.8172\n"  # the run's own outputs are not modified
    assert nbconf.reconcile(test[:1], ref) == test[:1]  # outputs that do not pair up: unchanged


def test_a_cell_can_declare_its_own_tolerance_for_non_integers():
    source = "# nbval-abs-tol: 0.005 (differences of smoke losses)\ntests.round(3)"
    tol = nbconf.cell_abs_tol(source)
    assert tol == 0.005
    assert nbconf.cell_abs_tol("x = 1  # nbval-abs-tol is mentioned, not declared") == 0.0
    ref, test = "<td>2</td><td>-0.082</td>", "<td>2</td><td>-0.084</td>"  # 02's node, AVX2 vs AVX-512
    assert not nbconf.agree_up_to_rounding(ref, test)
    assert nbconf.agree_up_to_rounding(ref, test, tol)
    assert not nbconf.agree_up_to_rounding(ref, "<td>2</td><td>-0.090</td>", tol)  # beyond it
    assert not nbconf.agree_up_to_rounding(ref, "<td>3</td><td>-0.082</td>", tol)  # counts stay exact
    out = nbconf.reconcile([{"output_type": "execute_result", "data": {"text/html": test}}],
                           [{"output_type": "execute_result", "data": {"text/html": ref}}], tol)
    assert out[0]["data"]["text/html"] == ref


def test_a_cell_can_declare_a_relative_tolerance_for_smoke_trained_models():
    source = "# nbval-rel-tol: 0.1 (properties of smoke-trained models)\nsummary"
    tol = nbconf.cell_rel_tol(source)
    assert tol == 0.1
    assert nbconf.cell_rel_tol("# nbval-abs-tol: 0.1") == 0.0
    # 04's node seed 1 on an AVX-512 Xeon against an AVX2 EPYC
    pairs = [("node seed 1  7.679  2.411  0.1933  5.532", "node seed 1  7.679  2.428  0.2056  5.715"),
             ("i.e. 208x less; 27 of 32 positive", "i.e. 210x less; 27 of 32 positive"),
             ("<td>4761</td><td>-47.9476</td>", "<td>4762</td><td>-47.9121</td>"),
             ("CI [-0.998, +0.567] (-77% of its mean)", "CI [-0.995, +0.568] (-76% of its mean)")]
    for ref, test in pairs:
        assert not nbconf.agree_up_to_rounding(ref, test)
        assert nbconf.agree_up_to_rounding(ref, test, rel_tol=tol)
    assert not nbconf.agree_up_to_rounding("0.1933", "0.2300", rel_tol=tol)                  # beyond it
    assert not nbconf.agree_up_to_rounding("27 of 32 positive", "28 of 32 positive", rel_tol=tol)  # counts stay exact
    assert not nbconf.agree_up_to_rounding("node seed 1", "node seed 2", rel_tol=tol)
    assert not nbconf.agree_up_to_rounding("rises at 5 of 12", "falls at 5 of 12", rel_tol=tol)  # words too
