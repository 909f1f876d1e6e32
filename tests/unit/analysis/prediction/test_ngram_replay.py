"""The n-gram replay: hand-checked sequences, vLLM's settings rules, edge cases, and the fast
engine against a plain step-by-step reference (and a literal port of vLLM's KMP search)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.prediction.ngram_replay import grid, propose, replay, replay_many
from pytest_specdecode.analysis.prediction.ngram_types import (
    NgramSettings,
    ReplayStats,
    RequestTokens,
    aggregate,
    effective_settings,
    grid_settings,
    prefix_cached_tokens,
    unsupported_reason,
)

S = NgramSettings


# --- effective settings ----------------------------------------------------------------------


def test_only_max_given_sets_min_to_max():
    """The seed's preset matched 4-grams only."""
    values = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
    assert effective_settings(values) == S(5, 4, 4)


def test_only_min_given_sets_max_to_min():
    values = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
    assert effective_settings(values) == S(3, 2, 2)


def test_neither_bound_gives_five():
    assert effective_settings({"method": "ngram", "num_speculative_tokens": 2}) == S(2, 5, 5)


def test_both_bounds_kept_and_model_alias():
    values = {"model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
              "prompt_lookup_max": 3}  # fmt: skip
    assert effective_settings(values) == S(3, 2, 3)
    assert S(3, 2, 3).label == "k=3 n=2..3"
    assert effective_settings(S(3, 2, 3).to_values()) == S(3, 2, 3)


def test_min_above_max_refused():
    with pytest.raises(ValueError, match="prompt_lookup_min <= prompt_lookup_max"):
        effective_settings({"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_min": 4, "prompt_lookup_max": 2})  # fmt: skip


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"method": "suffix", "num_speculative_tokens": 3}, "not on the n-gram grid"),
        ({"method": "eagle", "model": "x", "num_speculative_tokens": 3}, "no replay is possible"),
        ({"method": "draft_model", "model": "x", "num_speculative_tokens": 3}, "drafts with a"),
        ({"method": "ngram_gpu", "num_speculative_tokens": 3}, "not replayed"),
    ],
)
def test_other_methods_are_not_replayed(values, words):
    assert words in (unsupported_reason(values) or "")
    with pytest.raises(ValueError, match=words):
        effective_settings(values)


def test_grid_has_every_k_with_every_min_le_max():
    configs = grid_settings()
    assert len(configs) == 8 * 21
    assert S(1, 1, 1) in configs and S(8, 6, 6) in configs and S(4, 2, 5) in configs
    assert all(c.prompt_lookup_min <= c.prompt_lookup_max for c in configs)


# --- the proposal rule -----------------------------------------------------------------------


def test_longest_match_wins_and_its_earliest_copy():
    # [1, 2] occurs at 0 and 3; [9, 1, 2] occurs at 5 only... but is longer, so it wins.
    context = [1, 2, 3, 1, 2, 4, 9, 1, 2, 5, 6, 9, 1, 2]
    assert propose(context, S(3, 1, 3)) == [5, 6, 9]
    # With n <= 2 only, [1, 2]: earliest copy (at 0) for v1, latest (at 7) for v2.
    assert propose(context, S(3, 1, 2)) == [3, 1, 2]
    assert propose(context, S(3, 1, 2), proposer="v2") == [5, 6, 9]


def test_no_match_no_draft_and_v2_fills_with_the_last_token():
    assert propose([1, 2, 3, 4], S(3, 1, 2)) == []
    assert propose([1, 2, 3, 4], S(3, 1, 2), proposer="v2") == [4, 4, 4]
    assert propose([7], S(3, 1, 1)) == []  # nothing earlier to match


def test_fewer_than_k_when_the_match_is_near_the_end():
    context = [5, 6, 5, 6]  # [5, 6] at 0: only [5, 6] follows it
    assert propose(context, S(5, 2, 2)) == [5, 6]
    assert propose(context, S(5, 2, 2), proposer="v2") == [5, 6, 6, 6, 6]


def test_the_suffix_itself_is_not_a_match():
    # [3, 3] at 2 is the suffix itself; the copy at 1 ends before the last token and counts.
    assert propose([1, 3, 3, 3], S(2, 2, 2)) == [3]
    assert propose([1, 2, 3, 3], S(2, 2, 2)) == []


def test_proposer_cap_at_max_model_len():
    assert propose([1, 2, 3, 1], S(5, 1, 1), max_model_len=6) == [2, 3]
    assert propose([1, 2, 3, 1], S(5, 1, 1), max_model_len=4) == []


def _kmp_port(tokens: list[int], lo: int, hi: int, mml: int, k: int) -> list[int]:
    """A literal port of vLLM 0.32's `_find_longest_matched_ngram_and_propose_tokens`."""
    total = len(tokens)
    if total < lo:
        return []
    k = min(k, mml - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * hi
    longest = position = prev = 0
    i = 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < hi:
                lps[i] = prev
            if prev == hi:
                prev = lps[hi - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < lo:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return tokens[start : start + k]


def test_plain_rule_equals_a_literal_port_of_vllms_search():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(0, 40)
        tokens = [rng.randint(0, rng.choice([1, 2, 3, 6])) for _ in range(n)]
        lo = rng.randint(1, 5)
        hi = rng.randint(lo, 6)
        k = rng.randint(1, 8)
        mml = rng.choice([1000, n + rng.randint(0, 4)])
        expected = _kmp_port(tokens, lo, hi, mml, k)
        assert propose(tokens, S(k, lo, hi), max_model_len=mml) == expected, (tokens, lo, hi, k)


# --- replay: hand-checked ----------------------------------------------------------------------


def test_repeated_phrase_hand_checked():
    prompt = [10, 11, 12, 13, 14, 99]
    output = [10, 11, 12, 13, 14, 7]
    # n=2 only: after the prefill (10) the suffix [99, 10] is new: plain decode (11). Then
    # [10, 11] matches the prompt: draft [12, 13, 14], all accepted, plus the bonus token 7.
    r = replay(prompt, output, S(3, 2, 2))
    assert (r.steps, r.drafts, r.draft_tokens, r.accepted) == (3, 1, 3, 3)
    assert r.accepted_per_position == (1, 1, 1)
    assert r.exact and r.mean_acceptance_length == 4.0 and r.tokens_per_step == 2.0
    assert r.drafts_per_step == 0.5 and r.decode_tokens_per_step == 2.5
    # n=1..2: [10] matches at once: draft [11, 12, 13] accepted (+14). Then [13, 14] matches
    # the prompt: draft [99, 10, 11] against 7: rejected, 7 is the bonus token.
    r = replay(prompt, output, S(3, 1, 2))
    assert (r.steps, r.drafts, r.draft_tokens, r.accepted) == (3, 2, 6, 3)
    assert r.accepted_per_position == (1, 1, 1)
    assert r.per_position_rates == [0.5, 0.5, 0.5] and r.draft_acceptance_rate == 0.5


def test_no_match_means_one_token_per_step():
    r = replay([1, 2, 3], [4, 5, 6, 7], S(3, 1, 1))
    assert (r.steps, r.drafts, r.draft_tokens, r.accepted) == (4, 0, 0, 0)
    assert r.mean_acceptance_length is None and r.tokens_per_step == 1.0
    assert r.per_position_rates == [] and r.draft_acceptance_rate is None


def test_single_output_token_has_no_decode_step():
    r = replay([1, 2, 1], [2], S(3, 1, 1))
    assert (r.steps, r.decode_steps, r.drafts) == (1, 0, 0)
    assert r.drafts_per_step is None and r.decode_tokens_per_step == 1.0


def test_last_step_beyond_max_tokens_is_bounded_then_exact_with_lookahead():
    prompt, output = [1, 2, 3, 4, 5, 6, 1], [2, 3]
    # After the prefill (2): [2] matches at 1, draft [3, 4, 5, 6]. The client has only 3.
    r = replay(prompt, output, S(4, 1, 1))
    assert (r.drafts, r.draft_tokens, r.accepted, r.unverified_tokens) == (1, 4, 1, 3)
    assert not r.exact and r.accepted_max == 4
    assert r.accepted_per_position == (1, 0, 0, 0)
    assert r.accepted_per_position_max == (1, 1, 1, 1)
    r = replay(prompt, output, S(4, 1, 1), lookahead_ids=[4, 5, 9])
    assert (r.accepted, r.unverified_tokens, r.accepted_per_position) == (3, 0, (1, 1, 1, 0))
    r = replay(prompt, output, S(4, 1, 1), lookahead_ids=[4])  # too short: bounded again
    assert (r.accepted, r.unverified_tokens) == (2, 2)
    # A mismatch inside the known tokens needs no look-ahead.
    r = replay(prompt, [2, 8], S(4, 1, 1))
    assert (r.accepted, r.unverified_tokens) == (0, 0)


def test_scheduler_cap_at_max_model_len():
    prompt, output = [1, 2, 3, 4, 5, 6, 1], [2, 3, 4, 5]
    free = replay(prompt, output, S(4, 1, 1))
    assert (free.draft_tokens, free.accepted, free.steps) == (4, 3, 2)
    # Context 8 of max_model_len 11: at most 11 - 8 - 1 = 2 draft tokens.
    capped = replay(prompt, output, S(4, 1, 1), max_model_len=11)
    assert (capped.draft_tokens, capped.accepted, capped.steps) == (2, 2, 2)
    # No room at all: no draft is counted.
    none = replay(prompt, output[:2], S(4, 1, 1), max_model_len=9)
    assert (none.drafts, none.draft_tokens, none.steps) == (0, 0, 2)


def test_k_larger_than_the_remaining_context():
    r = replay([5, 6, 5], [6, 5, 6, 5], S(8, 2, 2))
    # After 6: [5, 6] at 0, only [5, 6] follows it in the context: draft of 2, both accepted.
    assert (r.drafts, r.draft_tokens, r.accepted) == (1, 2, 2)
    assert r.accepted_per_position == (1, 1, 0, 0, 0, 0, 0, 0)


def test_padded_prefill_after_a_prefix_cache_hit():
    prompt, output = [1, 2, 3, 4, 5], [9, 8, 7]
    plain = replay(prompt, output, S(3, 1, 1))
    hit = replay(prompt, output, S(3, 1, 1), cached_prompt_tokens=4)
    assert (plain.drafts, plain.draft_tokens) == (0, 0)
    assert (hit.drafts, hit.draft_tokens, hit.accepted, hit.steps) == (1, 3, 0, plain.steps)
    assert replay(prompt, output, S(3, 1, 1), cached_prompt_tokens=3).drafts == 0
    assert prefix_cached_tokens(33, 16) == 32 and prefix_cached_tokens(32, 16) == 16
    assert prefix_cached_tokens(1, 16) == 0


# --- replay: the fast engine against the plain reference ---------------------------------------


def _reference(req: RequestTokens, s: NgramSettings, mml: int | None, proposer: str) -> ReplayStats:
    truth = list(req.prompt_ids + req.output_ids + req.lookahead_ids)
    p, n = len(req.prompt_ids), len(req.output_ids)
    k = s.num_speculative_tokens
    produced, steps = 1, 1
    drafts = draft_tokens = accepted = unverified = 0
    pos, pos_max = [0] * k, [0] * k
    if 0 < req.cached_prompt_tokens == p - 1 and (mml is None or p + k + 1 <= mml):
        drafts, draft_tokens = 1, k
    while produced < n:
        c = p + produced
        draft = propose(truth[:c], s, max_model_len=mml, proposer=proposer)  # type: ignore[arg-type]
        if mml is not None:
            draft = draft[: max(mml - c - 1, 0)]
        a, open_ended = 0, False
        for j, t in enumerate(draft):
            if c + j >= len(truth):
                open_ended = True
                break
            if truth[c + j] != t:
                break
            a += 1
        if draft:
            drafts += 1
            draft_tokens += len(draft)
            top = len(draft) if open_ended else a
            unverified += top - a
            for q in range(a):
                pos[q] += 1
            for q in range(top):
                pos_max[q] += 1
        accepted += a
        produced += a + 1
        steps += 1
    return ReplayStats(s, 1, n, steps, drafts, draft_tokens, accepted, tuple(pos), unverified,
                       tuple(pos_max))  # fmt: skip


def _random_request(rng: random.Random, alphabet: int) -> RequestTokens:
    phrase = [rng.randrange(alphabet) for _ in range(rng.randint(1, 6))]

    def text(length: int) -> list[int]:
        out: list[int] = []
        while len(out) < length:
            out += phrase if rng.random() < 0.4 else [rng.randrange(alphabet)]
        return out[:length]

    prompt, output = text(rng.randint(1, 30)), text(rng.randint(1, 40))
    look = text(rng.choice([0, 0, 3, 8]))
    cached = len(prompt) - 1 if rng.random() < 0.2 else 0
    return RequestTokens.of(prompt, output, look, cached)


@pytest.mark.parametrize("proposer", ["v1", "v2"])
def test_fast_replay_equals_the_step_by_step_reference(proposer):
    rng = random.Random(11)
    for _ in range(400):
        req = _random_request(rng, rng.choice([2, 3, 5, 20]))
        lo = rng.randint(1, 4)
        s = S(rng.randint(1, 8), lo, rng.randint(lo, 6))
        mml = rng.choice(
            [None, None, len(req.prompt_ids) + len(req.output_ids) + rng.randint(0, 6)]
        )
        got = replay_many([req], s, max_model_len=mml, proposer=proposer)
        assert got == _reference(req, s, mml, proposer), (req, s, mml)
        assert got.unverified_tokens <= s.num_speculative_tokens - 1


def test_grid_equals_one_replay_per_config_and_aggregates_per_type():
    rng = random.Random(3)
    by_type = {
        "a": [_random_request(rng, 3) for _ in range(4)],
        "b": [_random_request(rng, 6) for _ in range(3)],
    }
    result = grid(by_type)
    assert set(result) == {"a", "b"} and len(result["a"]) == 168
    for name, requests in by_type.items():
        for s in rng.sample(grid_settings(), 25):
            singles = [replay_many([r], s) for r in requests]
            assert result[name][s] == replay_many(requests, s) == aggregate(singles)


def test_aggregate_sums_counts_then_rates():
    a = replay([1, 2, 3, 1], [2, 3, 1, 2], S(2, 1, 1))
    b = replay([4, 5], [6, 7, 8], S(2, 1, 1))
    both = aggregate([a, b])
    assert both.requests == 2 and both.steps == a.steps + b.steps
    assert both.accepted == a.accepted + b.accepted and both.drafts == a.drafts
    assert both.mean_acceptance_length == 1 + a.accepted / a.drafts
    assert both.tokens_per_step == (a.output_tokens + b.output_tokens) / (a.steps + b.steps)
    with pytest.raises(ValueError, match="different settings"):
        aggregate([a, replay([1], [2], S(3, 1, 1))])
    with pytest.raises(ValueError, match="nothing"):
        aggregate([])


def test_bad_input_refused():
    with pytest.raises(ValueError, match="without output"):
        replay([1, 2], [], S(2, 1, 1))
    with pytest.raises(ValueError, match=">= 0"):
        replay([1, -2], [3], S(2, 1, 1))
    with pytest.raises(ValueError, match="k >= 1"):
        S(0, 1, 1)


def test_to_dict_carries_effective_settings_and_figures():
    d = replay([10, 11, 12, 13, 14, 99], [10, 11, 12, 13, 14, 7], S(3, 2, 2)).to_dict()
    assert d["settings"] == {"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_min": 2, "prompt_lookup_max": 2}  # fmt: skip
    r = replay([10, 11, 12, 13, 14, 99], [10, 11, 12, 13, 14, 7], S(3, 2, 2))
    assert d["label"] == "k=3 n=2..2" and d["tokens_per_forward_pass"] == r.tokens_per_step == 2.0
    assert d["tokens_per_step"] == r.decode_tokens_per_step  # the map's axis, decode steps only
    assert np.isclose(d["mean_acceptance_length"], 4.0)


# --- recorded from the real CPU vLLM ---------------------------------------------------------

RECORDED = Path(__file__).parents[3] / "data" / "vllm-0.32-cpu-ngram-replay.json"


def test_replay_of_recorded_real_baseline_equals_the_recorded_counters():
    """Token ids and counters recorded on the real vLLM 0.32 (see the file's "source")."""
    data = json.loads(RECORDED.read_text())
    compared = 0
    for config, per_prompt in data["configs"].items():
        settings = effective_settings(json.loads(config))
        for prompt_type, measured in per_prompt.items():
            base = data["baseline"][prompt_type]
            got = replay(
                base["prompt_ids"],
                base["output_ids"],
                settings,
                lookahead_ids=base["lookahead_ids"],
                max_model_len=data["max_model_len"],
                cached_prompt_tokens=measured["prefix_cache_hits"],
            )
            if measured["outputs_equal"]:
                compared += 1
                assert got.exact
                assert (got.drafts, got.draft_tokens, got.accepted) == (
                    measured["drafts"],
                    measured["draft_tokens"],
                    measured["accepted"],
                ), (config, prompt_type)
                assert list(got.accepted_per_position) == measured["accepted_per_position"]
            without = replay(base["prompt_ids"], base["output_ids"], settings)
            if measured["outputs_equal"]:  # the stated bound holds without look-ahead too
                assert without.accepted <= measured["accepted"] <= without.accepted_max
    assert compared == 6
