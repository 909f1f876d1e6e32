"""What the shape target reads before anything is touched: the shape's config.json where it is,
the tokenizer's vocabulary, and the room on the serving host. Reads only.

- `unit`: the config.json where the target's server loads its model (`model_site`, the same
  read as the drafter check's: this machine, over SSH, in the unit's container);
- `file:PATH`: a config.json on this machine;
- a named shape (config/shape/named.py): no read at all.
The room: the server's GPUs (nvidia-smi, its CUDA_VISIBLE_DEVICES, tensor x pipeline parallel:
targets/facts/devices.py) at its `--gpu-memory-utilization`, a tensor parallel size larger than
the GPUs it sees refused; without GPUs, the host's MemAvailable and
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
from .devices import read_server_gpus
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
    """The room the server's command gives a model on `host`: every GPU of its tensor (x
    pipeline) parallel group; None where it cannot be read. ConfigError, with the figures, where
    the command asks for more GPUs than it sees (targets/facts/devices.py)."""
    found = read_server_gpus(host, argv, env)
    why = found.refusal()
    if why:
        raise ConfigError(f"the shape's room on {host.name}: {why}; nothing was touched")
    used = found.used
    totals = [g.memory_total_mib for g in used if g.memory_total_mib]
    if used and len(totals) == len(used):
        return gpu_room(
            totals,
            share=_share(argv),
            host=host.name,
            names=[g.name or "GPU" for g in used],
            visible=len(found.seen),
            tensor_parallel=found.tensor_parallel,
        )
    try:
        found_mem = host.run(["sh", "-c", _MEMINFO], timeout=30, privileged=False)
    except HostError:
        return None
    words = found_mem.stdout.split()
    if not found_mem.ok or len(words) < 2 or not words[1].isdigit():
        return None
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    return cpu_room(
        int(words[1]) * 1024, kv_space_gib=int(space) if space.isdigit() else None, host=host.name
    )


def _share(argv: Sequence[str]) -> float:
    text = option_value(argv, "--gpu-memory-utilization")
    try:
        value = float(text) if text is not None else VLLM_GPU_MEMORY_UTILIZATION
    except ValueError:
        return VLLM_GPU_MEMORY_UTILIZATION
    return value if 0 < value <= 1 else VLLM_GPU_MEMORY_UTILIZATION
