"""Where the systemd host is reached: `--spec-host ssh://user@host:port` or an ssh_config alias,
checked and resolved (as OpenSSH would) before anything connects, into an `SSHSpec`.

Read with paramiko's `SSHConfig`: HostName, User, Port, IdentityFile, UserKnownHostsFile and
ProxyJump (one or more hops; the first hop's own ProxyJump is followed, as `ssh -J` does).
ProxyCommand is refused: it would run a local command the tool cannot check.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paramiko

from ..errors import ConfigError

HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$|^\[?[0-9A-Fa-f:.]+\]?$")
USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ALIAS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
MAX_HOPS = 8


@dataclass(frozen=True)
class Destination:
    """One SSH endpoint: the target or a jump host, fully resolved."""

    user: str
    hostname: str
    port: int = 22
    identity_files: tuple[Path, ...] = ()  # from ssh_config, in order
    known_hosts: Path | None = None  # ssh_config's UserKnownHostsFile, if any
    alias: str | None = None

    @property
    def name(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def default_config_path() -> Path | None:
    path = Path.home() / ".ssh" / "config"
    return path if path.is_file() else None


def check_user(user: str, where: str) -> str:
    if not USER.match(user):
        raise ConfigError(f"{where}: {user!r} is not a valid user name")
    return user


def check_hostname(hostname: str, where: str) -> str:
    if not HOSTNAME.match(hostname):
        raise ConfigError(f"{where}: {hostname!r} is not a valid host name")
    return hostname


def check_port(port: Any, where: str) -> int:
    try:
        value = int(port)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= 65535:
        raise ConfigError(f"{where}: the port {port!r} is not a number from 1 to 65535")
    return value


def resolve(target: str, config_path: Path | None) -> tuple[Destination, tuple[Destination, ...]]:
    """`[user@]alias` → the target and its jump hosts, first hop first. Raises ConfigError."""
    where = f"host {target!r}"
    user, sep, alias = target.rpartition("@")
    if not ALIAS.match(alias) or (sep and not user):
        raise ConfigError(
            f"{where}: expected ssh://user@host[:port] or an ssh_config alias ([user@]alias)"
        )
    if sep:
        check_user(user, where)
    config = _load(config_path)
    source = f"ssh_config {config_path}" if config_path else "no ssh_config"
    return _resolve_chain(alias, user or None, None, config, source, depth=0)


def _load(path: Path | None) -> paramiko.SSHConfig | None:
    if path is None:
        return None
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except FileNotFoundError:
        raise ConfigError(f"ssh_config {path} does not exist") from None
    except Exception as exc:  # parse errors, a Match exec without invoke, unreadable files
        raise ConfigError(f"ssh_config {path} cannot be read: {exc}") from None


def _resolve_chain(
    alias: str,
    user: str | None,
    port: int | None,
    config: paramiko.SSHConfig | None,
    source: str,
    *,
    depth: int,
    follow_jumps: bool = True,
) -> tuple[Destination, tuple[Destination, ...]]:
    if depth > MAX_HOPS:
        raise ConfigError(
            f"{source}: the ProxyJump chain for {alias!r} is longer than {MAX_HOPS} hops or loops"
        )
    options = dict(config.lookup(alias)) if config is not None else {"hostname": alias}
    where = f"{source}, Host {alias}"
    if options.get("proxycommand"):
        raise ConfigError(
            f"{where}: ProxyCommand is not supported (it would run a local command this tool "
            "cannot check); use ProxyJump instead"
        )
    dest = Destination(
        user=check_user(user or options.get("user") or getpass.getuser(), where),
        hostname=check_hostname(str(options.get("hostname") or alias), where),
        port=port or check_port(options.get("port", 22), where),
        identity_files=tuple(Path(p) for p in options.get("identityfile", [])),
        known_hosts=_first_path(options.get("userknownhostsfile")),
        alias=alias,
    )
    jumps_text = str(options.get("proxyjump") or "none")
    if not follow_jumps or jumps_text.lower() == "none":
        return dest, ()
    hops = [_split_hop(h.strip(), where) for h in jumps_text.split(",")]
    first, first_jumps = _resolve_chain(*hops[0], config, source, depth=depth + 1)
    rest = [
        _resolve_chain(*hop, config, source, depth=depth + 1, follow_jumps=False)[0]
        for hop in hops[1:]
    ]
    chain = (*first_jumps, first, *rest)
    if len(chain) > MAX_HOPS:
        raise ConfigError(f"{where}: more than {MAX_HOPS} ProxyJump hops")
    return dest, chain


def _split_hop(text: str, where: str) -> tuple[str, str | None, int | None]:
    """One ProxyJump entry: `[user@]host[:port]` or `ssh://[user@]host[:port]`."""
    if text.startswith("ssh://"):
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if not parts.hostname or parts.path not in ("", "/") or port == -1:
            raise ConfigError(f"{where}: ProxyJump entry {text!r} is not ssh://[user@]host[:port]")
        user = check_user(parts.username, where) if parts.username else None
        return _hop_host(parts.hostname, where), user, port
    user, _, hostport = text.rpartition("@")
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:]+)(?::(\d+))?", hostport)
    if not match or (not user and "@" in text):
        raise ConfigError(f"{where}: ProxyJump entry {text!r} is not [user@]host[:port]")
    host = match.group(1) or match.group(3)
    port_text = match.group(2) or match.group(4)
    return (
        _hop_host(host, where),
        check_user(user, where) if user else None,
        check_port(port_text, where) if port_text else None,
    )


def _hop_host(host: str, where: str) -> str:
    if ALIAS.match(host) or HOSTNAME.match(host):
        return host
    raise ConfigError(f"{where}: ProxyJump host {host!r} is not a valid host name or alias")


def _first_path(value: Any) -> Path | None:
    if not value:
        return None
    first = str(value).split()[0]
    if first.lower() == "none":
        return None
    return Path(os.path.expanduser(first))


@dataclass(frozen=True)
class SSHSpec:
    user: str
    hostname: str
    port: int = 22
    identity_file: Path | None = None
    known_hosts: Path | None = None  # None: each hop's UserKnownHostsFile, else ~/.ssh/known_hosts
    accept_unknown_host_key: bool = False
    jumps: tuple[Destination, ...] = ()  # ProxyJump hops, the first connected first
    identity_files: tuple[Path, ...] = ()  # the target's IdentityFile lines from ssh_config
    alias: str | None = None  # the ssh_config Host it came from
    config_known_hosts: Path | None = None  # the target's UserKnownHostsFile from ssh_config
    sudo: bool | None = None  # None: sudo when the user is not root

    @property
    def name(self) -> str:
        core = f"{self.user}@{self.hostname}:{self.port}"
        notes = ([self.alias] if self.alias else []) + (
            ["via " + ", ".join(j.name for j in self.jumps)] if self.jumps else []
        )
        return core + (f" ({'; '.join(notes)})" if notes else "")

    @property
    def uses_sudo(self) -> bool:
        return self.sudo if self.sudo is not None else self.user != "root"

    @property
    def destination(self) -> Destination:
        return Destination(
            self.user,
            self.hostname,
            self.port,
            self.identity_files,
            self.config_known_hosts,
            self.alias,
        )

    @classmethod
    def parse(cls, url: str, *, ssh_config_path: Path | None = None, **kwargs: object) -> SSHSpec:
        """`ssh://user@host:port` or an ssh_config alias, validated before anything connects.

        The URL form is explicit and complete: ssh_config is read only for an alias, from
        `ssh_config_path` or else ~/.ssh/config.
        """
        if "://" not in url:
            config = ssh_config_path or default_config_path()
            target, jumps = resolve(url, config)
            return cls(
                user=target.user,
                hostname=target.hostname,
                port=target.port,
                jumps=jumps,
                identity_files=target.identity_files,
                alias=target.alias,
                config_known_hosts=target.known_hosts,
                **kwargs,  # type: ignore[arg-type]
            )
        parts = urlsplit(url)
        if parts.scheme != "ssh" or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(
                f"host {url!r}: expected ssh://user@host[:port] or an ssh_config alias"
            )
        try:
            port = parts.port or 22
        except ValueError:
            raise ConfigError(f"host {url!r}: the port is not a number from 1 to 65535") from None
        user = check_user(parts.username or "root", f"host {url!r}")
        check_hostname(parts.hostname, f"host {url!r}")
        return cls(user=user, hostname=parts.hostname, port=port, **kwargs)  # type: ignore[arg-type]
