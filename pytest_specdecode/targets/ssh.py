"""A host reached over SSH with paramiko: verified host keys, bounded commands, one reconnect."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import paramiko

from ..errors import ConfigError, HostError
from .hosts import BaseHost, CommandResult

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$|^\[?[0-9A-Fa-f:.]+\]?$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class SSHSpec:
    user: str
    hostname: str
    port: int = 22
    identity_file: Path | None = None
    known_hosts: Path | None = None  # None: ~/.ssh/known_hosts
    accept_unknown_host_key: bool = False

    @property
    def name(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @classmethod
    def parse(cls, url: str, **kwargs: object) -> SSHSpec:
        """`ssh://user@host:port`, validated before anything connects."""
        parts = urlsplit(url)
        if parts.scheme != "ssh" or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"host {url!r}: expected ssh://user@host[:port]")
        try:
            port = parts.port or 22
        except ValueError:
            raise ConfigError(f"host {url!r}: the port is not a number from 1 to 65535") from None
        user = parts.username or "root"
        if not _USER.match(user):
            raise ConfigError(f"host {url!r}: {user!r} is not a valid user name")
        if not _HOSTNAME.match(parts.hostname):
            raise ConfigError(f"host {url!r}: {parts.hostname!r} is not a valid host name")
        return cls(user=user, hostname=parts.hostname, port=port, **kwargs)  # type: ignore[arg-type]


class SSHHost(BaseHost):
    """Runs argv lists on a remote host. Every argument is quoted here, with shlex."""

    def __init__(
        self, spec: SSHSpec, *, connect_timeout_s: float = 10.0, keepalive_s: int = 15
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._client: paramiko.SSHClient | None = None

    def connect(self) -> None:
        client = paramiko.SSHClient()
        known = self.spec.known_hosts or Path.home() / ".ssh" / "known_hosts"
        try:
            client.load_host_keys(str(known))
        except FileNotFoundError:
            if not self.spec.accept_unknown_host_key:
                raise ConfigError(
                    f"{self.name}: known_hosts file {known} does not exist, so the host key "
                    "cannot be verified; add the host's key there (ssh-keyscan, checked out of "
                    "band) or opt in with --spec-accept-unknown-host-key"
                ) from None
        pkey = None
        if self.spec.identity_file is not None:
            try:
                pkey = paramiko.PKey.from_path(str(self.spec.identity_file))
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise ConfigError(
                    f"{self.name}: cannot read the identity file {self.spec.identity_file}: "
                    f"{exc}. Nothing on the host was touched"
                ) from None
        policy = (
            paramiko.AutoAddPolicy()
            if self.spec.accept_unknown_host_key
            else paramiko.RejectPolicy()
        )
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(
                self.spec.hostname,
                port=self.spec.port,
                username=self.spec.user,
                pkey=pkey,
                timeout=self._connect_timeout_s,
                banner_timeout=self._connect_timeout_s,
                auth_timeout=self._connect_timeout_s,
                allow_agent=self.spec.identity_file is None,
                look_for_keys=self.spec.identity_file is None,
            )
        except paramiko.BadHostKeyException as exc:
            raise ConfigError(
                f"{self.name}: the host key CHANGED (got {exc.key.get_name()} "
                f"{exc.key.get_base64()[:24]}…, known_hosts has another). Refusing to connect: "
                "this is what a man-in-the-middle looks like. Nothing on the host was touched"
            ) from None
        except paramiko.AuthenticationException as exc:
            raise ConfigError(
                f"{self.name}: authentication refused ({exc}); check the user and the identity "
                f"file {self.spec.identity_file or '(ssh agent / default keys)'}. Nothing on the "
                "host was touched"
            ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise ConfigError(
                    f"{self.name}: unknown host key (not in {known}); refusing. Verify the key "
                    "and add it to known_hosts, or opt in with --spec-accept-unknown-host-key. "
                    "Nothing on the host was touched"
                ) from None
            raise HostError(f"{self.name}: SSH failed: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise HostError(
                f"{self.name}: cannot connect within {self._connect_timeout_s:g}s ({exc}); "
                "nothing on the host was touched"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(self._keepalive_s)
        self._client = client

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, stdin: str | None = None
    ) -> CommandResult:
        command = shlex.join(argv)
        channel = self._open_channel(command)
        try:
            return self._finish(channel, tuple(argv), command, timeout, stdin)
        finally:
            channel.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _open_channel(self, command: str) -> paramiko.Channel:
        """A session channel, reconnecting once if the connection has dropped."""
        for attempt in (1, 2):
            try:
                if self._client is None or not self._alive():
                    self.close()
                    self.connect()
                transport = self._client.get_transport()  # type: ignore[union-attr]
                assert transport is not None
                return transport.open_session(timeout=self._connect_timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self.close()
                if attempt == 2:
                    raise HostError(
                        f"{self.name}: the SSH connection dropped and one reconnect failed "
                        f"({exc}); `{command}` was not run"
                    ) from None
        raise AssertionError("unreachable")

    def _alive(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    def _finish(
        self,
        channel: paramiko.Channel,
        argv: tuple[str, ...],
        command: str,
        timeout: float,
        stdin: str | None,
    ) -> CommandResult:
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        channel.settimeout(1.0)
        channel.exec_command(command)
        if stdin is not None:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        while True:
            # Drain both streams as we go, so a chatty command can never block on a full pipe.
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if (
                channel.exit_status_ready()
                and not channel.recv_ready()
                and not (channel.recv_stderr_ready())
            ):
                break
            if channel.closed and not channel.exit_status_ready():
                raise HostError(
                    f"{self.name}: the connection dropped while running `{command}`; "
                    "its outcome is unknown"
                )
            if time.monotonic() > deadline:
                raise HostError(
                    f"{self.name}: `{command}` did not finish within {timeout:g}s; it was "
                    "abandoned (it may still be running on the host)"
                )
            time.sleep(0.02)
        status = channel.recv_exit_status()
        return CommandResult(
            self.name, argv, status, out.decode(errors="replace"), err.decode(errors="replace")
        )
