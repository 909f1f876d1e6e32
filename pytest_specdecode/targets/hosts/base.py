"""Hosts that run commands: local now, SSH alongside, behind one interface (as pytest-testinfra)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...errors import HostError


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def describe(self) -> str:
        err = (self.stderr or self.stdout).strip().splitlines()[-5:]
        return f"`{shlex.join(self.argv)}` on {self.host} exited {self.exit_status}" + (
            ": " + " | ".join(err) if err else ""
        )


class Host(Protocol):
    """Where services live. `argv` is a list: hosts quote it themselves, callers never do.

    `privileged=False` marks a command that only reads what any user may read (nvidia-smi, the
    server's own Python): a host that escalates with sudo runs it as the user itself, so the
    sudo rule need not name it.
    """

    name: str

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult: ...

    def check(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult: ...

    def close(self) -> None: ...


class BaseHost:
    """`check` on top of `run`, shared by every host."""

    name = "host"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        raise NotImplementedError

    def check(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        result = self.run(argv, timeout=timeout, stdin=stdin, privileged=privileged)
        if not result.ok:
            raise HostError(result.describe())
        return result

    def close(self) -> None:
        return None


class LocalHost(BaseHost):
    """This machine."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.name = "localhost"
        self._env = dict(env) if env is not None else None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,  # this machine: as the controller runs
    ) -> CommandResult:
        argv = tuple(argv)
        try:
            proc = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self._env if self._env is not None else os.environ.copy(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HostError(
                f"`{shlex.join(argv)}` on {self.name} did not finish within {timeout:.0f}s "
                "and was killed"
            ) from None
        except OSError as exc:
            raise HostError(f"`{shlex.join(argv)}` on {self.name} could not start: {exc}") from None
        return CommandResult(self.name, argv, proc.returncode, proc.stdout, proc.stderr)
