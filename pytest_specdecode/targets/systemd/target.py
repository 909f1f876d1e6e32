"""The GPU host's vLLM unit over a Host: the original, candidates as drop-ins, a watchdog, a lock.

A candidate is the production unit itself with a runtime drop-in (see unitfile.py). What this
writes on the host, and where:
- /run/systemd/system/<unit>.d/zz-pytest-specdecode.conf: the candidate's drop-in. It exists only
  while a candidate is configured; /run is cleared at boot, so a reboot restores the original;
- /run/pytest-specdecode/: the lock (owner.txt, and `restoring` while a host-side restore runs)
  and restore.sh, the host-side restore;
- transient units pytest-specdecode-watchdog.{timer,service} (systemd-run). The timer runs
  restore.sh when the controller stops renewing; an interrupted controller starts the service
  at once. Nothing is ever written to /etc/systemd/system;
- with `--spec-arms together`, each candidate as a transient unit beside the running unit,
  specdecode-beside-<run>-<candidate>.service (beside.py); the unit itself is untouched;
- with a shape (--spec-shape), /run/pytest-specdecode-shape/<run>/config.json, and the drop-in
  serves the shape: its baseline too, in the original's window (shape.py).

It runs only the programs in HOST_PROGRAMS (inspection.py; no shell), so that a
non-root user can be given exactly those in a sudo rule; the Host wraps each command in
`sudo -n` where needed.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...config.specconfig import SpecConfig, VllmFacts
from ...config.target import check_unit_name
from ...config.vllm_argv import served_model
from ...errors import ConfigError, HostError, ServiceError
from ..base import Progress, Transports
from ..facts.model_config import ModelSite, hub_cache_of
from ..facts.vllm import ask_in_container, ask_vllm
from ..hosts.base import Host
from ..hosts.container import container_host
from .beside import BesideHost, BesideLaunch, beside_unit_prefix
from .inspection import UnitInspection
from .shape import ShapeHost, ShapeUnit
from .unitfile import (
    RUNTIME_UNIT_DIR,
    ExpandedExecStart,
    candidate_exec_start,
    dropin_path,
    dropin_run_id,
    effective_exec_start,
    own_dropins,
    render_dropin,
    shape_exec_start,
)
from .units import BesideUnit, SystemdUnit
from .watchdog import LOCK_DIR, RESTORE_SCRIPT, WATCHDOG, HostWatchdog

if TYPE_CHECKING:
    from ...config.shape.served import ServedShape
    from ..hosts.tunnel import ApiTunnel


class SystemdTarget(UnitInspection, HostWatchdog, BesideHost, ShapeHost):
    """A production unit on a host, and candidates as runtime drop-ins of that same unit.

    What it reads on the host is UnitInspection's; the lock, the watchdog and the handover are
    HostWatchdog's; candidates beside the running unit (`--spec-arms together`), BesideHost's;
    a shape's servers in the unit's window (`serve_shape`), ShapeHost's.
    """

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
        self._beside_units: list[BesideUnit] = []
        self.shape: ServedShape | None = None  # serve_shape: the unit's servers serve it
        self.found_active = True  # the unit as the run found it (only a shape's run may not)
        self._found: SystemdUnit | None = None
        self._wrote_shape = False
        self.tunnel: ApiTunnel | None = None

    def use_tunnel(self, tunnel: ApiTunnel) -> None:
        """Reach the API through SSH: every service of this target answers at `tunnel.url`."""
        assert self._original is None, "set the tunnel before the services are made"
        self.tunnel = tunnel
        self.api_base = tunnel.url

    # -- Target -------------------------------------------------------------------------------
    def preflight(self) -> None:
        self._refuse_if_locked()  # first: another run's lock explains every other state
        self._check_programs()
        text = self.unit_text()
        self._refuse_own_dropin(text)
        images = self.vllm_images
        render_dropin(self.unit, text, _PROBE_SPEC, run_id=self.run_id, images=images)
        if self.shape is not None:  # the shape's drop-ins too: refused here, not mid-run
            shape = self.shape
            render_dropin(self.unit, text, None, run_id=self.run_id, images=images, shape=shape)
        state = self.found_original().show()
        active = state.get("ActiveState")
        # A shape's baseline is its own: a stopped unit may serve it, and is left stopped.
        if active != "active" and not (self.shape is not None and active == "inactive"):
            raise ConfigError(
                f"unit {self.unit} on {self.host_name} is {active}/{state.get('SubState')}, "
                "not active: refusing to experiment. The tool restores the original to the "
                "state it found, and only a serving original is a baseline"
                + (" (with a shape: a serving or a stopped one)" if self.shape else "")
            )
        self.found_active = active == "active"
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

    def model_site(self) -> ModelSite:
        """Where the unit loads its models: the host, or its running container; read only."""
        where = f"unit {self.unit} on {self.host_name}"
        command = self.command()
        host: Host = self.host
        if command.server.image is not None:
            box = container_host(self.host, command.server)
            if box is None:
                raise ConfigError(
                    f"{where} runs vLLM in a container ({command.server.image}) without --name, "
                    "so a drafter's path cannot be checked where it is loaded; give it a --name"
                )
            host = box
        hub = None if host is not self.host else hub_cache_of(command.env.values)
        return ModelSite(host, where, served_model(command.argv, command.server), hub_cache=hub)

    def original(self) -> SystemdUnit:
        """The baseline: the unit as it runs, or the shape's baseline (a drop-in of its own)."""
        if self._original is None:
            self._original = SystemdUnit(self) if self.shape is None else ShapeUnit(self)
        return self._original

    def found_original(self) -> SystemdUnit:
        """What the restore puts back as it was found: the original itself, or the unit that
        the shape's baseline serves in place of (shape.py)."""
        if self.shape is None:
            return self.original()
        return ShapeHost.found_original(self)

    def before_swap(self) -> None:
        self._arm_watchdog()

    def candidate(self, spec: SpecConfig) -> SystemdUnit:
        """Configure the (stopped) unit as the candidate: write its drop-in, reload, check it."""
        if self.shape is not None:  # the unit stopped, the shape's folder and drop-in written
            self.configure_shape(spec)
            return SystemdUnit(self, spec)
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

    def beside(self, spec: SpecConfig) -> BesideUnit:
        """The candidate as a transient unit beside the running original, not yet started.

        Refused (ConfigError) where room_beside says there is no room; the original is never
        touched. The watchdog is armed first: its restore.sh stops this run's transient units.
        """
        launch = self.beside_launch(spec)
        self._arm_watchdog()
        api_base, tunnel = self.beside_api(launch)
        service = BesideUnit(self, spec, launch, api_base=api_base, tunnel=tunnel)
        self._beside_units.append(service)
        return service

    def live_beside(self) -> list[BesideLaunch]:
        """This run's transient units that systemd still has (they hold a port and cores)."""
        return [u.launch for u in self._beside_units if u.loaded()]

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        steps = [
            f"on {self.host_name}: lock {LOCK_DIR}; arm the watchdog: systemd-run --unit "
            f"{WATCHDOG} --on-active={self.watchdog_s:.0f}s /bin/sh {RESTORE_SCRIPT} (renewed "
            "while this controller runs); "
            + (f"measure {self.unit} as it runs" if self.shape is None else "serve the shape")
        ]
        if self.tunnel is not None:
            command = self.command()
            origin = f" (ExecStart as systemd expands it: {command.sources()})"
            steps.append(
                f"reach the API through SSH: {self.tunnel.describe()}"
                + (origin if command.used else "")
            )
        if self.shape is not None:
            return self.shape_plan(specs, steps)
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

    def await_host_restore(self, timeout_s: float, progress: Progress) -> None:
        """Wait until the host-side restore script has run to its end."""
        start = time.monotonic()
        last = start
        while self.host.run(["test", "-e", RESTORE_SCRIPT], timeout=30).ok:
            if time.monotonic() - start > timeout_s:
                raise ServiceError(
                    f"the host-side restore on {self.host_name} did not finish within "
                    f"{timeout_s:.0f}s; the unit is {self.found_original().state()}"
                    + self._watchdog_journal()
                )
            if time.monotonic() - last >= 15:
                last = time.monotonic()
                progress(f"  … the host is restoring {self.unit}: {self.found_original().state()}")
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
                self._stop_beside_units()
                self._disarm_watchdog()
                self._unlock()
                self.remove_shape_folder()  # the run's own: last, so that nothing waits on it
        finally:
            for service in self._beside_units:
                if service.tunnel is not None:
                    service.tunnel.close()
            self.host.close()
            if self._heartbeat_host is not None:
                self._heartbeat_host.close()
            if self.tunnel is not None:
                self.tunnel.close()

    def _stop_beside_units(self) -> None:
        """Stop whatever transient unit of this run is still there (the restore stops each one
        it started; this is for one it could not)."""
        if self._beside_units:
            pattern = f"{beside_unit_prefix(self.run_id)}*.service"
            self.host.run(["systemctl", "stop", pattern], timeout=180)

    # -- host files: every write and every removal goes through these two -------------------
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

    def _check_dropin_took_effect(self, spec: SpecConfig | None) -> None:
        """After the reload, `systemctl cat` must show our command as the one systemd runs."""
        text = self.host.check(["systemctl", "cat", self.unit], timeout=30).stdout
        where = f"unit {self.unit} on {self.host_name}"
        images = self.vllm_images
        if self.shape is not None:
            want = shape_exec_start(self.unit_text(), self.shape, spec, where=where, images=images)
        else:
            assert spec is not None
            want = candidate_exec_start(self.unit_text(), spec, where=where, images=images)
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


_PROBE_SPEC = SpecConfig("probe", {"method": "ngram", "num_speculative_tokens": 1})


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
