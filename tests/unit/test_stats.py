"""Tests for pytest_specdecode.analysis.stats (pure statistics, no server, no network)."""

from __future__ import annotations

import functools
import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as st

from pytest_specdecode.analysis import stats
from pytest_specdecode.analysis.stats import (
    Comparison,
    Verdict,
    holm_adjust,
    min_achievable_p,
    ratio_of_medians_ci,
)
from pytest_specdecode.config.settings import RunConfig

# The default design, as RunConfig defines it; a test passes its own where it matters.
DEFAULTS = {"alpha": RunConfig().alpha, "min_effect": RunConfig().min_effect}
compare = functools.partial(stats.compare, **DEFAULTS)
compare_family = functools.partial(stats.compare_family, **DEFAULTS)

# Eight baseline vs eight candidate values, no ties: exact two-sided p = 0.028, candidate
# median +3.9%. Significant on its own, not after Holm over a family of three.
MODERATE_BASELINE = [100, 101, 102, 103, 104, 105, 106, 110]
MODERATE_CANDIDATE = [103.5, 104.5, 106.5, 107, 108, 109, 111, 112]


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * rng.lognormal(mean=0.0, sigma=sigma, size=n)


# --------------------------------------------------------------------------- calibration


def test_false_positive_rate_under_no_effect_is_near_alpha():
    alpha = 0.05
    seeds = range(400)
    flagged = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        baseline = _lognormal(rng, 50.0, 0.3, 12)
        candidate = _lognormal(rng, 50.0, 0.3, 12)
        result = compare(
            baseline,
            candidate,
            metric="throughput",
            higher_is_better=True,
            alpha=alpha,
            min_effect=0.0,
            seed=seed,
            n_resamples=50,
        )
        assert result.verdict is not Verdict.INSUFFICIENT
        flagged += result.verdict is not Verdict.NO_DIFFERENCE
    rate = flagged / len(seeds)
    assert 0.01 <= rate <= 0.09, rate


# --------------------------------------------------------------------------- large effects


@pytest.fixture
def slower_candidate():
    """Throughput samples: candidate 20% slower, ~3% noise, n=10 per side."""
    rng = np.random.default_rng(7)
    baseline = _lognormal(rng, 100.0, 0.03, 10)
    candidate = _lognormal(rng, 80.0, 0.03, 10)
    return baseline, candidate


def test_large_throughput_drop_is_regressed_with_ci_excluding_one(slower_candidate):
    baseline, candidate = slower_candidate
    result = compare(baseline, candidate, metric="throughput", higher_is_better=True)
    assert result.verdict is Verdict.REGRESSED
    assert result.p_value < 0.001
    assert result.p_adjusted == result.p_value
    low, high = result.ratio_ci
    assert low <= result.ratio <= high
    assert high < 1.0
    assert low <= 0.8 <= high
    assert result.change == pytest.approx(result.ratio - 1.0)
    assert -0.25 < result.change < -0.15
    assert result.reason.startswith("p=")
    assert "3% minimum effect" in result.reason
    assert (result.n_baseline, result.n_candidate) == (10, 10)


def test_large_tpot_increase_is_regressed(slower_candidate):
    baseline, candidate = slower_candidate
    # Same runs as TPOT in ms: slower candidate -> higher TPOT, and lower is better.
    tpot_baseline, tpot_candidate = 1000.0 / baseline, 1000.0 / candidate
    result = compare(tpot_baseline, tpot_candidate, metric="tpot", higher_is_better=False)
    assert result.verdict is Verdict.REGRESSED
    assert result.ratio > 1.15
    assert result.ratio_ci[0] > 1.0
    assert result.metric == "tpot"
    assert result.higher_is_better is False


def test_faster_candidate_is_improved_for_throughput_and_tpot(slower_candidate):
    # Swap roles: the 20%-slower runs are now the baseline, the faster ones the candidate.
    slow, fast = slower_candidate[1], slower_candidate[0]
    thr = compare(slow, fast, metric="throughput", higher_is_better=True)
    tpot = compare(1000.0 / slow, 1000.0 / fast, metric="tpot", higher_is_better=False)
    assert thr.verdict is Verdict.IMPROVED
    assert thr.ratio > 1.15
    assert thr.ratio_ci[0] > 1.0
    assert f"{thr.change * 100:+.1f}%" in thr.reason
    assert tpot.verdict is Verdict.IMPROVED
    assert tpot.ratio < 0.87
    assert f"{tpot.change * 100:+.1f}%" in tpot.reason


# --------------------------------------------------------------------------- minimum effect


def test_minimum_effect_rule():
    rng = np.random.default_rng(3)
    baseline = _lognormal(rng, 100.0, 0.001, 20)
    candidate = _lognormal(rng, 99.0, 0.001, 20)

    strict = compare(baseline, candidate, metric="throughput", higher_is_better=True)
    assert strict.p_value < 1e-6
    assert strict.verdict is Verdict.NO_DIFFERENCE
    assert "below the minimum practical effect 3%" in strict.reason
    assert strict.reason.startswith("significant")

    lenient = compare(
        baseline, candidate, metric="throughput", higher_is_better=True, min_effect=0.005
    )
    assert lenient.verdict is Verdict.REGRESSED
    assert "0.5% minimum effect" in lenient.reason


def test_not_significant_reason_differs_from_too_small():
    rng = np.random.default_rng(11)
    baseline = _lognormal(rng, 100.0, 0.3, 10)
    candidate = _lognormal(rng, 100.0, 0.3, 10)
    result = compare(baseline, candidate, metric="throughput", higher_is_better=True)
    assert result.p_value >= 0.05
    assert result.verdict is Verdict.NO_DIFFERENCE
    assert result.reason.startswith("not significant (p=")


# --------------------------------------------------------------------------- sample size


def test_min_achievable_p_matches_exact_mann_whitney():
    assert min_achievable_p(3, 3) == pytest.approx(0.1)
    assert min_achievable_p(5, 5) == pytest.approx(2 / 252)
    assert min_achievable_p(4, 6) == pytest.approx(2 / 210)
    assert min_achievable_p(0, 5) == 1.0
    assert min_achievable_p(5, 0) == 1.0
    assert min_achievable_p(1, 1) == 1.0
    # Complete separation attains the bound with scipy's exact test.
    exact = st.mannwhitneyu([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], method="exact").pvalue
    assert exact == pytest.approx(min_achievable_p(5, 5))


def test_three_vs_three_is_insufficient_and_names_sample_size():
    result = compare([100, 101, 102], [50, 51, 52], metric="throughput", higher_is_better=True)
    assert result.verdict is Verdict.INSUFFICIENT
    assert "smallest possible p is 0.100" in result.reason
    # 2 / C(8, 4) = 0.029 <= 0.05, so 4 per side is the minimum for a single comparison.
    assert "take at least 4 samples per side" in result.reason
    assert result.ratio == pytest.approx(51 / 101)


def test_family_of_four_needs_five_per_side():
    def family(n: int) -> dict[str, tuple[list[float], list[float]]]:
        base = [100.0 + i for i in range(n)]
        cand = [80.0 + i for i in range(n)]
        return {f"prompt{k}": (base, cand) for k in range(4)}

    four = compare_family(family(4), metric="throughput", higher_is_better=True)
    for result in four.values():
        assert result.verdict is Verdict.INSUFFICIENT
        assert "0.029 (x4 comparisons for Holm = 0.114) > alpha 0.05" in result.reason
        assert "take at least 5 samples per side" in result.reason

    # min p 0.0079, x4 = 0.032 < 0.05: a verdict is still reachable.
    five = compare_family(family(5), metric="throughput", higher_is_better=True)
    for result in five.values():
        assert result.verdict is Verdict.REGRESSED
        assert result.p_adjusted == pytest.approx(4 * 2 / 252)


def test_fewer_than_two_samples_is_insufficient():
    result = compare([100.0], [50.0, 51.0, 52.0], metric="throughput", higher_is_better=True)
    assert result.verdict is Verdict.INSUFFICIENT
    assert "1 vs 3 samples" in result.reason
    assert result.ratio_ci == (result.ratio, result.ratio)


def test_empty_side_is_insufficient_and_json_ready():
    result = compare([], [50.0, 51.0], metric="throughput", higher_is_better=True)
    assert result.verdict is Verdict.INSUFFICIENT
    assert math.isnan(result.ratio)
    data = result.to_dict()
    assert data["ratio"] is None
    json.dumps(data, allow_nan=False)


# --------------------------------------------------------------------------- Holm


def test_holm_textbook_example():
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_is_monotone_capped_and_order_preserving():
    rng = np.random.default_rng(5)
    raw = rng.uniform(0, 0.6, size=15).tolist()
    adjusted = holm_adjust(raw)
    assert len(adjusted) == len(raw)
    order = np.argsort(raw)
    sorted_adj = [adjusted[i] for i in order]
    assert all(a <= b for a, b in itertools.pairwise(sorted_adj))
    assert all(a >= p for a, p in zip(adjusted, raw, strict=True))
    assert max(adjusted) == 1.0
    assert holm_adjust([0.9, 0.8]) == [1.0, 1.0]
    assert holm_adjust([0.02]) == [0.02]
    assert holm_adjust([]) == []


def test_holm_rejects_invalid_p():
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            holm_adjust([0.01, bad])


def test_compare_family_applies_holm():
    base, cand = MODERATE_BASELINE, MODERATE_CANDIDATE
    alone = compare(base, cand, metric="throughput", higher_is_better=True)
    assert alone.p_value < 0.05
    assert alone.verdict is Verdict.IMPROVED

    rng = np.random.default_rng(2)
    null_b, null_c = _lognormal(rng, 100, 0.05, 8), _lognormal(rng, 100, 0.05, 8)
    pairs = {
        "short": (base, cand),
        "long": (null_b, null_c),
        "code": (null_c, null_b),
    }
    family = compare_family(pairs, metric="throughput", higher_is_better=True)
    assert list(family) == ["short", "long", "code"]
    short = family["short"]
    assert short.p_value == pytest.approx(alone.p_value)
    assert short.p_adjusted == pytest.approx(3 * alone.p_value)
    assert short.p_adjusted >= 0.05
    assert short.verdict is Verdict.NO_DIFFERENCE
    assert "not significant (p_adj=" in short.reason
    assert all(isinstance(c, Comparison) for c in family.values())
    assert compare_family({}, metric="throughput", higher_is_better=True) == {}


# --------------------------------------------------------------------------- bootstrap CI


def test_ratio_ci_degenerate_data_does_not_crash():
    assert ratio_of_medians_ci([10.0] * 6, [12.0] * 6) == pytest.approx((1.2, 1.2))
    result = compare([10.0] * 6, [10.0] * 6, metric="tpot", higher_is_better=False)
    assert result.verdict is Verdict.NO_DIFFERENCE
    assert result.ratio_ci == (1.0, 1.0)


def test_ratio_ci_is_seeded_and_brackets_the_ratio():
    rng = np.random.default_rng(9)
    b, c = _lognormal(rng, 100, 0.1, 15), _lognormal(rng, 90, 0.1, 15)
    first = ratio_of_medians_ci(b, c, seed=1)
    assert first == ratio_of_medians_ci(b, c, seed=1)
    assert first != ratio_of_medians_ci(b, c, seed=2)
    ratio = float(np.median(c) / np.median(b))
    assert first[0] < ratio < first[1]
    narrow = ratio_of_medians_ci(b, c, seed=1, confidence=0.5)
    assert first[0] < narrow[0] and narrow[1] < first[1]


def test_to_dict_is_json_ready():
    result = compare(MODERATE_BASELINE, MODERATE_CANDIDATE, metric="tpot", higher_is_better=False)
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["verdict"] == "regressed"
    assert data["metric"] == "tpot"
    assert data["ratio_ci"] == list(result.ratio_ci)
    assert data["change"] == pytest.approx(result.change)
    assert Verdict("insufficient samples") is Verdict.INSUFFICIENT


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, float("nan")])
def test_invalid_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        compare([1, 2, 3], [1, 2, 3], metric="x", higher_is_better=True, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        compare_family({"a": ([1, 2], [1, 2])}, metric="x", higher_is_better=True, alpha=alpha)


@pytest.mark.parametrize("min_effect", [-0.01, float("nan"), float("inf")])
def test_invalid_min_effect(min_effect):
    with pytest.raises(ValueError, match="min_effect"):
        compare([1, 2, 3], [1, 2, 3], metric="x", higher_is_better=True, min_effect=min_effect)


@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), float("inf")])
def test_non_positive_or_non_finite_samples(bad):
    with pytest.raises(ValueError, match=r"candidate values must be finite and > 0.*index 2"):
        compare([1.0, 2.0, 3.0], [1.0, 2.0, bad], metric="x", higher_is_better=True)
    with pytest.raises(ValueError, match="baseline values must be finite and > 0"):
        ratio_of_medians_ci([bad, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="prompt7: baseline"):
        compare_family({"prompt7": ([bad, 1.0], [1.0, 2.0])}, metric="x", higher_is_better=True)


def test_non_1d_sample_rejected():
    with pytest.raises(ValueError, match="1-D"):
        compare([[1.0, 2.0], [3.0, 4.0]], [1.0, 2.0], metric="x", higher_is_better=True)


def test_min_achievable_p_rejects_negative_sizes():
    with pytest.raises(ValueError, match=">= 0"):
        min_achievable_p(-1, 3)
