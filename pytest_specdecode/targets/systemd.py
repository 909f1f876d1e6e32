"""The GPU host's vLLM unit over a Host: the original, candidates as drop-ins, a watchdog, a lock.

A candidate is the production unit itself with a runtime drop-in (see unitfile.py). What this
writes on the host, and where:
- /run/systemd/system/<unit>.d/zz-pytest-specdecode.conf: the candidate's drop-in. It exists only
  while a candidate is configured; /run is cleared at boot, so a reboot restores the original;
- /run/pytest-specdecode/: the lock (owner.txt, and `restoring` while a host-side restore runs)
  and restore.sh, the host-side restore;
- transient units pytest-specdecode-watchdog.{timer,service} (systemd-run). The timer runs
  restore.sh when the controller stops renewing; an interrupted controller starts the service
  at once. Nothing is ever written to /etc/systemd/system.

It runs only the programs in HOST_PROGRAMS (no shell), so that a non-root user can be given
exactly those in a sudo rule; the Host wraps each command in `sudo -n` where needed.
"""

from __future__ import annotations

import getpass
import json
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
from ..config.target import check_unit_name
from ..config.vllm_argv import host_address, option_value
from ..errors import ConfigError, HostError, ServiceError
from ..redaction import redact_text, register_secret_values
from . import gpu
from .base import Progress, Transports, port_answers
from .hosts import CommandResult, Host
from .unit_environment import (
    UnitEnvironment,
    parse_env_file,
    parse_environment_files,
    parse_manager_environment,
    parse_show_environment,
)
from .unitfile import (
    ANY_UNIT_NAME,
    DROPIN_NAME,
    RUNTIME_UNIT_DIR,
    ExpandedExecStart,
    candidate_exec_start,
    dropin_path,
    dropin_run_id,
    effective_exec_start,
    expand_exec_start,
    own_dropins,
    render_dropin,
)
from .vllm_facts import ask_in_container, ask_vllm

if TYPE_CHECKING:
    from .tunnel import ApiTunnel

STATE_DIR = "/run/pytest-specdecode"
LOCK_DIR = f"{STATE_DIR}/lock"
RESTORING = f"{LOCK_DIR}/restoring"  # says a host-side restore runs, and since when
RESTORE_SCRIPT = f"{STATE_DIR}/restore.sh"
WATCHDOG = "pytest-specdecode-watchdog"
HANDOVER_UNIT = "pytest-specdecode-restore"  # only if the watchdog's service cannot be started
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
    "rmdir": ("rmdir", "--version"),
    "cat": ("cat", "--version"),
    "test": ("test", "-d", "/"),
    "ss": ("ss", "-V"),
}
_INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")
# Reverse dependencies along which a stop of the unit propagates (Requires=, Requisite=,
# BindsTo=, PartOf=): those units stop with it and nothing starts them again by itself.
_STOPPED_WITH = ("RequiredBy", "RequisiteOf", "BoundBy", "ConsistsOf")
# Listeners of a container's published port that belong to the container engine, not the unit.
_CONTAINER_PROXIES = ("docker-proxy", "rootlessport", "slirp4netns", "pasta", "conmon")


class SystemdUnit:
    """The production unit on a host, seen as one Service: the original, or one candidate.

    Both are the same systemd unit. Which one runs is told by the candidate's drop-in: it is
    written only while the unit is stopped and removed only after it stopped, so the unit runs
    a candidate exactly when it is active with the drop-in present.
    """

    def __init__(self, target: SystemdTarget, spec: SpecConfig | None = None) -> None:
        self.target = target
        self.host = target.host
        self.unit = target.unit
        self.spec = spec
        self.api_base = target.api_base
        self.model = target.model
        where = f"unit {self.unit} on {target.host_name}"
        self.label = where if spec is None else f"candidate {spec.name}: {where} with {DROPIN_NAME}"
        self.progress = target.progress
        self._started_at: float | None = None
        self._restarts_at_start = 0
        self.gpu_notes: list[str] = []  # what the last stop saw on the GPUs besides the unit

    def show(self) -> dict[str, str]:
        result = self.host.check(
            ["systemctl", "show", self.unit, *(f"--property={p}" for p in _SHOW)], timeout=30
        )
        return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)

    def state(self) -> str:
        s = self.show()
        dropin = "present" if self.target.dropin_present() else "absent"
        return (
            f"{s.get('ActiveState')}/{s.get('SubState')} (NRestarts={s.get('NRestarts')}, "
            f"candidate drop-in {dropin})"
        )

    def is_active(self) -> bool:
        if self.show().get("ActiveState") not in ("active", "activating", "reloading"):
            return False
        return self.target.dropin_present() == (self.spec is not None)

    def start(self) -> None:
        if self.spec is None and self.target.dropin_present():
            # A candidate is configured (a restore that stopped half-way): stop it, drop it.
            self._systemctl("stop", timeout=180)
            self.target.remove_dropin()
        before = int(self.show().get("NRestarts") or 0)
        self._started_at = time.time()
        self._systemctl("start", timeout=120)
        # A manual start may reset NRestarts: a crash loop counts from the lower of the two.
        self._restarts_at_start = min(before, int(self.show().get("NRestarts") or 0))

    def stop(self) -> None:
        if self.spec is not None and not self.target.dropin_present():
            # The drop-in is gone: the host rebooted, or its watchdog restored the original.
            # The unit now runs the original, which is not this candidate's to stop.
            return
        before = gpu.snapshot_unit(self.host, self.unit)  # its PIDs, while they still run
        self._systemctl("stop", timeout=180)
        self._check_stopped(before)
        if self.spec is not None:
            self.target.remove_dropin()

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
    """A production unit on a host, and candidates as runtime drop-ins of that same unit."""

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
        vllm_images: Sequence[str] = (),
        restore_timeout_s: float = 3600.0,
    ) -> None:
        self.host = host
        self.progress = progress
        self.host_name = host.name
        self.unit = check_unit_name(unit)
        self.dropin = dropin_path(unit)
        self.api_base = api_base
        self.model = model
        self.watchdog_s = watchdog_s
        self.restore_timeout_s = restore_timeout_s  # bounds the host-side wait for the port
        self.vllm_images = tuple(vllm_images)
        # It goes into the restore script and the lock: nothing a shell could misread.
        machine = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64]
        self.run_id = f"{machine}-{os.getpid()}-{int(time.time())}"
        self.dependents: dict[str, bool] = {}  # units a stop of ours also stops -> active then
        self._heartbeat_host = heartbeat_host
        self._heartbeat: threading.Thread | None = None
        self._stop_heartbeat = threading.Event()
        self._original: SystemdUnit | None = None
        self._unit_text: str | None = None
        self._command: ExpandedExecStart | None = None
        self._boot_id: str | None = None
        self._locked = False
        self._armed = False
        self._handed_over = False
        self._closing = False
        self._wrote_dropin = False
        self.tunnel: ApiTunnel | None = None

    def use_tunnel(self, tunnel: ApiTunnel) -> None:
        """Reach the API through SSH: every service of this target answers at `tunnel.url`."""
        assert self._original is None, "set the tunnel before the services are made"
        self.tunnel = tunnel
        self.api_base = tunnel.url

    def api_address(self) -> tuple[str, int]:
        """Where the unit's API answers, as the host sees it: from ExecStart as systemd expands
        it, --host/--port, and for a container the -p that publishes that port."""
        where = f"unit {self.unit} on {self.host_name}"
        command = self.command()
        argv = command.server_argv  # a container's: inside it
        host = option_value(argv, "--host") or "127.0.0.1"
        port_text = option_value(argv, "--port") or "8000"  # vLLM's defaults
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            origin = f" ({command.sources()})" if command.used else ""
            raise ConfigError(
                f"{where}: --port {port_text!r}{origin} is not a port; cannot tell where its "
                "API listens"
            )
        host, port = host_address(command.server, (host, int(port_text)), where=where)
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host in ("::", "[::]"):
            host = "::1"
        return host, port

    def command(self) -> ExpandedExecStart:
        """The unit's ExecStart as its process receives it: words as systemd reports them, its
        variables from the unit's environment. Read once; refused when a variable is unset."""
        if self._command is None:
            where = f"unit {self.unit} on {self.host_name}"
            exec_start = effective_exec_start(
                self.unit_text(), where=where, images=self.vllm_images
            )
            self._command = expand_exec_start(
                exec_start,
                self.unit_environment(),
                where=where,
                images=self.vllm_images,
                words=self._systemd_words(),
            )
        return self._command

    def unit_environment(self) -> UnitEnvironment:
        """Environment= and EnvironmentFile= as systemd reports them, the files as they are now,
        over the manager's environment: what the next start of the unit expands ExecStart with.
        """
        where = f"unit {self.unit} on {self.host_name}"
        properties = ["--property=Environment", "--property=EnvironmentFiles"]
        shown = self.host.check(
            ["systemctl", "show", self.unit, *properties], timeout=30
        ).stdout.splitlines()
        assignments = [
            word
            for line in shown
            if line.startswith("Environment=")
            for word in parse_show_environment(line.split("=", 1)[1])
        ]
        manager = self.host.check(["systemctl", "show-environment"], timeout=30).stdout
        files: list[tuple[str, bool, dict[str, str] | None]] = []
        for path, optional in parse_environment_files(shown):
            got = self.host.run(["cat", "--", path], timeout=30)
            if got.ok:
                files.append((path, optional, parse_env_file(got.stdout)))
            elif optional and "No such file" in got.stderr:
                files.append((path, optional, None))
            else:
                raise ConfigError(
                    f"{where}: cannot read its EnvironmentFile={path} ({got.describe()}); "
                    "systemd would refuse to start the unit without it, so neither a candidate "
                    "nor the restore could start. Nothing was touched"
                )
        env = UnitEnvironment.merge(parse_manager_environment(manager), assignments, files)
        register_secret_values(env.values)  # a token in an EnvironmentFile is never shown
        return env

    def _systemd_words(self) -> list[str] | None:
        """ExecStart's words as the loaded unit has them (specifiers resolved), over D-Bus.

        `systemctl show -p ExecStart` joins the words with spaces; busctl keeps them apart.
        Readable by any user, so not under sudo. None where it cannot be asked.
        """
        path = "/org/freedesktop/systemd1/unit/" + bus_label(self.unit)
        argv = ["busctl", "--json=short", "get-property", "org.freedesktop.systemd1", path]
        argv += ["org.freedesktop.systemd1.Service", "ExecStart"]
        try:
            result = self.host.run(argv, timeout=30, privileged=False)
            commands = json.loads(result.stdout)["data"] if result.ok else []
        except (HostError, ValueError, KeyError, TypeError):
            return None
        if len(commands) != 1 or not isinstance(commands[0][1], list):
            return None
        return [str(word) for word in commands[0][1]]

    # -- Target -------------------------------------------------------------------------------
    def preflight(self) -> None:
        self._refuse_if_locked()  # first: another run's lock explains every other state
        self._check_programs()
        text = self.unit_text()
        self._refuse_own_dropin(text)
        render_dropin(self.unit, text, _PROBE_SPEC, run_id=self.run_id, images=self.vllm_images)
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
        writable = self.host.run(["test", "-w", RUNTIME_UNIT_DIR], timeout=30)
        if not writable.ok:
            raise ConfigError(
                f"{self.host_name}: {RUNTIME_UNIT_DIR} is not writable by "
                f"{self.host.name.split('@')[0]}; the candidate's drop-in cannot be written "
                "(connect as root, or as a user with the sudo rule of docs/remote-host.md)"
            )
        self.dependents = self._find_dependents()
        self._boot_id = self._read_boot_id()
        self._lock()
        try:
            self._arm_watchdog()  # from now on a silent controller is restored after
        except BaseException:
            self.close()
            raise

    def vllm_facts(self, progress: Progress | None = None) -> VllmFacts:
        """Asked of the Python in the unit's ExecStart, over SSH (in its running container, for
        a container unit); reads, never changes."""
        where = f"unit {self.unit} on {self.host_name}"
        command = self.command()
        if command.server.image is not None:
            return ask_in_container(self.host, command.server, where=where, progress=progress)
        return ask_vllm(self.host, command.argv, where=where, progress=progress)

    def original(self) -> SystemdUnit:
        if self._original is None:
            self._original = SystemdUnit(self)
        return self._original

    def before_swap(self) -> None:
        self._arm_watchdog()

    def candidate(self, spec: SpecConfig) -> SystemdUnit:
        """Configure the (stopped) unit as the candidate: write its drop-in, reload, check it."""
        self._arm_watchdog()
        self._check_port_free()
        content = render_dropin(
            self.unit, self.unit_text(), spec, run_id=self.run_id, images=self.vllm_images
        )
        self._wrote_dropin = True
        self.write_file(self.dropin, content)
        self.host.check(["systemctl", "daemon-reload"], timeout=60)
        self._check_dropin_took_effect(spec)
        return SystemdUnit(self, spec)

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        steps = [
            f"on {self.host_name}: lock {LOCK_DIR}; arm the watchdog: systemd-run --unit "
            f"{WATCHDOG} --on-active={self.watchdog_s:.0f}s /bin/sh {RESTORE_SCRIPT} (renewed "
            f"while this controller runs); measure {self.unit} as it runs"
        ]
        if self.tunnel is not None:
            command = self.command()
            origin = f" (ExecStart as systemd expands it: {command.sources()})"
            steps.append(
                f"reach the API through SSH: {self.tunnel.describe()}"
                + (origin if command.used else "")
            )
        for spec in specs:
            text = render_dropin(
                self.unit, self.unit_text(), spec, run_id=self.run_id, images=self.vllm_images
            )
            steps += [
                f"systemctl stop {self.unit} (the original or the previous candidate); check "
                "that its process is gone and the port free",
                f"write {self.dropin} (runtime only: /run is cleared at boot, so a reboot brings "
                "back the original by itself):\n" + _indent(text),
                f"systemctl daemon-reload; systemctl start {self.unit} (now candidate {spec.name})",
            ]
        steps += [
            f"restore: systemctl stop {self.unit}; rm {self.dropin}; systemctl daemon-reload; "
            f"systemctl start {self.unit}; wait until healthy; start again the units that its "
            "stop also stopped (BindsTo=/Requires=/PartOf=) and that were active; disarm the "
            "watchdog; unlock. On Ctrl-C, SIGTERM or SIGHUP the host runs this restore itself at "
            f"once ({WATCHDOG}.service runs {RESTORE_SCRIPT})",
        ]
        return steps

    def transports(self) -> Transports:
        return Transports()

    def hand_over(self, reason: str) -> str | None:
        """Start the host-side restore now; it completes even if this controller dies next.

        Runs on a thread of its own, from the first signal, over the heartbeat's connection.
        """
        if not (self._locked and self._armed) or self._handed_over or self._closing:
            return None
        host = self._heartbeat_host or self.host
        if not self._lock_is_ours(host):
            return None  # rebooted, or restored already: another run may hold the host now
        status = (
            f"restore in progress since {_now()}: handed to the host by run {self.run_id} "
            f"({reason})"
        )
        self.write_file(RESTORING, status + "\n", host=host)
        started = host.run(["systemctl", "start", "--no-block", f"{WATCHDOG}.service"], timeout=15)
        unit = f"{WATCHDOG}.service"
        if not started.ok:  # the watchdog's units are gone: run the same script on its own
            host.check(
                ["systemd-run", f"--unit={HANDOVER_UNIT}", "--collect", "/bin/sh", RESTORE_SCRIPT],
                timeout=15,
            )
            unit = f"{HANDOVER_UNIT}.service"
        self._handed_over = True
        self._stop_heartbeat.set()
        return f"{unit} on {self.host_name} runs {RESTORE_SCRIPT}"

    def await_host_restore(self, timeout_s: float, progress: Progress) -> None:
        """Wait until the host-side restore script has run to its end."""
        start = time.monotonic()
        last = start
        while self.host.run(["test", "-e", RESTORE_SCRIPT], timeout=30).ok:
            if time.monotonic() - start > timeout_s:
                raise ServiceError(
                    f"the host-side restore on {self.host_name} did not finish within "
                    f"{timeout_s:.0f}s; the unit is {self.original().state()}"
                    + self._watchdog_journal()
                )
            if time.monotonic() - last >= 15:
                last = time.monotonic()
                progress(f"  … the host is restoring {self.unit}: {self.original().state()}")
            time.sleep(1)

    def reachable(self) -> bool:
        try:
            return self.host.run(["true"], timeout=15).ok
        except HostError:
            return False

    def after_restore(self) -> list[str]:
        """Start again the dependents that were active at the start; say what was done."""
        notes: list[str] = []
        boot = self._read_boot_id()
        if self._boot_id and boot and boot != self._boot_id:
            notes.append(
                f"{self.host_name} rebooted during the run: the candidate's runtime drop-in went "
                "with /run, and the original came back by itself"
            )
        wanted = [u for u, active in self.dependents.items() if active]
        if not wanted:
            return notes
        states = self._active_states(wanted)
        stopped = [u for u in wanted if states.get(u) != "active"]
        if stopped:
            self.host.run(["systemctl", "start", *stopped], timeout=180)
            states = self._active_states(wanted)
            back = [u for u in stopped if states.get(u) == "active"]
            if back:
                depend = "it depends" if len(back) == 1 else "they depend"
                notes.append(
                    f"started again {', '.join(back)} (stopped with {self.unit}, which {depend} "
                    "on; active when the run began)"
                )
            still = [f"{u} is {states.get(u)}" for u in stopped if u not in back]
            if still:
                raise ServiceError(
                    f"units that depend on {self.unit} on {self.host_name} did not start again: "
                    + "; ".join(still)
                )
        if len(stopped) < len(wanted):
            notes.append(
                "active again: "
                + ", ".join(u for u in wanted if u not in stopped)
                + f" (they depend on {self.unit})"
            )
        return notes

    def close(self) -> None:
        """Called after the restore: remove this run's traces, then let go of the host."""
        self._closing = True
        try:
            if self._handed_over:
                self._stop_heartbeat.set()  # the host's restore removes the rest itself
            elif self._locked and not self._lock_is_ours():
                # Rebooted, or restored by the watchdog and perhaps locked by another run since:
                # nothing on the host is this run's any more.
                self._stop_heartbeat.set()
                self._locked = self._armed = False
            else:
                self._remove_dropin_if_written()
                self._disarm_watchdog()
                self._unlock()
        finally:
            self.host.close()
            if self._heartbeat_host is not None:
                self._heartbeat_host.close()
            if self.tunnel is not None:
                self.tunnel.close()

    # -- host files: every write and every removal goes through these two -------------------
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

    def write_file(
        self, path: str, content: str, mode: str = "0644", *, host: Host | None = None
    ) -> None:
        """Atomically: a temporary file beside it, then rename. Content goes by stdin only.

        `install -D` creates missing parent directories (0755), e.g. a drop-in's `<unit>.d/`.
        """
        if not re.fullmatch(r"0[0-7]{3}", mode) or not path.startswith("/") or ".." in path:
            raise ValueError(f"write_file: refusing path {path!r} or mode {mode!r}")
        tmp = f"{path}.tmp"
        on = host or self.host
        on.check(["install", "-m", mode, "-D", "/dev/stdin", tmp], stdin=content, timeout=60)
        on.check(["mv", "-f", tmp, path], timeout=30)

    def remove_files(self, *paths: str, empty_dir: str | None = None) -> None:
        """rm -rf the paths; then rmdir `empty_dir` if nothing else is in it."""
        self.host.check(["rm", "-rf", "--", *paths], timeout=30)
        if empty_dir:
            self.host.run(["rmdir", "--ignore-fail-on-non-empty", "--", empty_dir], timeout=30)

    # -- the candidate's drop-in ---------------------------------------------------------------
    def dropin_present(self) -> bool:
        return self.host.run(["test", "-e", self.dropin], timeout=30).ok

    def remove_dropin(self) -> None:
        """Remove the drop-in (the unit is stopped) and reload: the original is configured."""
        self.remove_files(self.dropin, empty_dir=self.dropin.rsplit("/", 1)[0])
        self.host.check(["systemctl", "daemon-reload"], timeout=60)

    def _remove_dropin_if_written(self) -> None:
        if self._wrote_dropin and self.dropin_present():
            self.host.run(["systemctl", "stop", self.unit], timeout=180)
            self.remove_dropin()

    def _check_dropin_took_effect(self, spec: SpecConfig) -> None:
        """After the reload, `systemctl cat` must show our command as the one systemd runs."""
        text = self.host.check(["systemctl", "cat", self.unit], timeout=30).stdout
        where = f"unit {self.unit} on {self.host_name}"
        want = candidate_exec_start(self.unit_text(), spec, where=where, images=self.vllm_images)
        try:
            got = effective_exec_start(text, where=where, images=self.vllm_images)
            ok = got.prefix + " ".join(t.raw for t in got.tokens) == want
        except ConfigError:
            ok = False
        if not ok:
            self.remove_dropin()
            raise ServiceError(
                f"{where}: after writing {self.dropin} and daemon-reload, the unit's ExecStart "
                "is not the candidate's (another drop-in overrides it?); the drop-in was removed"
            )

    def _refuse_own_dropin(self, text: str) -> None:
        """A drop-in of this tool already in place means a candidate may be what runs now."""
        found = own_dropins(text)
        if not found:
            return
        path, body = found[0]
        raise ConfigError(
            f"unit {self.unit} on {self.host_name} has pytest-specdecode's drop-in {path} (run "
            f"{dropin_run_id(body) or 'unknown'}), and no run holds the host's lock: it may be "
            f"running a candidate, not the original. Remove it, run `systemctl daemon-reload` "
            f"and restart {self.unit} (or reboot the host). Nothing was touched"
        )

    # -- dependents -----------------------------------------------------------------------------
    def _find_dependents(self) -> dict[str, bool]:
        """Units that a stop of ours also stops, recursively, and whether each is active now."""
        found: dict[str, bool] = {}
        frontier = [self.unit]
        while frontier and len(found) < 200:
            props = ["Id", "ActiveState", *_STOPPED_WITH]
            result = self.host.run(
                ["systemctl", "show", *(f"--property={p}" for p in props), *frontier], timeout=30
            )
            if not result.ok:
                break
            next_frontier: list[str] = []
            for block in result.stdout.split("\n\n"):
                values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
                if values.get("Id") and values["Id"] != self.unit:
                    found[values["Id"]] = values.get("ActiveState") == "active"
                for prop in _STOPPED_WITH:
                    for name in values.get(prop, "").split():
                        if name not in found and name != self.unit and ANY_UNIT_NAME.match(name):
                            found.setdefault(name, False)
                            next_frontier.append(name)
            frontier = next_frontier
        return found

    def _active_states(self, units: Sequence[str]) -> dict[str, str]:
        result = self.host.run(
            ["systemctl", "show", "--property=Id", "--property=ActiveState", *units], timeout=30
        )
        out: dict[str, str] = {}
        for block in result.stdout.split("\n\n"):
            values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if "Id" in values:
                out[values["Id"]] = values.get("ActiveState", "")
        return out

    def _read_boot_id(self) -> str | None:
        try:
            result = self.host.run(["cat", "/proc/sys/kernel/random/boot_id"], timeout=15)
        except HostError:
            return None
        return result.stdout.strip() if result.ok else None

    # -- lock -------------------------------------------------------------------------------------
    def _lock(self) -> None:
        owner = (
            f"run {self.run_id} by {getpass.getuser()} on {socket.gethostname()} since "
            f"{_now()}, unit {self.unit}"
        )
        self.host.check(["mkdir", "-p", "-m", "0700", STATE_DIR], timeout=30)
        got = self.host.run(["mkdir", LOCK_DIR], timeout=30)
        if not got.ok:
            self._refuse_if_locked()
            raise ConfigError(f"{self.host_name}: cannot create {LOCK_DIR}: {got.describe()}")
        self._locked = True
        self.write_file(f"{LOCK_DIR}/owner.txt", owner + "\n")

    def _refuse_if_locked(self) -> None:
        held = self._lock_text()
        if held is not None:
            raise ConfigError(
                f"{self.host_name} is locked by another experiment ({held or 'owner unknown'}); "
                f"nothing was touched. If that run is dead and its watchdog gone, remove "
                f"{LOCK_DIR} on the host"
            )

    def _lock_text(self) -> str | None:
        """Who holds the lock, and whether a host-side restore runs for it; None: no lock."""
        if not self.host.run(["test", "-d", LOCK_DIR], timeout=30).ok:
            return None
        # either file may be missing: cat then fails, but prints the other
        result = self.host.run(["cat", f"{LOCK_DIR}/owner.txt", RESTORING], timeout=30)
        return "; ".join(line.strip() for line in result.stdout.splitlines() if line.strip())

    def _lock_is_ours(self, host: Host | None = None) -> bool:
        try:
            result = (host or self.host).run(["cat", f"{LOCK_DIR}/owner.txt"], timeout=30)
        except HostError:
            return False
        return result.ok and result.stdout.startswith(f"run {self.run_id} ")

    def _unlock(self) -> None:
        if self._locked:
            if self._lock_is_ours():
                self.remove_files(LOCK_DIR)
            self._locked = False

    # -- watchdog -----------------------------------------------------------------------------
    def restore_script(self) -> str:
        """The host-side restore: what the watchdog runs, and what a signal hands over."""
        q = shlex.quote
        unit, dropin = q(self.unit), q(self.dropin)
        owner = q(f"{LOCK_DIR}/owner.txt")
        mine = f"grep -qsF {q(f'run {self.run_id} ')} {owner}"
        dependents = [u for u, active in self.dependents.items() if active]
        lines = [
            "#!/bin/sh",
            f"# pytest-specdecode run {self.run_id}: put {self.unit} back as it was found.",
            "# Run by the watchdog's timer when the controller stops renewing, or at once when",
            "# the controller is interrupted. Each step is idempotent.",
            f'{mine} || {{ echo "lock not held by run {self.run_id}: nothing to restore"; '
            "exit 0; }",
            f'[ -e {q(RESTORING)} ] || echo "restore in progress since $(date -u +%FT%TZ): the '
            f'watchdog fired (run {self.run_id} was silent for {self.watchdog_s:.0f}s)" > '
            f"{q(RESTORING)}",
            f"systemctl stop {q(WATCHDOG + '.timer')}",
            f"if [ -e {dropin} ]; then",
            f"  systemctl stop {unit}",
            f"  rm -f {dropin}",
            f"  rmdir --ignore-fail-on-non-empty {q(self.dropin.rsplit('/', 1)[0])}",
            "  systemctl daemon-reload",
            "fi",
            f"systemctl start {unit}",
        ]
        if dependents:
            lines.append(
                "# units that the stop also stopped, and that were active when the run began"
            )
            lines.append("systemctl start " + " ".join(q(u) for u in dependents))
        port = self._api_port()
        lines += [
            "# The lock says a restore is in progress until the original listens again.",
            f"i=0; while [ $i -lt {int(self.restore_timeout_s)} ] && command -v ss >/dev/null "
            f"&& ! ss -Htln 'sport = :{port}' | grep -q .; do sleep 2; i=$((i + 2)); done",
            f"{mine} && rm -rf {q(LOCK_DIR)}",
            f"rm -f {q(RESTORE_SCRIPT)}",
            f'echo "restored {self.unit} for run {self.run_id}"',
            "",
        ]
        return "\n".join(lines)

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
                    return  # the host restores on its own: stop renewing
                # Restarting the timer re-arms --on-active from now; never once a restore runs
                # (this controller's own handover sets _stop_heartbeat before it writes RESTORING).
                if host.run(["test", "-e", RESTORING], timeout=30).ok:
                    return
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
        self.remove_files(RESTORE_SCRIPT)
        self._armed = False

    def _watchdog_journal(self) -> str:
        result = self.host.run(
            ["journalctl", "-u", f"{WATCHDOG}.service", "-n", "20", "-o", "cat", "--no-pager"],
            timeout=30,
        )
        lines = [redact_text(line) for line in result.stdout.splitlines() if line.strip()]
        return ("\n--- the host-side restore's journal ---\n" + "\n".join(lines)) if lines else ""

    # -- ports ----------------------------------------------------------------------------------
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
        container = effective_exec_start(
            self.unit_text(), where=f"unit {self.unit}", images=self.vllm_images
        ).server.image
        if not port_held_by_unit(owners, self.unit, container=container is not None):
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
                    f"after {self.unit} stopped: something else holds it (a container that "
                    "outlived its unit? give the unit ExecStop=docker stop NAME), so the "
                    "candidate could not bind it"
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


def bus_label(name: str) -> str:
    """A unit name as a D-Bus object path element: other than [A-Za-z0-9] as _XX (hex)."""
    return "".join(
        c if c.isascii() and c.isalnum() and not (i == 0 and c.isdigit()) else f"_{ord(c):02x}"
        for i, c in enumerate(name)
    )


def _sudo_refused(result: CommandResult) -> bool:
    return result.argv[:2] == ("sudo", "-n") and result.stderr.lstrip().startswith("sudo:")


def port_held_by_unit(owners: str, unit: str, *, container: bool) -> bool:
    """Whether the listeners ("pid comm cgroups…", a line each) are the unit's, or its
    container's."""
    for line in owners.splitlines():
        if f"/{unit}" in line:
            continue
        parts = line.split()
        comm = parts[1] if len(parts) > 1 else ""
        if container and (
            comm in _CONTAINER_PROXIES or re.search(r"/(docker|libpod)-[0-9a-f]{12,}", line)
        ):
            continue
        return False
    return True


_PROBE_SPEC = SpecConfig("probe", {"method": "ngram", "num_speculative_tokens": 1})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
