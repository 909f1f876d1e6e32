"""Inside a unit's running container: commands through `docker exec` / `podman exec`.

A container unit's vLLM lives in its image, not on the host, so its facts are asked in there:
`ContainerHost` is a Host whose commands run in the named container, with the engine and the
engine's own options the unit itself uses (`podman --root … run` → `podman --root … exec`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from ...config.vllm_argv import ServerCommand
from .base import BaseHost, CommandResult, Host

# An init that a container may run as its first process (`--init`): the command follows it.
_INITS = {"tini", "tini-static", "dumb-init", "catatonit", "docker-init", "podman-init"}


class ContainerHost(BaseHost):
    """Commands run inside `container` on `host`, by the unit's own container engine.

    The engine needs the host's privileges (a rootful container), whatever the command.
    """

    def __init__(self, host: Host, engine: Sequence[str], container: str) -> None:
        self.host = host
        self.engine = tuple(engine)
        self.container = container
        self.name = f"container {container} on {host.name}"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        interactive = ["-i"] if stdin is not None else []
        return self.host.run(
            [*self.engine, "exec", *interactive, self.container, *argv],
            timeout=timeout,
            stdin=stdin,
            privileged=True,
        )

    def close(self) -> None:
        pass  # the host is the target's own, closed with it


def container_host(host: Host, server: ServerCommand) -> ContainerHost | None:
    """The unit's running container, where it has a name to be found by; else None."""
    if server.image is None or not server.container_name or not server.engine:
        return None
    return ContainerHost(host, server.engine, server.container_name)


def first_process(cmdline: str) -> list[str]:
    """The command of a container's first process, from /proc/1/cmdline (NUL-separated).

    An init in front of it (`--init`: tini, catatonit, docker-init) is stepped over.
    """
    argv = [a for a in cmdline.split("\0") if a]
    if argv and posixpath.basename(argv[0]) in _INITS:
        rest = argv[1:]
        if "--" in rest:
            return rest[rest.index("--") + 1 :]
        while rest and rest[0].startswith("-"):  # the init's own options
            rest = rest[1:]
        return rest
    return argv
