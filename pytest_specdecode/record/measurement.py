"""One cell's measurement: one prompt type at one load level in one server start.

`Measurement` holds its timed requests (and the warm-up, the discarded windows), what the
server's counters said over them, the load generator's own figures (`ClientLoad`), the host's
environment through the window and, side by side, where the stop rule looked (`SequentialLooks`);
its properties are the figures the analysis reads. A `Phase` of the run record
(record/schema.py) holds one per cell.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.load import SLO, LoadLevel
from .counters import Acceptance, Traffic, client_accepted_tokens
from .host_env import WindowEnvironment
from .requests.level_stats import LevelStats, level_stats
from .requests.request_metrics import acceptance_of, against_counters
from .requests.samples import RequestSample
from .requests.token_capture import TokenIds


@dataclass
class ClientLoad:
    """The load generator's own figures over a measured window (record/requests/level_stats.py)."""

    cpu_s: float = 0.0  # the client process's CPU time
    peak_cpu_share: float = 0.0  # its busiest window's CPU time over wall time
    peak_in_flight: int = 0
    max_send_lag_s: float = 0.0  # open loop: the latest a request left after its arrival

    def add(self, stats: LevelStats) -> None:
        self.cpu_s += stats.client_cpu_share * stats.wall_s
        self.peak_cpu_share = max(self.peak_cpu_share, stats.client_peak_cpu_share)
        self.peak_in_flight = max(self.peak_in_flight, stats.peak_in_flight)
        self.max_send_lag_s = max(self.max_send_lag_s, stats.max_send_lag_ms / 1000)


def metric_value(sample: RequestSample, values: str) -> float | None:
    """A request's value of a metric (`tokens_per_s` or `tpot_ms`) where it enters the
    statistics (finite and > 0), else None."""
    tpot = sample.tpot_s
    value = sample.tokens_per_s if values == "tokens_per_s" else tpot * 1000 if tpot else 0
    return value if math.isfinite(value) and value > 0 else None


@dataclass
class SequentialLooks:
    """Side by side: where the stop rule looked at a cell (analysis/verdict/sequential.py).

    `planned`: the cell's most slots; `looks`: the slot counts at which it looked, in order;
    `stopped`: whether it stopped at the last of them, decided. The analysis takes the
    boundary of the last look as the interval's level, so an early stop keeps its alpha."""

    planned: int
    looks: list[int] = field(default_factory=list)
    stopped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"planned": self.planned, "looks": list(self.looks), "stopped": self.stopped}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SequentialLooks:
        return cls(int(data["planned"]), [int(n) for n in data.get("looks", ())],
                   bool(data.get("stopped", False)))  # fmt: skip

    def schedule(self, slots: int) -> list[int]:
        """The looks the analysis counts for a cell of `slots` slots: those before, and the
        last (the stopping look, or wherever the cell ended)."""
        return [n for n in self.looks if n < slots] + [slots]


@dataclass
class Measurement:
    """One prompt type in one phase: its requests, and the server's acceptance over them."""

    prompt_type: str
    level: LoadLevel = field(default_factory=lambda: LoadLevel(concurrency=1))
    key: str = ""  # its name in Phase.measurements: cell_key(prompt type, level); see there
    samples: list[RequestSample] = field(default_factory=list)  # measured
    warmup: list[RequestSample] = field(default_factory=list)  # sent first, never analysed
    wall_s: float | None = None  # of the measured requests; None until they all finished
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(present=False))
    traffic: Traffic = field(default_factory=Traffic)  # the server's counts over the window
    foreign: str | None = None  # other clients' traffic in the window that was kept
    discarded: list[RequestSample] = field(default_factory=list)  # windows that had it
    token_ids: TokenIds | None = None  # captured after the timed requests, for the replay
    slo: SLO = field(default_factory=SLO)  # the level's, as configured when it was measured
    client: ClientLoad = field(default_factory=lambda: ClientLoad())
    environment: WindowEnvironment | None = None  # the serving host's, through the window
    sequential: SequentialLooks | None = None  # side by side: where the stop rule looked

    def __post_init__(self) -> None:
        self.key = self.key or self.prompt_type

    @property
    def concurrency(self) -> int | None:
        return self.level.concurrency

    @property
    def output_tokens(self) -> int:
        return sum(s.output_tokens for s in self.samples)

    def by_prompt(self, values: str) -> list[tuple[float, int | None]]:
        """The values of a metric (`tokens_per_s` or `tpot_ms`) that enter the statistics,
        each with the index of the prompt its request sent (None where not recorded)."""
        return [(v, s.prompt_index) for s in self.samples if (v := metric_value(s, values))]

    def by_slot(self, values: str) -> dict[int, list[float]]:
        """The values of a metric that enter the statistics, by the slot each request was sent
        in (measure/experiment/order.py); requests without a slot are left out."""
        out: dict[int, list[float]] = {}
        for s in self.samples:
            if s.slot is not None and (value := metric_value(s, values)):
                out.setdefault(s.slot, []).append(value)
        return out

    def slot_prompts(self) -> dict[int, tuple[int | None, ...]]:
        """Each slot's prompts (one at c1, N at cN), in the order sent."""
        out: dict[int, tuple[int | None, ...]] = {}
        for s in self.samples:
            if s.slot is not None:
                out[s.slot] = (*out.get(s.slot, ()), s.prompt_index)
        return out

    @property
    def tokens_per_s(self) -> list[float]:
        """Per-request output tok/s that enter the statistics (finite and > 0)."""
        return [v for v, _ in self.by_prompt("tokens_per_s")]

    @property
    def tpot_ms(self) -> list[float]:
        """Per-request TPOT in ms that enter the statistics; requests of one token have none."""
        return [v for v, _ in self.by_prompt("tpot_ms")]

    @property
    def stats(self) -> LevelStats:
        """The level's aggregates: aggregate tok/s, TTFT and TPOT percentiles, goodput."""
        return level_stats(
            self.samples,
            wall_s=self.wall_s or 0.0,
            slo=self.slo,
            cpu_s=self.client.cpu_s,
            peak_cpu_share=self.client.peak_cpu_share,
            peak_in_flight=self.client.peak_in_flight,
            send_lags_s=(self.client.max_send_lag_s,),
        )

    @property
    def median_tokens_per_s(self) -> float:
        values = self.tokens_per_s
        return statistics.median(values) if values else math.nan

    @property
    def median_tpot_ms(self) -> float:
        values = self.tpot_ms
        return statistics.median(values) if values else math.nan

    @property
    def output_throughput(self) -> float | None:
        """Output tokens over the wall time of the measured requests (vLLM bench's figure)."""
        if not self.wall_s:
            return None
        return self.output_tokens / self.wall_s

    @property
    def request_acceptance(self) -> Acceptance | None:
        """The timed requests' own figures summed (vLLM's per-request metrics); None unless
        every request reported them. Exact whatever else the server served meanwhile."""
        return acceptance_of(s.spec_decode for s in self.samples)

    @property
    def request_check(self) -> str | None:
        """Over a quiet window, where the requests' sum differs from the counters' delta."""
        mine = self.request_acceptance
        if mine is None or self.foreign is not None or not self.acceptance.present:
            return None
        return against_counters(mine, self.acceptance)

    @property
    def client_accepted(self) -> int | None:
        """Accepted tokens as the client saw them; None without per-chunk usage."""
        if not self.samples or any(s.tokens_per_chunk is None for s in self.samples):
            return None
        return sum(client_accepted_tokens(s.tokens_per_chunk or []) for s in self.samples)

    def to_json(self) -> dict[str, Any]:
        mine = self.request_acceptance
        return {
            "prompt_type": self.prompt_type,
            "key": self.key,
            "level": self.level.to_dict(),
            "slo": self.slo.to_dict(),
            "client": dataclasses.asdict(self.client),
            "wall_s": self.wall_s,
            "acceptance": self.acceptance.to_dict(),
            "traffic": self.traffic.to_dict(),
            "foreign": self.foreign,
            "summary": {  # for readers of the file; recomputed, never read back
                "n": len(self.samples),
                "median_tokens_per_s": self.median_tokens_per_s,
                "median_tpot_ms": self.median_tpot_ms,
                "output_throughput": self.output_throughput,
                "client_accepted_tokens": self.client_accepted,
                "request_acceptance": mine.to_dict() if mine is not None else None,
                "request_check": self.request_check,
                "level": self.stats.to_dict() if self.samples else None,
            },
            "warmup": [s.to_json() for s in self.warmup],
            "samples": [s.to_json() for s in self.samples],
            "discarded": [s.to_json() for s in self.discarded],
            "token_ids": self.token_ids.to_json() if self.token_ids is not None else None,
            "environment": self.environment.to_json() if self.environment else None,
            "sequential": self.sequential.to_json() if self.sequential else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        return cls(
            prompt_type=data["prompt_type"],
            key=data.get("key", ""),
            level=LoadLevel.from_dict(data.get("level") or {"concurrency": 1}),
            slo=SLO.from_dict(data.get("slo") or {}),
            client=ClientLoad(**_known(ClientLoad, data.get("client") or {})),
            samples=[RequestSample.from_json(s) for s in data.get("samples", [])],
            warmup=[RequestSample.from_json(s) for s in data.get("warmup", [])],
            wall_s=data.get("wall_s"),
            acceptance=_acceptance(data.get("acceptance")),
            traffic=Traffic(**_known(Traffic, data.get("traffic") or {})),
            foreign=data.get("foreign"),
            discarded=[RequestSample.from_json(s) for s in data.get("discarded", [])],
            token_ids=TokenIds.from_json(data["token_ids"]) if data.get("token_ids") else None,
            environment=(
                WindowEnvironment.from_json(data["environment"])
                if data.get("environment")
                else None
            ),
            sequential=(
                SequentialLooks.from_json(data["sequential"]) if data.get("sequential") else None
            ),
        )


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def _acceptance(data: Mapping[str, Any] | None) -> Acceptance:
    return Acceptance(**_known(Acceptance, data or {"present": False}))
