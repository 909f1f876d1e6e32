"""Repeated crossovers (analysis/replicas/model.py, looks.py, guard.py): the restart noise they
measure, the looks' levels, the stop, the guard's null, a dropped metric, the prompt terms, the
plan's reach; and the run as planned on simulated replicas (benchmarks/replica_crossover.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks.replica_crossover import (
    ASSUMED,
    DETECT,
    TESTBED,
    Replicas,
    planned_crossovers,
    run_rates,
    simulate,
)
from pytest_specdecode.analysis.replicas.crossover import CrossoverSlot, crossover_of, rotation
from pytest_specdecode.analysis.replicas.guard import (
    matched_differences,
    ranks_p,
    signed_rank_p,
)
from pytest_specdecode.analysis.replicas.looks import crossovers_needed, look_confidence, reach
from pytest_specdecode.analysis.replicas.model import Table
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict

ALPHA = 0.05


def _slots(rng: np.random.Generator, crossovers: int, *, prompts: int = 6, start_sd: float = 0.05,
           change: float = 0.0) -> list[CrossoverSlot]:  # fmt: skip
    """AB/BA crossovers, each prompt once a period, each period's starts of `start_sd`."""
    out = []
    levels = rng.normal(3.0, 0.3, prompts)
    for c in range(crossovers):
        for p, arms in enumerate(rotation(2, 2)):
            starts = rng.normal(0.0, start_sd, 2)
            for j in range(prompts):
                logs = levels[j] + starts + np.array(arms) * change + rng.normal(0.0, 0.05, 2)
                values = tuple(float(v) for v in np.exp(logs))
                out.append(CrossoverSlot(2 * c + p, j, arms, values, tuple(1 / v for v in values)))
    return out


def _period_means(slots: list[CrossoverSlot]) -> np.ndarray:
    periods = max(s.period for s in slots) + 1
    return np.array(
        [
            np.mean([math.log(s.throughput[1] / s.throughput[0]) for s in slots if s.period == p])
            for p in range(periods)
        ]
    )


def test_repeated_crossovers_measure_their_own_starts_and_set_an_assumption_aside() -> None:
    """N AB/BA crossovers: the change's variance is the spread of the periods' mean differences
    about `rho +- delta`, over 2N, on 2N - 2 degrees of freedom, whatever was assumed."""
    slots = _slots(np.random.default_rng(3), crossovers=3)
    d = _period_means(slots)
    sign = np.array([1.0 if p % 2 == 0 else -1.0 for p in range(d.size)])
    design = np.c_[np.ones(d.size), sign]
    beta, resid, *_ = np.linalg.lstsq(design, d, rcond=None)
    spread = float(resid[0]) / (d.size - 2)
    for assumed in (0.01, 0.05, 0.30):  # the assumption moves nothing once set aside
        got = crossover_of(
            slots, alpha=ALPHA, margin=0.03, restart_noise={"throughput": RestartNoise.assumed(
                assumed), "tpot": RestartNoise.assumed(assumed)}, planned=3,
        ).of("throughput")  # fmt: skip
        assert got.change.estimate == pytest.approx(beta[1])
        assert got.change.se**2 == pytest.approx(spread / d.size)
        assert got.change.df == pytest.approx(d.size - 2)
        assert got.noise is not None and got.noise.measured
        assert "starts (3 crossovers, 4 df)" in got.noise.source
        assert "assumption set aside" in got.noise.source
    # a measured outside is pooled with them: its degrees of freedom are added
    measured = RestartNoise(0.05, 7.0, "host profile x", True)
    pooled = crossover_of(
        slots, alpha=ALPHA, margin=0.03, restart_noise={"throughput": measured, "tpot": measured},
        planned=3,
    ).of("throughput")  # fmt: skip
    assert pooled.noise is not None and pooled.noise.df == pytest.approx(4 + 7)
    assert "host profile x" in pooled.noise.source
    assert pooled.change.df > got.change.df


def test_one_crossover_takes_the_outside_noise_and_never_stops_a_longer_run() -> None:
    slots = _slots(
        np.random.default_rng(4), crossovers=1, prompts=12, change=math.log(0.5), start_sd=0.0
    )
    assumed = {m: RestartNoise.assumed(0.01) for m in ("throughput", "tpot")}
    early = crossover_of(slots, alpha=ALPHA, margin=0.03, restart_noise=assumed, planned=4)
    assert early.of("throughput").verdict is Verdict.REGRESSED  # a halving: decided at look 1
    assert early.decided and not early.measured and not early.stops  # but not on an assumption
    measured = {m: RestartNoise(0.01, 8.0, "profile", True) for m in ("throughput", "tpot")}
    assert crossover_of(slots, alpha=ALPHA, margin=0.03, restart_noise=measured, planned=4).stops


def test_each_look_takes_its_boundary_and_the_last_no_less_than_the_fixed_design() -> None:
    fixed = 1 - 2 * ALPHA / 2
    assert look_confidence(1, 1, alpha=ALPHA, family=2) == pytest.approx(fixed)
    levels = [look_confidence(k, 4, alpha=ALPHA, family=2) for k in (1, 2, 3, 4)]
    assert levels[0] > 0.9999 and levels == sorted(levels, reverse=True)  # early looks spend little
    assert fixed < levels[-1] < 1 - 2 * ALPHA / 2 / 2  # the last: a little wider than fixed
    slots = _slots(np.random.default_rng(5), crossovers=2)
    noise = {m: RestartNoise(0.02, 8.0, "p", True) for m in ("throughput", "tpot")}
    at_two = crossover_of(slots, alpha=ALPHA, margin=0.03, restart_noise=noise, planned=4)
    assert at_two.of("throughput").change.confidence == pytest.approx(levels[1])
    assert (at_two.crossovers, at_two.planned) == (2, 4)


def test_the_guard_matches_each_prompt_across_the_periods_and_holds_its_null() -> None:
    """Each prompt once a period and no starts: Koch's test saw the second period's aligned
    values as the first's negatives (9-13% false rejections); the signed-rank test over the
    matched differences rejects at its level."""
    slots = _slots(np.random.default_rng(6), crossovers=2, prompts=3, start_sd=0.0)
    table = Table.of(slots, ["throughput"])
    d = {(s.period, s.prompt): math.log(s.throughput[1] / s.throughput[0]) for s in slots}
    want = sorted(d[(2 * c, j)] - d[(2 * c + 1, j)] for c in (0, 1) for j in range(3))
    assert sorted(matched_differences(table, "throughput")) == pytest.approx(want)
    rng = np.random.default_rng(7)
    runs = 300
    rejected = np.mean(
        [
            ranks_p(Table.of(_slots(rng, 1, prompts=24, start_sd=0.0), ["throughput"]),
                    "throughput") < ALPHA
            for _ in range(runs)
        ]
    )  # fmt: skip
    assert rejected <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / runs)


def test_a_metric_a_slot_lacks_is_named_with_the_family_it_leaves() -> None:
    slots = _slots(np.random.default_rng(8), crossovers=1)
    slots[4] = dataclasses.replace(slots[4], tpot=None)
    result = crossover_of(slots, alpha=ALPHA, margin=0.03, restart_noise={"throughput": ASSUMED})
    assert result.family == 1 and {m.metric for m in result.metrics} == {"throughput"}
    (why,) = result.dropped
    assert why.startswith("tpot: not analysed") and "period 1" in why and "one-token" in why
    assert result.to_dict()["dropped"] == [why]


def test_prompt_terms_are_fitted_only_where_they_have_degrees_of_freedom() -> None:
    noise = {m: ASSUMED for m in ("throughput", "tpot")}
    once = crossover_of(_slots(np.random.default_rng(9), 1), alpha=ALPHA, margin=0.03,
                        restart_noise=noise)  # fmt: skip
    assert once.of("throughput").prompt_terms == 0  # each prompt once a period: none left
    twice = crossover_of(_slots(np.random.default_rng(9), 2), alpha=ALPHA, margin=0.03,
                         restart_noise=noise, planned=2)  # fmt: skip
    assert twice.of("throughput").prompt_terms == 2 * (6 - 1)  # each prompt's replica and arm


def test_the_plan_needs_more_crossovers_for_noisier_starts_and_fewer_once_measured() -> None:
    common = dict(slot_var=0.0032, slots=48, most=40, alpha=ALPHA, family=2, margin=0.03)
    quiet = crossovers_needed(0.10, RestartNoise(0.01, 8.0, "p", True), **common)
    noisy = crossovers_needed(0.10, RestartNoise(0.05, 8.0, "p", True), **common)
    assumed = crossovers_needed(0.10, RestartNoise.assumed(0.05), **common)
    assert quiet is not None and noisy is not None and assumed is not None
    assert quiet < noisy < assumed  # an assumption is set aside: the run's own df only
    found = reach(RestartNoise(0.05, 8.0, "p", True), crossovers=noisy, **{
        k: v for k, v in common.items() if k != "most"})  # fmt: skip
    assert found.detectable <= 0.10 < reach(
        RestartNoise(0.05, 8.0, "p", True), crossovers=noisy - 1,
        **{k: v for k, v in common.items() if k != "most"},
    ).detectable  # fmt: skip


SMALL = Replicas(prompts=6, repeats=2)  # 12 slots a period: a unit test's seconds


@pytest.mark.parametrize("measured", [False, True], ids=["assumed", "A/A measured"])
def test_the_run_as_planned_errs_within_alpha_over_m_and_calls_a_true_minus_ten(
    measured: bool,
) -> None:
    """docs/statistics.md's table at a small scale, a look after each crossover. Starts of 10%
    (twice the assumption), four crossovers of 6 slots a period, margin 0: per metric and
    direction false calls within alpha/m plus two standard errors (a variance clipped at its
    slots' part on the starts' few df called 8%). Starts of 2%, the plan's crossovers: a true
    -10% called regressed per candidate in 80% of runs at least (less two standard errors),
    never improved, often before the last crossover."""
    outside = None if measured else ASSUMED
    runs = 200
    null = dataclasses.replace(SMALL, repeats=1, restart_sd=0.10)
    found = run_rates(null, runs, planned=4, outside=outside, alpha=ALPHA, margin=0.0, seed=11)
    bound = ALPHA / 2 + 2 * math.sqrt(ALPHA / 2 * (1 - ALPHA / 2) / runs)
    assert found["regressed"] <= bound and found["improved"] <= bound
    model = dataclasses.replace(SMALL, change=DETECT)
    known = outside or RestartNoise(model.restart_sd, model.noise_df, "A/A", True)
    planned = planned_crossovers(model, known, alpha=ALPHA, margin=0.03)
    runs = 40
    found = run_rates(model, runs, planned=planned, outside=outside, alpha=ALPHA, margin=0.03,
                      seed=12)  # fmt: skip
    assert found["candidate"][Verdict.REGRESSED] >= 0.8 - 2 * math.sqrt(0.16 / runs)
    assert found["candidate"][Verdict.IMPROVED] == 0.0
    assert found["made"] < planned


def test_the_test_bed_s_noise_asks_for_many_crossovers() -> None:
    """At the test bed's measured noise (a slot's difference 85%, benchmarks/replica_crossover.py
    → TESTBED), the plan asks for more crossovers than the default 4; its number calls a 10%
    change with 80% power, one fewer does not."""
    common = dict(slot_var=TESTBED.slot_var, slots=40, alpha=ALPHA, family=2, margin=0.03)
    fixed = crossovers_needed(0.10, ASSUMED, most=40, looks=False, **common)  # the quick answer
    assert fixed is not None and fixed > 4
    assert reach(ASSUMED, crossovers=fixed, looks=False, **common).detectable <= 0.10
    assert reach(ASSUMED, crossovers=fixed - 1, looks=False, **common).detectable > 0.10
    slots, _ = simulate(np.random.default_rng(13), TESTBED, 2)
    assert {s.period for s in slots} == {0, 1, 2, 3} and len(slots) == 4 * 40


def test_the_signed_rank_test_is_scipy_s_without_its_overhead() -> None:
    rng = np.random.default_rng(15)
    for n in (3, 8, 30, 50, 51, 120):
        x = rng.normal(0.2, 1.0, n)
        assert signed_rank_p(x) == pytest.approx(scipy_stats.wilcoxon(x).pvalue, rel=1e-9)
    assert signed_rank_p(np.zeros(4)) == 1.0
