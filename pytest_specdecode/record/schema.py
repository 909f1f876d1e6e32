"""The run record: one typed shape for a run, live or stored. results.json is its serialisation.

A live run builds a `RunRecord` as it measures; `RunRecord.from_json(json.load(f))` gives the
same objects back from a stored results.json. The analysis reads only this shape.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.arms import design_keys
from ..config.load import SLO, LoadLevel
from ..config.settings import PromptType, RunConfig
from ..errors import ConfigError
from .counters import Acceptance, Traffic, TrafficWatch, client_accepted_tokens, combine
from .drafter_check import DrafterCheck
from .ending import DiedStart, Measured, RestoreReport, RunCut, RunEnding
from .engine_settings import EngineSettings
from .host_env import WindowEnvironment
from .requests.level_stats import LevelStats, level_stats
from .requests.request_metrics import acceptance_of, against_counters
from .requests.samples import RequestSample
from .requests.token_capture import TokenIds
from .search import SearchRecord

SCHEMA = 2


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
                "request_acceptance": _optional(self.request_acceptance),
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


@dataclass
class Phase:
    """One server start serving one arm (the original, or a candidate), and what it measured."""

    name: str  # "baseline", a candidate's name, "baseline-after"
    arm: str  # BASELINE, or the candidate's name
    spec: dict[str, Any] | None  # the --speculative-config values; None for the original
    service: str = ""
    server_version: str | None = None
    reused_from: str | None = None  # the results.json a reused baseline came from
    measurements: dict[str, Measurement] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)  # added to measure it, not a hypothesis
    # the per-request metrics level its requests were asked to report, or "none: why"; None for
    # the original
    request_metrics: str | None = None
    startup_s: float | None = None  # from start to serving; None: measured as found running
    engine: EngineSettings | None = None  # what the start ran with (record/engine_settings.py)
    control_of: str | None = None  # --spec-control: the candidate whose side changes it has
    env: dict[str, str] = field(default_factory=dict)  # set for this start (a control's)
    order: str | None = None  # "interleaved" or "blocked": how its requests were sent
    order_seed: int | None = None  # the interleaved order's seed (measure/experiment/order.py)
    together_with: str | None = None  # --spec-arms together: the phase served beside it
    sent_first: list[str] = field(default_factory=list)  # together: per slot, whose went first
    # together: which of the two places it ran in (0: the original's own, 1: the second's);
    # the places alternate between pairs where the target can swap them
    position: int | None = None
    died_start: DiedStart | None = None  # its first start died before serving: this is a retry

    @property
    def acceptance(self) -> Acceptance:
        return combine([m.acceptance for m in self.measurements.values()])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arm": self.arm,
            "spec": self.spec,
            "service": self.service,
            "server_version": self.server_version,
            "reused_from": self.reused_from,
            "extra_args": self.extra_args,
            "request_metrics": self.request_metrics,
            "startup_s": self.startup_s,
            "engine": _optional(self.engine),
            "control_of": self.control_of,
            "env": self.env,
            "order": self.order,
            "order_seed": self.order_seed,
            "together_with": self.together_with,
            "sent_first": self.sent_first,
            "position": self.position,
            "died_start": _optional(self.died_start),
            "acceptance": self.acceptance.to_dict(),  # for readers; recomputed
            "measurements": {k: m.to_json() for k, m in self.measurements.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Phase:
        return cls(
            name=data["name"],
            arm=data["arm"],
            spec=data.get("spec"),
            service=data.get("service", ""),
            server_version=data.get("server_version"),
            reused_from=data.get("reused_from"),
            extra_args=list(data.get("extra_args") or []),
            request_metrics=data.get("request_metrics"),
            startup_s=data.get("startup_s"),
            engine=_read(EngineSettings, data.get("engine")),
            control_of=data.get("control_of"),
            env=dict(data.get("env") or {}),
            order=data.get("order"),
            order_seed=data.get("order_seed"),
            together_with=data.get("together_with"),
            sent_first=list(data.get("sent_first") or []),
            position=data.get("position"),
            died_start=_read(DiedStart, data.get("died_start")),
            measurements={
                k: Measurement.from_json(m) for k, m in data.get("measurements", {}).items()
            },
        )


REGIME_LABEL = "regime"  # in samples.jsonl, a regime window's phase: "<baseline start>@regime"


def regime_phase_name(phase: str) -> str:
    """The journal's name for a baseline start's regime window."""
    return f"{phase}@{REGIME_LABEL}"


@dataclass
class RegimeWindow:
    """The regime window: the baseline start `phase` with one server beside it (`neighbour`,
    the first started), measured before the others start; then beside all `beside` of them in
    the main rounds. Kept here, never in `RunRecord.phases`: its requests enter no verdict,
    figure or prediction; analysis/map/regime.py compares the two."""

    phase: str
    beside: int  # servers beside the baseline in the main rounds
    neighbour: str
    tolerance: float  # [run] regime_tolerance, as measured
    measurements: dict[str, Measurement] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "beside": self.beside,
            "neighbour": self.neighbour,
            "tolerance": self.tolerance,
            "measurements": {k: m.to_json() for k, m in self.measurements.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegimeWindow:
        found = data.get("measurements") or {}
        return cls(
            phase=str(data["phase"]),
            beside=int(data["beside"]),
            neighbour=str(data.get("neighbour") or ""),
            tolerance=float(data["tolerance"]),
            measurements={str(k): Measurement.from_json(m) for k, m in found.items()},
        )


@dataclass
class TargetInfo:
    """What was measured, where: secrets already redacted."""

    backend: str
    host: str
    api_base: str
    model: str
    unit: str | None = None
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunRecord:
    """Everything one run measured and how it ended."""

    plugin_version: str
    config_file: str
    target: TargetInfo
    run: RunConfig
    candidates: dict[str, dict[str, Any]]
    prompt_types: dict[str, PromptType]
    environment: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Phase] = field(default_factory=dict)
    baseline_from: BaselineSource | None = None  # the stored run a baseline was reused from
    failures: dict[str, str] = field(default_factory=dict)  # arm -> why it failed
    restore: RestoreReport | None = None  # how the original was put back
    restart_noise_prior: dict[str, dict[str, Any]] | None = None  # per metric, stored runs'
    traffic_watch: TrafficWatch | None = None  # other clients seen before anything was touched
    ending: RunEnding | None = None  # finished or interrupted, and how
    search: SearchRecord | None = None  # --spec-search: its reloads and why
    cut: RunCut | None = None  # ended early: by what, when, in which step (record/ending.py)
    regime: RegimeWindow | None = None  # beside two or more: the baseline beside one first
    # a drafter with a model: each candidate start's check before its timed windows, by start
    drafter_checks: dict[str, DrafterCheck] = field(default_factory=dict)
    schema: int = SCHEMA

    @property
    def keys(self) -> list[str]:
        """The measurement keys of the design, prompt type by prompt type, level by level."""
        return design_keys(self.prompt_types, self.run.levels)

    def arm_phases(self, arm: str) -> list[Phase]:
        """The phases that measured one arm, one per server start, in order (the ABA baseline
        is its own arm)."""
        return [p for p in self.phases.values() if p.arm == arm]

    def measured(self, starts_planned: int) -> Measured:
        """What this run measured itself so far (a reused baseline not counted), against
        `starts_planned` starts of its design."""
        own = [p for p in self.phases.values() if not p.reused_from]
        cells = [m for p in own for m in p.measurements.values()]
        return Measured(
            starts=len(own),
            starts_planned=starts_planned,
            cells=sum(bool(m.samples) for m in cells),
            cells_planned=starts_planned * len(self.keys),
            samples=sum(len(m.samples) for m in cells),
            token_ids=sum(m.token_ids is not None and m.token_ids.missing is None for m in cells),
        )

    @property
    def measured_candidates(self) -> list[str]:
        """Candidates with a measured phase, in the configured order."""
        return [c for c in self.candidates if self.arm_phases(c)]

    def to_json(self) -> dict[str, Any]:
        return _finite(
            {
                "schema": self.schema,
                "plugin_version": self.plugin_version,
                "config_file": self.config_file,
                "target": dataclasses.asdict(self.target),
                "run": dataclasses.asdict(self.run),
                "candidates": self.candidates,
                "prompt_types": {k: v.to_dict() for k, v in self.prompt_types.items()},
                "environment": self.environment,
                "baseline_from": _optional(self.baseline_from),
                "failures": self.failures,
                "restore": _optional(self.restore),
                "restart_noise_prior": self.restart_noise_prior,
                "traffic_watch": _optional(self.traffic_watch),
                "ending": _optional(self.ending),
                "search": _optional(self.search),
                "cut": _optional(self.cut),
                "regime": _optional(self.regime),
                "drafter_checks": {k: c.to_dict() for k, c in self.drafter_checks.items()},
                "phases": {k: p.to_json() for k, p in self.phases.items()},
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str = "results.json") -> RunRecord:
        schema = data.get("schema") if isinstance(data, Mapping) else None
        if schema != SCHEMA:
            raise ConfigError(
                f"{source} has schema {schema!r}; this pytest-specdecode reads schema {SCHEMA} "
                "(a run of another version: measure it again, or read it with that version)"
            )
        try:
            return cls(
                plugin_version=data["plugin_version"],
                config_file=data["config_file"],
                target=TargetInfo(**data["target"]),
                run=RunConfig(**_known(RunConfig, data["run"])),
                candidates=dict(data["candidates"]),
                prompt_types={k: PromptType.from_dict(v) for k, v in data["prompt_types"].items()},
                environment=dict(data.get("environment") or {}),
                phases={k: Phase.from_json(p) for k, p in data.get("phases", {}).items()},
                baseline_from=_read(BaselineSource, data.get("baseline_from")),
                failures=dict(data.get("failures") or {}),
                restore=_read(RestoreReport, data.get("restore")),
                restart_noise_prior=data.get("restart_noise_prior"),
                traffic_watch=_read(TrafficWatch, data.get("traffic_watch")),
                ending=_read(RunEnding, data.get("ending")),
                search=_read(SearchRecord, data.get("search")),
                cut=_read(RunCut, data.get("cut")),
                regime=_read(RegimeWindow, data.get("regime")),
                drafter_checks={
                    k: DrafterCheck.from_dict(c)
                    for k, c in (data.get("drafter_checks") or {}).items()
                },
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source} is not a complete pytest-specdecode run: {exc!r}"
            ) from None


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def _optional(part: Any) -> dict[str, Any] | None:
    """A typed part's JSON, or None."""
    return part.to_dict() if part is not None else None


def _acceptance(data: Mapping[str, Any] | None) -> Acceptance:
    return Acceptance(**_known(Acceptance, data or {"present": False}))


def _finite(value: Any) -> Any:
    """NaN and infinities become None: results.json stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@dataclass(frozen=True)
class BaselineSource:
    """The stored run a reused baseline came from (--spec-baseline-from), and its facts."""

    path: str
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "facts": self.facts}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineSource:
        return cls(path=str(data["path"]), facts=dict(data.get("facts") or {}))


def _read(kind: Any, data: Mapping[str, Any] | None) -> Any:
    """A typed part of the record from its JSON, or None."""
    return kind.from_dict(data) if data is not None else None
