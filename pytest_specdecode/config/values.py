"""The checks every table of the experiment's TOML shares: a ConfigError names the file, the
table and the key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def no_unknown(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def positive_int(value: Any, key: str, where: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")


def positive_number(value: Any, key: str, here: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{here}: {key} must be a positive number, got {value!r}")
    return float(value)


def path_of(value: Any, base: Path) -> Path | None:
    if value is None:
        return None
    path = Path(os.path.expanduser(str(value)))
    return path if path.is_absolute() else (base / path).resolve()
