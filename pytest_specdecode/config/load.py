"""Load levels and their SLOs, from the command line and the TOML: parsers for settings.py.

Command line: `--spec-concurrency 1,4,16` gives closed-loop levels; `--spec-rate 0.5,2` gives
open-loop levels (Poisson arrivals, seeded), each capped at the concurrency when exactly one is
given too. TOML:

    [slo]                 # every level: per-request limits (goodput) and percentile limits
    ttft_ms = 2000
    tpot_ms = 150
    tpot_p99_ms = 300
    [slo.levels.c16]      # one level, by its label (c16, r2, r2-c8): overrides the above
    tpot_ms = 300

Errors are ConfigError naming the option or the file and table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..measure.levels import SLO, LoadLevel

_REQUEST_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def parse_int_list(value: str | int | Sequence[int], *, source: str) -> tuple[int, ...]:
    """ "1,4,16" (or 4, or [1, 4]) as distinct integers >= 1, in the order given."""
    items = _items(value, source)
    out = []
    for item in items:
        try:
            number = int(item)
        except (TypeError, ValueError):
            number = 0
        if isinstance(item, bool) or number < 1 or str(number) != str(item).strip():
            raise ConfigError(f"{source}: {item!r} is not an integer >= 1 (e.g. 1,4,16)")
        out.append(number)
    return _distinct(out, source)


def parse_float_list(value: str | float | Sequence[float], *, source: str) -> tuple[float, ...]:
    """ "0.5,2" (or 2.0, or [0.5, 2]) as distinct positive finite numbers, in the order given."""
    out = []
    for item in _items(value, source):
        try:
            number = float(item)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(item, bool) or not math.isfinite(number) or number <= 0:
            raise ConfigError(f"{source}: {item!r} is not a positive number (e.g. 0.5,2)")
        out.append(number)
    return _distinct(out, source)


def load_levels(
    concurrency: str | int | Sequence[int] | None = None,
    rate: str | float | Sequence[float] | None = None,
    *,
    seed: int = 0,
) -> tuple[LoadLevel, ...]:
    """The levels each phase measures, in order; one closed-loop level of 1 by default."""
    conc = parse_int_list(concurrency, source="--spec-concurrency") if concurrency else ()
    rates = parse_float_list(rate, source="--spec-rate") if rate else ()
    if not rates:
        return tuple(LoadLevel(concurrency=c) for c in conc or (1,))
    if len(conc) > 1:
        raise ConfigError(
            f"--spec-rate with several --spec-concurrency values ({', '.join(map(str, conc))}) "
            "is ambiguous: give one concurrency, the cap on requests in flight at every rate"
        )
    cap = conc[0] if conc else None
    return tuple(LoadLevel(concurrency=cap, rate=r, seed=seed) for r in rates)


@dataclass(frozen=True)
class SLOConfig:
    """The SLO of every level, with per-level overrides by label."""

    default: SLO = field(default_factory=SLO)
    per_level: Mapping[str, SLO] = field(default_factory=dict)

    def for_level(self, level: LoadLevel) -> SLO:
        return self.per_level.get(level.label, self.default)


def slo_config(table: Mapping[str, Any], *, where: str) -> SLOConfig:
    """The `[slo]` table (see the module doc); an empty table sets no limit."""
    here = f"{where} [slo]"
    levels = table.get("levels", {})
    if not isinstance(levels, Mapping):
        raise ConfigError(f"{here}: levels must be a table of level labels (e.g. [slo.levels.c16])")
    base = {k: v for k, v in table.items() if k != "levels"}
    default = _slo(base, here)
    per_level = {}
    for label, values in levels.items():
        if not isinstance(values, Mapping):
            raise ConfigError(f"{here}: levels.{label} must be a table of limits")
        per_level[str(label)] = _slo({**base, **values}, f"{where} [slo.levels.{label}]")
    return SLOConfig(default=default, per_level=per_level)


def check_slo_levels(config: SLOConfig, levels: Sequence[LoadLevel], *, where: str) -> None:
    """A per-level SLO must name a level that is measured (a typo would silently not apply)."""
    labels = [level.label for level in levels]
    unknown = [label for label in config.per_level if label not in labels]
    if unknown:
        raise ConfigError(
            f"{where} [slo.levels]: no measured level {', '.join(unknown)}; "
            f"the levels are {', '.join(labels)}"
        )


def _slo(values: Mapping[str, Any], here: str) -> SLO:
    request = {k: values[k] for k in _REQUEST_KEYS if k in values}
    percentiles = {k: v for k, v in values.items() if k not in _REQUEST_KEYS}
    try:
        return SLO(**request, percentiles=percentiles)
    except ValueError as exc:
        raise ConfigError(f"{here}: {exc}") from None


def _items(value: Any, source: str) -> list[Any]:
    if isinstance(value, str):
        items: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    if not items or any(item == "" for item in items):
        raise ConfigError(f"{source}: expected a comma-separated list, got {value!r}")
    return items


def _distinct(values: list[Any], source: str) -> tuple[Any, ...]:
    if len(set(values)) != len(values):
        raise ConfigError(f"{source}: a level is given twice: {values}")
    return tuple(values)
