"""The GPU host's vLLM as systemd units over a Host: the original, candidates, a watchdog, a lock.

What it writes on the host, and where:
- /etc/systemd/system/<unit>-specdecode.service: the candidate, removed at restore;
- /run/pytest-specdecode/: the lock (owner.txt) and the watchdog's restore.sh, removed at restore;
- transient units pytest-specdecode-watchdog.{timer,service} (systemd-run), stopped at restore.

It runs only the programs in HOST_PROGRAMS (no shell), so that a non-root user can be given
exactly those in a sudo rule; the Host wraps each command in `sudo -n` where needed.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..config.specconfig import SpecConfig, VllmFacts
from ..errors import ConfigError, HostError, ServiceError
from ..record.redaction import redact_text
from . import gpu
from .base import Progress, Transports, port_answers
from .hosts import CommandResult, Host
from .unitfile import (
    candidate_unit_name,
    check_unit_name,
    effective_exec_start,
    render_candidate_unit,
)
from .vllm_argv import option_value
from .vllm_facts import ask_vllm

if TYPE_CHECKING:
    from .tunnel import ApiTunnel

STATE_DIR = "/run/pytest-specdecode"
LOCK_DIR = f"{STATE_DIR}/lock"
RESTORE_SCRIPT = f"{STATE_DIR}/restore.sh"
UNIT_DIR = "/etc/systemd/system"
WATCHDOG = "pytest-specdecode-watchdog"
# Journal lines that mean the engine is dead although the unit may still look active.
ENGINE_DEATH = re.compile(
    r"EngineCore failed|Engine core initialization failed|EngineDeadError|InvalidCxxCompiler"
    r"|CUDA out of memory|OutOfMemoryError|Traceback \(most recent call last\)"
)
GPU_RELEASE_TIMEOUT_S = 60.0  # H200: 0.2 s after the process; big multi-GPU servers longer
_SHOW = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")
# Every program this backend runs on the host, with a harmless invocation that proves it may.
HOST_PROGRAMS: dict[str, tuple[str, ...]] = {
    "systemctl": ("systemctl", "--version"),
    "journalctl": ("journalctl", "--version"),
    "systemd-run": ("systemd-run", "--version"),
    "install": ("install", "--version"),
    "mv": ("mv", "--version"),
    "rm": ("rm", "--version"),
    "mkdir": ("mkdir", "--version"),
    "cat": ("cat", "--version"),
    "test": ("test", "-d", "/"),
    "ss": ("ss", "-V"),
}
_INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")


class SystemdUnit:
    """One unit on a host, seen as a Service."""

    def __init__(
        self,
        host: Host,
        unit: str,
        *,
        api_base: str,
        model: str,
        progress: Progress | None = None,
    ) -> None:
        self.host = host
        self.unit = check_unit_name(unit)
        self.api_base = api_base
        self.model = model
        self.label = f"unit {unit} on {host.name}"
        self._started_at: float | None = None
        self._restarts_at_start = 0
        self.progress = progress
        self.gpu_notes: list[str] = []  # what the last stop saw on the GPUs besides the unit

    def show(self) -> dict[str, str]:
        result = self.host.check(
            ["systemctl", "show", self.unit, *(f"--property={p}" for p in _SHOW)], timeout=30
        )
        return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)

    def state(self) -> str:
        s = self.show()
        return f"{s.get('ActiveState')}/{s.get('SubState')} (NRestarts={s.get('NRestarts')})"

    def is_active(self) -> bool:
        return self.show().get("ActiveState") in ("active", "activating", "reloading")

    def start(self) -> None:
        self._restarts_at_start = int(self.show().get("NRestarts") or 0)
        self._started_at = time.time()
        self._systemctl("start", timeout=120)

    def stop(self) -> None:
        before = gpu.snapshot_unit(self.host, self.unit)  # its PIDs, while they still run
        self._systemctl("stop", timeout=180)
        self._check_stopped(before)

    def failure(self) -> str | None:
        s = self.show()
        restarts = int(s.get("NRestarts") or 0)
        if s.get("ActiveState") == "failed":
            return f"the unit failed (Result={s.get('Result')}, status {s.get('ExecMainStatus')})"
        if restarts > self._restarts_at_start:
            return (
                f"crash loop: NRestarts climbed from {self._restarts_at_start} to {restarts} "
                f"since the start ({s.get('ActiveState')}/{s.get('SubState')})"
            )
        if s.get("ActiveState") == "inactive" and self._started_at is not None:
            return f"the unit stopped by itself (Result={s.get('Result')})"
        death = self._engine_death()
        if death:
            return f"the engine died while the unit stays {s.get('ActiveState')}: {death[:200]}"
        return None

    def log_tail(self, lines: int = 20) -> list[str]:
        """The newest journal lines: since this run started the unit, else of its current run."""
        return self._journal(lines, since_start=self._started_at is not None)

    def _engine_death(self) -> str | None:
        """A journal line of the unit's current run that says the engine is dead."""
        lines = self._journal(300, since_start=False)
        return next((line for line in lines if ENGINE_DEATH.search(line)), None)

    def _journal(self, lines: int, *, since_start: bool) -> list[str]:
        """The newest `lines` entries, oldest first (journalctl -r, reversed: no shell, no tail)."""
        try:
            if since_start:
                match = ["-u", self.unit, "--since", f"@{int(self._started_at or 0) - 1}"]
            else:
                invocation = self.host.run(
                    ["systemctl", "show", "-p", "InvocationID", "--value", self.unit], timeout=30
                ).stdout.strip()
                if not _INVOCATION_ID.match(invocation):
                    return []
                match = [f"_SYSTEMD_INVOCATION_ID={invocation}"]
            result = self.host.run(
                ["journalctl", *match, "-o", "cat", "--no-pager", "-r", "-n", str(lines)],
                timeout=30,
            )
        except HostError:
            return []
        newest_first = [redact_text(line) for line in result.stdout.splitlines() if line.strip()]
        return newest_first[::-1]

    def _systemctl(self, verb: str, *, timeout: float) -> None:
        result = self.host.run(["systemctl", verb, self.unit], timeout=timeout)
        if not result.ok:
            raise ServiceError(
                f"`systemctl {verb} {self.unit}` failed on {self.host.name}: "
                f"{result.describe()}; the unit is now {self.state()}"
            )

    def _check_stopped(self, before: gpu.UnitGpuSnapshot) -> None:
        """No process of the unit lingers; its GPU memory is released (where nvidia-smi is).

        GPU memory is judged by the unit's own PIDs (taken before the stop) on the GPUs they
        used; other processes on the host are reported in `gpu_notes`, never fatal.
        """
        deadline = time.monotonic() + 60
        while True:
            s = self.show()
            if s.get("ActiveState") in ("inactive", "failed") and s.get("MainPID") in ("0", ""):
                break
            if time.monotonic() > deadline:
                raise ServiceError(f"{self.label} did not stop within 60s: {self.state()}")
            time.sleep(1)
        self.gpu_notes = [before.note] if before.note else []
        if before.apps is not None:  # None: no nvidia-smi on the host, or it failed (the note)
            release = gpu.wait_until_released(
                lambda: gpu.poll_release(self.host, before.pids),
                before,
                label=self.label,
                timeout_s=GPU_RELEASE_TIMEOUT_S,
                progress=self.progress,
            )
            self.gpu_notes += release.notes(self.label, before.gpus)
        for note in self.gpu_notes if self.progress is not None else ():
            self.progress(f"GPU: {note}")  # reported, never fatal (not a warning: -W error)


class SystemdTarget:
    """A production unit on a host, and candidate units derived from it."""

    adopts_running_original = True  # the running unit is the baseline, measured as it runs
    typical_start_s = 300.0

    def __init__(
        self,
        host: Host,
        unit: str,
        *,
        api_base: str,
        model: str,
        watchdog_s: float = 1800.0,
        heartbeat_host: Host | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.host = host
        self.progress = progress
        self.host_name = host.name
        self.unit = check_unit_name(unit)
        self.candidate_unit = candidate_unit_name(unit)
        self.api_base = api_base
        self.model = model
        self.watchdog_s = watchdog_s
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
        self._heartbeat_host = heartbeat_host
        self._heartbeat: threading.Thread | None = None
        self._stop_heartbeat = threading.Event()
        self._original: SystemdUnit | None = None
        self._unit_text: str | None = None
        self._locked = False
        self._armed = False
        self.watchdog_fired = False
        self._wrote_candidate = False
        self.tunnel: ApiTunnel | None = None

    def use_tunnel(self, tunnel: ApiTunnel) -> None:
        """Reach the API through SSH: every service of this target answers at `tunnel.url`."""
        assert self._original is None, "set the tunnel before the services are made"
        self.tunnel = tunnel
        self.api_base = tunnel.url

    def api_address(self) -> tuple[str, int]:
        """Where the unit's API listens, as the host sees it: its ExecStart's --host/--port."""
        _, tokens = effective_exec_start(self.unit_text(), where=f"unit {self.unit}")
        argv = [t.value for t in tokens]
        host = option_value(argv, "--host") or "127.0.0.1"
        port_text = option_value(argv, "--port") or "8000"  # vLLM's defaults
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ConfigError(
                f"unit {self.unit} on {self.host_name}: --port {port_text!r} is not a port; "
                "cannot tell where its API listens"
            )
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host in ("::", "[::]"):
            host = "::1"
        return host, int(port_text)

    # -- Target -------------------------------------------------------------------------------
    def preflight(self) -> None:
        self._check_programs()
        text = self.unit_text()
        render_candidate_unit(self.unit, text, _PROBE_SPEC, run_id=self.run_id)  # parses or refuses
        state = self.original().show()
        if state.get("ActiveState") != "active":
            raise ConfigError(
                f"unit {self.unit} on {self.host_name} is {state.get('ActiveState')}/"
                f"{state.get('SubState')}, not active: refusing to experiment. The tool restores "
                "the original to the state it found, and only a serving original is a baseline"
            )
        self._check_port_owner()
        if self.tunnel is not None:
            self.tunnel.remote_answers()  # refuses an sshd that forbids forwarding
        writable = self.host.run(["test", "-w", UNIT_DIR], timeout=30)
        if not writable.ok:
            raise ConfigError(
                f"{self.host_name}: {UNIT_DIR} is not writable by {self.host.name.split('@')[0]}; "
                "the candidate unit cannot be written (connect as root, or as a user with the "
                "sudo rule of the README)"
            )
        self._lock()

    def vllm_facts(self, progress: Progress | None = None) -> VllmFacts:
        """Asked of the Python in the unit's ExecStart, over SSH; reads, never changes."""
        _, tokens = effective_exec_start(self.unit_text(), where=f"unit {self.unit}")
        where = f"unit {self.unit} on {self.host_name}"
        return ask_vllm(self.host, [t.value for t in tokens], where=where, progress=progress)

    def original(self) -> SystemdUnit:
        if self._original is None:
            self._original = SystemdUnit(
                self.host,
                self.unit,
                api_base=self.api_base,
                model=self.model,
                progress=self.progress,
            )
        return self._original

    def before_swap(self) -> None:
        self._arm_watchdog()

    def candidate(self, spec: SpecConfig) -> SystemdUnit:
        self._arm_watchdog()
        self._check_port_free()
        content = render_candidate_unit(self.unit, self.unit_text(), spec, run_id=self.run_id)
        self._wrote_candidate = True
        self.write_file(f"{UNIT_DIR}/{self.candidate_unit}", content)
        self.host.check(["systemctl", "daemon-reload"], timeout=60)
        return SystemdUnit(
            self.host,
            self.candidate_unit,
            api_base=self.api_base,
            model=self.model,
            progress=self.progress,
        )

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        steps = [f"on {self.host_name}: lock {LOCK_DIR}; measure {self.unit} as it runs"]
        if self.tunnel is not None:
            steps.append(f"reach the API through SSH: {self.tunnel.describe()}")
        for spec in specs:
            unit_file = render_candidate_unit(self.unit, self.unit_text(), spec, run_id=self.run_id)
            steps += [
                f"arm the watchdog: systemd-run --unit {WATCHDOG} --on-active="
                f"{self.watchdog_s:.0f}s /bin/sh {RESTORE_SCRIPT} (renewed while running)",
                f"systemctl stop {self.unit} (or the previous candidate)",
                f"write {UNIT_DIR}/{self.candidate_unit}:\n" + _indent(unit_file),
                f"systemctl daemon-reload; systemctl start {self.candidate_unit}",
            ]
        steps += [
            f"restore: systemctl stop {self.candidate_unit}; rm {UNIT_DIR}/"
            f"{self.candidate_unit}; systemctl daemon-reload; systemctl start {self.unit}; wait "
            f"until healthy; disarm the watchdog; unlock",
        ]
        return steps

    def transports(self) -> Transports:
        return Transports()

    def close(self) -> None:
        """Called after the restore: remove every trace, then let go of the host."""
        try:
            self._remove_candidate()
            self._disarm_watchdog()
            self._unlock()
        finally:
            self.host.close()
            if self._heartbeat_host is not None:
                self._heartbeat_host.close()
            if self.tunnel is not None:
                self.tunnel.close()

    # -- host files -----------------------------------------------------------------------------
    def unit_text(self) -> str:
        if self._unit_text is None:
            result = self.host.run(["systemctl", "cat", self.unit], timeout=30)
            if not result.ok and _sudo_refused(result):
                raise self._sudo_refusal(result)
            if not result.ok:
                raise ConfigError(
                    f"unit {self.unit} not found on {self.host_name} "
                    f"({(result.stderr or result.stdout).strip()[:200]}); nothing was touched"
                )
            self._unit_text = result.stdout
        return self._unit_text

    def write_file(self, path: str, content: str, mode: str = "0644") -> None:
        """Atomically: a temporary file beside it, then rename. Content goes by stdin only.

        `install -D` creates missing parent directories (0755), e.g. a drop-in's `<unit>.d/`.
        """
        if not re.fullmatch(r"0[0-7]{3}", mode) or not path.startswith("/") or ".." in path:
            raise ValueError(f"write_file: refusing path {path!r} or mode {mode!r}")
        tmp = f"{path}.tmp"
        self.host.check(["install", "-m", mode, "-D", "/dev/stdin", tmp], stdin=content, timeout=60)
        self.host.check(["mv", "-f", tmp, path], timeout=30)

    # -- lock -------------------------------------------------------------------------------------
    def _lock(self) -> None:
        owner = (
            f"run {self.run_id} by {getpass.getuser()} on {socket.gethostname()} since "
            f"{datetime.now(UTC).isoformat(timespec='seconds')}, unit {self.unit}"
        )
        self.host.check(["mkdir", "-p", "-m", "0700", STATE_DIR], timeout=30)
        got = self.host.run(["mkdir", LOCK_DIR], timeout=30)
        if not got.ok:
            held = self.host.run(["cat", f"{LOCK_DIR}/owner.txt"], timeout=30).stdout.strip()
            raise ConfigError(
                f"{self.host_name} is locked by another experiment ({held or 'owner unknown'}); "
                f"nothing was touched. If that run is dead and its watchdog gone, remove "
                f"{LOCK_DIR} on the host"
            )
        self._locked = True
        self.write_file(f"{LOCK_DIR}/owner.txt", owner + "\n")

    def _unlock(self) -> None:
        if self._locked:
            self.host.run(["rm", "-rf", LOCK_DIR], timeout=30)
            self._locked = False

    # -- watchdog -----------------------------------------------------------------------------
    def restore_script(self) -> str:
        cand, orig = shlex.quote(self.candidate_unit), shlex.quote(self.unit)
        return "\n".join(
            [
                "#!/bin/sh",
                f"# pytest-specdecode run {self.run_id}: the controller stopped renewing; restore.",
                f"systemctl stop {cand}",
                f"rm -f {shlex.quote(f'{UNIT_DIR}/{self.candidate_unit}')}",
                "systemctl daemon-reload",
                f"systemctl start {orig}",
                f"rm -rf {shlex.quote(LOCK_DIR)} {shlex.quote(RESTORE_SCRIPT)}",
                "",
            ]
        )

    def _arm_watchdog(self) -> None:
        if self._armed:
            return
        self.write_file(RESTORE_SCRIPT, self.restore_script(), mode="0700")
        self._start_timer()
        self._armed = True
        self._stop_heartbeat.clear()
        self._heartbeat = threading.Thread(
            target=self._renew_loop, daemon=True, name="specdecode-watchdog"
        )
        self._heartbeat.start()

    def _start_timer(self) -> None:
        host = self.host  # renewals restart the timer from the heartbeat's own connection
        host.run(["systemctl", "stop", f"{WATCHDOG}.timer", f"{WATCHDOG}.service"], timeout=30)
        host.run(
            ["systemctl", "reset-failed", f"{WATCHDOG}.timer", f"{WATCHDOG}.service"], timeout=30
        )
        host.check(
            [
                "systemd-run",
                f"--unit={WATCHDOG}",
                f"--on-active={int(self.watchdog_s)}s",
                "--timer-property=AccuracySec=1s",
                f"--description=pytest-specdecode watchdog for {self.unit}",
                "/bin/sh",
                RESTORE_SCRIPT,
            ],
            timeout=30,
        )

    def _renew_loop(self) -> None:
        host = self._heartbeat_host or self.host
        interval = max(1.0, self.watchdog_s / 3)
        while not self._stop_heartbeat.wait(interval):
            try:
                fired = host.run(
                    [
                        "systemctl",
                        "show",
                        f"{WATCHDOG}.service",
                        "--property=ExecMainStartTimestampMonotonic",
                        "--value",
                    ],
                    timeout=30,
                ).stdout.strip()
                if fired not in ("", "0"):
                    self.watchdog_fired = True  # the host restored on its own: stop renewing
                    return
                # Restarting the timer re-arms --on-active from now.
                host.run(["systemctl", "restart", f"{WATCHDOG}.timer"], timeout=30)
            except Exception:  # the next beat retries; the timer itself is the safety net
                continue

    def _disarm_watchdog(self) -> None:
        if not self._armed:
            return
        self._stop_heartbeat.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=30)
        self.host.run(["systemctl", "stop", f"{WATCHDOG}.timer", f"{WATCHDOG}.service"], timeout=30)
        self.host.run(["rm", "-f", RESTORE_SCRIPT], timeout=30)
        self._armed = False

    # -- candidate ----------------------------------------------------------------------------
    def _remove_candidate(self) -> None:
        if not self._wrote_candidate:
            return
        path = f"{UNIT_DIR}/{self.candidate_unit}"
        if self.host.run(["test", "-e", path], timeout=30).ok:
            self.host.run(["systemctl", "stop", self.candidate_unit], timeout=180)
            self.host.check(["rm", "-f", path], timeout=30)
            self.host.check(["systemctl", "daemon-reload"], timeout=60)

    def _check_port_owner(self) -> None:
        """The API port must be the unit's: else we would measure, or collide with, another."""
        port = self._api_port()
        listeners = self.host.run(["ss", "-Htlnp", f"sport = :{port}"], timeout=30)
        pids = sorted(set(re.findall(r"pid=(\d+)", listeners.stdout))) if listeners.ok else []
        if not pids:
            return  # nothing listens yet (or no ss): the readiness wait will tell
        owners = ""
        for pid in pids:
            seen = self.host.run(["cat", f"/proc/{pid}/comm", f"/proc/{pid}/cgroup"], timeout=30)
            owners += f"{pid} {' '.join(seen.stdout.split())}\n"
        if f"/{self.unit}" not in owners:
            holder = " ".join(owners.split()[:2]) or pids[0]
            raise ConfigError(
                f"port {port} on {self.host_name} is held by pid {holder}, which is not part of "
                f"unit {self.unit}: api_base points at another server, and a candidate could "
                "not bind that port. Nothing was touched"
            )

    def _check_port_free(self) -> None:
        """After the stop, nothing may still answer on the service's port."""
        deadline = time.monotonic() + 30
        while self._api_answers():
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"port {self._api_port()} on {self.host_name} still answers 30s "
                    f"after {self.unit} stopped: something else holds it, so the candidate could "
                    "not bind it"
                )
            time.sleep(1)

    def _api_port(self) -> int:
        """The API's port on the host (the tunnel's destination, else api_base's)."""
        if self.tunnel is not None:
            return self.tunnel.destination[1]
        return urlsplit(self.api_base).port or 80

    def _api_answers(self) -> bool:
        return self.tunnel.remote_answers() if self.tunnel else port_answers(self.api_base)

    def _check_programs(self) -> None:
        """Each program this backend runs can run, as the host runs it (sudo -n included)."""
        for program, argv in HOST_PROGRAMS.items():
            result = self.host.run(argv, timeout=30)
            if result.ok:
                continue
            if _sudo_refused(result):
                raise self._sudo_refusal(result)
            raise ConfigError(
                f"{self.host_name}: {result.describe()}. {program} is missing or does not run "
                "on the host. Nothing on the host was touched"
            )

    def _sudo_refusal(self, result: CommandResult) -> ConfigError:
        return ConfigError(
            f"{result.describe()}. sudo would ask for a password (or its rule "
            f"does not allow this program): this tool needs passwordless sudo for "
            f"{', '.join(HOST_PROGRAMS)} (see the README, 'A non-root user with sudo'). Nothing "
            "on the host was touched"
        )


def _sudo_refused(result: CommandResult) -> bool:
    return result.argv[:2] == ("sudo", "-n") and result.stderr.lstrip().startswith("sudo:")


_PROBE_SPEC = SpecConfig("probe", {"method": "ngram", "num_speculative_tokens": 1})


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
