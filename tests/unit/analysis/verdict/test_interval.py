"""analysis/verdict/interval.py: the interval of the change, requests nested within server
starts; pure, no server (by pairs: tests/unit/analysis/variance/test_pairs.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from pytest_specdecode.analysis.verdict.interval import Interval, Question, nested_interval
from pytest_specdecode.analysis.verdict.stats import RestartNoise

ASSUMED = RestartNoise.assumed(0.05)
KNOWN = RestartNoise(0.02, 10.0, "stored A/A runs")


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
