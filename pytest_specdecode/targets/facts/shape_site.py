"""What the shape target reads before anything is touched: the shape's config.json where it is,
the tokenizer's vocabulary, and the room on the serving host. Reads only.

- `unit`: the config.json where the target's server loads its model (`model_site`, the same
  read as the drafter check's: this machine, over SSH, in the unit's container);
- `file:PATH`: a config.json on this machine;
- a named shape (config/shape/named.py): no read at all.
The room: the server's GPUs (nvidia-smi, its CUDA_VISIBLE_DEVICES, tensor x pipeline parallel)
at its `--gpu-memory-utilization`; without GPUs, the host's MemAvailable and
VLLM_CPU_KVCACHE_SPACE. None where neither can be read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ...config.shape.geometry import Shape
from ...config.shape.memory import Room, cpu_room, gpu_room
from ...config.shape.named import named_shape
from ...config.shape.table import ShapeConfig
from ...config.vllm_argv import VLLM_GPU_MEMORY_UTILIZATION, option_value
from ...errors import ConfigError, HostError
from ..hosts.base import Host
from .gpu import GPUS_QUERY, GpuOutputError, parse_gpus
from .model_config import ModelFiles, ModelSite, read_model_config


def read_shape(asked: ShapeConfig, site: ModelSite | None) -> tuple[Shape, int | None]:
    """The shape asked for, and the vocabulary of the target's own model (its tokenizer's ids
    stay below it), where its config.json could be read; ConfigError where the shape cannot."""
    served = _served_files(site)
    vocab = _vocab(served.config) if served is not None else None
    if asked.served:
        if served is None or site is None:
            where = site.where if site is not None else "the target"
            raise ConfigError(
                f"{where}: the server command names no model whose config.json could be read, "
                "so there is no served shape to serve; give [shape] source = 'file:PATH' or a "
                "named shape. Nothing was touched"
            )
        origin = f"the served model's config.json, {served.resolved} on {site.host.name}"
        return Shape(asked.source, origin, served.config), vocab
    path = asked.path
    if path is not None:
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"[shape] source {asked.source}: {path} is not read: {exc}") from None
        if not isinstance(config, dict):
            raise ConfigError(f"[shape] source {asked.source}: {path} is not a JSON object")
        return Shape(asked.source, f"{path} on this machine", config), vocab
    return named_shape(asked.source), vocab


def _served_files(site: ModelSite | None) -> ModelFiles | None:
    if site is None or site.model is None:
        return None
    return read_model_config(
        site.host,
        site.on_host(site.model),
        where=site.where,
        what="the served model",
        hub_cache=site.hub_cache,
    )


def _vocab(config: Mapping[str, object]) -> int | None:
    text = config.get("text_config")
    found = (text if isinstance(text, Mapping) else config).get("vocab_size")
    return found if isinstance(found, int) else None


_MEMINFO = "grep -m1 '^MemAvailable:' /proc/meminfo"


def read_room(host: Host, argv: Sequence[str], env: Mapping[str, str]) -> Room | None:
    """The room the server's command gives a model on `host`; None where it cannot be read."""
    try:
        result = host.run(["nvidia-smi", *GPUS_QUERY], timeout=30, privileged=False)
        gpus = parse_gpus(result.stdout) if result.ok else []
    except (HostError, GpuOutputError):
        gpus = []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        gpus = [g for i in wanted for g in gpus if g.index == i]
    if gpus:
        used = gpus[: max(1, _parallel(argv))]
        totals = [g.memory_total_mib for g in used if g.memory_total_mib]
        if len(totals) == len(used):
            share = _share(argv)
            names = [g.name or "GPU" for g in used]
            return gpu_room(totals, share=share, host=host.name, names=names, visible=len(gpus))
    try:
        found = host.run(["sh", "-c", _MEMINFO], timeout=30, privileged=False)
    except HostError:
        return None
    words = found.stdout.split()
    if not found.ok or len(words) < 2 or not words[1].isdigit():
        return None
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    return cpu_room(
        int(words[1]) * 1024, kv_space_gib=int(space) if space.isdigit() else None, host=host.name
    )


def _parallel(argv: Sequence[str]) -> int:
    """GPUs one server uses: tensor x pipeline parallel."""
    out = 1
    for flags in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
        text = next((v for f in flags if (v := option_value(argv, f)) is not None), "1")
        out *= int(text) if text.isdigit() and int(text) > 0 else 1
    return out


def _share(argv: Sequence[str]) -> float:
    text = option_value(argv, "--gpu-memory-utilization")
    try:
        value = float(text) if text is not None else VLLM_GPU_MEMORY_UTILIZATION
    except ValueError:
        return VLLM_GPU_MEMORY_UTILIZATION
    return value if 0 < value <= 1 else VLLM_GPU_MEMORY_UTILIZATION
