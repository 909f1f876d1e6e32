"""One sample of the serving host: its CPU time, the server's share, and the GPUs' state.

Pure parsing of one shell script's output (`parse_host_sample`); the host call is a thin seam
(`HostProbe`), one command over the connection the run already has. What the script prints:
- `cpus N`, `tck N`: online CPUs and clock ticks per second;
- `stat cpu …`: /proc/stat's first line (user nice system idle iowait irq softirq steal …);
- `cg usec N` (cgroup v2 cpu.stat, also the hybrid layout's `unified` tree) or `cg nsec N` (v1
  cpuacct.usage): a systemd unit's CPU; `cg none PATH` where its cgroup has no CPU accounting;
- `ticks N`: a local server's process group's CPU, and `own N` this controller's, in ticks;
- `pid N`: the server's processes (its GPUs are the ones they hold);
- `smi RC`, `gpu …`, `app …`: nvidia-smi's query interface, as CSV without units.
Real nvidia-smi output (tests/data/nvidia-smi-h200/query-clocks*.txt): clocks in MHz, the
active clock event reasons as a hex bitmask (0x1 idle, 0x4 the software power cap under load).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import HostError
from .base import Service
from .facts.gpu import (
    APP_FIELDS,
    GpuOutputError,
    GpuProcess,
    parse_compute_apps,
    parse_csv,
)
from .hosts.base import Host
from .local_process import LocalProcessService
from .systemd.target import SystemdUnit

CLOCK_FIELDS = (
    "index",
    "uuid",
    "clocks.sm",
    "clocks.mem",
    "clocks_event_reasons.active",
    "temperature.gpu",
    "power.draw",
)
# nvml.h's clock event reasons. Idle and the applications' clock setting do not slow a server.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}

_SCRIPT = r"""
echo "cpus $(getconf _NPROCESSORS_ONLN)"; echo "tck $(getconf CLK_TCK)"
head -n1 /proc/stat | sed 's/^/stat /'
unit=$1; group=$2; own=$3; gpu_query=$4; apps_query=$5; fs=$6  # the loops reuse $@
if [ -n "$unit" ]; then
  cg=$(systemctl show -p ControlGroup --value "$unit")
  v2=""  # cgroup v2, or the hybrid layout's v2 tree beside v1 controllers
  for d in "$fs$cg" "$fs/unified$cg"; do
    [ -z "$v2" ] && [ -n "$cg" ] && [ -f "$d/cpu.stat" ] && v2=$d
  done
  if [ -n "$v2" ]; then
    grep '^usage_usec' "$v2/cpu.stat" | sed 's/^usage_usec/cg usec/'
    cat "$v2/cgroup.procs" 2>/dev/null | sed 's/^/pid /'
  elif [ -n "$cg" ] && [ -f "$fs/cpuacct$cg/cpuacct.usage" ]; then
    echo "cg nsec $(cat "$fs/cpuacct$cg/cpuacct.usage")"
    cat "$fs/cpuacct$cg/cgroup.procs" 2>/dev/null | sed 's/^/pid /'
  elif [ -n "$cg" ]; then
    echo "cg none $cg"  # a cgroup without CPU accounting here: the unit's share is unknown
  else
    echo "cg usec 0"  # inactive: no cgroup, it uses nothing
  fi
fi
if [ "$group" = "none" ]; then
  echo "ticks 0"
elif [ -n "$group" ]; then
  t=0
  for f in /proc/[0-9]*/stat; do
    read -r line < "$f" 2>/dev/null || continue
    rest=${line##*) }; set -- $rest
    p=${f#/proc/}
    if [ "$3" = "$group" ]; then t=$((t + ${12} + ${13})); echo "pid ${p%/stat}"; fi
  done
  echo "ticks $t"
fi
if [ -n "$own" ] && read -r line < "/proc/$own/stat" 2>/dev/null; then
  rest=${line##*) }; set -- $rest; echo "own $((${12} + ${13}))"
fi
command -v nvidia-smi >/dev/null 2>&1 || exit 0
out=$(nvidia-smi "$gpu_query" --format=csv,noheader,nounits 2>&1); echo "smi $?"
printf '%s\n' "$out" | sed 's/^/gpu /'
nvidia-smi "$apps_query" --format=csv,noheader 2>/dev/null | sed 's/^/app /'
exit 0
"""


@dataclass(frozen=True)
class Scope:
    """Whose CPU time is the server's: a systemd unit's cgroup, or a local process group; and
    this controller's own process, where it shares the host (its load is every arm's)."""

    unit: str | None = None  # its cgroup; none yet (inactive): it uses nothing
    group: int | None = None  # None: the server has not started, it uses nothing
    own: int | None = None


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str | None
    sm_mhz: float | None
    memory_mhz: float | None
    reasons: int | None  # the active clock event reasons' bitmask
    temperature_c: float | None
    power_w: float | None

    @property
    def throttle(self) -> list[str]:
        bits = self.reasons or 0
        return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


@dataclass(frozen=True)
class HostSample:
    """One reading of the host. CPU figures are cumulative: a window is two samples' difference."""

    cpus: int | None = None
    tick_s: float = 0.01
    total_ticks: int | None = None  # every CPU's time (guest time is inside user's)
    idle_ticks: int | None = None  # idle and iowait
    steal_ticks: int | None = None
    server_s: float | None = None  # the server's own CPU time
    own_s: float = 0.0  # this controller's, where it runs on the host
    server_pids: frozenset[int] = frozenset()
    gpus: tuple[GpuReading, ...] = ()
    apps: tuple[GpuProcess, ...] = ()
    note: str | None = None  # why part of it could not be read

    def server_gpus(self) -> tuple[GpuReading, ...]:
        """The GPUs the server's processes hold."""
        uuids = {a.gpu_uuid for a in self.apps if a.pid in self.server_pids}
        return tuple(g for g in self.gpus if g.uuid in uuids)

    def clock_gpus(self) -> tuple[GpuReading, ...]:
        """The GPUs whose clocks stand for the server's: its own, else (nvidia-smi lists none
        of its processes, as in a VM or container that hides them) every GPU of the host."""
        return self.server_gpus() or self.gpus

    def others_on_server_gpus(self) -> list[GpuProcess]:
        uuids = {g.uuid for g in self.server_gpus()}
        return [a for a in self.apps if a.gpu_uuid in uuids and a.pid not in self.server_pids]


def parse_host_sample(text: str) -> HostSample:
    """The output of the sampling script (see the module's docstring)."""
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        lines.setdefault(key, []).append(rest.strip())
    cpus = _int(_first(lines, "cpus"))
    tck = _int(_first(lines, "tck")) or 100
    total = idle = steal = None
    stat = _first(lines, "stat")
    if stat and stat.startswith("cpu "):
        values = [int(v) for v in stat.split()[1:]]
        values += [0] * (8 - len(values))
        total = sum(values[:8])
        idle, steal = values[3] + values[4], values[7]
    server_s = None
    notes = []
    cg = _first(lines, "cg")
    if cg and cg.startswith("none"):
        notes.append(
            f"the unit's CPU time could not be read: its cgroup {cg[5:]} has no CPU accounting"
        )
    elif cg:
        unit, _, value = cg.partition(" ")
        server_s = int(value) / (1e6 if unit == "usec" else 1e9)
    elif "ticks" in lines:
        server_s = int(lines["ticks"][0]) / tck
    own = _int(_first(lines, "own"))
    gpus: tuple[GpuReading, ...] = ()
    apps: tuple[GpuProcess, ...] = ()
    smi = _first(lines, "smi")
    if smi is not None and smi != "0":
        notes.append(f"nvidia-smi exited {smi}: {' '.join(lines.get('gpu', []))[:200]}")
    elif smi == "0":
        try:
            gpus = tuple(_reading(row) for row in parse_csv("\n".join(lines["gpu"]), CLOCK_FIELDS))
            apps = tuple(parse_compute_apps("\n".join(lines.get("app", []))))
        except (GpuOutputError, KeyError, ValueError) as exc:
            notes.append(f"nvidia-smi's output could not be read: {exc}")
    return HostSample(
        cpus=cpus,
        tick_s=1 / tck,
        total_ticks=total,
        idle_ticks=idle,
        steal_ticks=steal,
        server_s=server_s,
        own_s=(own or 0) / tck,
        server_pids=frozenset(int(p) for p in lines.get("pid", []) if p.isdigit()),
        gpus=gpus,
        apps=apps,
        note="; ".join(notes) or None,
    )


def scope_of(service: Service) -> Scope | None:
    """Whose CPU time is the server's, or None where this backend does not say."""
    if isinstance(service, SystemdUnit):
        return Scope(unit=service.unit)
    if isinstance(service, LocalProcessService):
        return Scope(group=service.pid, own=os.getpid())
    return None


class HostProbe:
    """Samples the serving host over its connection: one shell command a sample."""

    def __init__(self, host: Host, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.host = host
        self.cgroup_root = cgroup_root  # a seam: the unit tests' own tree

    def __call__(self, service: Service) -> HostSample | None:
        scope = scope_of(service)
        if scope is None:
            return None
        return self.sample(scope)

    def sample(self, scope: Scope) -> HostSample:
        argv: Sequence[str] = [
            "sh", "-c", _SCRIPT, "sh", scope.unit or "",
            "" if scope.unit else str(scope.group or "none"),
            str(scope.own or ""), "--query-gpu=" + ",".join(CLOCK_FIELDS),
            "--query-compute-apps=" + ",".join(APP_FIELDS), self.cgroup_root,
        ]  # fmt: skip
        try:
            result = self.host.run(argv, timeout=30, privileged=False)
        except HostError as exc:
            return HostSample(note=f"the host could not be sampled: {exc}")
        if not result.ok:
            return HostSample(note=f"the host could not be sampled: {result.describe()}")
        return parse_host_sample(result.stdout)


def busiest(host: Host, count: int = 5) -> list[str]:
    """The processes that used the most CPU over their lives (ps), as `pid comm N%`."""
    script = f"ps -eo pid=,pcpu=,comm= --sort=-pcpu | head -n {count}"
    try:
        result = host.run(["sh", "-c", script], timeout=30, privileged=False)
    except HostError:
        return []
    rows = [line.split(None, 2) for line in result.stdout.splitlines()] if result.ok else []
    return [f"pid {r[0]} {r[2]} {r[1]}%" for r in rows if len(r) == 3]


def _reading(row: dict[str, str]) -> GpuReading:
    reasons = row.get("clocks_event_reasons.active") or ""
    return GpuReading(
        index=int(row["index"]),
        uuid=row.get("uuid") or None,
        sm_mhz=_float(row.get("clocks.sm")),
        memory_mhz=_float(row.get("clocks.mem")),
        reasons=int(reasons, 16) if reasons.startswith("0x") else None,
        temperature_c=_float(row.get("temperature.gpu")),
        power_w=_float(row.get("power.draw")),
    )


def _first(lines: dict[str, list[str]], key: str) -> str | None:
    return lines[key][0] if lines.get(key) else None


def _int(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None  # [N/A], [Not Supported]
