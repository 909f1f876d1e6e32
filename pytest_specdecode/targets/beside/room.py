"""Where a second copy of a running server fits on its host, and on which port. Pure functions.

`--spec-arms together` on a systemd target runs the candidate beside the production unit
(systemd/beside.py). Before anything is touched, this decides whether the host has room:
- a GPU host (nvidia-smi answers): GPUs without any compute process, as many as the original
  uses; else, on the original's own GPUs, free memory for the original's share
  (`--gpu-memory-utilization`, 0.9 by vLLM's default: then there is none);
- a CPU host: cores that no OMP thread of the original is bound to: its CPUAffinity= where set,
  else `VLLM_CPU_OMP_THREADS_BIND` (a core list; `auto`, vLLM's default, binds all the allowed
  cores but the last `VLLM_CPU_NUM_OF_RESERVED_CPU`, one per rank, which it leaves to its
  front end; `nobind`: all of them).
A refusal is a sentence that names the host, the unit and the figures.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ...config.vllm_argv import VLLM_GPU_MEMORY_UTILIZATION, option_value
from ..facts.gpu import Gpu, UnitGpuSnapshot

PORT_SPAN = 100  # ports tried after the original's


@dataclass(frozen=True)
class UnitPlacement:
    """Where a candidate unit runs beside the production unit: its devices or cores, and the
    variables and properties that pin it (a local server's place: placement.Placement)."""

    where: str  # e.g. "GPU 1 (no compute process)", "core 1 (the original's OMP threads: 0)"
    env: Mapping[str, str] = field(default_factory=dict)  # set for the server process itself
    properties: tuple[str, ...] = ()  # systemd-run --property= values, e.g. CPUAffinity=1
    cores: tuple[int, ...] = ()  # on a CPU host, the cores it is pinned to


# ------------------------------------------------------------------------------------- ports


def listening_ports(ss_output: str) -> set[int]:
    """The local ports of `ss -Htln` lines (`LISTEN 0 4096 127.0.0.1:8100 0.0.0.0:*`)."""
    ports: set[int] = set()
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            port = fields[3].rpartition(":")[2]
            if port.isdigit():
                ports.add(int(port))
    return ports


def first_free_port(taken: Collection[int], after: int, span: int = PORT_SPAN) -> int | None:
    """The first port above `after` that nothing listens on, within `span`."""
    return next((p for p in range(after + 1, min(after + span, 65535) + 1) if p not in taken), None)


def with_unit_port(argv: Sequence[str], server_args: int, port: int) -> list[str]:
    """The command with the server's `--port` set to `port` (replaced where given, else added)."""
    out = list(argv)
    found = False
    i = server_args
    while i < len(out):
        if out[i] == "--port" and i + 1 < len(out):
            out[i + 1], found = str(port), True
            i += 2
            continue
        if out[i].startswith("--port="):
            out[i], found = f"--port={port}", True
        i += 1
    return out if found else [*out, "--port", str(port)]


# --------------------------------------------------------------------------------------- GPU


def gpu_placement(
    snapshot: UnitGpuSnapshot, server_argv: Sequence[str], *, where: str
) -> UnitPlacement | str:
    """Free GPUs for a second copy, else the original's GPUs if their free memory holds its
    share; else why not (a sentence with the figures)."""
    if snapshot.note is not None and snapshot.apps is None:
        return f"no room beside {where}: nvidia-smi could not tell ({snapshot.note})"
    gpus = [g for g in snapshot.gpus if g.index is not None]
    if not gpus:
        return f"no room beside {where}: nvidia-smi lists no GPU"
    busy = {a.gpu_uuid for a in snapshot.apps or () if a.gpu_uuid is not None}
    own = snapshot.unit_gpus
    need = max(len(own), _tensor_parallel(server_argv))
    free = [g for g in gpus if g.uuid not in busy]
    if len(free) >= need:
        chosen = free[:need]
        return UnitPlacement(
            f"{_gpus_text(chosen)} (no compute process on {'it' if need == 1 else 'them'})",
            env={"CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in chosen)},
        )
    share_text = option_value(server_argv, "--gpu-memory-utilization")
    share = _fraction(share_text) or VLLM_GPU_MEMORY_UTILIZATION
    shown = f"--gpu-memory-utilization {share:g}" + ("" if share_text else " (vLLM's default)")
    mine = [g for g in gpus if g.uuid in own] or gpus[:need]
    short = [g for g in mine if _free_mib(g) < share * (g.memory_total_mib or 0)]
    if mine and not short and all(g.memory_total_mib for g in mine):
        return UnitPlacement(
            f"{_gpus_text(mine)} beside the original (free memory holds its {shown})",
            env={"CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in mine)},
        )
    figures = "; ".join(
        f"GPU {g.index} ({g.name or '?'}): {g.memory_used_mib} of {g.memory_total_mib} MiB "
        f"used, {_free_mib(g)} MiB free, {share * (g.memory_total_mib or 0):.0f} MiB needed"
        for g in mine
    )
    return (
        f"no room beside {where}: it runs with {shown} on {_gpus_text(mine)}, so a second copy "
        f"needs that share free: {figures}; and {len(free)} of {len(gpus)} GPUs have no compute "
        f"process ({need} needed)"
    )


def _gpus_text(gpus: Sequence[Gpu]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g.index) for g in gpus)


def _free_mib(gpu: Gpu) -> int:
    return (gpu.memory_total_mib or 0) - (gpu.memory_used_mib or 0)


def _fraction(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 < value <= 1 else None


def _tensor_parallel(argv: Sequence[str]) -> int:
    text = option_value(argv, "--tensor-parallel-size") or option_value(argv, "-tp") or "1"
    return int(text) if text.isdigit() and int(text) > 0 else 1


# --------------------------------------------------------------------------------------- CPU


def parse_cpu_list(text: str) -> list[int]:
    """`0-3,5`, `0 1 2` or `0-1|2-3` (vLLM's ranks) as sorted core numbers; '' is none."""
    cores: set[int] = set()
    for part in re.split(r"[\s,|]+", text.strip()):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        cores.update(range(int(low), int(high or low) + 1))
    return sorted(cores)


def format_cpu_list(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def cpu_placement(
    online: Sequence[int],
    affinity: Sequence[int],
    env: Mapping[str, str],
    server_argv: Sequence[str],
    *,
    where: str,
    taken: Collection[int] = (),
) -> UnitPlacement | str:
    """Cores the original's compute threads leave free, less `taken` (given to this run's other
    transient units); else why not (with the figures)."""
    allowed = sorted(set(affinity) & set(online)) if affinity else sorted(online)
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() or "auto"
    if affinity:
        used, how = allowed, f"CPUAffinity={format_cpu_list(allowed)}"
    elif bind == "nobind":
        used, how = allowed, "VLLM_CPU_OMP_THREADS_BIND=nobind (every core)"
    elif bind == "auto":
        reserved_text = env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "")
        reserved = int(reserved_text) if reserved_text.isdigit() else _tensor_parallel(server_argv)
        used = allowed[: max(len(allowed) - reserved, 1)]
        how = (
            f"VLLM_CPU_OMP_THREADS_BIND=auto binds its threads to cores {format_cpu_list(used)} "
            f"of {format_cpu_list(allowed)}, leaving the last {reserved} to its front end"
        )
    else:
        try:
            used = parse_cpu_list(bind)
        except ValueError:
            return f"no room beside {where}: VLLM_CPU_OMP_THREADS_BIND={bind!r} is not a core list"
        how = f"VLLM_CPU_OMP_THREADS_BIND={bind}"
    free = [c for c in online if c not in set(used) | set(taken)]
    if not free:
        others = f"; this run's other candidates hold {format_cpu_list(taken)}" if taken else ""
        return (
            f"no room beside {where}: its threads use every core of the host ({how}; "
            f"{len(online)} online: {format_cpu_list(online)}{others}), so a second copy has "
            "none of its own"
        )
    cores = format_cpu_list(free)
    return UnitPlacement(
        f"{'core' if len(free) == 1 else 'cores'} {cores} (the original: {how})",
        env={"VLLM_CPU_OMP_THREADS_BIND": cores},
        properties=(f"CPUAffinity={' '.join(map(str, free))}",),
        cores=tuple(free),
    )
