"""Metrics parsing on /metrics text captured from the real CPU vLLM 0.32 server."""

from pathlib import Path

import pytest

from pytest_specdecode.analysis.prediction.ngram_replay import replay
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings
from pytest_specdecode.analysis.verdict.checks import acceptance_cross_check
from pytest_specdecode.measure.server_metrics import (
    ServerCounters,
    acceptance_between,
    parse_counters,
    traffic_between,
)
from pytest_specdecode.record.counters import Acceptance, Traffic, combine

DATA = Path(__file__).parents[2] / "data"
NGRAM = (DATA / "vllm-0.32-cpu-ngram.metrics.txt").read_text()
BASELINE = (DATA / "vllm-0.32-cpu-baseline.metrics.txt").read_text()


def test_counters_from_a_real_ngram_server():
    c = parse_counters(NGRAM)
    assert (c.drafts, c.draft_tokens, c.accepted) == (160.0, 790.0, 231.0)
    assert c.accepted_per_position == {0: 76.0, 1: 46.0, 2: 46.0, 3: 39.0, 4: 24.0}


def test_acceptance_from_zero_is_the_lifetime_figure():
    acc = acceptance_between(ServerCounters(), parse_counters(NGRAM))
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
    c = parse_counters(two.replace("# EOF", ""))
    assert (c.drafts, c.accepted, c.accepted_per_position[0]) == (320.0, 462.0, 152.0)


def test_a_server_without_speculation_reports_absent_not_an_error():
    c = parse_counters(BASELINE)
    assert not c.present
    assert not acceptance_between(c, c).present
    assert not combine([acceptance_between(c, c)]).present


def test_delta_between_two_scrapes():
    before = parse_counters(NGRAM)
    after = ServerCounters(
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


def test_traffic_counters_of_a_real_server():
    c = parse_counters(NGRAM)
    assert c.traffic == {
        "requests": 39.0,  # summed over finished_reason
        "prompt_tokens": 2341.0,
        "generation_tokens": 2496.0,
        "decode_steps": 2247.0,
        "running": 0.0,
        "waiting": 0.0,
    }
    window = traffic_between(parse_counters(BASELINE), c)
    assert (window.requests, window.generation_tokens, window.decode_steps) == (38, 2488, 2240)
    assert (window.busy_before, window.busy_after) == (0.0, 0.0)
    assert traffic_between(ServerCounters(), c).requests is None  # unknown, not zero


def test_unequal_parts_combine_by_their_counts_not_their_rates():
    a = Acceptance(True, 10.0, 50.0, 30.0, 4.0, 0.6, [0.9, 0.8, 0.6, 0.5, 0.2])
    b = Acceptance(True, 30.0, 90.0, 15.0, 1.5, 1 / 6, [0.3, 0.2])  # k=3 would give 3 positions
    both = combine([a, b, Acceptance(present=False)])
    assert (both.drafts, both.draft_tokens, both.accepted) == (40.0, 140.0, 45.0)
    assert both.mean_acceptance_length == pytest.approx(1 + 45 / 40)
    assert both.draft_acceptance_rate == pytest.approx(45 / 140)
    # Position 1: 9 + 9 accepted of 40 drafts; position 3: 6 of 40 (b drafted no third token).
    assert both.per_position_rates == pytest.approx([18 / 40, 14 / 40, 6 / 40, 5 / 40, 2 / 40])


ACC = acceptance_between(ServerCounters(), parse_counters(NGRAM))  # 231 accepted, 160 drafts


def check(traffic: Traffic, client: int | None, requests: int = 39) -> str | None:
    return acceptance_cross_check(
        ACC, traffic, requests=requests, client_accepted=client, num_speculative_tokens=5
    )


def test_cross_check_is_exact_with_the_servers_token_counters():
    # 2496 tokens - 39 first tokens - 2247 steps = 210 delivered beyond one per step; the
    # server's 231 exceed it by 21: tokens accepted past max_tokens, within 39 x 5.
    real = Traffic(requests=39, generation_tokens=2496, decode_steps=2247)
    assert check(real, 210) is None
    assert check(real, 214) is None  # four merged chunks: the client counts more, never fewer
    assert "fewer than the 210 the server delivered" in check(real, 209)
    # 2496 - 39 - 2450 = 7 delivered: 224 cut tokens are more than 39 requests x 5 can hide.
    many_steps = check(Traffic(generation_tokens=2496, decode_steps=2450), 7)
    assert "+224 difference is outside what truncation at max_tokens explains (0 to 195)" in (
        many_steps
    )
    # 2596 - 39 - 2247 = 310 delivered: the server cannot have accepted fewer than it delivered.
    assert "-79 difference" in check(Traffic(generation_tokens=2596, decode_steps=2247), 310)


def test_cross_check_without_decode_step_counters_uses_the_clients_count():
    unknown = Traffic()
    assert check(unknown, 231, requests=4) is None
    assert check(unknown, 215, requests=4) is None  # truncation: the server counted more
    assert check(unknown, 240, requests=4) is None  # merged chunks: the client counted more
    assert "server counted 231" in check(unknown, 150, requests=4)
    assert "server counted 231" in check(unknown, 260, requests=4)
    assert "no per-chunk usage" in check(unknown, None, requests=4)


def test_foreign_traffic_is_what_the_server_counted_beyond_this_runs_requests():
    from pytest_specdecode.measure.traffic import foreign, quiet, rate_text

    from ...support.synthetic import sample

    ours = [sample("coding", "baseline", i, 30.0, tokens=64) for i in range(5)]
    clean = Traffic(requests=5, generation_tokens=320, busy_before=0, busy_after=0)
    assert foreign(clean, ours) is None
    other = Traffic(requests=7, generation_tokens=400, busy_before=1, busy_after=0)
    assert foreign(other, ours) == (
        "2 other requests finished; 80 tokens were generated for others; "
        "1 requests were in flight when the window began"
    )
    # A long request of someone else's, still running at the end: its tokens show.
    assert "tokens were generated for others" in foreign(Traffic(5, None, 350, None, 0, 1), ours)
    assert foreign(Traffic(), ours) is None  # no counters: nothing can be told
    assert quiet(Traffic(0, 0, 0, 0, 0, 0)) and not quiet(Traffic(requests=1))
    assert rate_text(Traffic(requests=2, generation_tokens=100, busy_after=1), 10) == (
        "12.0 requests/min, 10.0 generated tok/s, 1 in flight"
    )
    assert rate_text(Traffic(), 10).startswith("unknown")


@pytest.mark.parametrize(
    ("traffic", "seen"),
    [
        (Traffic(requests=6, generation_tokens=320), "1 other requests finished"),
        (
            Traffic(requests=5, generation_tokens=320, busy_before=0, busy_after=1),
            "1 requests were in flight when the window ended",
        ),
        (
            Traffic(requests=5, generation_tokens=320, busy_before=2, busy_after=0),
            "2 requests were in flight when the window began",
        ),
    ],
    ids=["one request more", "one still running at the end", "two running at the start"],
)
def test_each_margin_of_foreign_traffic_alone_marks_a_window(traffic, seen) -> None:
    from pytest_specdecode.measure.traffic import foreign

    from ...support.synthetic import sample

    ours = [sample("coding", "baseline", i, 30.0, tokens=64) for i in range(5)]  # 320 tokens
    assert foreign(traffic, ours) == seen


def test_a_request_in_flight_is_not_quiet() -> None:
    from pytest_specdecode.measure.traffic import quiet

    # Nothing finished during the watch, but someone's long request is still running.
    assert not quiet(Traffic(requests=0, generation_tokens=0, busy_before=1, busy_after=1))
    assert quiet(Traffic(requests=0, generation_tokens=0, busy_before=1, busy_after=0))


@pytest.mark.parametrize("k", [2, 3])
def test_cross_check_slack_of_k_per_request_is_reached(k: int) -> None:
    """Why the acceptance cross-check allows k cut tokens per request, not k - 1.

    The server counts a step's accepted tokens before the stop check cuts them. A last step
    that starts one token before max_tokens delivers that one token (the step's "one"), and
    every token it accepted is cut: k when all are. The replay's own bound is k - 1, because it
    only misses the drafts checked past the known tokens.
    """
    period = list(range(10, 10 + k + 1))  # every draft of n=1 is accepted
    n_out = 2 + (k + 1)  # prefill, one full step, then the last step at max_tokens - 1
    out = (period * 5)[:n_out]
    ahead = (period * 5)[n_out : n_out + 8]
    s = NgramSettings(k, 1, 1)
    stats = replay(period * 2, out, s, lookahead_ids=ahead)
    assert stats.exact and stats.decode_steps == 2 and stats.accepted == 2 * k
    delivered = n_out - 1 - stats.decode_steps
    assert stats.accepted - delivered == k  # all k accepted at the last step were cut
    assert replay(period * 2, out, s).unverified_tokens == k - 1
    acc = Acceptance(True, stats.drafts, stats.draft_tokens, stats.accepted)
    traffic = Traffic(requests=1, generation_tokens=n_out, decode_steps=stats.decode_steps)
    check = dict(requests=1, client_accepted=delivered)
    assert acceptance_cross_check(acc, traffic, num_speculative_tokens=k, **check) is None
    assert acceptance_cross_check(acc, traffic, num_speculative_tokens=k - 1, **check)
