"""The crossover across replicas (analysis/replicas/crossover.py): the closed form, the
rotation, and its false calls and power on simulated replicas (benchmarks/replica_crossover.py)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks.replica_crossover import Replicas, rates
from pytest_specdecode.analysis.replicas.crossover import CrossoverSlot, crossover_of, rotation
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict


def _two_by_two(rng: np.random.Generator, *, prompts: int, repeats: int, distinct: bool = False):
    """Random 2x2 slots; each prompt sent `repeats` times per period (or every slot its own)."""
    slots = []
    for period, arms in enumerate(rotation(2, 2)):
        for i in range(prompts * repeats):
            prompt = (period, i) if distinct else i % prompts
            a, b = np.exp(rng.normal(3.0, 0.3, 2))
            slots.append(CrossoverSlot(period, prompt, arms, (float(a), float(b))))
    return slots


def _noise(sd: float, df: float = 8.0) -> dict[str, RestartNoise]:
    return {"throughput": RestartNoise(sd, df, "test", True)}


def _d(slots, period):
    return np.array(
        [math.log(s.throughput[1] / s.throughput[0]) for s in slots if s.period == period]
    )


def test_the_rotation_serves_each_arm_once_on_each_replica() -> None:
    assert rotation(2, 2) == ((0, 1), (1, 0))
    for replicas, arms in itertools.product((2, 3, 4), (2, 3, 4)):
        schedule = rotation(replicas, arms)
        assert len(schedule) == arms
        assert schedule[0][0] == 0  # the first replica keeps its original in the first period
        for r in range(replicas):
            assert sorted(p[r] for p in schedule) == list(range(arms))
        if replicas == arms:  # a Latin square: each period serves each arm once
            assert all(sorted(p) == list(range(arms)) for p in schedule)
    with pytest.raises(ValueError):
        rotation(1, 2)


def test_two_by_two_is_the_closed_form_without_prompt_repeats() -> None:
    slots = _two_by_two(np.random.default_rng(3), prompts=10, repeats=2, distinct=True)
    d1, d2 = _d(slots, 0), _d(slots, 1)
    got = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.0)).of("throughput")
    assert got.change.estimate == pytest.approx((d1.mean() - d2.mean()) / 2)
    assert got.replicas[0].estimate == pytest.approx((d1.mean() + d2.mean()) / 2)
    # no restart noise: the slots' own spread, on n1 + n2 - 2 degrees of freedom
    pooled = (np.sum((d1 - d1.mean()) ** 2) + np.sum((d2 - d2.mean()) ** 2)) / (
        d1.size + d2.size - 2
    )
    assert got.change.df == pytest.approx(d1.size + d2.size - 2)
    assert got.change.se**2 == pytest.approx(pooled * (1 / d1.size + 1 / d2.size) / 4)
    # with a restart noise: one start's variance added (four starts, each weighed 1/2)
    noisy = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.03, 1e9))
    change = noisy.of("throughput").change
    assert change.se**2 == pytest.approx(0.03**2 + got.change.se**2)
    assert change.df >= 8.0  # Satterthwaite's: never below the fewer of its parts' own


def test_two_by_two_with_repeated_prompts_is_each_prompts_closed_form_averaged() -> None:
    slots = _two_by_two(np.random.default_rng(5), prompts=6, repeats=3)
    per_prompt = []
    for j in range(6):
        d = [
            np.mean([math.log(s.throughput[1] / s.throughput[0]) for s in slots
                     if s.prompt == j and s.period == p])
            for p in (0, 1)
        ]  # fmt: skip
        per_prompt.append(((d[0] - d[1]) / 2, (d[0] + d[1]) / 2))
    got = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.02)).of("throughput")
    assert got.change.estimate == pytest.approx(np.mean([c for c, _ in per_prompt]))
    assert got.replicas[0].estimate == pytest.approx(np.mean([r for _, r in per_prompt]))
    # the slots' 36 within-slot values less 2 x 6 prompt terms (each prompt's own change and
    # replica effect), with the restart noise's 8 (Satterthwaite: at most their sum)
    assert 8.0 <= got.change.df <= 36 - 12 + 8.0
    levels = [
        np.mean([np.mean(np.log(s.throughput)) for s in slots if s.period == p]) for p in (0, 1)
    ]
    assert got.periods[0].estimate == pytest.approx(levels[1] - levels[0])


def test_a_larger_rotation_recovers_known_effects() -> None:
    """Three replicas, three arms, no noise: every effect comes back exactly."""
    replica, arm, period, level = (0.0, 0.1, -0.2), (0.0, -0.3, 0.05), (0.0, 0.04, -0.02), (1, 2, 3)
    slots = [
        CrossoverSlot(p, j, arms, tuple(math.exp(level[j] + period[p] + replica[r] + arm[arms[r]])
                                        for r in range(3)))
        for p, arms in enumerate(rotation(3, 3))
        for j in (0, 1, 2) * 2
    ]  # fmt: skip
    slots = [
        CrossoverSlot(s.period, s.prompt, s.arms, tuple(v * (1 + 1e-9 * i) for v in s.throughput))
        for i, s in enumerate(slots)
    ]
    result = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.01))
    assert (result.replicas, result.arms, result.periods) == (3, 3, 3)
    for a in (1, 2):
        assert result.of("throughput", a).change.estimate == pytest.approx(arm[a], abs=1e-6)
    got = result.of("throughput", 1)
    assert [e.estimate for e in got.replicas] == pytest.approx(replica[1:], abs=1e-6)
    assert [e.estimate for e in got.periods] == pytest.approx(period[1:], abs=1e-6)


def _rotated(rng: np.random.Generator, replicas: int, arms: int) -> list[CrossoverSlot]:
    """Slots of a rotation, 4 prompts twice a period, throughput and TPOT per replica; arm 1
    10% slower and arm 2 5% faster than the baseline, so that the ranks' p-values are small."""
    change = (0.0, math.log(0.9), math.log(1.05))
    slots = []
    for period, served in enumerate(rotation(replicas, arms)):
        for i in range(8):
            speed = np.exp(rng.normal(3.0, 0.3) + np.array([change[a] for a in served])
                           + rng.normal(0.0, 0.02, replicas))  # fmt: skip
            tpot = 1.0 / speed * np.exp(rng.normal(0.0, 0.01, replicas))
            slots.append(CrossoverSlot(period, i % 4, served, tuple(map(float, speed)),
                                       tuple(map(float, tpot))))  # fmt: skip
    return slots


@pytest.mark.parametrize(
    ("replicas", "arms", "tpot_missing", "family"),
    [
        (2, 2, False, 2),  # one candidate, throughput and TPOT
        (2, 2, True, 1),  # one slot without TPOT: throughput alone
        (2, 3, False, 4),  # two candidates: twice the family
        (3, 3, False, 4),
        (3, 3, True, 2),
    ],
)
def test_the_family_is_the_candidates_times_the_metrics_every_slot_has(
    replicas: int, arms: int, tpot_missing: bool, family: int
) -> None:
    """docs/statistics.md: each change at the family's 1 - 2 alpha / m (m = candidates x
    metrics), its ranks' guard Holm over the same family; a metric a slot lacks leaves it."""
    alpha = 0.05
    slots = _rotated(np.random.default_rng(7), replicas, arms)
    if tpot_missing:  # e.g. a one-token output in one slot
        slots[5] = CrossoverSlot(slots[5].period, slots[5].prompt, slots[5].arms,
                                 slots[5].throughput, None)  # fmt: skip
    noise = RestartNoise(0.01, 8.0, "test", True)
    result = crossover_of(
        slots, alpha=alpha, margin=0.03, restart_noise={"throughput": noise, "tpot": noise}
    )
    assert len(result.metrics) == family
    assert {m.metric for m in result.metrics} == {"throughput"} | (
        set() if tpot_missing else {"tpot"}
    )
    for m in result.metrics:
        assert m.change.confidence == pytest.approx(1 - 2 * alpha / family)
        # the interval's half-width is the t quantile of the family's level, and so is each
        # replica's and period's (one level for every interval a report prints)
        for estimate in (m.change, *m.replicas, *m.periods):
            half = (estimate.high - estimate.low) / 2
            t = scipy_stats.t.ppf(1 - alpha / family, estimate.df)
            assert half == pytest.approx(t * estimate.se, rel=1e-6), (m.metric, m.arm)
    # Holm over the family: the smallest p-value is multiplied by the family's size
    first = min(result.metrics, key=lambda m: m.p_value)
    assert 0 < first.p_value * family < 1
    assert first.p_adjusted == pytest.approx(first.p_value * family)
    assert all(m.p_adjusted >= first.p_adjusted for m in result.metrics)


def test_replicas_that_never_swap_are_refused() -> None:
    slots = [CrossoverSlot(0, i, (0, 1), (1.0 + i, 2.0 + i)) for i in range(8)]
    with pytest.raises(ValueError, match="separate the replicas from the arms"):
        crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.02))


def test_a_faster_replica_fools_period_one_alone_but_not_the_crossover() -> None:
    """Replica B 10% faster, no true change, starts of 2%: at margin 0 the crossover calls each
    direction no more often than alpha (within two binomial standard errors), where period 1
    alone, the candidate on B against the baseline on A, calls the 10% an improvement; its
    intervals cover; a true -10% the crossover calls regressed at the default margin."""
    runs, alpha, seed = 80, 0.05, 11
    bound = alpha + 2 * math.sqrt(alpha * (1 - alpha) / runs)
    fooled = rates(Replicas(), runs, alpha=alpha, margin=0.0, seed=seed)
    cross, alone = fooled["calls"]["crossover"], fooled["calls"]["period 1 alone"]
    assert cross[Verdict.REGRESSED] <= bound and cross[Verdict.IMPROVED] <= bound
    assert alone[Verdict.IMPROVED] > 0.6
    assert fooled["mean"]["replica"] == pytest.approx(math.log(1.1), abs=0.01)
    noisier = rates(Replicas(restart_sd=0.03), runs, alpha=alpha, margin=0.0, seed=seed)
    assert max(noisier["calls"]["crossover"].values()) <= bound
    for effect in ("change", "replica", "period"):  # 95% intervals (alpha 0.05 over 2 metrics)
        assert noisier["coverage"][effect] >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / runs)
    power = rates(Replicas(change=math.log(0.9)), runs, alpha=alpha, margin=0.03, seed=seed)
    assert power["calls"]["crossover"][Verdict.REGRESSED] > 0.7
    assert power["calls"]["crossover"][Verdict.IMPROVED] == 0.0


def test_an_undecided_crossover_says_whether_slots_or_starts_would_narrow_it() -> None:
    slots = _two_by_two(np.random.default_rng(5), prompts=6, repeats=3)
    few = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.001))
    assert few.of("throughput").verdict is Verdict.INCONCLUSIVE
    assert "more slots per period would narrow it" in few.of("throughput").reason
    starts = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(1.0))
    assert "another crossover" in starts.of("throughput").reason
    assert "by crossover" in starts.of("throughput").reason


def test_the_result_prints_the_change_the_replica_and_the_period_and_serialises() -> None:
    slots = _two_by_two(np.random.default_rng(5), prompts=6, repeats=3)
    result = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.02))
    lines = result.of("throughput").lines()
    assert lines[0].startswith("throughput, arm 1 against the baseline: ")
    assert lines[1].startswith("replica 2 against replica 1: ")
    assert lines[2].startswith("period 2 against period 1: ")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["metrics"][0]["change"]["estimate"] == result.of("throughput").change.estimate
    assert data["metrics"][0]["verdict"] == result.of("throughput").verdict.value


def test_a_value_that_is_not_positive_or_a_missing_noise_is_named() -> None:
    slots = _two_by_two(np.random.default_rng(5), prompts=6, repeats=3)
    bad = [*slots[:-1], CrossoverSlot(1, 0, (1, 0), (1.0, 0.0))]
    with pytest.raises(ValueError, match=r"slot 35 \(period 1\): throughput"):
        crossover_of(bad, alpha=0.05, margin=0.03, restart_noise=_noise(0.02))
    with pytest.raises(ValueError, match="no restart noise given for throughput"):
        crossover_of(slots, alpha=0.05, margin=0.03, restart_noise={})


def test_a_restart_noise_of_no_weight_leaves_one_degree_of_freedom() -> None:
    slots = _two_by_two(np.random.default_rng(5), prompts=6, repeats=3)
    weightless = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.02, 0.0))
    weighted = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise=_noise(0.02, 8.0))
    assert weightless.of("throughput").change.df == 1.0
    assert weighted.of("throughput").change.df >= 8.0
