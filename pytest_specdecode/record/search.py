"""A search's part of the run record: what it reloaded, why, what it predicted before, and why
it stopped (`--spec-search`). Plain values only: the analysis reads them back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEARCH_PREFIX = "search-"  # the search's candidates: search-1, search-2, ...


def slot_name(slot: int) -> str:
    return f"{SEARCH_PREFIX}{slot}"


@dataclass(frozen=True)
class PredictedBand:
    """One measurement key as predicted before a reload: tok/s and speedup, each with its band."""

    tokens_per_s: float
    low: float
    high: float
    speedup: float
    speedup_low: float
    speedup_high: float

    def to_json(self) -> dict[str, float]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PredictedBand:
        return cls(**{k: float(data[k]) for k in cls.__dataclass_fields__})


@dataclass
class SearchReload:
    """One reload of the search: an ordinary candidate, chosen by prediction."""

    slot: int
    arm: str  # its candidate name: search-1, ...
    values: dict[str, Any]  # the --speculative-config values
    label: str  # e.g. "k=3 n=2..4", or the schedule's
    kind: str  # "teach", "predicted best" or "schedule"
    why: str
    predicted: dict[str, PredictedBand] = field(default_factory=dict)  # by measurement key

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "arm": self.arm,
            "values": self.values,
            "label": self.label,
            "kind": self.kind,
            "why": self.why,
            "predicted": {k: p.to_json() for k, p in self.predicted.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchReload:
        return cls(
            slot=int(data["slot"]),
            arm=str(data["arm"]),
            values=dict(data["values"]),
            label=str(data["label"]),
            kind=str(data["kind"]),
            why=str(data["why"]),
            predicted={
                k: PredictedBand.from_json(v) for k, v in (data.get("predicted") or {}).items()
            },
        )


@dataclass
class SearchRecord:
    """The search of one run (`--spec-search ngram`)."""

    method: str
    max_reloads: int
    margin: float
    reloads: list[SearchReload] = field(default_factory=list)
    stopped: str | None = None  # why it stopped before its budget was spent
    prior: str | None = None  # the cost prior it started from, with the stored runs named
    coverage: list[str] = field(default_factory=list)  # the band's coverage, as shown
    widen: dict[str, float] = field(default_factory=dict)  # per prompt type
    # per prompt type, [inside, total] of the stored runs' held-out checks when it started
    coverage_counts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def used(self) -> int:
        return len(self.reloads)

    def reload_of(self, arm: str) -> SearchReload | None:
        return next((r for r in self.reloads if r.arm == arm), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "max_reloads": self.max_reloads,
            "margin": self.margin,
            "reloads": [r.to_json() for r in self.reloads],
            "stopped": self.stopped,
            "prior": self.prior,
            "coverage": self.coverage,
            "widen": self.widen,
            "coverage_counts": self.coverage_counts,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchRecord:
        return cls(
            method=str(data["method"]),
            max_reloads=int(data["max_reloads"]),
            margin=float(data["margin"]),
            reloads=[SearchReload.from_json(r) for r in data.get("reloads") or []],
            stopped=data.get("stopped"),
            prior=data.get("prior"),
            coverage=list(data.get("coverage") or []),
            widen={k: float(v) for k, v in (data.get("widen") or {}).items()},
            coverage_counts={
                k: [int(x) for x in v] for k, v in (data.get("coverage_counts") or {}).items()
            },
        )
