"""The divergence rule (experiments/divergence.py): each criterion flags what it says and nothing
else, and bad rules are refused with the valid choices."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from nodelm_lib.experiments import divergence

REFERENCES = {"bigram": 2.47, "trigram": 2.01}


def runs(losses: dict) -> pd.DataFrame:
    return pd.DataFrame([{"cell": cell, "seed": s, "val_loss": v, "test_loss": v + 0.05}
                         for cell, values in losses.items() for s, v in enumerate(values)])


def test_each_criterion_flags_its_run_and_says_why():
    table = runs({"a": [1.80, 1.82, 2.26], "b": [1.80, math.nan, 1.81], "c": [2.50, 2.49, 2.51]})
    reasons = divergence.divergence_reasons(table, divergence.DivergenceRule("bigram", seed_margin=0.1), REFERENCES,
                                            group="cell")
    flagged = {(r.cell, r.seed): why for r, why in zip(table.itertuples(), reasons) if why}
    assert set(flagged) == {("a", 2), ("b", 1), ("c", 0), ("c", 1), ("c", 2)}
    assert "median 1.810" in flagged[("a", 2)]
    assert "not finite" in flagged[("b", 1)]
    assert "above the bigram's 2.470" in flagged[("c", 0)]


def test_a_run_just_inside_the_margin_and_a_group_of_two_are_not_flagged():
    # 1.905 is 0.095 above the median 1.81 of its others; with two seeds there is no median of others
    table = runs({"a": [1.80, 1.82, 1.905], "pair": [1.80, 2.30]})
    flags = divergence.diverged(table, divergence.DivergenceRule("bigram", seed_margin=0.1), REFERENCES, group="cell")
    assert not flags.any()


def test_the_ceiling_alone_and_the_margin_alone():
    table = runs({"a": [1.80, 1.82, 2.26]})
    assert divergence.diverged(table, divergence.DivergenceRule("trigram"), REFERENCES, group="cell").tolist() \
        == [False, False, True]
    assert not divergence.diverged(table, divergence.DivergenceRule(None, seed_margin=0.5), REFERENCES, group="cell").any()


def test_flagged_runs_applies_the_declared_rule_whatever_its_action_and_none_flags_nothing():
    # 07 flags the reported runs (reruns included) with the rule its sweep applied: rerun or report, same flags
    table = runs({"a": [1.80, 1.82, 2.26], "b": [1.80, 1.81, 1.79]})
    rerun = divergence.divergence_rule({"above": "bigram", "seed_margin": 0.1, "action": "rerun_lower"})
    report = divergence.divergence_rule({"above": "bigram", "seed_margin": 0.1, "action": "report"})
    for rule in (rerun, report):
        reasons = divergence.flagged_runs(table, rule, REFERENCES, group="cell")
        assert (reasons != "").tolist() == [False, False, True, False, False, False]
    assert (divergence.flagged_runs(table, None, REFERENCES, group="cell") == "").all()


def test_without_diverged_blanks_only_the_flagged_runs_losses():
    table = runs({"a": [1.80, 1.82, 2.26]})
    flags = divergence.diverged(table, divergence.DivergenceRule(seed_margin=0.1), REFERENCES, group="cell")
    kept = divergence.without_diverged(table, flags)
    assert kept["val_loss"].isna().tolist() == [False, False, True]
    assert kept["test_loss"].isna().tolist() == [False, False, True]
    assert table["val_loss"].notna().all()  # the input is left as it was


@pytest.mark.parametrize("kwargs, message", [
    ({"above": ""}, "name a reference model"),
    ({"above": "fourgram"}, r"above='fourgram' is not valid; name a reference model \(unigram, bigram, trigram\)"),
    ({"seed_margin": 0}, "finite number of nats > 0"),
    ({"seed_margin": math.inf}, "finite number of nats > 0"),
    ({"seed_margin": True}, "finite number of nats > 0"),
])
def test_a_bad_rule_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        divergence.DivergenceRule(**kwargs)


def test_a_level_missing_from_the_references_names_them():
    with pytest.raises(ValueError, match=r"above='unigram' needs that reference's validation loss; the references "
                                         r"given are \['bigram', 'trigram'\]"):
        divergence.diverged(runs({"a": [1.8, 1.9, 2.0]}), divergence.DivergenceRule("unigram"), REFERENCES,
                            group="cell")


def test_the_rule_describes_itself_with_the_ceilings_value():
    text = divergence.DivergenceRule("bigram", seed_margin=0.1).describe(REFERENCES)
    assert "above the bigram's (2.470)" in text and "0.1 nats above the median" in text
