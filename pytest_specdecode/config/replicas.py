"""`[[target.replicas]]`: a target of several replicas, each read as a `[target]` of its own.

Each entry takes the keys a `[target]` takes for its backend (a systemd unit on a host reached
over SSH, or a local server), plus a `name` and optional `drain` / `undrain` commands; the keys
of `[target]` itself are every entry's defaults. A local replica may take `devices` (the GPUs
its servers see: their CUDA_VISIBLE_DEVICES) and `port` (its servers' `--port`, and its
api_base's), so that replicas of one command run one per GPU or GPU group. The crossover
across replicas (docs/replicas.md) runs in run/crossover/periods.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError
from .target import TargetConfig, target_config

REPLICA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_OWN_KEYS = {"name", "drain", "undrain", "devices", "port"}
VISIBLE = "CUDA_VISIBLE_DEVICES"
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
_MOST_ARGS = 256
_MOST_ARG_CHARS = 4096


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica: its name, its target, and the commands that take it out of its load
    balancer and put it back (argv, run without a shell; empty where none is given)."""

    name: str
    target: TargetConfig
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    devices: tuple[int, ...] = ()  # local: the GPUs its servers see (CUDA_VISIBLE_DEVICES)
    port: int | None = None  # local: its servers' --port

    def describe(self) -> str:
        """`a: unit vllm.service on gpu-a, API http://gpu-a:8000/v1`, for the plan."""
        t = self.target
        api = t.api_base or "through the SSH connection"
        if t.backend == "local":
            on = ""
            if self.devices:
                gpus = ",".join(map(str, self.devices))
                on = f" on GPU{'s' if len(self.devices) > 1 else ''} {gpus} ({VISIBLE}={gpus})"
            return f"{self.name}: a local server ({' '.join(t.command[:3])} …){on}, API {api}"
        return f"{self.name}: unit {t.unit} on {t.host}, API {api}"


def target_and_replicas(
    table: Mapping[str, Any], overrides: Mapping[str, Any], base: Path, where: str
) -> tuple[TargetConfig, tuple[ReplicaConfig, ...]]:
    """`[target]` and its replicas. Without replicas: the target as before, and (). With them:
    the first replica's target (what a plain plan reads), and every replica."""
    if "replicas" not in table:
        return target_config({**table, **overrides}, base, where), ()
    given = sorted(k for k in overrides if k != "backend")
    if given:
        raise ConfigError(
            f"{where} [target] has replicas: the command line's {', '.join(given)} would apply "
            "to which one? Set them in each [[target.replicas]] entry instead"
        )
    replicas = replicas_of(table, base, where)
    return replicas[0].target, replicas


def replicas_of(table: Mapping[str, Any], base: Path, where: str) -> tuple[ReplicaConfig, ...]:
    """Every `[[target.replicas]]` entry, each over `[target]`'s own keys; ConfigError naming
    the entry (its index and name) and the key."""
    entries = table["replicas"]
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise ConfigError(
            f"{where} [target] replicas must be [[target.replicas]] tables, got {entries!r}"
        )
    if len(entries) < 2:
        raise ConfigError(
            f"{where} [target] has {len(entries)} [[target.replicas]] entry: a crossover needs "
            "at least 2 replicas (one replica is a plain [target])"
        )
    shared = {k: v for k, v in table.items() if k != "replicas"}
    out: list[ReplicaConfig] = []
    for index, entry in enumerate(entries, start=1):
        out.append(_replica(entry, shared, base, where, index))
    _distinct(out, where)
    return tuple(out)


def _replica(
    entry: Mapping[str, Any], shared: Mapping[str, Any], base: Path, where: str, index: int
) -> ReplicaConfig:
    name = entry.get("name")
    here = f"{where} [[target.replicas]] entry {index}"
    if not isinstance(name, str) or not REPLICA_NAME.match(name):
        raise ConfigError(
            f"{here}: name must be a short name (letters, digits, '_.-'), got {name!r}"
        )
    here = f"{here} ({name!r})"
    if "replicas" in entry:
        raise ConfigError(f"{here}: a replica holds no replicas of its own")
    keys = {k: v for k, v in entry.items() if k not in _OWN_KEYS}
    merged = dict(shared)
    if "command" in keys and "host" not in keys:  # a local replica: none of the shared host's
        merged.pop("host", None)
        merged.pop("unit", None)
    merged.update(keys)
    try:
        target = target_config(merged, base, here)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if here in message else f"{here}: {message}") from None
    devices = _devices(entry.get("devices"), here)
    port = _port(entry.get("port"), here)
    if (devices or port is not None) and target.backend != "local":
        raise ConfigError(
            f"{here}: devices and port are a local replica's; a systemd unit's GPUs and port "
            "are its own (its unit file), so they cannot be set here"
        )
    return ReplicaConfig(
        name=name,
        target=_placed(target, devices, port, entry, here),
        drain=check_argv(entry.get("drain"), "drain", here),
        undrain=check_argv(entry.get("undrain"), "undrain", here),
        devices=devices,
        port=port,
    )


def _devices(value: Any, here: str) -> tuple[int, ...]:
    """`devices = [0, 1]` or `"0,1"`: GPU indices, each once; () where none is given."""
    if value is None:
        return ()
    words = value.split(",") if isinstance(value, str) else value
    if not isinstance(words, list | tuple):
        words = [words]
    out: list[int] = []
    for word in words:
        text = word.strip() if isinstance(word, str) else word
        if isinstance(text, str) and text.isdigit():
            text = int(text)
        if not isinstance(text, int) or isinstance(text, bool) or text < 0:
            raise ConfigError(
                f"{here}: devices must be GPU indices as nvidia-smi numbers them, e.g. [0] or "
                f'[0, 1] or "0,1", got {value!r}'
            )
        out.append(text)
    if not out or len(set(out)) != len(out):
        raise ConfigError(f"{here}: devices must name each GPU once, at least one: got {value!r}")
    return tuple(out)


def _port(value: Any, here: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ConfigError(f"{here}: port must be a TCP port (1 to 65535), got {value!r}")
    return value


def _placed(
    target: TargetConfig,
    devices: tuple[int, ...],
    port: int | None,
    entry: Mapping[str, Any],
    here: str,
) -> TargetConfig:
    """A local replica's target on its own GPUs and port: CUDA_VISIBLE_DEVICES in its servers'
    environment, `--port` in its command and its api_base on that port."""
    changes: dict[str, Any] = {}
    if devices:
        visible = ",".join(map(str, devices))
        given = target.env.get(VISIBLE)
        if given is not None and given != visible:
            raise ConfigError(
                f"{here}: devices = {list(devices)} and env's {VISIBLE}={given!r} disagree: "
                "give the replica's GPUs once, as devices"
            )
        changes["env"] = {**target.env, VISIBLE: visible}
    if port is not None:
        parts = urlsplit(target.api_base)
        if "api_base" in entry and parts.port not in (None, port):
            raise ConfigError(
                f"{here}: port = {port} and api_base {target.api_base!r} disagree: give the "
                "port once (api_base's host is kept, its port set to port)"
            )
        host = parts.hostname or "127.0.0.1"
        netloc = f"[{host}]" if ":" in host else host
        changes["api_base"] = urlunsplit(parts._replace(netloc=f"{netloc}:{port}"))
        changes["command"] = _on_port(target.command, port)
    return dataclasses.replace(target, **changes) if changes else target


def _on_port(command: Sequence[str], port: int) -> tuple[str, ...]:
    """The command listening on `port`: every `--port V` and `--port=V` replaced by one."""
    out: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
        elif arg == "--port":
            skip = True
        elif not arg.startswith("--port="):
            out.append(arg)
    return (*out, "--port", str(port))


def check_argv(value: Any, key: str, here: str) -> tuple[str, ...]:
    """A command as an argv list, run without a shell: strings, one line each, no NUL."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise ConfigError(
            f'{here}: {key} must be a command as a list of words, e.g. ["lbctl", "drain", '
            f'"gpu-a"], not the string {value[:80]!r} (it is run without a shell)'
        )
    if not isinstance(value, list) or not value or len(value) > _MOST_ARGS:
        raise ConfigError(f"{here}: {key} must be a non-empty list of words, got {value!r}")
    for word in value:
        if not isinstance(word, str):
            raise ConfigError(f"{here}: {key} holds {word!r}, which is not a string")
        if "\0" in word or "\n" in word or "\r" in word or len(word) > _MOST_ARG_CHARS:
            raise ConfigError(
                f"{here}: {key} holds {word[:80]!r}, which is not a word this tool will pass on "
                "(one line, no NUL)"
            )
    if not value[0].strip():
        raise ConfigError(f"{here}: {key}'s first word (the program) is empty")
    return tuple(value)


def _distinct(replicas: Sequence[ReplicaConfig], where: str) -> None:
    """Names, API bases, (host, unit) pairs, and a local replica's port and GPUs: each
    replica's own."""
    seen: dict[tuple[str, str], str] = {}
    for index, replica in enumerate(replicas, start=1):
        t = replica.target
        keys = [("name", replica.name)]
        if t.api_base:
            keys.append(("api_base", t.api_base))
        if t.backend == "systemd":
            keys.append(("unit", f"{t.unit} on {t.host}"))
        else:
            parts = urlsplit(t.api_base)
            host = parts.hostname or ""
            host = "this machine" if host in _LOOPBACK else host
            port = parts.port or (443 if parts.scheme == "https" else 80)
            keys.append(("port", f"{port} on {host}"))
            keys += [("GPU", str(d)) for d in replica.devices]
        for kind, value in keys:
            other = seen.setdefault((kind, value), f"entry {index} ({replica.name!r})")
            if not other.startswith(f"entry {index} "):
                raise ConfigError(
                    f"{where} [[target.replicas]] entry {index} ({replica.name!r}) and {other} "
                    f"share the {kind} {value!r}: each replica needs its own"
                )


@dataclass(frozen=True)
class Period:
    """One period of the crossover: which arm each replica serves, in replica order."""

    number: int  # from 1, over every crossover
    serving: tuple[tuple[str, str], ...]  # (replica, arm)
    crossover: int = 1  # the crossover it belongs to, from 1


def crossover_periods(
    replicas: Sequence[str], arms: Sequence[str], crossovers: int = 1
) -> tuple[Period, ...]:
    """The rotation in which each replica serves each arm once: as many periods as arms, and in
    period p, replica i serves arm (i + p) mod arms; `crossovers` times over, each period a new
    start of every replica. Two replicas and two arms: the AB/BA crossover (period 1: the first
    replica the baseline, the second the candidate; period 2: swapped; period 3 as period 1...).
    `arms[0]` is the baseline, each replica's original."""
    if not replicas or not arms:
        return ()
    m = len(arms)
    return tuple(
        Period(p + 1, tuple((r, arms[(i + p) % m]) for i, r in enumerate(replicas)), p // m + 1)
        for p in range(m * max(1, crossovers))
    )


def restarts_of(periods: Sequence[Period], replica: str, baseline: str) -> int:
    """How often `replica` is restarted: into each arm it serves that differs from the one
    before (it starts as its original, the baseline), and back to its original at the end."""
    serving = [baseline, *(dict(p.serving)[replica] for p in periods), baseline]
    return sum(1 for before, after in pairwise(serving) if before != after)
