"""The run record: one typed shape for a run, live or stored. results.json is its serialisation.

A live run builds a `RunRecord` as it measures; `RunRecord.from_json(json.load(f))` gives the
same objects back from a stored results.json. The analysis reads only this shape. Each `Phase`
(one server start) holds one `Measurement` per cell (record/measurement.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.arms import design_keys
from ..config.settings import PromptType, RunConfig
from ..config.shape.served import ServedShape
from ..errors import ConfigError
from .counters import Acceptance, TrafficWatch, combine
from .drafter_check import DrafterCheck
from .ending import DiedStart, Measured, RestoreReport, RunCut, RunEnding
from .engine_settings import EngineSettings
from .measurement import Measurement
from .search import SearchRecord

SCHEMA = 2


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
    # --spec-shape: the architecture served with dummy weights, its depth, what is real, random,
    # cut and changed (config/shape/served.py); None: the model itself was measured
    shape: ServedShape | None = None
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
                "shape": _optional(self.shape),
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
                shape=_read(ServedShape, data.get("shape")),
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
