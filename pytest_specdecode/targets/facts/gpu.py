"""GPU memory on the serving host, judged by the unit's own processes (nvidia-smi, read as CSV).

Pure parsing and decisions over nvidia-smi's CSV output; the host calls are two thin seams
(`snapshot_unit`, `poll_release`). Facts from a real H200 host (tests/data/nvidia-smi-h200):
- idle, `--query-compute-apps` prints nothing and exits 0;
- a process that has just created its CUDA context shows about 100 MiB before its big
  allocation lands, so the amount a process holds is never judged from one sample;
- memory was released about 0.2 s after the process was gone; big servers take longer, so the
  release is polled with a bound;
- processes of other users and services appear in the same list: only the unit's own PIDs, on
  the GPUs they used, decide whether memory is still held. The others are reported.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...errors import HostError, ServiceError
from ..base import Progress
from ..hosts.base import Host

APP_FIELDS = ("pid", "used_memory", "gpu_uuid", "process_name")
GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version")
APPS_QUERY = ["--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader"]
GPUS_QUERY = ["--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader"]

# Header names as nvidia-smi prints them (units stripped), mapped to the query's field names.
_HEADER_ALIASES = {
    "used_gpu_memory": "used_memory",
    "name": "name",
    "process_name": "process_name",
    "gpu_name": "name",
}
_HEADER_FIELD = re.compile(r"^([a-z_.]+)(?:\s*\[[^\]]*\])?$")
_NOT_A_VALUE = re.compile(r"^\[?(N/A|Not Supported|Insufficient Permissions|Unknown Error)\]?$")


class GpuOutputError(ValueError):
    """nvidia-smi printed something that is not the CSV that was asked for."""


@dataclass(frozen=True)
class GpuProcess:
    """One row of `--query-compute-apps`."""

    pid: int
    used_mib: int | None
    gpu_uuid: str | None = None
    name: str | None = None

    def describe(self, gpus: Sequence[Gpu] = (), alive: Iterable[int] | None = None) -> str:
        what = self.name or "?"
        if alive is not None and self.pid in set(alive):
            what += ", still running"
        memory = f"{self.used_mib} MiB" if self.used_mib is not None else "memory unknown"
        return f"pid {self.pid} ({what}) {memory} on {gpu_label(self.gpu_uuid, gpus)}"


@dataclass(frozen=True)
class Gpu:
    """One row of `--query-gpu`."""

    index: int | None
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver: str | None = None

    def describe(self) -> str:
        """`index: name, memory, driver`, the shape of the report's environment line."""
        total = f"{self.memory_total_mib} MiB" if self.memory_total_mib is not None else "? MiB"
        return f"{self.index}: {self.name}, {total}, driver {self.driver}"


def gpu_label(uuid: str | None, gpus: Sequence[Gpu] = ()) -> str:
    """`GPU 0 (GPU-695d…)` where the index is known, else the UUID."""
    if uuid is None:
        return "an unknown GPU"
    index = next((g.index for g in gpus if g.uuid == uuid), None)
    return f"GPU {index} ({uuid})" if index is not None else uuid


# --------------------------------------------------------------------------------- parsing


def mib(value: str) -> int | None:
    """`21090 MiB` → 21090; `[N/A]`, `[Not Supported]` and empty → None."""
    text = value.strip()
    if not text or _NOT_A_VALUE.match(text):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB)?", text)
    if m is None:
        raise GpuOutputError(f"not an amount of memory: {value!r}")
    factor = {"GiB": 1024.0, "KiB": 1 / 1024, None: 1.0, "MiB": 1.0}[m.group(2)]
    return round(float(m.group(1)) * factor)


def parse_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `--format=csv` or `csv,noheader` output as {field: value}.

    A header line, if present, names the columns (`used_gpu_memory [MiB]` → used_memory);
    otherwise they are `fields`, the ones the query asked for. The last column keeps any
    commas (put free text such as process_name last). Empty output is no rows.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    columns = list(fields)
    header = _header(lines[0])
    if header is not None:
        columns, lines = header, lines[1:]
    rows = []
    for line in lines:
        values = [v.strip() for v in line.split(",", len(columns) - 1)]
        if len(values) != len(columns):
            raise GpuOutputError(f"expected {len(columns)} columns {columns}, got {line!r}")
        rows.append(dict(zip(columns, values, strict=True)))
    return rows


def _header(line: str) -> list[str] | None:
    names = []
    for raw in line.split(","):
        m = _HEADER_FIELD.match(raw.strip())
        if m is None:
            return None
        names.append(_HEADER_ALIASES.get(m.group(1), m.group(1)))
    return names


def parse_compute_apps(text: str, fields: Sequence[str] = APP_FIELDS) -> list[GpuProcess]:
    """`--query-compute-apps` output; nothing (idle) is an empty list."""
    apps = []
    for row in parse_csv(text, fields):
        pid = row.get("pid", "")
        if not pid.isdigit():
            raise GpuOutputError(f"compute-apps row without a pid: {row}")
        apps.append(
            GpuProcess(
                pid=int(pid),
                used_mib=mib(row.get("used_memory", "")),
                gpu_uuid=_value(row.get("gpu_uuid")),
                name=_value(row.get("process_name") or row.get("name")),
            )
        )
    return apps


def parse_gpus(text: str, fields: Sequence[str] = GPU_FIELDS) -> list[Gpu]:
    """`--query-gpu` output, one Gpu per row."""
    gpus = []
    for row in parse_csv(text, fields):
        index = row.get("index", "")
        gpus.append(
            Gpu(
                index=int(index) if index.isdigit() else None,
                uuid=_value(row.get("uuid")),
                name=_value(row.get("name")),
                memory_total_mib=mib(row["memory.total"]) if "memory.total" in row else None,
                memory_used_mib=mib(row["memory.used"]) if "memory.used" in row else None,
                driver=_value(row.get("driver_version")),
            )
        )
    return gpus


def _value(text: str | None) -> str | None:
    if text is None or not text.strip() or _NOT_A_VALUE.match(text.strip()):
        return None
    return text.strip()


# --------------------------------------------------------------------------------- decision


@dataclass(frozen=True)
class UnitGpuSnapshot:
    """Taken before a stop: the unit's processes, and what nvidia-smi listed."""

    main_pid: int
    pids: frozenset[int]  # MainPID and every process of the unit's cgroup
    apps: tuple[GpuProcess, ...] | None  # None: no nvidia-smi, or it failed (see note)
    gpus: tuple[Gpu, ...] = ()
    note: str | None = None

    @property
    def unit_gpus(self) -> frozenset[str]:
        """The UUIDs of the GPUs on which the unit's processes held memory."""
        return frozenset(
            a.gpu_uuid for a in self.apps or () if a.pid in self.pids and a.gpu_uuid is not None
        )


@dataclass(frozen=True)
class GpuPoll:
    """One look after the stop: compute-apps, and which of the unit's PIDs still run."""

    apps: tuple[GpuProcess, ...] | None
    alive: frozenset[int] = frozenset()
    note: str | None = None


@dataclass(frozen=True)
class GpuRelease:
    """Whether the unit's GPU memory is released, and who else holds GPU memory."""

    released: bool
    held: tuple[GpuProcess, ...] = ()  # the unit's own processes, still listed
    shared: tuple[GpuProcess, ...] = ()  # other processes on the GPUs the unit used
    elsewhere: tuple[GpuProcess, ...] = ()  # other processes on other GPUs
    unit_gpus: frozenset[str] = frozenset()
    checked: bool = True  # False: nvidia-smi absent or failing, nothing could be judged
    note: str | None = None

    def notes(self, label: str, gpus: Sequence[Gpu] = ()) -> list[str]:
        """What to tell the user; never a reason to fail."""
        out = [self.note] if self.note else []
        if self.shared:
            where = "the GPUs it used" if self.unit_gpus else "this host's GPUs"
            listed = "; ".join(a.describe(gpus) for a in self.shared)
            out.append(
                f"after {label} stopped, other processes still hold memory on {where}: {listed}. "
                "They are not the unit's: the candidate must fit beside them, and they may "
                "disturb the timings"
            )
        if self.elsewhere:
            listed = "; ".join(a.describe(gpus) for a in self.elsewhere)
            out.append(f"other GPUs of the host are in use by other processes: {listed}")
        return out


def judge_release(before: UnitGpuSnapshot, now: GpuPoll) -> GpuRelease:
    """After a stop: released when none of the unit's PIDs is in the compute-apps list."""
    if now.apps is None:
        return GpuRelease(released=True, checked=False, note=now.note)
    unit_gpus = before.unit_gpus
    held = tuple(a for a in now.apps if a.pid in before.pids)
    others = [a for a in now.apps if a.pid not in before.pids]
    shared = tuple(
        a for a in others if not unit_gpus or a.gpu_uuid is None or a.gpu_uuid in unit_gpus
    )
    elsewhere = tuple(a for a in others if a not in shared)
    return GpuRelease(
        released=not held, held=held, shared=shared, elsewhere=elsewhere, unit_gpus=unit_gpus
    )


def wait_until_released(
    poll: Callable[[], GpuPoll],
    before: UnitGpuSnapshot,
    *,
    label: str,
    timeout_s: float = 60.0,
    interval_s: float = 0.5,
    report_every_s: float = 10.0,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> GpuRelease:
    """Poll until the unit's PIDs are gone from compute-apps; ServiceError after `timeout_s`."""
    start = last_report = clock()
    while True:
        now = poll()
        release = judge_release(before, now)
        if release.released:
            return release
        elapsed = clock() - start
        held = "; ".join(a.describe(before.gpus, now.alive) for a in release.held)
        if elapsed >= timeout_s:
            raise ServiceError(
                f"{label} stopped, but {elapsed:.0f}s later its own processes still hold GPU "
                f"memory: {held}. A candidate started now could run out of memory; end those "
                "processes (the unit's KillMode may leave children behind) and run again"
            )
        if progress is not None and clock() - last_report >= report_every_s:
            last_report = clock()
            progress(f"  … {elapsed:.0f}s: waiting for {label} to release GPU memory: {held}")
        sleep(interval_s)


# --------------------------------------------------------------------------------- host seams

_SNAPSHOT = r"""
unit=$1
main=$(systemctl show -p MainPID --value "$unit")
echo "main ${main:-0}"
cg=$(systemctl show -p ControlGroup --value "$unit")
if [ -n "$cg" ]; then
  for d in "/sys/fs/cgroup$cg" "/sys/fs/cgroup/systemd$cg" "/sys/fs/cgroup/unified$cg"; do
    if [ -d "$d" ]; then
      find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sed 's/^/pid /'
      break
    fi
  done
fi
command -v nvidia-smi >/dev/null 2>&1 || { echo "smi absent"; exit 0; }
apps=$(nvidia-smi "$2" "$3" 2>&1); rc=$?
echo "smi $rc"
printf '%s\n' "$apps" | sed 's/^/app /'
nvidia-smi "$4" "$5" 2>/dev/null | sed 's/^/gpu /'
exit 0
"""

_POLL = r"""
q1=$1; q2=$2; shift 2
for p in "$@"; do [ -d "/proc/$p" ] && echo "alive $p"; done
command -v nvidia-smi >/dev/null 2>&1 || { echo "smi absent"; exit 0; }
apps=$(nvidia-smi "$q1" "$q2" 2>&1); rc=$?
echo "smi $rc"
printf '%s\n' "$apps" | sed 's/^/app /'
exit 0
"""


def parse_snapshot(text: str) -> UnitGpuSnapshot:
    """The output of the snapshot script: `main N`, `pid N`…, `smi RC`, `app …`, `gpu …`."""
    sections = _sections(text)
    main = int((sections.get("main") or ["0"])[0] or 0)
    pids = {int(p) for p in sections.get("pid", []) if p.isdigit()}
    if main:
        pids.add(main)
    apps, note = _apps(sections)
    gpus: tuple[Gpu, ...] = ()
    if sections.get("gpu"):
        try:
            gpus = tuple(parse_gpus("\n".join(sections["gpu"])))
        except GpuOutputError:
            gpus = ()
    return UnitGpuSnapshot(main, frozenset(pids), apps, gpus, note)


def parse_poll(text: str) -> GpuPoll:
    sections = _sections(text)
    apps, note = _apps(sections)
    alive = frozenset(int(p) for p in sections.get("alive", []) if p.isdigit())
    return GpuPoll(apps, alive, note)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        out.setdefault(key, []).append(rest)
    return out


def _apps(sections: dict[str, list[str]]) -> tuple[tuple[GpuProcess, ...] | None, str | None]:
    status = (sections.get("smi") or ["absent"])[0]
    if status == "absent":
        return None, None
    body = "\n".join(sections.get("app", []))
    if status != "0":
        return None, f"nvidia-smi exited {status} ({body.strip()[:200]}): GPU memory not checked"
    try:
        return tuple(parse_compute_apps(body)), None
    except GpuOutputError as exc:
        return None, f"nvidia-smi's compute-apps list could not be read ({exc}): not checked"


def snapshot_unit(host: Host, unit: str) -> UnitGpuSnapshot:
    """Before a stop: the unit's PIDs (MainPID and its cgroup) and nvidia-smi's view."""
    try:
        result = host.run(
            ["sh", "-c", _SNAPSHOT, "sh", unit, *APPS_QUERY, *GPUS_QUERY],
            timeout=60,
            privileged=False,  # reads only: the sudo rule need not name a shell
        )
    except HostError as exc:
        return UnitGpuSnapshot(0, frozenset(), None, note=f"GPU snapshot failed: {exc}")
    if not result.ok:
        note = f"GPU snapshot failed: {result.describe()}"
        return UnitGpuSnapshot(0, frozenset(), None, note=note)
    return parse_snapshot(result.stdout)


def poll_release(host: Host, pids: Iterable[int]) -> GpuPoll:
    """After a stop: which of `pids` still run, and nvidia-smi's compute-apps list."""
    argv = ["sh", "-c", _POLL, "sh", *APPS_QUERY, *map(str, sorted(pids))]
    try:
        result = host.run(argv, timeout=60, privileged=False)
    except HostError as exc:
        return GpuPoll(None, note=f"GPU check failed: {exc}")
    if not result.ok:
        return GpuPoll(None, note=f"GPU check failed: {result.describe()}")
    return parse_poll(result.stdout)


# --------------------------------------------------------------------------------- facts

IDENTITY_FIELDS = ("index", "name", "driver_version")
_IDENTITY_QUERY = (
    "command -v nvidia-smi >/dev/null || exit 3; nvidia-smi "
    f"--query-gpu={','.join(IDENTITY_FIELDS)} --format=csv"
)  # with its header: the columns are read by name


def gpus_and_driver(gpus: Sequence[Gpu]) -> tuple[tuple[str, ...], str | None]:
    """Each GPU's name, in index order, and the driver (several, joined, where they differ)."""
    names = tuple(g.name or "unknown GPU" for g in gpus)
    drivers = sorted({g.driver for g in gpus if g.driver})
    return names, (" + ".join(drivers) if drivers else None)


def read_gpus(host: Host) -> list[Gpu] | None:
    """The host's GPUs (index, name, driver); [] where nvidia-smi is absent, None where it
    could not be read. Reads only."""
    try:
        result = host.run(["sh", "-c", _IDENTITY_QUERY], timeout=30, privileged=False)
    except HostError:
        return None
    if result.exit_status == 3:
        return []
    if not result.ok:
        return None
    try:
        return parse_gpus(result.stdout, IDENTITY_FIELDS)
    except GpuOutputError:
        return None
