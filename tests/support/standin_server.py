"""A stand-in for vLLM's OpenAI-compatible streaming API, for fault injection in tests only.

The real vLLM server covers normal behaviour elsewhere in the suite. `StandInSSEServer` stands
in for it only for what needs a real socket and that a real server will not produce on demand:
connection resets and closes in the middle of a body, streams that go silent or trickle pings
forever, and an HTTP 500 among valid streams. Parsing faults (malformed SSE, missing usage,
errors mid-stream) are played back without a socket, by httpx.MockTransport
(tests/test_loadgen.py). It is not a model of vLLM and must not be used to measure anything.

It is a real HTTP/1.1 server on 127.0.0.1 (a free port chosen by the OS), run by an asyncio
loop in a background thread, written on raw streams so that every byte on the wire, and the
way each connection ends, is under the test's control. Only the standard library is used.

A request picks its scenario by its URL path (`/scenario/<name>/v1/...`, so an `api_base` of
`server.api_base_for(name)`) or else by the `model` field of its JSON body. The model
`QUEUED` takes the next name from `server.enqueue(...)`, to give concurrent requests
different scenarios. Each request is recorded (`server.requests`) with its path, headers and
JSON body, so tests can assert what the client sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

QUEUED = "queued"  # the model name that takes its scenario from StandInSSEServer.enqueue

CHUNK_DELAY_S = 0.02  # between streamed chunks, so that timings are measurable
PING_INTERVAL_S = 0.2  # between the SSE comment lines of the `slow_trickle` scenario

PROMPT_TOKENS = 7

# (text, cumulative completion tokens) per chunk after the role chunk: tokens per chunk are
# [0 (role chunk), 1, 3, 1, 4, 2], 11 in all, as speculative decoding would deliver them.
MULTI_TOKEN_PIECES: list[tuple[str, int]] = [
    ("Hello", 1),
    (" there, my", 4),
    (" dear", 5),
    (" old friend of", 9),
    (" mine.", 11),
]
MULTI_TOKEN_TEXT = "".join(text for text, _ in MULTI_TOKEN_PIECES)
MULTI_TOKEN_PER_CHUNK = [0, 1, 3, 1, 4, 2]
MULTI_TOKEN_TOTAL = 11

# One token per chunk, for the streams that fail part way and for `no_usage`.
SIMPLE_PIECES = ["One", " two", " three", " four"]

HTTP_ERRORS: dict[str, tuple[int, str, str, str]] = {
    # scenario: (status, reason, content type, body)
    "http_500": (500, "Internal Server Error", "text/plain", "Internal Server Error"),
}


@dataclass
class RecordedRequest:
    """One request as the stand-in received it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON body, or None if there was none
    scenario: str
    received_at: float = field(default_factory=time.perf_counter)


class _Response:
    """The response side of one request: raw HTTP/1.1 writes with chunked SSE bodies."""

    def __init__(self, writer: asyncio.StreamWriter, on_finish: Callable[[], None]) -> None:
        self.writer = writer
        self._on_finish: Callable[[], None] | None = on_finish

    def finished(self) -> None:
        """The stream is over, or about to be (counted once: see `StandInSSEServer.in_flight`)."""
        if self._on_finish is not None:
            self._on_finish()
            self._on_finish = None

    async def status(self, code: int, reason: str, content_type: str, body: str) -> None:
        data = body.encode()
        head = (
            f"HTTP/1.1 {code} {reason}\r\n"
            f"content-type: {content_type}\r\n"
            f"content-length: {len(data)}\r\n"
            "\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()

    async def start_stream(self) -> None:
        self.writer.write(
            b"HTTP/1.1 200 OK\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n"
            b"\r\n"
        )
        await self.writer.drain()

    async def raw(self, text: str) -> None:
        """One HTTP chunk carrying `text` exactly."""
        data = text.encode()
        self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await self.writer.drain()

    async def event(self, payload: dict[str, Any] | str, *, delay: float = CHUNK_DELAY_S) -> None:
        """A `data:` event (a dict is sent as JSON), after `delay` seconds."""
        if delay:
            await asyncio.sleep(delay)
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await self.raw(f"data: {data}\n\n")

    async def done(self) -> None:
        """`data: [DONE]` and the end of the body: a complete, valid stream."""
        self.finished()  # before [DONE], so the client cannot send its next request first
        await self.event("[DONE]", delay=0)
        await self.end_body()

    async def end_body(self) -> None:
        """The chunked body's terminator: the HTTP response is complete."""
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0, then close)."""
        await self.writer.drain()
        await asyncio.sleep(0.05)  # let the client read what was sent before the reset
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


def _chat_chunk(
    content: str | None,
    *,
    role: bool = False,
    finish_reason: str | None = None,
    completion_tokens: int | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": content}
    chunk: dict[str, Any] = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "stand-in",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if completion_tokens is not None:
        chunk["usage"] = _usage(completion_tokens)
    return chunk


def _usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _usage_only_chunk(completion_tokens: int, obj: str = "chat.completion.chunk") -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": obj,
        "created": 1700000000,
        "model": "stand-in",
        "choices": [],
        "usage": _usage(completion_tokens),
    }


async def _few_chunks(resp: _Response, n: int = 3) -> None:
    """The role chunk and `n - 1` one-token chunks, with continuous usage."""
    await resp.start_stream()
    await resp.event(_chat_chunk(None, role=True, completion_tokens=0), delay=0)
    for i, text in enumerate(SIMPLE_PIECES[: n - 1], start=1):
        await resp.event(_chat_chunk(text, completion_tokens=i))


class StandInSSEServer:
    """A stand-in for vLLM's streaming API that misbehaves on request. Tests only.

    Use as a context manager, or call `start()` and `close()`.
    """

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0  # SSE streams being sent now
        self.peak_in_flight = 0
        self.open_connections = 0
        self._queue: deque[str] = deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._scenarios: dict[str, Callable[[_Response], Awaitable[bool]]] = {
            "multi_token_chunks": self._multi_token_chunks,
            "reset_mid_stream": self._reset_mid_stream,
            "truncated_body": self._truncated_body,
            "never_ends": self._never_ends,
            "slow_trickle": self._slow_trickle,
        }

    # ------------------------------------------------------------------ public

    @property
    def scenarios(self) -> tuple[str, ...]:
        return (*HTTP_ERRORS, *self._scenarios)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def api_base_for(self, scenario: str) -> str:
        """An `api_base` whose requests all get `scenario`, whatever their model."""
        return f"{self.base_url}/scenario/{scenario}"

    def enqueue(self, *scenarios: str) -> None:
        """Scenarios for the next requests whose model is `QUEUED`, in arrival order."""
        with self._lock:
            self._queue.extend(scenarios)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> StandInSSEServer:
        self._thread = threading.Thread(target=self._run, name="StandInSSEServer", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._startup_error is not None:
            raise RuntimeError("the stand-in server did not start") from self._startup_error
        if not self._started.is_set():
            raise RuntimeError("the stand-in server did not start within 10 s")
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, end every open connection (silent ones included), join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already stopped
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
                loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the stand-in server's thread did not stop within {timeout} s")

    def __enter__(self) -> StandInSSEServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:
            self._startup_error = exc
            loop.close()
            self._started.set()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.open_connections += 1
        try:
            keep_alive = True
            while keep_alive:
                keep_alive = await self._one_request(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except asyncio.CancelledError:
            # close() ends silent streams and idle connections by cancelling their handlers.
            # The task must not end cancelled: Python 3.11's start_server callback would log
            # the CancelledError from task.exception() as an unhandled exception.
            pass
        finally:
            self.open_connections -= 1
            self._handlers.discard(task)
            if not writer.transport.is_closing():
                writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """Serve one request; returns whether the connection may carry another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return False  # a clean close between requests
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        raw_body = await reader.readexactly(length) if length else b""
        try:
            body = json.loads(raw_body) if raw_body else None
        except json.JSONDecodeError:
            body = None
        scenario = self._scenario_for(path, body)
        self.requests.append(RecordedRequest(method, path, headers, body, scenario))
        resp = _Response(writer, self._stream_finished)

        if scenario in HTTP_ERRORS:
            await resp.status(*HTTP_ERRORS[scenario])
            return True
        handler = self._scenarios.get(scenario)
        if handler is None:
            error = {"object": "error", "message": f"stand-in: no scenario {scenario!r}"}
            await resp.status(404, "Not Found", "application/json", json.dumps(error))
            return True
        wanted = "/v1/chat/completions"
        if method != "POST" or not path.endswith(wanted):
            error = {"object": "error", "message": f"stand-in: {scenario} wants POST {wanted}"}
            await resp.status(404, "Not Found", "application/json", json.dumps(error))
            return True
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await handler(resp)
        finally:
            resp.finished()

    def _stream_finished(self) -> None:
        self.in_flight -= 1

    def _scenario_for(self, path: str, body: Any) -> str:
        if path.startswith("/scenario/"):
            return path.split("/")[2]
        model = body.get("model") if isinstance(body, dict) else None
        if model == QUEUED:
            with self._lock:
                return self._queue.popleft() if self._queue else "<queue empty>"
        return str(model)

    # ------------------------------------------------------------------ scenarios
    # Each returns whether the connection may be reused for another request.

    async def _multi_token_chunks(self, resp: _Response) -> bool:
        await resp.start_stream()
        await resp.event(_chat_chunk(None, role=True, completion_tokens=0))
        for n, (text, cumulative) in enumerate(MULTI_TOKEN_PIECES, start=1):
            last = n == len(MULTI_TOKEN_PIECES)
            await resp.event(
                _chat_chunk(
                    text, finish_reason="length" if last else None, completion_tokens=cumulative
                )
            )
        await resp.event(_usage_only_chunk(MULTI_TOKEN_TOTAL), delay=0)
        await resp.done()
        return True

    async def _reset_mid_stream(self, resp: _Response) -> bool:
        await _few_chunks(resp)
        await resp.reset()
        return False

    async def _truncated_body(self, resp: _Response) -> bool:
        """A clean close (FIN) in the middle of the chunked body: no terminating chunk."""
        await _few_chunks(resp)
        resp.writer.close()
        return False

    async def _never_ends(self, resp: _Response) -> bool:
        await _few_chunks(resp)
        await asyncio.Event().wait()  # silent until cancelled by close()
        return False

    async def _slow_trickle(self, resp: _Response) -> bool:
        await _few_chunks(resp)
        while True:  # until the client goes away or close() cancels it
            await asyncio.sleep(PING_INTERVAL_S)
            await resp.raw(": ping\n\n")
