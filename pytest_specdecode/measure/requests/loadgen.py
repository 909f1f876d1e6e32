"""The load generator. Every request is timed here, in `timed_request`.

`run_level` sends one load level (closed-loop concurrency and/or open-loop Poisson arrivals)
and returns its samples with their aggregates (record/requests/level_stats.py); it builds its
client in `make_client`, whose `transport` lets the fast tests answer from an `httpx.MockTransport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import httpx

from ...clock import MACHINE, Clock
from ...config.load import SLO, LoadLevel
from ...errors import RequestError
from ...record.requests.level_stats import LevelStats, level_stats
from ...record.requests.samples import RequestSample
from .sse_transport import LeanSSETransport

if TYPE_CHECKING:
    from ...config.prompts import Prompt

Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True)
class RequestSpec:
    """What to send: the prompt and the decoding settings."""

    api_base: str
    model: str
    prompt: str
    max_tokens: int
    endpoint: Endpoint = "chat"
    temperature: float = 0.0
    ignore_eos: bool = False
    timeout_s: float = 300.0  # the whole request, from send to the end of the stream
    read_timeout_s: float = 60.0  # the longest silence allowed between two chunks
    messages: tuple[tuple[str, str], ...] = ()  # chat: (role, content); empty: one user turn
    return_token_ids: bool = False  # vLLM streams the ids (ignored by servers without it)

    def __post_init__(self) -> None:
        if self.messages and self.endpoint != "chat":
            raise ValueError("multi-turn messages need the chat endpoint, not completions")

    def url_and_payload(self) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.ignore_eos:
            payload["ignore_eos"] = True
        if self.return_token_ids:
            payload["return_token_ids"] = True
        if self.endpoint == "chat":
            turns = self.messages or (("user", self.prompt),)
            payload["messages"] = [{"role": role, "content": text} for role, text in turns]
            return f"{self.api_base}/v1/chat/completions", payload
        payload["prompt"] = self.prompt
        return f"{self.api_base}/v1/completions", payload


async def timed_request(
    client: httpx.AsyncClient,
    spec: RequestSpec,
    *,
    prompt_type: str,
    phase: str,
    index: int,
    warmup: bool,
    prompt_index: int | None = None,
    level: str | None = None,
    clock: Clock = MACHINE,
) -> RequestSample:
    """Send one streaming request and time it on `clock`. Raises RequestError on any protocol
    problem."""
    url, payload = spec.url_and_payload()
    try:
        async with asyncio.timeout(spec.timeout_s):
            sample = await _stream(
                client, url, payload, spec, prompt_type, phase, index, warmup, clock.now
            )
    except TimeoutError:
        raise RequestError(
            f"{url}: the stream did not end within {spec.timeout_s:g}s ({prompt_type}, {phase})"
        ) from None
    except httpx.ReadTimeout:
        raise RequestError(
            f"{url}: no data for {spec.read_timeout_s:g}s ({prompt_type}, {phase})"
        ) from None
    except httpx.TimeoutException as exc:
        raise RequestError(
            f"{url}: timed out ({type(exc).__name__}; {prompt_type}, {phase})"
        ) from None
    except httpx.HTTPError as exc:
        raise RequestError(
            f"{url}: the connection broke mid-request ({type(exc).__name__}: "
            f"{exc or 'no detail'}; {prompt_type}, {phase})"
        ) from None
    sample.prompt_index = prompt_index
    sample.level = level
    return sample


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    spec: RequestSpec,
    prompt_type: str,
    phase: str,
    index: int,
    warmup: bool,
    clock: Callable[[], float],
) -> RequestSample:
    """The hot path: one stream, its SSE lines split from raw bytes, one clock read per read.

    An event's time is the time its bytes were read, so the events of one read share it.
    """
    timeout = httpx.Timeout(10.0, read=spec.read_timeout_s)
    started_at = time.time()
    t0 = clock()
    first = last = 0.0
    gaps: list[float] = []
    per_chunk: list[int] | None = []
    seen_tokens = 0
    text: list[str] = []
    usage: Mapping[str, Any] | None = None
    spec_decode: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = [] if spec.return_token_ids else None
    finish_reason: str | None = None
    chunks = 0
    done = False
    async with client.stream("POST", url, json=payload, timeout=timeout) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")[:300]
            raise RequestError(
                f"{url} answered HTTP {response.status_code} ({prompt_type}, {phase}): {body}"
            )
        pending = b""
        # The body's own stream, not response.aiter_raw(): a layer less on every read (httpx
        # still maps the transport's errors, and closes the stream with the response).
        reads = aiter(response.stream)
        while True:
            try:
                raw = await anext(reads)  # type: ignore[arg-type]
            except StopAsyncIteration:
                if not pending:
                    break
                raw = b"\n"  # a last line without a newline still counts, as in SSE
            now = clock()
            lines = (pending + raw if pending else raw).split(b"\n")
            pending = lines.pop()  # an incomplete line, or b""
            for line in lines:
                if not line:
                    continue
                if line[-1] == 13:  # "\r" of a CRLF line end
                    line = line[:-1]
                    if not line:
                        continue
                if line[0] == 58:  # an SSE comment (":")
                    continue
                if not line.startswith(b"data:"):
                    raise RequestError(f"{url}: malformed SSE line {_shown(line)}")
                try:
                    data = line[5:].decode().strip()
                    event, end = _scan(data, 0) if data != "[DONE]" else (None, 0)
                except (ValueError, StopIteration):
                    raise RequestError(
                        f"{url}: malformed SSE data {_shown(line[5:].strip())}"
                    ) from None
                if event is None:
                    done = True
                    break
                if end != len(data):
                    raise RequestError(f"{url}: malformed SSE data {_shown(line[5:].strip())}")
                if type(event) is not dict:
                    raise RequestError(
                        f"{url}: SSE data is not a JSON object: {_shown(line[5:].strip())}"
                    )
                if "error" in event:
                    raise RequestError(
                        f"{url}: the server reported an error mid-stream: "
                        f"{str(event['error'])[:300]}"
                    )
                chunk_usage = event.get("usage")
                if chunk_usage:
                    usage = chunk_usage
                    metrics = event.get("metrics")
                    if type(metrics) is dict and type(metrics.get("speculative_decoding")) is dict:
                        spec_decode = metrics["speculative_decoding"]
                if prompt_ids is None and output_ids is not None:
                    prompt_ids = _ids(event.get("prompt_token_ids"))
                choices = event.get("choices")
                if not choices:
                    continue
                if chunks:
                    gaps.append(now - last)
                else:
                    first = now
                chunks += 1
                last = now
                choice = choices[0]
                if choice.get("finish_reason"):
                    finish_reason = str(choice["finish_reason"])
                delta = choice.get("delta")
                piece = delta.get("content") if type(delta) is dict else choice.get("text")
                if piece:
                    text.append(piece if type(piece) is str else str(piece))
                if output_ids is not None:
                    ids = choice.get("token_ids")
                    if type(ids) is list:
                        output_ids += ids
                    if prompt_ids is None:  # completions: in the choice
                        prompt_ids = _ids(choice.get("prompt_token_ids"))
                if per_chunk is not None:
                    cumulative = chunk_usage.get("completion_tokens") if chunk_usage else None
                    if cumulative is None:
                        per_chunk = None
                    else:
                        per_chunk.append(cumulative - seen_tokens)
                        seen_tokens = cumulative
            if done:
                break
        if done:
            await _drain(reads)  # type: ignore[arg-type]
    if not done:
        raise RequestError(f"{url}: the stream ended without [DONE] after {chunks} chunks")
    if not chunks:
        raise RequestError(f"{url}: the stream carried no tokens")
    if not usage or usage.get("completion_tokens") is None:
        raise RequestError(
            f"{url}: the server sent no usage; output tokens cannot be counted "
            "(with speculation a chunk may carry several tokens, so chunks are not tokens)"
        )
    return RequestSample(
        prompt_type=prompt_type,
        phase=phase,
        index=index,
        warmup=warmup,
        started_at=started_at,
        ttft_s=first - t0,
        e2e_s=last - t0,
        output_tokens=int(usage["completion_tokens"]),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        chunks=chunks,
        chunk_gaps_s=gaps,
        tokens_per_chunk=per_chunk if per_chunk else None,
        text="".join(text),
        spec_decode=spec_decode,
        prompt_ids=prompt_ids,
        output_ids=_ids(output_ids) if output_ids else None,
        finish_reason=finish_reason,
    )


def _ids(value: Any) -> list[int] | None:
    """A list of token ids, or None where the server sent something else (or nothing)."""
    if type(value) is not list or not all(type(v) is int for v in value):
        return None
    return value


_DRAIN_S = 1.0
_scan = json.JSONDecoder().scan_once  # the C scanner under json.loads, without its wrappers


async def _drain(reads: AsyncIterator[bytes]) -> None:
    """Read what follows [DONE] (the end of the body, normally at once), so that the connection
    can be reused, as vLLM's client reuses its; a server that keeps the stream open after
    [DONE] costs a second at most, and the connection."""
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in reads:
                pass


def _shown(raw: bytes) -> str:
    return repr(raw.decode("utf-8", errors="replace")[:120])


def make_client(
    max_in_flight: int | None,
    *,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """The client of one batch of requests: a connection per request in flight, all kept alive.

    `max_in_flight` None means no bound (an open-loop level without a concurrency cap); the
    bound applies to httpx's own transport, while `LeanSSETransport` (the default, see
    measure/requests/sse_transport.py) opens what the level's requests in flight need. `transport`
    replaces it: `httpx.AsyncHTTPTransport()` for httpx's own, an `httpx.MockTransport` in
    fast tests.
    """
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    return httpx.AsyncClient(
        headers=dict(headers or {}),
        limits=limits,
        transport=transport if transport is not None else LeanSSETransport(),
    )


def planned_specs(
    base: RequestSpec, prompts: Sequence[Prompt], indices: Sequence[int]
) -> list[RequestSpec]:
    """One request per planned prompt index (config/prompts.py `request_plan`), in order."""
    return [replace(base, prompt=prompts[i].text, messages=prompts[i].messages) for i in indices]


@dataclass
class LevelResult:
    """One load level: its samples, in request order, and their aggregates."""

    level: LoadLevel
    samples: list[RequestSample]
    stats: LevelStats
    slo: SLO


class _CpuWindows:
    """The client process's CPU time over wall time, whole and per window of `window_s`."""

    def __init__(self, window_s: float, clock: Clock) -> None:
        self.window_s = window_s
        self.clock = clock
        self.peak = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.wall0, self.cpu0 = self.clock.now(), time.process_time()
        self._task = asyncio.ensure_future(self._sample())

    async def _sample(self) -> None:
        wall, cpu = self.wall0, self.cpu0
        while True:
            await asyncio.sleep(self.window_s)
            now, used = self.clock.now(), time.process_time()
            if now - wall > 0:
                self.peak = max(self.peak, (used - cpu) / (now - wall))
            wall, cpu = now, used

    async def stop(self) -> float:
        """Stops sampling; returns the CPU seconds used since start."""
        used = time.process_time() - self.cpu0
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return used


async def run_level(
    specs: Sequence[RequestSpec],
    level: LoadLevel,
    *,
    prompt_type: str,
    phase: str,
    prompt_indices: Sequence[int] | None = None,
    warmup: bool = False,
    slo: SLO | None = None,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    on_sample: Callable[[RequestSample], None] = lambda s: None,
    cpu_window_s: float = 1.0,
    clock: Clock = MACHINE,
) -> LevelResult:
    """Send one load level: request i is `specs[i]`, sent in that order; returns the samples.

    Closed loop (concurrency N, no rate): N requests in flight, the next sent as one ends.
    Open loop (rate): request i leaves at its Poisson arrival time (seeded), with at most
    `concurrency` in flight if that is set too. The first RequestError cancels the rest and is
    raised. The client's CPU share is measured over the level and per `cpu_window_s` window.
    Times are read on `clock`; run this on its event loop (`clock.run`).
    """
    if not specs:
        raise ValueError("a load level needs at least one request")
    indices = list(prompt_indices) if prompt_indices is not None else [None] * len(specs)
    if len(indices) != len(specs):
        raise ValueError(f"{len(specs)} requests but {len(indices)} prompt indices")
    bound = level.concurrency if level.concurrency is not None else None
    gate = asyncio.Semaphore(bound) if bound is not None else None
    arrivals = (
        poisson_arrivals(len(specs), level.rate, level.seed) if level.rate is not None else None
    )
    lags: list[float] = []
    in_flight = peak = 0
    label = level.label

    async with make_client(bound, headers=headers, transport=transport) as client:

        async def one(i: int) -> RequestSample:
            nonlocal in_flight, peak
            if arrivals is not None:
                await asyncio.sleep(max(0.0, t0 + arrivals[i] - clock.now()))
            if gate is not None:
                await gate.acquire()
            try:
                if arrivals is not None:
                    lags.append(clock.now() - t0 - arrivals[i])
                in_flight += 1
                peak = max(peak, in_flight)
                sample = await timed_request(
                    client,
                    specs[i],
                    prompt_type=prompt_type,
                    phase=phase,
                    index=i,
                    warmup=warmup,
                    prompt_index=indices[i],
                    level=label,
                    clock=clock,
                )
            finally:
                in_flight -= 1
                if gate is not None:
                    gate.release()
            on_sample(sample)
            return sample

        cpu = _CpuWindows(cpu_window_s, clock)
        t0 = clock.now()
        cpu.start()
        tasks = [asyncio.ensure_future(one(i)) for i in range(len(specs))]
        try:
            samples = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cpu.stop()
            raise
        wall = clock.now() - t0
        cpu_s = await cpu.stop()
    slo = slo or SLO()
    stats = level_stats(
        samples,
        wall_s=wall,
        slo=slo,
        cpu_s=cpu_s,
        peak_cpu_share=cpu.peak,
        peak_in_flight=peak,
        send_lags_s=lags,
    )
    return LevelResult(level=level, samples=list(samples), stats=stats, slo=slo)


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Send times in seconds from the level's start: the first at 0, then exponential gaps."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out
