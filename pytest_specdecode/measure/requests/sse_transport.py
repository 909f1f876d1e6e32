"""A lean HTTP/1.1 transport for httpx, made for long SSE streams: the load generator's default.

httpx's own transport (httpcore over h11) handles every HTTP chunk of a response as an event of
its own, through several layers. With one SSE event per chunk, that costs the client more than
the stream itself at a few hundred streams (benchmarks/client_capacity.py). This transport
reads the socket, undoes the chunked encoding of each read at once, and hands httpx the bytes.

It does what the load generator needs and no more: HTTP/1.1 over TCP or TLS, a request body
sent whole, `Content-Length`, chunked or read-to-close bodies, and keep-alive connections
reused per host. No proxies, no HTTP/2, no `Expect: 100-continue`. Its failures are httpx's own
exceptions (ConnectError, ConnectTimeout, ReadTimeout, ReadError, RemoteProtocolError), so
callers cannot tell the two transports apart except by speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import httpx

_MAX_BUFFER = 1 << 20  # stop reading the socket while this much is unread


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection, reusable when a response was read to its end.

    A protocol rather than asyncio streams, to keep a read cheap when every read carries one SSE
    event: a read that finds data buffered returns it at once, and one that must wait only moves
    the connection's deadline, which one timer checks (see `_check_deadline`).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._data: list[bytes] = []
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._data.append(data)
        self._size += len(data)
        if self._size > _MAX_BUFFER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._stop_timer()
        if exc is not None:
            self._error = exc
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_deadline(self) -> None:
        """The read timer: expire the waiting read if its deadline passed, else re-arm for it.

        One timer serves many reads: a read that waits only moves the deadline, so a stream
        that delivers steadily costs a timer per timeout period, not one per read.
        """
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # not waiting: the next wait arms a timer again
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(self._deadline, self._check_deadline)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- for the transport

    @property
    def usable(self) -> bool:
        """Still open, and the server has not closed its side while the connection was idle."""
        return self.transport is not None and not self.transport.is_closing() and not self._eof

    async def read(self, timeout: float | None) -> bytes:
        """What has arrived, waiting up to `timeout` for it; b"" at the end of the stream."""
        if not self._data:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            if timeout is not None:
                self._deadline = loop.time() + timeout
                if self._timer is not None and self._timer.when() > self._deadline:
                    self._stop_timer()  # a shorter timeout than the armed one's
                if self._timer is None:
                    self._timer = loop.call_at(self._deadline, self._check_deadline)
            try:
                await waiter
            finally:
                self._waiter = None
            if not self._data:
                if self._error is not None:
                    raise self._error
                return b""
        data = self._data[0] if len(self._data) == 1 else b"".join(self._data)
        self._data.clear()
        self._size = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self.transport.write(data)

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    async def aclose(self) -> None:
        self.close()
        if self.transport is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._closed)


class _Body(httpx.AsyncByteStream):
    """The response body; chunked encoding undone one socket read at a time."""

    def __init__(
        self,
        transport: LeanSSETransport,
        key: tuple[str, str, int],
        conn: _Connection,
        *,
        chunked: bool,
        length: int | None,
        buffered: bytes,
        read_timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self.transport, self.key, self.conn = transport, key, conn
        self.chunked, self.length, self.buffered = chunked, length, buffered
        self.read_timeout, self.request = read_timeout, request
        self.keep_alive = True  # False when the server said "Connection: close"
        self.closed = False

    async def _read(self) -> bytes:
        try:
            return await self.conn.read(self.read_timeout)
        except TimeoutError:
            raise httpx.ReadTimeout(
                "no data within the read timeout", request=self.request
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=self.request) from None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self.chunked:
            return self._chunked()  # not wrapped: one generator less on every read
        return self._sized() if self.length is not None else self._to_close()

    async def _sized(self) -> AsyncIterator[bytes]:
        left = self.length or 0
        data = self.buffered[:left]
        while True:
            if data:
                left -= len(data)
                yield data
            if left <= 0:
                break
            data = await self._read()
            if not data:
                raise httpx.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: "
                    f"{left} bytes missing",
                    request=self.request,
                )
        self.conn.reusable = True

    async def _to_close(self) -> AsyncIterator[bytes]:
        data = self.buffered
        while True:
            if data:
                yield data
            data = await self._read()
            if not data:
                break

    async def _chunked(self) -> AsyncIterator[bytes]:
        """De-chunk: each read yields the payload of every complete (or partial) chunk in it."""
        buf = self.buffered
        left = 0  # bytes of the current chunk's payload still to come
        crlf = 0  # bytes of the CRLF after a payload still to skip
        trailer = False  # inside the trailer, after the last (empty) chunk
        read, timeout = self.conn.read, self.read_timeout
        while True:
            out = []
            pos, end = 0, len(buf)
            while pos < end:
                if left:
                    take = min(left, end - pos)
                    out.append(buf[pos : pos + take])
                    pos += take
                    left -= take
                    if left:
                        break
                    crlf = 2
                if crlf:
                    take = min(crlf, end - pos)
                    pos += take
                    crlf -= take
                    continue
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if trailer:
                    if not line:  # the end of the message
                        if out:
                            yield b"".join(out)
                        self.conn.reusable = pos == end
                        return
                    continue
                try:
                    size = int(line.split(b";", 1)[0] if b";" in line else line, 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(
                        f"malformed chunk size line {line[:40]!r}", request=self.request
                    ) from None
                if size == 0:
                    trailer = True
                elif pos + size + 2 <= end:  # the usual case: the chunk and its CRLF are here
                    out.append(buf[pos : pos + size])
                    pos += size + 2
                else:
                    left = size
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            rest = buf[pos:]
            try:
                data = await read(timeout)
            except TimeoutError:
                raise httpx.ReadTimeout(
                    "no data within the read timeout", request=self.request
                ) from None
            except (OSError, ssl.SSLError) as exc:
                raise httpx.ReadError(
                    str(exc) or type(exc).__name__, request=self.request
                ) from None
            if not data:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body: "
                    "incomplete chunked read",
                    request=self.request,
                )
            buf = rest + data if rest else data

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.conn.reusable and self.keep_alive:
            self.transport._release(self.key, self.conn)
        else:
            await self.conn.aclose()


class LeanSSETransport(httpx.AsyncBaseTransport):
    """httpx transport: plain HTTP/1.1 with keep-alive, for streaming requests. See module doc."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True) -> None:
        if isinstance(verify, ssl.SSLContext):
            self._ssl: ssl.SSLContext = verify
        else:
            self._ssl = ssl.create_default_context()
            if not verify:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}", request=request)
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.scheme, url.host, port)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = self._head(request, body)
        conn = await self._idle_connection(key)
        if conn is not None:
            try:
                return await self._exchange(request, key, conn, head + body, timeouts)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if not getattr(exc, "before_response", False):
                    raise
                # The server closed the idle connection as we reused it: once more, afresh.
        conn = await self._connect(request, key, timeouts.get("connect"))
        return await self._exchange(request, key, conn, head + body, timeouts)

    async def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            await conn.aclose()
        return None

    async def _exchange(
        self,
        request: httpx.Request,
        key: tuple[str, str, int],
        conn: _Connection,
        data: bytes,
        timeouts: dict[str, float | None],
    ) -> httpx.Response:
        try:
            conn.write(data)
        except OSError as exc:
            await conn.aclose()
            error = httpx.WriteError(str(exc) or type(exc).__name__, request=request)
            error.before_response = True  # type: ignore[attr-defined]
            raise error from None
        try:
            return await self._response(request, key, conn, timeouts.get("read"))
        except BaseException:
            await conn.aclose()
            raise

    @staticmethod
    def _head(request: httpx.Request, body: bytes) -> bytes:
        lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
        names = set()
        for name, value in request.headers.raw:
            names.add(name.lower())
            lines.append(name + b": " + value)
        if b"host" not in names:
            lines.insert(1, b"Host: " + request.url.netloc)
        if body and b"content-length" not in names and b"transfer-encoding" not in names:
            lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _connect(
        self, request: httpx.Request, key: tuple[str, str, int], timeout: float | None
    ) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    ssl=self._ssl if scheme == "https" else None,
                    server_hostname=host if scheme == "https" else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port}", request=request) from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return conn

    async def _response(
        self,
        request: httpx.Request,
        key: tuple[str, str, int],
        conn: _Connection,
        read_timeout: float | None,
    ) -> httpx.Response:
        buf = b""
        try:
            while (end := buf.find(b"\r\n\r\n")) < 0:
                data = await conn.read(read_timeout)
                if not data:
                    error = httpx.RemoteProtocolError(
                        "server disconnected without sending a response", request=request
                    )
                    error.before_response = not buf  # type: ignore[attr-defined]
                    raise error
                buf += data
                if len(buf) > 1 << 20:
                    raise httpx.RemoteProtocolError("response head too long", request=request)
        except TimeoutError:
            raise httpx.ReadTimeout("no response within the read timeout", request=request) from (
                None
            )
        except (OSError, ssl.SSLError) as exc:
            error = httpx.ReadError(str(exc) or type(exc).__name__, request=request)
            error.before_response = not buf  # type: ignore[attr-defined]
            raise error from None
        status_line, *header_lines = buf[:end].split(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(
                f"malformed status line {status_line[:60]!r}", request=request
            )
        headers = []
        for line in header_lines:
            name, sep, value = line.partition(b":")
            if not sep:
                raise httpx.RemoteProtocolError(
                    f"malformed header line {line[:60]!r}", request=request
                )
            headers.append((name.strip(), value.strip()))
        lower = {n.lower(): v for n, v in headers}
        chunked = b"chunked" in lower.get(b"transfer-encoding", b"").lower()
        length = None if chunked else lower.get(b"content-length")
        status = int(parts[1])
        no_body = request.method == "HEAD" or status in (204, 304) or 100 <= status < 200
        stream = _Body(
            self,
            key,
            conn,
            chunked=chunked,
            length=0 if no_body else (int(length) if length is not None else None),
            buffered=buf[end + 4 :],
            read_timeout=read_timeout,
            request=request,
        )
        stream.keep_alive = lower.get(b"connection", b"").lower() != b"close"
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": parts[2] if len(parts) > 2 else b"",
            },
        )

    def _release(self, key: tuple[str, str, int], conn: _Connection) -> None:
        conn.reusable = False
        self._idle.setdefault(key, []).append(conn)

    async def aclose(self) -> None:
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        for conn in idle:
            await conn.aclose()
