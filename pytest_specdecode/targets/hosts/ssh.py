"""A host reached over SSH with paramiko: verified host keys on every hop, bounded commands,
one reconnect, and privilege escalation with `sudo -n` for a non-root user.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import paramiko
from paramiko.auth_strategy import AuthStrategy, InMemoryPrivateKey

from ...config.ssh_config import Destination, SSHSpec
from ...errors import ConfigError, HostError
from .base import BaseHost, CommandResult

SUDO = ("sudo", "-n", "--")


class SSHHost(BaseHost):
    """Runs argv lists on a remote host. Every argument is quoted here, with shlex.

    With `spec.uses_sudo`, every argv runs as `sudo -n -- argv…`: the callers never ask whether
    they are root. A sudo that would ask for a password fails at once (`-n`), never hangs.
    """

    def __init__(
        self, spec: SSHSpec, *, connect_timeout_s: float = 10.0, keepalive_s: int = 15
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.sudo = spec.uses_sudo
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._clients: list[paramiko.SSHClient] = []
        self._lock = threading.RLock()

    # -- connection -----------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect hop by hop; each hop's host key is verified before the next is reached."""
        hops = [*self.spec.jumps, self.spec.destination]
        clients: list[paramiko.SSHClient] = []
        try:
            sock: paramiko.Channel | None = None
            for i, hop in enumerate(hops):
                role = self.name if i == len(hops) - 1 else f"jump host {hop.name}"
                if i and sock is None:
                    raise AssertionError("no channel to the next hop")
                clients.append(self._connect_hop(hop, sock, role))
                if i + 1 < len(hops):
                    sock = self._channel_to(clients[-1], hops[i + 1], role)
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        for client in clients:
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(self._keepalive_s)
        self._clients = clients

    @property
    def _client(self) -> paramiko.SSHClient | None:
        return self._clients[-1] if self._clients else None

    def _connect_hop(
        self, hop: Destination, sock: paramiko.Channel | None, role: str
    ) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        known = self.spec.known_hosts or hop.known_hosts or Path.home() / ".ssh" / "known_hosts"
        untouched = "Nothing on the host was touched"
        try:
            client.load_host_keys(str(known))
        except FileNotFoundError:
            if not self.spec.accept_unknown_host_key:
                raise ConfigError(
                    f"{role}: known_hosts file {known} does not exist, so the host key "
                    "cannot be verified; add the host's key there (ssh-keyscan, checked out of "
                    "band) or opt in with --spec-accept-unknown-host-key"
                ) from None
        keys = self._identities(hop, role)
        policy = (
            paramiko.AutoAddPolicy()
            if self.spec.accept_unknown_host_key
            else paramiko.RejectPolicy()
        )
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(
                hop.hostname,
                port=hop.port,
                username=hop.user,
                auth_strategy=_Keys(hop.user, [key for _, key in keys]) if keys else None,
                timeout=self._connect_timeout_s,
                banner_timeout=self._connect_timeout_s,
                auth_timeout=self._connect_timeout_s,
                channel_timeout=self._connect_timeout_s,
                allow_agent=not keys,
                look_for_keys=not keys,
                sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            raise ConfigError(
                f"{role}: the host key CHANGED (got {exc.key.get_name()} "
                f"{exc.key.get_base64()[:24]}…, {known} has another). Refusing to connect: "
                f"this is what a man-in-the-middle looks like. {untouched}"
            ) from None
        except paramiko.AuthenticationException as exc:
            shown = ", ".join(str(path) for path, _ in keys) or "(ssh agent / default keys)"
            why = "no key was accepted" if keys else str(exc)
            raise ConfigError(
                f"{role}: authentication refused for {hop.user} ({why}); check the user and the "
                f"identity file {shown}. {untouched}"
            ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise ConfigError(
                    f"{role}: unknown host key (not in {known}); refusing. Verify the key "
                    "and add it to known_hosts, or opt in with --spec-accept-unknown-host-key. "
                    f"{untouched}"
                ) from None
            raise HostError(f"{role}: SSH failed: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise HostError(
                f"{role}: cannot connect within {self._connect_timeout_s:g}s ({exc}); "
                "nothing on the host was touched"
            ) from None
        return client

    def _identities(self, hop: Destination, role: str) -> list[tuple[Path, paramiko.PKey]]:
        """The explicit identity, then the hop's ssh_config IdentityFiles that exist, loaded."""
        explicit = [self.spec.identity_file] if self.spec.identity_file else []
        found = [p for p in hop.identity_files if p.is_file()]
        keys = []
        for path in dict.fromkeys([*explicit, *found]):
            try:
                keys.append((path, paramiko.PKey.from_path(str(path))))
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise ConfigError(
                    f"{role}: cannot read the identity file {path}: {exc}. Nothing on the host "
                    "was touched"
                ) from None
        return keys

    def _channel_to(
        self, client: paramiko.SSHClient, hop: Destination, role: str
    ) -> paramiko.Channel:
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip",
                (hop.hostname, hop.port),
                ("127.0.0.1", 0),
                timeout=self._connect_timeout_s,
            )
        except (paramiko.ChannelException, paramiko.SSHException, EOFError, OSError) as exc:
            raise HostError(
                f"{role} cannot reach the next hop {hop.name} ({exc}); nothing on the host was "
                "touched"
            ) from None

    def close(self) -> None:
        with self._lock:
            for client in reversed(self._clients):
                client.close()
            self._clients = []

    def _alive(self) -> bool:
        for client in self._clients:
            transport = client.get_transport()
            if not (transport and transport.is_active()):
                return False
        return bool(self._clients)

    def transport(self, purpose: str) -> paramiko.Transport:
        """The live connection's transport, reconnecting once if it has dropped."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if not self._alive():
                        self.close()
                        self.connect()
                    transport = self._clients[-1].get_transport()
                    if transport is None or not transport.is_active():
                        raise paramiko.SSHException("the transport is not active")
                    return transport
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    self.close()
                    if attempt == 2:
                        raise HostError(
                            f"{self.name}: the SSH connection dropped and one reconnect failed "
                            f"({exc}); {purpose}"
                        ) from None
        raise AssertionError("unreachable")

    # -- commands -------------------------------------------------------------------------------
    def wrap(self, argv: Sequence[str], *, privileged: bool = True) -> tuple[str, ...]:
        """The argv as it runs on the host: under `sudo -n --` for a non-root user, unless it
        only reads what the user may read itself."""
        return (*SUDO, *argv) if self.sudo and privileged else tuple(argv)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        full = self.wrap(argv, privileged=privileged)
        command = shlex.join(full)
        channel = self._open_session(command)
        try:
            return self._finish(channel, full, command, timeout, stdin)
        finally:
            channel.close()

    def open_forward(self, host: str, port: int) -> paramiko.Channel:
        """A `direct-tcpip` channel to host:port as the remote host sees it.

        Raises paramiko.ChannelException when the host refuses to open it (nothing listens
        there, or its sshd forbids forwarding), HostError when the connection is gone.
        """
        for attempt in (1, 2):
            transport = self.transport(f"no channel to {host}:{port} was opened")
            try:
                return transport.open_channel(
                    "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=self._connect_timeout_s
                )
            except paramiko.ChannelException:
                raise
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if attempt == 2:
                    raise HostError(
                        f"{self.name}: cannot open a channel to {host}:{port} ({exc})"
                    ) from None
                self.close()
        raise AssertionError("unreachable")

    def _open_session(self, command: str) -> paramiko.Channel:
        for attempt in (1, 2):
            transport = self.transport(f"`{command}` was not run")
            try:
                return transport.open_session(timeout=self._connect_timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if attempt == 2:
                    raise HostError(
                        f"{self.name}: the SSH connection dropped and one reconnect failed "
                        f"({exc}); `{command}` was not run"
                    ) from None
                self.close()
        raise AssertionError("unreachable")

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
            # A command that exits before reading its input (not executable for this user, say)
            # closes the channel under us: its exit status and stderr below say what happened.
            with contextlib.suppress(OSError):
                channel.sendall(stdin.encode())
        with contextlib.suppress(OSError):
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


class _Keys(AuthStrategy):
    """Each identity in turn, as ssh tries its IdentityFile lines (no agent, no default keys)."""

    def __init__(self, username: str, keys: list[paramiko.PKey]) -> None:
        super().__init__(ssh_config=None)
        self._username = username
        self._keys = keys

    def get_sources(self):  # type: ignore[no-untyped-def]
        for key in self._keys:
            yield InMemoryPrivateKey(self._username, key)
