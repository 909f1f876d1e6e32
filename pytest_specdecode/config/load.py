"""Load levels and their SLOs: what a level is, and how the command line and the TOML give them.

A level is closed-loop (`concurrency` N: N requests in flight, the next sent as one ends) or
open-loop (`rate`: Poisson arrivals at that many requests per second, seeded), or both (open-loop
arrivals with at most N in flight, as vLLM bench's `--request-rate` with `--max-concurrency`).
The requests of a level are sent by `measure.loadgen.run_level`; its aggregates are
`record.level_stats`.

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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ConfigError

PERCENTILE_KEY = re.compile(r"^(ttft|tpot|e2e)_p(\d{1,2}(?:\.\d+)?)_ms$")


class Timed(Protocol):
    """What an SLO and the aggregates read from a sample (record.samples.RequestSample has it)."""

    ttft_s: float
    e2e_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float | None: ...

    @property
    def tokens_per_s(self) -> float: ...


@dataclass(frozen=True)
class LoadLevel:
    """One load level: closed-loop concurrency, open-loop Poisson rate, or both."""

    concurrency: int | None = None  # requests in flight at most (closed loop without a rate)
    rate: float | None = None  # requests per second, Poisson arrivals (open loop)
    seed: int = 0  # for the arrivals

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ValueError("a load level needs a concurrency, a rate, or both")
        c = self.concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"concurrency must be an integer >= 1, got {c!r}")
        r = self.rate
        if r is not None and (isinstance(r, bool) or not math.isfinite(r) or r <= 0):
            raise ValueError(f"rate must be a positive number of requests per second, got {r!r}")

    @property
    def label(self) -> str:
        """A short, stable name: "c4", "r2.5", "r2.5-c8"."""
        parts = []
        if self.rate is not None:
            parts.append(f"r{self.rate:g}")
        if self.concurrency is not None:
            parts.append(f"c{self.concurrency}")
        return "-".join(parts)

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "concurrency": self.concurrency, "rate": self.rate}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadLevel:
        return cls(concurrency=data.get("concurrency"), rate=data.get("rate"))


@dataclass(frozen=True)
class SLO:
    """Service-level objectives of one level.

    Per-request limits decide which requests count towards goodput (a request is good when it
    meets all of them, as in vLLM bench's `--goodput`). Percentile limits are checks on the
    level's distribution, keyed `ttft_p99_ms`, `tpot_p50_ms`, `e2e_p90_ms` and so on.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    percentiles: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            _check_limit(key, getattr(self, key))
        for key, value in self.percentiles.items():
            if not PERCENTILE_KEY.match(key):
                raise ValueError(
                    f"unknown percentile limit {key!r}; use ttft|tpot|e2e, a percentile and "
                    "_ms, e.g. ttft_p99_ms or tpot_p50_ms"
                )
            _check_limit(key, value)

    @property
    def per_request(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def good(self, sample: Timed) -> bool:
        """Whether one request meets every per-request limit."""
        tpot = sample.tpot_s
        return (
            (self.ttft_ms is None or sample.ttft_s * 1000 <= self.ttft_ms)
            and (self.tpot_ms is None or (tpot is not None and tpot * 1000 <= self.tpot_ms))
            and (self.e2e_ms is None or sample.e2e_s * 1000 <= self.e2e_ms)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "e2e_ms": self.e2e_ms,
            "percentiles": dict(self.percentiles),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SLO:
        return cls(
            ttft_ms=data.get("ttft_ms"),
            tpot_ms=data.get("tpot_ms"),
            e2e_ms=data.get("e2e_ms"),
            percentiles=dict(data.get("percentiles") or {}),
        )


def _check_limit(key: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{key} must be a positive number of milliseconds, got {value!r}")


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
