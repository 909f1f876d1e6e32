"""Load levels and their aggregates: pure functions."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import pytest

from pytest_specdecode.config.load import SLO, LoadLevel, check_slo_levels, load_levels, slo_config
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.measure.requests.loadgen import poisson_arrivals
from pytest_specdecode.record.requests.level_stats import level_stats, percentile


@dataclass
class S:
    ttft_s: float
    e2e_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float | None:
        return (
            None
            if self.output_tokens < 2
            else (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
        )

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.e2e_s


def test_level_labels_and_validation():
    assert LoadLevel(concurrency=4).label == "c4"
    assert LoadLevel(rate=2.5).label == "r2.5"
    assert LoadLevel(rate=2.0, concurrency=8).label == "r2-c8"
    assert LoadLevel(rate=1.0).open_loop and not LoadLevel(concurrency=1).open_loop
    for bad in ({}, {"concurrency": 0}, {"concurrency": True}, {"rate": 0.0}, {"rate": math.inf}):
        with pytest.raises(ValueError):
            LoadLevel(**bad)


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    a = poisson_arrivals(4000, 5.0, seed=1)
    assert a == poisson_arrivals(4000, 5.0, seed=1)
    assert a != poisson_arrivals(4000, 5.0, seed=2)
    assert a[0] == 0.0 and all(np.diff(a) > 0)
    gaps = np.diff(a)
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.06)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.1)  # exponential: sd = mean


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 99.9, 100])
def test_percentile_is_numpys_linear_interpolation(q):
    values = [3.0, 1.0, 7.5, 2.2, 9.9, 4.4, 0.1]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], q))


def test_slo_validation_and_goodness():
    with pytest.raises(ValueError, match="unknown percentile limit 'tpot_p99'"):
        SLO(percentiles={"tpot_p99": 5})
    with pytest.raises(ValueError, match="ttft_ms must be a positive number"):
        SLO(ttft_ms=0)
    slo = SLO(ttft_ms=100, tpot_ms=20)
    assert slo.good(S(0.05, 0.05 + 0.019 * 9, 10))
    assert not slo.good(S(0.15, 0.15 + 0.019 * 9, 10))  # TTFT too long
    assert not slo.good(S(0.05, 0.05 + 0.021 * 9, 10))  # TPOT too long
    assert not slo.good(S(0.05, 0.05, 1))  # no TPOT at all cannot meet a TPOT limit
    assert SLO(e2e_ms=100).good(S(0.05, 0.05, 1))


def test_level_stats_from_known_samples():
    samples = [S(0.1, 1.1, 11), S(0.2, 2.2, 21), S(0.3, 1.3, 2), S(0.4, 0.4, 1)]
    stats = level_stats(
        samples,
        wall_s=4.0,
        slo=SLO(ttft_ms=250, percentiles={"ttft_p50_ms": 250, "tpot_p99_ms": 500}),
        cpu_s=1.0,
        peak_in_flight=3,
        send_lags_s=[0.0, 0.004],
    )
    assert stats.n == 4 and stats.output_tokens == 35
    assert stats.output_tokens_per_s == 35 / 4.0
    assert stats.request_rate == 1.0
    assert stats.median_tokens_per_s == statistics.median([10, 21 / 2.2, 2 / 1.3, 2.5])
    assert stats.ttft_p50_ms == pytest.approx(250.0)
    tpots = [100.0, 100.0, 1000.0]  # the one-token request has none
    assert stats.tpot_p50_ms == pytest.approx(100.0)
    assert stats.tpot_p99_ms == pytest.approx(float(np.percentile(tpots, 99)))
    assert stats.good == 2 and stats.goodput == 0.5 and stats.good_fraction == 0.5
    checks = {c.key: c.met for c in stats.slo_checks}
    assert checks == {"ttft_p50_ms": True, "tpot_p99_ms": False}
    assert stats.client_cpu_share == 0.25 and not stats.client_saturated
    assert stats.peak_in_flight == 3 and stats.max_send_lag_ms == pytest.approx(4.0)
    data = stats.to_dict()
    assert data["slo_checks"][1] == {
        "key": "tpot_p99_ms",
        "value": pytest.approx(982.0),
        "limit": 500.0,
        "met": False,
    }


# --------------------------------------------------------------------------- config/load.py


def test_levels_from_the_command_line():
    assert load_levels() == (LoadLevel(concurrency=1),)
    assert [lv.label for lv in load_levels("1,4,16")] == ["c1", "c4", "c16"]
    assert [lv.label for lv in load_levels(8)] == ["c8"]
    assert [lv.label for lv in load_levels(None, "0.5, 2")] == ["r0.5", "r2"]
    capped = load_levels("8", "1,2", seed=3)
    assert [lv.label for lv in capped] == ["r1-c8", "r2-c8"]
    assert {lv.seed for lv in capped} == {3}


@pytest.mark.parametrize(
    ("concurrency", "rate", "message"),
    [
        ("1,x", None, "--spec-concurrency: 'x' is not an integer >= 1"),
        ("0", None, "--spec-concurrency: '0' is not an integer >= 1"),
        ("1.5", None, "'1.5' is not an integer"),
        ("4,4", None, "a level is given twice"),
        ("1,,4", None, "expected a comma-separated list"),
        (None, "-1", "--spec-rate: '-1' is not a positive number"),
        (None, "inf", "'inf' is not a positive number"),
        ("1,4", "2", "is ambiguous: give one concurrency"),
    ],
)
def test_bad_levels_are_usage_errors(concurrency, rate, message):
    with pytest.raises(ConfigError) as info:
        load_levels(concurrency, rate)
    assert message in str(info.value)


def test_slo_table_with_per_level_overrides():
    config = slo_config(
        {"ttft_ms": 2000, "tpot_p99_ms": 300, "levels": {"c16": {"tpot_ms": 300}}},
        where="exp.toml",
    )
    assert config.default == SLO(ttft_ms=2000, percentiles={"tpot_p99_ms": 300})
    c16 = config.for_level(LoadLevel(concurrency=16))
    assert (c16.ttft_ms, c16.tpot_ms, dict(c16.percentiles)) == (2000, 300, {"tpot_p99_ms": 300})
    assert config.for_level(LoadLevel(concurrency=1)) is config.default
    check_slo_levels(config, load_levels("1,16"), where="exp.toml")
    with pytest.raises(ConfigError, match=r"\[slo.levels\]: no measured level c16; the levels"):
        check_slo_levels(config, load_levels("1,4"), where="exp.toml")
    assert slo_config({}, where="x").default == SLO()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"tpot_ms": -1}, "exp.toml [slo]: tpot_ms must be a positive number"),
        ({"tpot_p99": 5}, "exp.toml [slo]: unknown percentile limit 'tpot_p99'"),
        ({"levels": {"c4": {"ttft_p50_ms": "fast"}}}, "[slo.levels.c4]: ttft_p50_ms must be"),
        ({"levels": 3}, "levels must be a table of level labels"),
    ],
)
def test_bad_slo_tables(table, message):
    with pytest.raises(ConfigError) as info:
        slo_config(table, where="exp.toml")
    assert message in str(info.value)
