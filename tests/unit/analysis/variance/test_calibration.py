"""Calibration through the whole chain (tests/support/chain.py): seeded, over the real code.

Each simulated run is written as results.json, A/A runs go into the host's profile as the
plugin writes it, and the next run is analysed from its own file with the restart noise the
plugin would know. Nothing is handed to the analysis beside the files. The host: four prompt
types of twelve prompts whose own levels spread by 10%, a request's own noise 4%, and a shift
per server start shared by its prompt types. docs/statistics.md has the full tables
(`python -m benchmarks.calibration`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from pytest_specdecode.analysis.variance.power import design_power
from pytest_specdecode.analysis.variance.restarts import ASSUMED_WEIGHT
from pytest_specdecode.analysis.verdict.stats import Verdict
from pytest_specdecode.config.settings import RunConfig

from ....support.chain import DESIGNS, Rates, Route, SimHost, aa_estimates, rates, simulate_route

ALPHA = 0.05
ROUTES = {
    # the documented route: an A/A run of eight starts (--spec-repeats 4), then the run
    "aa-then-run": Route(aa_runs=1, aa_repeats=4, repeats=1),
    # nothing measured: the assumed restart noise, and the run's own repeated starts
    "repeats-1": Route(aa_runs=0, repeats=1),
    "repeats-2": Route(aa_runs=0, repeats=2),
    "repeats-3": Route(aa_runs=0, repeats=3),
}
SHIFTS = (0.0, 0.02, 0.046, 0.06)
RUNS = {"aa-then-run": 40, "repeats-1": 60, "repeats-2": 60, "repeats-3": 50}


def _within_alpha(found: list[Rates]) -> None:
    """Each shift's rate within alpha plus its Monte Carlo error, and the pooled rate within
    alpha plus the pooled error."""
    for r in found:
        assert r.regressed <= ALPHA + r.mc_error(ALPHA), found
        assert r.improved <= ALPHA + r.mc_error(ALPHA), found
    runs = sum(r.runs for r in found)
    pooled = Rates(runs, 0, 0, 0, 0)
    regressed = sum(r.regressed * r.runs for r in found) / runs
    improved = sum(r.improved * r.runs for r in found) / runs
    assert regressed <= ALPHA + pooled.mc_error(ALPHA) / 2, found
    assert improved <= ALPHA + pooled.mc_error(ALPHA) / 2, found


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_harmless_change_is_called_no_more_often_than_alpha(route: str, tmp_path: Path) -> None:
    """A/A: the same configuration against itself, at restart noises of 0 to 6% (the CPU
    host's is 4.6%): false "regressed" and false "improved" each at most alpha per run."""
    found = [
        rates(
            SimHost(start_sd=shift),
            ROUTES[route],
            effect=0.0,
            runs=RUNS[route],
            seed=100 + i,
            tmp=tmp_path / f"{shift}",
        )
        for i, shift in enumerate(SHIFTS)
    ]
    _within_alpha(found)


def test_a_host_twice_as_noisy_as_assumed_is_no_false_alarm_machine(tmp_path: Path) -> None:
    """Nothing measured, and the host's restart noise is 10%, twice the assumed 5% (a CI
    machine's A/A measured 8.6%): false "regressed" and "improved" each stay within alpha, at
    one and at three starts per arm. An assumption weighed like 12 measured degrees of freedom
    gave 12% false "regressed" at one start."""
    found = [
        rates(
            SimHost(start_sd=0.10),
            ROUTES[route],
            effect=0.0,
            runs=120,
            seed=40 + i,
            tmp=tmp_path / route,
        )
        for i, route in enumerate(("repeats-1", "repeats-3"))
    ]
    _within_alpha(found)


def test_power_for_a_ten_percent_regression_at_the_default_design(tmp_path: Path) -> None:
    """The default design (one start per arm, 6 to 16 requests) after the documented A/A run,
    on a quiet host (restart noise 1%): a true -10% is called regressed in >= 80% of runs."""
    r = rates(
        SimHost(start_sd=0.01), ROUTES["aa-then-run"], effect=-0.10, runs=60, seed=7, tmp=tmp_path
    )
    assert r.regressed >= 0.80, r
    assert r.improved == 0.0, r


def test_repeated_starts_buy_power_on_a_noisy_host(tmp_path: Path) -> None:
    """At the CPU host's 4.6%, with nothing measured: three starts per arm find a -20% change
    far more often than one, and the false alarms stay within alpha (the test above)."""
    one = rates(SimHost(start_sd=0.046), ROUTES["repeats-1"], effect=-0.2, runs=40, seed=8,
                tmp=tmp_path / "1")  # fmt: skip
    three = rates(SimHost(start_sd=0.046), ROUTES["repeats-3"], effect=-0.2, runs=40, seed=8,
                  tmp=tmp_path / "3")  # fmt: skip
    assert three.regressed >= one.regressed + 0.2, (one, three)


def test_pairing_by_prompt_gains_power_over_new_prompts_each_request(tmp_path: Path) -> None:
    """At equal cost (12 requests per start), a 10% regression on a host whose prompts spread
    by 15%: pairing by prompt finds it far more often than a design whose every request is a
    new prompt."""
    route = Route(aa_runs=1, aa_repeats=4, repeats=1, run=RunConfig(samples=12, max_samples=12))
    found = {
        pairing: rates(
            SimHost(start_sd=0.02, prompt_sd=0.15, pairing=pairing),
            route,
            effect=-0.10,
            runs=40,
            seed=9,
            tmp=tmp_path / pairing,
        )
        for pairing in ("paired", "unpaired")
    }
    assert found["paired"].regressed >= found["unpaired"].regressed + 0.2, found


def test_the_restart_noise_an_aa_run_writes_is_unbiased_and_as_sure_as_its_df_says(
    tmp_path: Path,
) -> None:
    """60 A/A runs of eight starts on a host whose restart noise is 4.6%, each read back from
    the host profile it wrote: the estimates centre on the truth (the prompts' spread is not
    counted as noise), and they scatter no more than their stated degrees of freedom allow
    (a start's shift is shared by its prompt types: 7 df, not 28)."""
    found = aa_estimates(
        SimHost(start_sd=0.046), ROUTES["aa-then-run"], runs=60, seed=31, tmp=tmp_path
    )
    estimates = [f["throughput"] for f in found]
    variance = np.array([n.variance for n in estimates])
    assert variance.mean() / 0.046**2 == pytest.approx(1.0, abs=0.2)
    assert np.mean(np.sqrt(variance) < 0.046 / 2) <= 0.12  # 12 df would allow 0.4%
    (df,) = {n.df for n in estimates}
    assert df == 7
    spread = np.array([n.start_variance for n in estimates])
    assert spread.var(ddof=1) / spread.mean() ** 2 <= 1.6 * 2 / df  # chi-square's, at its df


def test_the_runs_own_starts_never_count_as_measured_noise(tmp_path: Path) -> None:
    """Nothing stored, two starts per arm: every verdict's outside knowledge is the stated
    assumption, and the intervals still cover the truth as often as their confidence says."""
    route = ROUTES["repeats-2"]
    r = rates(SimHost(start_sd=0.046), route, effect=0.0, runs=60, seed=21, tmp=tmp_path / "c")
    nominal = 2 * ALPHA / 8  # each two-sided interval of a family of 8
    assert r.missed <= nominal + 0.015, r
    verdicts = simulate_route(
        SimHost(start_sd=0.046), route, effect=0.0, rng=np.random.default_rng(5),
        reports=tmp_path / "one",
    )  # fmt: skip
    for v in verdicts.values():
        for c in v.comparisons:
            assert not c.noise.measured and c.noise.source.startswith("unmeasured: assumed 5%")
            assert c.interval.df > 2 + ASSUMED_WEIGHT  # the run's own 2 df, and the assumption's


def test_the_plans_smallest_callable_change_is_called_four_times_in_five(tmp_path: Path) -> None:
    """The plan says what a design can call with 80% power (analysis/variance/power.py); the chain,
    given a true change of that size, calls it in about 80% of the comparisons."""
    host, route = SimHost(start_sd=0.01), ROUTES["aa-then-run"]
    noise = aa_estimates(host, route, runs=1, seed=3, tmp=tmp_path / "aa")[0]["throughput"]
    assert noise.residual is not None
    plan = design_power(
        noise, residual_var=noise.residual, starts=1, requests=16, family=8, alpha=ALPHA,
        margin=0.03,
    )  # fmt: skip
    rng = np.random.default_rng(9)
    called = []
    for i in range(40):
        verdicts = simulate_route(
            host, route, effect=-plan.detectable, rng=rng, reports=tmp_path / f"r{i}"
        )
        called += [v.throughput.verdict is Verdict.REGRESSED for v in verdicts.values()]
    assert np.mean(called) == pytest.approx(0.80, abs=0.12), plan


def _most_false_calls(runs: int, *, chance: float = 1e-4) -> int:
    """The most false calls a rate of alpha makes in `runs` but with probability < `chance`."""
    return int(binom.isf(chance, runs, ALPHA))


@pytest.mark.parametrize("design", DESIGNS)
def test_drift_within_a_start_is_no_false_alarm_in_any_design(design: str, tmp_path: Path) -> None:
    """A/A after the documented A/A run, both in this design, on a host whose throughput drifts
    within a start by 10% (AR(1), phi 0.75: 3-s blocks swing about ±15%, the H200's figures)
    beside a restart noise of 4.6%: false "regressed" and false "improved" each no more often
    than a rate of alpha would allow but once in 10^4 (docs/statistics.md, "Drift within a
    start", has the full table)."""
    runs = 40
    host = SimHost(start_sd=0.046, drift_sd=0.10)
    route = Route(aa_runs=1, aa_repeats=4, repeats=1, design=design)
    r = rates(host, route, effect=0.0, runs=runs, seed=61, tmp=tmp_path)
    most = _most_false_calls(runs)
    assert r.regressed * runs <= most and r.improved * runs <= most, (most, r)


# The H200's side-by-side figures (issue 37): each server's start effect 1.5%, a request's
# own spread 9%, drift 7% at phi 0.88 shared by the pair; 48 requests per prompt type.
SIDE_BY_SIDE = SimHost(start_sd=0.015, request_sd=0.09, drift_sd=0.07, drift_phi=0.88)
SIDE_ROUTE = Route(
    aa_runs=1, aa_repeats=3, repeats=1, run=RunConfig(samples=48, max_samples=48),
    design="together",
)  # fmt: skip


def test_side_by_side_by_pairs_calls_no_more_than_alpha_and_no_interval_runs_away(
    tmp_path: Path,
) -> None:
    """A/A side by side after an A/A run of three pairs, one pair of 48 requests per prompt
    type, analysed by pairs: false calls within alpha, and no interval wider than ±100% (one
    pair's df once reached 0.1, and its interval (0, 1e304))."""
    runs = 40
    r = rates(SIDE_BY_SIDE, SIDE_ROUTE, effect=0.0, runs=runs, seed=71, tmp=tmp_path)
    most = _most_false_calls(runs)
    assert r.regressed * runs <= most and r.improved * runs <= most, (most, r)
    assert r.widest < 1.0, r


def test_side_by_side_by_pairs_gains_power_over_one_at_a_time(tmp_path: Path) -> None:
    """Where the pair's two servers start alike (the H200's A/A pair agreed to 0.1%), the
    drift they share cancels in each slot: after an A/A run of eight pairs, a true -10% is
    called far more often by pairs than one arm at a time after an A/A run of eight starts, on
    the same host and requests. (After three A/A pairs, the offsets' 3 df keep the pairs'
    interval the wider in most comparisons: docs/statistics.md.)"""
    runs = 30
    host = replace(SIDE_BY_SIDE, start_sd=0.001)
    route = replace(SIDE_ROUTE, aa_repeats=8)
    by_pairs = rates(host, route, effect=-0.10, runs=runs, seed=72, tmp=tmp_path)
    alone = Route(1, 4, 1, SIDE_ROUTE.run, "interleaved")
    by_starts = rates(host, alone, effect=-0.10, runs=runs, seed=72, tmp=tmp_path)
    assert by_pairs.by_pairs > 0.9, by_pairs
    assert by_pairs.regressed > by_starts.regressed + 0.2, (by_pairs, by_starts)
