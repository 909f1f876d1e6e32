"""The `[target]` table: how the original service runs, and where it answers.

`local`: a vLLM process this tool starts from `command`. `systemd`: a production unit on a host
reached over SSH (config/ssh_config.py), validated offline before anything connects.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigError
from .values import no_unknown, path_of, positive_number
from .vllm_argv import check_image_names, check_vllm_command

UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}\.service$")


@dataclass(frozen=True)
class TargetConfig:
    """How the original service runs, and where it answers."""

    backend: Literal["local", "systemd"]
    api_base: str
    model: str
    command: tuple[str, ...]  # local: the original server's command line
    workdir: Path
    env: Mapping[str, str]
    startup_timeout_s: float
    restore_timeout_s: float
    api_key_env: str | None  # the *name* of a variable holding an API key, never the key
    host: str | None = None  # systemd: ssh://user@host:port, or an ssh_config alias
    unit: str | None = None  # systemd: the production unit
    identity_file: Path | None = None
    known_hosts: Path | None = None
    accept_unknown_host_key: bool = False
    watchdog_s: float = 1800.0
    ssh_config: Path | None = None  # systemd: where an alias is looked up (else ~/.ssh/config)
    sudo: bool | None = None  # systemd: run commands under `sudo -n`; None: when not root
    api_via: Literal["auto", "direct", "ssh"] = "auto"  # systemd: how the API is reached
    vllm_images: tuple[str, ...] = ()  # systemd: container images whose entrypoint is vLLM's
    # a candidate whose engine dies before it ever serves, for a reason other than its config,
    # is started once more; default: yes for a local process, no for a systemd unit
    retry_failed_start: bool = False


_TARGET_KEYS = {
    "backend",
    "host",
    "unit",
    "identity_file",
    "known_hosts",
    "accept_unknown_host_key",
    "watchdog_s",
    "restore_timeout_s",
    "api_base",
    "model",
    "command",
    "workdir",
    "env",
    "startup_timeout_s",
    "api_key_env",
    "ssh_config",
    "sudo",
    "api_via",
    "vllm_images",
    "retry_failed_start",
}


def target_config(table: dict[str, Any], base: Path, where: str) -> TargetConfig:
    here = f"{where} [target]"
    no_unknown(table, _TARGET_KEYS, here)
    backend = table.get("backend", "systemd" if table.get("host") else "local")
    if backend not in ("local", "systemd"):
        raise ConfigError(f"{here}: backend must be 'local' or 'systemd', got {backend!r}")
    api_base = str(table.get("api_base", "")).rstrip("/")
    parts = urlsplit(api_base)
    # systemd: without api_base, the API is reached through the SSH connection
    if (backend == "local" or api_base) and (
        parts.scheme not in ("http", "https") or not parts.hostname
    ):
        raise ConfigError(f"{here}: api_base must be an http(s) URL, got {api_base!r}")
    model = table.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{here}: 'model' (the served model name) is required")
    command: Any = ()
    if backend == "local":
        command = table.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise ConfigError(f"{here}: 'command' must be the server's command line")
        check_vllm_command(command, where=here)
        if any(a == "--api-key" or a.startswith("--api-key=") for a in command):
            raise ConfigError(
                f"{here}: the command carries --api-key: a key on a command line shows in ps and "
                "in logs. Put it in an environment variable and name it in api_key_env; the "
                "server gets it as VLLM_API_KEY"
            )
    else:
        _systemd_keys(table, base, here)
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{here}: 'env' must be a table of strings")
    api_key_env = table.get("api_key_env")
    if api_key_env is not None and not (
        isinstance(api_key_env, str) and api_key_env.isidentifier()
    ):
        raise ConfigError(f"{here}: api_key_env must name an environment variable")
    timeout = positive_number(table.get("startup_timeout_s", 1800), "startup_timeout_s", here)
    retry = table.get("retry_failed_start", backend == "local")
    if not isinstance(retry, bool):
        raise ConfigError(f"{here}: retry_failed_start must be true or false, got {retry!r}")
    return TargetConfig(
        backend=backend,
        api_base=api_base,
        model=model,
        command=tuple(command),
        workdir=(base / str(table.get("workdir", "."))).resolve(),
        env=dict(env),
        startup_timeout_s=timeout,
        restore_timeout_s=positive_number(
            table.get("restore_timeout_s", max(timeout, 3600.0)), "restore_timeout_s", here
        ),
        api_key_env=api_key_env,
        host=table.get("host"),
        unit=table.get("unit"),
        identity_file=path_of(table.get("identity_file"), base),
        known_hosts=path_of(table.get("known_hosts"), base),
        accept_unknown_host_key=bool(table.get("accept_unknown_host_key", False)),
        watchdog_s=positive_number(table.get("watchdog_s", 1800), "watchdog_s", here),
        ssh_config=path_of(table.get("ssh_config"), base),
        sudo=table.get("sudo"),
        api_via=table.get("api_via", "auto"),
        vllm_images=_images(table.get("vllm_images", []), here),
        retry_failed_start=retry,
    )


def _images(value: Any, here: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{here}: vllm_images must be a list of image names")
    return check_image_names(value, where=here)


def _systemd_keys(table: Mapping[str, Any], base: Path, here: str) -> None:
    from .ssh_config import SSHSpec

    host, unit = table.get("host"), table.get("unit")
    if not isinstance(host, str):
        raise ConfigError(
            f"{here}: the systemd backend needs host = 'ssh://user@host:port' or an ssh_config "
            "alias (or --spec-host)"
        )
    ssh_config = path_of(table.get("ssh_config"), base)
    if ssh_config is not None and not ssh_config.is_file():
        raise ConfigError(f"{here}: ssh_config {str(ssh_config)!r} is not a readable file")
    SSHSpec.parse(host, ssh_config_path=ssh_config)  # an alias is resolved here, offline
    if table.get("sudo") is not None and not isinstance(table.get("sudo"), bool):
        raise ConfigError(f"{here}: sudo must be true or false (default: when not root)")
    api_via = table.get("api_via", "auto")
    if api_via not in ("auto", "direct", "ssh"):
        raise ConfigError(f"{here}: api_via must be 'auto', 'direct' or 'ssh', got {api_via!r}")
    if api_via == "direct" and not table.get("api_base"):
        raise ConfigError(f"{here}: api_via = 'direct' needs api_base (or --spec-api-base)")
    if not isinstance(unit, str):
        raise ConfigError(
            f"{here}: the systemd backend needs unit = 'NAME.service' (or --spec-unit)"
        )
    check_unit_name(unit)
    for key in ("identity_file", "known_hosts"):
        value = table.get(key)
        if value is not None and not Path(os.path.expanduser(str(value))).is_file():
            raise ConfigError(f"{here}: {key} {value!r} is not a readable file")
    if not isinstance(table.get("accept_unknown_host_key", False), bool):
        raise ConfigError(f"{here}: accept_unknown_host_key must be true or false")


def check_unit_name(unit: str) -> str:
    """A plain .service name: nothing a shell or a path could misread; not a bare template."""
    if not UNIT_NAME.match(unit) or ".." in unit:
        raise ConfigError(
            f"unit {unit!r} is not a plain systemd service name (letters, digits, ':_.@-', "
            "ending in .service)"
        )
    if unit.endswith("@.service"):
        raise ConfigError(
            f"unit {unit!r} is a template, which never runs itself: name the instance that "
            f"serves, such as {unit.removesuffix('@.service')}@MODEL.service"
        )
    return unit
