"""The `[shape]` table and `--spec-shape`: which shape to serve, and at which depths.

    [shape]
    source = "unit"        # the served model's own config.json, read where its server loads it
                           # ("served" is the same); "file:PATH" a config.json on this machine;
                           # or a named shape: llama-3.1-8b, llama-3.2-1b, deepseek-v3, kimi-k2
    layers = "auto"        # the largest depth that fits; or N, or [N, M] (the map's per-depth
                           # fit): each checked against the room

`--spec-shape SOURCE` and `--spec-shape-layers auto|N[,N...]` override the table's keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..values import no_unknown
from .named import NAMED

SERVED_SOURCES = ("unit", "served")  # the served model's own config.json
FILE_PREFIX = "file:"
_KEYS = {"source", "layers"}


@dataclass(frozen=True)
class ShapeConfig:
    """What was asked: the shape's source and its depths (None: auto, the largest that fits)."""

    source: str  # "unit", "file:/abs/path/config.json" or a named shape
    layers: tuple[int, ...] | None = None

    @property
    def served(self) -> bool:
        return self.source in SERVED_SOURCES

    @property
    def path(self) -> Path | None:
        """A `file:` source's config.json (a folder's, where it names a folder)."""
        if not self.source.startswith(FILE_PREFIX):
            return None
        path = Path(self.source.removeprefix(FILE_PREFIX))
        return path / "config.json" if path.is_dir() else path

    @property
    def layers_text(self) -> str:
        return "auto" if self.layers is None else ", ".join(map(str, self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "layers": list(self.layers) if self.layers else None}


def shape_config(
    table: Mapping[str, Any], overrides: Mapping[str, Any], *, base: Path, where: str
) -> ShapeConfig | None:
    """The [shape] table with the command line's overrides; None where neither asks for one."""
    here = f"{where} [shape]"
    no_unknown(table, _KEYS, here)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**table, **given}
    if not merged:
        return None
    source = merged.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(
            f"{here}: source must be 'unit', 'file:PATH' or one of {', '.join(NAMED)}, got "
            f"{source!r}"
        )
    source = source.strip()
    if source.startswith(FILE_PREFIX):
        raw = os.path.expanduser(source.removeprefix(FILE_PREFIX))
        path = Path(raw) if os.path.isabs(raw) or "source" in given else base / raw
        source = FILE_PREFIX + str(path.resolve())
        found = path / "config.json" if path.is_dir() else path
        if not found.is_file():
            raise ConfigError(f"{here}: source {source!r}: {found} is not a readable file")
    elif source.lower() in NAMED:
        source = source.lower()
    elif source not in SERVED_SOURCES:
        raise ConfigError(
            f"{here}: no shape {source!r}: give 'unit' (the served model's own config.json), "
            f"'file:PATH' (a config.json here) or a named shape: {', '.join(NAMED)}"
        )
    return ShapeConfig(source, _layers(merged.get("layers", "auto"), here))


def _layers(value: Any, here: str) -> tuple[int, ...] | None:
    """`auto`, N, [N, M] or "N,M" (the option's form) as depths; None for auto."""
    if value is None or value == "auto":
        return None
    items = value.split(",") if isinstance(value, str) else value
    items = items if isinstance(items, list | tuple) else [items]
    depths = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        number = int(text) if isinstance(text, str) and text.isdigit() else text
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ConfigError(
                f"{here}: layers must be 'auto', a depth or a list of depths (each >= 1), got "
                f"{value!r}"
            )
        depths.append(number)
    if not depths:
        raise ConfigError(f"{here}: layers is an empty list; give 'auto' or a depth")
    return tuple(sorted(set(depths)))
