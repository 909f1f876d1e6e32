"""analysis/verdict/stats.py: the rank guard, the verdict and the family; pure, no server (the
interval is in test_interval.py, the calibration in test_calibration.py)."""

from __future__ import annotations

import math

import pytest
from scipy import stats as st

from pytest_specdecode.analysis.verdict.interval import Interval, Question
from pytest_specdecode.analysis.verdict.noise import as_prior
from pytest_specdecode.analysis.verdict.stats import (
    RestartNoise,
    Verdict,
    compare_family,
    decide,
    holm_adjust,
    min_achievable_p,
    minimum_requests,
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
