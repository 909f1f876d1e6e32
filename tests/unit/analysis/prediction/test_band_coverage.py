"""The band's coverage over stored runs: each config held out, predicted from the rest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats

from pytest_specdecode.analysis.prediction.bands.coverage import (
    CoverageCase,
    PromptCoverage,
    band_coverage,
)
from pytest_specdecode.analysis.search.policy import SearchPolicy
from pytest_specdecode.record.schema import Phase, RunRecord

from ....support.search_sim import Truth, measure, search_record

TRUTH = Truth(cost={"c1": (0.1, 0.03)})
K2 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
K6 = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
      "prompt_lookup_max": 4}  # fmt: skip


def case(measured: float, *, predicted: float = 100.0) -> CoverageCase:
    return CoverageCase("run", "k2", "k=2 n=3..3", "coding", "coding", predicted, 90.0, 110.0,
                        measured)  # fmt: skip


def test_the_share_inside_and_what_is_done_when_it_falls_short() -> None:
    full = PromptCoverage("coding", tuple(case(100 + i) for i in range(10)))
    assert (full.inside, full.total, full.widen) == (10, 10, 1.0) and not full.below
    assert full.text == (
        "coding: 10 of 10 measured tok/s inside the predicted band (100%; nominal 95%)"
    )
    # 8 of 10: below 95%, but 8 or fewer happen 8.6% of the time if the band holds: kept.
    chance = PromptCoverage("coding", tuple(case(v) for v in [100] * 8 + [120, 80]))
    assert chance.p_value == pytest.approx(stats.binom.cdf(8, 10, 0.95))
    assert chance.below and chance.widen == 1.0
    assert "within chance (binomial p=0.086); the band is not widened" in chance.text
    # 5 of 10: beyond chance: widened until 95% (here all 10) would have been inside.
    short = PromptCoverage("coding", tuple(case(v) for v in [100] * 5 + [115, 120, 85, 125, 80]))
    assert short.widen == pytest.approx(max(c.distance for c in short.cases))
    assert short.widen == pytest.approx(math.log(1.25) / math.log(1.1), rel=1e-6)
    assert "widened x" in short.text


def slow(phase: Phase, factor: float) -> None:
    """A start that ran `factor` times slower than its config's truth (a restart's shift)."""
    for m in phase.measurements.values():
        for s in m.samples:
            s.e2e_s = s.ttft_s + (s.e2e_s - s.ttft_s) * factor


def stored_run(
    tmp_path: Path, seed: int, *, shift: float = 1.0, version: str = "0.32.0"
) -> RunRecord:
    """Two configs measured; k2's start `shift` times slower than its config."""
    rec = search_record(tmp_path, TRUTH, seed=seed)
    slow(measure(rec, "k2", K2, TRUTH, seed=seed + 1), shift)
    measure(rec, "k6", K6, TRUTH, seed=seed + 2)
    for phase in rec.phases.values():
        phase.server_version = version
    return rec


def test_stored_runs_with_two_configs_check_the_band(tmp_path: Path) -> None:
    one = search_record(tmp_path / "one", TRUTH)
    measure(one, "k2", K2, TRUTH)  # one config: nothing to hold out
    runs = [("r1", stored_run(tmp_path / "r1", 1)), ("r2", stored_run(tmp_path / "r2", 5)),
            ("one", one)]  # fmt: skip
    found = band_coverage(runs)
    assert found.runs == ("r1", "r2") and found.looked_at == 3
    assert {n: (c.inside, c.total) for n, c in found.per_type.items()} == {
        "coding": (4, 4),
        "math": (4, 4),
    }  # two configs held out in each of two runs, on each prompt type
    assert found.widen == {}
    assert found.lines()[0].startswith("band coverage over 2 stored run(s) with more than one")


def test_a_band_that_misses_beyond_chance_is_widened_for_the_search(tmp_path: Path) -> None:
    # Each run's k2 start ran 80% slower than its config: beyond the restart noise the band
    # assumes (5%), run after run. (Each run has a vLLM version of its own, so no run lends
    # the others a prior that would learn the shift as a cost.)
    runs = [
        (f"r{i}", stored_run(tmp_path / f"r{i}", 10 * i, shift=1.8, version=f"0.32.{i}"))
        for i in range(4)
    ]
    found = band_coverage(runs)
    coding = found.per_type["coding"]
    assert coding.inside < coding.total and coding.p_value < 0.05 and coding.widen > 1
    assert "beyond chance" in coding.text and set(found.widen) == {"coding", "math"}
    rec = search_record(tmp_path / "now", TRUTH, seed=99)
    measure(rec, "search-1", K2, TRUTH)
    plain = SearchPolicy(margin=0.03).predictions(rec)
    wide = SearchPolicy(margin=0.03, coverage=found).predictions(rec)
    s = next(iter(plain.predictions["coding"]))
    (lo, hi), (wlo, whi) = (
        p.predictions["coding"][s].tokens_per_s_band
        for p in (plain, wide)  # type: ignore[misc]
    )
    assert wlo < lo and whi > hi
