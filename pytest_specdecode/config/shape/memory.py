"""The depth that fits: a shape's memory per layer, and the room the serving host gives it.

Pure arithmetic over the config.json's figures; the room is read on the host by
targets/facts/shape_site.py. What a depth needs:
- weights: the embedding and the LM head (once where tied), then per layer its attention
  (q, k, v and o; with MLA the low-rank q and kv projections) and its MLP: a dense layer's
  gate, up and down; a MoE layer's routed experts, shared experts and router. In the dtype the
  server loads (bf16 unless the command or the config says float32); the layers' linear weights
  in one byte where the config's quantization is fp8, the embedding and head staying in the
  dtype;
- a KV-cache floor: one sequence of the server's max_model_len, vLLM's own condition to start
  (MLA keeps kv_lora_rank + qk_rope_head_dim a token and layer; others 2 x KV heads x head_dim);
- on a GPU an allowance per GPU for the CUDA context, the profile run's activations and the
  CUDA graphs, outside vLLM's share of the memory it fills with KV cache.
These are estimates to choose a depth, not vLLM's own accounting: the server's start says the
rest, and a start that does not fit fails before anything is measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ShapeRefused
from .geometry import Shape

GIB = 1 << 30
GPU_ALLOWANCE = 2 * GIB  # per GPU: CUDA context, profile-run activations, CUDA graphs
CPU_ALLOWANCE = 2 * GIB  # the server's own processes beside its weights
ONE_BYTE = ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt")  # quant_method: linear weights in 1 byte


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


@dataclass(frozen=True)
class Room:
    """Where the shape must fit, from what the serving host told: the server's GPUs at its share
    of their memory, or a CPU host's available memory (and its KV space apart); `servers`
    sharing it (1: the server alone; side by side, each gets its part)."""

    device: str  # "gpu" or "cpu"
    host: str
    totals_mib: tuple[int, ...] = ()  # GPU: each of the server's GPUs' memory
    names: tuple[str, ...] = ()  # GPU: their names
    share: float = 0.9  # GPU: --gpu-memory-utilization (each server's, side by side)
    available_bytes: int = 0  # CPU: MemAvailable
    kv_space_gib: int | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE
    visible_gpus: int = 0  # GPU: all the server may see (side by side, each may get its own)
    servers: int = 1  # servers sharing it
    beside: str = ""  # how they share it, in words
    tensor_parallel: int = 1  # GPU: of its GPUs, the tensor parallel group (the rest: pipeline)

    @property
    def gpus(self) -> int:
        return len(self.totals_mib)

    @property
    def per_gpu(self) -> int:
        """GPU: what the smallest of its GPUs holds at the share, less the allowance: the weights
        are split evenly over the GPUs, so the smallest bounds each part."""
        usable = [int(t * (1 << 20) * self.share) - GPU_ALLOWANCE for t in self.totals_mib]
        return max(min(usable, default=0), 0)

    def kv_split(self, shape: Shape) -> int:
        """Over how many GPUs one sequence's KV cache is split: the pipeline's stages, and the
        tensor parallel ranks up to the KV heads (a rank keeps one head at least); MLA's latent
        cache is whole on every rank of the group."""
        pipeline = max(1, self.gpus // max(1, self.tensor_parallel))
        ranks = 1 if shape.mla else max(1, min(self.tensor_parallel, shape.kv_heads))
        return pipeline * ranks

    @property
    def bytes(self) -> int:
        """For the weights (and, where `kv_bytes` is None, the KV cache too): on GPUs, every GPU
        of the server's, each at the smallest one's part."""
        if self.device == "gpu":
            return self.gpus * self.per_gpu
        each = self.available_bytes // self.servers - (self.kv_bytes or 0) - CPU_ALLOWANCE
        return max(each, 0)

    @property
    def kv_bytes(self) -> int | None:
        return self.kv_space_gib * GIB if self.kv_space_gib else None

    @property
    def where(self) -> str:
        if self.device == "gpu":
            kinds = ", ".join(sorted(set(self.names))) or "GPU"
            text = (
                f"{len(self.totals_mib)} x {kinds} "
                f"({', '.join(f'{t} MiB' for t in self.totals_mib)}) x "
                f"--gpu-memory-utilization {self.share:g}, less {gib(GPU_ALLOWANCE)} a GPU, "
                + (f"tensor parallel {self.tensor_parallel}, " if self.tensor_parallel > 1 else "")
                + f"on {self.host}"
            )
        else:
            kv = f", VLLM_CPU_KVCACHE_SPACE={self.kv_space_gib} GiB for the KV cache"
            part = f", split {self.servers} ways" if self.servers > 1 else ""
            text = (
                f"{gib(self.available_bytes)} of memory available on {self.host}{part}"
                f"{kv if self.kv_space_gib else ''}, less {gib(CPU_ALLOWANCE)} for the server"
            )
        return text + (f"; {self.beside}" if self.beside else "")

    def shared(self, servers: int, *, share: float, beside: str) -> Room:
        """The room of each of `servers` servers side by side: GPUs of their own where enough
        are visible (the room unchanged), else the same GPUs at `share` each; on a CPU, the
        memory split."""
        own = self.visible_gpus >= servers * len(self.totals_mib)
        if servers <= 1 or (self.device == "gpu" and own):
            return self
        changes: dict[str, Any] = {"servers": servers, "beside": beside}
        if self.device == "gpu":
            changes["share"] = min(self.share, share)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        return {**found, "totals_mib": list(self.totals_mib), "names": list(self.names),
                "bytes": self.bytes, "where": self.where}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Room:
        names = {f.name for f in dataclasses.fields(cls)}
        found = {k: v for k, v in data.items() if k in names}
        return cls(**{**found, "totals_mib": tuple(found.get("totals_mib") or ()),
                      "names": tuple(found.get("names") or ())})  # fmt: skip


def gpu_room(
    totals_mib: Sequence[int],
    *,
    share: float,
    host: str,
    names: Sequence[str] = (),
    visible: int | None = None,
    tensor_parallel: int = 1,
) -> Room:
    """The server's GPUs: each one's memory x its share (`--gpu-memory-utilization`), less the
    allowance per GPU; `visible`: all the GPUs it may see (default: its own); `tensor_parallel`:
    of its GPUs, the tensor parallel group's (the others are pipeline stages)."""
    return Room(
        "gpu",
        host,
        totals_mib=tuple(totals_mib),
        names=tuple(names),
        share=share,
        visible_gpus=visible if visible is not None else len(totals_mib),
        tensor_parallel=tensor_parallel,
    )


def cpu_room(available_bytes: int, *, kv_space_gib: int | None, host: str) -> Room:
    """A CPU server: the host's available memory, less its KV cache where
    VLLM_CPU_KVCACHE_SPACE sets one apart, less the allowance."""
    return Room("cpu", host, available_bytes=available_bytes, kv_space_gib=kv_space_gib)


@dataclass(frozen=True)
class ShapeBytes:
    """One layer's weights by kind, the embeddings, and one layer's KV cache per token."""

    attention: int
    dense_mlp: int
    moe_mlp: int  # routed experts, shared experts and router; 0 for a dense model
    embeddings: int  # embedding and LM head
    kv_per_token: int  # one layer's

    def weights(self, shape: Shape, depth: int) -> int:
        dense = min(depth, shape.first_dense) if shape.is_moe else depth
        return (
            self.embeddings
            + depth * self.attention
            + dense * self.dense_mlp
            + (depth - dense) * self.moe_mlp
        )

    def kv_floor(self, depth: int, max_model_len: int) -> int:
        return depth * self.kv_per_token * max_model_len

    def per_layer(self, shape: Shape) -> int:
        """What one more layer past the dense ones costs in weights."""
        return self.attention + (self.moe_mlp if shape.is_moe else self.dense_mlp)


def shape_bytes(shape: Shape, *, dtype_bytes: int, kv_dtype_bytes: int) -> ShapeBytes:
    """The shape's bytes: weights in `dtype_bytes` (its layers' in one where fp8), KV cache in
    `kv_dtype_bytes`."""
    t, h = shape.text, shape.hidden
    linear = 1 if shape.quantization in ONE_BYTE else dtype_bytes
    if shape.mla:
        heads, rope = shape.heads, int(t.get("qk_rope_head_dim") or 0)
        q_head = int(t.get("qk_nope_head_dim") or 0) + rope
        kv_lora, q_lora = int(t["kv_lora_rank"]), int(t.get("q_lora_rank") or 0)
        q = h * q_lora + q_lora * heads * q_head if q_lora else h * heads * q_head
        v = int(t.get("v_head_dim") or shape.head_dim)
        attention = q + h * (kv_lora + rope) + kv_lora * heads * (q_head - rope + v) + heads * v * h
        kv_token = kv_lora + rope
    else:
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        attention = h * q + 2 * h * kv + q * h
        kv_token = 2 * kv
    moe = 0
    if shape.is_moe:
        experts = shape.routed_experts * 3 * h * shape.moe_intermediate
        moe = experts + 3 * h * shape.shared_intermediate + h * shape.routed_experts
    return ShapeBytes(
        attention=attention * linear,
        dense_mlp=3 * h * shape.intermediate * linear,
        moe_mlp=moe * linear,
        embeddings=(1 if shape.tied else 2) * shape.vocab * h * dtype_bytes,
        kv_per_token=kv_token * kv_dtype_bytes,
    )


@dataclass(frozen=True)
class DepthFit:
    """The depths chosen for a shape in a room (ascending: the largest is served), and the
    figures that chose them."""

    depths: tuple[int, ...]
    asked: str  # "auto" or the depths asked, e.g. "2, 4"
    bytes: ShapeBytes
    room: Room
    max_model_len: int
    full: int  # the shape's own depth

    def need(self, shape: Shape, depth: int) -> tuple[int, int]:
        """(weights, KV floor) at `depth`."""
        return self.bytes.weights(shape, depth), self.bytes.kv_floor(depth, self.max_model_len)

    def describe(self, shape: Shape, depth: int | None = None) -> str:
        """`2 of 32 layers: 3.1 GiB of weights and 0.1 GiB of KV cache for one 2048-token
        sequence, in 14.0 GiB (…)`."""
        depth = depth or self.depths[-1]
        weights, kv = self.need(shape, depth)
        room = self.room
        each = ""
        if room.device == "gpu" and room.gpus > 1:
            whole = " (MLA's latent cache, whole on every rank)" if shape.mla else ""
            each = (
                f"; on each of its {room.gpus} GPUs {gib(weights / room.gpus)} of weights and "
                f"{gib(kv / room.kv_split(shape))} of KV cache{whole}, in {gib(room.per_gpu)}"
            )
        return (
            f"{depth} of {self.full} layers: {gib(weights)} of weights and {gib(kv)} of KV "
            f"cache for one {self.max_model_len}-token sequence, in {gib(room.bytes)}{each} "
            f"({room.where})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "depths": list(self.depths),
            "asked": self.asked,
            "bytes": vars(self.bytes).copy(),
            "room": self.room.to_dict(),
            "max_model_len": self.max_model_len,
            "full": self.full,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DepthFit:
        return cls(
            depths=tuple(int(d) for d in data["depths"]),
            asked=str(data["asked"]),
            bytes=ShapeBytes(**{k: int(v) for k, v in data["bytes"].items()}),
            room=Room.from_dict(data["room"]),
            max_model_len=int(data["max_model_len"]),
            full=int(data["full"]),
        )


def fits(shape: Shape, sizes: ShapeBytes, room: Room, depth: int, max_model_len: int) -> bool:
    """Whether `depth` fits: on GPUs, each GPU's part of the weights and of the KV cache in
    each GPU's room (`Room.kv_split`); on a CPU, in its memory (and its KV space apart)."""
    weights, kv = sizes.weights(shape, depth), sizes.kv_floor(depth, max_model_len)
    if room.device == "gpu":
        return weights / max(1, room.gpus) + kv / room.kv_split(shape) <= room.per_gpu
    if room.kv_bytes is not None:
        return weights <= room.bytes and kv <= room.kv_bytes
    return weights + kv <= room.bytes


def fit_depths(
    shape: Shape,
    asked: Sequence[int] | None,
    room: Room,
    *,
    max_model_len: int,
    dtype_bytes: int = 2,
    kv_dtype_bytes: int | None = None,
) -> DepthFit:
    """The depths to serve: those `asked`, each checked; or (None: auto) the largest that fits.

    Raises ShapeRefused, with the figures, where a depth asked is below the shape's minimum or
    above its own, or where a depth (auto: even the minimum) does not fit."""
    kv_bytes = kv_dtype_bytes or dtype_bytes
    sizes = shape_bytes(shape, dtype_bytes=dtype_bytes, kv_dtype_bytes=kv_bytes)
    low, full = shape.min_depth, shape.layers

    def fit(depths: tuple[int, ...], said: str) -> DepthFit:
        return DepthFit(depths, said, sizes, room, max_model_len, full)

    if asked is None:
        if not fits(shape, sizes, room, low, max_model_len):
            raise ShapeRefused(
                f"the shape {shape.source} cannot fit even at its minimum depth: "
                f"{fit((low,), 'auto').describe(shape)}{_why_minimum(shape)}"
            )
        best = max(d for d in range(low, full + 1) if fits(shape, sizes, room, d, max_model_len))
        return fit((best,), "auto")
    said = ", ".join(map(str, asked))
    depths = tuple(sorted(set(asked)))
    wrong = [d for d in depths if not low <= d <= full]
    if wrong:
        raise ShapeRefused(
            f"the shape {shape.source} cannot be cut to {', '.join(map(str, wrong))} layers: its "
            f"depths run from {low}{_why_minimum(shape)} to its own {full}"
        )
    large = [d for d in depths if not fits(shape, sizes, room, d, max_model_len)]
    if large:
        raise ShapeRefused(
            f"the shape {shape.source} does not fit at "
            + "; ".join(fit(depths, said).describe(shape, d) for d in large)
        )
    return fit(depths, said)


def _why_minimum(shape: Shape) -> str:
    if not shape.first_dense:
        return ""
    return (
        f" ({shape.first_dense} dense layers, first_k_dense_replace, then one MoE layer, so that "
        "the cut keeps its experts)"
    )
