"""The API through SSH: a local listener whose connections ride `direct-tcpip` channels.

`ApiTunnel(host, destination)` listens on 127.0.0.1:<ephemeral> here. Each connection made to
it is forwarded over the host's SSH connection to `destination` as the host sees it (for
example 127.0.0.1:8000, where the unit binds the API). The rest of the tool uses `tunnel.url`
like any API base. The SSH connection is opened at the first connection, and re-opened (the
SSHHost's one reconnect) by any later connection that finds it dropped; a connection that was
being forwarded when it dropped ends, as it would on a network failure.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable

import paramiko

from ...errors import ConfigError, HostError
from .ssh import SSHHost

Address = tuple[str, int]
_CONNECT_FAILED = 2  # SSH_OPEN_CONNECT_FAILED: nothing listens there


class ApiTunnel:
    """http://127.0.0.1:PORT here → the API's address on the SSH host."""

    def __init__(self, host: SSHHost, destination: Address | Callable[[], Address]) -> None:
        self.host = host
        self._destination = destination
        self._resolved: Address | None = None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(32)
        self._listener.settimeout(0.5)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.forwarded = 0  # connections carried to the host, for the record
        self.last_error: str | None = None
        self._closed = threading.Event()
        self._open: set[socket.socket | paramiko.Channel] = set()
        self._guard = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="api-tunnel")
        self._thread.start()

    @property
    def destination(self) -> Address:
        """Where the API answers on the host (resolved once, at first use)."""
        if self._resolved is None:
            dest = self._destination
            self._resolved = dest() if callable(dest) else dest
        return self._resolved

    def describe(self) -> str:
        host, port = self.destination
        return f"{self.url} here, forwarded over SSH to {host}:{port} on {self.host.name}"

    def remote_answers(self) -> bool:
        """Whether something accepts connections at the destination, on the host.

        (A TCP probe of `url` would always succeed: the local listener accepts.) Raises
        ConfigError when the host's sshd forbids forwarding, HostError when SSH is gone.
        """
        host, port = self.destination
        try:
            channel = self.host.open_forward(host, port)
        except paramiko.ChannelException as exc:
            if exc.code == _CONNECT_FAILED:
                return False
            raise ConfigError(
                f"{self.host.name}: sshd refuses to forward to {host}:{port} ({exc.text}); the "
                "API can only be reached through SSH if the host's sshd allows TCP forwarding "
                "(AllowTcpForwarding, PermitOpen) for this user. Nothing on the host was touched"
            ) from None
        channel.close()
        return True

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._guard:
            ends, self._open = list(self._open), set()
        for end in ends:
            with contextlib.suppress(Exception):
                end.close()
        self._thread.join(timeout=5)
        self.host.close()

    # -- forwarding -----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn,), daemon=True, name="api-tunnel-conn"
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            host, port = self.destination
            channel = self.host.open_forward(host, port)
        except (paramiko.ChannelException, HostError, ConfigError, OSError) as exc:
            self.last_error = str(exc)
            conn.close()  # the client sees a dropped connection, as with a down server
            return
        except Exception as exc:  # never let a thread die silently with the socket open
            self.last_error = f"{type(exc).__name__}: {exc}"
            conn.close()
            return
        with self._guard:
            if self._closed.is_set():
                conn.close()
                channel.close()
                return
            self._open |= {conn, channel}
            self.forwarded += 1
        try:
            _pump(conn, channel, self._closed)
        finally:
            with self._guard:
                self._open -= {conn, channel}
            channel.close()
            conn.close()


def _pump(conn: socket.socket, channel: paramiko.Channel, closed: threading.Event) -> None:
    """Copy bytes both ways until either side closes."""
    while not closed.is_set():
        try:
            ready, _, _ = select.select([conn, channel], [], [], 1.0)
            if conn in ready:
                data = conn.recv(65536)
                if not data:
                    return
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(65536)
                if not data:
                    return
                conn.sendall(data)
        except (OSError, EOFError, paramiko.SSHException, ValueError):
            return
        if channel.closed or (channel.eof_received and not channel.recv_ready()):
            return
