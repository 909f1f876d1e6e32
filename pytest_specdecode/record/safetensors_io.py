"""The safetensors format, read and written without torch: an 8-byte little-endian header length,
a JSON header (each tensor's dtype, shape and byte range), then the raw bytes.

bf16 has no numpy dtype: its tensors are raw bytes here, and `bf16_bytes` rounds float32 to
bf16 (round to nearest even on the upper 16 bits). A tensor is read by its byte range alone, so
cutting a few layers from a large checkpoint reads only those layers.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

HEADER_LIMIT = 1 << 27  # a header larger than this is not a safetensors header
ITEM_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: dtype, shape, and its bytes' range after the header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def shapes_of_header(header: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """A parsed header's tensors and their shapes (`__metadata__` left out)."""
    return {
        name: tuple(int(n) for n in entry["shape"])
        for name, entry in header.items()
        if isinstance(entry, dict) and isinstance(entry.get("shape"), list)
    }


@dataclass(frozen=True)
class SafetensorsFile:
    """A file's header, read once; its tensors' bytes read on demand."""

    path: Path
    entries: Mapping[str, TensorEntry]
    metadata: Mapping[str, str]
    data_start: int

    @classmethod
    def open(cls, path: Path) -> SafetensorsFile:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path} is not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > HEADER_LIMIT:
                raise ConfigError(f"{path}: a safetensors header of {n} bytes is not one")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: the safetensors header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise ConfigError(f"{path}: the safetensors header is not an object")
        meta = header.get("__metadata__")
        entries = {
            name: TensorEntry(name, e["dtype"], tuple(e["shape"]), *e["data_offsets"])
            for name, e in header.items()
            if name != "__metadata__"
        }
        return cls(path, entries, dict(meta) if isinstance(meta, dict) else {}, 8 + n)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: e.shape for n, e in self.entries.items()}

    def read(self, name: str) -> bytes:
        """One tensor's raw bytes."""
        entry = self.entries[name]
        with self.path.open("rb") as f:
            f.seek(self.data_start + entry.start)
            data = f.read(entry.nbytes)
        if len(data) != entry.nbytes:
            raise ConfigError(f"{self.path}: tensor {name} is cut short")
        return data


@dataclass(frozen=True)
class TensorOut:
    """A tensor to write: its bytes come from `chunks` (called once, at its turn)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: Callable[[], Iterable[bytes]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ITEM_BYTES[self.dtype]


def write_safetensors(
    path: Path, tensors: Iterable[TensorOut], metadata: Mapping[str, str] | None = None
) -> int:
    """Write the tensors in order (the header first, padded to 8 bytes with spaces, as the
    reference writer does); returns the file's size. Each tensor's bytes are streamed."""
    items = list(tensors)
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in items:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in items:
            written = 0
            for chunk in t.chunks():
                f.write(chunk)
                written += len(chunk)
            if written != t.nbytes:
                tmp.unlink(missing_ok=True)
                raise ValueError(f"tensor {t.name}: {written} bytes given, {t.nbytes} declared")
    os.replace(tmp, path)
    return 8 + len(text) + offset


def bf16_bytes(values: np.ndarray) -> bytes:
    """float32 values as bf16 bytes: the upper 16 bits, rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def bf16_values(data: bytes) -> np.ndarray:
    """bf16 bytes back to float32 (exact: bf16 is float32's upper half)."""
    halves = np.frombuffer(data, dtype="<u2").astype(np.uint32)
    return (halves << np.uint32(16)).view(np.float32)


def chunked(total: int, step: int) -> Iterator[int]:
    """Sizes of `step` that sum to `total`."""
    while total > 0:
        yield min(step, total)
        total -= step
