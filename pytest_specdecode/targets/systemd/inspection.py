"""What the systemd backend reads on the host and never changes: the unit as systemd has it (its
text, ExecStart expanded, its environment, where its API listens) and the preflight's checks
(programs, port owner, dependents, boot id). SystemdTarget (target.py) inherits UnitInspection.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ...config.vllm_argv import host_address, option_value
from ...errors import ConfigError, HostError, ServiceError
from ...redaction import register_secret_values
from ..base import port_answers
from ..hosts.base import CommandResult, Host
from .unit_environment import (
    UnitEnvironment,
    parse_env_file,
    parse_environment_files,
    parse_manager_environment,
    parse_show_environment,
)
from .unitfile import (
    ANY_UNIT_NAME,
    ExpandedExecStart,
    effective_exec_start,
    expand_exec_start,
)

if TYPE_CHECKING:
    from ..hosts.tunnel import ApiTunnel

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
# Reverse dependencies along which a stop of the unit propagates (Requires=, Requisite=,
# BindsTo=, PartOf=): those units stop with it and nothing starts them again by itself.
_STOPPED_WITH = ("RequiredBy", "RequisiteOf", "BoundBy", "ConsistsOf")
# Listeners of a container's published port that belong to the container engine, not the unit.
_CONTAINER_PROXIES = ("docker-proxy", "rootlessport", "slirp4netns", "pasta", "conmon")


class UnitInspection:
    """Reads of the host for one SystemdTarget, which sets these attributes."""

    host: Host
    host_name: str
    unit: str
    api_base: str
    vllm_images: tuple[str, ...]
    tunnel: ApiTunnel | None
    _unit_text: str | None
    _command: ExpandedExecStart | None

    # -- the unit as systemd has it -------------------------------------------------------------
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
            f"{', '.join(HOST_PROGRAMS)} (see docs/remote-host.md, 'A non-root user with "
            "sudo'). Nothing on the host was touched"
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
