"""analysis/verdict/stats.py: pure statistics, no server (the calibration is in
test_calibration.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from pytest_specdecode.analysis.verdict.noise import as_prior
from pytest_specdecode.analysis.verdict.stats import (
    Interval,
    Question,
    RestartNoise,
    Verdict,
    compare_family,
    decide,
    holm_adjust,
    min_achievable_p,
    minimum_requests,
    nested_interval,
)

ASSUMED = RestartNoise.assumed(0.05)
KNOWN = RestartNoise(0.02, 10.0, "stored A/A runs")


# --------------------------------------------------------------------------- feasibility


def test_min_achievable_p_matches_exact_mann_whitney() -> None:
    for n in (2, 3, 5, 6):
        b, c = list(range(n)), list(range(100, 100 + n))
        exact = st.mannwhitneyu(b, c, alternative="two-sided", method="exact").pvalue
        assert min_achievable_p(n, n) == pytest.approx(exact)
    assert min_achievable_p(0, 5) == 1.0 and min_achievable_p(1, 1) == 1.0
    with pytest.raises(ValueError):
        min_achievable_p(-1, 3)


def test_minimum_requests_for_a_family() -> None:
    # 4 prompt types x 2 metrics: 5 vs 5 gives 2/252 x 8 = 0.063; 6 vs 6 gives 0.017.
    assert minimum_requests(8, 0.05) == 6
    assert minimum_requests(4, 0.05) == 5
    assert minimum_requests(1, 0.05) == 4
    assert minimum_requests(8, 0.01) == 7


# --------------------------------------------------------------------------- Holm


def test_holm_textbook_example() -> None:
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_rejects_invalid_p() -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            holm_adjust([0.01, bad])


# --------------------------------------------------------------------------- the interval


def interval(b, c, *, noise: RestartNoise, confidence: float = 0.95, **kw) -> Interval:
    return nested_interval(Question("p", "throughput", True, b, c, **kw), noise=noise,
                           confidence=confidence)  # fmt: skip


def test_one_start_each_adds_the_restart_noise_to_the_requests_spread() -> None:
    b = [[10.0, 11.0, 12.0, 10.5, 11.5]]
    c = [[9.0, 9.5, 10.0, 9.2, 9.8]]
    found = interval(b, c, noise=KNOWN)
    lb, lc = np.log(b[0]), np.log(c[0])
    assert found.estimate == pytest.approx(lc.mean() - lb.mean())
    s_w2 = (np.var(lb, ddof=1) + np.var(lc, ddof=1)) / 2
    tau2 = KNOWN.sd**2 + s_w2 / 5
    assert found.se == pytest.approx(math.sqrt(2 * tau2))
    # Satterthwaite: the noise with its 10 df, the within part with 8.
    df = tau2**2 / (KNOWN.sd**4 / 10 + (s_w2 / 5) ** 2 / 8)
    assert found.df == pytest.approx(df)
    t = st.t.ppf(0.975, df)
    assert (found.low, found.high) == pytest.approx(
        (found.estimate - t * found.se, found.estimate + t * found.se)
    )


def test_repeated_starts_pool_with_the_assumption_never_replace_it() -> None:
    b = [[10.0, 10.1, 9.9], [11.0, 11.1, 10.9]]  # two starts 10% apart
    c = [[10.5, 10.6, 10.4], [10.4, 10.5, 10.6]]
    found = interval(b, c, noise=ASSUMED)
    starts_b = np.log([10.0, 11.0])
    spread = np.var(starts_b, ddof=1) / 2  # one df per arm; the candidate's starts barely move
    # The prior keeps its weight (more with the residual's own df, by Satterthwaite)
    assert 2 + ASSUMED.df <= found.df < 2 + ASSUMED.df + 1
    tau2 = (2 * spread + ASSUMED.df * ASSUMED.sd**2) / (2 + ASSUMED.df)
    assert found.se == pytest.approx(math.sqrt(tau2), rel=0.05)
    own = interval(b, c, noise=RestartNoise(0.0, 0.0, "nothing", measured=False))
    assert own.df == pytest.approx(2)  # with no outside knowledge: the run's own df alone


def test_no_interval_without_any_spread_to_go_on() -> None:
    found = interval([[10.0]], [[9.0]], noise=RestartNoise(0.0, 5.0, "x"), confidence=0.9)
    assert found.low == -math.inf and found.high == math.inf


def test_an_outside_estimate_from_few_starts_widens_the_interval() -> None:
    """The same restart noise, measured with 3 df or with 30: the t quantile on the honest df."""
    b = [[10.0, 10.2, 9.8, 10.1, 9.9, 10.0]]
    c = [[9.0, 9.2, 8.8, 9.1, 8.9, 9.0]]
    few = interval(b, c, noise=RestartNoise(0.02, 3.0, "one A/A run"), confidence=0.99)
    many = interval(b, c, noise=RestartNoise(0.02, 30.0, "ten A/A runs"), confidence=0.99)
    assert few.se == pytest.approx(many.se)
    assert few.df < 4 < 25 < many.df
    assert few.high - few.low > 1.5 * (many.high - many.low)


# --------------------------------------------------------------------------- the verdict


def interval_of(low: float, high: float) -> Interval:
    low_log, high_log = math.log1p(low), math.log1p(high)
    return Interval((low_log + high_log) / 2, low_log, high_log, 0.01, 20.0, 0.9875)


@pytest.mark.parametrize(
    ("low", "high", "higher_is_better", "expected"),
    [
        (-0.20, -0.05, True, Verdict.REGRESSED),
        (0.05, 0.20, True, Verdict.IMPROVED),
        (-0.02, 0.02, True, Verdict.EQUIVALENT),
        (-0.08, 0.01, True, Verdict.INCONCLUSIVE),  # straddles -3%
        (-0.02, 0.08, True, Verdict.INCONCLUSIVE),
        (0.05, 0.20, False, Verdict.REGRESSED),  # TPOT up is worse
        (-0.20, -0.05, False, Verdict.IMPROVED),
    ],
)
def test_decide_reads_the_interval_against_the_margin(low, high, higher_is_better, expected):
    verdict, reason = decide(
        interval_of(low, high),
        higher_is_better=higher_is_better,
        min_effect=0.03,
        p_adjusted=0.001,
        alpha=0.05,
        noise=KNOWN,
    )
    assert verdict is expected, reason
    assert f"[{low * 100:+.1f}%, {high * 100:+.1f}%]" in reason


def test_a_difference_needs_the_ranks_to_agree() -> None:
    verdict, reason = decide(
        interval_of(-0.20, -0.05),
        higher_is_better=True,
        min_effect=0.03,
        p_adjusted=0.2,
        alpha=0.05,
        noise=KNOWN,
    )
    assert verdict is Verdict.INCONCLUSIVE and "ranks do not confirm it" in reason


def _undecided_reason(noise: RestartNoise, starts: tuple[int, int]) -> str:
    """The reason given for a -5.5% change whose interval straddles the ±3% margin."""
    _, reason = decide(
        interval_of(-0.15, 0.05),
        higher_is_better=True,
        min_effect=0.03,
        p_adjusted=0.5,
        alpha=0.05,
        noise=noise,
        family=8,
        starts=starts,
    )
    return reason


def test_inconclusive_says_what_would_decide_it_and_names_an_assumed_noise() -> None:
    reason = _undecided_reason(ASSUMED, (1, 1))
    assert "straddles the ±3% margin" in reason
    assert "it would take about" in reason and "starts per arm (--spec-repeats" in reason
    assert "were the change to stay near -5.5%" in reason
    assert "the restart noise is assumed" in reason


def test_inconclusive_names_another_machines_noise_a_prior_not_an_assumption() -> None:
    prior = as_prior(RestartNoise(0.028, 7.0, "an A/A run of 8 starts"))
    assert prior.is_prior and not prior.measured
    reason = _undecided_reason(prior, (3, 3))
    assert "the restart noise is a prior from another machine: an A/A run here" in reason
    assert "assumed" not in reason


def test_a_change_on_the_margin_says_it_cannot_be_settled() -> None:
    _, reason = decide(
        interval_of(-0.10, 0.04),  # centred at -3%: the margin itself
        higher_is_better=True,
        min_effect=0.03,
        p_adjusted=0.5,
        alpha=0.05,
        noise=KNOWN,
        family=8,
    )
    assert "sits too near the margin to settle in 50 starts per arm" in reason


# --------------------------------------------------------------------------- the family


def test_compare_family_adjusts_intervals_and_ranks_for_its_size() -> None:
    base = [[100.0, 101, 102, 103, 104, 105]]
    slow = [[80.0, 81, 82, 83, 84, 85]]
    questions = [
        Question(f"p{i}", metric, metric == "throughput", base, slow if i == 0 else base)
        for i in range(4)
        for metric in ("throughput", "tpot")
    ]
    found = compare_family(
        questions, alpha=0.05, min_effect=0.03, noise={"throughput": KNOWN, "tpot": KNOWN}
    )
    assert len(found) == 8
    assert [c.interval.confidence for c in found] == [pytest.approx(1 - 2 * 0.05 / 8)] * 8
    first = found[0]
    assert first.p_adjusted == pytest.approx(min(1.0, 8 * first.p_value))
    assert first.verdict is Verdict.REGRESSED and first.change == pytest.approx(-0.19, abs=0.01)
    assert found[1].verdict is Verdict.IMPROVED  # TPOT of the same values read as lower-better
    assert first.to_dict()["restart_noise"] == {
        "sd": 0.02,
        "df": 10.0,
        "source": "stored A/A runs",
        "measured": True,
        "spread": None,
        "within": 0.0,
        "residual": None,
    }


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, float("nan")])
def test_invalid_alpha(alpha: float) -> None:
    q = Question("a", "throughput", True, [[1.0, 2.0]], [[1.0, 2.0]])
    with pytest.raises(ValueError, match="alpha"):
        compare_family([q], alpha=alpha, min_effect=0.03, noise={"throughput": KNOWN})


@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), float("inf")])
def test_non_positive_or_non_finite_values_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="not finite and > 0"):
        interval([[1.0, 2.0]], [[1.0, bad]], noise=KNOWN)


def test_an_assumption_the_runs_own_starts_rule_out_is_set_aside() -> None:
    """Two starts of the baseline twice apart: no 5% restart noise explains that, so the
    assumption's degrees of freedom do not dilute it; the run's own 2 df speak alone."""
    b = [[10.0, 10.1, 9.9], [20.0, 20.2, 19.8]]
    c = [[15.0, 15.1, 14.9], [15.1, 15.0, 15.2]]
    found = interval(b, c, noise=ASSUMED)
    assert found.df == pytest.approx(2)
    near = interval([[10.0, 10.1, 9.9], [10.6, 10.7, 10.5]], c, noise=ASSUMED)  # 6%: plausible
    assert near.df > 2 + ASSUMED.df
