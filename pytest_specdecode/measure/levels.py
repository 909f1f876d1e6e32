"""Load levels: what a level is, its SLO, and the aggregates of its samples. Pure functions.

A level is closed-loop (`concurrency` N: N requests in flight, the next sent as one ends) or
open-loop (`rate`: Poisson arrivals at that many requests per second, seeded), or both (open-loop
arrivals with at most N in flight, as vLLM bench's `--request-rate` with `--max-concurrency`).
The requests of a level are sent by `loadgen.run_level`.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SATURATED_SHARE = 0.9  # the client's CPU time over wall time at which it may be the limit

_PERCENTILE_KEY = re.compile(r"^(ttft|tpot|e2e)_p(\d{1,2}(?:\.\d+)?)_ms$")


class Timed(Protocol):
    """What the aggregates read from a sample (loadgen.RequestSample has it)."""

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


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Send times in seconds from the level's start: the first at 0, then exponential gaps."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


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
            if not _PERCENTILE_KEY.match(key):
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


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default, as vLLM bench uses)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class SLOCheck:
    """One percentile limit against its measured value."""

    key: str  # e.g. "tpot_p99_ms"
    value: float
    limit: float

    @property
    def met(self) -> bool:
        return self.value <= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "limit": self.limit, "met": self.met}


@dataclass(frozen=True)
class LevelStats:
    """The aggregates of one level's measured requests."""

    n: int
    wall_s: float
    output_tokens: int
    median_tokens_per_s: float  # per request, then the median over requests
    output_tokens_per_s: float  # all output tokens over the level's wall time
    request_rate: float  # completed requests per second of wall time
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float  # nan when no request had two tokens
    tpot_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    good: int | None  # requests meeting every per-request SLO; None without one
    goodput: float | None  # good requests per second of wall time
    slo_checks: tuple[SLOCheck, ...]
    client_cpu_share: float  # the client process's CPU time over wall time, whole level
    client_peak_cpu_share: float  # the same over the busiest window
    client_saturated: bool  # the client, not the server, may have been the limit
    peak_in_flight: int
    max_send_lag_ms: float  # open loop: how late a request left after its arrival time

    @property
    def good_fraction(self) -> float | None:
        return None if self.good is None else self.good / self.n if self.n else math.nan

    @property
    def slo_met(self) -> bool:
        return all(c.met for c in self.slo_checks)

    def warnings(self) -> list[str]:
        """What a reader of this level's figures must be told."""
        if not self.client_saturated:
            return []
        return [
            f"the load generator's process used {self.client_peak_cpu_share:.0%} of a core "
            "in its busiest window: the client, not the server, may be the limit at this level"
        ]

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "slo_checks"}
        data["slo_checks"] = [c.to_dict() for c in self.slo_checks]
        data["good_fraction"] = self.good_fraction
        data["warnings"] = self.warnings()
        return data


def level_stats(
    samples: Sequence[Timed],
    *,
    wall_s: float,
    slo: SLO | None = None,
    cpu_s: float = 0.0,
    peak_cpu_share: float | None = None,
    peak_in_flight: int = 0,
    send_lags_s: Sequence[float] = (),
) -> LevelStats:
    """The aggregates of a level from its samples and the client's own measurements."""
    slo = slo or SLO()
    ttft = [s.ttft_s * 1000 for s in samples]
    tpot = [t * 1000 for s in samples if (t := s.tpot_s) is not None]
    e2e = [s.e2e_s * 1000 for s in samples]
    values = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    checks = []
    for key, limit in slo.percentiles.items():
        match = _PERCENTILE_KEY.match(key)
        assert match is not None  # SLO checked its keys
        metric, q = match.group(1), float(match.group(2))
        checks.append(SLOCheck(key, percentile(values[metric], q), float(limit)))
    good = sum(1 for s in samples if slo.good(s)) if slo.per_request else None
    tokens = sum(s.output_tokens for s in samples)
    share = cpu_s / wall_s if wall_s > 0 else 0.0
    peak = max(share, peak_cpu_share or 0.0)
    return LevelStats(
        n=len(samples),
        wall_s=wall_s,
        output_tokens=tokens,
        median_tokens_per_s=(
            statistics.median(s.tokens_per_s for s in samples) if samples else math.nan
        ),
        output_tokens_per_s=tokens / wall_s if wall_s > 0 else math.nan,
        request_rate=len(samples) / wall_s if wall_s > 0 else math.nan,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p99_ms=percentile(tpot, 99),
        e2e_p50_ms=percentile(e2e, 50),
        e2e_p99_ms=percentile(e2e, 99),
        good=good,
        goodput=good / wall_s if good is not None and wall_s > 0 else None,
        slo_checks=tuple(checks),
        client_cpu_share=share,
        client_peak_cpu_share=peak,
        client_saturated=peak >= SATURATED_SHARE,
        peak_in_flight=peak_in_flight,
        max_send_lag_ms=max(send_lags_s, default=0.0) * 1000,
    )
