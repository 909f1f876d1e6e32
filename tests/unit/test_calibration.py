"""Calibration by Monte Carlo over the real analysis code (seeded, seconds).

What these figures assume: requests' log throughput is normal around their start's level with a
4% spread; each server start shifts the level (shared by its prompt types, or one shift per
prompt type); four prompt types, throughput and TPOT; alpha 5%, margin 3%; the default design
(6 to 16 requests per prompt type and start, one start per arm) unless a case says otherwise.
docs/statistics.md has the tables these tests pin down.
"""

from __future__ import annotations

import math

import pytest

from pytest_specdecode.analysis.stats import RestartNoise
from pytest_specdecode.config.settings import RunConfig

from ..support.simulate import Scenario, rates

RUNS = 300
DEFAULT = RunConfig()
DESIGN = {"samples": DEFAULT.samples, "max_samples": DEFAULT.max_samples, "repeats": 1}
ASSUMED = RestartNoise(DEFAULT.assumed_restart_noise, math.inf, "unmeasured: assumed")


def known(sd: float) -> RestartNoise:
    return RestartNoise(sd, 20.0, "measured by A/A runs")


@pytest.mark.parametrize("shared", [True, False], ids=["shared-shift", "own-shift"])
@pytest.mark.parametrize(
    ("start_sd", "noise"),
    [(0.02, known(0.02)), (0.05, ASSUMED)],
    ids=["2%-measured", "5%-unmeasured"],
)
def test_aa_false_alarms_stay_within_alpha(start_sd: float, noise: RestartNoise, shared) -> None:
    """The same configuration against itself, per-start shifts as large as the noise the
    analysis is told (or assumes): the family calls anything in at most alpha of the runs."""
    s = Scenario(start_sd=start_sd, noise=noise, shared_shift=shared, **DESIGN)
    r = rates(s, runs=RUNS, seed=11)
    assert r.regressed <= s.alpha + r.mc_error(s.alpha), r
    assert r.improved <= s.alpha + r.mc_error(s.alpha), r


def test_a_change_inside_the_margin_is_not_a_regression() -> None:
    s = Scenario(effect=-0.02, start_sd=0.02, noise=known(0.02), shared_shift=False, **DESIGN)
    r = rates(s, runs=RUNS, seed=12)
    assert r.regressed <= s.alpha + r.mc_error(s.alpha), r


def test_power_for_a_ten_percent_regression_at_the_default_design() -> None:
    """With the restart noise measured at 1% (a quiet GPU host; the 2-core CPU testbed is
    noisier, see docs/statistics.md for what more noise costs)."""
    s = Scenario(effect=-0.10, start_sd=0.01, noise=known(0.01), **DESIGN)
    r = rates(s, runs=RUNS, seed=13)
    assert r.regressed >= 0.80, r


PROMPT_SET = {
    "samples": 8,
    "max_samples": None,
    "prompts": 8,
    "prompt_sd": 0.15,
    "request_sd": 0.03,
    "start_sd": 0.02,
    "noise": known(0.02),
}


def test_paired_prompts_keep_false_alarms_within_alpha() -> None:
    """Eight prompts whose own levels spread by 15%, the same in every phase: the analysis
    removes each prompt's level; the same configuration is still called nothing."""
    s = Scenario(**PROMPT_SET)
    r = rates(s, runs=RUNS, seed=21)
    assert r.regressed <= s.alpha + r.mc_error(s.alpha), r
    assert r.improved <= s.alpha + r.mc_error(s.alpha), r


def test_pairing_by_prompt_gains_power_over_new_prompts_each_request() -> None:
    """At equal cost (8 requests per prompt type and start), a 10% regression: pairing by
    prompt finds it far more often than a design whose every request is a new prompt
    (benchmarks/paired_design.py has the table, docs/statistics.md the figures)."""
    paired = rates(Scenario(effect=-0.10, **PROMPT_SET), runs=RUNS, seed=22)
    unpaired = rates(Scenario(effect=-0.10, pairing="unpaired", **PROMPT_SET), runs=RUNS, seed=22)
    assert paired.regressed >= unpaired.regressed + 0.2, (paired, unpaired)
