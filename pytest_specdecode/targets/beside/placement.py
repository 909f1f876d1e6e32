"""Two servers side by side (`--spec-arms together`): where each runs. Pure: argv, ports, shares.

On a CPU each server gets its own cores: the cores this process may use, split in two halves,
applied with `taskset -c` and vLLM's `VLLM_CPU_OMP_THREADS_BIND` (the CPU backend binds its
OpenMP threads to that list). On one GPU each gets its share of the memory
(`--gpu-memory-utilization`); with several GPUs, each its own (`CUDA_VISIBLE_DEVICES`).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from urllib.parse import urlsplit, urlunsplit

from ..facts.gpu import Gpu

GPU_SHARE = 0.45  # --gpu-memory-utilization of each of two servers on one GPU
PORT_FLAG = "--port"
MEMORY_FLAG = "--gpu-memory-utilization"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Placement:
    """Where one of the two servers runs: its cores (CPU), or its GPUs and memory share."""

    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()  # CUDA_VISIBLE_DEVICES; empty: as the original sees them
    memory_share: float | None = None  # --gpu-memory-utilization

    def argv(self, argv: Sequence[str], *, taskset: str | None = "taskset") -> list[str]:
        """The command run in this place: `taskset -c` before it, the memory share after."""
        out = list(argv)
        if self.memory_share is not None:
            out = with_option(out, MEMORY_FLAG, f"{self.memory_share:g}")
        if self.cores and taskset:
            out = [taskset, "-c", core_list(self.cores), *out]
        return out

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.cores:
            env[BIND_ENV] = core_list(self.cores)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return env

    def describe(self) -> str:
        if self.cores:
            return f"cores {core_list(self.cores)}"
        parts = []
        if self.gpus:
            parts.append(f"GPU {','.join(str(g) for g in self.gpus)}")
        if self.memory_share is not None:
            parts.append(f"{self.memory_share:.0%} of the GPU memory")
        return ", ".join(parts) or "as the original"


@dataclass(frozen=True)
class PlannedServer:
    """One server of a group as the plan names it, from the places the run takes: its phase,
    port and place (`port 8012, 15% of the GPU memory`), and its command as a shell runs it."""

    name: str
    where: str
    command: str
    memory_share: float | None = None  # --gpu-memory-utilization, on a shared GPU
    cores: tuple[int, ...] = ()


def core_list(cores: Iterable[int]) -> str:
    """`0,1,2,5` → `0-2,5`, the form taskset and VLLM_CPU_OMP_THREADS_BIND read."""
    ordered = sorted(set(cores))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def split_cores(cores: Iterable[int], servers: int = 2) -> tuple[Placement, ...]:
    """The cores in `servers` even parts, in order: the first for the original."""
    ordered = sorted(set(cores))
    if len(ordered) < servers:
        raise ValueError(f"{servers} servers need {servers} cores, {len(ordered)} may be used")
    size = len(ordered) // servers
    bounds = [i * size for i in range(servers)] + [len(ordered)]
    return tuple(Placement(cores=tuple(ordered[a:b])) for a, b in pairwise(bounds))


def cpu_room(cores: Iterable[int], servers: int = 2) -> str | None:
    """None where `servers` servers can each have a core of their own; else why not."""
    usable = sorted(set(cores))
    if len(usable) >= servers:
        return None
    return (
        f"this process may use {len(usable)} core ({core_list(usable) or 'none'}); {servers} CPU "
        "servers side by side need one core each at least"
    )


# What a vLLM server takes beyond its --gpu-memory-utilization share: its CUDA context and what
# it allocates outside the share's accounting. Seen on an H100 (2026-12-07, vLLM 0.26.0, an 8B
# shape at 0.3 with an EAGLE-3 head): 25.5 and 27.6 GiB taken for 23.75, and the third server
# found less than its share free and refused to start.
SERVER_OVERHEAD_MIB = 4096


def gpu_share_of(share: float, servers: int, total_mib: int | None = None) -> float:
    """Each server's memory share on a shared GPU: `share`, or less where more servers share it
    (0.9 of the memory over them all: eight SmolLM2 servers at 0.1 each on an H200), and, where
    the GPU's memory is known, less each server's overhead beyond its share."""
    each = share if servers <= 2 else min(share, round(0.9 / servers, 3))
    if total_mib and servers >= 2:
        room = 0.9 * total_mib - servers * SERVER_OVERHEAD_MIB
        each = min(each, math.floor(1000 * room / (servers * total_mib)) / 1000)
    return max(each, 0.0)


def gpu_placements(
    gpus: Sequence[Gpu], *, share: float = GPU_SHARE, tensor_parallel: int = 1, servers: int = 2
) -> tuple[Placement, ...] | str:
    """Each server's GPUs or memory share, or why the GPUs cannot hold `servers` copies.

    With servers·tp GPUs or more, each server gets tp GPUs of its own (the freest first); on
    fewer, all share tp GPUs, each with its share of the memory (gpu_share_of), which must be
    free on every one: vLLM refuses to start where less than its share is free.
    """
    if len(gpus) >= servers * tensor_parallel:
        ordered = sorted(gpus, key=lambda g: (g.memory_used_mib or 0, g.index or 0))
        return tuple(
            Placement(
                gpus=tuple(
                    sorted(
                        g.index or 0
                        for g in ordered[i * tensor_parallel : (i + 1) * tensor_parallel]
                    )
                )
            )
            for i in range(servers)
        )
    if len(gpus) < tensor_parallel:
        return f"{len(gpus)} GPU(s), and the server needs {tensor_parallel}"
    totals = [g.memory_total_mib for g in gpus[:tensor_parallel] if g.memory_total_mib]
    each = gpu_share_of(share, servers, min(totals) if totals else None)
    if each <= 0.0:
        return (
            f"{servers} servers on {tensor_parallel} GPU(s) of {min(totals)} MiB leave no share "
            f"after {SERVER_OVERHEAD_MIB} MiB each beyond it"
        )
    short = []
    for gpu in gpus[:tensor_parallel]:
        total, used = gpu.memory_total_mib, gpu.memory_used_mib
        if total is None or used is None:
            return f"GPU {gpu.index}: its memory is not known (nvidia-smi said N/A)"
        needed = round(servers * (each * total + SERVER_OVERHEAD_MIB))
        if total - used < needed:
            short.append(
                f"GPU {gpu.index} ({gpu.name}) has {total - used} MiB free of {total} MiB; "
                f"{servers} servers at {each:g} each need {needed} MiB"
            )
    if short:
        return "; ".join(short)
    return tuple(Placement(memory_share=each) for _ in range(servers))


def with_option(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """`--flag value` set: every existing `--flag V` and `--flag=V` replaced by one at the end."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return [*out, flag, value]


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """The same command listening on `port` (vLLM's default is 8000 where none was given)."""
    return with_option(argv, PORT_FLAG, str(port))


def api_base_on_port(api_base: str, port: int) -> str:
    """The same API base on another port: `http://127.0.0.1:8011` → `http://127.0.0.1:8012`."""
    parts = urlsplit(api_base)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}"
    if parts.username:
        netloc = f"{parts.username}{':' + parts.password if parts.password else ''}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def shown(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A command as a shell would run it, its variables first."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(env.items()))
    return prefix + shlex.join(argv)
