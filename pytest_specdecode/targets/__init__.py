"""Where the targets live: the original service and its candidates, behind one interface.

Backends, one module each (as pytest-testinfra's): `local` (a vLLM child process, the embedded
default) and `systemd` (a unit on a host reached over SSH). `open_target` picks one; nothing
else asks which backend it has.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .base import Progress, Target, port_answers

if TYPE_CHECKING:
    from ..config.ssh_config import SSHSpec
    from ..config.target import TargetConfig


def open_target(config: TargetConfig, *, log_dir: Path, progress: Progress | None = None) -> Target:
    """The configured backend; `progress` hears what it waits for (e.g. GPU memory release)."""
    if config.backend == "local":
        from .local import LocalProcessTarget

        env = dict(config.env)
        if config.api_key_env and os.environ.get(config.api_key_env):
            env["VLLM_API_KEY"] = os.environ[config.api_key_env]  # vLLM's --api-key, unseen
        return LocalProcessTarget(
            command=config.command,
            api_base=config.api_base,
            model=config.model,
            workdir=config.workdir,
            env=env,
            log_dir=log_dir,
        )
    from ..config.ssh_config import SSHSpec
    from .hosts.ssh import SSHHost
    from .hosts.tunnel import ApiTunnel
    from .systemd.target import SystemdTarget

    assert config.host and config.unit
    spec = SSHSpec.parse(
        config.host,
        ssh_config_path=config.ssh_config,
        identity_file=config.identity_file,
        known_hosts=config.known_hosts,
        accept_unknown_host_key=config.accept_unknown_host_key,
        sudo=config.sudo,
    )
    target = SystemdTarget(
        SSHHost(spec),
        config.unit,
        api_base=config.api_base,
        model=config.model,
        watchdog_s=config.watchdog_s,
        heartbeat_host=SSHHost(spec),
        progress=progress,
        vllm_images=config.vllm_images,
        restore_timeout_s=config.restore_timeout_s,
    )
    if api_through_ssh(config, spec):
        # Its own connection, opened at the first request: the dry run never opens it.
        target.use_tunnel(ApiTunnel(SSHHost(spec), target.api_address))
    return target


def api_through_ssh(config: TargetConfig, spec: SSHSpec) -> bool:
    """Whether the API must be reached through the SSH connection rather than directly.

    `auto` goes direct only when api_base is given, answers from here, and does not name a
    loopback address of a host that is not this machine's loopback (that one is the host's own).
    """
    if config.api_via != "auto":
        return config.api_via == "ssh"
    if not config.api_base:
        return True
    if _loopback(urlsplit(config.api_base).hostname) and (
        spec.jumps or not _loopback(spec.hostname)
    ):
        return True
    return not port_answers(config.api_base)


def _loopback(name: str | None) -> bool:
    if name in (None, "localhost"):
        return name == "localhost"
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False
