"""The candidate as a transient unit beside the running production unit (`--spec-arms together`).

The production unit keeps serving, as the baseline arm: nothing of it is stopped, restarted or
rewritten. The candidate runs as

    systemd-run --unit=specdecode-beside-<run>-<candidate>.service --collect \
        --property=Environment=… --property=EnvironmentFile=… --property=User=… … \
        -- /usr/bin/env CUDA_VISIBLE_DEVICES=<free GPUs> <the original's command> \
           --port <a free port> --speculative-config <JSON>

with the original's command as its process receives it (ExecStart, systemd's specifiers and
variables resolved), its Environment= and EnvironmentFile= (the same files, read by systemd, so
their values never travel), User=, Group= and WorkingDirectory=. Where it runs comes from
beside/room.py. It leaves nothing behind: a transient unit vanishes when it stops, `--collect`
removes it when it failed, a reboot removes it by nature, and the watchdog's restore.sh stops
this run's transient units (watchdog.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from ...config.specconfig import SpecConfig
from ...config.target import check_unit_name
from ...config.vllm_argv import with_speculative_config
from ...errors import ConfigError
from ...redaction import redact_text
from ..beside.room import (
    UnitPlacement,
    cpu_placement,
    first_free_port,
    gpu_placement,
    listening_ports,
    parse_cpu_list,
    with_unit_port,
)
from ..facts import gpu
from ..hosts.base import Host
from .unit_environment import (
    UnitEnvironment,
    parse_environment_files,
    parse_show_environment,
)

if TYPE_CHECKING:  # paramiko only where a host is reached over SSH (the GPU kit has none)
    from ...config.shape.served import ServedShape
    from ..hosts.tunnel import ApiTunnel
    from .unitfile import ExpandedExecStart

BESIDE_PREFIX = "specdecode-beside"
# Properties of the production unit that the transient unit takes over as they are.
COPIED_PROPERTIES = ("User", "Group", "WorkingDirectory")
_PLAIN_PROPERTY = re.compile(r"^[-!~]?[A-Za-z0-9_./@:+-]*$")


def beside_unit_prefix(run_id: str) -> str:
    """The start of every transient unit name of one run (restore.sh stops them by pattern)."""
    return f"{BESIDE_PREFIX}-{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)[:120]}-"


def beside_unit_name(run_id: str, spec_name: str) -> str:
    """`specdecode-beside-<run>-<candidate>.service`, checked as a plain unit name."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", spec_name)[:60] or "candidate"
    return check_unit_name(f"{beside_unit_prefix(run_id)}{slug}.service")


def quote_property(value: str) -> str:
    """One word of a --property= list value (Environment=), double-quoted, C-escaped, the way
    systemd-run splits it (no `$` or `%` expansion happens there)."""
    _refuse_control(value, "a property value")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_word(word: str) -> str:
    """One word of the transient unit's command: systemd expands `$NAME` in it when it starts
    the unit, so a `$` the word really holds is written `$$`."""
    _refuse_control(word, "a command word")
    return word.replace("$", "$$")


def systemd_run_argv(
    name: str,
    argv: Sequence[str],
    *,
    description: str,
    environment: Sequence[str],
    environment_files: Sequence[tuple[str, bool]],
    copied: Mapping[str, str],
    placement: UnitPlacement,
    extra_env: Mapping[str, str] | None = None,
) -> list[str]:
    """The systemd-run command line that starts the transient unit (argv, no shell)."""
    _refuse_control(description, "the description")
    out = ["systemd-run", f"--unit={check_unit_name(name)}", "--collect"]
    out.append(f"--description={description}")
    for assignment in environment:
        out.append(f"--property=Environment={quote_property(assignment)}")
    for path, optional in environment_files:
        if not path.startswith("/") or not _PLAIN_PROPERTY.match(path):
            raise ConfigError(f"{name}: EnvironmentFile={path!r} is not a plain absolute path")
        out.append(f"--property=EnvironmentFile={'-' if optional else ''}{path}")
    for key, value in copied.items():
        if value:
            if not _PLAIN_PROPERTY.match(value):
                raise ConfigError(f"{name}: {key}={value!r} is not a plain value")
            out.append(f"--property={key}={value}")
    out += [f"--property={p}" for p in placement.properties]
    pinned = [f"{k}={v}" for k, v in {**(extra_env or {}), **placement.env}.items()]
    return [*out, "--", "/usr/bin/env", *map(command_word, [*pinned, *argv])]


def _refuse_control(text: str, what: str) -> None:
    if any(c in text for c in "\n\r\0"):
        raise ConfigError(f"refusing a control character in {what} of a transient unit")


def with_port_in_url(api_base: str, port: int) -> str:
    parts = urlsplit(api_base)
    host = parts.hostname or "127.0.0.1"
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit((parts.scheme or "http", netloc, parts.path, "", ""))


@dataclass(frozen=True)
class BesideLaunch:
    """How one candidate is started beside the original: decided before anything is touched."""

    name: str  # the transient unit
    run_argv: list[str]  # systemd-run's command line
    address: tuple[str, int]  # where its API listens, as the host sees it
    placement: UnitPlacement

    @property
    def port(self) -> int:
        return self.address[1]


class BesideHost:
    """Room for, and the launch of, candidates beside the running unit, for one SystemdTarget
    (which sets these attributes and inherits this)."""

    host: Host
    host_name: str
    unit: str
    run_id: str
    api_base: str
    tunnel: ApiTunnel | None
    vllm_images: tuple[str, ...]
    shape: ServedShape | None

    if TYPE_CHECKING:  # UnitInspection's

        def command(self) -> ExpandedExecStart: ...

        def api_address(self) -> tuple[str, int]: ...

        def unit_environment(self) -> UnitEnvironment: ...

        def live_beside(self) -> list[BesideLaunch]: ...  # SystemdTarget's

    def room_beside(self, spec: SpecConfig) -> str | None:
        """None where a second copy fits beside the original; else why not (host, unit,
        figures). Reads only."""
        if self.shape is not None:
            return (
                f"unit {self.unit} on {self.host_name} serves the shape in its own window, one "
                "server at a time: a second one beside it is not served on a unit (docs/shape.md)"
            )
        found = self._beside_placement()
        return found if isinstance(found, str) else None

    def beside_launch(self, spec: SpecConfig) -> BesideLaunch:
        """The transient unit for `spec`: its name, port, devices or cores, and command line."""
        where = f"unit {self.unit} on {self.host_name}"
        command = self.command()
        if command.server.image is not None:
            raise ConfigError(
                f"{where} runs vLLM in a container ({command.server.image}): a second copy "
                "beside it would need a container name and port mapping of its own, which this "
                "tool does not derive; run its arms one at a time. Nothing was touched"
            )
        placement = self._beside_placement()
        if isinstance(placement, str):
            raise ConfigError(f"{placement}. Nothing was touched")
        listen_host, original_port = self.api_address()
        port = self._free_port(original_port)
        argv = with_unit_port(command.argv, command.server.server_args, port)
        argv = with_speculative_config(argv, spec, where=where, images=self.vllm_images)
        environment, files, copied = self._copied_properties()
        name = beside_unit_name(self.run_id, spec.name)
        run_argv = systemd_run_argv(
            name,
            argv,
            description=f"pytest-specdecode candidate {spec.name} beside {self.unit}",
            environment=environment,
            environment_files=files,
            copied=copied,
            placement=placement,
            extra_env=spec.env,
        )
        return BesideLaunch(name, run_argv, (listen_host, port), placement)

    def beside_api(self, launch: BesideLaunch) -> tuple[str, ApiTunnel | None]:
        """Where the transient unit's API answers from here: its own tunnel over SSH where the
        original's is tunnelled, else api_base with its port."""
        if self.tunnel is None:
            return with_port_in_url(self.api_base, launch.port), None
        from ..hosts.ssh import SSHHost
        from ..hosts.tunnel import ApiTunnel

        tunnel = ApiTunnel(SSHHost(self.tunnel.host.spec), launch.address)
        return tunnel.url, tunnel

    def beside_plan(self, spec: SpecConfig) -> str:
        """For the plan's line on arms side by side: where each of the two runs."""
        launch = self.beside_launch(spec)
        return (
            f"the original {self.unit} on {self.host_name} as it serves (never stopped), the "
            f"candidate as transient unit {launch.name} on port {launch.port}, "
            f"{launch.placement.where} ({redact_text(shlex.join(launch.run_argv))})"
        )

    def plan_beside(self, specs: Sequence[SpecConfig]) -> list[str]:
        """The steps of `--spec-arms together` on this host, readable before anything is done."""
        steps = [
            f"{self.unit} on {self.host_name} keeps serving as the baseline arm: it is never "
            "stopped, restarted or rewritten"
        ]
        for spec in specs:
            launch = self.beside_launch(spec)
            steps.append(
                f"candidate {spec.name} beside it: transient unit {launch.name} on port "
                f"{launch.port}, {launch.placement.where}:\n    "
                + redact_text(shlex.join(launch.run_argv))
            )
        steps.append(
            "restore: systemctl stop of each transient unit (it vanishes; --collect removes a "
            f"failed one); on Ctrl-C, SIGTERM, SIGHUP or a silent controller, restore.sh stops "
            f"{beside_unit_prefix(self.run_id)}*.service; a reboot removes them by nature"
        )
        return steps

    def _beside_placement(self) -> UnitPlacement | str:
        where = f"unit {self.unit} on {self.host_name}"
        argv = self.command().server_argv
        snapshot = gpu.snapshot_unit(self.host, self.unit)
        if snapshot.apps is not None or snapshot.note is not None:
            return gpu_placement(snapshot, argv, where=where)
        online = self.host.check(["cat", "/sys/devices/system/cpu/online"], timeout=30).stdout
        affinity = self.host.check(
            ["systemctl", "show", self.unit, "--property=CPUAffinity", "--value"], timeout=30
        ).stdout
        env = self.unit_environment().values
        taken = [core for live in self.live_beside() for core in live.placement.cores]
        return cpu_placement(
            parse_cpu_list(online), parse_cpu_list(affinity), env, argv, where=where, taken=taken
        )

    def _free_port(self, after: int) -> int:
        listening = self.host.check(["ss", "-Htln"], timeout=30).stdout
        starting = {live.port for live in self.live_beside()}  # may not listen yet
        port = first_free_port(listening_ports(listening) | starting, after)
        if port is None:
            raise ConfigError(
                f"no free port on {self.host_name} within 100 above {after} (the port of unit "
                f"{self.unit}) for a candidate beside it. Nothing was touched"
            )
        return port

    def _copied_properties(
        self,
    ) -> tuple[list[str], list[tuple[str, bool]], dict[str, str]]:
        """Environment= words, EnvironmentFile= paths and User=, Group=, WorkingDirectory=."""
        names = ["Environment", "EnvironmentFiles", *COPIED_PROPERTIES]
        shown = self.host.check(
            ["systemctl", "show", self.unit, *(f"--property={n}" for n in names)], timeout=30
        ).stdout.splitlines()
        values = dict(line.split("=", 1) for line in shown if "=" in line)
        environment = parse_show_environment(values.get("Environment", ""))
        files = parse_environment_files([x for x in shown if x.startswith("EnvironmentFiles=")])
        return environment, files, {k: values.get(k, "") for k in COPIED_PROPERTIES}
