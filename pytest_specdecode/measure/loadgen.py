"""The load generator. Every request is timed here, in `timed_request`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from ..errors import RequestError

Endpoint = Literal["chat", "completions"]


@dataclass
class RequestSample:
    """One streamed request, timed on the client."""

    prompt_type: str
    phase: str
    index: int
    warmup: bool
    started_at: float  # unix time
    ttft_s: float  # to the first chunk carrying choices (as vLLM's benchmark client)
    e2e_s: float  # to the last chunk carrying choices
    output_tokens: int  # from usage: with speculation, one chunk may carry several tokens
    prompt_tokens: int
    chunks: int
    chunk_gaps_s: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] | None = None  # from continuous usage, when the server sends it
    text: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.e2e_s if self.e2e_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot_s"] = self.tpot_s
        data["tokens_per_s"] = self.tokens_per_s
        return data


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
        if self.endpoint == "chat":
            payload["messages"] = [{"role": "user", "content": self.prompt}]
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
) -> RequestSample:
    """Send one streaming request and time it. Raises RequestError on any protocol problem."""
    url, payload = spec.url_and_payload()
    try:
        async with asyncio.timeout(spec.timeout_s):
            return await _stream(client, url, payload, spec, prompt_type, phase, index, warmup)
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


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    spec: RequestSpec,
    prompt_type: str,
    phase: str,
    index: int,
    warmup: bool,
) -> RequestSample:
    timeout = httpx.Timeout(10.0, read=spec.read_timeout_s)
    started_at = time.time()
    t0 = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    per_chunk: list[int] | None = []
    seen_tokens = 0
    text: list[str] = []
    usage: Mapping[str, Any] | None = None
    chunks = 0
    done = False
    async with client.stream("POST", url, json=payload, timeout=timeout) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")[:300]
            raise RequestError(
                f"{url} answered HTTP {response.status_code} ({prompt_type}, {phase}): {body}"
            )
        async for line in response.aiter_lines():
            if not line or line.startswith(":"):
                continue
            if not line.startswith("data:"):
                raise RequestError(f"{url}: malformed SSE line {line[:120]!r}")
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise RequestError(f"{url}: malformed SSE data {data[:120]!r}") from None
            if not isinstance(event, dict):
                raise RequestError(f"{url}: SSE data is not a JSON object: {data[:120]!r}")
            if "error" in event:
                raise RequestError(
                    f"{url}: the server reported an error mid-stream: {str(event['error'])[:300]}"
                )
            now = time.perf_counter()
            if event.get("usage"):
                usage = event["usage"]
            if not event.get("choices"):
                continue
            chunks += 1
            if first is None:
                first = now
            else:
                gaps.append(now - last)  # type: ignore[operator]
            last = now
            text.append(_chunk_text(event["choices"][0]))
            if per_chunk is not None:
                cumulative = (event.get("usage") or {}).get("completion_tokens")
                if cumulative is None:
                    per_chunk = None
                else:
                    per_chunk.append(cumulative - seen_tokens)
                    seen_tokens = cumulative
    if not done:
        raise RequestError(f"{url}: the stream ended without [DONE] after {chunks} chunks")
    if first is None or last is None:
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
    )


def _chunk_text(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, Mapping):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


async def run_requests(
    spec: RequestSpec,
    *,
    prompt_type: str,
    phase: str,
    count: int,
    warmup: bool = False,
    concurrency: int = 1,
    headers: Mapping[str, str] | None = None,
    on_sample: Callable[[RequestSample], None] = lambda s: None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestSample], float]:
    """Send `count` requests, `concurrency` at a time; returns them and the wall time taken.

    `transport` is httpx's seam: fast tests pass an `httpx.MockTransport`.
    """
    limits = httpx.Limits(max_connections=max(concurrency, 1))
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        headers=dict(headers or {}), limits=limits, transport=transport
    ) as client:

        async def one(i: int) -> RequestSample:
            async with gate:
                sample = await timed_request(
                    client, spec, prompt_type=prompt_type, phase=phase, index=i, warmup=warmup
                )
            on_sample(sample)
            return sample

        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        try:
            samples = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return list(samples), time.perf_counter() - t0
