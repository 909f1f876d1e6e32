"""Suffix decoding replayed offline with Arctic Inference's own cache (the package vLLM's
`suffix` method imports), over token ids the real CPU vLLM 0.32 gave (tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.prediction.ngram_types import RequestTokens
from pytest_specdecode.analysis.prediction.predict import predict_run
from pytest_specdecode.analysis.prediction.suffix_replay import (
    missing_reason,
    replay_suffix,
    suffix_settings,
)
from tests.support.synthetic import RECORDED_REPLAY, recorded_run

pytest.importorskip("arctic_inference.suffix_decoding", reason="pytest-specdecode[suffix]")

DATA = json.loads(RECORDED_REPLAY.read_text())
REQUESTS = [
    RequestTokens(tuple(b["prompt_ids"]), tuple(b["output_ids"])) for b in DATA["baseline"].values()
]


def test_vllms_defaults_are_the_replays() -> None:
    s = suffix_settings({"method": "suffix"})
    assert s is not None and (s.k, s.max_tree_depth, s.min_token_prob) == (24, 24, 0.1)
    assert suffix_settings({"method": "suffix", "num_speculative_tokens": 8}).k == 8
    assert suffix_settings({"method": "ngram", "num_speculative_tokens": 8}) is None
    assert missing_reason() is None


def test_each_step_emits_its_accepted_drafts_and_one_token() -> None:
    found = replay_suffix(REQUESTS, suffix_settings({"method": "suffix"}), DATA["max_model_len"])
    decoded = sum(len(r.output_ids) - 1 for r in REQUESTS)
    assert found.requests == 4 and found.output_tokens == 384
    assert 0 < found.accepted <= found.draft_tokens and found.drafts <= found.steps
    assert 0 <= found.steps + found.accepted - decoded <= found.requests  # a last step's bonus
    assert found.tokens_per_step == pytest.approx(decoded / found.steps)


def test_a_response_seen_before_is_drafted_from_the_global_tree() -> None:
    """What the n-gram replay cannot show: suffix decoding learns across requests."""
    settings = suffix_settings({"method": "suffix"})
    once = replay_suffix(REQUESTS[:1], settings, DATA["max_model_len"])
    twice = replay_suffix(REQUESTS[:1] * 2, settings, DATA["max_model_len"])
    second_steps = twice.steps - once.steps
    assert second_steps < once.steps / 3  # the repeat: a few long drafts
    assert (len(REQUESTS[0].output_ids) - 1) / second_steps > 4 * once.tokens_per_step


def test_the_prediction_replays_a_suffix_candidate_per_prompt_type(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    rec.candidates["suffix"] = {"method": "suffix", "num_speculative_tokens": 8}
    found = predict_run(rec)
    assert set(found.suffix["suffix"]) == set(found.replays)
    coding = found.suffix["suffix"]["coding"]
    assert coding.settings.k == 8 and coding.steps > 0
    assert found.to_json()["suffix"]["suffix"]["coding"]["label"] == "suffix k=8 depth=24"
