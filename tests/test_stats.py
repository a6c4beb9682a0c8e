"""nodelm_lib.reporting.stats against scipy's own tests and hand-computed values (fast, no training)."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats as ss

from nodelm_lib.reporting import comparisons
from nodelm_lib.reporting import stats as st


# --------------------------------------------------------------------------- mean_ci


@pytest.mark.parametrize("n", [2, 3, 5, 10])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_mean_ci_matches_scipy_and_numpy(n, confidence):
    x = np.random.default_rng(n).normal(3.0, 0.7, size=n)
    r = st.mean_ci(x, confidence)
    lo, hi = ss.t.interval(confidence, n - 1, loc=x.mean(), scale=ss.sem(x))
    assert r["n"] == n
    assert r["mean"] == pytest.approx(np.mean(x))
    assert r["sd"] == pytest.approx(np.std(x, ddof=1))
    assert r["sem"] == pytest.approx(ss.sem(x))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi))
    assert r["ci_half"] == pytest.approx((hi - lo) / 2)


def test_mean_ci_drops_nans_and_handles_one_value():
    r = st.mean_ci([1.0, np.nan, 3.0])
    assert r["n"] == 2 and r["mean"] == 2.0 and r["sd"] == pytest.approx(math.sqrt(2))
    one = st.mean_ci([4.0, np.nan])
    assert one["n"] == 1 and one["mean"] == 4.0
    assert all(math.isnan(one[k]) for k in ("sd", "sem", "ci_low", "ci_high", "ci_half"))


def test_mean_ci_errors():
    with pytest.raises(ValueError, match="at least 1 non-NaN value"):
        st.mean_ci([np.nan, np.nan])
    with pytest.raises(ValueError, match="at least 1 non-NaN value"):
        st.mean_ci([])
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 95"):
        st.mean_ci([1.0, 2.0], confidence=95)
    with pytest.raises(ValueError, match="must be 1-D"):
        st.mean_ci([[1.0, 2.0], [3.0, 4.0]])


# --------------------------------------------------------------------------- paired_test


def _random_pair(n, seed):
    rng = np.random.default_rng(seed)
    b = rng.normal(5.0, 1.0, size=n)
    return b + rng.normal(0.3, 0.5, size=n), b


@pytest.mark.parametrize("n", range(5, 13))
def test_paired_test_matches_scipy(n):
    a, b = _random_pair(n, seed=100 + n)
    r = st.paired_test(a, b)
    t = ss.ttest_rel(a, b)
    assert r["n"] == n
    assert r["t"] == pytest.approx(t.statistic, rel=1e-10)
    assert r["p_t"] == pytest.approx(t.pvalue, rel=1e-10)
    ci = t.confidence_interval(0.95)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high))
    d = a - b
    assert np.unique(np.abs(d)).size == n  # no ties: scipy's "exact" is exact here
    assert r["p_wilcoxon"] == pytest.approx(ss.wilcoxon(a, b, method="exact").pvalue, rel=1e-12)
    assert r["mean_diff"] == pytest.approx(d.mean())
    assert r["sd_diff"] == pytest.approx(d.std(ddof=1))
    assert r["d_z"] == pytest.approx(d.mean() / d.std(ddof=1))
    assert r["hedges_gz"] == pytest.approx(r["d_z"] * (1 - 3 / (4 * (n - 1) - 1)))


@pytest.mark.parametrize("n, p", [(5, 2 / 32), (6, 2 / 64), (4, 2 / 16)])
def test_wilcoxon_all_positive_is_two_over_two_to_the_n(n, p):
    b = np.zeros(n)
    a = np.arange(1.0, n + 1)
    assert st.paired_test(a, b)["p_wilcoxon"] == pytest.approx(p)
    assert st.paired_test(b, a)["p_wilcoxon"] == pytest.approx(p)  # symmetric


def test_wilcoxon_five_seeds_never_below_005():
    # the best case for five seeds: every difference has the same sign
    assert st.wilcoxon_signed_rank([0.1, 0.2, 0.3, 0.4, 0.5])["p"] == 0.0625


def _brute_force_p(d):
    """Two-sided exact p by listing all 2**m sign assignments (zeros dropped)."""
    d = np.asarray(d, float)
    d = d[d != 0]
    r = ss.rankdata(np.abs(d))  # average ranks for ties
    w = r[d > 0].sum()
    null = np.array([r[np.array(s, bool)].sum() for s in itertools.product([0, 1], repeat=d.size)])
    return min(1.0, 2 * min(np.mean(null <= w + 1e-9), np.mean(null >= w - 1e-9)))


@pytest.mark.parametrize(
    "d",
    [
        [1, 1, 2, -2, 3, 3, 3, -0.5, 0, 4],  # ties and a zero
        [0.5, 0.5, -0.5, 1.0, 1.0, 2.0],  # ties spanning signs
        [1, -1, 1, -1, 1],  # all tied
        [0, 0, 1, 2, 3, 4, 5],  # zeros are dropped, not ranked
    ],
)
def test_wilcoxon_ties_and_zeros(d):
    r = st.wilcoxon_signed_rank(d)
    assert r["n_nonzero"] == np.count_nonzero(d)
    assert r["p"] == pytest.approx(_brute_force_p(d))
    # scipy's method="auto" runs an exact sign-flip permutation test for n <= 13 when
    # there are ties or zeros (its method="exact" is conservative then, see the report)
    assert r["p"] == pytest.approx(ss.wilcoxon(d, zero_method="wilcox").pvalue)


def test_wilcoxon_hand_count_with_ties():
    # |d| = 1, 1, 2 -> ranks 1.5, 1.5, 3; W+ = 6 is the maximum: 1 of 8 assignments
    assert st.wilcoxon_signed_rank([1, 1, 2])["p"] == pytest.approx(2 / 8)
    # d = 1, -1, 2: W+ = 4.5; P(W >= 4.5) = #{4.5, 6, 4.5} / 8 -> p = min(1, 2 * 3/8)
    assert st.wilcoxon_signed_rank([1, -1, 2])["p"] == pytest.approx(0.75)


def test_wilcoxon_exact_up_to_20():
    a, b = _random_pair(20, seed=7)
    r = st.wilcoxon_signed_rank(a - b)
    assert r["method"] == "exact"
    assert r["p"] == pytest.approx(ss.wilcoxon(a, b, method="exact").pvalue, rel=1e-12)


@pytest.mark.parametrize("n", [25, 30, 60])
def test_wilcoxon_normal_approximation_above_20(n):
    d = np.round(np.random.default_rng(n).normal(0.2, 1.0, size=n), 1)  # ties and zeros
    r = st.wilcoxon_signed_rank(d)
    assert r["n_nonzero"] > 20 and r["method"] == "normal"
    assert r["p"] == pytest.approx(ss.wilcoxon(d, method="asymptotic").pvalue, rel=1e-10)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 20])
def test_wilcoxon_is_scipys_exact_test_without_ties(m, seed):
    """Distinct |d| (continuous differences, possibly with zeros, which both drop): our p is
    scipy's exact p and the brute-force count over all 2**m sign assignments."""
    rng = np.random.default_rng(1000 * m + seed)
    d = rng.normal(0.2 * seed, 1.0, size=m)
    r = st.wilcoxon_signed_rank(d)
    assert r["method"] == "exact"
    assert r["p"] == pytest.approx(ss.wilcoxon(d, method="exact").pvalue, rel=1e-12)
    if m <= 13:
        assert r["p"] == pytest.approx(_brute_force_p(d), rel=1e-12)
    with_zeros = np.concatenate([[0.0, 0.0], d])
    assert st.wilcoxon_signed_rank(with_zeros)["p"] == r["p"]
    assert r["p"] == pytest.approx(ss.wilcoxon(with_zeros, method="exact", zero_method="wilcox").pvalue, rel=1e-12)


@pytest.mark.parametrize(
    "d",
    [
        [0.5, 0.5, -0.5, 1.0, 1.0, 2.0],  # scipy's "exact" 0.094, all 64 assignments 0.125
        [1, 1, 2, -2, 3, 3, 3, -0.5, 4],  # scipy's "exact" 0.055, the count 0.043
        [1, -1, 1, -1, 1],  # scipy's "exact" 0.81, the count 1
    ],
)
def test_wilcoxon_keeps_its_own_count_where_scipys_exact_is_not_exact(d):
    """With tied |d| scipy's method="exact" compares the average-rank statistic with the null
    distribution of untied ranks 1..m: its p is not the exact p (either side of it). The count
    over all sign assignments of the tied ranks is kept for these inputs."""
    r = st.wilcoxon_signed_rank(d)
    assert r["p"] == pytest.approx(_brute_force_p(d))
    assert ss.wilcoxon(d, method="exact").pvalue != pytest.approx(r["p"], abs=1e-3)


def test_paired_test_identical_samples():
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    r = st.paired_test(a, a)
    assert r["p_t"] == 1.0 and r["p_wilcoxon"] == 1.0
    assert math.isnan(r["d_z"]) and math.isnan(r["hedges_gz"]) and math.isnan(r["t"])
    assert r["mean_diff"] == 0.0 and r["ci_low"] == r["ci_high"] == 0.0


def test_paired_test_constant_shift():
    r = st.paired_test([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert r["t"] == math.inf and r["p_t"] == 0.0 and r["d_z"] == math.inf


def test_paired_test_errors():
    with pytest.raises(ValueError, match="same length, got 3 and 2"):
        st.paired_test([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 pairs, got 1"):
        st.paired_test([1.0], [2.0])
    with pytest.raises(ValueError, match=r"b contains NaN at positions \[1\]"):
        st.paired_test([1, 2, 3], [1, np.nan, 3])


# --------------------------------------------------------------------------- holm


def test_holm_hand_example():
    np.testing.assert_allclose(st.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(st.holm([0.5, 0.6]), [1.0, 1.0])  # capped at 1


def test_holm_nan_passthrough_and_not_counted():
    out = st.holm([0.01, np.nan, 0.04])
    assert math.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.02, 0.04])  # m = 2
    assert np.isnan(st.holm([np.nan])).all() and st.holm([]).size == 0


def test_holm_monotone_and_bounded():
    p = np.random.default_rng(1).uniform(0, 0.2, size=30)
    adj = st.holm(p)
    order = np.argsort(p)
    assert np.all(np.diff(adj[order]) >= 0)
    assert np.all(adj >= p) and np.all(adj <= 1)


def test_holm_rejects_out_of_range():
    with pytest.raises(ValueError, match=r"\[0, 1\], got \[1.5\]"):
        st.holm([0.1, 1.5])


# --------------------------------------------------------------------------- compare_arms


def _synthetic_runs(seeds=range(8)):
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        base = 5.0 + rng.normal(0, 0.3)  # a seed effect shared by all arms
        rows += [
            {"arm": "baseline", "seed": s, "val_loss": base},
            {"arm": "ode", "seed": s, "val_loss": base - 0.2 + rng.normal(0, 0.02)},
            {"arm": "worse", "seed": s, "val_loss": base + 0.2 + rng.normal(0, 0.02)},
            {"arm": "noise", "seed": s, "val_loss": base + rng.normal(0, 0.02)},
        ]
    return pd.DataFrame(rows)


def test_compare_arms_verdicts():
    df = _synthetic_runs()
    out = comparisons.compare_arms(df, "val_loss", reference="baseline")
    assert list(out.columns) == comparisons.COMPARE_COLUMNS
    assert list(out["arm"]) == ["ode", "worse", "noise"]
    verdict = dict(zip(out["arm"], out["verdict"]))
    assert verdict == {"ode": "better", "worse": "worse", "noise": "no significant difference"}
    assert (out["reference"] == "baseline").all() and (out["n"] == 8).all()
    np.testing.assert_allclose(out["p_t_holm"], st.holm(out["p_t"]))
    np.testing.assert_allclose(out["p_wilcoxon_holm"], st.holm(out["p_wilcoxon"]))
    # the same row through paired_test directly
    ode = df[df.arm == "ode"].sort_values("seed")["val_loss"].to_numpy()
    ref = df[df.arm == "baseline"].sort_values("seed")["val_loss"].to_numpy()
    assert out.loc[0, "p_t"] == pytest.approx(ss.ttest_rel(ode, ref).pvalue)
    # higher_is_better flips the direction (e.g. accuracy)
    flipped = comparisons.compare_arms(df, "val_loss", reference="baseline", higher_is_better=True)
    assert list(flipped["verdict"][:2]) == ["worse", "better"]


def test_compare_arms_pairs_by_seed_not_row_order():
    df = _synthetic_runs()
    shuffled = df.sample(frac=1.0, random_state=3)
    a = comparisons.compare_arms(df, "val_loss", reference="baseline").set_index("arm")
    b = comparisons.compare_arms(shuffled, "val_loss", reference="baseline").set_index("arm")
    pd.testing.assert_frame_equal(a.loc[["ode", "worse", "noise"]], b.loc[["ode", "worse", "noise"]])


def test_compare_arms_missing_seeds():
    df = _synthetic_runs()
    df = df[~((df.arm == "ode") & df.seed.isin([2, 5]))]
    with pytest.raises(ValueError, match=r"missing from 'ode': \[2, 5\]"):
        comparisons.compare_arms(df, "val_loss", reference="baseline")
    out = comparisons.compare_arms(df, "val_loss", reference="baseline", allow_missing=True)
    assert dict(zip(out["arm"], out["n"])) == {"ode": 6, "worse": 8, "noise": 8}
    # a NaN metric (diverged run) counts as a missing seed
    df2 = _synthetic_runs()
    df2.loc[(df2.arm == "noise") & (df2.seed == 7), "val_loss"] = np.nan
    with pytest.raises(ValueError, match=r"missing from 'noise': \[7\]"):
        comparisons.compare_arms(df2, "val_loss", reference="baseline")


def test_compare_arms_errors():
    df = _synthetic_runs()
    with pytest.raises(ValueError, match=r"unknown reference arm 'base'; valid arms are \['baseline', 'ode'"):
        comparisons.compare_arms(df, "val_loss", reference="base")
    with pytest.raises(ValueError, match=r"columns \['test_loss'\] not in the data frame"):
        comparisons.compare_arms(df, "test_loss", reference="baseline")
    dup = pd.concat([df, df.iloc[[1]]])
    with pytest.raises(ValueError, match=r"arm 'ode' has more than one run for seeds \[0\]"):
        comparisons.compare_arms(dup, "val_loss", reference="baseline")
    with pytest.raises(ValueError, match="only arm"):
        comparisons.compare_arms(df[df.arm == "baseline"], "val_loss", reference="baseline")


# --------------------------------------------------------------------------- summary


def test_summary_table():
    df = _synthetic_runs(seeds=range(5))
    df["tokens_per_s"] = 1000.0 + df["seed"]
    out = comparisons.summary_table(df, ["val_loss", "tokens_per_s"], order=["ode", "baseline"])
    assert list(out["arm"]) == ["ode", "baseline"]
    assert list(out.columns) == [
        "arm", "n", "val_loss_mean", "val_loss_ci", "val_loss_sd",
        "tokens_per_s_mean", "tokens_per_s_ci", "tokens_per_s_sd",
    ]
    r = st.mean_ci(df[df.arm == "ode"]["val_loss"])
    assert out.loc[0, "val_loss_mean"] == pytest.approx(r["mean"])
    assert out.loc[0, "val_loss_ci"] == pytest.approx(r["ci_half"])
    assert out.loc[0, "val_loss_sd"] == pytest.approx(r["sd"])
    assert (out["n"] == 5).all()
    default = comparisons.summary_table(df, "val_loss")
    assert list(default["arm"]) == ["baseline", "ode", "worse", "noise"]
    with pytest.raises(ValueError, match=r"unknown arms \['rnn'\] in order; valid arms are"):
        comparisons.summary_table(df, ["val_loss"], order=["rnn"])


def test_summary_table_reports_per_metric_n_when_nans_dropped():
    df = _synthetic_runs(seeds=range(4))
    df.loc[(df.arm == "ode") & (df.seed == 0), "val_loss"] = np.nan
    out = comparisons.summary_table(df, ["val_loss"]).set_index("arm")
    assert out.loc["ode", "n"] == 4 and out.loc["ode", "val_loss_n"] == 3


# --------------------------------------------------------------------------- equivalence (TOST)


def test_tost_matches_a_hand_computed_case():
    # d = a - b = [0.01, -0.01, 0.02, 0.00, 0.005]: mean 0.005, sd 0.0111803, se 0.005, df 4
    a = np.array([1.01, 0.99, 1.02, 1.00, 1.005])
    b = np.ones(5)
    res = st.tost(a, b, margin=0.02)
    d = a - b
    se = d.std(ddof=1) / np.sqrt(5)
    assert se == pytest.approx(0.005)
    # by hand: t_lower = (0.005 + 0.02) / 0.005 = 5, t_upper = (0.005 - 0.02) / 0.005 = -3
    assert res["p_lower"] == pytest.approx(ss.t.sf(5.0, 4))
    assert res["p_upper"] == pytest.approx(ss.t.cdf(-3.0, 4))
    # t with 4 df in closed form: F(t) = 1/2 + 3/8 * t / sqrt(1 + t^2/4) * (1 - t^2 / (12 (1 + t^2/4)))
    # at t = -3: 1/2 - 3/8 * 1.664101 * 0.769231 = 0.019971, below 0.05: equivalent
    assert res["p_tost"] == pytest.approx(0.019971, abs=2e-6)
    # the same decision as the 90% interval inside the margin
    half = ss.t.ppf(0.95, 4) * se
    assert (res["ci90_low"], res["ci90_high"]) == pytest.approx((0.005 - half, 0.005 + half))
    assert res["ci90_high"] < 0.02
    # a margin of 0.01 is not met: 0.005 + half > 0.01
    assert st.tost(a, b, margin=0.01)["p_tost"] > 0.05


def test_tost_rejects_a_bad_margin_and_handles_identical_differences():
    with pytest.raises(ValueError, match="margin=0 is not valid"):
        st.tost([1, 2], [1, 2], margin=0)
    with pytest.raises(ValueError, match="margin=nan is not valid"):
        st.tost([1, 2], [1, 2], margin=float("nan"))
    assert st.tost([1.0, 2.0], [1.0, 2.0], margin=0.1)["p_tost"] == 0.0
    assert st.tost([1.5, 2.5], [1.0, 2.0], margin=0.1)["p_tost"] == 1.0
    # a margin read from a numpy table is a numpy scalar: the same test as the float; a bool is no margin
    a, b = [1.0, 1.3, 0.9, 1.1], [1.05, 1.2, 1.0, 1.1]
    assert st.tost(a, b, margin=np.float32(0.25))["p_tost"] == pytest.approx(st.tost(a, b, margin=0.25)["p_tost"])
    with pytest.raises(ValueError, match="margin=True is not valid"):
        st.tost(a, b, margin=True)


def test_tost_holds_its_size_at_the_margin_on_synthetic_data():
    # true difference exactly at the margin: TOST should declare equivalence at most ~5% of the time
    rng = np.random.default_rng(0)
    hits = [st.tost(0.02 + rng.normal(0, 0.01, 5), np.zeros(5), 0.02)["p_tost"] < 0.05 for _ in range(4000)]
    assert np.mean(hits) == pytest.approx(0.05, abs=0.012)


def test_compare_arms_with_a_margin_says_equivalent_or_not_resolved():
    seeds = range(5)
    rows = [{"arm": "ref", "seed": s, "loss": 2.0 + 0.01 * s} for s in seeds]
    rows += [{"arm": "same", "seed": s, "loss": 2.0 + 0.01 * s + d} for s, d in zip(seeds, [0.001, -0.001, 0.002, 0, 0.001])]
    rows += [{"arm": "noisy", "seed": s, "loss": 2.0 + 0.01 * s + d} for s, d in zip(seeds, [0.05, -0.04, 0.03, -0.05, 0.02])]
    rows += [{"arm": "worse", "seed": s, "loss": 2.3 + 0.01 * s + 0.001 * s * s} for s in seeds]
    out = comparisons.compare_arms(pd.DataFrame(rows), "loss", "ref", equivalence_margin=0.02).set_index("arm")
    assert out.loc["same", "verdict"] == "equivalent (±0.02)"
    assert out.loc["noisy", "verdict"] == "not resolved at 5 seeds"
    assert out.loc["worse", "verdict"] == "worse"
    assert out["p_tost_holm"].tolist() == pytest.approx(st.holm(out["p_tost"]).tolist())
    # without a margin the old verdicts and columns
    plain = comparisons.compare_arms(pd.DataFrame(rows), "loss", "ref")
    assert "p_tost" not in plain.columns and set(plain["verdict"]) == {"no significant difference", "worse"}


def test_holm_family_adjusts_over_every_table_at_once():
    t1 = pd.DataFrame({"arm": ["a"], "reference": "r", "n": 5, "mean_diff": [0.1], "p_t": [0.03], "p_wilcoxon": [0.06]})
    t2 = pd.DataFrame({"arm": ["b", "c"], "reference": "r", "n": 5, "mean_diff": [0.1, -0.1], "p_t": [0.01, 0.04],
                       "p_wilcoxon": [0.06, 0.06]})
    fam = comparisons.holm_family({"one": t1, "two": t2})
    assert fam["family"].tolist() == ["one", "two", "two"]
    assert fam["p_t_holm"].tolist() == pytest.approx([0.06, 0.03, 0.06])
    # alone, table one's p of 0.03 would be "worse"; in the family of three it is not
    assert comparisons.with_verdicts(t1)["verdict"].tolist() == ["worse"]
    assert fam["verdict"].tolist() == ["no significant difference", "worse", "no significant difference"]
