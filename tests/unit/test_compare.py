"""The one comparison, at its integration: Holm over the prompt types, TPOT beside throughput."""

from __future__ import annotations

from scipy import stats as st

from pytest_specdecode.analysis.compare import compare_arms
from pytest_specdecode.analysis.stats import Verdict
from pytest_specdecode.record.schema import Measurement, Phase

from ..support.synthetic import sample

BASE = [100.0, 101.0, 102.0, 103.0, 104.0]
BORDERLINE = [95.0, 96.0, 97.0, 98.0, 100.5]  # -4.9%, one pair out of order: p = 0.016


def phase(name: str, rates: dict[str, list[float]]) -> Phase:
    p = Phase(name=name, arm=name, spec=None if name == "baseline" else {"method": "ngram"})
    for prompt_type, values in rates.items():
        m = Measurement(prompt_type=prompt_type)
        m.samples = [sample(prompt_type, name, i, v) for i, v in enumerate(values)]
        p.measurements[prompt_type] = m
    return p


def test_a_change_significant_alone_is_not_after_holm_over_the_family() -> None:
    raw = st.mannwhitneyu(BASE, BORDERLINE, alternative="two-sided").pvalue
    assert 0.05 / 4 < raw < 0.05  # significant on its own, not among four
    others = {name: BASE for name in ("math", "structured", "explanatory")}
    verdicts = compare_arms(
        [phase("baseline", {"coding": BASE, **others})],
        [phase("ngram", {"coding": BORDERLINE, **others})],
        alpha=0.05,
        min_effect=0.03,
    )
    coding = verdicts["coding"]
    assert coding.throughput.p_value == raw
    assert coding.throughput.p_adjusted == min(1.0, 4 * raw)
    assert coding.verdict is Verdict.NO_DIFFERENCE, coding.reason
    # The same prompt type compared alone is a regression: the family made the difference.
    alone = compare_arms(
        [phase("baseline", {"coding": BASE})],
        [phase("ngram", {"coding": BORDERLINE})],
        alpha=0.05,
        min_effect=0.03,
    )
    assert alone["coding"].verdict is Verdict.REGRESSED


def test_either_metric_regressing_is_a_regression() -> None:
    verdicts = compare_arms(
        [phase("baseline", {"coding": BASE})],
        [phase("ngram", {"coding": BORDERLINE})],
        alpha=0.05,
        min_effect=0.03,
    )
    v = verdicts["coding"]
    # The synthetic requests have a fixed TTFT: slower requests also have a longer TPOT.
    assert v.tpot is not None and v.tpot.verdict is Verdict.REGRESSED
    assert v.regressed and v.reason == v.throughput.reason
