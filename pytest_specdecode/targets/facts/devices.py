"""The GPUs one server sees and the GPUs its command asks for; their memory after the restore.

A server sees the GPUs nvidia-smi lists on its host that its `CUDA_VISIBLE_DEVICES` names (an
index or a UUID each, in that order; all of them where it is unset), and uses the first
tensor x pipeline parallel of them (`--tensor-parallel-size`/`-tp`,
`--pipeline-parallel-size`/`-pp`). `ServerGpus.refusal` says, before anything is touched, where
the command asks for more GPUs than it sees, or where its `CUDA_VISIBLE_DEVICES` names a GPU the
host does not have: vLLM would fail only once it starts, after the original was stopped.
Pure, but for the reads on the host: `listed_gpus`, `read_server_gpus`, `memory_after_restore`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...config.vllm_argv import option_value
from ...errors import HostError, ServiceError
from ..hosts.base import Host
from .gpu import APPS_QUERY, GPUS_QUERY, Gpu, GpuOutputError, parse_compute_apps, parse_gpus

VISIBLE = "CUDA_VISIBLE_DEVICES"
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")


def parallel_size(argv: Sequence[str], flags: Sequence[str]) -> int:
    """The value of the first of `flags` the command gives; 1 where none (or not a count)."""
    text = next((v for f in flags if (v := option_value(argv, f)) is not None), "1")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def devices_of(value: str | None) -> tuple[str, ...] | None:
    """`CUDA_VISIBLE_DEVICES`'s entries (`0,1` → ('0', '1')); None where it is unset."""
    if value is None:
        return None
    return tuple(e.strip() for e in value.split(",") if e.strip())


def _named(entry: str, gpus: Sequence[Gpu]) -> Gpu | None:
    """The GPU an entry names: its index, or its UUID (or a unique start of it)."""
    if entry.isdigit():
        return next((g for g in gpus if g.index == int(entry)), None)
    found = [g for g in gpus if g.uuid and g.uuid.startswith(entry)]
    return found[0] if len(found) == 1 else None


def gpu_list(indices: Sequence[int | None]) -> str:
    """`GPU 0`, `GPUs 0,1`."""
    shown = ",".join("?" if i is None else str(i) for i in indices)
    return f"GPU {shown}" if len(indices) == 1 else f"GPUs {shown}"


@dataclass(frozen=True)
class ServerGpus:
    """What one server command sees of its host's GPUs, and how many it asks for."""

    host: str
    listed: tuple[Gpu, ...]  # every GPU nvidia-smi lists on the host; () where none
    devices: tuple[str, ...] | None  # its CUDA_VISIBLE_DEVICES; None: unset (all)
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def seen(self) -> tuple[Gpu, ...]:
        """The GPUs the server sees, in the order CUDA numbers them for it."""
        if self.devices is None:
            return self.listed
        named = [_named(e, self.listed) for e in self.devices]
        return tuple(g for g in named if g is not None)

    @property
    def unknown(self) -> tuple[str, ...]:
        """The entries of CUDA_VISIBLE_DEVICES that name no GPU of the host."""
        return tuple(e for e in self.devices or () if _named(e, self.listed) is None)

    @property
    def per_server(self) -> int:
        """The GPUs one server uses: tensor x pipeline parallel."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def used(self) -> tuple[Gpu, ...]:
        """The GPUs one server of this command uses: the first `per_server` it sees."""
        return self.seen[: self.per_server]

    def asks(self) -> str:
        """`--tensor-parallel-size 2` (and the pipeline's), in the command's words."""
        parts = [f"--tensor-parallel-size {self.tensor_parallel}"]
        if self.pipeline_parallel > 1:
            parts.append(f"--pipeline-parallel-size {self.pipeline_parallel}")
        return " x ".join(parts)

    def sees(self) -> str:
        """`2 GPUs (CUDA_VISIBLE_DEVICES=0,1 of the 8 nvidia-smi lists)`."""
        count = f"{len(self.seen)} GPU{'s' if len(self.seen) != 1 else ''}"
        if self.devices is None:
            return f"{count} (no {VISIBLE}: all nvidia-smi lists)"
        return f"{count} ({VISIBLE}={','.join(self.devices)} of the {len(self.listed)} listed)"

    def refusal(self) -> str | None:
        """Why the command cannot serve on these GPUs, with the figures; None where it can, or
        where the host lists no GPU (a CPU server: nothing to count)."""
        if not self.listed:
            return None
        if self.unknown:
            listed = ", ".join(f"{g.index} ({g.uuid})" for g in self.listed)
            return (
                f"{VISIBLE}={','.join(self.devices or ())} names "
                f"{', '.join(repr(e) for e in self.unknown)}, which nvidia-smi on {self.host} "
                f"does not list (it lists {listed})"
            )
        if self.per_server > len(self.seen):
            return (
                f"the server command asks for {self.asks()}, {self.per_server} GPUs, and sees "
                f"{self.sees()} on {self.host}: give it {self.per_server} GPUs, or a smaller "
                "--tensor-parallel-size"
            )
        return None

    def describe(self) -> str:
        """`GPUs 0,1 (2 x NVIDIA H200, 143771 MiB each), tensor parallel 2`, for the plan."""
        used = self.used
        if not used:
            return "no GPU"
        names = sorted({g.name or "GPU" for g in used})
        totals = sorted({g.memory_total_mib for g in used if g.memory_total_mib})
        each = f", {totals[0]} MiB each" if len(totals) == 1 and len(used) > 1 else ""
        memory = f", {totals[0]} MiB" if len(totals) == 1 and len(used) == 1 else each
        text = f"{gpu_list([g.index for g in used])} ({len(used)} x {' + '.join(names)}{memory})"
        if self.tensor_parallel > 1:
            text += f", tensor parallel {self.tensor_parallel}"
        if self.pipeline_parallel > 1:
            text += f", pipeline parallel {self.pipeline_parallel}"
        return text


def server_gpus(
    host: str, gpus: Sequence[Gpu], argv: Sequence[str], env: Mapping[str, str]
) -> ServerGpus:
    """What a server with `argv` and `env` sees of `gpus`, the host's."""
    return ServerGpus(
        host,
        tuple(gpus),
        devices_of(env.get(VISIBLE)),
        parallel_size(argv, TP_FLAGS),
        parallel_size(argv, PP_FLAGS),
    )


def listed_gpus(host: Host) -> list[Gpu]:
    """Every GPU nvidia-smi lists on `host`, with its memory; [] where it lists none, is absent
    or cannot be read. Reads only."""
    try:
        result = host.run(["nvidia-smi", *GPUS_QUERY], timeout=30, privileged=False)
        return parse_gpus(result.stdout) if result.ok else []
    except (HostError, GpuOutputError):
        return []


def read_server_gpus(host: Host, argv: Sequence[str], env: Mapping[str, str]) -> ServerGpus:
    """`server_gpus` over what nvidia-smi lists on `host` now. Reads only."""
    return server_gpus(host.name, listed_gpus(host), argv, env)


def memory_after_restore(
    host: Host,
    gpus: Sequence[Gpu],
    ours: Callable[[int], bool],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """After the restore stopped every server this run started: each of `gpus` (the servers'),
    its memory used, once no process `ours` says is this run's holds any of it (waited for,
    `timeout_s` at most: the driver releases it a moment after the process is gone). Notes for
    the restore's report; ServiceError naming the host, the GPUs and the processes where this
    run's still hold memory; [] where nvidia-smi cannot tell."""
    uuids = {g.uuid for g in gpus}
    start = clock()
    while True:
        try:
            result = host.run(["nvidia-smi", *APPS_QUERY], timeout=30, privileged=False)
            apps = parse_compute_apps(result.stdout) if result.ok else None
        except (HostError, GpuOutputError):
            apps = None
        if apps is None:
            return []
        mine = [a for a in apps if a.gpu_uuid in uuids]
        held = [a for a in mine if ours(a.pid)]
        if not held:
            break
        if clock() - start >= timeout_s:
            listed = "; ".join(a.describe(gpus) for a in held)
            raise ServiceError(
                f"on {host.name}, {clock() - start:.0f}s after the restore stopped every server "
                f"this run started, its processes still hold memory on "
                f"{gpu_list([g.index for g in gpus])}: {listed}. A run started now could find "
                "no room there; end those processes"
            )
        sleep(interval_s)
    now = {g.uuid: g for g in listed_gpus(host)}
    used = ", ".join(
        f"GPU {g.index} {now[g.uuid].memory_used_mib} MiB"
        for g in gpus
        if g.uuid in now and now[g.uuid].memory_used_mib is not None
    )
    notes = [f"GPU memory after the restore on {host.name}: {used} used"] if used else []
    if mine:
        listed = "; ".join(a.describe(gpus) for a in mine)
        notes.append(f"other processes hold memory on those GPUs, not this run's: {listed}")
    return notes
