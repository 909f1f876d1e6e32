"""LeanSSETransport over real loopback sockets: framing, keep-alive and its errors.

A raw asyncio server (below) writes exact bytes in exact pieces, so that chunk-size lines,
payloads and their CRLFs can be split across TCP reads anywhere. The stand-in server's faults
(reset, close mid-body, silence) run on this transport in test_loadgen_edge_cases.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import httpx
import pytest

from pytest_specdecode.measure.requests.loadgen import RequestSpec, make_client, timed_request
from pytest_specdecode.measure.requests.sse_transport import LeanSSETransport

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


class RawServer:
    """Answers each request on a connection with the next response, written piece by piece."""

    def __init__(self, responses: Sequence[Sequence[bytes]], *, close_after: bool = False):
        self.responses = list(responses)
        self.close_after = close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()
        _, pending = await asyncio.wait(self.handlers, timeout=1) if self.handlers else ((), ())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        self.connections += 1
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length:
                    await reader.readexactly(length[0])
                for piece in self.responses.pop(0):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)
                if self.close_after:
                    break
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENTS = [b"data: one\n\n", b"data: two, a longer one\n\n", b"data: [DONE]\n\n"]
CHUNKED_BODY = (
    b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\nX-T: 1\r\n\r\n"
)


async def body_of(client: httpx.AsyncClient, url: str) -> AsyncIterator[bytes]:
    async with client.stream("POST", url, content=b'{"a": 1}') as response:
        assert response.status_code == 200
        async for raw in response.aiter_raw():
            yield raw


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [1, 2, 5, 11, 1000])
async def test_chunked_body_split_anywhere_arrives_whole(size):
    wire = CHUNKED_HEAD + CHUNKED_BODY
    pieces = [wire[i : i + size] for i in range(0, len(wire), size)]
    async with RawServer([pieces]) as base, httpx.AsyncClient(transport=LeanSSETransport()) as c:
        got = [raw async for raw in body_of(c, f"{base}/v1/x")]
    assert b"".join(got) == b"".join(EVENTS)


@pytest.mark.asyncio
async def test_request_head_and_body_on_the_wire():
    server = RawServer([[CHUNKED_HEAD + CHUNKED_BODY]])
    async with (
        server as base,
        httpx.AsyncClient(
            transport=LeanSSETransport(), headers={"Authorization": "Bearer k"}
        ) as client,
    ):
        [_ async for _ in body_of(client, f"{base}/v1/chat/completions?x=1")]
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    lower = head.lower()
    assert "\r\nhost: 127.0.0.1:" in lower
    assert "\r\ncontent-length: 8\r\n" in lower
    assert "\r\nauthorization: bearer k\r\n" in lower


@pytest.mark.asyncio
async def test_a_connection_read_to_its_end_is_reused():
    ok = b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nnope!"
    server = RawServer([[ok], [CHUNKED_HEAD, CHUNKED_BODY], [ok]])
    async with server as base, httpx.AsyncClient(transport=LeanSSETransport()) as client:
        first = await client.post(f"{base}/a")
        assert (first.status_code, first.text) == (404, "nope!")
        assert b"".join([r async for r in body_of(client, f"{base}/b")]) == b"".join(EVENTS)
        third = await client.post(f"{base}/c")
    assert third.status_code == 404
    assert server.connections == 1


@pytest.mark.asyncio
async def test_an_idle_connection_the_server_closed_is_replaced():
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    server = RawServer([[ok], [ok]], close_after=True)  # closes after each response
    async with server as base, httpx.AsyncClient(transport=LeanSSETransport()) as client:
        assert (await client.post(f"{base}/a")).text == "ok"
        await asyncio.sleep(0.05)
        assert (await client.post(f"{base}/b")).text == "ok"
    assert server.connections == 2


@pytest.mark.asyncio
async def test_connection_close_and_read_to_close_bodies():
    close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end"
    async with (
        RawServer([[close]], close_after=True) as base,
        httpx.AsyncClient(transport=LeanSSETransport()) as client,
    ):
        response = await client.post(f"{base}/a")
    assert response.text == "until the end"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("wire", "error", "message"),
    [
        (
            [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"],
            httpx.RemoteProtocolError,
            "5 bytes missing",
        ),
        ([CHUNKED_HEAD + b"zz\r\n"], httpx.RemoteProtocolError, "malformed chunk size line"),
        ([b"SMTP ready\r\n\r\n"], httpx.RemoteProtocolError, "malformed status line"),
        ([], httpx.RemoteProtocolError, "server disconnected without sending a response"),
    ],
)
async def test_framing_errors_are_httpx_errors(wire, error, message):
    async with (
        RawServer([wire], close_after=True) as base,
        httpx.AsyncClient(transport=LeanSSETransport()) as client,
    ):
        with pytest.raises(error, match=message):
            await client.post(f"{base}/a")


@pytest.mark.asyncio
async def test_nothing_listening_is_a_connect_error():
    async with RawServer([]) as base:
        pass  # closed again: the port is free now
    async with httpx.AsyncClient(transport=LeanSSETransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"{base}/a")


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", [LeanSSETransport, httpx.AsyncHTTPTransport])
async def test_the_load_generator_reuses_a_connection_after_done(transport):
    def stream(text: str) -> list[bytes]:
        role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        chunk = {
            "choices": [{"index": 0, "delta": {"content": text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        events = [f"data: {json.dumps(e)}\n\n".encode() for e in (role, chunk)] + [
            b"data: [DONE]\n\n"
        ]
        # [DONE] and the end of the body in separate writes, as a server may send them
        return [CHUNKED_HEAD, *(b"%x\r\n%s\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]

    server = RawServer([stream("a"), stream("b")])
    spec = RequestSpec(api_base="", model="m", prompt="p", max_tokens=4)
    async with server as base, make_client(1, transport=transport()) as client:
        spec = replace(spec, api_base=base)
        texts = [
            (
                await timed_request(client, spec, prompt_type="w", phase="p", index=i, warmup=False)
            ).text
            for i in range(2)
        ]
    assert texts == ["a", "b"]
    assert server.connections == 1
