"""The load generator against faults that need a real socket, which a real vLLM will not produce
on demand: a reset mid-stream, a close in the middle of the HTTP body, a silent stream, a
trickle of pings past the deadline; and the default transport (LeanSSETransport) end to end.

Every request here goes over real HTTP to `StandInSSEServer` (tests/support/standin_server.py), a
stand-in that plays back exact bytes. Parsing is tested without a socket (test_loadgen.py,
httpx.MockTransport), normal behaviour against the real vLLM (test_loadgen_vllm.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from pytest_specdecode.config.load import LoadLevel
from pytest_specdecode.errors import RequestError
from pytest_specdecode.measure.requests.loadgen import (
    RequestSpec,
    make_client,
    run_level,
    timed_request,
)
from pytest_specdecode.record.requests.samples import RequestSample
from tests.support.standin_server import (
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


async def run_requests(spec, *, count: int, concurrency: int = 1, **kwargs):
    """`count` requests of one prompt at one closed-loop level: (samples, wall time)."""
    result = await run_level([spec] * count, LoadLevel(concurrency=concurrency), **kwargs)
    return result.samples, result.stats.wall_s


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


Transport = Callable[[], httpx.AsyncBaseTransport | None]


@pytest.fixture(params=["lean", "httpx"])
def transport(request) -> Transport:
    """Each test runs on the default transport (LeanSSETransport) and on httpx's own."""
    return (lambda: None) if request.param == "lean" else httpx.AsyncHTTPTransport


async def send(transport: Transport, spec: RequestSpec, **labels) -> RequestSample:
    kwargs = {"prompt_type": "edge", "phase": "baseline", "index": 3, "warmup": False, **labels}
    async with make_client(1, transport=transport()) as client:
        return await timed_request(client, spec, **kwargs)


async def send_failing(transport: Transport, spec: RequestSpec) -> tuple[str, float]:
    """Send a request that must fail; returns the RequestError's message and the wall time."""
    t0 = time.perf_counter()
    with pytest.raises(RequestError) as info:
        await send(transport, spec)
    return str(info.value), time.perf_counter() - t0


# --------------------------------------------------------------------------- valid streams


@pytest.mark.asyncio
async def test_multi_token_chunks_count_tokens_from_usage_not_chunks(standin, transport):
    before = time.time()
    sample = await send(transport, spec_for(standin, "multi_token_chunks"), index=5, warmup=True)

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
async def test_multi_token_chunks_timings(standin, transport):
    sample = await send(transport, spec_for(standin, "multi_token_chunks"))

    # The stand-in sleeps 20 ms before each chunk: the last can be read no sooner than 120 ms
    # after the request, however busy the machine. A starved client may read every chunk at
    # once, so the gaps' own sizes are timed on virtual time instead (test_loadgen.py).
    assert sample.e2e_s >= 0.12
    assert 0.02 <= sample.ttft_s <= sample.e2e_s
    assert sample.tpot_s == pytest.approx((sample.e2e_s - sample.ttft_s) / (11 - 1))
    assert len(sample.chunk_gaps_s) == sample.chunks - 1 == 5
    assert all(gap >= 0 for gap in sample.chunk_gaps_s)
    assert sum(sample.chunk_gaps_s) == pytest.approx(sample.e2e_s - sample.ttft_s)
    assert sample.tokens_per_s == pytest.approx(11 / sample.e2e_s)
    data = sample.to_json()
    assert data["tpot_s"] == sample.tpot_s
    assert data["tokens_per_chunk"] == [0, 1, 3, 1, 4, 2]


# --------------------------------------------------------------------------- broken streams


@pytest.mark.asyncio
async def test_connection_reset_mid_stream(standin, transport):
    message, _ = await send_failing(transport, spec_for(standin, "reset_mid_stream"))

    assert "the connection broke mid-request (ReadError" in message
    assert "edge, baseline" in message


@pytest.mark.asyncio
async def test_close_in_the_middle_of_the_http_body(standin, transport):
    message, _ = await send_failing(transport, spec_for(standin, "truncated_body"))

    assert "the connection broke mid-request (RemoteProtocolError" in message
    assert "incomplete chunked read" in message


@pytest.mark.asyncio
async def test_silent_stream_hits_the_read_timeout(standin, transport):
    spec = spec_for(standin, "never_ends", read_timeout_s=0.5, timeout_s=30.0)

    message, wall = await send_failing(transport, spec)

    assert "no data for" in message
    assert message.endswith("no data for 0.5s (edge, baseline)")
    assert wall >= 0.45  # the message names the deadline that ended it: 0.5 s, not 30 s


@pytest.mark.asyncio
async def test_trickle_of_comments_hits_the_overall_deadline(standin, transport):
    # Pings every 0.2 s keep the 0.9 s read timeout from firing (even with either side held up
    # for half a second on a busy machine): only timeout_s can end it.
    spec = spec_for(standin, "slow_trickle", read_timeout_s=0.9, timeout_s=1.0)

    message, wall = await send_failing(transport, spec)

    assert "the stream did not end within 1s (edge, baseline)" in message
    assert "ReadTimeout" not in message
    assert wall >= 1.0  # the message names the deadline that ended it


# --------------------------------------------------------------------------- run_requests


@pytest.mark.asyncio
@pytest.mark.parametrize("concurrency", [1, 2])
async def test_run_requests(standin, transport, concurrency):
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
        transport=transport(),
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
async def test_run_requests_raises_the_first_request_error(standin, transport):
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
            transport=transport(),
        )

    assert [s.index for s in seen] == [0]


# ------------------------------------------------------- timeout messages and cancellation


@pytest.mark.asyncio
async def test_run_requests_leaves_no_request_running_after_a_failure(standin, transport):
    standin.enqueue("http_500", "never_ends")
    others = asyncio.all_tasks() - {asyncio.current_task()}

    with pytest.raises(RequestError, match="answered HTTP 500"):
        await run_requests(
            spec_for(standin, QUEUED, read_timeout_s=1.0),
            prompt_type="edge",
            phase="candidate",
            count=2,
            concurrency=2,
            transport=transport(),
        )

    left = asyncio.all_tasks() - {asyncio.current_task()} - others
    try:
        assert not left
    finally:
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
