"""Where the targets live: the original service and its candidates, behind one interface.

Backends, one module each (as pytest-testinfra's): `local` (a vLLM child process, the embedded
default) and `systemd` (a unit on a host reached over SSH). `open_target` picks one; nothing
else asks which backend it has.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .base import Target

if TYPE_CHECKING:
    from ..config.settings import TargetConfig


def open_target(config: TargetConfig, *, log_dir: Path) -> Target:
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
    from .ssh import SSHHost, SSHSpec
    from .systemd import SystemdTarget

    assert config.host and config.unit
    spec = SSHSpec.parse(
        config.host,
        identity_file=config.identity_file,
        known_hosts=config.known_hosts,
        accept_unknown_host_key=config.accept_unknown_host_key,
    )
    return SystemdTarget(
        SSHHost(spec),
        config.unit,
        api_base=config.api_base,
        model=config.model,
        watchdog_s=config.watchdog_s,
        heartbeat_host=SSHHost(spec),
        vllm_images=config.vllm_images,
        restore_timeout_s=config.restore_timeout_s,
    )
