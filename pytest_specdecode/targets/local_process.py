"""One vLLM server process that this run starts and stops itself, on this machine.

It runs in a process group of its own, so that a stop reaches its engine's workers too, and
dies with this controller even when that is killed (PR_SET_PDEATHSIG). Each start appends to
its log file (in the run folder), after its command line; a stop redacts the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ServiceError
from ..redaction import redact_text

_IMPORT_FAILED = re.compile(r"\b(?:ModuleNotFoundError|ImportError): ")
_START_LOG_BYTES = 16 * 1024 * 1024  # a start's log read whole, up to this
# Variables of the plugin's own venv that must not leak into the server's.
_PLUGIN_ONLY_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")


class LocalProcessService:
    """One vLLM server process that this run starts and stops itself."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        api_base: str,
        model: str,
        workdir: Path,
        env: Mapping[str, str],
        log_path: Path,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.api_base = api_base
        self.model = model
        self.label = f"local vLLM process '{name}'"
        self._workdir = workdir
        self._env = env
        self._log_path = log_path
        self._stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where the latest start's lines begin in the (appended) log
        self.placement = ""  # side by side: its cores or GPU share (targets/beside/placement.py)
        self.stale = False  # runs with another command than the one it would start now

    def place(self, argv: Sequence[str], env: Mapping[str, str], placement: str) -> None:
        """The command and environment of its next start; `stale` while it runs another one."""
        changed = list(argv) != self.argv or dict(env) != dict(self._env)
        self.argv, self._env, self.placement = list(argv), dict(env), placement
        self.stale = self.stale or (changed and self.is_active())

    def is_active(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.is_active():
            return
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_env(self._env)
        with self._log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"$ {shlex.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    cwd=self._workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
                self.stale = False
            except OSError as exc:
                raise ServiceError(
                    f"{self.label} could not start `{self.argv[0]}` in {self._workdir}: {exc}; "
                    "nothing is running (did scripts/setup-embedded run?)"
                ) from None
        self.label = f"local vLLM process '{self.name}' (pid {self._proc.pid})"

    @property
    def pid(self) -> int | None:
        """The server's process, which leads its process group; None before a start."""
        return self._proc.pid if self._proc is not None else None

    def terminate(self) -> None:
        """SIGTERM to the server's process group, without waiting (safe from a signal handler)."""
        if self._proc is not None and self._proc.poll() is None:
            _signal_group(self._proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        proc = self._proc
        self.label = f"local vLLM process '{self.name}'"  # the next start names its own pid
        if proc is None:
            return
        if proc.poll() is not None:  # it died: its engine's processes may outlive it
            _signal_group(proc.pid, signal.SIGKILL)
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self._stop_timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # Engine workers share the process group: make sure none outlives the server.
        _signal_group(proc.pid, signal.SIGKILL)
        self._redact_log()

    def _redact_log(self) -> None:
        """The server's log stays in the run folder: no secret may stay in it."""
        try:
            text = self._log_path.read_text(errors="replace")
            clean = redact_text(text)
            if clean != text:
                self._log_path.write_text(clean)
        except OSError:
            pass

    def failure(self) -> str | None:
        if self._proc is None:
            return "never started"
        code = self._proc.poll()
        if code is None:
            return None
        return f"the process exited with status {code}" + self._held_back_hint()

    def _held_back_hint(self) -> str:
        """A failed import, where this process's PYTHONPATH was held back from the server."""
        held = os.environ.get("PYTHONPATH")
        if not held or "PYTHONPATH" in self._env:
            return ""
        if not any(_IMPORT_FAILED.search(line) for line in self.start_log()):
            return ""
        return (
            f"; the server could not import a module, and this run's PYTHONPATH ({held}) is not "
            "passed to it: set PYTHONPATH in [target.env] if the server needs it"
        )

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            with self._log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [redact_text(line) for line in text.splitlines() if line.strip()][-lines:]

    def start_log(self) -> list[str]:
        """The latest start's lines, from the line this run wrote before it (its command) on."""
        try:
            with self._log_path.open("rb") as f:
                f.seek(self._log_offset)
                text = f.read(_START_LOG_BYTES).decode(errors="replace")
        except OSError:
            return []
        lines = [line for line in text.splitlines() if line.strip()]
        first = max((i for i, line in enumerate(lines) if line.startswith("$ ")), default=0)
        return [redact_text(line) for line in lines[first:]]

    def settings_log(self) -> list[str]:
        return self.start_log()


def server_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: this one without the plugin's venv, plus the config's."""
    env = {k: v for k, v in os.environ.items() if k not in _PLUGIN_ONLY_ENV}
    env.update(extra)
    return env


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the controller dies, even by SIGKILL (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
