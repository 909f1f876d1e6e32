"""The break-even map: its servers' configs, the line through its points, what it reads off."""

from __future__ import annotations

import math

import pytest

from pytest_specdecode.analysis.map.break_even import ALL_PROMPTS, MapPoint, fit_line, map_of_run
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.break_even import map_candidates, map_ks, map_lengths, point_of
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ConfigError
from tests.support import synthetic

NGRAM_K5 = SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 5})


def test_auto_maps_the_candidates_k_and_one_other() -> None:
    assert map_ks("auto", [NGRAM_K5]) == (3, 5)
    assert map_ks("auto", [SpecConfig("k3", {"method": "ngram", "num_speculative_tokens": 3})]) == (
        3,
        5,
    )
    assert map_ks("auto", []) == (3, 5)
    assert map_ks("4, 2", []) == (2, 4)


@pytest.mark.parametrize("text", ["three", "0", "3;rm -rf /", "17"])
def test_a_bad_k_list_is_refused_before_anything_starts(text: str) -> None:
    with pytest.raises(ConfigError, match="--spec-break-even"):
        map_ks(text, [])


def test_the_map_servers_run_the_candidates_drafter_at_synthetic_lengths() -> None:
    found = map_candidates("auto", [NGRAM_K5], 2)
    assert [c.name for c in found] == ["map-k3-L1", "map-k3-L4", "map-k5-L1", "map-k5-L6"]
    values = found[-1].values
    assert values["rejection_sample_method"] == "synthetic"
    assert values["prompt_lookup_min"] == 1  # drafts wherever any earlier token recurs
    assert point_of(values) == (5, 6.0)
    assert point_of(NGRAM_K5.values) is None
    assert map_lengths(4, 3) == (1.0, 3.0, 5.0)
    assert [c.name for c in map_candidates("3", [], 3)] == ["map-k3-L1", "map-k3-L2p5", "map-k3-L4"]
    with pytest.raises(ConfigError, match="break_even_points"):
        map_lengths(3, 1)


def _point(length: float, ratio: float, se: float = 0.03, df: float = 20) -> MapPoint:
    return MapPoint("map", 3, length, "c1", ALL_PROMPTS, math.log(ratio), se, df)


def test_a_line_through_two_points_reads_off_break_even_and_ceiling() -> None:
    from pytest_specdecode.analysis.map.break_even import MapLine

    points = (_point(1.0, 0.8), _point(4.0, 3.2))  # a step costs 1.25 plain steps: r = L / 1.25
    a, b, draws = fit_line(points, confidence=0.95)
    assert a == pytest.approx(0.0, abs=1e-9) and b == pytest.approx(0.8)
    line = MapLine(3, "c1", ALL_PROMPTS, points, a, b, 0.95, draws)
    be, low, high = line.break_even
    assert be == pytest.approx(1.25)
    assert low < 1.25 < high and high - low < 0.5
    top, top_low, top_high = line.ceiling
    assert top == pytest.approx(3.2) and top_low < 3.2 < top_high
    ratio, lo, hi = line.at(2.0)
    assert ratio == pytest.approx(1.6) and lo < 1.6 < hi
    assert "breaks even at 1.25 tokens per step" in line.describe()


def test_a_line_that_stays_below_one_never_breaks_even() -> None:
    from pytest_specdecode.analysis.map.break_even import MapLine

    points = (_point(1.0, 0.3), _point(4.0, 0.6))
    a, b, draws = fit_line(points, confidence=0.95)
    line = MapLine(3, "c1", ALL_PROMPTS, points, a, b, 0.95, draws)
    assert line.break_even[0] > 4.0
    assert "never breaks even up to 4 tokens per step" in line.describe()


def test_wider_points_give_a_wider_band() -> None:
    narrow = fit_line((_point(1.0, 0.8, 0.02), _point(4.0, 3.2, 0.02)), confidence=0.95)
    wide = fit_line((_point(1.0, 0.8, 0.2), _point(4.0, 3.2, 0.2)), confidence=0.95)

    def width(fit: tuple) -> float:
        values = sorted(a + b * 2.5 for a, b in fit[2])
        return values[int(0.975 * len(values))] - values[int(0.025 * len(values))]

    assert width(wide) > 5 * width(narrow)


def test_a_run_with_map_servers_gets_its_map_and_their_verdicts_do_not_gate(tmp_path) -> None:
    s = synthetic.settings(tmp_path, candidates=(), run_extra='break_even = "3"', samples=8)
    rec = synthetic.record(s)
    synthetic.add_phase(rec, "baseline", {"coding": 100.0, "math": 50.0}, seed=1)
    synthetic.add_phase(rec, "map-k3-L1", {"coding": 80.0, "math": 40.0}, seed=2)
    synthetic.add_phase(rec, "map-k3-L4", {"coding": 320.0, "math": 160.0}, seed=3)
    found = analyze(rec)
    assert found.break_even is not None
    line = found.break_even.line(3, "c1")
    assert line is not None
    assert line.break_even[0] == pytest.approx(1.25, rel=0.1)
    assert line.ceiling[0] == pytest.approx(3.2, rel=0.1)
    assert found.break_even.line(3, "c1", "coding") is not None
    assert found.verdicts == {}  # the map measures the engine: no hypothesis, no gate
    assert "break_even" in found.to_json()
    assert map_of_run(rec, {}) is None


def test_the_reports_show_the_map_and_each_candidate_against_its_band(tmp_path) -> None:
    from pytest_specdecode.record.counters import Acceptance
    from pytest_specdecode.report import write_reports
    from pytest_specdecode.report.terminal import lines

    s = synthetic.settings(tmp_path, run_extra='break_even = "auto"', samples=8)
    rec = synthetic.record(s)
    assert list(rec.candidates) == ["ngram", "map-k3-L1", "map-k3-L4", "map-k5-L1", "map-k5-L6"]
    rates = {"coding": 100.0, "math": 50.0}

    def counted(k: int, length: float) -> Acceptance:  # 8 requests of 64 tokens, k a step
        steps = (8 * 63) / length
        return Acceptance(present=True, drafts=steps, draft_tokens=k * steps,
                          accepted=(length - 1) * steps, mean_acceptance_length=length)  # fmt: skip

    synthetic.add_phase(rec, "baseline", rates, seed=1)
    for name, k, length, cost in (("map-k3-L1", 3, 1, 1.2), ("map-k3-L4", 3, 4, 1.2),
                                  ("map-k5-L1", 5, 1, 1.4), ("map-k5-L6", 5, 6, 1.4)):  # fmt: skip
        ratio = length / cost
        synthetic.add_phase(rec, name, {w: r * ratio for w, r in rates.items()}, seed=k + length,
                            acceptance=counted(k, length))  # fmt: skip
    # n-gram k5 at 2.1 tokens per step: the map says 2.1 / 1.4 = 1.5x
    synthetic.add_phase(rec, "ngram", {w: r * 1.5 for w, r in rates.items()}, seed=9,
                        acceptance=counted(5, 2.1))  # fmt: skip
    found = analyze(rec)
    assert set(found.verdicts) == {"ngram"} and len(found.map_verdicts) == 4
    k5 = found.break_even.line(5, "c1")
    assert k5.break_even[0] == pytest.approx(1.4, rel=0.1)
    assert [line.k for line in found.break_even.overall] == [3, 5]
    checks = {(c.prompt_type, c.map_k) for c in found.candidate_predictions}
    assert checks == {("coding", 5), ("math", 5)}
    assert all(c.inside and c.source == "counted" for c in found.candidate_predictions)
    assert "100% to 100% of k" in found.break_even.drafting
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    written = write_reports(rec, found, run_dir, failed=[], step_summary=None)
    text = (run_dir / "summary.md").read_text()
    assert "### The break-even map" in text
    assert "| 5 | c1 | 1.00: 0.72x [" in text
    assert "ngram/coding at c1, k=5, 2.10 tokens per step (counted): predicted 1.50x [" in text
    assert "by the map (k=5, c1); measured 1.49x [" in text
    assert (run_dir / "break-even.png").stat().st_size > 10_000
    assert "break-even" in written.plots
    assert any(line.startswith("break-even map: k=3 at c1: breaks even") for line in
               lines(rec, found, files={}))  # fmt: skip


def test_the_map_lies_at_the_tokens_a_step_counted_not_the_length_asked() -> None:
    """The H200 probe of 2026-12-04 (benchmarks/synthetic_probe.py, vLLM 0.26.0): n-gram k=3,
    prompt_lookup_min 1, asked L = 4, nine requests of 128 tokens. Every draft was accepted
    (821 of 821: length 3.96 a draft), but 14% of steps found no match and drafted nothing, so
    a step emitted 3.55 tokens: that is where the point lies."""
    from pytest_specdecode.analysis.map.break_even import measured_steps
    from pytest_specdecode.record.counters import Acceptance
    from pytest_specdecode.record.measurement import Measurement

    m = Measurement(prompt_type="coding")
    m.samples = [synthetic.sample("coding", "map-k3-L4", i, 156.3, tokens=128) for i in range(9)]
    m.acceptance = Acceptance(present=True, drafts=277, draft_tokens=821, accepted=821)
    steps = measured_steps([m])
    assert steps.length == pytest.approx(3.964, abs=1e-3)
    assert steps.tokens_per_step == pytest.approx(1143 / 322)
    assert steps.drafts_per_step == pytest.approx(821 / 322)
    asked = _point(4.0, 2.868)
    counted = MapPoint("map", 3, 4.0, "c1", ALL_PROMPTS, math.log(2.868), 0.03, 20,
                       steps.length, steps.drafts_per_step, steps.tokens_per_step)  # fmt: skip
    assert counted.x == pytest.approx(3.55, abs=0.01) and asked.x == 4.0
    a, b, _ = fit_line((_point(1.0, 0.883), counted), confidence=0.95)
    assert (1 - a) / b == pytest.approx(1.15, abs=0.01)  # where k=3 broke even in eager mode


def test_a_step_that_drafted_counts_though_the_output_dropped_its_tokens() -> None:
    """The H100 map of 2026-12-07 (an 8B shape, an EAGLE-3 head, k = 5, everything accepted,
    16 requests of 128 tokens): each request's last step accepted 5 drafts that max_tokens cut
    from the output, and vLLM's counter kept them. Output minus accepted gave 17 steps a request
    where 22 drafted: 7.47 tokens a step, past k + 1. The drafts counted bound the steps."""
    from pytest_specdecode.analysis.map.break_even import measured_steps
    from pytest_specdecode.record.counters import Acceptance
    from pytest_specdecode.record.measurement import Measurement

    m = Measurement(prompt_type="coding")
    m.samples = [synthetic.sample("coding", "map-k5-L6", i, 539.4, tokens=128) for i in range(16)]
    m.acceptance = Acceptance(
        present=True, drafts=16 * 22, draft_tokens=16 * 110, accepted=16 * 110
    )
    steps = measured_steps([m])
    assert steps.tokens_per_step == pytest.approx(2032 / 352)  # 5.77: at most k + 1
    assert steps.drafts_per_step == pytest.approx(5.0)
    assert steps.length == pytest.approx(6.0)
