"""The one comparison, at its integration: starts, the family, TPOT beside throughput."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_specdecode.analysis.verdict.compare import compare_arms
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.schema import Phase

from ....support.synthetic import sample

QUIET = RestartNoise(0.005, 50.0, "stored A/A runs")
NOISES = {"throughput": QUIET, "tpot": QUIET}
BASE = [100.0, 101.0, 102.0, 103.0, 104.0]
SLOWER = [85.0, 86.0, 87.0, 88.0, 100.5]  # -12%, one pair of requests out of order: p = 0.016


def phase(name: str, rates: dict[str, list[float]], arm: str | None = None) -> Phase:
    arm = arm or name
    p = Phase(name=name, arm=arm, spec=None if arm == "baseline" else {"method": "ngram"})
    for prompt_type, values in rates.items():
        m = Measurement(prompt_type=prompt_type)
        m.samples = [sample(prompt_type, name, i, v) for i, v in enumerate(values)]
        p.measurements[prompt_type] = m
    return p


def compare(baseline: list[Phase], candidate: list[Phase]):
    return compare_arms(baseline, candidate, alpha=0.05, min_effect=0.03, noise=NOISES)


def test_the_ranks_are_holm_adjusted_over_the_whole_family() -> None:
    others = {name: BASE for name in ("math", "structured", "explanatory")}
    alone = compare([phase("baseline", {"coding": BASE})], [phase("ngram", {"coding": SLOWER})])
    assert alone["coding"].verdict is Verdict.REGRESSED  # 2 comparisons: p_adj 0.032
    family = compare(
        [phase("baseline", {"coding": BASE, **others})],
        [phase("ngram", {"coding": SLOWER, **others})],
    )
    coding = family["coding"]
    assert coding.throughput.p_adjusted == min(1.0, 8 * coding.throughput.p_value)
    assert coding.verdict is Verdict.INCONCLUSIVE, coding.reason  # 8 comparisons: 0.13
    assert "ranks do not confirm it" in coding.reason


def test_either_metric_regressing_is_a_regression() -> None:
    v = compare([phase("baseline", {"coding": BASE})], [phase("ngram", {"coding": SLOWER})])[
        "coding"
    ]
    # The synthetic requests have a fixed TTFT: slower requests also have a longer TPOT.
    assert v.tpot is not None and v.tpot.verdict is Verdict.REGRESSED
    assert v.regressed and v.reason == v.throughput.reason


def test_repeated_starts_of_both_arms_enter_the_comparison() -> None:
    base = [phase("baseline", {"coding": BASE}), phase("baseline#2", {"coding": BASE}, "baseline")]
    cand = [phase("ngram", {"coding": SLOWER}), phase("ngram#2", {"coding": SLOWER}, "ngram")]
    v = compare(base, cand)["coding"]
    assert (v.throughput.starts_baseline, v.throughput.starts_candidate) == (2, 2)
    assert (v.throughput.n_baseline, v.throughput.n_candidate) == (10, 10)


# The gate's order: a regression on either metric wins, then no verdict, then improved, then
# equivalent (only when both are). An undecided metric is never hidden behind the other's.
ORDER = [
    Verdict.REGRESSED,
    Verdict.INSUFFICIENT,
    Verdict.INCONCLUSIVE,
    Verdict.IMPROVED,
    Verdict.EQUIVALENT,
]


@pytest.mark.parametrize("tpot", ORDER, ids=str)
@pytest.mark.parametrize("throughput", ORDER, ids=str)
def test_the_prompt_types_verdict_is_the_first_of_its_metrics_in_the_gates_order(
    throughput: Verdict, tpot: Verdict
) -> None:
    v = compare([phase("baseline", {"coding": BASE})], [phase("ngram", {"coding": BASE})])["coding"]
    assert v.tpot is not None
    v = replace(
        v,
        throughput=replace(v.throughput, verdict=throughput, reason=f"throughput {throughput}"),
        tpot=replace(v.tpot, verdict=tpot, reason=f"TPOT {tpot}"),
    )
    first = min(throughput, tpot, key=ORDER.index)
    assert v.verdict is first
    assert v.reason == (f"throughput {first}" if throughput is first else f"TPOT {first}")
    assert v.undecided is (first in {Verdict.INSUFFICIENT, Verdict.INCONCLUSIVE})


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_other_clients_in_either_sides_window_give_no_verdict(side: str) -> None:
    base, cand = phase("baseline", {"coding": BASE}), phase("ngram", {"coding": SLOWER})
    dirty = (base if side == "baseline" else cand).measurements["coding"]
    dirty.foreign = "3 other requests finished"
    v = compare([base], [cand])["coding"]
    assert v.verdict is Verdict.CONTAMINATED and v.undecided
    assert v.contaminated == f"{side if side == 'baseline' else 'ngram'} 3 other requests finished"
    assert v.reason.startswith("other clients used the server while it was measured")


def test_one_gate_rule_for_the_suite_and_the_run_an_inconclusive_aa_run_passes_both(
    tmp_path,
) -> None:
    """An A/A run (the original against itself) that calls no difference passes the suite's
    test and the run's `passed`; an ordinary candidate that is inconclusive passes neither."""
    from pytest_specdecode.analysis.run import analyze
    from pytest_specdecode.config.arms import AA_ARM

    from ....support.synthetic import add_phase, record, settings

    for arm, passes in ((AA_ARM, True), ("ngram", False)):
        rec = record(settings(tmp_path, candidates=("ngram",)))
        rec.candidates = {arm: {} if arm == AA_ARM else rec.candidates["ngram"]}
        add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0})
        add_phase(rec, arm, {"coding": 20.0, "math": 16.0}, seed=1)
        analysis = analyze(rec)
        verdicts = list(analysis.verdicts[arm].values())
        assert {v.verdict for v in verdicts} == {Verdict.INCONCLUSIVE}  # 5% noise assumed
        assert analysis.outcome == "inconclusive"
        assert [v.passes for v in verdicts] == [passes, passes]
        assert analysis.passed is passes
