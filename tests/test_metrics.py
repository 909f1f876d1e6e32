"""Metrics parsing on /metrics text captured from the real CPU vLLM 0.32 server."""

from pathlib import Path

import pytest

from pytest_specdecode.measure.server_metrics import (
    SpecCounters,
    acceptance_between,
    combine,
    cross_check,
    parse_spec_counters,
)

DATA = Path(__file__).parent / "data"
NGRAM = (DATA / "vllm-0.32-cpu-ngram.metrics.txt").read_text()
BASELINE = (DATA / "vllm-0.32-cpu-baseline.metrics.txt").read_text()


def test_counters_from_a_real_ngram_server():
    c = parse_spec_counters(NGRAM)
    assert (c.drafts, c.draft_tokens, c.accepted) == (160.0, 790.0, 231.0)
    assert c.accepted_per_position == {0: 76.0, 1: 46.0, 2: 46.0, 3: 39.0, 4: 24.0}


def test_acceptance_from_zero_is_the_lifetime_figure():
    acc = acceptance_between(SpecCounters(), parse_spec_counters(NGRAM))
    assert acc.present
    assert acc.mean_acceptance_length == pytest.approx(1 + 231 / 160)
    assert acc.draft_acceptance_rate == pytest.approx(231 / 790)
    assert acc.per_position_rates == pytest.approx(
        [76 / 160, 46 / 160, 46 / 160, 39 / 160, 24 / 160]
    )
    # Acceptance decays with the position, as in the seed.
    assert acc.per_position_rates == sorted(acc.per_position_rates, reverse=True)


def test_counters_are_summed_over_engines():
    two = NGRAM + "\n".join(
        line.replace('engine="0"', 'engine="1"')
        for line in NGRAM.splitlines()
        if line.startswith("vllm:spec_decode")
    )
    c = parse_spec_counters(two.replace("# EOF", ""))
    assert (c.drafts, c.accepted, c.accepted_per_position[0]) == (320.0, 462.0, 152.0)


def test_a_server_without_speculation_reports_absent_not_an_error():
    c = parse_spec_counters(BASELINE)
    assert not c.present
    assert not acceptance_between(c, c).present
    assert not combine([acceptance_between(c, c)]).present


def test_delta_between_two_scrapes():
    before = parse_spec_counters(NGRAM)
    after = SpecCounters(
        drafts=170.0,
        draft_tokens=840.0,
        accepted=251.0,
        accepted_per_position={0: 82.0, 1: 50.0, 2: 49.0, 3: 40.0, 4: 24.0},
    )
    acc = acceptance_between(before, after)
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (10.0, 50.0, 20.0)
    assert acc.mean_acceptance_length == pytest.approx(3.0)
    assert acc.per_position_rates == pytest.approx([0.6, 0.4, 0.3, 0.1, 0.0])
    both = combine([acc, acc])
    assert both.drafts == 20.0 and both.mean_acceptance_length == pytest.approx(3.0)
    assert both.per_position_rates == pytest.approx([0.6, 0.4, 0.3, 0.1, 0.0])


def test_cross_check_agrees_within_the_truncation_slack_and_flags_the_rest():
    acc = acceptance_between(SpecCounters(), parse_spec_counters(NGRAM))
    assert cross_check(acc, 231, requests=4, num_speculative_tokens=5) is None
    assert cross_check(acc, 215, requests=4, num_speculative_tokens=5) is None
    assert "server counted 231" in cross_check(acc, 150, requests=4, num_speculative_tokens=5)
    assert "server counted 231" in cross_check(acc, 240, requests=4, num_speculative_tokens=5)
    assert "no per-chunk usage" in cross_check(acc, None, requests=4, num_speculative_tokens=5)
