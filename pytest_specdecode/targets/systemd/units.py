"""The production unit as a Service: the original, one candidate (the same unit with a drop-in),
or a candidate's transient unit beside it. Started, stopped and read through systemctl and
journalctl on the target's host."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Protocol

from ...config.specconfig import SpecConfig
from ...errors import HostError, ServiceError
from ...redaction import redact_text
from ..base import Progress
from ..facts import gpu
from ..hosts.base import Host
from .beside import BesideLaunch
from .unitfile import DROPIN_NAME

if TYPE_CHECKING:
    from ..hosts.tunnel import ApiTunnel


class UnitOwner(Protocol):
    """What a unit needs of its target (target.py → SystemdTarget)."""

    host: Host
    unit: str
    api_base: str
    model: str
    progress: Progress

    @property
    def host_name(self) -> str: ...

    def dropin_present(self) -> bool: ...

    def remove_dropin(self) -> None: ...


# Journal lines that mean the engine is dead although the unit may still look active.
ENGINE_DEATH = re.compile(
    r"EngineCore failed|Engine core initialization failed|EngineDeadError|InvalidCxxCompiler"
    r"|CUDA out of memory|OutOfMemoryError|Traceback \(most recent call last\)"
)
GPU_RELEASE_TIMEOUT_S = 60.0  # H200: 0.2 s after the process; big multi-GPU servers longer
_SHOW = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")
_INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")
# The journal lines a start's settings are read from (record/engine_settings.py).
SETTINGS_LINES = (
    "non-default args|Initializing a V1 LLM engine|version |WARNING|sync scheduling|"
    "Asynchronous scheduling|"
    "Model Runner|model runner"
)
_START_LOG_LINES = 20000  # a failed start's journal, read whole up to this


class SystemdUnit:
    """The production unit on a host, seen as one Service: the original, or one candidate.

    Both are the same systemd unit. Which one runs is told by the candidate's drop-in: it is
    written only while the unit is stopped and removed only after it stopped, so the unit runs
    a candidate exactly when it is active with the drop-in present. `configured`: whether this
    service is the unit with a drop-in of this run's (a candidate; shape.py's baseline too).
    """

    def __init__(self, target: UnitOwner, spec: SpecConfig | None = None) -> None:
        self.target = target
        self.host = target.host
        self.unit = target.unit
        self.spec = spec
        self.configured = spec is not None
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
        return self.target.dropin_present() == self.configured

    def start(self) -> None:
        if not self.configured and self.target.dropin_present():
            # A candidate is configured (a restore that stopped half-way): stop it, drop it.
            self._systemctl("stop", timeout=180)
            self.target.remove_dropin()
        before = int(self.show().get("NRestarts") or 0)
        self._started_at = time.time()
        self._systemctl("start", timeout=120)
        # A manual start may reset NRestarts: a crash loop counts from the lower of the two.
        self._restarts_at_start = min(before, int(self.show().get("NRestarts") or 0))

    def stop(self) -> None:
        if self.configured and not self.target.dropin_present():
            # The drop-in is gone: the host rebooted, or its watchdog restored the original.
            # The unit now runs the original, which is not this candidate's to stop.
            return
        before = gpu.snapshot_unit(self.host, self.unit)  # its PIDs, while they still run
        self._systemctl("stop", timeout=180)
        self._check_stopped(before)
        if self.configured:
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

    def start_log(self) -> list[str]:
        """The journal of the unit since this run started it (its restarts too), oldest first."""
        return self._journal(_START_LOG_LINES, since_start=self._started_at is not None)

    def settings_log(self) -> list[str]:
        """The lines of the unit's current run that tell its settings (journalctl --grep), so
        a unit that has served for weeks is not read whole; else its newest 5000 lines."""
        invocation = self.host.run(
            ["systemctl", "show", "-p", "InvocationID", "--value", self.unit], timeout=30
        ).stdout.strip()
        if not _INVOCATION_ID.match(invocation):
            return []
        match = [f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager"]
        try:
            found = self.host.run(["journalctl", *match, "--grep", SETTINGS_LINES], timeout=60)
            if not found.ok and "grep" in found.stderr.lower():  # built without PCRE2
                found = self.host.run(["journalctl", *match, "-r", "-n", "5000"], timeout=60)
                return [redact_text(x) for x in found.stdout.splitlines() if x.strip()][::-1]
        except HostError:
            return []
        return [redact_text(x) for x in found.stdout.splitlines() if x.strip()]

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


class BesideUnit(SystemdUnit):
    """The candidate, as a transient unit beside the production unit (which it never touches).

    Its facts are SystemdUnit's, read of the transient unit: is_active, failure, log_tail,
    start_log and settings_log from `systemctl show` and its journal.
    """

    def __init__(
        self,
        target: UnitOwner,
        spec: SpecConfig,
        launch: BesideLaunch,
        *,
        api_base: str,
        tunnel: ApiTunnel | None = None,
    ) -> None:
        super().__init__(target, spec)
        self.unit = launch.name
        self.original_unit = target.unit
        self.launch = launch
        self.api_base = api_base
        self.tunnel = tunnel
        self.label = (
            f"candidate {spec.name}: transient unit {launch.name} beside {target.unit} on "
            f"{target.host_name}"
        )

    def loaded(self) -> bool:
        """Whether systemd knows the unit now (a transient unit is gone once it stopped)."""
        result = self.host.run(
            ["systemctl", "show", self.unit, "--property=LoadState", "--value"], timeout=30
        )
        return result.ok and result.stdout.strip() == "loaded"

    def is_active(self) -> bool:
        return self.show().get("ActiveState") in ("active", "activating", "reloading")

    def start(self) -> None:
        if self.loaded():
            raise ServiceError(
                f"{self.label}: a unit of that name is already loaded ({self.state()}); "
                "nothing was started"
            )
        self._started_at = time.time()
        result = self.host.run(self.launch.run_argv, timeout=60)
        if not result.ok:
            raise ServiceError(
                f"{self.label}: systemd-run failed: {redact_text(result.describe())}; the unit "
                f"is now {self.state()}. The original {self.original_unit} was not touched"
            )

    def stop(self) -> None:
        """Stop it (if systemd still has it) and check nothing of it lingers; close its tunnel."""
        try:
            if self.loaded():
                before = gpu.snapshot_unit(self.host, self.unit)
                self._systemctl("stop", timeout=180)
                self._check_stopped(before)
        finally:
            if self.tunnel is not None:
                self.tunnel.close()
                self.tunnel = None

    def state(self) -> str:
        s = self.show()
        return (
            f"{s.get('ActiveState')}/{s.get('SubState')} (MainPID={s.get('MainPID')}, "
            f"Result={s.get('Result')})"
        )

    def failure(self) -> str | None:
        if self._started_at is not None and not self.loaded():
            return "the transient unit is gone: its process exited (--collect removed it)"
        return super().failure()
