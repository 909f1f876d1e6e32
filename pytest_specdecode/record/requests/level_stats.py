"""The aggregates of one load level's measured requests: percentiles, goodput, the client's load.

Pure functions over samples (`record.samples.RequestSample` has what `Timed` reads); the level
itself and its SLO are configuration (config/load.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...config.load import PERCENTILE_KEY, SLO, Timed

SATURATED_SHARE = 0.9  # the client's CPU time over wall time at which it may be the limit


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
    median_tokens_per_s: float  # per request (those with output), then the median
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
    # as Measurement.tokens_per_s: a request with no output token enters no rate
    rates = [r for s in samples if math.isfinite(r := s.tokens_per_s) and r > 0]
    values = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    checks = []
    for key, limit in slo.percentiles.items():
        match = PERCENTILE_KEY.match(key)
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
        median_tokens_per_s=statistics.median(rates) if rates else math.nan,
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
