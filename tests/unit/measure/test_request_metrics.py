"""vLLM's per-request speculative metrics, on what the real CPU vLLM 0.32 sent (tests/data)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pytest_specdecode.measure.requests.loadgen import RequestSpec, make_client, timed_request
from pytest_specdecode.record.requests.request_metrics import (
    RequestSpecDecode,
    acceptance_of,
    against_counters,
    payload_problem,
)
from tests.support.synthetic import acceptance_of as counted
from tests.support.synthetic import per_request_data

DATA = per_request_data()


def _counters(level: str):
    c = DATA["levels"][level]["counters"]
    return counted(c["drafts"], c["draft_tokens"], c["accepted"], c["accepted_per_position"])


@pytest.mark.parametrize("level", ["c1", "c4"])
def test_the_requests_sum_to_the_counters_delta(level: str) -> None:
    payloads = [r["payload"] for r in DATA["levels"][level]["requests"]]
    mine = acceptance_of(payloads)
    assert mine is not None
    counters = _counters(level)
    assert (mine.drafts, mine.draft_tokens, mine.accepted) == (
        counters.drafts,
        counters.draft_tokens,
        counters.accepted,
    )
    assert [round(r * mine.drafts) for r in mine.per_position_rates] == DATA["levels"][level][
        "counters"
    ]["accepted_per_position"]
    assert against_counters(mine, counters) is None


def test_a_missing_request_shows_against_the_counters() -> None:
    payloads = [r["payload"] for r in DATA["levels"]["c1"]["requests"]][1:]
    note = against_counters(acceptance_of(payloads), _counters("c1"))
    assert note is not None and "drafts 130 vs 148" in note


def test_acceptance_needs_every_request() -> None:
    payloads = [r["payload"] for r in DATA["levels"]["c1"]["requests"]]
    assert acceptance_of([*payloads, None]) is None
    assert acceptance_of([]) is None


def test_a_payload_read() -> None:
    found = RequestSpecDecode.of(DATA["final_usage_chunk"]["metrics"]["speculative_decoding"])
    assert (found.drafts, found.accepted, found.num_draft_tokens) == (18, 64, 90)
    assert found.mean_acceptance_length == pytest.approx(1 + 64 / 18)
    assert found.per_position() == (16, 16, 16, 8, 8)
    assert found.steps[:3] == [(5, 0), (5, 0), (5, 5)]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"acceptance_histogram": [1, 2]}, "acceptance_histogram must list 6"),
        ({"num_spec_steps": 17}, "disagree with the histogram"),
        ({"per_step_drafted": None}, "come together"),
        ({"per_step_accepted": [0] * 18}, "do not sum"),
        ({"num_draft_tokens": -1}, "must be a count"),
    ],
)
def test_a_bad_payload_says_what_is_wrong(change: dict, says: str) -> None:
    payload = {**DATA["final_usage_chunk"]["metrics"]["speculative_decoding"], **change}
    assert says in (payload_problem(payload) or "")
    assert acceptance_of([payload]) is None


def test_the_load_generator_keeps_the_payload_and_the_ids() -> None:
    """The real stream's first chunks and final usage chunk, as vLLM sent them."""
    request = DATA["levels"]["c1"]["requests"][0]
    events = [*DATA["first_chunks"], DATA["final_usage_chunk"]]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    seen = {}

    def answer(req: httpx.Request) -> httpx.Response:
        seen.update(json.loads(req.content))
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    spec = RequestSpec("http://vllm", "m", "p", 128, return_token_ids=True)

    async def send():
        async with make_client(1, transport=httpx.MockTransport(answer)) as client:
            return await timed_request(
                client, spec, prompt_type="math", phase="ngram", index=0, warmup=False
            )

    sample = asyncio.run(send())
    assert seen["return_token_ids"] is True
    assert sample.spec_decode == DATA["final_usage_chunk"]["metrics"]["speculative_decoding"]
    assert sample.prompt_ids == request["prompt_ids"]
    assert sample.output_ids == request["output_ids"][: len(sample.output_ids or [])]
    assert sample.output_ids  # the second chunk's ids


def test_without_the_option_nothing_is_kept() -> None:
    body = (
        'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}\n\n'
        'data: {"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    spec = RequestSpec("http://vllm", "m", "p", 8)

    async def send():
        transport = httpx.MockTransport(lambda r: httpx.Response(200, text=body))
        async with make_client(1, transport=transport) as client:
            return await timed_request(
                client, spec, prompt_type="math", phase="b", index=0, warmup=False
            )

    sample = asyncio.run(send())
    assert (sample.spec_decode, sample.prompt_ids, sample.output_ids) == (None, None, None)
