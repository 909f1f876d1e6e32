"""The replay step by step, and its check against the server's per-request arrays: on what the
real CPU vLLM 0.32 sent (tests/data), and on arrays changed to show each class."""

from __future__ import annotations

import random

import pytest

from pytest_specdecode.analysis.prediction.ngram_replay import StepReplay, replay_many
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings, RequestTokens
from pytest_specdecode.analysis.prediction.step_check import LevelSteps, check_steps
from pytest_specdecode.record.requests.request_metrics import RequestSpecDecode
from tests.support.synthetic import per_request_data

DATA = per_request_data()
PRESET = NgramSettings(5, 4, 4)
MML = DATA["max_model_len"]


def _requests(level: str) -> list[dict]:
    return DATA["levels"][level]["requests"]


def _replay(request: dict, output: list[int] | None = None) -> StepReplay:
    tokens = RequestTokens.of(request["prompt_ids"], output or request["output_ids"])
    return StepReplay(tokens, PRESET, max_model_len=MML)


def _server(request: dict) -> list[tuple[int, int]]:
    return RequestSpecDecode.of(request["payload"]).steps


def test_the_steps_sum_to_the_replay() -> None:
    rng = random.Random(1)
    for _ in range(300):
        vocab = rng.choice([3, 5, 20])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        ahead = [rng.randrange(vocab) for _ in range(rng.choice([0, 3, 8]))]
        lo = rng.randrange(1, 4)
        settings = NgramSettings(rng.randrange(1, 7), lo, rng.randrange(lo, 5))
        cached = rng.choice([0, len(prompt) - 1])
        mml = rng.choice([None, len(prompt) + len(output) + 2])
        request = RequestTokens.of(prompt, output, ahead, cached)
        total = replay_many([request], settings, max_model_len=mml)
        steps = StepReplay(request, settings, max_model_len=mml).steps()
        drafted = [s for s in steps if s.drafted]
        assert len(drafted) == total.drafts
        assert sum(s.drafted for s in drafted) == total.draft_tokens
        assert sum(s.accepted for s in drafted) == total.accepted
        assert sum(s.unverified for s in drafted) == total.unverified_tokens
        assert sum(not s.padded for s in steps) == total.decode_steps


@pytest.mark.parametrize("level", ["c1", "c4"])
def test_the_server_drafts_as_the_replay_on_its_own_tokens(level: str) -> None:
    """At one stream and at four, every verify step of every request is the replay's (the last
    within the bound: no look-ahead was recorded)."""
    checks = [
        check_steps(_server(r), _replay(r), output_ids=r["output_ids"]) for r in _requests(level)
    ]
    found = LevelSteps.of(checks)
    assert found.agreeing == found.requests == 12
    assert found.agreed_steps == found.steps == sum(len(_server(r)) for r in _requests(level))


def test_at_four_streams_only_the_outputs_part_from_the_one_stream_replay() -> None:
    """The seed's math prompt: 4.56 at c1, 3.25 at c4, because its c4 output differs."""
    one = {r["prompt_index"]: r for r in _requests("c1")}
    checks = []
    for r in _requests("c4"):
        base = one[r["prompt_index"]]
        check = check_steps(_server(r), _replay(base), output_ids=r["output_ids"])
        checks.append(check)
        differ = next(
            (
                j
                for j, (a, b) in enumerate(zip(base["output_ids"], r["output_ids"], strict=True))
                if a != b
            ),
            None,
        )
        if differ is None:
            assert check.agrees, check.detail
        else:
            assert check.first == "outputs differ"
            assert check.first_token is not None and check.first_token <= differ
    found = LevelSteps.of(checks)
    assert (found.agreeing, found.by_first) == (5, {"outputs differ": 7})
    seed = RequestSpecDecode.of(_requests("c4")[0]["payload"])
    assert round(seed.mean_acceptance_length or 0, 2) == 3.25
    assert "outputs differ 7" in found.text()


def _seed() -> tuple[list[tuple[int, int]], StepReplay, list[int]]:
    """A request whose text does not repeat itself (the seed's prompt does: a step there can
    look like one a few tokens on), its arrays then changed as a server might have made them."""
    r = _requests("c1")[2]
    return _server(r), _replay(r), r["output_ids"]


def test_a_draft_the_server_left_out() -> None:
    server, replay, output = _seed()
    check = check_steps(server[:3] + server[4:], replay, output_ids=output)
    assert (check.first, check.first_step) == ("no draft", 3)
    assert "the server none; its next draft is the replay's" in check.detail
    assert set(check.classes) == {"no draft"}
    assert check.agreed == len(server) - 1


def test_fewer_draft_tokens() -> None:
    server, replay, output = _seed()
    _, accepted = server[2]
    changed = [*server[:2], (3, min(accepted, 3)), *server[3:]]
    check = check_steps(changed, replay, output_ids=output)
    assert (check.first, check.first_step) == ("fewer draft tokens", 2)


def test_another_outcome_is_other() -> None:
    server, replay, output = _seed()
    assert server[5] == (5, 0)
    changed = [*server[:5], (5, 1), *server[6:]]
    check = check_steps(changed, replay, output_ids=output)
    assert (check.first, check.first_step, check.classes) == ("other", 5, {"other": 1})
    assert check.agreed == len(server) - 1


def test_a_server_that_drafted_nothing_at_all() -> None:
    server, replay, output = _seed()
    check = check_steps([], replay, output_ids=output)
    assert check.first == "no draft"
    assert check.classes == {"no draft": len(server)}
    assert LevelSteps.of([check]).step_shares() == {"agree": 0.0, "no draft": 1.0}


def test_an_output_that_ends_or_runs_on_differs() -> None:
    """A request that stopped early (EOS), or ran past the replayed output: the drafts it did
    not make, or made past the end, come from the outputs' difference, not the proposer."""
    server, replay, output = _seed()
    drafted = [s for s in replay.steps() if s.drafted]
    cut = drafted[6].position  # the request ends where the replay's 7th draft would start
    shorter = check_steps(server[:6], replay, output_ids=output[:cut])
    assert (shorter.first, shorter.agreed) == ("outputs differ", 6), shorter.detail
    assert shorter.classes == {"outputs differ": len(server) - 6}
    end = drafted[-1].position  # the replayed output ends before the request's last step
    ended = StepReplay(
        RequestTokens.of(replay.request.prompt_ids, output[:end]), PRESET, max_model_len=MML
    )
    longer = check_steps(server, ended, output_ids=output)
    assert (longer.first, longer.classes) == ("outputs differ", {"outputs differ": 1})
