"""The systemd backend's host-side safety net: the lock, restore.sh, its watchdog, the handover.

SystemdTarget (target.py) inherits HostWatchdog. Everything lives under /run/pytest-specdecode
and in transient units (systemd-run); a reboot clears it all.
"""

from __future__ import annotations

import getpass
import shlex
import socket
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ...errors import ConfigError, HostError
from ...redaction import redact_text
from ..hosts.base import Host
from .beside import beside_unit_prefix
from .unitfile import SHAPE_ROOT, run_folder

if TYPE_CHECKING:
    from ...config.shape.served import ServedShape

STATE_DIR = "/run/pytest-specdecode"
LOCK_DIR = f"{STATE_DIR}/lock"
RESTORING = f"{LOCK_DIR}/restoring"  # says a host-side restore runs, and since when
RESTORE_SCRIPT = f"{STATE_DIR}/restore.sh"
WATCHDOG = "pytest-specdecode-watchdog"
HANDOVER_UNIT = "pytest-specdecode-restore"  # only if the watchdog's service cannot be started


class HostWatchdog:
    """The lock and the host-side restore of one SystemdTarget, which sets these attributes."""

    host: Host
    host_name: str
    unit: str
    dropin: str
    run_id: str
    watchdog_s: float
    restore_timeout_s: float
    dependents: dict[str, bool]
    shape: ServedShape | None  # a shape's run: restore.sh removes its folder too
    found_active: bool  # the unit was active when the run began: restore.sh starts it again
    _heartbeat_host: Host | None
    _heartbeat: threading.Thread | None
    _stop_heartbeat: threading.Event
    _locked: bool
    _armed: bool
    _handed_over: bool
    _closing: bool

    if TYPE_CHECKING:  # SystemdTarget's host files; UnitInspection's port

        def write_file(
            self, path: str, content: str, mode: str = "0644", *, host: Host | None = None
        ) -> None: ...

        def remove_files(self, *paths: str, empty_dir: str | None = None) -> None: ...

        def _api_port(self) -> int: ...

    # -- handover -------------------------------------------------------------------------------
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
            "# candidates beside the unit (--spec-arms together): transient, gone once stopped",
            f"systemctl stop {q(beside_unit_prefix(self.run_id) + '*.service')}",
            f"if [ -e {dropin} ]; then",
            f"  systemctl stop {unit}",
            f"  rm -f {dropin}",
            f"  rmdir --ignore-fail-on-non-empty {q(self.dropin.rsplit('/', 1)[0])}",
            "  systemctl daemon-reload",
            "fi",
        ]
        if self.shape is not None:
            lines += [
                "# the run's shape folder (its config.json, the map's drafters), this run's own",
                f"rm -rf -- {q(run_folder(self.shape.folder))}",
                f"rmdir -- {q(SHAPE_ROOT)} 2>/dev/null",
            ]
        if not self.found_active:  # a shape's run on a stopped unit: it stays stopped
            lines.append(f"# {self.unit} was stopped when the run began: it is left stopped")
        else:
            lines.append(f"systemctl start {unit}")
        if dependents and self.found_active:
            lines.append(
                "# units that the stop also stopped, and that were active when the run began"
            )
            lines.append("systemctl start " + " ".join(q(u) for u in dependents))
        port = self._api_port()
        if self.found_active:
            lines += [
                "# The lock says a restore is in progress until the original listens again.",
                f"i=0; while [ $i -lt {int(self.restore_timeout_s)} ] && command -v ss "
                f">/dev/null && ! ss -Htln 'sport = :{port}' | grep -q .; do sleep 2; "
                "i=$((i + 2)); done",
            ]
        lines += [
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
