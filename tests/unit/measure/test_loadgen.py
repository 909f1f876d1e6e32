"""The load generator's parsing, timing and load levels, with no socket: httpx.MockTransport.

The mock plays back exact SSE bytes in the pieces a test chooses (an event split across reads,
several events in one read, CRLF line ends), with sleeps between pieces where timing matters:
those tests run on virtual time (support/virtual_clock.py), so a 20 ms gap is measured as
exactly 20 ms however busy the machine is.
What needs a real socket (a reset or a close mid-body, a silent stream) is in
test_loadgen_edge_cases.py against the stand-in server; normal behaviour against the real vLLM
is in test_loadgen_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from pytest_specdecode.config.load import SLO, LoadLevel
from pytest_specdecode.config.prompts import Prompt, request_plan
from pytest_specdecode.errors import RequestError
from pytest_specdecode.measure.requests.loadgen import (
    RequestSpec,
    planned_specs,
    poisson_arrivals,
    run_level,
    timed_request,
)
from pytest_specdecode.record.requests.level_stats import LevelStats, level_stats

from ...support.virtual_clock import VirtualTime

API = "http://mock.test"
PROMPT = "Say hello to an old friend."

# (text, cumulative completion tokens): tokens per chunk [0 (role), 1, 3, 1, 4, 2], as
# speculative decoding delivers them.
PIECES = [("Hello", 1), (" there, my", 4), (" dear", 5), (" old friend of", 9), (" mine.", 11)]


async def run_requests(spec, *, count: int, concurrency: int = 1, **kwargs):
    """`count` requests of one prompt at one closed-loop level: (samples, wall time)."""
    result = await run_level([spec] * count, LoadLevel(concurrency=concurrency), **kwargs)
    return result.samples, result.stats.wall_s


def chat_chunk(content: str | None, tokens: int | None, *, role: bool = False) -> dict[str, Any]:
    delta = {"role": "assistant", "content": ""} if role else {"content": content}
    chunk: dict[str, Any] = {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }
    if tokens is not None:
        chunk["usage"] = {
            "prompt_tokens": 7,
            "completion_tokens": tokens,
            "total_tokens": 7 + tokens,
        }
    return chunk


def usage_chunk(tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-mock",
        "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens},
    }


def sse(*events: dict[str, Any] | str, end: str = "\n\n") -> bytes:
    return b"".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}{end}".encode() for e in events
    )


MULTI_TOKEN = [
    sse(chat_chunk(None, 0, role=True)),
    *(sse(chat_chunk(text, n)) for text, n in PIECES),
    sse(usage_chunk(11)),
    sse("[DONE]"),
]


class Pieces(httpx.AsyncByteStream):
    """A response body sent in the given pieces, `delay_s` apart."""

    def __init__(self, pieces: Sequence[bytes], delay_s: float = 0.0) -> None:
        self.pieces, self.delay_s = pieces, delay_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, piece in enumerate(self.pieces):
            if i and self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield piece


class Counted(Pieces):
    """Pieces whose stream counts as in flight at its mock until the client closes it."""

    def __init__(self, mock: Mock, pieces: Sequence[bytes], delay_s: float) -> None:
        super().__init__(pieces, delay_s)
        self.mock, self.closed = mock, False

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.mock.in_flight -= 1


@dataclass
class Mock:
    """A MockTransport answering every request with `pieces`; it records what was sent."""

    pieces: Sequence[bytes] = field(default_factory=lambda: MULTI_TOKEN)
    delay_s: float = 0.0
    status: int = 200
    requests: list[httpx.Request] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    started: list[float] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.started.append(asyncio.get_running_loop().time())  # virtual, on a virtual clock
        if self.status != 200:
            return httpx.Response(self.status, text='{"object": "error", "message": "nope"}')
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=Counted(self, self.pieces, self.delay_s),
        )

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]


def spec(**overrides: Any) -> RequestSpec:
    fields: dict[str, Any] = {"api_base": API, "model": "m", "prompt": PROMPT, "max_tokens": 16}
    fields.update(overrides)
    return RequestSpec(**fields)


async def send(mock: Mock, request: RequestSpec | None = None, **labels: Any):
    kwargs = {"prompt_type": "w", "phase": "baseline", "index": 3, "warmup": False, **labels}
    async with httpx.AsyncClient(transport=mock.transport()) as client:
        return await timed_request(client, request or spec(), **kwargs)


async def failure(mock: Mock, request: RequestSpec | None = None) -> str:
    with pytest.raises(RequestError) as info:
        await send(mock, request)
    return str(info.value)


# --------------------------------------------------------------------------- one stream


@pytest.mark.asyncio
async def test_multi_token_chunks_count_tokens_from_usage_not_chunks():
    sample = await send(Mock(), index=5, warmup=True, prompt_index=2, level="c4")

    assert (sample.prompt_type, sample.phase, sample.index, sample.warmup) == (
        "w",
        "baseline",
        5,
        True,
    )
    assert (sample.prompt_index, sample.level) == (2, "c4")
    assert sample.output_tokens == 11
    assert sample.prompt_tokens == 7
    assert sample.chunks == 6  # the role chunk and five content chunks; not the usage-only one
    assert sample.tokens_per_chunk == [0, 1, 3, 1, 4, 2]
    assert sample.text == "Hello there, my dear old friend of mine."
    assert sample.to_json()["prompt_index"] == 2


def test_timings_follow_the_pieces_and_tpot_divides_by_tokens():
    clock = VirtualTime().clock
    sample = clock.run(send(Mock(delay_s=0.02), clock=clock))

    assert sample.ttft_s == 0  # the role chunk is the first piece
    # Six pieces after the role chunk's arrive 20 ms apart; the last content chunk is the 6th.
    assert sample.e2e_s - sample.ttft_s == pytest.approx(0.1)
    assert sample.tpot_s == pytest.approx(0.01)  # over 10 token intervals, not 5 chunks
    assert sample.chunk_gaps_s == pytest.approx([0.02] * 5)


@pytest.mark.asyncio
async def test_events_split_anywhere_across_reads_parse_the_same():
    body = b"".join(MULTI_TOKEN)
    for size in (1, 3, 7, 64):
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        sample = await send(Mock(pieces=pieces))
        assert (sample.output_tokens, sample.chunks) == (11, 6), size
        assert sample.text == "Hello there, my dear old friend of mine."


@pytest.mark.asyncio
async def test_events_of_one_read_share_its_arrival_time():
    sample = await send(Mock(pieces=[b"".join(MULTI_TOKEN)]))

    assert sample.chunks == 6
    assert sample.chunk_gaps_s == [0.0] * 5
    assert sample.e2e_s == sample.ttft_s


@pytest.mark.asyncio
async def test_crlf_line_ends_comments_and_a_last_line_without_newline():
    pieces = [
        b": ping\r\n\r\n",
        sse(chat_chunk(None, 0, role=True), end="\r\n\r\n"),
        sse(chat_chunk("Hi", 1), end="\r\n\r\n"),
        b": another ping\n\n",
        sse(usage_chunk(1)),
        b"data: [DONE]",
    ]
    sample = await send(Mock(pieces=pieces))

    assert (sample.text, sample.output_tokens, sample.chunks) == ("Hi", 1, 2)


@pytest.mark.asyncio
async def test_a_chunk_without_usage_drops_the_per_chunk_counts_but_not_the_total():
    pieces = [
        sse(chat_chunk(None, 0, role=True)),
        sse(chat_chunk("a", None)),
        sse(chat_chunk("b", 2)),
        sse(usage_chunk(2)),
        sse("[DONE]"),
    ]
    sample = await send(Mock(pieces=pieces))

    assert sample.tokens_per_chunk is None
    assert sample.output_tokens == 2


@pytest.mark.asyncio
async def test_chat_request_body_asks_for_greedy_streaming_with_continuous_usage():
    mock = Mock()
    await send(mock, spec(max_tokens=32))

    (request,) = mock.requests
    assert request.method == "POST"
    assert str(request.url) == f"{API}/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert mock.bodies()[0] == {
        "model": "m",
        "max_tokens": 32,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "messages": [{"role": "user", "content": PROMPT}],
    }


@pytest.mark.asyncio
async def test_ignore_eos_is_sent_only_when_asked():
    mock = Mock()
    await send(mock, spec(ignore_eos=True))
    await send(mock, spec())

    assert mock.bodies()[0]["ignore_eos"] is True
    assert "ignore_eos" not in mock.bodies()[1]


@pytest.mark.asyncio
async def test_multi_turn_messages_are_sent_as_given():
    mock = Mock()
    turns = (("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye"))
    await send(mock, spec(prompt="Bye", messages=turns))

    assert mock.bodies()[0]["messages"] == [{"role": r, "content": c} for r, c in turns]


def test_multi_turn_messages_need_the_chat_endpoint():
    with pytest.raises(ValueError, match="need the chat endpoint"):
        spec(endpoint="completions", messages=(("user", "Hi"),))


@pytest.mark.asyncio
async def test_completions_endpoint_reads_choice_text():
    def chunk(text: str, tokens: int) -> dict[str, Any]:
        return {
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}],
            "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens},
        }

    pieces = [
        sse(chunk(" Once", 1)),
        sse(chunk(" upon a", 3)),
        sse(chunk(" time", 4)),
        sse(usage_chunk(4)),
        sse("[DONE]"),
    ]
    mock = Mock(pieces=pieces)
    sample = await send(mock, spec(endpoint="completions"))

    assert str(mock.requests[0].url) == f"{API}/v1/completions"
    body = mock.bodies()[0]
    assert body["prompt"] == PROMPT and "messages" not in body
    assert (sample.text, sample.output_tokens, sample.chunks) == (" Once upon a time", 4, 3)
    assert sample.tokens_per_chunk == [1, 2, 1]


# --------------------------------------------------------------------------- broken streams


@pytest.mark.asyncio
async def test_no_usage_is_an_error_because_chunks_are_not_tokens():
    pieces = [sse(chat_chunk(None, None, role=True)), sse(chat_chunk("a", None)), sse("[DONE]")]
    message = await failure(Mock(pieces=pieces))

    assert f"{API}/v1/chat/completions: the server sent no usage" in message
    assert "chunks are not tokens" in message


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("piece", "expected"),
    [
        (b"data: {not json\n\n", "malformed SSE data '{not json'"),
        (b"this line is not server-sent events\n\n", "malformed SSE line 'this line is not"),
        (b"data: [1, 2]\n\n", "SSE data is not a JSON object: '[1, 2]'"),
        (b"data: \xff\xfe\n\n", "malformed SSE data"),
    ],
)
async def test_malformed_events(piece, expected):
    message = await failure(Mock(pieces=[MULTI_TOKEN[0], piece, sse("[DONE]")]))

    assert expected in message


@pytest.mark.asyncio
async def test_error_event_mid_stream():
    error = {"object": "error", "message": "the engine died mid-stream", "code": 500}
    message = await failure(Mock(pieces=[*MULTI_TOKEN[:2], sse({"error": error})]))

    assert "the server reported an error mid-stream" in message
    assert "the engine died mid-stream" in message


@pytest.mark.asyncio
async def test_end_without_done():
    message = await failure(Mock(pieces=MULTI_TOKEN[:4]))

    assert message.endswith("the stream ended without [DONE] after 4 chunks")


@pytest.mark.asyncio
async def test_done_without_tokens():
    message = await failure(Mock(pieces=[sse(usage_chunk(0)), sse("[DONE]")]))

    assert message.endswith("the stream carried no tokens")


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [400, 404, 500])
async def test_http_error_status_names_status_and_body(status):
    message = await failure(Mock(status=status))

    assert message.startswith(
        f"{API}/v1/chat/completions answered HTTP {status} (w, baseline): "
        '{"object": "error", "message": "nope"}'
    )


# --------------------------------------------------------------------------- load levels


def specs_for(n: int) -> list[RequestSpec]:
    return [spec(prompt=f"prompt {i}") for i in range(n)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_closed_loop_level_keeps_n_in_flight_and_sends_in_plan_order(concurrency):
    mock = Mock(delay_s=0.01)
    seen = []
    clock = VirtualTime().clock
    result = clock.run(
        run_level(
            specs_for(7),
            LoadLevel(concurrency=concurrency),
            prompt_type="w",
            phase="p",
            prompt_indices=[4, 5, 6, 0, 1, 2, 3],
            transport=mock.transport(),
            on_sample=seen.append,
            clock=clock,
        )
    )

    assert mock.peak_in_flight == concurrency == result.stats.peak_in_flight
    assert [b["messages"][0]["content"] for b in mock.bodies()] == [f"prompt {i}" for i in range(7)]
    assert [s.index for s in result.samples] == list(range(7))
    assert [s.prompt_index for s in result.samples] == [4, 5, 6, 0, 1, 2, 3]
    assert {s.level for s in result.samples} == {f"c{concurrency}"}
    assert sorted(map(id, seen)) == sorted(map(id, result.samples))
    stats = result.stats
    assert stats.n == 7 and stats.output_tokens == 77
    assert stats.output_tokens_per_s == pytest.approx(77 / stats.wall_s)
    assert stats.request_rate == pytest.approx(7 / stats.wall_s)
    # 5 gaps of 10 ms to the last token, 2 more to [DONE]: one request after another, or three
    # at a time
    assert [s.e2e_s for s in result.samples] == pytest.approx([0.05] * 7)
    assert stats.wall_s == pytest.approx(0.07 * math.ceil(7 / concurrency))
    assert stats.tpot_p50_ms <= stats.tpot_p99_ms
    assert stats.ttft_p50_ms <= stats.ttft_p99_ms
    assert stats.good is None and stats.goodput is None
    assert not stats.client_saturated


def test_open_loop_level_sends_at_the_seeded_poisson_arrivals():
    mock = Mock()
    level = LoadLevel(rate=40.0, seed=7)
    clock = VirtualTime().clock
    result = clock.run(
        run_level(
            specs_for(8), level, prompt_type="w", phase="p", transport=mock.transport(), clock=clock
        )
    )

    arrivals = poisson_arrivals(8, 40.0, 7)
    sent = [t - mock.started[0] for t in mock.started]
    assert sent == pytest.approx(arrivals, abs=1e-9)
    assert result.stats.max_send_lag_ms == pytest.approx(0, abs=1e-6)
    assert result.samples[0].level == "r40"


def test_open_loop_with_a_concurrency_cap_waits_for_a_slot():
    mock = Mock(delay_s=0.02)
    clock = VirtualTime().clock
    level = LoadLevel(rate=1000.0, concurrency=2)
    result = clock.run(
        run_level(
            specs_for(6),
            level,
            prompt_type="w",
            phase="p",
            transport=mock.transport(),
            clock=clock,
        )
    )

    assert mock.peak_in_flight == 2
    # 140 ms a request (7 gaps), two at a time: the last two, due within the first few ms,
    # wait about 280 ms for the third and fourth to end
    assert max(poisson_arrivals(6, 1000.0, level.seed)) < 0.01
    assert 270 < result.stats.max_send_lag_ms < 280


@pytest.mark.asyncio
async def test_goodput_and_percentile_checks_against_the_slo():
    slow = Mock(delay_s=0.01)  # TPOT about 6 ms: ~60 ms over 10 token intervals
    slo = SLO(tpot_ms=1000.0, ttft_ms=0.001, percentiles={"tpot_p99_ms": 1.0, "e2e_p50_ms": 1e6})
    result = await run_level(
        specs_for(3),
        LoadLevel(concurrency=3),
        prompt_type="w",
        phase="p",
        slo=slo,
        transport=slow.transport(),
    )

    stats = result.stats
    assert stats.good == 0 and stats.goodput == 0.0  # no request meets TTFT <= 1 microsecond
    checks = {c.key: c for c in stats.slo_checks}
    assert not checks["tpot_p99_ms"].met and checks["e2e_p50_ms"].met
    assert not all(c.met for c in stats.slo_checks)
    assert result.slo.to_dict()["tpot_ms"] == 1000.0

    lenient = await run_level(
        specs_for(3),
        LoadLevel(concurrency=3),
        prompt_type="w",
        phase="p",
        slo=SLO(tpot_ms=1000.0),
        transport=slow.transport(),
    )
    assert lenient.stats.good == 3
    assert lenient.stats.goodput == pytest.approx(3 / lenient.stats.wall_s)


def test_a_busy_client_is_flagged_and_an_idle_one_is_not():
    body = b"".join(MULTI_TOKEN)

    async def handle(request: httpx.Request) -> httpx.Response:
        end = time.process_time() + 0.02  # the "client" burns 20 ms of CPU ...
        while time.process_time() < end:
            pass
        await asyncio.sleep(0.02)  # ... in a request of 20 ms (virtual)
        return httpx.Response(200, stream=Pieces([body]))

    def level(n: int, transport: httpx.MockTransport):
        clock = VirtualTime().clock
        return clock.run(
            run_level(
                specs_for(n),
                LoadLevel(concurrency=1),
                prompt_type="w",
                phase="p",
                transport=transport,
                cpu_window_s=0.1,
                clock=clock,
            )
        )

    busy = level(30, httpx.MockTransport(handle))
    idle = level(3, Mock(delay_s=0.03).transport())

    # CPU over wall time: a busy client uses far more of it than one that waits on its server.
    # (CPU seconds are the process's own, so the figures hold on a busy machine; the flag
    # itself is tested on fixed figures below.)
    assert busy.stats.client_cpu_share >= 1.0
    assert busy.stats.client_cpu_share > 3 * idle.stats.client_cpu_share
    assert busy.stats.client_peak_cpu_share >= busy.stats.client_cpu_share
    assert idle.stats.client_cpu_share < 0.5


def test_the_saturation_flag_and_its_warning():
    def stats(cpu_s: float, peak: float | None = None) -> LevelStats:
        return level_stats([], wall_s=10.0, cpu_s=cpu_s, peak_cpu_share=peak)

    assert not stats(8.9).client_saturated and stats(8.9).warnings() == []
    assert stats(9.0).client_saturated
    burst = stats(2.0, peak=0.95)  # saturated in its busiest window only
    assert burst.client_saturated and burst.client_cpu_share == 0.2
    assert "used 95% of a core" in burst.warnings()[0]
    assert "the client, not the server, may be the limit" in burst.warnings()[0]
    assert burst.to_dict()["warnings"] == burst.warnings()


@pytest.mark.asyncio
async def test_the_first_failure_cancels_the_level_and_is_raised():
    calls = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 2:
            return httpx.Response(500, text="Internal Server Error")
        return httpx.Response(200, stream=Pieces([*MULTI_TOKEN[:3]], delay_s=10))

    others = asyncio.all_tasks() - {asyncio.current_task()}
    with pytest.raises(RequestError, match="answered HTTP 500"):
        await run_level(
            specs_for(4),
            LoadLevel(concurrency=2),
            prompt_type="w",
            phase="p",
            transport=httpx.MockTransport(handle),
        )
    assert not asyncio.all_tasks() - {asyncio.current_task()} - others


@pytest.mark.asyncio
async def test_a_planned_prompt_set_sends_each_prompt_as_planned():
    prompts = [Prompt(f"q{i}") for i in range(3)] + [
        Prompt("again", messages=(("user", "first"), ("assistant", "ok"), ("user", "again")))
    ]
    plan = request_plan(len(prompts), samples=4, warmup=0)
    mock = Mock()
    await run_level(
        planned_specs(spec(), prompts, plan.levels[0]),
        LoadLevel(concurrency=1),
        prompt_type="w",
        phase="p",
        prompt_indices=plan.levels[0],
        transport=mock.transport(),
    )

    sent = [b["messages"] for b in mock.bodies()]
    assert [m[-1]["content"] for m in sent] == ["q0", "q1", "q2", "again"]
    assert len(sent[3]) == 3


def test_a_level_needs_requests_and_matching_indices():
    with pytest.raises(ValueError, match="at least one request"):
        asyncio.run(run_level([], LoadLevel(concurrency=1), prompt_type="w", phase="p"))
    with pytest.raises(ValueError, match="2 requests but 1 prompt indices"):
        asyncio.run(
            run_level(
                specs_for(2),
                LoadLevel(concurrency=1),
                prompt_type="w",
                phase="p",
                prompt_indices=[0],
            )
        )


@pytest.mark.asyncio
async def test_run_requests_sends_the_same_prompt_count_times():
    mock = Mock()
    samples, wall = await run_requests(
        spec(),
        prompt_type="w",
        phase="p",
        count=3,
        warmup=True,
        concurrency=2,
        headers={"Authorization": "Bearer mock"},
        transport=mock.transport(),
    )

    assert [s.index for s in samples] == [0, 1, 2] and all(s.warmup for s in samples)
    assert all(r.headers["authorization"] == "Bearer mock" for r in mock.requests)
    assert wall >= max(s.e2e_s for s in samples)
