"""The load generator against faults a real vLLM will not produce on demand.

Every request here goes over real HTTP to `StandInSSEServer` (tests/support/standin_server.py), a
stand-in that plays back exact bytes: multi-token chunks, missing usage, malformed SSE, HTTP
errors, errors and resets mid-stream, streams that end without [DONE] or never end. Normal
behaviour is tested against the real vLLM server elsewhere.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from pytest_specdecode.errors import RequestError
from pytest_specdecode.measure.loadgen import (
    RequestSample,
    RequestSpec,
    run_requests,
    timed_request,
)
from pytest_specdecode.measure.server_metrics import client_accepted_tokens
from tests.support.standin_server import (
    COMPLETIONS_TEXT,
    MULTI_TOKEN_PER_CHUNK,
    MULTI_TOKEN_TEXT,
    MULTI_TOKEN_TOTAL,
    PROMPT_TOKENS,
    QUEUED,
    StandInSSEServer,
)

pytestmark = pytest.mark.filterwarnings(
    "error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning"
)

PROMPT = "Say hello to an old friend."
WALL_LIMIT_S = 5.0  # a fault must be reported within this, whatever the stand-in does


@pytest.fixture
def standin() -> Iterator[StandInSSEServer]:
    """A fresh stand-in server; shut down (silent streams included) and checked after."""
    server = StandInSSEServer().start()
    try:
        yield server
    finally:
        server.close()
        assert server.thread is not None and not server.thread.is_alive()
        assert server.open_connections == 0
        assert not [t for t in threading.enumerate() if t.name == "StandInSSEServer"]


def spec_for(server: StandInSSEServer, scenario: str, **overrides) -> RequestSpec:
    """A request that gets `scenario` from the stand-in (chosen by the model name)."""
    fields = {
        "api_base": server.base_url,
        "model": scenario,
        "prompt": PROMPT,
        "max_tokens": 16,
        "timeout_s": 10.0,
        "read_timeout_s": 5.0,
    }
    fields.update(overrides)
    return RequestSpec(**fields)


async def send(spec: RequestSpec, **labels) -> RequestSample:
    kwargs = {"prompt_type": "edge", "phase": "baseline", "index": 3, "warmup": False, **labels}
    async with httpx.AsyncClient() as client:
        return await timed_request(client, spec, **kwargs)


async def send_failing(spec: RequestSpec) -> tuple[str, float]:
    """Send a request that must fail; returns the RequestError's message and the wall time."""
    t0 = time.perf_counter()
    with pytest.raises(RequestError) as info:
        await send(spec)
    return str(info.value), time.perf_counter() - t0


# --------------------------------------------------------------------------- valid streams


@pytest.mark.asyncio
async def test_multi_token_chunks_count_tokens_from_usage_not_chunks(standin):
    before = time.time()
    sample = await send(spec_for(standin, "multi_token_chunks"), index=5, warmup=True)

    assert (sample.prompt_type, sample.phase, sample.index, sample.warmup) == (
        "edge",
        "baseline",
        5,
        True,
    )
    assert before <= sample.started_at <= time.time()
    assert sample.output_tokens == MULTI_TOKEN_TOTAL == 11
    assert sample.prompt_tokens == PROMPT_TOKENS
    assert sample.chunks == 6  # the role chunk and five content chunks; the usage-only one not
    assert sample.output_tokens != sample.chunks
    assert sample.tokens_per_chunk == MULTI_TOKEN_PER_CHUNK == [0, 1, 3, 1, 4, 2]
    assert sum(sample.tokens_per_chunk) == sample.output_tokens
    assert sample.text == MULTI_TOKEN_TEXT == "Hello there, my dear old friend of mine."


@pytest.mark.asyncio
async def test_multi_token_chunks_timings(standin):
    sample = await send(spec_for(standin, "multi_token_chunks"))

    assert 0 < sample.ttft_s < sample.e2e_s < WALL_LIMIT_S
    # The stand-in sleeps 20 ms before each of the five chunks after the role chunk.
    assert sample.e2e_s - sample.ttft_s > 0.05
    assert sample.tpot_s == pytest.approx((sample.e2e_s - sample.ttft_s) / (11 - 1))
    assert len(sample.chunk_gaps_s) == sample.chunks - 1 == 5
    assert all(gap >= 0 for gap in sample.chunk_gaps_s)
    assert sum(sample.chunk_gaps_s) == pytest.approx(sample.e2e_s - sample.ttft_s)
    assert sample.tokens_per_s == pytest.approx(11 / sample.e2e_s)
    data = sample.to_dict()
    assert data["tpot_s"] == sample.tpot_s
    assert data["tokens_per_chunk"] == [0, 1, 3, 1, 4, 2]


@pytest.mark.asyncio
async def test_client_accepted_tokens_of_multi_token_sample(standin):
    sample = await send(spec_for(standin, "multi_token_chunks"))

    assert sample.tokens_per_chunk is not None
    # The role chunk carries none and the first token comes from prefill: (3-1)+(1-1)+(4-1)+(2-1)
    assert client_accepted_tokens(sample.tokens_per_chunk) == 6


@pytest.mark.asyncio
async def test_chat_request_body_asks_for_greedy_streaming_with_continuous_usage(standin):
    await send(spec_for(standin, "multi_token_chunks", max_tokens=32))

    (request,) = standin.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {
        "model": "multi_token_chunks",
        "max_tokens": 32,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "messages": [{"role": "user", "content": PROMPT}],
    }
    assert request.body["temperature"] == 0


@pytest.mark.asyncio
async def test_ignore_eos_is_sent_only_when_asked(standin):
    await send(spec_for(standin, "multi_token_chunks", ignore_eos=True))

    assert standin.requests[0].body["ignore_eos"] is True


@pytest.mark.asyncio
async def test_completions_endpoint_reads_choice_text(standin):
    sample = await send(spec_for(standin, "completions_endpoint", endpoint="completions"))

    (request,) = standin.requests
    assert request.path == "/v1/completions"
    assert request.body["prompt"] == PROMPT
    assert "messages" not in request.body
    assert request.body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert sample.text == COMPLETIONS_TEXT == " Once upon a time"
    assert sample.output_tokens == 4
    assert sample.chunks == 3
    assert sample.tokens_per_chunk == [1, 2, 1]
    assert 0 < sample.ttft_s < sample.e2e_s


# --------------------------------------------------------------------------- broken streams


@pytest.mark.asyncio
async def test_no_usage_is_an_error_because_chunks_are_not_tokens(standin):
    message, _ = await send_failing(spec_for(standin, "no_usage"))

    assert "/v1/chat/completions: the server sent no usage" in message
    assert "chunks are not tokens" in message


@pytest.mark.asyncio
async def test_malformed_sse_data(standin):
    message, _ = await send_failing(spec_for(standin, "malformed_sse"))

    assert message.endswith("/v1/chat/completions: malformed SSE data '{not json'")


@pytest.mark.asyncio
async def test_line_without_data_prefix(standin):
    message, _ = await send_failing(spec_for(standin, "not_sse"))

    assert message.endswith("malformed SSE line 'this line is not server-sent events'")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("http_500", "answered HTTP 500 (edge, baseline): Internal Server Error"),
        (
            "http_404",
            'answered HTTP 404 (edge, baseline): {"object": "error", "message": "The model',
        ),
        (
            "http_400",
            'answered HTTP 400 (edge, baseline): {"object": "error", "message": "max_tokens must',
        ),
    ],
)
async def test_http_error_status_names_status_and_body(standin, scenario, expected):
    message, _ = await send_failing(spec_for(standin, scenario))

    assert message.startswith(f"{standin.base_url}/v1/chat/completions {expected}")


@pytest.mark.asyncio
async def test_scenario_chosen_by_url_path_overrides_the_model(standin):
    spec = spec_for(standin, "multi_token_chunks", api_base=standin.api_base_for("http_404"))

    message, _ = await send_failing(spec)

    assert "/scenario/http_404/v1/chat/completions answered HTTP 404" in message
    assert standin.requests[0].body["model"] == "multi_token_chunks"


@pytest.mark.asyncio
async def test_error_event_mid_stream(standin):
    message, _ = await send_failing(spec_for(standin, "error_mid_stream"))

    assert "the server reported an error mid-stream" in message
    assert "stand-in: the engine died mid-stream" in message


@pytest.mark.asyncio
async def test_connection_reset_mid_stream(standin):
    message, wall = await send_failing(spec_for(standin, "reset_mid_stream"))

    assert "the connection broke mid-request (ReadError" in message
    assert "edge, baseline" in message
    assert wall < WALL_LIMIT_S


@pytest.mark.asyncio
async def test_clean_close_without_done(standin):
    message, _ = await send_failing(spec_for(standin, "eof_without_done"))

    assert message.endswith("the stream ended without [DONE] after 3 chunks")


@pytest.mark.asyncio
async def test_close_in_the_middle_of_the_http_body(standin):
    message, _ = await send_failing(spec_for(standin, "truncated_body"))

    assert "the connection broke mid-request (RemoteProtocolError" in message
    assert "incomplete chunked read" in message


@pytest.mark.asyncio
async def test_silent_stream_hits_the_read_timeout(standin):
    spec = spec_for(standin, "never_ends", read_timeout_s=0.5, timeout_s=30.0)

    message, wall = await send_failing(spec)

    assert "no data for" in message
    assert message.endswith("no data for 0.5s (edge, baseline)")
    assert 0.45 <= wall < WALL_LIMIT_S


@pytest.mark.asyncio
async def test_trickle_of_comments_hits_the_overall_deadline(standin):
    # Pings every 0.2 s keep the 0.5 s read timeout from firing: only timeout_s can end it.
    spec = spec_for(standin, "slow_trickle", read_timeout_s=0.5, timeout_s=1.0)

    message, wall = await send_failing(spec)

    assert "the stream did not end within 1s (edge, baseline)" in message
    assert "ReadTimeout" not in message
    assert 1.0 <= wall < WALL_LIMIT_S


# --------------------------------------------------------------------------- run_requests


@pytest.mark.asyncio
@pytest.mark.parametrize("concurrency", [1, 2])
async def test_run_requests(standin, concurrency):
    seen: list[RequestSample] = []
    spec = spec_for(standin, "multi_token_chunks")

    samples, wall = await run_requests(
        spec,
        prompt_type="edge",
        phase="candidate",
        count=4,
        warmup=True,
        concurrency=concurrency,
        headers={"Authorization": "Bearer stand-in"},
        on_sample=seen.append,
    )

    assert [s.index for s in samples] == [0, 1, 2, 3]
    assert all(s.warmup and s.prompt_type == "edge" and s.phase == "candidate" for s in samples)
    assert all(s.output_tokens == 11 for s in samples)
    assert len(seen) == 4
    assert sorted(map(id, seen)) == sorted(map(id, samples))
    assert len(standin.requests) == 4
    assert all(r.headers["authorization"] == "Bearer stand-in" for r in standin.requests)
    assert standin.peak_in_flight == concurrency
    assert wall > max(s.e2e_s for s in samples)
    if concurrency == 1:
        assert wall >= sum(s.e2e_s for s in samples)
    else:
        assert wall < sum(s.e2e_s for s in samples)


@pytest.mark.asyncio
async def test_run_requests_raises_the_first_request_error(standin):
    standin.enqueue("multi_token_chunks", "http_500")
    seen: list[RequestSample] = []

    with pytest.raises(RequestError, match="answered HTTP 500"):
        await run_requests(
            spec_for(standin, QUEUED),
            prompt_type="edge",
            phase="candidate",
            count=2,
            concurrency=1,
            on_sample=seen.append,
        )

    assert [s.index for s in seen] == [0]


# ------------------------------------------------------- timeout messages and cancellation


@pytest.mark.asyncio
async def test_read_timeout_message_names_the_timeout(standin):
    spec = spec_for(standin, "never_ends", read_timeout_s=0.5)

    message, _ = await send_failing(spec)

    assert "no data for 0.5s" in message


@pytest.mark.asyncio
async def test_run_requests_leaves_no_request_running_after_a_failure(standin):
    standin.enqueue("http_500", "never_ends")
    others = asyncio.all_tasks() - {asyncio.current_task()}

    with pytest.raises(RequestError, match="answered HTTP 500"):
        await run_requests(
            spec_for(standin, QUEUED, read_timeout_s=1.0),
            prompt_type="edge",
            phase="candidate",
            count=2,
            concurrency=2,
        )

    left = asyncio.all_tasks() - {asyncio.current_task()} - others
    try:
        assert not left
    finally:
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
